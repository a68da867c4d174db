"""Tasks for the fault-tolerant rung's tests, in a module the ranks can import (they unpickle the task)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time

from torch import nn

from minddp.ft import ToyTask


class SlowStateModel(nn.Sequential):
    """ToyTask's model, whose ``state_dict`` takes ``pause_s`` (a large model's final state, written slowly)."""

    pause_s = 0.0

    def state_dict(self, *args, **kwargs):
        time.sleep(self.pause_s)
        return super().state_dict(*args, **kwargs)


class SlowFinishTask(ToyTask):
    """ToyTask, but a rank's final state takes ``pause_s`` to serialise (no fault: nothing else reads it)."""

    def __init__(self, pause_s: float, **kwargs):
        super().__init__(**kwargs)
        self.pause_s = pause_s

    def build_model(self) -> nn.Module:
        model = SlowStateModel(*super().build_model())
        model.pause_s = self.pause_s
        return model


class FreezeTask(ToyTask):
    """ToyTask, but the rank of ``slot`` freezes for ``freeze_s`` the first time it trains ``step`` alone.

    Alone, it is the last rank that holds the trained state (its peer died in that step's first attempt); frozen
    (SIGSTOP, all its threads, its heartbeat's too), it says nothing for ``freeze_s``, then a helper process it
    started sends SIGCONT and it goes on. Once in the run (a file in ``folder`` says it happened). Each rank
    process also writes, at its first step, how many objects it froze from the cycle collector's sight and how
    many a full collection still walks (``gc-<pid>``).
    """

    def __init__(self, folder: str, freeze_s: float, step: int, slot: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.folder, self.freeze_s, self.freeze_step, self.freeze_slot = folder, freeze_s, step, slot
        self.step_asked = None

    def global_batch(self, step: int):
        self.step_asked = step  # the rung asks for the step's batch right before its loss
        return super().global_batch(step)

    def loss(self, model, shard, world: int):
        slot = os.environ.get("MINDDP_FT_SLOT")
        gc_file = os.path.join(self.folder, f"gc-{os.getpid()}")
        if slot is not None and not os.path.exists(gc_file):
            with open(gc_file, "w") as f:
                f.write(f"{gc.get_freeze_count()} {len(gc.get_objects())}")
        if slot == str(self.freeze_slot) and world == 1 and self.step_asked == self.freeze_step and self._first():
            helper = subprocess.Popen(["sh", "-c", f"sleep {self.freeze_s}; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)
            helper.wait()
        return super().loss(model, shard, world)

    def _first(self) -> bool:
        try:
            os.close(os.open(os.path.join(self.folder, "froze"), os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


class MidMessageTask(ToyTask):
    """ToyTask, but in ``step`` each slot of ``ends`` (slot -> ``"stop"`` or ``"kill"``) writes the first half of
    a message to the launcher, then freezes (SIGSTOP) or dies (SIGKILL) before the rest: a process that a fault
    finds in the middle of a send. Each writes a file ``<slot>`` in ``folder`` first.

    Its pipe to the launcher is the rank's :class:`~minddp.runtime.processes.Outbox`, found on the call stack
    (the rank's main function holds it).
    """

    def __init__(self, folder: str, step: int, ends: dict[int, str], **kwargs):
        super().__init__(**kwargs)
        self.folder, self.end_step, self.ends = folder, step, ends
        self.step_asked = None

    def global_batch(self, step: int):
        self.step_asked = step
        return super().global_batch(step)

    def loss(self, model, shard, world: int):
        slot = int(os.environ.get("MINDDP_FT_SLOT", "-1"))
        if slot in self.ends and self.step_asked == self.end_step:
            open(os.path.join(self.folder, str(slot)), "w").close()
            outbox = _outbox_on_stack()
            half = (1000).to_bytes(8, "little") + b"x" * 500  # a frame of 1000 bytes, cut at 500
            os.write(outbox.pipe.fileno(), half)
            os.kill(os.getpid(), signal.SIGSTOP if self.ends[slot] == "stop" else signal.SIGKILL)
        return super().loss(model, shard, world)


def _outbox_on_stack():
    import sys

    from minddp.runtime.processes import Outbox

    frame = sys._getframe()
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, Outbox):
                return value
        frame = frame.f_back
    raise AssertionError("no Outbox on the rank's stack")
