"""Stage ``bucket``: fewer, bigger messages.

Every collective pays a fixed cost (a round trip, a thread hand-off, a kernel
launch) before its bytes move. A model with hundreds of small parameters pays
it hundreds of times a step under :mod:`hook`. Buckets pay it a few times:

1. at construction, **plan** the buckets
   (:func:`~minddp.stages.bucket_plan.plan_buckets`: parameters in reverse
   order, since backward finishes the last layers first; ``bucket_cap_mb`` per
   bucket, ``None`` = one bucket);
2. in the autograd hook, count the parameter in its bucket; when the bucket's
   last gradient arrives, **flatten** the bucket's gradients into one buffer
   and hand it to the comm hook: one all_reduce for all of them;
3. when the average is back, **copy** each slice into its parameter's ``.grad``.

As in :mod:`hook`, each bucket is waited for inside backward;
:mod:`bucket_async` lets it travel while backward goes on.

A parameter that gets no gradient in a backward leaves its bucket unfilled.
:meth:`finish_gradient_synchronization` sends such buckets anyway (zeros
where a gradient is missing; a parameter without ``.grad`` keeps none), so
every rank sends the same buckets.

Example::

    >>> model = BucketDDP(net, bucket_cap_mb=1)
    >>> model(x).sum().backward()
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from __future__ import annotations

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.stages.bucket_plan import plan_buckets
from minddp.stages.hook import HookDDP


class BucketDDP(HookDDP):
    """Coalesce gradients into flat buckets; one comm-hook call per bucket."""

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = 25):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_mb = bucket_cap_mb
        self.buckets = [[params[i] for i in b] for b in plan_buckets(params, bucket_cap_mb)]   # step 1
        self.bucket_of = {p: b for b, members in enumerate(self.buckets) for p in members}
        self.waiting = [len(members) for members in self.buckets]    # gradients each bucket waits for

    def _grad_ready(self, param: nn.Parameter) -> None:
        if self.sync_this_backward:                                                  # step 2
            self.parameters_used.check()          # before the first send of the step (a no-op after it)
            b = self.bucket_of[param]
            self.waiting[b] -= 1
            if self.waiting[b] == 0:
                self._send_bucket(b)

    def _send_bucket(self, b: int) -> None:
        members = self.buckets[b]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in members])
        bucket = GradBucket(b, flat, members, is_last=b == len(self.buckets) - 1)
        self._sent(bucket, send(self.comm_hook, self.comm_state, bucket))

    def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
        pieces = average.view(-1).split([p.numel() for p in bucket.parameters()])   # step 3
        for param, piece in zip(bucket.parameters(), pieces):
            if param.grad is not None:
                param.grad.copy_(piece.view_as(param.grad))

    def finish_gradient_synchronization(self) -> None:
        """Send the buckets that did not fill (see the module doc), then finish as :mod:`hook` does."""
        if self.sync_this_backward:
            self.parameters_used.check()          # if no gradient came at all, nothing was checked yet
            for b, waiting in enumerate(self.waiting):
                if waiting > 0:
                    self._send_bucket(b)
            self.waiting = [len(members) for members in self.buckets]
        super().finish_gradient_synchronization()
