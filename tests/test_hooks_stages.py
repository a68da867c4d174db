"""Every stage takes every hook: gradients against a single-process oracle, and training.

Oracle: each rank recomputes, without any wrapper, the gradient of the mean
loss over *both* ranks' batches (the global batch). With no hook or with
``allreduce_hook`` a stage must give that gradient (to float rounding);
fp16/bf16 within their precision; ``noop_hook`` must leave exactly this
rank's local gradient.

Training: hooks that torch cannot run on gloo (bf16, batched PowerSGD) and the
wrapped combinations lower the loss on a fixed evaluation batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from test_hooks_support import batch, fresh, loss_fn, make_model, train, wrap

from minddp import launch
from minddp.comm import make_hook
from minddp.ladder import SHARDED_GRADIENTS, STAGES

HOOKS = [None, "allreduce", "fp16", "torch-fp16-wrapper", "bf16", "noop"]
TRAIN_HOOKS = ["bf16", "batched-powersgd", "fp16+powersgd", "bf16+powersgd", "bf16+batched-powersgd"]
PSGD = dict(start_powerSGD_iter=2, matrix_approximation_rank=2)


def grads_of(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def oracle_grads(model, rank: int, world: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(global-batch gradient, this rank's local gradient, the mean over ranks of |local gradient|), in one process."""
    m = fresh(model)
    sum(loss_fn(m, batch(r, 0)) for r in range(world)).div(world).backward()
    global_grads = grads_of(m)
    local = []
    for r in range(world):
        m = fresh(model)
        loss_fn(m, batch(r, 0)).backward()
        local.append(grads_of(m))
    magnitude = [sum(g[i].abs() for g in local) / world for i in range(len(global_grads))]
    return global_grads, local[rank], magnitude


#: Unit roundoff (round to nearest: relative error <= u) and half the smallest subnormal spacing (the absolute
#: error of a rounding below the smallest normal) of each dtype a hook averages in.
ROUNDOFF = {
    torch.float32: (2.0**-24, 2.0**-150),
    torch.float16: (2.0**-11, 2.0**-25),
    torch.bfloat16: (2.0**-8, 2.0**-134),
}
HOOK_DTYPE = {
    None: torch.float32,
    "allreduce": torch.float32,
    "fp16": torch.float16,
    "torch-fp16-wrapper": torch.float16,
    "bf16": torch.bfloat16,
}


def averaging_bound(name, magnitude: torch.Tensor, world: int) -> torch.Tensor:
    """Per element, how far an average over ``world`` ranks computed in ``name``'s dtype may be from the exact one.

    A hook rounds each element at most ``world + 1`` times (the cast, a division by the world size, the
    ``world − 1`` additions of the sum, in any order: gloo's, any machine's); each rounding is off by at most
    ``u`` of its value or, below the smallest normal, by half a subnormal spacing: ``γ_{world+1}·m + (world + 1)·η``
    with ``m`` the mean of the ranks' |gradient| (the sum's terms can cancel: the error scales with their
    magnitude). The oracle's own float32 sum adds ``γ_{world+1}(2**-24)·m``. The local gradients themselves are
    the same on both sides: the same kernels on the same shapes, the oracle's 1/world scaling exact (a power of 2).
    """

    def gamma(n, u):
        return n * u / (1 - n * u)

    u, eta = ROUNDOFF[HOOK_DTYPE[name]]
    return (gamma(world + 1, u) + gamma(world + 1, 2.0**-24)) * magnitude + (world + 1) * (eta + 2.0**-150)


def hook_named(name):
    if name == "torch-fp16-wrapper":  # torch's own composition; its future holds the fp16 buffer
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks

        return None, torch_hooks.fp16_compress_wrapper(torch_hooks.allreduce_hook)
    return make_hook(name) if name else (None, None)


def rank_stage_grads(stages: list[str]) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    out = {"oracle": oracle_grads(model, rank, world)}
    for stage in stages:
        for name in HOOKS:
            state, hook = hook_named(name)
            ddp = wrap(stage, fresh(model), state, hook, bucket_cap_mb=0.002)  # several buckets
            loss_fn(ddp, batch(rank, 0)).backward()
            finish = getattr(ddp, "finish_gradient_synchronization", None)
            if finish is not None:
                finish()
            out[stage, name] = grads_of(ddp.module)
    return out


def test_every_stage_takes_every_stateless_hook():
    # zero2 and fsdp take the reduce-scatter form of these hooks: tests/test_sharding_stages.py
    stages = [s for s in STAGES if s not in SHARDED_GRADIENTS]
    for rank, out in enumerate(launch(rank_stage_grads, stages, world_size=2)):
        global_grads, local_grads, magnitude = out["oracle"]
        for stage in stages:
            for name in HOOKS:
                got = out[stage, name]
                tag = f"stage {stage}, hook {name}, rank {rank}"
                if name == "noop":
                    for g, want in zip(got, local_grads):
                        assert torch.equal(g, want), tag
                    assert not all(torch.allclose(g, w) for g, w in zip(got, global_grads)), tag
                    continue
                for g, want, m in zip(got, global_grads, magnitude):  # within the rounding the dtype allows
                    excess = (g - want).abs() - averaging_bound(name, m, 2)
                    assert float(excess.max()) <= 0, (tag, float(excess.max()))
                if name == "allreduce":  # the default path and the explicit hook are one computation
                    assert all(torch.equal(a, b) for a, b in zip(got, out[stage, None])), tag
                if name == "torch-fp16-wrapper":  # torch's wrapper computes what minddp's fp16 hook computes
                    assert all(torch.equal(a, b) for a, b in zip(got, out[stage, "fp16"])), tag


def eval_loss(model) -> float:
    with torch.no_grad():
        return sum(float(loss_fn(model, batch(r, 10_000))) for r in range(2)) / 2


def rank_train(cases: list[tuple[str, str]]) -> dict:
    rank = dist.get_rank()
    model = make_model()
    before = eval_loss(model)
    out = {}
    for stage, name in cases:
        state, hook = make_hook(name, **PSGD)
        ddp = wrap(stage, fresh(model), state, hook)
        train(ddp, 25, rank)
        out[stage, name] = (before, eval_loss(ddp.module))
    return out


def test_gloo_only_hooks_and_wrappers_train():
    cases = [("bucket-async", n) for n in TRAIN_HOOKS] + [
        ("hook-async", "batched-powersgd"),
        ("hook-async", "bf16+powersgd"),
    ]
    for out in launch(rank_train, cases, world_size=2):
        for case, (before, after) in out.items():
            assert after < 0.7 * before, f"{case}: eval loss {before:.4f} -> {after:.4f}"
