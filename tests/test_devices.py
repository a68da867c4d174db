"""The device rule (docs/devices.md), on the CPU: where ranks compute, how they talk, where messages live.

1. :func:`minddp.runtime.device.choose` on machines faked by their GPU count: NCCL with a GPU per rank, ranks
   sharing the GPUs over gloo when they outnumber them, gloo on the CPU without one, NCCL refused
   without a GPU per rank; each choice says why in one line.
2. A group's backend string says which device types it serves; bookkeeping messages go to the CPU
   where the group serves it and to the rank's GPU under a plain NCCL group.
3. Every function in minddp that issues a collective builds its tensors on a stated device (a lint
   over the source: the rule that the GPU run found broken in six places).
4. The stages train like one process in a group built the way the NCCL placement builds it, one
   backend per device type (``cpu:gloo,cuda:...``): nothing in minddp reads the backend as one name.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import toy_models

from minddp import launch
from minddp.runtime import device
from minddp.runtime.device import Placement, choose, parse_backend

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------- 1. the choice
@pytest.mark.parametrize(
    "requested, ranks, gpus, nccl, backend, device_type, rank1, group_backend",
    [
        ("auto", 2, 0, False, "gloo", "cpu", "cpu", "gloo"),  # a laptop
        ("auto", 2, 0, True, "gloo", "cpu", "cpu", "gloo"),  # a CUDA torch without a GPU
        ("auto", 2, 2, True, "nccl", "cuda", "cuda:1", "cpu:gloo,cuda:nccl"),  # a GPU per rank
        ("auto", 2, 8, True, "nccl", "cuda", "cuda:1", "cpu:gloo,cuda:nccl"),  # more GPUs than ranks
        ("auto", 2, 1, True, "gloo", "cuda", "cuda:0", "gloo"),  # one GPU, two ranks: shared
        ("auto", 4, 2, True, "gloo", "cuda", "cuda:1", "gloo"),  # 4 ranks on 2 GPUs: 0,1,0,1
        ("auto", 2, 2, False, "gloo", "cuda", "cuda:1", "gloo"),  # GPUs, but a torch without NCCL
        ("gloo", 2, 8, True, "gloo", "cpu", "cpu", "gloo"),  # gloo asked for: the CPU
        ("nccl", 1, 1, True, "nccl", "cuda", "cuda:0", "cpu:gloo,cuda:nccl"),
    ],
)
def test_choose_on_faked_machines(
    monkeypatch, requested, ranks, gpus, nccl, backend, device_type, rank1, group_backend
):
    monkeypatch.delenv("MINDDP_BACKEND", raising=False)
    p = choose(requested, local_world_size=ranks, gpus=gpus, nccl=nccl)
    assert (p.backend, p.device_type, p.group_backend()) == (backend, device_type, group_backend)
    assert str(p.device(ranks - 1 if ranks == 2 else 1)) == rank1
    assert "\n" not in p.why and p.why.startswith(f"{ranks} rank")


def test_one_gpu_two_ranks_says_it_shares_and_why(monkeypatch):
    monkeypatch.delenv("MINDDP_BACKEND", raising=False)
    why = choose("auto", 2, gpus=1, nccl=True).why
    assert why == (
        "2 ranks share the GPU: gloo with CUDA tensors, since NCCL needs one GPU per rank (--backend gloo: the CPU)"
    )
    assert [str(choose("auto", 4, gpus=2, nccl=True).device(r)) for r in range(4)] == [
        "cuda:0",
        "cuda:1",
        "cuda:0",
        "cuda:1",
    ]


@pytest.mark.parametrize(
    "gpus, nccl, said",
    [(1, True, "2 local ranks but 1 GPU"), (0, True, "2 local ranks but 0 GPUs"), (2, False, "this torch has no NCCL")],
)
def test_nccl_without_a_gpu_per_rank_is_refused_in_one_line(gpus, nccl, said):
    with pytest.raises(ValueError) as err:
        choose("nccl", 2, gpus=gpus, nccl=nccl)
    message = str(err.value)
    assert said in message and "--backend auto" in message and "\n" not in message


def test_minddp_backend_replaces_auto_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("MINDDP_BACKEND", "gloo")
    assert choose("auto", 2, gpus=2, nccl=True).device_type == "cpu"
    assert choose("nccl", 2, gpus=2, nccl=True).backend == "nccl"  # an explicit choice wins
    monkeypatch.setenv("MINDDP_BACKEND", "mpi")
    with pytest.raises(ValueError, match="MINDDP_BACKEND='mpi' is not a backend"):
        choose("auto", 2, gpus=0, nccl=False)


# --------------------------------------------------------------------- 2. what a group serves
@pytest.mark.parametrize(
    "name, served",
    [
        ("gloo", {"cpu": "gloo", "cuda": "gloo"}),
        ("nccl", {"cuda": "nccl"}),
        ("cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}),
        ("cuda:nccl", {"cuda": "nccl"}),
    ],
)
def test_backend_strings(name, served):
    assert parse_backend(name) == served


def test_message_device_follows_what_the_group_serves(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for name, expected in [("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda:3")]:
        monkeypatch.setattr(dist, "get_backend", lambda group=None, name=name: name)
        assert str(device.message_device(None)) == expected
        fake_cuda = torch.empty(0, device="meta")
        assert not device.gloo_on_cuda(None, fake_cuda)  # not a CUDA tensor: never staged


# ------------------------------------------------------------------------------- 3. the lint
#: Calls that issue a collective or a point-to-point message with a tensor the caller built.
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "broadcast",
    "reduce_scatter",
    "reduce",
    "gather",
    "scatter",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather_single",
    "reduce_scatter_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_to_all_single",
    "P2POp",
}
CONSTRUCTORS = {"tensor", "zeros", "ones", "full", "empty", "arange", "randn", "rand"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def _is_torch(node) -> bool:
    return isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"


def unplaced_tensors(path: pathlib.Path) -> list[str]:
    """``file:line`` of every torch constructor without ``device=`` in a function that issues a collective
    (through ``dist.X`` or a compat shim of the same name)."""
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = list(_calls(fn))
        if not any(c.func.attr in COLLECTIVES for c in calls):
            continue
        for c in calls:
            if _is_torch(c) and c.func.attr in CONSTRUCTORS and not any(k.arg == "device" for k in c.keywords):
                found.append(f"{path.relative_to(ROOT)}:{c.lineno} ({fn.name})")
    return found


def test_every_tensor_minddp_sends_is_built_on_a_stated_device():
    """The GPU run died in ParameterUse.check (a CPU mask all_gathered in an NCCL group); the rule:
    a function that issues a collective states the device of every tensor it builds (the rank's,
    :func:`minddp.runtime.device.message_device`, or the CPU where its group is gloo's by construction)."""
    files = sorted((ROOT / "minddp").rglob("*.py")) + sorted((ROOT / "notebooks").glob("*.py"))
    assert len(files) > 50
    offenders = [where for path in files for where in unplaced_tensors(path)]
    assert offenders == [], "tensors built without a device in functions that send them: " + ", ".join(offenders)


def test_the_lint_finds_the_defect_it_is_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch, torch.distributed as dist\n"
        "def check(group):\n"
        "    mine = torch.tensor([1, 0], dtype=torch.uint8)\n"
        "    dist.all_gather([mine, mine], mine, group=group)\n"
    )
    global ROOT
    keep, ROOT = ROOT, tmp_path
    try:
        assert unplaced_tensors(bad) == ["bad.py:3 (check)"]
    finally:
        ROOT = keep


