"""Memory per rank, measured from the tensors, matches the ZeRO formulas (2 and 3 ranks, tiny offline Llama).

The oracle is arithmetic: ``Ψ`` trainable fp32 parameters with AdamW hold
DDP ``16Ψ``, ZeRO-1 ``8Ψ + 8Ψ/n``, ZeRO-2 ``4Ψ + 12Ψ/n``, FSDP ``16Ψ/n`` for
its units plus 16 bytes per replicated parameter (n ranks). What may separate the
measurement from it (``docs/sharding.md``): Adam's step counters (4 bytes a
tensor) and the padding of uneven chunks; both stay far under 1 %. FSDP computing
in bf16 (``compute_dtype``) keeps its fp32 shards as the master weights, so it
meets the same formula, with its gathered units half the bytes. The mixed-precision
formulas are checked against the ZeRO paper's, written out.
"""

from __future__ import annotations

import pytest

from minddp import launch
from minddp.bench.memory import measure_rank
from minddp.sharding.memory import STAGES, formula_bytes, formula_parts


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def measured(request):
    world = request.param
    stages = [*STAGES, "fsdp:bf16"]
    return world, launch(measure_rank, "tiny-llama", stages, world_size=world, backend="gloo", timeout_s=180)


def test_model_state_bytes_match_the_formulas_within_one_percent(measured):
    world, per_rank = measured
    for rank, stages in enumerate(per_rank):
        for name, m in stages.items():
            stage = name.partition(":")[0]  # fsdp:bf16 keeps fp32 masters: the fp32 formula
            state = m["parameters"] + m["gradients"] + m["optimizer"]
            expected = formula_bytes(stage, m["psi"], world, m["replicated"])
            assert abs(state / expected - 1) < 0.01, f"rank {rank} {stage}: {state} B measured, {expected:.0f} formula"


def test_each_rung_holds_less_and_for_the_reason_it_says(measured):
    world, per_rank = measured
    m = per_rank[0]
    assert m["zero1"]["optimizer"] < m["ddp"]["optimizer"] and m["zero1"]["gradients"] == m["ddp"]["gradients"]
    assert m["zero2"]["gradients"] < m["zero1"]["gradients"] and m["zero2"]["parameters"] == m["ddp"]["parameters"]
    assert m["fsdp"]["parameters"] < m["zero2"]["parameters"]
    assert m["fsdp"]["gathered"] > 0 and all(m[s]["gathered"] == 0 for s in ("ddp", "zero1", "zero2"))


