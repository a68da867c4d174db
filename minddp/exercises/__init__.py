"""Exercises checked on real ranks: write a stage (or a comm hook), and be told in one line what is wrong.

The notebooks end each stage section with a "your turn" cell: write the
stage, then (``MySimpleDDP`` is the learner's class, written in the notebook: not run by the doctests)::

    >>> from minddp.exercises import check
    >>> check(MySimpleDDP, like="simple")      # doctest: +SKIP
    ✗ simple: gradients were summed, not averaged (all 6 parameters): all_reduce sums over ranks; divide ...

:func:`check` trains the class on 2 real ranks (a small network, 3 steps of 3
micro-batches, a different initialisation on every rank) beside two
independent oracles, a single process on the global batch and torch's own
DDP on the same shards, and names the first thing that goes wrong:

* your code raised (which exception, where, on which ranks);
* a rank hung in a collective the other ranks never made (after
  ``timeout_s``: the check never hangs);
* the broadcast is missing (the ranks do not start from rank 0's weights);
* the gradients after ``finish_gradient_synchronization()`` are not the
  average over ranks: not synchronized, summed (forgot the division), divided
  twice, the incoming gradient of the last micro-batch synced instead of the
  accumulated one, ...;
* the parameters differ from the oracles after step N;
* the wrong kind, number or place of collectives, against the model answer
  named by ``like`` (e.g. syncing inside ``no_sync()``, one call per
  parameter where the bucket plan has two, sending after backward where the
  stage sends from the autograd hook, ``dist.all_reduce`` where the answer
  makes a reduce-scatter and an all-gather);
* an async rung that waits: every message waited for before backward
  computed its last gradient, where the model answer still has messages in
  flight then (and the opposite, for the rungs that wait). This comes from
  the order of events each rank records (gradient ready, collective
  started, wait), never from timings.

:func:`check_hook` does the same for a comm hook ``hook(state, bucket) ->
Future[Tensor]`` (``like="fp16"``).

The model answers are in :mod:`minddp.exercises.solutions`; the tests run the
checker on them and on deliberately wrong versions of each.
"""

from minddp.exercises.checker import Verdict, check, check_hook, shutdown

__all__ = ["check", "check_hook", "Verdict", "shutdown"]
