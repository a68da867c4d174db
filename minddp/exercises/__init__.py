"""Exercises checked on real ranks: write a stage (or a comm hook), and be told in one line what is wrong.

The notebooks end each stage section with a "your turn" cell: write the stage, then (``MySimpleDDP``
is the learner's class, written in the notebook: not run by the doctests)::

    >>> from minddp.exercises import check
    >>> check(MySimpleDDP, like="simple")      # doctest: +SKIP
    ✗ simple: gradients were summed, not averaged (all 6 parameter tensors): all_reduce sums over ranks; divide ...

:func:`check` trains the class on 2 real ranks beside two independent oracles (a single process on
the global batch, torch's own DDP on the same shards) and names the first thing that goes wrong: an
exception, a hang, a missing broadcast, gradients that are not the average over ranks, parameters
that leave the oracles, the wrong kind, number or place of collectives against the model answer named
by ``like``, or an async rung that waits. :func:`check_hook` does the same for a comm hook
(``like="fp16"``), and :func:`check_shard` (:func:`check_shards`: several in one run) for notebook
07's split of the global batch among the ranks of the moment, through a lost rank
(:mod:`minddp.exercises.lost_rank`); :func:`check_outer_sync` and :func:`check_fragment_schedule` notebook 10's
DiLoCo sync and streaming schedule (:mod:`minddp.exercises.diloco`); :func:`check_handover` notebook 09's
piece after which each bucket is handed over (:mod:`minddp.exercises.compiled`, no ranks). The model answers are in
:mod:`minddp.exercises.solutions`, the rank side in :mod:`minddp.exercises.harness`; ``notebooks/README.md``
(*Exercises and their checker*) lists every finding and how each is told.
"""

from minddp.exercises.checker import Verdict, check, check_hook, shutdown
from minddp.exercises.compiled import check_handover
from minddp.exercises.diloco import check_fragment_schedule, check_outer_sync
from minddp.exercises.lost_rank import check_shard, check_shards

__all__ = [
    "check",
    "check_hook",
    "check_shard",
    "check_shards",
    "check_outer_sync",
    "check_fragment_schedule",
    "check_handover",
    "Verdict",
    "shutdown",
]
