"""What the benchmark runs: named configurations, and how each wraps a model.

A configuration (:class:`BenchConfig`) is a stage (one of minddp's, or ``torch`` for torch's own
DDP) plus a comm hook and the one flag that matters for memory (``gradient_as_bucket_view``), named
``<stage>[+<variant>]``: ``bucket-async``, ``ddp+noop``, ``torch+powersgd-r1``, ``ddp+fp16``,
``torch+gabv``, ``torch+pyhook``. Each carries the names of the two runs it is judged against: ``ref``
(torch's DDP with the same hook) and ``noop`` (the same stage with ``noop_hook``, the
no-communication limit). Beside the sharded rungs run torch's own sharding (:data:`TORCH_SHARDED`),
which has no no-communication variant. :func:`wrap` and :func:`optimizer` build a configuration on a
model. ``docs/benchmarks.md`` (*Method*, its *Configurations* item) says what each variant is for.

Example::

    >>> [c.name for c in bench_configs(["ddp", "torch"], variants=["noop"])]
    ['ddp', 'torch', 'ddp+noop', 'torch+noop']
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from minddp.train.config import TrainConfig

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
#: torch's own sharding, as configurations (not minddp stages): its ZeRO-1 over its DDP, and fully_shard.
TORCH_SHARDED = ("torch-zero1", "torch-fsdp")
#: ``--stages sharded``: the sharded ladder beside DDP and torch's own.
SHARDED_BENCH = ("ddp", "zero1", "zero2", "fsdp", "torch", "torch-zero1", "torch-fsdp")


@dataclass(frozen=True)
class BenchConfig:
    """One column of the benchmark: stage, hook, flags, and what it is compared with."""

    name: str
    stage: str  # a minddp stage name, or "torch"
    hook: str = "allreduce"  # a minddp.comm.registry name (torch: the same name, torch's hook)
    powersgd_rank: int | None = None
    gradient_as_bucket_view: bool = False
    python_hook: bool = False  # torch only: average through torch's Python allreduce_hook, not its C++ default
    bucket_cap_mb: float | None = None  # None: the train command's --bucket-cap-mb
    ref: str | None = None  # torch's DDP with the same hook, in the same run
    noop: str | None = None  # the same stage with noop_hook, in the same run

    @property
    def torch_cpp_default(self) -> bool:
        """torch averaging in C++, no Python hook (no ``dist.all_reduce`` call to meter its bytes by)."""
        return self.stage in ("torch",) + TORCH_SHARDED and self.hook == "allreduce" and not self.python_hook


def bench_configs(stages: list[str], variants: list[str] = list(VARIANTS)) -> list[BenchConfig]:
    """Every configuration for ``stages`` (plain averaging) and the chosen ``variants``."""
    has_torch = "torch" in stages
    noop = "noop" in variants

    def make(name, stage, ref_name, **kw):
        return BenchConfig(
            name,
            stage,
            ref=ref_name if has_torch and ref_name != name else None,
            noop=f"{stage}+noop"
            if noop and kw.get("hook", "allreduce") == "allreduce" and not kw.get("gradient_as_bucket_view")
            else None,
            **kw,
        )

    configs = [make(s, s, "torch") for s in stages]
    if noop:
        configs += [make(f"{s}+noop", s, "torch+noop", hook="noop") for s in stages if s not in TORCH_SHARDED]
    for stage in [s for s in VARIANT_STAGES if s in stages]:
        if "powersgd" in variants:
            configs += [
                make(
                    f"{stage}+powersgd-r{r}",
                    stage,
                    f"torch+powersgd-r{r}",
                    hook="powersgd",
                    powersgd_rank=r,
                    bucket_cap_mb=POWERSGD_BUCKET_CAP_MB,
                )
                for r in POWERSGD_RANKS
            ]
        if "fp16" in variants:
            configs.append(make(f"{stage}+fp16", stage, "torch+fp16", hook="fp16"))
        if "gabv" in variants:
            configs.append(make(f"{stage}+gabv", stage, "torch+gabv", gradient_as_bucket_view=True))
    if "pyhook" in variants and has_torch:
        configs.append(make("torch+pyhook", "torch", "torch", python_hook=True))
    return configs


def wrap(config: BenchConfig, model: nn.Module, cfg: TrainConfig, wire=None, link=None) -> nn.Module:
    """``model`` wrapped as ``config`` says (else the train command's settings), by :func:`minddp.ladder.wrap`.

    ``link`` (``--link``) is this rank's emulated NIC, under every configuration.
    """
    from minddp.ladder import wrap as wrap_in_stage

    options = cfg.powersgd_options()
    if config.powersgd_rank is not None:
        options["matrix_approximation_rank"] = config.powersgd_rank
    if config.stage == "torch-fsdp":
        return torch_fully_shard(model)
    return wrap_in_stage(
        "torch" if config.stage == "torch-zero1" else config.stage,
        model,
        hook=config.hook,
        bucket_cap_mb=cfg.bucket_cap_mb if config.bucket_cap_mb is None else config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        python_hook=config.python_hook,
        powersgd_options=options,
        wire=wire,
        link=link,
    )


def optimizer(config: BenchConfig, model: nn.Module, cfg: TrainConfig, wire=None, link=None):
    """The configuration's AdamW, sharded as its stage shards it (:func:`minddp.ladder.make_optimizer`), or ZeRO-1."""
    import torch

    if config.stage == "torch-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=cfg.lr)
    from minddp.ladder import make_optimizer

    stage = "torch" if config.stage == "torch-fsdp" else config.stage
    return make_optimizer(stage, model, torch.optim.AdamW, hook=config.hook, wire=wire, link=link, lr=cfg.lr)


def torch_fully_shard(model: nn.Module) -> nn.Module:
    """torch's FSDP2 as its docs apply it: ``fully_shard`` on every block (minddp's units), then on the root."""
    from torch.distributed.fsdp import fully_shard

    from minddp.sharding.fsdp import blocks_of

    is_block = blocks_of(model)
    for module in [m for m in model.modules() if is_block(m) and m is not model]:
        fully_shard(module)
    return fully_shard(model)
