"""The train command's settings: one typed dataclass; the CLI is derived from it.

Every field of :class:`TrainConfig` becomes one ``--option`` (underscores
become dashes), with the field's ``help`` text, type and default. Booleans get
``--x/--no-x``. Choices come from the registries at the time the parser is
built, so a stage, hook or transport added by another module shows up in
``--help`` without touching this file.

Parsing is two steps, both before any process starts:

1. ``argparse`` checks types and choices;
2. :func:`validate` checks what depends on several options (e.g. the global
   batch divides into ranks and micro-batches) and on the world (a model path
   that must exist).

Either step raises :class:`ConfigError` with one line that names the cause and
the fix; ``python -m minddp.train`` prints it and exits with code 2.

Example::

    >>> cfg = parse_args(["--stage", "bucket-async", "--steps", "20"])
    >>> cfg.stage, cfg.steps
    ('bucket-async', 20)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from minddp.cli import Parser, UsageError
from minddp.device import BACKENDS
from minddp.hub import is_local_path
from minddp.models import DTYPES, GPU_PRESET, OFFLINE_MODEL, OFFLINE_PRESETS


#: A bad or contradictory option (one line: cause and fix); the same error every minddp tool raises.
ConfigError = UsageError


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def stage_choices() -> list[str]:
    from minddp.ladder import BASELINES, STAGES
    return list(BASELINES[:1]) + list(STAGES) + list(BASELINES[1:]) + ["all"]


def hook_choices() -> list[str]:
    from minddp.comm.registry import hook_names
    return list(hook_names())


def collective_choices() -> list[str]:
    from minddp.collectives import TRANSPORTS
    return list(TRANSPORTS)


@dataclass
class TrainConfig:
    """Everything one ``python -m minddp.train`` run needs; ``--help`` shows the same text."""

    stage: str = _opt("bucket-async", "what syncs the gradients: a minddp stage, 'single' (one process on "
                      "the global batch), 'torch' (torch's DistributedDataParallel), or 'all' (each in turn, "
                      "same data and seeds)", choices=stage_choices)
    hook: str = _opt("allreduce", "comm hook every stage sends its buckets through (torch's hook of the "
                     "same name for --stage torch)", choices=hook_choices)
    powersgd_rank: int = _opt(1, "PowerSGD: rank of the low-rank approximation (matrix_approximation_rank)")
    powersgd_start_iter: int = _opt(2, "PowerSGD: plain allreduce for this many steps first "
                                    "(start_powerSGD_iter; torch defaults to 1000, short runs need less)")
    powersgd_min_compression_rate: float = _opt(2.0, "PowerSGD: compress a tensor only if this saves at least "
                                                "this factor (min_compression_rate)")
    powersgd_error_feedback: bool = _opt(True, "PowerSGD: add back last step's compression error "
                                         "(use_error_feedback)")
    powersgd_warm_start: bool = _opt(True, "PowerSGD: reuse last step's factors as the start (warm_start)")
    collective: str = _opt("torch", "how each all_reduce travels: torch's own, or a minddp collective "
                           "written from point-to-point messages", choices=collective_choices)
    world_size: int = _opt(2, "local ranks to start (ignored under torchrun, which sets WORLD_SIZE)")
    backend: str = _opt("auto", "process-group backend: auto = NCCL with one GPU per rank, else gloo",
                        choices=lambda: list(BACKENDS))
    model: str = _opt(OFFLINE_MODEL, f"'{OFFLINE_MODEL}' (offline default: an 80 k-parameter Llama, seeded random "
                      "init), 'small-llama' (5 M) or 'medium-llama' (25 M) (offline too), or a Hugging Face model "
                      f"id or local folder; GPU preset: {GPU_PRESET} with --dtype bf16")
    dtype: str = _opt("fp32", "parameter dtype (bf16 as in the blog, for GPUs)", choices=lambda: list(DTYPES))
    dataset: str = _opt("synthetic", "'synthetic' (offline default: generated paraphrase pairs), 'glue/mrpc' "
                        "(from the hub), or a local data set with columns sentence1, sentence2, label")
    max_seq_len: int = _opt(64, "truncate each sentence pair to this many tokens")
    steps: int = _opt(1000, "optimizer steps per stage")
    batch_size: int | None = _opt(None, "examples per rank per micro-batch (default 8, or derived from "
                                  "--global-batch-size)")
    global_batch_size: int | None = _opt(None, "examples per optimizer step over all ranks; must be divisible "
                                         "by world size x grad accum")
    grad_accum: int = _opt(3, "micro-batches per optimizer step (gradient accumulation, as in the blog)")
    bucket_cap_mb: float = _opt(0.1, "bucket size cap in MiB for the bucketed stages and torch (torch's "
                                "default is 25; the offline model needs small buckets to have several)")
    lr: float = _opt(3e-3, "AdamW learning rate")
    seed: int = _opt(314, "seed for the model init, the data and the shuffling (the blog's)")
    eval_examples: int = _opt(500, "held-out examples to measure accuracy on (0 = the whole split)")
    profile: bool = _opt(True, "write PyTorch profiler traces (one per rank) under --trace-dir")
    profile_steps: int = _opt(5, "profiled (active) steps after one warm-up step, as in the blog")
    trace_dir: str = _opt("traces", "folder for traces: <trace-dir>/<run-name>/<stage>/rank<r>.pt.trace.json")
    trace_gzip: bool = _opt(True, "write .pt.trace.json.gz (about 10x smaller) instead of .pt.trace.json")
    run_name: str | None = _opt(None, "name of this run's folder under --trace-dir (default: "
                                "<model>-<dataset>-<date-time>)")
    summary_json: str | None = _opt(None, "also write the run's summary (losses, accuracy, timings) to this "
                                    "JSON file")
    timeout: float | None = _opt(None, "seconds any collective may wait before the run fails "
                                 "(default: MINDDP_TIMEOUT or 300)")
    save_every: int = _opt(0, "save a checkpoint every N optimizer steps to <checkpoint-dir>/<stage>.pt, "
                           "atomically (0 = never)")
    checkpoint_dir: str = _opt("checkpoints", "folder for --save-every checkpoints (one file per stage, "
                               "replaced at each save)")
    resume: str | None = _opt(None, "continue from this checkpoint: model, optimizer, hook state, RNG states and "
                              "data position; the run must use the options it was saved with")
    analyze: bool = _opt(False, "after training, run python -m minddp.analyze on the run folder")
    progress: bool = _opt(True, "show a progress bar on rank 0")

    # -- derived, filled in by validate() --------------------------------------------------------

    def stages(self) -> list[str]:
        """The stages this run trains, in reading order."""
        return [s for s in stage_choices() if s != "all"] if self.stage == "all" else [self.stage]

    def effective_world_size(self) -> int:
        """Ranks of the distributed stages: torchrun's WORLD_SIZE when under it, else --world-size."""
        from minddp.launch import in_torchrun
        return int(os.environ["WORLD_SIZE"]) if in_torchrun() else self.world_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def powersgd_options(self) -> dict:
        """The PowerSGD settings, by ``PowerSGDState``'s names."""
        return dict(matrix_approximation_rank=self.powersgd_rank, start_powerSGD_iter=self.powersgd_start_iter,
                    min_compression_rate=self.powersgd_min_compression_rate,
                    use_error_feedback=self.powersgd_error_feedback, warm_start=self.powersgd_warm_start,
                    random_seed=self.seed)


