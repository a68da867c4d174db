"""How much a compressing hook changes the gradient: ||g - ĝ|| / ||g||, measured beside it, and bounded.

:func:`error_measured` wraps any hook. For each bucket it

1. copies the uncompressed gradient (before the hook touches the buffer) and
   averages that copy *exactly*, straight through torch, with the mean of the
   ranks' magnitudes ``|g|`` beside it in the same all_reduce, waiting for it
   here (not counted by the wire's meter: it is measurement, not training
   traffic; and waiting keeps the comparison below free of any second Future);
2. runs the wrapped hook as usual;
3. when the hook's result is in, adds ||ĝ - g||² and ||g||² to ``traffic``
   (and the magnitudes' sums that :func:`rounding_bound` reads) and hands back
   that result, untouched. This runs on the backend's thread, maybe beside
   another bucket's step 3: :meth:`Traffic.measured` adds under a lock.

:func:`rounding_bound` is the most a 16-bit average can be off by rounding alone, derived from the
operation: the exercise checker judges a learner's fp16 hook by it, and notebook 04 checks the
package's fp16 and bf16 hooks against it.

Nothing of this runs unless the hook is wrapped, so measuring costs nothing
when it is not asked for.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import AsyncBucketDDP
    >>> from minddp.comm.powerSGD_hook import PowerSGDState, powerSGD_hook
    >>> traffic, model = Traffic(), AsyncBucketDDP(torch.nn.Linear(16, 16))
    >>> state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    >>> model.register_comm_hook(state, error_measured(powerSGD_hook, traffic))
    >>> for _ in range(3):
    ...     model(torch.randn(8, 16)).pow(2).sum().backward(); model.finish_gradient_synchronization()
    >>> 0 < traffic.relative_error() < 1             # rank 1 of a 16 x 16 gradient: a coarse picture
    True
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.wire import Traffic, Wire
from minddp.runtime import keep


def _group_of(state) -> dist.ProcessGroup:
    """The process group behind a hook state: a group, a Wire, or a state holding one (PowerSGD's)."""
    group = getattr(state, "process_group", state)
    return Wire.of(group).group


def reference_average(values: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference average g of ``values`` over ``group``, and the ranks' mean magnitude, in float32, by plain
    averaging's order: each rank divides by the world size, then one all_reduce sums (the checker's too)."""
    flat = values.to(torch.float32, copy=True).view(-1)
    both = torch.cat([flat, flat.abs()]).div_(group.size())
    dist.all_reduce(*keep.held(both), group=group)  # kept until gloo lets go of it
    exact, magnitude = both.split(flat.numel())
    return exact, magnitude


def squared_error(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """``(‖ĝ − g‖², ‖g‖²)`` of one bucket: :meth:`Traffic.relative_error` is the root of their sums' ratio."""
    return float((got.float().view(-1) - exact).pow(2).sum()), float(exact.pow(2).sum())


def error_measured(hook, traffic: Traffic):
    """``hook``, with the relative error of its average accumulated into ``traffic`` (module doc)."""

    @functools.wraps(hook)
    def measured(state, bucket: GradBucket) -> torch.futures.Future:
        exact, magnitude = reference_average(bucket.buffer(), _group_of(state))  # step 1
        fut = hook(state, bucket)  # step 2

        def compare(done: torch.futures.Future):  # step 3
            result = done.value()
            got = result[0] if isinstance(result, list) else result
            error_sq, norm_sq = squared_error(got, exact)
            magnitude_sq = float(magnitude.pow(2).sum())
            # on a backend thread, maybe beside another bucket's: computed first, added as one step
            traffic.measured(error_sq, norm_sq, magnitude_sq, float(magnitude.sum()), magnitude.numel())
            return result

        return keep.then(fut, compare)

    measured.__name__ = f"error_measured({getattr(hook, '__name__', 'hook')})"
    return measured


def _gamma(n: int, u: float) -> float:
    """Higham's γ_n = n·u / (1 − n·u): the relative error bound of n roundings in a row, in any order."""
    return n * u / (1 - n * u)


def rounding_bound(dtype: torch.dtype, world: int, magnitude_sq: float, magnitude_sum: float, values: int) -> float:
    """The most ||ĝ − g|| can be when ĝ averages ``world`` float32 gradients in ``dtype`` (float16, bfloat16).

    Divide by ||g|| for the relative error. Derived from the operation, for any
    order of the sum (gloo's, a BLAS's: any machine): each value is rounded at
    most ``world + 1`` times, by the cast to ``dtype``, the division by the
    world size (before or after the sum) and the ``world − 1`` additions (the
    cast back to float32 is exact). Each rounding is off by at most
    ``u = eps / 2`` of its result, or by half the spacing of ``dtype``'s
    subnormals where the result is below its smallest normal. So element ``i``
    is off by at most ``b_i = γ_{world+1}(u) · a_i + (world + 1) · tiny · eps / 2``,
    with ``γ_k(u) = k·u / (1 − k·u)``, ``tiny`` and ``eps`` ``dtype``'s
    ``torch.finfo``, and ``a_i`` the mean of the ranks' ``|g_i|`` (the terms of
    a sum can cancel: its error scales with their magnitudes, not with the
    average), plus ``γ_{world+1}(2**-24) · a_i`` for the float32 average it is
    compared with. The norm of the ``b_i`` bounds ||ĝ − g||; it needs only the
    sums of ``a_i²``, of ``a_i`` and the number of values
    (``||b||² = γ² Σa² + 2γ·c Σa + N c²``, ``c`` the second term of ``b_i``).
    """
    info = torch.finfo(dtype)
    gamma = _gamma(world + 1, info.eps / 2) + _gamma(world + 1, torch.finfo(torch.float32).eps / 2)
    c = (world + 1) * info.smallest_normal * info.eps / 2  # half the subnormal spacing, per rounding
    return math.sqrt(gamma**2 * magnitude_sq + 2 * gamma * c * magnitude_sum + values * c**2)
