"""Stage ``ga``: gradient accumulation. Talk only when the optimizer is about to step.

With accumulation, the optimizer steps once every ``k`` micro-batches and
autograd *adds* each micro-batch's gradient into ``.grad``. Averaging the
partial sums across ranks after every micro-batch would send ``k`` times the
bytes for the same result, because averaging is linear: the mean of the sums
equals the sum of the means. So:

1. inside ``with model.no_sync():`` a forward records that the coming
   backward must not sync, and :meth:`finish_gradient_synchronization`
   does nothing for it;
2. the last micro-batch runs outside the context, and its sync averages the
   whole accumulated gradient once.

As in torch, the decision is taken in ``forward`` (the flag
``require_backward_grad_sync`` is read there), so the *forward* of a
micro-batch must be inside ``no_sync()``.

Example::

    >>> for i, batch in enumerate(micro_batches):
    ...     ctx = model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()
    ...     with ctx:
    ...         (model(batch).loss / len(micro_batches)).backward()
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from __future__ import annotations

import contextlib

from minddp.stages.simple import SimpleDDP


class GradAccumDDP(SimpleDDP):
    """SimpleDDP that skips the sync on non-boundary micro-steps (``no_sync()``)."""

    require_backward_grad_sync = True    # torch's name; False inside no_sync()
    sync_this_backward = True            # what the last forward decided

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally for the backwards of forwards run inside."""
        before = self.require_backward_grad_sync     # restored, not set: a no_sync inside a no_sync stays off
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def forward(self, *inputs, **kwargs):
        self.sync_this_backward = self.require_backward_grad_sync                 # step 1
        return super().forward(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        if self.sync_this_backward:                                               # step 2
            super().finish_gradient_synchronization()
