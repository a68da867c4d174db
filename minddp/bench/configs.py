"""What the benchmark runs: named configurations, and how each wraps a model.

A configuration is a stage (one of minddp's, or ``torch`` for torch's own
DDP) plus a comm hook and the one flag that matters for memory
(``gradient_as_bucket_view``). Each carries the names of the two runs it is
judged against in the same benchmark:

* ``ref``: torch's DDP with the *same* hook (the ratio column), and
* ``noop``: the same stage with ``noop_hook`` (the no-communication limit;
  exposed comm = this configuration's step time minus that one's).

Names read as ``<stage>[+<variant>]``: ``bucket-async``, ``ddp+noop``,
``torch+powersgd-r1``, ``ddp+fp16``, ``torch+gabv``, ``torch+pyhook``.

``torch+pyhook`` is torch's DDP averaging through torch's own *Python*
``allreduce_hook`` instead of its C++ default: the same work, so its ratio to
``torch`` is what a Python comm hook costs torch's reducer. minddp's stages
always run a Python hook, so this is the like-for-like reference for their
exposed comm (``noop_hook``, the other side of that difference, is Python in
both).

Example::

    >>> [c.name for c in bench_configs(["ddp", "torch"], variants=["noop"])]
    ['ddp', 'torch', 'ddp+noop', 'torch+noop']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from minddp.config import TrainConfig

#: Variants beyond plain averaging. ``noop`` applies to every stage; ``pyhook`` to torch only (minddp's
#: default already is a Python hook); the others compare ``ddp`` with torch.
VARIANTS = ("noop", "powersgd", "fp16", "gabv", "pyhook")
#: Stages that take part in the hook/flag variants other than noop (ours vs torch's).
VARIANT_STAGES = ("ddp", "torch")
POWERSGD_RANKS = (1, 4)
#: Bucket cap of the PowerSGD configurations (torch's default; one bucket on the offline model). torch's
#: ``powerSGD_hook`` issues its second all_reduce from a future's callback; with several buckets in flight
#: on gloo the two ranks then pair different collectives and gloo aborts ("collective mismatch").
POWERSGD_BUCKET_CAP_MB = 25.0


@dataclass(frozen=True)
class BenchConfig:
    """One column of the benchmark: stage, hook, flags, and what it is compared with."""

    name: str
    stage: str                      # a minddp stage name, or "torch"
    hook: str = "allreduce"         # a minddp.comm.registry name (torch: the same name, torch's hook)
    powersgd_rank: int | None = None
    gradient_as_bucket_view: bool = False
    python_hook: bool = False       # torch only: average through torch's Python allreduce_hook, not its C++ default
    bucket_cap_mb: float | None = None   # None: the train command's --bucket-cap-mb
    ref: str | None = None          # torch's DDP with the same hook, in the same run
    noop: str | None = None         # the same stage with noop_hook, in the same run

    @property
    def torch_cpp_default(self) -> bool:
        """torch's DDP averaging in C++, no Python hook (no ``dist.all_reduce`` call to meter its bytes by)."""
        return self.stage == "torch" and self.hook == "allreduce" and not self.python_hook


def bench_configs(stages: list[str], variants: list[str] = list(VARIANTS)) -> list[BenchConfig]:
    """Every configuration for ``stages`` (plain averaging) and the chosen ``variants``."""
    has_torch = "torch" in stages
    noop = "noop" in variants

    def make(name, stage, ref_name, **kw):
        return BenchConfig(name, stage, ref=ref_name if has_torch and ref_name != name else None,
                           noop=f"{stage}+noop" if noop and kw.get("hook", "allreduce") == "allreduce"
                           and not kw.get("gradient_as_bucket_view") else None, **kw)

    configs = [make(s, s, "torch") for s in stages]
    if noop:
        configs += [make(f"{s}+noop", s, "torch+noop", hook="noop") for s in stages]
    for stage in [s for s in VARIANT_STAGES if s in stages]:
        if "powersgd" in variants:
            configs += [make(f"{stage}+powersgd-r{r}", stage, f"torch+powersgd-r{r}", hook="powersgd",
                             powersgd_rank=r, bucket_cap_mb=POWERSGD_BUCKET_CAP_MB) for r in POWERSGD_RANKS]
        if "fp16" in variants:
            configs.append(make(f"{stage}+fp16", stage, "torch+fp16", hook="fp16"))
        if "gabv" in variants:
            configs.append(make(f"{stage}+gabv", stage, "torch+gabv", gradient_as_bucket_view=True))
    if "pyhook" in variants and has_torch:
        configs.append(make("torch+pyhook", "torch", "torch", python_hook=True))
    return configs


def powersgd_options(cfg: TrainConfig, rank: int | None) -> dict:
    """PowerSGD settings of the train command, with this configuration's rank."""
    from minddp.train import _powersgd_options
    return _powersgd_options(dataclasses.replace(cfg, powersgd_rank=rank or cfg.powersgd_rank))


def wrap(config: BenchConfig, model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """``model`` wrapped as ``config`` says, with its hook registered (same settings as the train command)."""
    options = powersgd_options(cfg, config.powersgd_rank) if config.hook == "powersgd" else {}
    cap = cfg.bucket_cap_mb if config.bucket_cap_mb is None else config.bucket_cap_mb
    if config.stage == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        from minddp.train import _torch_hooks
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      bucket_cap_mb=cap,
                                      gradient_as_bucket_view=config.gradient_as_bucket_view)
        state = powerSGD_hook.PowerSGDState(process_group=None, **options) if options else None
        # plain averaging registers nothing (torch's C++ default), unless the Python hook is asked for
        if config.hook != "allreduce" or config.python_hook:
            ddp.register_comm_hook(state, _torch_hooks()[config.hook])
        return ddp
    from minddp.comm.registry import make_hook
    from minddp.stages import build_stage
    wrapped = build_stage(config.stage, model, bucket_cap_mb=cap,
                          gradient_as_bucket_view=config.gradient_as_bucket_view)
    if config.hook != "allreduce":           # plain averaging: the stage's built-in default
        wrapped.register_comm_hook(*make_hook(config.hook, None, **options))
    return wrapped
