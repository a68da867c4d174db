"""What torch 2.13's own sharding does on CPU/gloo: each row of docs/sharding.md's table, pinned by a test.

Oracle: single-process training on the global batch (for 16-bit compute, a
single process that casts the weights the same way and averages each rank's
shard's gradient in fp32, as in ``test_sharding_stages``). Each test states
torch's behaviour today; if a torch release changes it, the test fails and
the table must change with it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import toy_models

from minddp import launch
from minddp.runtime import compat

STEPS, ROWS = 3, 4


def flat(model) -> torch.Tensor:
    return torch.cat(
        [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1) for p in model.parameters()]
    )


def zero_run(option: str):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    model = toy_models.build("mlp", 100 + rank)
    ddp = DistributedDataParallel(model)
    try:
        if option == "overlap_with_ddp":
            from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            optimizer = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=0.01, overlap_with_ddp=True)
            ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, optimizer))
        else:
            optimizer = ZeroRedundancyOptimizer(
                ddp.parameters(),
                torch.optim.AdamW,
                lr=0.01,
                parameters_as_bucket_view=option == "parameters_as_bucket_view",
            )
    except RuntimeError as exc:
        return f"refused: {exc}"
    for batch in toy_models.global_batches("mlp", STEPS, ROWS * world):
        toy_models.loss_fn(ddp, toy_models.shard(batch, rank, world)).backward()
        optimizer.step()
        optimizer.zero_grad()
    optimizer.consolidate_state_dict(to=0)
    state = optimizer.state_dict() if rank == 0 else None
    return flat(model), state


def fsdp_run(option: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    model = toy_models.build("mlp", 100)
    # the CPU, said explicitly: fully_shard's default mesh is cuda:<rank> wherever CUDA is available
    kwargs, dtype = (
        {"mesh": init_device_mesh("cpu", (world,))},
        {"bf16": torch.bfloat16, "fp16": torch.float16}.get(option),
    )
    if dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if option == "reshard_after_forward=False":
        kwargs["reshard_after_forward"] = False
    for layer in model.net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in toy_models.global_batches("mlp", STEPS, ROWS * world):
        mine = toy_models.shard(batch, rank, world)
        out = model(mine["x"].to(dtype) if dtype is not None else mine["x"])
        torch.nn.functional.cross_entropy(out.float(), mine["y"]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat(model), str(model.net[0].weight.device)


def gloo_collectives():
    rank, world = dist.get_rank(), dist.get_world_size()
    averaged, scattered = torch.full((4,), float(rank + 1)), torch.zeros(2)
    try:
        dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
        compat.reduce_scatter_single(scattered, torch.full((2 * world,), float(rank + 1)), op=dist.ReduceOp.AVG)
    except RuntimeError as exc:  # torch 2.6's gloo: "Cannot use ReduceOp.AVG with Gloo"
        averaged = scattered = str(exc)
    work = compat.reduce_scatter_single(torch.zeros(2), torch.ones(2 * world), async_op=True)
    try:
        work.get_future()
        future = "has a Future"
    except RuntimeError as exc:
        future = str(exc)
    work.wait()
    as_list = lambda t: t if isinstance(t, str) else t.tolist()  # noqa: E731
    return as_list(averaged), as_list(scattered), future


def fsdp_refusal() -> str:
    """Where compat says torch's fully_shard has no CPU path (torch 2.6): what its first forward raises."""
    try:
        fsdp_run("fp32")
    except AttributeError as exc:
        return str(exc)
    return "trained"


def rank_main() -> dict:
    fsdp = (
        {o: fsdp_run(o) for o in ("fp32", "reshard_after_forward=False", "bf16", "fp16")}
        if compat.TORCH_FULLY_SHARD_ON_CPU
        else {"refused": fsdp_refusal()}
    )
    return {
        "zero": {o: zero_run(o) for o in ("plain", "parameters_as_bucket_view", "overlap_with_ddp")},
        "fsdp": fsdp,
        "gloo": gloo_collectives(),
    }


