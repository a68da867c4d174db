"""Every stage trains exactly like one process on the global batch, and like torch's DDP.

Oracle 1: a single process that sees the whole global batch (for BatchNorm,
which normalises per batch, the single process runs each rank's shard through
the model separately: that is what data parallelism computes, by design).
Oracle 2: ``torch.nn.parallel.DistributedDataParallel`` trained the same way.

Each rank starts from *different* random weights, so only the broadcast at
construction can make the runs agree.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import toy_models
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import launch
from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.wire import Traffic, Wire
from minddp.ladder import STAGES, build_stage, options_for
from minddp.ladder.loop import train_step
from minddp.stages import plan_buckets

STEPS = 5
ROWS = 4  # rows per rank per micro-batch
BUCKET_CAP_MB = 0.001  # ~1 KB: several buckets even for the tiny models
FOUNDATION_STAGES = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
# The tolerance against the oracles, from what differs between them and the stages (ranks of one run agree
# bitwise, asserted with torch.equal). All run the same float32 operations on the same rows; only the order of the
# additions differs: a rank sums the loss and each weight gradient over its own rows and the all_reduce adds the
# ranks' parts, where the single process sums all rows at once; a stage accumulates micro-batches where torch's
# DDP may hold them in its buckets. A float32 sum of n terms is within (n - 1)·u·Σ|terms| of the exact one
# (u = 2**-24, the unit roundoff), so each step's update differs by a few u of its size (n ≤ 24 rows here), and
# five steps carry and compound that. RTOL = 1e-5 is about 170 u: room for that growth, and orders of magnitude
# below the defects the test is for (a micro-batch missed, a rank's gradient not added, a division by the wrong
# count: each changes the update by a part of the order of the update itself). ATOL is for parameters near 0,
# where a relative bound means nothing: 16 u of a parameter of size 1.
RTOL, ATOL = 1e-5, 1e-6
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def micro_batches(batch: dict, rank: int, world: int, accum: int) -> list[dict]:
    """Global batch -> ``accum`` micro global batches -> this rank's shard of each."""
    return [toy_models.shard(toy_models.shard(batch, m, accum), rank, world) for m in range(accum)]


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def wrap(stage: str, model, traffic: Traffic):
    if stage == "torch":
        return TorchDDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    wrapped = build_stage(stage, model, **options_for(stage, bucket_cap_mb=BUCKET_CAP_MB))
    wrapped.register_comm_hook(Wire(None, traffic=traffic), allreduce_hook)  # the default hook, metered
    return wrapped


def rank_trainings(model_name: str, stages: list[str], accums: list[int], optimizers: list[str]) -> dict:
    """On each rank: train every (stage, accum, optimizer); record params after init and each step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for stage in stages:
        for accum in accums:
            batches = toy_models.global_batches(model_name, STEPS, ROWS * world * accum)
            for opt_name in optimizers:
                model = toy_models.build(model_name, seed=100 + rank)  # differs per rank on purpose
                traffic = Traffic()
                ddp = wrap(stage, model, traffic)
                optimizer = OPTIMIZERS[opt_name](ddp.parameters())
                history, calls = [flat_params(model)], []
                for batch in batches:
                    traffic.reset()
                    train_step(ddp, optimizer, micro_batches(batch, rank, world, accum), toy_models.loss_fn)
                    calls.append(traffic.calls)
                    history.append(flat_params(model))
                out[(stage, accum, opt_name)] = {"history": history, "calls": calls}
    return out


def single_process(model_name: str, accum: int, opt_name: str, world: int) -> torch.Tensor:
    """The reference: one process, rank 0's initial weights, the whole global batch."""
    model = toy_models.build(model_name, seed=100)
    optimizer = OPTIMIZERS[opt_name](model.parameters())
    per_shard = model_name == "bn"  # BatchNorm statistics are per forward: run each rank's shard alone
    for batch in toy_models.global_batches(model_name, STEPS, ROWS * world * accum):
        for m in range(accum):
            micro = toy_models.shard(batch, m, accum)
            if per_shard:
                for r in range(world):
                    (toy_models.loss_fn(model, toy_models.shard(micro, r, world)) / (accum * world)).backward()
            else:
                (toy_models.loss_fn(model, micro) / accum).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_params(model)


