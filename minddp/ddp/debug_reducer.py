"""The production DDP in debug mode: its reducer's collectives checked and labelled like the script's own.

``minddp.DistributedDataParallel`` built with debug mode on (``MINDDP_DEBUG=1`` or
``minddp.debug.enable()``) owns a :class:`DebugReducer` instead of a :class:`~minddp.ddp.reducer.Reducer`;
off, nothing here runs. It lives beside the reducer, not in :mod:`minddp.debug`: it overrides the
reducer's own steps, so it changes with them. The differences, each for the collective check
(:mod:`minddp.debug.collective_check`):

1. **the fast path goes through the check**: the built-in average hands its sum to
   ``torch.distributed.all_reduce`` (:func:`checked_sum`, a ``Wire`` transport) instead of the
   process group directly, so each bucket is compared across ranks before it is sent (the sum is the
   same collective, so the same bits; it blocks until each bucket is summed, so no bucket travels while
   backward computes);
2. **labels**: each bucket's collectives are named ``DDP's bucket 0 of 2 (head.weight, head.bias)``,
   the end of backward's and a joined rank's too, so a mismatch or a rank that left says which
   tensors the others were sending (and the check adds the step).

The checks of the model itself (replicas, gradients, data, ``requires_grad``) are the teaching
stages' too: :mod:`minddp.debug.watch`. More: ``docs/debugging.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> bucket = torch.ones(3)
    >>> checked_sum(bucket, torch.distributed.group.WORLD)     # every rank's bucket summed in place
    >>> bucket
    tensor([1., 1., 1.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.wire import Wire
from minddp.ddp.reducer import Reducer
from minddp.debug import collective_check


def checked_sum(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Step 1: sum ``tensor`` in place across ``group`` through ``torch.distributed`` (checked in debug mode)."""
    dist.all_reduce(tensor, group=group)


class DebugReducer(Reducer):
    """A :class:`Reducer` whose collectives are checked and labelled (module doc, steps 1-2)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.state = Wire(self.group, transport=checked_sum)

    def register_comm_hook(self, state, hook) -> None:
        super().register_comm_hook(state, hook)
        if hook is allreduce_hook and self.state.transport is None:  # the fast path again: checked too
            self.state = Wire(self.state.group, checked_sum, self.state.traffic, self.state.link)

    def _launch(self, b: int) -> None:
        names = [self.names[self.position[id(p)]] for p in self.layouts[b].params]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} tensors)" if len(names) > 3 else "")
        with collective_check.labelled(f"DDP's bucket {b} of {len(self.layouts)} ({shown})"):
            super()._launch(b)

    def _finalize_backward(self) -> None:
        with collective_check.labelled("DDP's end of backward"):
            super()._finalize_backward()

    def shadow_backward(self) -> None:
        with collective_check.labelled("DDP's join(): a joined rank's share of a step of the others"):
            super().shadow_backward()