def single(world: int, optimizer: str, dtype=None) -> tuple[torch.Tensor, dict]:
    model = toy_models.build("mlp", 100)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=0.01)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=0.1)
    )
    for batch in toy_models.global_batches("mlp", STEPS, ROWS * world):
        for r in range(world) if dtype is not None else [None]:
            if r is None:
                toy_models.loss_fn(model, batch).backward()
                continue
            mine = toy_models.shard(batch, r, world)
            cast = {n: p.to(dtype) for n, p in model.named_parameters()}
            out = torch.func.functional_call(model, cast, (mine["x"].to(dtype),))
            (torch.nn.functional.cross_entropy(out.float(), mine["y"]) / world).backward()
        opt.step()
        opt.zero_grad()
    return flat(model), opt.state_dict()


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def runs(request):
    return request.param, launch(rank_main, world_size=request.param, timeout_s=180)


def test_zero_redundancy_optimizer_works_on_gloo(runs):
    """Rows: ZeroRedundancyOptimizer (plain, parameters_as_bucket_view, consolidate_state_dict) works."""
    world, per_rank = runs
    reference, state = single(world, "adamw")
    for option in ("plain", "parameters_as_bucket_view"):
        final, consolidated = per_rank[0]["zero"][option]
        assert torch.allclose(final, reference, rtol=1e-5, atol=1e-6), option
        assert consolidated["state"].keys() == state["state"].keys()


def test_zero_overlap_with_ddp_is_refused_on_gloo(runs):
    """Row: overlap_with_ddp=True (ZeRO stepping inside DDP's hook) refuses gloo at construction."""
    _, per_rank = runs
    # torch 2.13 and 2.15 name gloo; 2.6 says what it needs instead ("... requires NCCL/HCCL backend ...")
    assert all(
        r["zero"]["overlap_with_ddp"].startswith("refused: Gloo backend using Overlapping DDP with ZeRO")
        or r["zero"]["overlap_with_ddp"].startswith(
            "refused: Overlapping DDP with ZeRO using this approach currently requires NCCL"
        )
        for r in per_rank
    )


def test_fully_shard_trains_correctly_on_gloo(runs):
    """Rows: fully_shard per layer + root, fp32 and reshard_after_forward=False: the single-process result
    (the silent wrong average of pytorch#162338 is gone in 2.13); bf16/fp16 params with fp32 reduce:
    within 1e-4 of a single process casting the same way. Parameters stay on the CPU."""
    world, per_rank = runs
    if not compat.TORCH_FULLY_SHARD_ON_CPU:  # torch 2.6: the flag is checked against what torch does
        assert "record_event" in per_rank[0]["fsdp"]["refused"], per_rank[0]["fsdp"]
        pytest.skip(f"torch {torch.__version__}'s fully_shard has no CPU path (torch.cpu.Stream.record_event)")
    reference, _ = single(world, "sgd")
    for option in ("fp32", "reshard_after_forward=False"):
        final, device = per_rank[0]["fsdp"][option]
        assert device == "cpu" and torch.allclose(final, reference, rtol=1e-5, atol=1e-6), option
    for option, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        final, _ = per_rank[0]["fsdp"][option]
        assert (final - single(world, "sgd", dtype)[0]).abs().max() <= 1e-4, option


def test_gloo_averages_and_reduce_scatters_but_its_reduce_scatter_has_no_future(runs):
    """Rows: gloo's ReduceOp.AVG is right for all_reduce and reduce_scatter_single; reduce_scatter_single's
    work hands back no Future (so minddp's wire reduce-scatters through all_reduce on gloo)."""
    world, per_rank = runs
    mean = sum(range(1, world + 1)) / world
    release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    for averaged, scattered, future in (r["gloo"] for r in per_rank):
        if release < (2, 13) and isinstance(averaged, str):  # 2.6: refused, loudly (not a wrong average)
            assert "Cannot use ReduceOp.AVG with Gloo" in averaged
        else:
            assert averaged == [mean] * 4 and scattered == [mean] * 2
        assert "not implemented" in future
