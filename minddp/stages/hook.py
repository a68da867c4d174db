"""Stage ``hook``: sync each gradient the moment autograd has finished it.

Waiting for the end of backward wastes time: the last layer's gradient is
final long before the first layer's is computed. Autograd can tell us when a
parameter's gradient is done:

1. at construction, register ``register_post_accumulate_grad_hook`` on every
   parameter that needs a gradient. It fires after autograd has *added* this
   backward's contribution into ``param.grad``, so the hook reads the
   accumulated gradient (right under gradient accumulation too), and it fires
   once per backward even for a tied parameter used twice;
2. in the hook, if this backward syncs, hand the comm hook a bucket of this
   one parameter, which starts its all_reduce;
3. here, wait for it right away, inside backward, and write the average
   back. Communication now *interleaves* with backward, but autograd stands
   still while we wait: interleaving is not overlapping. :mod:`hook_async`
   removes the wait.

:meth:`finish_gradient_synchronization` has nothing left to do here.

The autograd hooks reach this wrapper through a weak reference: the
parameters keep their hooks on autograd's C++ side, where Python's garbage
collector cannot see a cycle, so a strong reference would keep the wrapper
(and its process group) alive until the interpreter exits.

Example::

    >>> model = HookDDP(net)
    >>> model(x).sum().backward()        # grads are averaged during backward
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.stages.grad_accum import GradAccumDDP


class HookDDP(GradAccumDDP):
    """Per-parameter autograd hooks that sync each gradient during backward."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.index = {p: i for i, p in enumerate(reversed(params))}   # bucket index: last layers first
        me = weakref.ref(self)
        handles = [p.register_post_accumulate_grad_hook(lambda p: me()._grad_ready(p))   # step 1
                   for p in params]
        weakref.finalize(self, lambda: [h.remove() for h in handles])

    def _grad_ready(self, param: nn.Parameter) -> None:
        """Step 2: autograd has finished ``param``'s gradient for this backward."""
        if self.sync_this_backward:
            self.parameters_used.check()          # before the first send of the step (a no-op after it)
            i = self.index[param]
            bucket = GradBucket(i, param.grad.reshape(-1), [param], is_last=i == len(self.index) - 1)
            self._sent(bucket, send(self.comm_hook, self.comm_state, bucket))

    def _sent(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        """Step 3: wait for the average here, inside backward."""
        self._write_back(bucket, future.wait())

    def _write_back(self, bucket: GradBucket, average: torch.Tensor) -> None:
        param, = bucket.parameters()
        param.grad.copy_(average.view_as(param.grad))

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to do: every gradient was averaged during backward."""
        self.parameters_used.check()              # only if no gradient at all came in this backward
