"""Debug mode (``MINDDP_DEBUG=1``): the one place that says whether it is on, and how a finding is said.

Off by default, and then free: nothing is installed, no hook registered, no message sent. On, three
pieces check a run and name what is wrong in one line on every rank:

1. :mod:`minddp.runtime.collective_check`: every ``torch.distributed`` collective (the script's own
   included) is compared across ranks on a side channel before it is sent;
2. :mod:`minddp.stages.debug`: a wrapped model's replicas, gradients, data and ``requires_grad``,
   compared across ranks at each step;
3. :mod:`minddp.ddp.debug`: the production DDP's own collectives, labelled by step and bucket.

A finding is one line, ``minddp debug (rank R): <cause>: <what, where, when>. Fix: <fix>``, raised as
:class:`DebugError` (the run stops) or warned as :class:`DebugWarning` (it goes on). What each one
means: ``docs/debugging.md``.

Example::

    >>> enabled()                                    # MINDDP_DEBUG unset
    False
    >>> finding("replicas drifted apart", "parameter 'w' differs at step 3", "change it on every rank", rank=1)
    "minddp debug (rank 1): replicas drifted apart: parameter 'w' differs at step 3. Fix: change it on every rank"
"""

from __future__ import annotations

from minddp.runtime.envflags import env_flag

#: The environment variable that turns debug mode on for every rank (``MINDDP_DEBUG=1 torchrun ...``).
ENV = "MINDDP_DEBUG"

_forced: bool | None = None  # set by a constructor's ``debug=True``; None: the environment decides
_step: int | None = None  # the training step this rank is in, as the wrapped model counts it (None: none yet)


class DebugError(RuntimeError):
    """A bug debug mode found that would corrupt training or hang it: raised on every rank."""


class DebugWarning(UserWarning):
    """A finding that does not corrupt the model (every rank reading the same data): the run goes on."""


def enabled() -> bool:
    """Is debug mode on in this process (``MINDDP_DEBUG``, or a wrapper built with ``debug=True``)?"""
    return env_flag(ENV) if _forced is None else _forced


def turn_on(flag: bool | None) -> bool:
    """A wrapper's ``debug=`` argument: True turns debug mode on for this process, None follows the environment.

    Returns whether this wrapper runs in debug mode (``debug=False``: this one does not).
    """
    global _forced
    _forced = True if flag else _forced
    return enabled() if flag is None else flag


def at_step(step: int) -> None:
    """A wrapped model says which step (0, 1, ...) this rank is now in; findings about collectives say it."""
    global _step
    _step = step


def current_step() -> int | None:
    """The step this rank is in (None before a wrapped model's first step)."""
    return _step


def finding(cause: str, what: str, fix: str, rank: int | None) -> str:
    """The one line every rank says: the cause, what and where (tensor or call, ranks, step), and the fix."""
    who = "" if rank is None else f" (rank {rank})"
    return f"minddp debug{who}: {cause}: {what}. Fix: {fix}"
