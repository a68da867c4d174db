"""Hooks by name, for the CLI: ``--hook fp16+powersgd`` -> ``(state, hook)``, minddp's or torch's.

Names mirror torch's hook functions: ``allreduce``, ``fp16``, ``bf16``, ``powersgd``,
``batched-powersgd``, ``noop``; a ``fp16+`` / ``bf16+`` prefix wraps any of them in the matching
compress wrapper. One table (:data:`HOOKS`) names each hook's module and function, the same in
:mod:`minddp.comm` as in ``torch.distributed.algorithms.ddp_comm_hooks``: :func:`make_hook` builds
minddp's, :func:`torch_hook` torch's (the baseline a run compares with). PowerSGD's knobs are keyword
options of both (:data:`POWERSGD_OPTIONS`, ``None`` = the default); other hooks ignore them. A
checkpoint stores the hook's *name* and its state, and resuming calls ``make_hook(name)`` again (a
closure cannot be pickled). The table of names: ``docs/hooks.md``.

Example::

    >>> state, hook = make_hook("fp16+powersgd", matrix_approximation_rank=2, start_powerSGD_iter=10)
    >>> state
    PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10, iter=0, use_error_feedback=True, warm_start=True)
    >>> torch_hook("fp16")[1].__module__                      # torch's function of the same name
    'torch.distributed.algorithms.ddp_comm_hooks.default_hooks'
"""

from __future__ import annotations

import inspect
from types import ModuleType

from minddp.comm import debugging_hooks, default_hooks, powerSGD_hook
from minddp.comm.powerSGD_hook import PowerSGDState

#: Name -> (module, function): the same names in minddp.comm and in torch.distributed.algorithms.ddp_comm_hooks.
HOOKS = {
    "allreduce": ("default_hooks", "allreduce_hook"),  # state: the process group
    "fp16": ("default_hooks", "fp16_compress_hook"),
    "bf16": ("default_hooks", "bf16_compress_hook"),
    "powersgd": ("powerSGD_hook", "powerSGD_hook"),  # state: a PowerSGDState
    "batched-powersgd": ("powerSGD_hook", "batched_powerSGD_hook"),
    "noop": ("debugging_hooks", "noop_hook"),  # no state at all
}
#: Prefix -> the compress wrapper that takes any hook but ``noop`` (``fp16+powersgd``).
WRAPPERS = {"fp16": ("default_hooks", "fp16_compress_wrapper"), "bf16": ("default_hooks", "bf16_compress_wrapper")}
_OURS = {"default_hooks": default_hooks, "powerSGD_hook": powerSGD_hook, "debugging_hooks": debugging_hooks}

#: The option names :func:`make_hook` passes on to ``PowerSGDState``.
POWERSGD_OPTIONS = tuple(
    name for name in inspect.signature(PowerSGDState.__init__).parameters if name not in ("self", "process_group")
)


def hook_names() -> list[str]:
    """Every name :func:`make_hook` accepts, wrapped combinations included."""
    wrappable = [b for b in HOOKS if b not in WRAPPERS and b != "noop"]
    return list(HOOKS) + [f"{w}+{b}" for w in WRAPPERS for b in wrappable]


def make_hook(name: str, process_group=None, **options):
    """Return minddp's ``(state, hook)`` for ``register_comm_hook``.

    ``options`` configure PowerSGD (see :data:`POWERSGD_OPTIONS`; ``None``
    values are left at their default) and are ignored by the other hooks.
    """
    return _build(name, process_group, options, _OURS)


def torch_hook(name: str, process_group=None, **options):
    """``(state, hook)`` of torch's own comm hook called ``name`` (minddp's names, e.g. ``fp16+powersgd``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks, powerSGD_hook

    modules = {"default_hooks": default_hooks, "powerSGD_hook": powerSGD_hook, "debugging_hooks": debugging_hooks}
    return _build(name, process_group, options, modules)


def _build(name: str, process_group, options: dict, modules: dict[str, ModuleType]):
    """``(state, hook)`` for ``name``, its functions (and ``PowerSGDState``) taken from ``modules``."""
    if name not in hook_names():
        raise ValueError(f"unknown hook {name!r}: choose one of {', '.join(hook_names())}")
    wrapper, _, base = name.rpartition("+")
    module, function = HOOKS[base]
    hook = getattr(modules[module], function)
    if "powersgd" in base:
        unknown = sorted(set(options) - set(POWERSGD_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown PowerSGD option(s) {unknown} for hook {name!r}: choose from {', '.join(POWERSGD_OPTIONS)}"
            )
        kwargs = {k: v for k, v in options.items() if v is not None}
        state = modules[module].PowerSGDState(process_group, **kwargs)
    else:
        state = None if base == "noop" else process_group
    if wrapper:
        module, function = WRAPPERS[wrapper]
        hook = getattr(modules[module], function)(hook)
    return state, hook
