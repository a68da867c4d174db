"""What the production wrappers share (``ddp``, ``fsdp``): the same start on every rank, and torch's ``no_sync``.

The teaching stages show both ideas in their own lines (``simple``: the same start; ``ga``: ``no_sync``).
The production wrappers take them from here rather than from a teaching class, so that a teaching file
holds only what its own idea needs and a change made for production cannot reach the ladder:

1. :func:`same_start`, at construction: every rank's model checked against rank 0's
   (:func:`~minddp.stages.checks.check_same_model`), then rank 0's parameters and buffers broadcast;
2. :class:`DataParallelBase`: ``no_sync()`` and the flag it sets, ``require_backward_grad_sync``
   (torch's name), which each wrapper's forward reads to decide whether the coming backward syncs.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> class Wrapper(DataParallelBase):
    ...     def __init__(self, module):
    ...         super().__init__()
    ...         same_start(module, None)                   # the same model, then rank 0's values everywhere
    ...         self.module = module
    >>> wrapper = Wrapper(torch.nn.Linear(4, 2))
    >>> with wrapper.no_sync():
    ...     wrapper.require_backward_grad_sync             # its forward would decide: accumulate locally
    False
    >>> wrapper.require_backward_grad_sync
    True
"""

import contextlib

import torch
from torch import nn

from minddp.comm.plain import broadcast
from minddp.stages.checks import check_same_model


def same_start(module: nn.Module, group) -> None:
    """Step 1: raise on every rank of ``group`` (a process group, None: all) unless all hold the same model, then
    give every rank rank 0's tensors."""
    check_same_model(module, group)  # the broadcast below would not notice different models
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            broadcast(tensor, group_src=0, group=group)


class DataParallelBase(nn.Module):
    """Step 2: torch's ``no_sync()`` switch, for a wrapper whose forward reads ``require_backward_grad_sync``."""

    require_backward_grad_sync = True  # False inside no_sync()

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally for the backwards of forwards run inside (as torch's ``no_sync``)."""
        before = self.require_backward_grad_sync  # restored, not set: a no_sync inside a no_sync stays off
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before
