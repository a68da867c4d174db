"""Stage ``ga``: gradient accumulation — talk only when the optimizer is about to step.

With accumulation, the optimizer steps once every ``k`` micro-batches and
autograd *adds* each micro-batch's gradient into ``.grad``. Averaging the
partial sums across ranks after every micro-batch would send ``k`` times the
bytes for the same result, because averaging is linear: the mean of the sums
equals the sum of the means. So:

1. inside ``with model.no_sync():`` the forward records that the coming
   backward must not sync, and :meth:`finish_gradient_synchronization` is a
   no-op for it;
2. the last micro-batch runs outside the context, and its sync averages the
   whole accumulated gradient once.

As in torch, the decision is taken in ``forward`` (the flag
``require_backward_grad_sync`` is read there), so the forward of a
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.require_backward_grad_sync = True
        self._sync_this_backward = True

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally for the backwards of forwards run inside."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *args, **kwargs):
        self._sync_this_backward = self.require_backward_grad_sync      # step 1
        return self.module(*args, **kwargs)

    def _should_sync(self) -> bool:
        return self._sync_this_backward                                  # step 2
