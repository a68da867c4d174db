"""Run a function when the current backward pass ends: the seam that makes DDP automatic.

A plain training loop calls ``loss.backward()`` then ``optimizer.step()``
and nothing in between, so the wrapper must finish gradient synchronization
*inside* ``backward()``. Per-parameter hooks cannot tell which of them is the
last one (unused parameters, tied weights, frozen layers...). The autograd
engine can: ``queue_callback`` registers a function that the engine runs once
the whole graph of the *current* backward has been executed, still inside
``backward()``, so an exception raised there reaches the caller of
``backward()``.

This is a private torch API (``Variable._execution_engine``); torch's own
DDP uses the same call (``Reducer``'s ``finalize_backward``). It must be
called from inside a running backward, e.g. from a gradient hook, which is
what :mod:`minddp.stages.ddp` does on the first hook of each backward.
``tests/test_ddp_script.py`` pins it: a loop without any extra call must
give torch's results.

Example::

    >>> def hook(param):
    ...     at_end_of_backward(lambda: print("backward done"))
"""

from __future__ import annotations

from typing import Callable

import torch


def at_end_of_backward(fn: Callable[[], None]) -> None:
    """Queue ``fn`` to run when the backward pass now executing has finished its graph."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)