def build_parser() -> argparse.ArgumentParser:
    """Derive the CLI from :class:`TrainConfig`'s fields."""
    parser = Parser(prog="python -m minddp.train",
                     description="Train a sequence classifier with one DDP stage (or all of them) on N ranks "
                                 "and write profiler traces for comparison.",
                     epilog="Example: python -m minddp.train --stage bucket-async   (offline default, 2 ranks)")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type in ("bool", bool):
            parser.add_argument(flag, default=f.default, help=help_text, action=argparse.BooleanOptionalAction)
            continue
        base = re.sub(r"\s*\|\s*None", "", str(f.type))
        kind = {"int": int, "float": float, "str": str}[base]
        choices = f.metadata.get("choices")
        parser.add_argument(flag, type=kind, default=f.default, help=help_text,
                            choices=choices() if choices else None, metavar=None if choices else base.upper())
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Steps 1-2: parse ``argv`` into a validated :class:`TrainConfig`, or raise :class:`ConfigError`."""
    ns = build_parser().parse_args(argv)                                                   # step 1
    cfg = TrainConfig(**vars(ns))
    validate(cfg, explicit_batch_size=ns.batch_size is not None)                           # step 2
    return cfg


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def validate(cfg: TrainConfig, explicit_batch_size: bool = True) -> None:
    """Step 2: the checks argparse cannot do. Fills ``cfg.batch_size`` when it was derived."""
    from minddp.data import check_dataset_name
    for name in ("world_size", "steps", "grad_accum", "max_seq_len", "profile_steps"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.eval_examples < 0:
        raise ConfigError(f"--eval-examples must be 0 (all) or more, got {cfg.eval_examples}")
    if cfg.lr <= 0 or cfg.bucket_cap_mb <= 0:
        raise ConfigError("--lr and --bucket-cap-mb must be positive")
    if cfg.save_every < 0:
        raise ConfigError(f"--save-every must be 0 (never) or a number of steps, got {cfg.save_every}")
    if cfg.resume is not None and cfg.stage == "all":
        raise ConfigError("--resume continues one stage's run; pick that --stage instead of 'all'")
    if cfg.resume is not None and cfg.stage in ("ddp", "torch") and "powersgd" in cfg.hook:
        raise ConfigError(f"--resume with --stage {cfg.stage} and a PowerSGD hook is not supported: that stage "
                          "rebuilds its buckets after its first step, so the saved per-bucket PowerSGD memory "
                          "would not fit them; resume with --stage bucket-async (or another hook)")
    if cfg.resume is not None and not os.path.isfile(cfg.resume):
        raise ConfigError(f"--resume {cfg.resume!r}: no such file; give a checkpoint written with --save-every")
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {cfg.timeout}")
    world = cfg.effective_world_size()
    per_step = world * cfg.grad_accum
    if cfg.global_batch_size is not None:
        if cfg.global_batch_size < 1 or cfg.global_batch_size % per_step:
            raise ConfigError(f"--global-batch-size {cfg.global_batch_size} is not divisible by world size x "
                              f"grad accum = {world} x {cfg.grad_accum}; use a multiple of {per_step}")
        derived = cfg.global_batch_size // per_step
        if explicit_batch_size and cfg.batch_size != derived:
            raise ConfigError(f"--batch-size {cfg.batch_size} contradicts --global-batch-size "
                              f"{cfg.global_batch_size} (which means {derived} per rank per micro-batch); "
                              "give only one of them")
        cfg.batch_size = derived
    elif cfg.batch_size is None:
        cfg.batch_size = 8
    if cfg.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.model not in OFFLINE_PRESETS:
        if is_local_path(cfg.model):
            path = os.path.expanduser(cfg.model)
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"--model {cfg.model!r}: no model folder there (no config.json); give a folder "
                                  f"saved with save_pretrained, a hub id, or '{OFFLINE_MODEL}'")
        elif not _HUB_ID.match(cfg.model):
            raise ConfigError(f"--model {cfg.model!r} is neither an offline preset ({', '.join(OFFLINE_PRESETS)}), "
                              "a local folder, nor a Hugging Face id like owner/name")
    try:
        check_dataset_name(cfg.dataset)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.stage == "single" and cfg.collective != "torch":
        raise ConfigError("--collective has no effect with --stage single (one process sends nothing); "
                          "drop it or pick a distributed stage")
