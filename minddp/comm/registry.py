"""Hooks by name, for the CLI: ``--hook fp16+powersgd`` -> ``(state, hook)``.

Names mirror torch's hook functions: ``allreduce``, ``fp16``, ``bf16``, ``powersgd``,
``batched-powersgd``, ``noop``; a ``fp16+`` / ``bf16+`` prefix wraps any of them in the matching
compress wrapper. PowerSGD's knobs are keyword options of :func:`make_hook`
(:data:`POWERSGD_OPTIONS`, ``None`` = the default); other hooks ignore them. A checkpoint stores the
hook's *name* and its state, and resuming calls ``make_hook(name)`` again (a closure cannot be
pickled). The table of names: ``docs/hooks.md``.

Example::

    >>> state, hook = make_hook("fp16+powersgd", matrix_approximation_rank=2, start_powerSGD_iter=10)
    >>> state
    PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10, iter=0, use_error_feedback=True, warm_start=True)
"""

from __future__ import annotations

import inspect

from minddp.comm import debugging_hooks, default_hooks
from minddp.comm.powerSGD_hook import PowerSGDState, batched_powerSGD_hook, powerSGD_hook

#: Hooks whose state is just the process group.
_STATELESS = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}
#: Hooks that keep a :class:`PowerSGDState`.
_POWERSGD = {
    "powersgd": powerSGD_hook,
    "batched-powersgd": batched_powerSGD_hook,
}
#: Hooks that need no state at all.
_DEBUGGING = {"noop": debugging_hooks.noop_hook}
_WRAPPERS = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}

#: The option names :func:`make_hook` passes on to ``PowerSGDState``.
POWERSGD_OPTIONS = tuple(
    name for name in inspect.signature(PowerSGDState.__init__).parameters if name not in ("self", "process_group")
)


def hook_names() -> list[str]:
    """Every name :func:`make_hook` accepts, wrapped combinations included."""
    base = list(_STATELESS) + list(_POWERSGD) + list(_DEBUGGING)
    wrappable = [b for b in base if b not in _WRAPPERS and b not in _DEBUGGING]
    return base + [f"{w}+{b}" for w in _WRAPPERS for b in wrappable]


def make_hook(name: str, process_group=None, **options):
    """Return ``(state, hook)`` for ``register_comm_hook``.

    ``options`` configure PowerSGD (see :data:`POWERSGD_OPTIONS`; ``None``
    values are left at their default) and are ignored by the other hooks.
    """
    if name not in hook_names():
        raise ValueError(f"unknown hook {name!r}: choose one of {', '.join(hook_names())}")
    wrapper, _, base = name.rpartition("+")
    if base in _POWERSGD:
        unknown = sorted(set(options) - set(POWERSGD_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown PowerSGD option(s) {unknown} for hook {name!r}: choose from {', '.join(POWERSGD_OPTIONS)}"
            )
        kwargs = {k: v for k, v in options.items() if v is not None}
        state, hook = PowerSGDState(process_group, **kwargs), _POWERSGD[base]
    elif base in _DEBUGGING:
        state, hook = None, _DEBUGGING[base]
    else:
        state, hook = process_group, _STATELESS[base]
    if wrapper:
        hook = _WRAPPERS[wrapper](hook)
    return state, hook
