"""Faults to train through: ``kill@STEP:SLOT``, ``stop@STEP:SLOT``, ``raise@STEP:SLOT``, ``coord@STEP``.

* ``kill``: the rank SIGKILLs itself in step STEP, after its forward (its peers
  are then waiting for it in the gradient all_reduce): a lost machine;
* ``stop``: the rank SIGSTOPs itself at the same point: a frozen machine. Its
  peers' collective times out after the hang bound, the lighthouse evicts the
  silent slot, and the launcher ends the process;
* ``raise``: the rank's comm hook raises before it starts the all_reduce (a
  transient network error); the rank stays and the step is tried again;
* ``coord``: the lighthouse stops answering once it has committed step STEP-1
  (its events sent first); the launcher, told, kills it and starts a new one on
  the same port.

Each fault fires once, on the first attempt of STEP by any incarnation of
SLOT: a flag in memory shared with the launcher is set *before* it fires (a
SIGKILL leaves no time to say anything after), with the time it fired.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

KINDS = ("kill", "stop", "raise", "coord")
_SPEC = re.compile(r"^(kill|stop|raise)@(\d+):(\d+)$|^coord@(\d+)$")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    slot: int | None = None  # None for ``coord``

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}" + ("" if self.slot is None else f":{self.slot}")


def parse_faults(text: str | None, world_size: int | None = None) -> list[Fault]:
    """``"kill@3:1,coord@6"`` -> faults; a ValueError naming the bad item and the form otherwise."""
    faults = []
    for item in filter(None, (text or "").replace(" ", "").split(",")):
        m = _SPEC.match(item)
        if m is None:
            raise ValueError(
                f"--inject {item!r}: write KIND@STEP:SLOT with KIND one of kill, stop, raise "
                "(e.g. kill@5:1), or coord@STEP"
            )
        fault = Fault("coord", int(m.group(4))) if m.group(4) else Fault(m.group(1), int(m.group(2)), int(m.group(3)))
        if world_size is not None and fault.slot is not None and fault.slot >= world_size:
            raise ValueError(f"--inject {item!r}: slot {fault.slot} does not exist with --world-size {world_size}")
        faults.append(fault)
    return faults


class FaultPlan:
    """The faults of one run, and which have fired when (in memory the launcher and every rank share)."""

    def __init__(self, faults: list[Fault], ctx):
        self.faults = list(faults)
        self.fired_at = ctx.Array("d", max(1, len(self.faults)), lock=False)  # 0.0: not yet; else time.time()

    def due(self, kind: str, step: int, slot: int) -> int | None:
        """The index of a fault of ``kind`` due now on ``slot`` at ``step`` that has not fired, or None."""
        for i, f in enumerate(self.faults):
            if f.kind == kind and f.step == step and f.slot == slot and self.fired_at[i] == 0.0:
                return i
        return None

    def fire(self, index: int) -> None:
        """Mark fault ``index`` fired (first: a kill leaves no time after), then do it to this process."""
        self.fired_at[index] = time.time()
        kind = self.faults[index].kind
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "raise":
            raise InjectedFault(f"injected fault {self.faults[index]}: the comm hook raised before its all_reduce")

    def when(self, index: int) -> float | None:
        return self.fired_at[index] or None


class InjectedFault(RuntimeError):
    """A collective that raised on purpose (``raise@STEP:SLOT``)."""
