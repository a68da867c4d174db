"""minddp's hooks against torch's: same model, seeds and data, several steps, 2 ranks on gloo.

Oracle 1: torch's DDP with torch's hook, against ``bucket-async`` with
``bucket_cap_mb=None`` (the whole small model in one bucket, as torch's
first bucket holds it) and minddp's hook.

Oracle 2, for per-parameter buckets (which torch's DDP cannot make): torch's
own hook *function* registered on a minddp stage (torch's hooks only call
``bucket.buffer()/index()/gradients()/is_last()``, so they run on our
GradBucket), against minddp's hook on the same stage. That isolates the hook.

PowerSGD starts at iteration 2 (torch's DDP rebuilds its buckets after the
first), with error feedback and warm start on, so every piece of its state
is exercised for four compressed steps.
"""

from __future__ import annotations

import torch
from test_hooks_support import fresh, make_model, params_of, train, wrap
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_default
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch_oracle import cpu_safe_torch_powersgd

from minddp import launch
from minddp.comm import default_hooks
from minddp.comm import powerSGD_hook as psgd

STEPS = 6
PSGD = dict(start_powerSGD_iter=2, use_error_feedback=True, warm_start=True, random_seed=3)


def _torch_psgd(rank: int):
    return torch_psgd.PowerSGDState(None, matrix_approximation_rank=rank, **PSGD), torch_psgd.powerSGD_hook


def _our_psgd(rank: int):
    return psgd.PowerSGDState(None, matrix_approximation_rank=rank, **PSGD), psgd.powerSGD_hook


def cases() -> dict:
    """name -> ((stage, state, hook) with torch's hook, (stage, state, hook) with ours); built in the rank."""
    ours_fp16_psgd = psgd.PowerSGDState(None, matrix_approximation_rank=1, **PSGD)
    torch_fp16_psgd = torch_psgd.PowerSGDState(None, matrix_approximation_rank=1, **PSGD)
    return {
        "allreduce/bucket": (
            ("torch", None, torch_default.allreduce_hook),
            ("bucket-async", None, default_hooks.allreduce_hook),
        ),
        "allreduce/hook": (("torch", None, torch_default.allreduce_hook), ("hook", None, default_hooks.allreduce_hook)),
        "fp16/bucket": (
            ("torch", None, torch_default.fp16_compress_hook),
            ("bucket-async", None, default_hooks.fp16_compress_hook),
        ),
        "fp16/simple": (
            ("torch", None, torch_default.fp16_compress_hook),
            ("simple", None, default_hooks.fp16_compress_hook),
        ),
        "powersgd-r1/bucket": (("torch", *_torch_psgd(1)), ("bucket-async", *_our_psgd(1))),
        "powersgd-r2/bucket": (("torch", *_torch_psgd(2)), ("bucket-async", *_our_psgd(2))),
        "powersgd-r1/hook": (("hook", *_torch_psgd(1)), ("hook", *_our_psgd(1))),
        # torch's hook on the synchronous stage: it issues its second and third
        # collectives from future callbacks, which on an async per-parameter stage
        # pair up differently on the two ranks and hang gloo. Ours issues them from
        # the hook call, so it runs on hook-async and must give the same result.
        "powersgd-r2/hook-async": (("hook", *_torch_psgd(2)), ("hook-async", *_our_psgd(2))),
        # torch's batched hook cannot run in torch 2.13 (it hands a 2-D matrix to an
        # orthogonalizer asserting 3-D: the bare AssertionError); with that one call
        # shimmed (_fix_torch_batched) it runs on our bucket, a plain tensor it may resize.
        "batched-powersgd/bucket": (
            (
                "bucket-async",
                torch_psgd.PowerSGDState(None, matrix_approximation_rank=1, **PSGD),
                torch_psgd.batched_powerSGD_hook,
            ),
            ("bucket-async", psgd.PowerSGDState(None, matrix_approximation_rank=1, **PSGD), psgd.batched_powerSGD_hook),
        ),
        "fp16+powersgd/bucket": (
            ("torch", torch_fp16_psgd, torch_default.fp16_compress_wrapper(torch_psgd.powerSGD_hook)),
            ("bucket-async", ours_fp16_psgd, default_hooks.fp16_compress_wrapper(psgd.powerSGD_hook)),
        ),
    }


def _fix_torch_batched() -> None:
    """Let torch's batched hook orthogonalize its 2-D P and Q as a batch of one (this process only)."""
    original = torch_psgd._orthogonalize
    if getattr(original, "shimmed", False):
        return

    def orthogonalize(matrices, epsilon=0):
        original(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)

    orthogonalize.shimmed = True
    torch_psgd._orthogonalize = orthogonalize


def rank_parity(names: list[str]) -> dict:
    rank = torch.distributed.get_rank()
    _fix_torch_batched()
    cpu_safe_torch_powersgd()  # torch's PowerSGD on CPU ranks of a GPU machine (tests/torch_oracle.py)
    model = make_model()
    out = {}
    for name, sides in cases().items():
        if name not in names:
            continue
        results = []
        for stage, state, hook in sides:
            ddp = wrap(stage, fresh(model), state, hook)
            losses, _ = train(ddp, STEPS, rank)
            results.append((params_of(ddp), losses))
        out[name] = results
    return out


