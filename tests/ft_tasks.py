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
