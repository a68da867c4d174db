"""Stage ``bucket-async``: buckets of gradients, sent while backward goes on, waited for once.

Builds on ``bucket``, with ``hook-async``'s change: a full bucket's Future is kept, not waited for,
and :meth:`finish_gradient_synchronization` waits for them all before ``optimizer.step()``. Written
as one class on ``ga`` (the start, the checks, ``no_sync``) that reads top to bottom, in the shape
of torch's DDP and picotron's ``DataParallelBucket``: plan, autograd hooks, count, send, wait, copy
back. The change from ``bucket`` (``hook``'s autograd hooks move into the class)::

    -class BucketDDP(HookDDP):
    +class AsyncBucketDDP(GradAccumDDP):
    +        handles = [p.register_post_accumulate_grad_hook(lambda p: me()._grad_ready(p)) for p in params]
         def _send_bucket(self, b: int) -> None:
    -        self._sent(bucket, send(self.comm_hook, self.comm_state, bucket))
    +        self.in_flight.append((bucket, send(self.comm_hook, self.comm_state, bucket)))
         def finish_gradient_synchronization(self) -> None:
    +        for bucket, future in self.in_flight:
    +            self._write_back(bucket, future.wait())

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = AsyncBucketDDP(torch.nn.Linear(4, 2), bucket_cap_mb=25)
    >>> model(torch.ones(3, 4)).sum().backward()       # the bucket's all_reduce starts in backward
    >>> model.finish_gradient_synchronization()        # wait for it, write the average back
    >>> model.module.bias.grad
    tensor([3., 3.])

More: ``docs/ladder.md``.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.stages.bucket_plan import bucket_caps, plan_buckets
from minddp.stages.grad_accum import GradAccumDDP


class AsyncBucketDDP(GradAccumDDP):
    """Flat buckets of gradients, each sent from an autograd hook when full and waited for at the end.

    Steps: 1. plan the buckets and hook every trainable parameter; 2. the hook counts each finished
    gradient in its bucket, and the bucket's last one flattens the bucket and sends it, keeping the
    Future; 3. before ``optimizer.step()``, send the buckets that did not fill, wait for every Future
    and copy each average back into ``.grad``.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None):
        super().__init__(module, process_group)  # ga: broadcast, checks, no_sync
        params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_mb = bucket_cap_mb
        # torch's rule: left at None, buckets of 25 MiB but a first one (the last layers) of 1 MiB, so that the
        # first all_reduce starts early in backward; a cap given is every bucket's (docs/ladder.md, "The bucket lesson")
        self.caps = bucket_caps(bucket_cap_mb)
        self.buckets = [[params[i] for i in b] for b in plan_buckets(params, *self.caps)]  # step 1
        self.bucket_of = {p: b for b, members in enumerate(self.buckets) for p in members}
        self.waiting = [len(members) for members in self.buckets]  # gradients each bucket waits for
        self.in_flight: list[tuple[GradBucket, torch.futures.Future]] = []  # sent, not yet waited for
        me = weakref.ref(self)  # as hook.py: autograd's C++ side holds the hooks, so hold us weakly
        handles = [p.register_post_accumulate_grad_hook(lambda p: me()._grad_ready(p)) for p in params]
        weakref.finalize(self, lambda: [h.remove() for h in handles])

    def _grad_ready(self, param: nn.Parameter) -> None:
        if self.sync_this_backward:  # step 2
            self.parameters_used.check()  # before the first send of the step (a no-op after it)
            b = self.bucket_of[param]
            self.waiting[b] -= 1
            if self.waiting[b] == 0:
                self._send_bucket(b)

    def _send_bucket(self, b: int) -> None:
        members = self.buckets[b]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in members])
        bucket = GradBucket(b, flat, members, is_last=b == len(self.buckets) - 1)
        self.in_flight.append((bucket, send(self.comm_hook, self.comm_state, bucket)))  # no wait

    def finish_gradient_synchronization(self) -> None:
        """Send the buckets that did not fill (zeros where a gradient is missing), wait for all (step 3)."""
        if self.sync_this_backward:  # after a no_sync() backward: nothing in flight, nothing to check
            self.parameters_used.check()  # if no gradient came at all, nothing was checked yet
            for b, waiting in enumerate(self.waiting):
                if waiting > 0:
                    self._send_bucket(b)
            self.waiting = [len(members) for members in self.buckets]
        for bucket, future in self.in_flight:
            self._write_back(bucket, future.wait())
        self.in_flight.clear()

    def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
        pieces = average.view(-1).split([p.numel() for p in bucket.parameters()])  # step 3
        for param, piece in zip(bucket.parameters(), pieces):
            if param.grad is not None:
                param.grad.copy_(piece.view_as(param.grad))
