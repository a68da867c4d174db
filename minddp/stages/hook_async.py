"""Stage ``hook-async``: start each gradient's all_reduce and keep going.

One change to :mod:`hook`: when a parameter's comm hook returns its Future,
we do *not* wait on it. The Future is kept, and autograd goes on computing
the earlier layers' gradients while gloo/NCCL moves the later layers' ones:

1. in the autograd hook, start the all_reduce and keep ``(bucket, future)``;
2. in :meth:`finish_gradient_synchronization`, just before
   ``optimizer.step()``, wait for every kept Future once and write each
   average back.

That is real overlap: communication hidden behind computation. The cost left
is one collective per parameter, each paying the fixed latency of a message;
:mod:`bucket` attacks that.

Example::

    >>> model = AsyncHookDDP(net)
    >>> model(x).sum().backward()               # all_reduces run during backward
    >>> model.finish_gradient_synchronization()  # wait for them, write back
"""

from __future__ import annotations

import torch

from minddp.comm.grad_bucket import GradBucket
from minddp.stages.hook import HookDDP


class AsyncHookDDP(HookDDP):
    """HookDDP whose all_reduces are waited for only at the end."""

    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight: list[tuple[GradBucket, torch.futures.Future]] = []

    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        self.in_flight.append((bucket, future))          # step 1: no wait, backward goes on

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all_reduce still in flight and write the averages back (step 2)."""
        super().finish_gradient_synchronization()
        for bucket, future in self.in_flight:
            self._write_back(bucket, future.wait())
        self.in_flight.clear()