def test_hooks_match_torch():
    names = [
        "allreduce/bucket",
        "allreduce/hook",
        "fp16/bucket",
        "fp16/simple",
        "powersgd-r1/bucket",
        "powersgd-r2/bucket",
        "powersgd-r1/hook",
        "powersgd-r2/hook-async",
        "batched-powersgd/bucket",
        "fp16+powersgd/bucket",
    ]
    per_rank = launch(rank_parity, names, world_size=2)
    for rank, out in enumerate(per_rank):
        assert sorted(out) == sorted(names)
        # Bit for bit, every case: both sides run in this one process, on the same model, data and seeds, and
        # make the same operations in the same order. The local gradients come from the same kernels on the
        # same shapes. allreduce and fp16 then work element by element (cast, divide by 2, a sum of two
        # values: the same roundings whatever the bucket's layout or the gloo release; a sum of two is the
        # same in either order). minddp's PowerSGD makes torch's matmuls on the same shapes in the same order,
        # with the same orthogonalization and the same seeded random Q, on the same buckets (one bucket of
        # the whole model, as torch's holds it from iteration 2; per-parameter buckets, torch's hook function
        # on the same stage). A BLAS or core count that sums a matmul in another order does so on both
        # sides. Any difference is a difference in what the two hooks compute.
        for name, ((theirs, their_losses), (ours, our_losses)) in out.items():
            assert torch.equal(ours, theirs), (
                f"{name} rank {rank}: must match torch bit for bit, max difference "
                f"{float((ours - theirs).abs().max()):.2e}"
            )
            assert torch.equal(torch.as_tensor(our_losses), torch.as_tensor(their_losses)), (name, rank)
    # The replicas agree with each other (every rank applied the same update).
    for name in names:
        assert torch.equal(per_rank[0][name][1][0], per_rank[1][name][1][0]), f"{name}: ranks diverged"


# -- complex gradients: the wire sends a complex bucket as its real view, as torch.distributed does --------


def complex_grads_on_rank() -> dict:
    """One backward of a complex linear layer per configuration; the gradients it leaves, by name."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from minddp.comm.registry import make_hook
    from minddp.ladder import build_stage

    rank = torch.distributed.get_rank()
    x = torch.randn(5, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(10 + rank))

    def model():
        torch.manual_seed(0)
        return nn.Linear(4, 3, dtype=torch.complex64)

    def grads(ddp):
        ddp(x).abs().pow(2).sum().backward()
        getattr(ddp, "finish_gradient_synchronization", lambda: None)()
        return [p.grad.clone() for p in ddp.parameters()]

    # The exact average: each rank's own gradients, gathered, (a + b) / 2 (halving is exact in floating point,
    # so it is bit for bit torch's a/2 + b/2 at 2 ranks).
    local = grads(model())
    every = [[torch.empty_like(g) for _ in range(2)] for g in local]
    for g, gathered in zip(local, every):
        torch.distributed.all_gather(gathered, g)
    out = {"mean": [(a + b) / 2 for a, b in every]}
    # torch's DDP where torch's broadcast takes complex tensors (not 2.6: gloo refuses them, "Invalid scalar type")
    try:
        torch.distributed.broadcast(torch.zeros(1, dtype=torch.complex64), src=0)
        out["torch"] = grads(TorchDDP(model()))
    except RuntimeError as exc:
        if "Invalid scalar type" not in str(exc):
            raise
    for stage in ("hook-async", "bucket-async", "ddp"):
        out[stage] = grads(build_stage(stage, model()))  # the built-in average
        allreduce = build_stage(stage, model())
        allreduce.register_comm_hook(*make_hook("allreduce"))
        out[f"{stage}+allreduce"] = grads(allreduce)
    return out


def test_complex_gradients_average_like_torch():
    # Halving a complex tensor is exact where torch divides each part (2.13, 2.15); torch 2.6's vectorized
    # complex division rounds more than once (up to 2 ulp of the magnitude here, measured), for the stages
    # and torch's DDP alike: there 4 ulp, relative to the magnitude, is the bound.
    z = torch.randn(4096, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    exact = torch.equal(z / 2, torch.complex(z.real / 2, z.imag / 2))
    rtol = 0 if exact else 4 * torch.finfo(torch.float32).eps
    release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    for out in launch(complex_grads_on_rank, world_size=2):
        assert "torch" in out or release < (2, 13), "torch's DDP is the oracle where its broadcast takes complex"
        for name, grads in out.items():
            assert len(grads) == 2 and all(g.dtype == torch.complex64 for g in grads), name
            for ours, ref in zip(grads, out["mean"]):
                torch.testing.assert_close(ours, ref, rtol=rtol, atol=0, msg=name)
