"""Stage ``bucket``: fewer, bigger messages.

Builds on ``hook``: each collective's fixed cost is paid per bucket, not per parameter (docs/ladder.md,
"``bucket``", steps 1-3): 1. **plan** the buckets (:func:`~minddp.stages.bucket_plan.plan_buckets`);
2. at a bucket's last gradient, **flatten** it for the comm hook; 3. **copy** the average back. Unfilled
buckets are sent by :meth:`finish_gradient_synchronization`, which sets the counts back (a forward that
records a graph while they are not is refused: :func:`~minddp.stages.checks.check_finished`). The change::

         def _grad_ready(self, param: nn.Parameter) -> None:
    -            bucket = GradBucket(i, param.grad.reshape(-1), [param], is_last=i == len(self.index) - 1)
    +            self.waiting[b] -= 1
    +            if self.waiting[b] == 0:
    +                self._send_bucket(b)
    +    def _send_bucket(self, b: int) -> None:
    +        bucket = GradBucket(b, flat, members, is_last=b == len(self.buckets) - 1)
         def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
    +        pieces = average.view(-1).split([p.numel() for p in bucket.parameters()])

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = BucketDDP(torch.nn.Linear(4, 2), bucket_cap_mb=1)
    >>> len(model.buckets)                             # weight and bias in one bucket
    1
    >>> model(torch.ones(3, 4)).sum().backward()       # one all_reduce, inside backward
    >>> model.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.stages.bucket_plan import bucket_caps, plan_buckets
from minddp.stages.checks import check_finished
from minddp.stages.hook import HookDDP


class BucketDDP(HookDDP):
    """Coalesce gradients into flat buckets; one comm-hook call per bucket."""

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_mb = bucket_cap_mb  # None: torch's 25 MiB, the first bucket 1 MiB (docs/ladder.md)
        self.buckets = [[params[i] for i in b] for b in plan_buckets(params, *bucket_caps(bucket_cap_mb))]  # step 1
        self.bucket_of = {p: b for b, members in enumerate(self.buckets) for p in members}
        self.waiting = [len(members) for members in self.buckets]  # gradients each bucket waits for

    def forward(self, *inputs, **kwargs):
        check_finished(self.waiting == [len(members) for members in self.buckets])  # counts back: the last step done
        return super().forward(*inputs, **kwargs)

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
        self._sent(bucket, self.comm_hook(self.comm_state, bucket))

    def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
        pieces = average.view(-1).split([p.numel() for p in bucket.parameters()])  # step 3
        for param, piece in zip(bucket.parameters(), pieces):
            if param.grad is not None:
                param.grad.copy_(piece.view_as(param.grad))

    def finish_gradient_synchronization(self) -> None:
        """Send the buckets that did not fill (see the module doc), then finish as :mod:`hook` does."""
        if self.sync_this_backward:
            self.parameters_used.check()  # if no gradient came at all, nothing was checked yet
            for b, waiting in enumerate(self.waiting):
                if waiting > 0:
                    self._send_bucket(b)
            self.waiting = [len(members) for members in self.buckets]
        super().finish_gradient_synchronization()
