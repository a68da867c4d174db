"""Stage ``hook``: sync each gradient the moment autograd has finished it.

Builds on ``ga``. The last layer's gradient is final long before the first layer's is computed:
1. at construction, a ``register_post_accumulate_grad_hook`` on every trainable parameter (it fires
once the backward's contribution is *added* into ``.grad``); 2. the hook hands the comm hook a
bucket of that one parameter; 3. and waits for it there, inside backward. Communication interleaves
with backward but does not overlap it: autograd stands still while we wait (``hook-async`` removes
the wait). The hooks hold the wrapper weakly, and go with it (``docs/ladder.md`` says why). The change::

         def __init__(self, module: nn.Module, process_group=None):
    +        self.handles = [p.register_post_accumulate_grad_hook(lambda p: me()._grad_ready(p)) for p in params]
    +    def _grad_ready(self, param: nn.Parameter) -> None:
    +            self._sent(bucket, self.comm_hook(self.comm_state, bucket))
    +    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
    +        self._write_back(bucket, future.wait())
         def finish_gradient_synchronization(self) -> None:
    -        for index, param in enumerate(reversed(params)):

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = HookDDP(torch.nn.Linear(4, 2))
    >>> model(torch.ones(3, 4)).sum().backward()       # each gradient averaged during backward
    >>> model.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.stages.grad_accum import GradAccumDDP


class HookDDP(GradAccumDDP):
    """Per-parameter autograd hooks that sync each gradient during backward."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.index = {p: i for i, p in enumerate(reversed(params))}  # message index: last layers first
        me = weakref.ref(self)  # autograd keeps the hooks; they must not keep the wrapper
        self.handles = [p.register_post_accumulate_grad_hook(lambda p: me()._grad_ready(p)) for p in params]  # step 1
        weakref.finalize(self, lambda handles: [h.remove() for h in handles], self.handles)  # removed with the wrapper

    def _grad_ready(self, param: nn.Parameter) -> None:
        """Step 2: autograd has finished ``param``'s gradient for this backward."""
        if self.sync_this_backward:
            self.parameters_used.check()  # before the first send of the step (a no-op after it)
            i = self.index[param]
            bucket = GradBucket(i, param.grad.reshape(-1), [param], is_last=i == len(self.index) - 1)
            self._sent(bucket, self.comm_hook(self.comm_state, bucket))

    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        """Step 3: wait for the average here, inside backward."""
        self._write_back(bucket, future.wait())

    def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
        (param,) = bucket.parameters()
        param.grad.copy_(average.view_as(param.grad))

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to do: every gradient was averaged during backward."""
        if self.sync_this_backward:  # after a no_sync() backward: nothing at all
            self.parameters_used.check()  # only if no gradient at all came in this backward
