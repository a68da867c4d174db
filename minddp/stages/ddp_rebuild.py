"""Rebuilding the bucket plan from the order in which gradients really became ready.

Before any backward, the order gradients will arrive in is a guess (torch,
and so the ``ddp`` stage, start from one bucket of everything). Models often
register layers in another order than they use them, so a bucket planned on a
guess could wait for a gradient that comes much later and block every bucket
after it (launches are strictly in order). After the first synced backward
the wrapper knows the real order, so, at the next forward:

1. rank 0 broadcasts the order it observed (ranks usually agree, but any
   difference would make ranks pair different buckets in their collectives:
   everyone takes rank 0's);
2. every rank plans buckets over the parameters in that order with the same
   caps as before (:func:`~minddp.stages.bucket_plan.plan_buckets`, which walks
   its input in reverse, so it is handed the order reversed);
3. this happens once (torch does the same), and only when every parameter got
   a gradient (with ``find_unused_parameters`` the order changes step to step,
   so torch keeps the static plan there too).

Example::

    >>> plan = plan_from_order(params, [3, 1, 2, 0], bucket_cap_mb=25, first_bucket_cap_mb=1)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.comm import wire
from minddp.stages.bucket_plan import plan_buckets


def agree_on_order(order: list[int], n_params: int, group: dist.ProcessGroup) -> list[int] | None:
    """Step 1: rank 0's ready order on every rank; None if rank 0 did not see every parameter."""
    message = torch.full((n_params,), -1, dtype=torch.int64)
    if len(order) == n_params:
        message[:] = torch.tensor(order, dtype=torch.int64)
    dist.broadcast(message, src=wire.src_rank(group), group=group)
    agreed = message.tolist()
    return None if -1 in agreed else agreed


def plan_from_order(params: list[torch.Tensor], order: list[int], bucket_cap_mb: float | None,
                    first_bucket_cap_mb: float | None) -> list[list[int]]:
    """Step 2: buckets that fill in ``order`` (indices into ``params``), capped like the static plan."""
    backwards = list(reversed(order))                  # plan_buckets walks its input from the end
    plan = plan_buckets([params[i] for i in backwards], bucket_cap_mb, first_bucket_cap_mb)
    return [[backwards[j] for j in bucket] for bucket in plan]
