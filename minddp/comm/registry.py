"""Hooks by name, for the CLI: ``--hook fp16+powersgd`` -> ``(state, hook)``.

Names mirror torch's hook functions: ``allreduce``, ``fp16``, ``bf16`` (and,
as the hook layer grows, ``powersgd``, ``batched-powersgd``, ``noop``).
A ``fp16+`` / ``bf16+`` prefix wraps any other hook in the matching
compress wrapper.

Example::

    >>> state, hook = make_hook("fp16", process_group=None)
    >>> ddp.register_comm_hook(state, hook)
"""

from __future__ import annotations

from minddp.comm import default_hooks

#: Hooks whose state is just the process group.
_STATELESS = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}
_WRAPPERS = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}


def hook_names() -> list[str]:
    """Every name :func:`make_hook` accepts, wrapped combinations included."""
    base = list(_STATELESS)
    return base + [f"{w}+{b}" for w in _WRAPPERS for b in base if b not in _WRAPPERS]


def make_hook(name: str, process_group=None, **options):
    """Return ``(state, hook)`` for ``register_comm_hook``; options are ignored by stateless hooks."""
    if name not in hook_names():
        raise ValueError(f"unknown hook {name!r}: choose one of {', '.join(hook_names())}")
    wrapper, _, base = name.rpartition("+")
    hook = _STATELESS[base]
    if wrapper:
        hook = _WRAPPERS[wrapper](hook)
    return process_group, hook
