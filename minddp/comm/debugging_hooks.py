"""Hooks for measuring, not for training.

:func:`noop_hook` sends nothing and leaves every rank's local gradient as it
is. Training with it is *wrong* (ranks drift apart); timing with it shows the
headroom: if a step is barely faster with no communication at all,
communication was not the bottleneck, and compressing it will not pay.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import AsyncBucketDDP
    >>> model = AsyncBucketDDP(torch.nn.Linear(4, 2))
    >>> model.register_comm_hook(None, noop_hook)     # time a few steps, then compare
    >>> model(torch.ones(3, 4)).sum().backward(); model.finish_gradient_synchronization()
    >>> model.module.bias.grad                        # this rank's own gradient, not averaged
    tensor([3., 3.])
"""

from __future__ import annotations

from typing import Any

import torch

from minddp.comm.grad_bucket import GradBucket

__all__ = ["noop_hook"]


def noop_hook(_: Any, bucket: GradBucket) -> torch.futures.Future:
    """Return an already-completed future holding the bucket, unchanged: no communication."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
