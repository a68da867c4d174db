"""One training step that drives every stage (and torch's DDP, and no wrapper at all).

The contract every stage shares, driven as a user's script would drive it:

1. for each micro-batch but the last, forward and backward inside
   ``model.no_sync()`` where the wrapper has one: the *stage* then decides
   that these backwards only accumulate locally;
2. backward (the hook and bucket stages send during it);
3. ``model.finish_gradient_synchronization()`` after *every* backward, where
   the method exists (torch's DDP has none: it finishes at the end of
   backward by itself). After a backward run inside ``no_sync()`` the stage's
   own finish does nothing: no collective, no wait, no check, the
   accumulated gradient untouched; so ``ga`` sends ``k`` times fewer messages
   than ``simple`` because of its ``no_sync``, not because of this loop. A
   wrapper with no ``no_sync()`` (stage ``simple``, like the blog's first
   DDP) cannot skip a sync, so it syncs after every micro-batch: the result
   is the same (averaging is linear, and averaging an already averaged
   gradient changes nothing), the traffic is ``k`` times larger, and that is
   exactly the cost stage ``ga`` removes;
4. ``optimizer.step()`` then ``optimizer.zero_grad()``.

Each micro-batch's loss is divided by the number of micro-batches, so the
accumulated gradient is the gradient of the mean loss over all of them. The
mean loss returned is summed where the losses are and read once, after the
step: one host sync per step, not one per micro-batch.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.ladder import build_stage
    >>> ddp = build_stage("ddp", torch.nn.Linear(4, 2))
    >>> optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    >>> loss = train_step(ddp, optimizer, [torch.ones(2, 4)] * 3, lambda m, b: m(b).sum())   # 3 micro-batches
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch
from torch import nn


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Any],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
) -> float:
    """Run one optimizer step over ``micro_batches``; return the mean loss (a float)."""
    k = len(micro_batches)
    total = 0.0  # summed on the loss's device, in float64 as Python sums floats: read once, at the end of the step
    no_sync = getattr(model, "no_sync", None)
    finish = getattr(model, "finish_gradient_synchronization", None)
    for i, batch in enumerate(micro_batches):
        quiet = no_sync is not None and i < k - 1
        with no_sync() if quiet else contextlib.nullcontext():  # step 1
            with torch.profiler.record_function("minddp.forward_backward"):
                loss = loss_fn(model, batch) / k
                loss.backward()  # step 2
        total = total + loss.detach().double()  # no .item() here: a host sync per micro-batch on a GPU
        if finish is not None:
            with torch.profiler.record_function("minddp.finish_gradient_synchronization"):
                finish()  # step 3: every backward; the stage knows whether it synced
    with torch.profiler.record_function("minddp.optimizer_step"):
        optimizer.step()  # step 4
        optimizer.zero_grad(set_to_none=True)
    return float(total)  # the one host sync of the step
