"""Stage ``ga``: gradient accumulation. Talk only when the optimizer is about to step.

Builds on ``simple``. Averaging is linear (the mean of the sums is the sum of the means), so the
micro-batches of an accumulation step need not sync: 1. a forward run inside ``with
model.no_sync():`` records that its backward does not sync; 2. the last micro-batch, outside,
averages the whole accumulated gradient once. As in torch, the decision is taken in ``forward``. The
change::

    +    def no_sync(self):
    +        self.require_backward_grad_sync = False
         def forward(self, *inputs, **kwargs):
    +        self.sync_this_backward = self.require_backward_grad_sync
         def finish_gradient_synchronization(self) -> None:
    +        if self.sync_this_backward:
    +            super().finish_gradient_synchronization()

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = GradAccumDDP(torch.nn.Linear(4, 2))
    >>> with model.no_sync():
    ...     model(torch.ones(3, 4)).sum().backward()   # accumulated here, not sent
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> model.finish_gradient_synchronization()        # one sync for both micro-batches
    >>> model.module.bias.grad
    tensor([6., 6.])

More: ``docs/ladder.md``.
"""

from __future__ import annotations

import contextlib

from minddp.stages.simple import SimpleDDP


class GradAccumDDP(SimpleDDP):
    """SimpleDDP that skips the sync on non-boundary micro-steps (``no_sync()``)."""

    require_backward_grad_sync = True  # torch's name; False inside no_sync()
    sync_this_backward = True  # what the last forward decided

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally for the backwards of forwards run inside."""
        before = self.require_backward_grad_sync  # restored, not set: a no_sync inside a no_sync stays off
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def forward(self, *inputs, **kwargs):
        self.sync_this_backward = self.require_backward_grad_sync  # step 1
        return super().forward(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        if self.sync_this_backward:  # step 2
            super().finish_gradient_synchronization()