def check_equivalence(model_name: str, world: int, accums=(1, 3), optimizers=("sgd", "adam"), stages=FOUNDATION_STAGES):
    per_rank = launch(
        rank_trainings,
        model_name,
        list(stages) + ["torch"],
        list(accums),
        list(optimizers),
        world_size=world,
        timeout_s=120,
    )
    for accum in accums:
        for opt_name in optimizers:
            reference = single_process(model_name, accum, opt_name, world)
            torch_final = per_rank[0][("torch", accum, opt_name)]["history"][-1]
            assert torch.allclose(torch_final, reference, rtol=RTOL, atol=ATOL), (
                f"oracle disagreement: torch DDP vs single process ({model_name}, accum={accum}, {opt_name}): "
                f"{(torch_final - reference).abs().max():.3g}"
            )
            for stage in stages:
                key = (stage, accum, opt_name)
                runs = [r[key]["history"] for r in per_rank]
                for step in range(STEPS + 1):  # 0 = right after construction
                    for r in range(1, world):
                        assert torch.equal(runs[0][step], runs[r][step]), (
                            f"{key}: rank {r} differs from rank 0 after step {step}"
                        )
                final = runs[0][-1]
                assert torch.allclose(final, reference, rtol=RTOL, atol=ATOL), (
                    f"{key}: differs from single-process training by {(final - reference).abs().max():.3g}"
                )
                assert torch.allclose(final, torch_final, rtol=RTOL, atol=ATOL), (
                    f"{key}: differs from torch DDP by {(final - torch_final).abs().max():.3g}"
                )
    return per_rank


@pytest.mark.parametrize("model_name", ["mlp", "tied", "bn", "llama"])
def test_every_stage_matches_single_process_and_torch_ddp(model_name):
    # The ranks start from different weights, so agreement proves the broadcast.
    assert not torch.equal(
        flat_params(toy_models.build(model_name, 100)), flat_params(toy_models.build(model_name, 101))
    )
    check_equivalence(model_name, world=2)


def test_three_ranks():
    check_equivalence("mlp", world=3, optimizers=("adam",))


@pytest.mark.parametrize("model_name", ["tied", "mlp"])
def test_all_reduce_calls_per_step_follow_the_plan(model_name):
    """Per-parameter stages: one call per trainable tensor (a tied one counts once, a frozen one not at
    all); bucket stages: one per planned bucket; with accumulation, calls only on the sync step, except
    for ``simple``, which has no ``no_sync()`` and so syncs after every micro-batch."""
    per_rank = launch(rank_trainings, model_name, FOUNDATION_STAGES, [1, 3], ["sgd"], world_size=2, timeout_s=120)
    model = toy_models.build(model_name, 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_buckets = len(plan_buckets(trainable, BUCKET_CAP_MB))
    if model_name == "tied":
        assert len(trainable) == 3  # embed (= out, tied) + mix.weight + mix.bias; frozen excluded
    else:
        assert 1 < n_buckets < len(trainable), "the cap should make a few buckets for this to mean something"
    for stage in FOUNDATION_STAGES:
        expected = n_buckets if stage.startswith("bucket") else len(trainable)
        for accum in (1, 3):
            per_step = expected * accum if stage == "simple" else expected
            for rank_result in per_rank:
                calls = rank_result[(stage, accum, "sgd")]["calls"]
                assert calls == [per_step] * STEPS, f"{stage} accum={accum}: {calls}, expected {per_step}/step"


def test_stage_registry_lists_the_build_up_in_order():
    assert list(STAGES)[:6] == FOUNDATION_STAGES