# ------------------------------------------------------------- 4. a group with a backend per device
@dataclass(frozen=True)
class PerDeviceGloo(Placement):
    """The CPU, in a group built the way the NCCL placement builds its own: one backend named per device."""

    def group_backend(self) -> str:
        return "cpu:gloo,cuda:gloo"


def _train_in_per_device_group(stages):
    from minddp.ladder import build_stage, make_optimizer, options_for
    from minddp.ladder.loop import train_step

    assert dist.get_backend() == "cpu:gloo,cuda:gloo"
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    batches = toy_models.global_batches("tied", steps=3, rows=4)
    for stage, options in stages:
        inner = toy_models.build("tied", seed=rank)  # different weights per rank: the broadcast fixes it
        names = [name for name, _ in inner.named_parameters()]
        model = build_stage(stage, inner, **options_for(stage, bucket_cap_mb=0.0001), **options)
        opt = make_optimizer(stage, model, torch.optim.SGD, lr=0.1)
        for batch in batches:
            train_step(model, opt, [toy_models.shard(batch, rank, world)], toy_models.loss_fn)
        full = model.full_parameters() if hasattr(model, "full_parameters") else dict(inner.named_parameters())
        out[stage + str(options)] = torch.cat([full[name].detach().reshape(-1).clone() for name in names])
    return out


def test_stages_train_in_a_group_with_a_backend_per_device_type():
    stages = [
        ("simple", {}),
        ("bucket-async", {}),
        ("ddp", {"find_unused_parameters": True}),
        ("zero2", {}),
        ("fsdp", {}),
    ]
    placement = PerDeviceGloo("gloo", "cpu", 0, "2 ranks, a backend per device type")
    per_rank = launch(_train_in_per_device_group, stages, world_size=2, backend=placement)
    single = toy_models.build("tied", seed=0)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for batch in toy_models.global_batches("tied", steps=3, rows=4):
        toy_models.loss_fn(single, batch).backward()
        opt.step()
        opt.zero_grad()
    expected = torch.cat([p.detach().reshape(-1) for p in single.parameters()])
    for key, flat in per_rank[0].items():
        assert torch.equal(flat, per_rank[1][key]), key
        # one process on the global batch sums 4 rows where the ranks sum 2 and 2 and average: float32
        # rounding of a few operations per element, far below 1e-5 relative on these O(1) values
        torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-6, msg=key)


# --------------------------------------------------------------------------- the GPU preset
def test_the_gpu_preset_is_smollm2_360m_built_offline():
    from minddp.train.models import build_model, count_parameters

    with torch.device("meta"):
        model = build_model("smollm2-360m", vocab_size=400, pad_token_id=0, seed=1)
    c = model.config
    # HuggingFaceTB/SmolLM2-360M's published config.json
    assert (
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.tie_word_embeddings,
    ) == (49152, 960, 2560, 32, 15, 5, True)
    assert 361e6 < count_parameters(model) < 363e6
