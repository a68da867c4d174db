"""Tasks for the fault-tolerant rung's tests, in a module the ranks can import (they unpickle the task)."""

from __future__ import annotations

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