def test_fsdp_computing_in_bf16_keeps_fp32_state_and_gathers_half_the_bytes(measured):
    """compute_dtype=bf16: the same fp32 shards, gradients and Adam state; the units are gathered in bf16, 2 bytes
    a value where fp32 takes 4 (the same units, the same padding: exactly half); fewer bytes saved for backward."""
    _, per_rank = measured
    for m in per_rank:
        fp32, bf16 = m["fsdp"], m["fsdp:bf16"]
        assert {k: bf16[k] for k in ("parameters", "gradients", "optimizer")} == {
            k: fp32[k] for k in ("parameters", "gradients", "optimizer")
        }
        assert 2 * bf16["gathered"] == fp32["gathered"] > 0
        assert 0 < bf16["activations"] < fp32["activations"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_formulas_are_the_zero_papers_in_both_precisions(world):
    """The ZeRO paper (Rajbhandari et al., 2020, fig. 1), Ψ parameters, n ranks: fp32 Adam 4 + 4 + 8 bytes a
    parameter, mixed precision 2 + 2 + K with K = 12; P_os, P_os+g, P_os+g+p shard one more kind each."""
    psi, n, rep = 1_000_003, world, 5_000
    fp32 = {"ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / n, "zero2": 4 * psi + 12 * psi / n, "fsdp": 16 * psi / n}
    mixed = {"ddp": 16 * psi, "zero1": 4 * psi + 12 * psi / n, "zero2": 2 * psi + 14 * psi / n, "fsdp": 16 * psi / n}
    for stage in STAGES:
        assert formula_bytes(stage, psi, n) == pytest.approx(fp32[stage], rel=1e-12)
        assert formula_bytes(stage, psi, n, precision="bf16-mixed") == pytest.approx(mixed[stage], rel=1e-12)
        if stage != "fsdp":  # only fsdp keeps parameters whole outside its units
            assert formula_bytes(stage, psi, n, rep) == formula_bytes(stage, psi, n)
    assert formula_bytes("fsdp", psi, n, rep) == pytest.approx(16 * (psi - rep) / n + 16 * rep, rel=1e-12)
    assert formula_parts("zero2", psi, n, precision="bf16-mixed") == pytest.approx(
        {"parameters": 2 * psi, "gradients": 2 * psi / n, "optimizer": 12 * psi / n}, rel=1e-12
    )
    with pytest.raises(ValueError, match="choose one of fp32, bf16-mixed"):
        formula_bytes("ddp", psi, n, precision="fp8")


def test_activations_are_measured_and_the_same_forward_saves_the_same(measured):
    """Every stage runs the same forward on the same batch, so autograd saves the same activations
    (FSDP's saved-tensor hook swaps out only its parameters, which are not activations)."""
    _, per_rank = measured
    acts = {stage: per_rank[0][stage]["activations"] for stage in STAGES}
    assert acts["ddp"] > 0 and len(set(acts.values())) == 1, acts


def split_activations(model_name: str) -> dict:
    """On every rank: fsdp's activations in fp32 and computing in bf16, with ``Probe.activations_by``."""
    import torch

    from minddp.ladder import build_stage
    from minddp.ladder.loop import train_step
    from minddp.sharding.fsdp import blocks_of
    from minddp.sharding.memory import Probe
    from minddp.train.models import build_model

    out = {}
    batch = {"input_ids": torch.randint(1, 92, (8, 32), generator=torch.Generator().manual_seed(0))}
    batch["labels"] = torch.zeros(8, dtype=torch.long)
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)
        wrapped = build_stage("fsdp", model, compute_dtype=dtype, shard=blocks_of(model))
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        probe = Probe(wrapped, model, optimizer)
        train_step(wrapped, optimizer, [batch], lambda m, b: m(**b).loss)
        out[str(dtype)] = (probe.result()["activations"], probe.activations_by)
    return out


def test_activations_by_dtype_and_module_add_up_and_bf16_ones_are_half_their_fp32_bytes():
    """The split sums to the activations; fp32 compute saves no bf16; computing in bf16, the oracle is the fp32
    run's own measurement: each tensor saved in bf16 takes half its fp32 bytes, every other the same."""
    for per_dtype in launch(split_activations, "tiny-llama", world_size=2, backend="gloo", timeout_s=180):
        (a32, by32), (a16, by16) = per_dtype["torch.float32"], per_dtype["torch.bfloat16"]
        assert sum(by32.values()) == a32 and sum(by16.values()) == a16
        assert not any(d == "bfloat16" for d, _ in by32) and all(isinstance(m, str) and m for _, m in by16)
        low = sum(b for (d, _), b in by16.items() if d == "bfloat16")
        assert 0 < low and abs(a16 + low - a32) < 1e-3 * a32, (a32, a16, low)


def gradients_between(model_name: str) -> dict:
    """On every rank: each stage trains one step of two micro-batches under a Probe; what it held between them."""
    import torch

    from minddp.ladder import build_stage, make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.sharding.fsdp import blocks_of
    from minddp.sharding.memory import Probe
    from minddp.train.models import build_model

    g = torch.Generator().manual_seed(0)
    batches = [
        {"input_ids": torch.randint(1, 92, (4, 16), generator=g), "labels": torch.randint(0, 2, (4,), generator=g)}
        for _ in range(2)
    ]
    out = {}
    for stage in [*STAGES, "fsdp:bf16"]:
        model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)
        if stage == "fsdp:bf16":  # its module holds bf16 casts of the replicated tensors during a forward
            wrapped = build_stage("fsdp", model, compute_dtype=torch.bfloat16, shard=blocks_of(model))
        else:
            wrapped = wrap(stage, model)
        optimizer = make_optimizer(stage.partition(":")[0], wrapped, torch.optim.AdamW, lr=1e-3)
        probe = Probe(wrapped, model, optimizer)
        train_step(wrapped, optimizer, batches, lambda m, b: m(**b).loss)
        out[stage] = {**probe.result(), "between": probe.gradients_between}
    return out


