"""The two checks the teaching stages make, so that a mistake is an error and not a hang.

Two ranks that disagree on what they send do not fail cleanly: they hang, or sum one layer's
gradient with another's and silently diverge. So the stages check, each with one small collective,
and raise the same one-line finding on every rank (a :class:`~minddp.debug.findings.CrossRankError`):

1. :func:`check_same_model`, at construction: every rank's parameters (name, shape, dtype,
   ``requires_grad``: a layer frozen on some ranks would pair unrelated gradients) all-gathered and compared;
2. :class:`ParameterUse`, once per synced step: each forward notes locally which parameters its
   graph reaches; before the step's first gradient is sent, the notes are all-gathered and a
   parameter used on some ranks only is named (such a model needs ``find_unused_parameters=True``).

Why before the first send, and what only the production DDP checks: ``docs/ladder.md``. A third needs no
collective: :func:`check_finished` (a forgotten ``finish_gradient_synchronization()``, refused).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> module = torch.nn.Linear(4, 2)
    >>> check_same_model(module, None)                   # raises on every rank if a rank differs
    >>> use = ParameterUse(module, None)
    >>> use.saw(module(torch.ones(1, 4)))                # after each forward: local, free
    >>> use.check()                                      # before the first gradient is sent
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minddp.debug.findings import CrossRankError, finding
from minddp.stages.graph import parameters_reached


def check_same_model(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Step 1: raise on every rank unless all ranks hold parameters of the same names, shapes, dtypes, requires_grad."""
    # str(p.dtype)[6:]: "float32", without "torch."
    mine = [(n, tuple(p.shape), str(p.dtype)[6:], p.requires_grad) for n, p in module.named_parameters()]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if theirs == reference:
            continue
        what = f"rank {rank} has {len(theirs)} parameters while rank 0 has {len(reference)}"
        if len(theirs) == len(reference):  # the first parameter that differs
            (n0, s0, d0, g0), (n, s, d, g) = next((a, b) for a, b in zip(reference, theirs) if a != b)
            what = (
                f"parameter {n!r} on rank {rank} has shape {list(s)} dtype {d} requires_grad={g}, but rank 0's "
                f"{n0!r} has shape {list(s0)} dtype {d0} requires_grad={g0} "
                f"({'requires_grad' if g != g0 else 'size'} mismatch)"
            )
        cause = "DistributedDataParallel expects the same model across all ranks"
        fix = "build the same model (same config, the same parameters frozen) on every rank before wrapping"
        raise CrossRankError(finding(cause, what, fix, dist.get_rank()))


class ParameterUse:
    """Step 2: which parameters this step's forwards reached, compared across ranks before anything is sent."""

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None):
        self.named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self.group = group
        self.reached: set[int] | None = None  # None: no forward since the last check
        # saw() stays Python under torch.compile, as torch's DDP's graph walk (docs/ddp.md): Dynamo skips it
        self.saw = functools.partial(torch.compiler.disable(ParameterUse.note), self)

    def note(self, outputs: Any) -> None:
        """After a forward (as ``saw``): note the parameters its graph reaches (no message; without grad, none)."""
        if torch.is_grad_enabled():
            self.reached = (self.reached or set()) | parameters_reached(outputs)

    def check(self) -> None:
        """Raise on every rank unless the forwards since the last check reached the same parameters everywhere.

        Every rank runs the same forwards, so every rank has something to
        check (or nothing) at the same point: the collective is always paired.
        """
        if self.reached is None or not self.named:
            return
        mine = torch.tensor(
            [id(p) in self.reached for _, p in self.named], dtype=torch.uint8, device=self.named[0][1].device
        )  # the model's device: one its group serves
        self.reached = None
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(gathered, mine, group=self.group)
        everyone = torch.stack(gathered)  # ranks x parameters: 1 where reached
        differ = (everyone.min(0).values != everyone.max(0).values).nonzero().view(-1).tolist()
        if differ:
            where = "; ".join(
                f"{self.named[i][0]!r} on ranks {everyone[:, i].nonzero().view(-1).tolist()} only" for i in differ[:4]
            )
            cause = "the forwards of this step used different parameters on different ranks"
            what = f"{where}{'; ...' if len(differ) > 4 else ''}: the ranks would send different gradients"
            fix = "take the same branches on every rank, or use minddp's DDP with find_unused_parameters=True"
            raise CrossRankError(finding(cause, what, fix, dist.get_rank()))


def check_finished(finished: bool) -> None:
    """At a forward that records a graph: raise unless the last synced backward was finished (nothing left kept)."""
    if torch.is_grad_enabled() and not finished:  # torch's words for its DDP's case, then the fix
        raise RuntimeError(
            "Expected to have finished reduction in the prior iteration before starting a new one: call "
            "model.finish_gradient_synchronization() after every backward (before optimizer.step())"
        )
