"""The production DDP's bucket plans: torch's first-iteration plan, and the plan rebuilt from observed order.

:mod:`minddp.stages.bucket` plans once, from registration order. torch's DDP, and so this one, does
three things more, to train bit for bit like torch from the first step and to launch buckets as early
as the real gradient order allows:

0. **the caps** (:func:`torch_caps`): the teaching stages' rule (:func:`~minddp.stages.bucket_plan.bucket_caps`:
   ``bucket_cap_mb`` left at ``None`` means 25 MiB buckets and a smaller first one; a cap given is every
   bucket's), the first bucket's cap read from torch's own knob (1 MiB, through
   :func:`~minddp.runtime.compat.default_first_bucket_bytes`) when the DDP is built, as torch reads it;
1. **the first iteration** (:func:`plan_first_iteration_like_torch`): one bucket per (dtype, device)
   in registration order (capped buckets, launched last-filled first, with ``find_unused_parameters``);
2. **the rebuild**, once, at the forward after the first synced backward: rank 0 broadcasts the order
   it saw gradients become ready (:func:`agree_on_order`) and every rank plans buckets in that order
   with the same caps (:func:`plan_from_order`).

Why the first plan decides the rounding: ``docs/ddp.md`` (The bucket plans).

Example (4 KiB weights, 64 B biases)::

    >>> torch_caps(None), torch_caps(4)
    ((25.0, 1.0), (4, None))
    >>> params = [torch.zeros(32, 32), torch.zeros(16), torch.zeros(32, 32), torch.zeros(16)]
    >>> plan_first_iteration_like_torch(params, 25, 1, find_unused_parameters=False)
    [[0, 1, 2, 3]]
    >>> plan_from_order(params, [3, 1, 2, 0], bucket_cap_mb=1 / 256, first_bucket_cap_mb=1 / 512)
    [[3, 1, 2], [0]]
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.runtime import compat
from minddp.runtime.device import message_device
from minddp.stages.bucket_plan import MB, bucket_caps, plan_buckets


def torch_caps(bucket_cap_mb: float | None) -> tuple[float, float | None]:
    """Step 0: ``(cap, first bucket's cap or None)`` as torch's DDP sets them from its ``bucket_cap_mb``.

    At the default, the first cap is torch's own knob, read now as torch reads it when it builds its DDP.
    """
    return bucket_caps(bucket_cap_mb, compat.default_first_bucket_bytes() / MB)


def plan_first_iteration_like_torch(
    params: list[torch.Tensor],
    bucket_cap_mb: float | None,
    first_bucket_cap_mb: float | None,
    find_unused_parameters: bool,
) -> list[list[int]]:
    """Step 1: the plan torch's DDP starts from (indices into ``params``)."""
    keys = {(p.dtype, p.device) for p in params}
    if not find_unused_parameters or bucket_cap_mb is None:
        buckets = [[i for i, p in enumerate(params) if (p.dtype, p.device) == key] for key in keys]
    else:
        n = len(params)
        forward = plan_buckets(params[::-1], bucket_cap_mb, first_bucket_cap_mb)  # it walks its input from the end
        buckets = [[n - 1 - j for j in bucket] for bucket in forward]
    return sorted(buckets, key=min, reverse=True)


def agree_on_order(order: list[int], n_params: int, group: dist.ProcessGroup) -> list[int] | None:
    """Step 2: rank 0's ready order on every rank; None if rank 0 did not see every parameter."""
    message = torch.full((n_params,), -1, dtype=torch.int64, device=message_device(group))
    if len(order) == n_params:
        message[:] = torch.tensor(order, dtype=torch.int64, device=message.device)
    dist.broadcast(message, group_src=0, group=group)
    agreed = message.tolist()
    return None if -1 in agreed else agreed


def plan_from_order(
    params: list[torch.Tensor], order: list[int], bucket_cap_mb: float | None, first_bucket_cap_mb: float | None
) -> list[list[int]]:
    """Step 2: buckets that fill in ``order`` (indices into ``params``), capped like the first plan."""
    backwards = list(reversed(order))  # plan_buckets walks its input from the end
    plan = plan_buckets([params[i] for i in backwards], bucket_cap_mb, first_bucket_cap_mb)
    return [[backwards[j] for j in bucket] for bucket in plan]
