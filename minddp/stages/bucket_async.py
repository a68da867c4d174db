"""Stage ``bucket-async``: buckets of gradients, sent while backward goes on, waited for once.

Builds on ``bucket``, with ``hook-async``'s change and nothing else: a full bucket's Future is kept, not
waited for, so autograd computes the earlier layers' gradients while it travels (1.); before
``optimizer.step()``, :meth:`finish_gradient_synchronization` sends the buckets that did not fill, waits
for every kept Future and copies each average back (2.): the shape of torch's DDP. The change::

         def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
    -        self._write_back(bucket, future.wait())
    +        self.in_flight.append((bucket, future))
         def finish_gradient_synchronization(self) -> None:
    +        for bucket, future in self.in_flight:
    +            self._write_back(bucket, future.wait())

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = AsyncBucketDDP(torch.nn.Linear(4, 2), bucket_cap_mb=25)
    >>> model(torch.ones(3, 4)).sum().backward()       # the bucket's all_reduce starts in backward
    >>> model.finish_gradient_synchronization()        # wait for it, write the average back
    >>> model.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import torch

from minddp.comm.grad_bucket import GradBucket
from minddp.stages.bucket import BucketDDP


class AsyncBucketDDP(BucketDDP):
    """BucketDDP whose buckets are waited for only at the end."""

    def __init__(self, module, process_group=None, bucket_cap_mb: float | None = None):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight: list[tuple[GradBucket, torch.futures.Future]] = []  # sent, not yet waited for

    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        self.in_flight.append((bucket, future))  # step 1: no wait, backward goes on

    def finish_gradient_synchronization(self) -> None:
        """Send the buckets that did not fill, then wait for every bucket in flight and copy it back (step 2)."""
        super().finish_gradient_synchronization()
        for bucket, future in self.in_flight:
            self._write_back(bucket, future.wait())
        self.in_flight.clear()
