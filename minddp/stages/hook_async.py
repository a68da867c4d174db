"""Stage ``hook-async``: start each gradient's all_reduce and keep going.

Builds on ``hook``, with one change: the comm hook's Future is kept, not waited for, so autograd
computes the earlier layers' gradients while the later ones travel (1.); just before
``optimizer.step()``, :meth:`finish_gradient_synchronization` waits for every kept Future once and
writes each average back (2.). Real overlap; the cost left is one message per parameter, which
``bucket`` attacks. A forward that records a graph while a Future is still kept is refused (finish was
never called: :func:`~minddp.stages.checks.check_finished`). The change::

         def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
    -        self._write_back(bucket, future.wait())
    +        self.in_flight.append((bucket, future))
         def finish_gradient_synchronization(self) -> None:
    +        for bucket, future in self.in_flight:
    +            self._write_back(bucket, future.wait())

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = AsyncHookDDP(torch.nn.Linear(4, 2))
    >>> model(torch.ones(3, 4)).sum().backward()       # all_reduces started during backward
    >>> len(model.in_flight)                           # one kept Future per parameter
    2
    >>> model.finish_gradient_synchronization()        # wait for them, write back
    >>> model.module.bias.grad
    tensor([3., 3.])

More: ``docs/ladder.md``.
"""

from __future__ import annotations

import torch

from minddp.comm.grad_bucket import GradBucket
from minddp.stages.checks import check_finished
from minddp.stages.hook import HookDDP


class AsyncHookDDP(HookDDP):
    """HookDDP whose all_reduces are waited for only at the end."""

    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight: list[tuple[GradBucket, torch.futures.Future]] = []

    def forward(self, *inputs, **kwargs):
        check_finished(not self.in_flight)  # no Future kept: the last step was finished
        return super().forward(*inputs, **kwargs)

    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        self.in_flight.append((bucket, future))  # step 1: no wait, backward goes on

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all_reduce still in flight and write the averages back (step 2)."""
        super().finish_gradient_synchronization()
        for bucket, future in self.in_flight:
            self._write_back(bucket, future.wait())
        self.in_flight.clear()
