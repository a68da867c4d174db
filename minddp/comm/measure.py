"""How much a compressing hook changes the gradient: ||g - ĝ|| / ||g||, measured beside it.

:func:`error_measured` wraps any hook. For each bucket it

1. copies the uncompressed gradient (before the hook touches the buffer) and
   averages that copy *exactly*, straight through torch, waiting for it here
   (not counted by the wire's meter: it is measurement, not training
   traffic; and waiting keeps the comparison below free of any second Future);
2. runs the wrapped hook as usual;
3. when the hook's result is in, adds ||ĝ - g||² and ||g||² to ``traffic``
   and hands back that result, untouched.

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

import torch
import torch.distributed as dist

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.wire import Traffic, Wire


def _group_of(state) -> dist.ProcessGroup:
    """The process group behind a hook state: a group, a Wire, or a state holding one (PowerSGD's)."""
    group = getattr(state, "process_group", state)
    return Wire.of(group).group


def error_measured(hook, traffic: Traffic):
    """``hook``, with the relative error of its average accumulated into ``traffic`` (module doc)."""

    @functools.wraps(hook)
    def measured(state, bucket: GradBucket) -> torch.futures.Future:
        group = _group_of(state)
        exact = bucket.buffer().to(torch.float32, copy=True).div_(group.size())  # step 1
        dist.all_reduce(exact, group=group)
        fut = hook(state, bucket)  # step 2

        def compare(done: torch.futures.Future):  # step 3
            result = done.value()
            got = result[0] if isinstance(result, list) else result
            traffic.error_sq += float((got.float().view(-1) - exact).pow(2).sum())
            traffic.norm_sq += float(exact.pow(2).sum())
            return result

        return fut.then(compare)

    measured.__name__ = f"error_measured({getattr(hook, '__name__', 'hook')})"
    return measured
