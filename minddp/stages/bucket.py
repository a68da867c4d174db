"""Stage ``bucket``: fewer, bigger messages.

Every collective pays a fixed cost (a round trip, a kernel launch, a thread
hand-off) before its bytes move. A model with hundreds of small parameters
pays it hundreds of times per step under :mod:`hook`. Buckets pay it a few
times:

1. at construction, plan the buckets (:func:`~minddp.stages.bucket_plan.plan_buckets`:
   reverse parameter order, ``bucket_cap_mb`` per bucket, ``None`` = one)
   and allocate one flat buffer per bucket, reused every step;
2. in the per-parameter autograd hook, count the parameter as ready in its
   bucket; when the bucket's last gradient arrives, copy the bucket's
   gradients into its flat buffer and hand the buffer to the comm hook as one
   bucket (one all_reduce for all of them);
3. when the result is back, copy each slice into its parameter's ``.grad``.

Here the bucket's communication is still waited for inside backward
(``async_op = False``); :mod:`bucket_async` lets it run on.

A parameter that gets no gradient leaves its bucket unfilled. At
:meth:`finish_gradient_synchronization` such buckets are still sent (zeros
for the missing gradients, so every rank issues the same collectives and
none hangs), then an error names the parameters; models that skip
parameters need ``minddp.DistributedDataParallel(find_unused_parameters=True)``.

Example::

    >>> model = BucketDDP(net, bucket_cap_mb=1)
    >>> model(x).sum().backward()
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from __future__ import annotations

import torch
from torch import nn

from minddp.comm.grad_bucket import BucketLayout, GradBucket
from minddp.stages.bucket_plan import plan_buckets
from minddp.stages.hook import HookDDP


class BackwardProgress:
    """What the current synced backward has delivered so far; a fresh one for each.

    A plain object rather than attributes of the wrapper: every assignment to
    an ``nn.Module`` attribute first checks whether the value is a parameter,
    a buffer or a submodule (a few µs each in the middle of backward), and
    this bookkeeping changes many times a step.
    """

    def __init__(self, layouts: list[BucketLayout]):
        self.remaining = [len(layout.params) for layout in layouts]   # gradients still to come, per bucket
        self.ready: set[int] = set()                                  # id() of each parameter delivered


class BucketDDP(HookDDP):
    """Coalesce gradients into flat buckets; one comm-hook call per bucket."""

    #: Cap of the first bucket in MiB (None: same as ``bucket_cap_mb``); the ``ddp`` stage uses 1, like torch.
    first_bucket_cap_mb: float | None = None
    #: What a backward keeps count of (the ``ddp`` stage adds the launch order).
    progress_type = BackwardProgress

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = 25):
        super().__init__(module, process_group)
        self.bucket_cap_mb = bucket_cap_mb
        self._set_plan(self._static_plan())                                                   # step 1

    def _static_plan(self) -> list[list[int]]:
        """The plan before any backward: reverse parameter order, ``bucket_cap_mb`` per bucket."""
        return plan_buckets(self._params, self.bucket_cap_mb, self.first_bucket_cap_mb)

    def _set_plan(self, plan: list[list[int]]) -> None:
        """Lay out buckets for ``plan`` (lists of indices into ``self._params``)."""
        self.bucket_plan = plan
        self._layouts = [BucketLayout([self._params[i] for i in bucket]) for bucket in plan]
        self._bucket_buffers = [torch.empty(layout.numel, dtype=layout.params[0].dtype, device=layout.params[0].device)
                         for layout in self._layouts]
        self._bucket_of = {id(self._params[i]): b for b, bucket in enumerate(plan) for i in bucket}
        self._reset_readiness()

    def _reset_readiness(self) -> None:
        self._progress = self.progress_type(self._layouts)

    def _grad_ready(self, param: nn.Parameter) -> None:
        b, progress = self._bucket_of[id(param)], self._progress                  # step 2
        if id(param) in progress.ready:
            raise RuntimeError(
                f"gradient of {self._param_names[id(param)]!r} became ready twice before a sync: "
                "call finish_gradient_synchronization() (and optimizer.step()) after each backward, "
                "or run the extra backwards inside no_sync()"
            )
        progress.ready.add(id(param))
        progress.remaining[b] -= 1
        if progress.remaining[b] == 0:
            self._bucket_filled(b)

    def _bucket_filled(self, b: int) -> None:
        """Bucket ``b`` has all its gradients: send it now (the ``ddp`` stage keeps launches in order)."""
        self._launch_bucket(b)

    def _launch_bucket(self, b: int) -> None:
        layout, flat = self._layouts[b], self._bucket_buffers[b]
        views, grads = layout.views(flat), [p.grad for p in layout.params]
        if any(g is None for g in grads):
            for view, grad in zip(views, grads):
                if grad is None:
                    view.zero_()
                else:
                    view.copy_(grad)
        else:
            torch._foreach_copy_(views, grads)     # one call for the whole bucket, not one per gradient
        self._submit(GradBucket(b, flat, layout, is_last=b == len(self._layouts) - 1))  # step 3 on completion

    def finish_gradient_synchronization(self) -> None:
        """Send buckets left unfilled (see the module doc), wait for all, write back."""
        progress = self._progress
        if not progress.ready:
            return super().finish_gradient_synchronization()  # nothing was backpropagated with sync
        missing = [b for b, left in enumerate(progress.remaining) if left > 0]
        for b in missing:
            self._launch_bucket(b)
        unused = [self._param_names[id(p)] for b in missing for p in self._layouts[b].params
                  if id(p) not in progress.ready]
        self._reset_readiness()
        super().finish_gradient_synchronization()
        if unused:
            raise RuntimeError(
                f"parameters {unused} received no gradient in this backward, so their buckets could not "
                "fill up; if your model skips parameters on some steps use "
                "minddp.DistributedDataParallel(..., find_unused_parameters=True), otherwise make every "
                "parameter contribute to the loss"
            )