def test_between_micro_batches_every_stage_holds_the_whole_gradients():
    """Under no_sync the first micro-batch's gradients are accumulated whole, sharded only at the last backward's
    sync: the oracle is the whole model's fp32 gradient bytes, 4Ψ (no padding: gradients are kept unpadded), fsdp
    computing in bf16 too (its gradients are summed in its fp32 master dtype)."""
    for per_stage in launch(gradients_between, "tiny-llama", world_size=2, backend="gloo", timeout_s=180):
        for stage, m in per_stage.items():
            assert m["between"] == 4 * m["psi"], (stage, m)
        assert per_stage["zero2"]["gradients"] < per_stage["zero2"]["between"]
        assert per_stage["fsdp"]["gradients"] < per_stage["fsdp"]["between"]
        assert per_stage["fsdp:bf16"]["replicated"] > 0  # the tensors it casts for the forward


def handed_to_all_gathers() -> dict:
    """On every rank: zero1 and zero2, in buckets of 4 KiB, over a model whose sizes 3 ranks do not divide; the
    bytes of the tensors their all-gathers of parameters are handed in one step, and of the receive buffers held
    at the last start."""
    import weakref

    import torch
    from torch import nn

    from minddp.comm.wire import Wire
    from minddp.ladder import build_stage, make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.sharding import zero1
    from minddp.sharding.memory import all_gather_buffer_bytes

    handed, receiving = [], []
    start = Wire.all_gather

    def recording(wire, output, input):
        receiving.append(weakref.ref(output))
        handed.append((output.untyped_storage().nbytes() + input.untyped_storage().nbytes(), output.numel()))
        held_now = sum(r().untyped_storage().nbytes() for r in receiving if r() is not None)
        handed[-1] += (held_now,)
        return start(wire, output, input)

    Wire.all_gather = recording
    zero1.BUCKET_CAP_MB = 4 / 1024  # several all-gather buckets
    g = torch.Generator().manual_seed(0)
    batch = [(torch.randn(4, 7, generator=g), torch.randn(4, 5, generator=g))]
    out = {}
    for stage in ("zero1", "zero2", "fsdp"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(7, 31), nn.Tanh(), nn.Linear(31, 31), nn.Tanh(), nn.Linear(31, 5))
        if stage == "fsdp":  # each Linear a unit, of three sizes
            wrapped = build_stage(stage, model, shard=nn.Linear)
        else:
            wrapped = wrap(stage, model, bucket_cap_mb=4 / 1024)
        optimizer = make_optimizer(stage, wrapped, torch.optim.AdamW, lr=1e-3)
        for _ in range(2):  # zero2 all-gathers in the forward after a step: record the second step's only
            handed.clear()
            receiving.clear()
            train_step(wrapped, optimizer, batch, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())
        sharded = optimizer if stage == "zero1" else wrapped
        out[stage] = {"function": all_gather_buffer_bytes(sharded), "handed": list(handed)}
    return out


def test_all_gather_buffer_bytes_are_what_the_sharded_stages_hand_their_all_gathers():
    """The oracle is the stages' own tensors: the storages each all-gather of parameters is handed in a step (send
    block and receive buffer) sum to the function's bytes over zero1's and zero2's several buckets, with padded
    chunks, and every receive buffer is still held when the last all-gather starts; for fsdp, which gathers one
    unit at a time, the function's bytes are the most one call is handed."""
    for per_stage in launch(handed_to_all_gathers, world_size=3, backend="gloo", timeout_s=180):
        for stage, got in per_stage.items():
            calls = got["handed"]
            assert len(calls) > 1, (stage, calls)  # several buckets or units
            if stage == "fsdp":
                assert len({b for b, _, _ in calls}) == 3, calls  # units of three sizes
                assert max(b for b, _, _ in calls) == got["function"], got
                continue
            assert sum(b for b, _, _ in calls) == got["function"], (stage, got)
            assert calls[-1][2] == sum(4 * numel for _, numel, _ in calls), (stage, calls)
