"""Misuse checks every stage shares: each raises on every rank, naming the cause and the fix.

A mistake on one rank of a data-parallel job tends to show up as a hang on
the others, or worse as silently wrong gradients. The checks here turn such
mistakes into errors that every rank raises at the same point:

0. :func:`verify_replicas`, at construction: all ranks all-gather their
   parameters' names, shapes and dtypes; any difference raises on every rank,
   naming the rank and the parameter (before rank 0's weights are broadcast
   over a different model);
1. :func:`check_same_settings`, once, just before the first gradient is sent:
   all ranks all-gather their stage, comm hook and bucket sizes; a rank that
   differs (another ``--hook``, another ``bucket_cap_mb``) would pair its
   collectives with the wrong tensors, so every rank raises with the diff;
2. :func:`guard_optimizer_step`: a global optimizer step pre-hook that
   refuses ``optimizer.step()`` while the stage still has all_reduces in
   flight (the step would use local, un-averaged gradients);
3. :func:`finite_check`: with ``check_finite`` (or
   ``MINDDP_CHECK_FINITE=1``), a non-finite gradient raises. The check reads
   the *reduced* bucket: a NaN or Inf on any rank makes the sum non-finite on
   every rank, so every rank raises at the same bucket, without an extra
   collective; each rank's message says whether its own local gradient was
   already non-finite before communication.

Example::

    >>> check_same_settings({"stage": "BucketDDP", "hook": "allreduce_hook", "buckets": [1024]}, group)
    >>> handle = guard_optimizer_step(ddp)     # removed when ddp is garbage collected
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook


def finite_check_enabled() -> bool:
    """``MINDDP_CHECK_FINITE=1`` turns the non-finite gradient check on for every stage."""
    return os.environ.get("MINDDP_CHECK_FINITE", "0") not in ("", "0", "false", "False")


def describe_hook_state(state) -> str | None:
    """The hook state as ranks can compare it: its settings, never its memory address.

    A state class with its own ``__repr__`` (minddp's ``PowerSGDState``) is
    described by it. One without (torch's ``PowerSGDState``) would print as
    ``<... object at 0x7f...>``, different on every rank for the same
    settings, so it is described by its type and its public scalar fields.
    """
    if state is None or isinstance(state, dist.ProcessGroup):
        return None
    cls = type(state)
    if cls.__repr__ is not object.__repr__:
        return repr(state)
    names = sorted(set(getattr(cls, "__slots__", ())) | set(getattr(state, "__dict__", {})))
    fields = [(n, getattr(state, n, None)) for n in names if not n.startswith("_")]
    shown = ", ".join(f"{n}={v!r}" for n, v in fields if isinstance(v, (bool, int, float, str, type(None))))
    return f"{cls.__name__}({shown})"


def check_same_settings(settings: dict, group: dist.ProcessGroup) -> None:
    """Step 1: raise on every rank unless all ranks send gradients with the same settings."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, settings, group=group)
    diffs = [f"{key}: rank {rank} has {theirs[key]!r}, rank 0 has {everyone[0][key]!r}"
             for rank, theirs in enumerate(everyone[1:], start=1) for key in settings
             if theirs.get(key) != everyone[0].get(key)]
    if diffs:
        raise RuntimeError(
            "minddp: ranks send gradients differently, so their all_reduces would mix unrelated tensors: "
            + "; ".join(diffs) + ". Give every rank the same stage, comm hook and bucket_cap_mb"
        )


def guard_optimizer_step(stage) -> torch.utils.hooks.RemovableHandle:
    """Step 2: refuse ``optimizer.step()`` on ``stage``'s parameters while it has work in flight.

    The hook is global (torch calls it for every optimizer), so it only looks
    at optimizers that hold one of the stage's parameters, and only when the
    stage reports unfinished work (``stage._unsynced_work()``): cheap.
    """
    ref = weakref.ref(stage)

    def pre_hook(optimizer, args, kwargs):
        owner = ref()
        if owner is None:
            return
        unfinished = owner._unsynced_work()
        if unfinished and _steps_params_of(optimizer, owner):
            raise RuntimeError(
                f"optimizer.step() was called while {unfinished}, so it would apply local, "
                "un-averaged gradients: call model.finish_gradient_synchronization() after the last "
                "backward and before optimizer.step() (minddp.loop.train_step does)"
            )

    handle = register_optimizer_step_pre_hook(pre_hook)
    weakref.finalize(stage, handle.remove)
    return handle


def _steps_params_of(optimizer: torch.optim.Optimizer, stage) -> bool:
    mine = {id(p) for p in stage._params}
    return any(id(p) in mine for group in optimizer.param_groups for p in group["params"])


def finite_check(bucket_index: int, names: list[str], local_finite: bool, rank: int):
    """Step 3: a ``check(result)`` that raises if the reduced bucket holds NaN/Inf."""

    def check(tensor: torch.Tensor) -> None:
        if not bool(torch.isfinite(tensor).all()):
            here = ("this rank's own gradient was already non-finite before communication" if not local_finite
                    else "this rank's own gradient was finite, so another rank sent the NaN/Inf")
            raise FloatingPointError(
                f"minddp check_finite: the averaged gradient of bucket {bucket_index} ({', '.join(names[:4])}"
                f"{', ...' if len(names) > 4 else ''}) contains NaN or Inf on rank {rank}; {here}. Look for a "
                "diverging loss (lower the learning rate, clip gradients) or bad input on that rank"
            )

    return check


def verify_replicas(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Raise on every rank unless all ranks hold parameters of the same names, shapes, dtypes."""
    mine = [(name, tuple(p.shape), str(p.dtype).replace("torch.", "")) for name, p in module.named_parameters()]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if len(theirs) != len(reference):
            raise RuntimeError(
                f"DistributedDataParallel expects the same model across all ranks, but rank {rank} has "
                f"{len(theirs)} parameters while rank 0 has {len(reference)}: build the same model on every rank"
            )
        for (n0, s0, d0), (n, s, d) in zip(reference, theirs):
            if (n0, s0, d0) != (n, s, d):
                raise RuntimeError(
                    f"DistributedDataParallel expects the same model across all ranks: parameter {n!r} on "
                    f"rank {rank} has shape {list(s)} dtype {d}, but rank 0's {n0!r} has shape {list(s0)} "
                    f"dtype {d0} (size mismatch); build the same model (same config) on every rank"
                )
