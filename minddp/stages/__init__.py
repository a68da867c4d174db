"""The build-up of data parallelism, one idea per file, and a registry by name.

Read in this order; each class overrides only what its idea needs:

================  =============================  =======================================================
name              class                          the one idea it adds
================  =============================  =======================================================
``simple``        ``SimpleDDP``                  broadcast at start; average every grad after backward
``ga``            ``GradAccumDDP``               ``no_sync()``: skip the sync on accumulation steps
``hook``          ``HookDDP``                    sync each grad from an autograd hook, during backward
``hook-async``    ``AsyncHookDDP``               the same, without waiting: overlap
``bucket``        ``BucketDDP``                  one all_reduce per bucket of grads, not per grad
``bucket-async``  ``AsyncBucketDDP``             buckets sent while backward goes on
``ddp``           ``DistributedDataParallel``    torch's DDP: drop-in, automatic finish, rebuilt plan,
                                                 unused parameters, bucket views (docs/ddp.md)
================  =============================  =======================================================

``single`` (no wrapper, one process) and ``torch`` (torch's own DDP) are the
baselines the train command and the tests compare against.
"""

from __future__ import annotations

import inspect

from torch import nn

from minddp.stages.bucket import BucketDDP
from minddp.stages.bucket_async import AsyncBucketDDP
from minddp.stages.bucket_plan import plan_buckets
from minddp.stages.ddp import DistributedDataParallel
from minddp.stages.grad_accum import GradAccumDDP
from minddp.stages.hook import HookDDP
from minddp.stages.hook_async import AsyncHookDDP
from minddp.stages.simple import SimpleDDP

#: Stage name -> wrapper class, in reading order.
STAGES: dict[str, type[nn.Module]] = {
    "simple": SimpleDDP,
    "ga": GradAccumDDP,
    "hook": HookDDP,
    "hook-async": AsyncHookDDP,
    "bucket": BucketDDP,
    "bucket-async": AsyncBucketDDP,
    "ddp": DistributedDataParallel,
}

#: Names that are runs but not wrappers of ours.
BASELINES = ("single", "torch")


def register_stage(name: str, cls: type[nn.Module]) -> None:
    """Add a stage (e.g. ``ddp``) to the registry the CLI and tests iterate over."""
    STAGES[name] = cls


def build_stage(name: str, module: nn.Module, process_group=None, **options) -> nn.Module:
    """Wrap ``module`` in stage ``name``; options a stage does not take are ignored.

    So one call site can pass ``bucket_cap_mb`` to every stage and only the
    bucketed ones use it.
    """
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: choose one of {', '.join(STAGES)}")
    cls = STAGES[name]
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted}
    return cls(module, process_group=process_group, **kwargs)


__all__ = ["STAGES", "BASELINES", "build_stage", "register_stage", "plan_buckets", "SimpleDDP",
           "GradAccumDDP", "HookDDP", "AsyncHookDDP", "BucketDDP", "AsyncBucketDDP", "DistributedDataParallel"]
