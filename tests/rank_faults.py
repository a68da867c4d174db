"""A fault injected into the train command's ranks at a chosen step, for the reliability tests.

``launch`` pickles its function by name, so what runs in the ranks must be a
module-level function: :func:`train_rank_with_fault` is ``train_rank`` with
the ``train_step`` it calls (``minddp.train.run.train_step``, the ladder's loop) wrapped to call
``fault(*args)`` (also module-level) before the ``call``-th step of this rank.
"""

from __future__ import annotations


def train_rank_with_fault(cfg, stage, data, folder, fault, call, *args):
    from minddp.train import run as train

    real, calls = train.train_step, []

    def train_step(*step_args):
        calls.append(1)
        if len(calls) == call:
            fault(*args)
        return real(*step_args)

    train.train_step = train_step
    return train.train_rank(cfg, stage, data, folder)
