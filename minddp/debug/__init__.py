"""Debug mode (``MINDDP_DEBUG=1``), and every check that names a bug across ranks in one line, in one room.

Off by default, and then free: nothing is installed, no hook registered, no message sent. On, three
checks name what is wrong in one line on every rank, before the collective or the step it would spoil:

1. the collective check (:mod:`~minddp.debug.collective_check`): every ``torch.distributed``
   collective, the script's own included, compared across ranks before it is sent;
2. the model watch (:mod:`~minddp.debug.watch`): a wrapped model's replicas, gradients, data and
   ``requires_grad``, compared across ranks at each step;
3. DDP's reducer in debug mode (:mod:`minddp.ddp.debug_reducer`): its buckets sent through the checked
   ``all_reduce``, labelled. It stays beside the reducer it subclasses: it overrides the reducer's own
   steps (send a bucket, end a backward, a joined rank's share), so it changes when they change, and it
   sits above them in the layers, while this package sits below every wrapper that attaches it.

The modules, each what its name says: :mod:`~minddp.debug.switch` (on or off, and :func:`attach`),
:mod:`~minddp.debug.findings` (the one-line form of every cross-rank finding: ``<checker> (rank R):
<cause>: <what, where, when>. Fix: <fix>``, and its errors), the two checks above, and
:mod:`~minddp.debug.ddp_guards` (DDP's cross-rank guards: the same settings, the same bucket plan,
finite averages, why a reduction did not finish). The teaching stages' own two checks
(:mod:`minddp.stages.checks`) say their findings in the same form.

**One switch, one call.** Debug mode is on for the whole process or not at all: ``MINDDP_DEBUG=1`` in
the environment when minddp is imported, or :func:`enable` (and :func:`disable`) at any time. Every
wrapper's constructor (the six teaching stages through ``SimpleDDP``, ``ddp``, ``zero2``, ``fsdp``,
``local-sgd`` and ``diloco`` through ``LocalSGD``) calls :func:`~minddp.debug.switch.attach` once, so
what is watched depends only on the wrapper, never on how it was built: while debug mode is on, each gets
the collective check, and a wrapper whose ranks hold the same replica also gets a
:class:`~minddp.debug.watch.Watch` (``sharded = True`` says they differ by design: a sharded one holds a
different shard on each rank, local SGD's replicas differ between syncs; only its collectives can be
compared). A wrapper built while debug mode
is off is not watched; one built while it was on pauses its checks while it is off.

**Why the switch is a module of its own, and so short.** A learner reads every file a teaching stage's
imports reach (``tests/test_readability.py`` counts them, function-local imports too). The stage's file
imports :mod:`~minddp.debug.switch` (a few lines: a slot, :func:`enabled`, :func:`attach`) and its checks
import :mod:`~minddp.debug.findings` (the errors and the one-line form); neither imports the checks. The
checks are plugged into the switch's slot by :func:`enable`, here, so the code that watches a wrapper is
reached only while debug mode is on, through the slot, and a learner following a stage to its all_reduce
reads the switch and nothing of the checks.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> enabled()                                    # MINDDP_DEBUG unset
    False
    >>> finding("replicas drifted apart", "parameter 'w' differs at step 3", "change it on every rank", 1, BY)
    "minddp debug (rank 1): replicas drifted apart: parameter 'w' differs at step 3. Fix: change it on every rank"
"""

from __future__ import annotations

from minddp.debug import collective_check, switch, watch
from minddp.debug.collective_check import BY
from minddp.debug.findings import CrossRankError, DebugError, DebugWarning, finding
from minddp.debug.switch import attach, enabled
from minddp.runtime.envflags import env_flag

#: The environment variable that turns debug mode on for every rank (``MINDDP_DEBUG=1 torchrun ...``).
ENV = "MINDDP_DEBUG"

__all__ = ["enable", "disable", "enabled", "attach", "finding", "BY", "CrossRankError", "DebugError", "DebugWarning"]


def enable() -> None:
    """Debug mode on in this process from now on: the collectives checked, every wrapper built from now watched."""
    switch.checks = watch.checks_for
    collective_check.install()


def disable() -> None:
    """Debug mode off from now on: nothing is checked (the wrappers watched so far pause); :func:`enable` resumes.

    A ``minddp.DistributedDataParallel`` built in debug mode keeps its bucket-plan guard (``check_consistency``,
    a setting of its own: set it False to stop it) and its labelled reducer.
    """
    switch.checks = None


if env_flag(ENV):  # MINDDP_DEBUG=1: the script's collectives are checked from the first one (docs/debugging.md)
    enable()
