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
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from minddp.runtime.cli import Parser, UsageError, number
from minddp.runtime.device import BACKENDS, DEFAULT_TIMEOUT_S
from minddp.runtime.hang import DEFAULT_HANG_S
from minddp.train.hub import is_local_path
from minddp.train.models import DTYPES, GPU_PRESET, OFFLINE_MODEL, OFFLINE_PRESETS

#: A bad or contradictory option (one line: cause and fix); the same error every minddp tool raises.
ConfigError = UsageError


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def stage_choices() -> list[str]:
    from minddp.ladder import BASELINES, STAGES

    return list(BASELINES[:1]) + list(STAGES) + list(BASELINES[1:]) + ["all"]


#: ``--stage sharded``: the sharded ladder as one comparison, from DDP up (docs/sharding.md).
SHARDED_LADDER = ["ddp", "zero1", "zero2", "fsdp"]

#: ``--compile-backend``: torch.compile's backends that need nothing beyond torch (Inductor on a CPU: a C++ compiler).
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def hook_choices() -> list[str]:
    from minddp.comm.registry import hook_names

    return list(hook_names())


def collective_choices() -> list[str]:
    from minddp.collectives import TRANSPORTS

    return list(TRANSPORTS)


#: The ``--help`` sections, in order. A new option goes into the section it belongs to (``group=`` below).
GROUPS = {
    "what": "what to train",
    "steps": "steps and batches",
    "comm": "communication: buckets, comm hooks, collectives",
    "ranks": "ranks and failures",
    "outputs": "profiling and outputs",
    "checkpoints": "checkpoints",
    "slow": "slow links: --stage local-sgd and diloco (docs/diloco.md)",
}

_count = number(int, low=1)
_count0 = number(int, low=0)
_seconds = number(float, low=0, low_open=True, high=1e7)
_positive = number(float, low=0, low_open=True)


def stage_list(allowed=None):
    """An argparse ``type``: one stage name, a comma list of them, 'all' or 'sharded' (train and bench alike)."""

    def parse(text: str) -> str:
        names = [n.strip() for n in text.split(",") if n.strip()]
        from minddp.ladder import FAULT_TOLERANT, SLOW_LINKS  # named only, never part of 'all'

        known = allowed() if allowed else stage_choices() + ["sharded", *SLOW_LINKS, *FAULT_TOLERANT]
        unknown = [n for n in names if n not in known]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"unknown stage {', '.join(unknown) or '(empty)'}; choose from "
                f"{', '.join(known)}, or a comma list of them"
            )
        for word, means in (("all", "every stage"), ("sharded", "ddp, zero1, zero2 and fsdp")):
            if word in names and len(names) > 1:
                raise argparse.ArgumentTypeError(f"'{word}' already means {means}; give it alone")
        return ",".join(dict.fromkeys(names))

    parse.__name__ = "stage"
    return parse


def _one_of(choices):
    """An argparse ``type`` for a name from ``choices()`` (read when parsing: registries may grow)."""

    def parse(text: str) -> str:
        if text not in choices():
            raise argparse.ArgumentTypeError(f"unknown {text!r}; choose from {', '.join(choices())}")
        return text

    parse.__name__ = "name"
    return parse


def _bucket_cap(text) -> float | str:
    """``--bucket-cap-mb``: a positive number of MiB, or ``auto`` (chosen by :mod:`minddp.costmodel.auto`)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    return _positive(text)


_bucket_cap.__name__ = "MiB or auto"


def _link(text: str) -> str:
    """``--link``: a preset or ``bandwidth,latency`` (:func:`minddp.comm.link.parse_link`), refused in one line."""
    from minddp.comm.link import parse_link

    try:
        parse_link(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclass
class TrainConfig:
    """Everything one ``python -m minddp.train`` run needs; ``--help`` shows the same text.

    Each field: default, help, ``group`` (its ``--help`` section, :data:`GROUPS`),
    ``metavar`` (:data:`minddp.runtime.cli.METAVARS`) and ``type`` (the parser that
    refuses a bad value in one line: range, finiteness, a known name).
    """

    # what to train
    stage: str = _opt(
        "bucket-async",
        "what syncs the gradients: a minddp stage ({stages}), 'single' (one process on the "
        "global batch), 'torch' (torch's "
        "DistributedDataParallel), a comma list of them, 'all' (each in turn, same data and seeds) or "
        "'sharded' (ddp, zero1, zero2, fsdp in turn); named only: 'local-sgd' and 'diloco' (sync the weights every "
        "--sync-every steps, for slow links) and 'ft' (trains through a lost rank)",
        group="what",
        metavar="NAME[,...]",
        type=stage_list(),
    )
    hook: str = _opt(
        "allreduce",
        "comm hook every stage sends its buckets through (torch's hook of the "
        "same name for --stage torch): allreduce, fp16, bf16, powersgd, batched-powersgd, noop, or "
        "fp16+/bf16+ one of them",
        group="comm",
        metavar="NAME",
        type=_one_of(hook_choices),
    )
    collective: str = _opt(
        "torch",
        "how each all_reduce travels: torch (its own), or ring / naive (minddp "
        "collectives written from point-to-point messages)",
        group="comm",
        metavar="NAME",
        type=_one_of(collective_choices),
    )
    link: str | None = _opt(
        None,
        "emulate a network under every gradient collective (results unchanged, completion "
        "delayed to the modeled time): a preset (100mbit, 1gbit, 10gbit, 100gbit-ib, pcie-t4, "
        "nvlink, loopback; wan and home for the slow-link stages) or 'bandwidth,latency' such as 2.5gbit,40us; "
        "see docs/scaling.md",
        group="comm",
        metavar="LINK",
        type=_link,
    )
    model: str = _opt(
        OFFLINE_MODEL,
        f"'{OFFLINE_MODEL}' (offline default: an 80 k-parameter Llama, seeded random "
        "init), 'small-llama' (5 M), 'medium-llama' (25 M) or 'smollm2-360m' (the blog's 362 M architecture, "
        "random init: the GPU preset, with --dtype bf16) (offline too), or a Hugging Face model id "
        f"or local folder such as {GPU_PRESET} (the blog's checkpoint)",
        group="what",
        metavar="NAME",
    )
    dtype: str = _opt(
        "fp32",
        "parameter dtype: fp32, or bf16 (as in the blog, for GPUs)",
        group="what",
        metavar="NAME",
        type=_one_of(lambda: list(DTYPES)),
    )
    compile: bool = _opt(
        False,
        "compile the model with torch.compile, then wrap it in the stage (as nanoGPT does); the bucketed "
        "stages and ddp cut the compiled graph where their buckets fill, so buckets still go out during "
        "backward (docs/ddp.md, Compiled). Not for fsdp and ft",
        group="what",
    )
    compile_backend: str = _opt(
        "inductor",
        "torch.compile's backend with --compile: inductor (torch's default: generated kernels, the slowest to "
        "compile), aot_eager (traced, run as eager: eager's exact results) or eager",
        group="what",
        metavar="NAME",
        type=_one_of(lambda: list(COMPILE_BACKENDS)),
    )
    dataset: str = _opt(
        "synthetic",
        "'synthetic' (offline default: generated paraphrase pairs), 'glue/mrpc' "
        "(from the hub), or a local data set with columns sentence1, sentence2, label (a folder, "
        "or one csv/json/parquet file)",
        group="what",
        metavar="NAME",
    )
    max_seq_len: int = _opt(
        64, "truncate each sentence pair to this many tokens", group="what", metavar="N", type=number(int, low=4)
    )
    # steps and batches
    steps: int = _opt(
        1000, "optimizer steps per stage (the whole run of each stage)", group="steps", metavar="N", type=_count
    )
    batch_size: int | None = _opt(
        None,
        "examples per rank per micro-batch (default 8, or derived from --global-batch-size)",
        group="steps",
        metavar="N",
        type=_count,
    )
    global_batch_size: int | None = _opt(
        None,
        "examples per optimizer step over all ranks; must be divisible by world size x grad accum",
        group="steps",
        metavar="N",
        type=_count,
    )
    grad_accum: int = _opt(
        3,
        "micro-batches per optimizer step (gradient accumulation, as in the blog)",
        group="steps",
        metavar="N",
        type=_count,
    )
    lr: float = _opt(3e-3, "AdamW learning rate", group="steps", metavar="X", type=_positive)
    seed: int = _opt(
        314,
        "seed for the model init, the data and the shuffling (the blog's)",
        group="steps",
        metavar="N",
        type=number(int, low=0, high=2**32 - 1),
    )
    eval_examples: int = _opt(
        500,
        "held-out examples to measure loss and accuracy on (0 = the whole split)",
        group="steps",
        metavar="N",
        type=_count0,
    )
    eval_every: int = _opt(
        0,
        "measure the held-out loss and accuracy every N optimizer steps as well as at the end (0 = at the end "
        "only); each measurement is a line of the stage's metrics.jsonl",
        group="steps",
        metavar="N",
        type=_count0,
    )
    # communication
    bucket_cap_mb: float = _opt(
        0.1,
        "bucket size cap in MiB for the bucketed stages and torch (torch's "
        "default is 25; the offline model needs small buckets to have several), or 'auto': "
        "chosen at the start of each stage by the step-time model (minddp.costmodel) for this "
        "model, world size and link, which says which cap and why",
        group="comm",
        metavar="MIB",
        type=_bucket_cap,
    )
    powersgd_rank: int = _opt(
        1,
        "PowerSGD: rank of the low-rank approximation (matrix_approximation_rank)",
        group="comm",
        metavar="N",
        type=_count,
    )
    powersgd_start_iter: int = _opt(
        2,
        "PowerSGD: plain allreduce for this many steps first "
        "(start_powerSGD_iter; torch defaults to 1000, short runs need less)",
        group="comm",
        metavar="N",
        type=_count0,
    )
    powersgd_min_compression_rate: float = _opt(
        2.0,
        "PowerSGD: compress a tensor only if this saves at least this factor (min_compression_rate)",
        group="comm",
        metavar="X",
        type=_positive,
    )
    powersgd_error_feedback: bool = _opt(
        True, "PowerSGD: add back last step's compression error (use_error_feedback)", group="comm"
    )
    powersgd_warm_start: bool = _opt(
        True, "PowerSGD: reuse last step's factors as the start (warm_start)", group="comm"
    )
    # ranks and failures
    world_size: int = _opt(
        2,
        "local ranks to start (ignored under torchrun, which sets WORLD_SIZE)",
        group="ranks",
        metavar="N",
        type=_count,
    )
    backend: str = _opt(
        "auto",
        "process-group backend: auto (NCCL with one GPU per rank, else gloo), gloo or nccl",
        group="ranks",
        metavar="NAME",
        type=_one_of(lambda: list(BACKENDS)),
    )
    timeout: float | None = _opt(
        None,
        "seconds any collective may wait before the run fails (default: MINDDP_TIMEOUT or 300)",
        group="ranks",
        metavar="SECONDS",
        type=_seconds,
    )
    hang_timeout: float | None = _opt(
        None,
        "seconds one rank may stop (frozen, or idle outside a collective its "
        "peers wait in) before the run ends naming it (default: MINDDP_HANG_TIMEOUT "
        "or 30; 0 = off)",
        group="ranks",
        metavar="SECONDS",
        type=number(float, low=0, high=1e7, zero_means="off"),
    )
    inject: str | None = _opt(
        None,
        "--stage ft only: faults to train through, e.g. kill@5:1,stop@9:0,raise@12:1,"
        "coord@15 (SIGKILL, SIGSTOP past --hang-timeout, a collective that raises, the "
        "coordinator's restart; docs/fault-tolerance.md)",
        group="ranks",
        metavar="FAULTS",
    )
    # profiling and outputs
    profile: bool = _opt(True, "write PyTorch profiler traces (one per rank) under --trace-dir", group="outputs")
    profile_steps: int = _opt(
        5,
        "profiled steps after one warm-up step, as in the blog (0 = none, as --no-profile)",
        group="outputs",
        metavar="N",
        type=_count0,
    )
    trace_dir: str = _opt(
        "traces",
        "folder for traces: <trace-dir>/<run-name>/<stage>/rank<r>.pt.trace.json",
        group="outputs",
        metavar="DIR",
    )
    trace_gzip: bool = _opt(
        True, "write .pt.trace.json.gz (about 10x smaller) instead of .pt.trace.json", group="outputs"
    )
    run_name: str | None = _opt(
        None,
        "name of this run's folder under --trace-dir (default: <model>-<dataset>-<date-time>)",
        group="outputs",
        metavar="NAME",
    )
    summary_json: str | None = _opt(
        None,
        "also write the run's summary (losses, accuracy, timings) to this JSON file",
        group="outputs",
        metavar="FILE",
    )
    analyze: bool = _opt(False, "after training, run python -m minddp.analyze on the run folder", group="outputs")
    progress: bool = _opt(True, "show a progress bar on rank 0", group="outputs")
    # checkpoints
    save_every: int = _opt(
        0,
        "save a checkpoint every N optimizer steps to <checkpoint-dir>/<stage>.pt, atomically (0 = never)",
        group="checkpoints",
        metavar="N",
        type=_count0,
    )
    checkpoint_dir: str = _opt(
        "checkpoints",
        "folder for --save-every checkpoints (one file per stage, replaced at each save)",
        group="checkpoints",
        metavar="DIR",
    )
    resume: str | None = _opt(
        None,
        "continue from this checkpoint: model, optimizer, hook state, RNG states and "
        "data position; the run must use the options it was saved with",
        group="checkpoints",
        metavar="FILE",
    )

    # slow links
    sync_every: int | None = _opt(
        None,
        "--stage local-sgd and diloco: optimizer steps each replica takes alone between syncs, H (default 10)",
        group="slow",
        metavar="H",
        type=_count,
    )
    outer_lr: float | None = _opt(
        None,
        "--stage diloco: the outer SGD's learning rate (default 0.7, DiLoCo's; 1 with --outer-momentum 0 is plain "
        "averaging, local SGD)",
        group="slow",
        metavar="X",
        type=_positive,
    )
    outer_momentum: float | None = _opt(
        None,
        "--stage diloco: the outer SGD's Nesterov momentum, below 1 (default 0.9, DiLoCo's; 0 = none)",
        group="slow",
        metavar="X",
        type=number(float, low=0),
    )
    fragments: int | None = _opt(
        None,
        "--stage diloco: streaming DiLoCo's fragments K, synced one after another, one every H/K steps (default 1: the "
        "whole model at once); H must be a multiple of K",
        group="slow",
        metavar="K",
        type=_count,
    )
    fragment_delay: int | None = _opt(
        None,
        "--stage diloco: inner steps a fragment's message travels under before it is applied, tau, below H/K "
        "(default 0)",
        group="slow",
        metavar="N",
        type=_count0,
    )
    fragment_alpha: float | None = _opt(
        None,
        "--stage diloco: the local weights' share when a fragment's synced weights land, alpha in [0, 1] "
        "(default 0: the synced weights)",
        group="slow",
        metavar="X",
        type=number(float),
    )

    # -- derived, filled in by validate() --------------------------------------------------------

    def stages(self) -> list[str]:
        """The stages this run trains: every one in reading order for 'all', else those named, in that order."""
        if self.stage == "all":
            return [s for s in stage_choices() if s != "all"]
        if self.stage == "sharded":
            return list(SHARDED_LADDER)
        return self.stage.split(",")

    def effective_world_size(self) -> int:
        """Ranks of the distributed stages: torchrun's WORLD_SIZE when under it, else --world-size."""
        from minddp.runtime.launch import in_torchrun

        return int(os.environ["WORLD_SIZE"]) if in_torchrun() else self.world_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def powersgd_options(self) -> dict:
        """The PowerSGD settings, by ``PowerSGDState``'s names."""
        return dict(
            matrix_approximation_rank=self.powersgd_rank,
            start_powerSGD_iter=self.powersgd_start_iter,
            min_compression_rate=self.powersgd_min_compression_rate,
            use_error_feedback=self.powersgd_error_feedback,
            warm_start=self.powersgd_warm_start,
            random_seed=self.seed,
        )


EXAMPLES = [
    "python -m minddp.train --stage bucket-async            # offline default: tiny-llama, 2 ranks on CPU",
    "python -m minddp.train --stage all --steps 30          # every stage in turn, same data and seeds",
    "python -m minddp.train --stage ddp --hook powersgd --save-every 100",
    "python -m minddp.train --stage ddp --hook powersgd --resume checkpoints/ddp.pt --steps 2000",
    "python -m minddp.train --stage diloco --sync-every 20 --link wan   # talk every 20 steps, over a WAN",
    "torchrun --nproc-per-node 4 -m minddp.train --model HuggingFaceTB/SmolLM2-360M-Instruct --dtype bf16 "
    "--dataset glue/mrpc --batch-size 16 --steps 6",
]

USAGE = "python -m minddp.train [--stage NAME[,...]] [--steps N] [--model NAME] [options]"


def field_option(name: str) -> tuple[str, dict]:
    """The ``--flag`` and ``add_argument`` keywords of one :class:`TrainConfig` field (shared with the benchmark)."""
    f = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    flag = "--" + f.name.replace("_", "-")
    if f.type in ("bool", bool):
        return flag, dict(default=f.default, help=f.metadata["help"], action=argparse.BooleanOptionalAction)
    base = re.sub(r"\s*\|\s*None", "", str(f.type))
    text = f.metadata["help"]
    if "{stages}" in text:  # the registry as it is now: a stage another module adds is listed too
        from minddp.ladder import STAGES

        text = text.format(stages=", ".join(STAGES))
    return flag, dict(
        type=f.metadata.get("type") or {"int": int, "float": float, "str": str}[base],
        default=f.default,
        help=text,
        metavar=f.metadata.get("metavar"),
    )


def build_parser() -> argparse.ArgumentParser:
    """Derive the CLI from :class:`TrainConfig`'s fields, one ``--help`` section per :data:`GROUPS` entry."""
    parser = Parser(
        prog="python -m minddp.train",
        usage=USAGE,
        examples=EXAMPLES,
        description="Train a sequence classifier with one DDP stage (or several) on N ranks and write "
        "profiler traces for comparison. Bad options exit with code 2 before any rank "
        "starts; a failed rank exits with 1.",
    )
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for f in dataclasses.fields(TrainConfig):
        flag, kwargs = field_option(f.name)
        groups[f.metadata["group"]].add_argument(flag, **kwargs)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Steps 1-2: parse ``argv`` into a validated :class:`TrainConfig`, or raise :class:`ConfigError`."""
    ns = build_parser().parse_args(argv)  # step 1
    cfg = TrainConfig(**vars(ns))
    validate(cfg, explicit_batch_size=ns.batch_size is not None)  # step 2
    return cfg


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def validate(cfg: TrainConfig, explicit_batch_size: bool = True) -> None:
    """Step 2: the checks argparse cannot do. Fills ``cfg.batch_size`` when it was derived."""
    from minddp.train.data import check_dataset_name

    for f in dataclasses.fields(TrainConfig):  # the parsers' checks again, for a config built in code
        check = f.metadata.get("type")
        value = getattr(cfg, f.name)
        if check is not None and value is not None:
            try:
                check(value)
            except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
                raise ConfigError(f"argument --{f.name.replace('_', '-')}: {exc}") from None
    for env, value in (
        ("MINDDP_TIMEOUT", DEFAULT_TIMEOUT_S if cfg.timeout is None else None),
        ("MINDDP_HANG_TIMEOUT", DEFAULT_HANG_S if cfg.hang_timeout is None else None),
    ):
        if value is not None and not (math.isfinite(value) and value >= (0 if env == "MINDDP_HANG_TIMEOUT" else 1e-3)):
            raise ConfigError(
                f"{env}={os.environ.get(env)!r} is not a finite number of seconds; fix or unset it, "
                f"or give --{'timeout' if env == 'MINDDP_TIMEOUT' else 'hang-timeout'}"
            )
    stages = cfg.stages()
    if cfg.inject is not None:
        from minddp.ft.faults import parse_faults

        if stages != ["ft"]:
            raise ConfigError("--inject needs --stage ft: the other stages end the run when a rank fails")
        try:
            parse_faults(cfg.inject, cfg.world_size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if "ft" in stages:
        from minddp.runtime.launch import in_torchrun

        if in_torchrun() or cfg.resume or cfg.save_every:
            raise ConfigError(
                "--stage ft starts its own ranks and heals them from a peer: run it without "
                "torchrun, --resume and --save-every"
            )
    if cfg.resume is not None and len(stages) > 1:
        raise ConfigError(f"--resume continues one stage's run; pick that --stage instead of {cfg.stage!r}")
    if cfg.resume is not None and "powersgd" in cfg.hook:
        if cfg.stage == "torch":
            raise ConfigError(
                "--resume with --stage torch and a PowerSGD hook is not supported: torch's DDP rebuilds its "
                "buckets after the first step of every run and takes no saved plan, so the saved per-bucket "
                "PowerSGD memory would not fit them; resume with --stage ddp (which starts from the saved plan)"
            )
        if cfg.bucket_cap_mb == "auto" and cfg.stage in ("bucket", "bucket-async"):
            raise ConfigError(
                f"--resume with --bucket-cap-mb auto and a PowerSGD hook is not supported on --stage {cfg.stage}: "
                "auto picks the cap from this run's own timing, so the buckets may differ from those the saved "
                "PowerSGD memory was made for; give the cap the saved run chose (bucket_cap_mb_used in its "
                "config.json), or use --stage ddp (which saves its bucket plan)"
            )
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER

    sharded = stages[0] in SHARDED_OPTIMIZER + SHARDED_GRADIENTS  # their checkpoints are folders (DCP)
    if cfg.resume is not None and not (os.path.isdir(cfg.resume) if sharded else os.path.isfile(cfg.resume)):
        what = ("not a folder" if sharded else "a folder") if os.path.exists(cfg.resume) else "no such file"
        kind = "folder" if sharded else "file"
        raise ConfigError(f"--resume {cfg.resume!r}: {what}; give a checkpoint {kind} written with --save-every")
    world = cfg.effective_world_size()
    per_step = world * cfg.grad_accum
    if cfg.global_batch_size is not None:
        if cfg.global_batch_size < 1 or cfg.global_batch_size % per_step:
            raise ConfigError(
                f"--global-batch-size {cfg.global_batch_size} is not divisible by world size x "
                f"grad accum = {world} x {cfg.grad_accum}; use a multiple of {per_step}"
            )
        derived = cfg.global_batch_size // per_step
        if explicit_batch_size and cfg.batch_size != derived:
            raise ConfigError(
                f"--batch-size {cfg.batch_size} contradicts --global-batch-size "
                f"{cfg.global_batch_size} (which means {derived} per rank per micro-batch); "
                "give only one of them"
            )
        cfg.batch_size = derived
    elif cfg.batch_size is None:
        cfg.batch_size = 8
    if cfg.model not in OFFLINE_PRESETS:
        if is_local_path(cfg.model):
            path = os.path.expanduser(cfg.model)
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(
                    f"--model {cfg.model!r}: no model folder there (no config.json); give a folder "
                    f"saved with save_pretrained, a hub id, or '{OFFLINE_MODEL}'"
                )
        elif not _HUB_ID.match(cfg.model):
            raise ConfigError(
                f"--model {cfg.model!r} is neither an offline preset ({', '.join(OFFLINE_PRESETS)}), "
                "a local folder, nor a Hugging Face id like owner/name"
            )
    try:
        check_dataset_name(cfg.dataset)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if stages == ["single"] and cfg.link is not None:
        raise ConfigError(
            "--link has no effect with --stage single (one process sends nothing); drop it or pick a distributed stage"
        )
    if cfg.compile_backend != "inductor" and not cfg.compile:
        raise ConfigError("--compile-backend has no effect without --compile; add --compile or drop it")
    if cfg.compile and cfg.stage not in ("all", "sharded"):  # named: refused; in all or sharded: skipped (run.py)
        for stage in stages:
            reason = compile_unavailable(stage, cfg.bucket_cap_mb)
            if reason is not None:
                fix = "give --bucket-cap-mb 1 or more" if stage == "torch" else f"drop --stage {stage}"
                raise ConfigError(f"--compile: {reason}; {fix}, or drop --compile")
    check_slow_links(cfg, stages)
    if stages == ["single"] and cfg.collective != "torch":
        raise ConfigError(
            "--collective has no effect with --stage single (one process sends nothing); "
            "drop it or pick a distributed stage"
        )


#: The slow-link options, their defaults (DiLoCo's), and which stages take them (docs/diloco.md).
SLOW_LINK_OPTIONS = {
    "sync_every": (10, ("local-sgd", "diloco")),
    "outer_lr": (0.7, ("diloco",)),
    "outer_momentum": (0.9, ("diloco",)),
    "fragments": (1, ("diloco",)),
    "fragment_delay": (0, ("diloco",)),
    "fragment_alpha": (0.0, ("diloco",)),
}
#: How :func:`minddp.diloco.fragments.check_schedule` names them on the command line.
SLOW_LINK_FLAGS = {
    "sync_every": "--sync-every",
    "fragments": "--fragments",
    "delay": "--fragment-delay",
    "alpha": "--fragment-alpha",
}


def check_slow_links(cfg: TrainConfig, stages: list[str]) -> None:
    """The slow-link options: given only to the stages that take them, a schedule that can run, a hook they send
    through; the defaults filled in for a run that trains one of them."""
    from minddp.diloco.fragments import check_schedule
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, SLOW_LINK_HOOKS

    for name, (default, takers) in SLOW_LINK_OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if getattr(cfg, name) is None:
            setattr(cfg, name, default if any(s in takers for s in stages) else None)
            continue
        if any(s in takers for s in stages):
            continue
        sharded = [s for s in stages if s in SHARDED_OPTIMIZER + SHARDED_GRADIENTS and cfg.stage != "all"]
        if sharded:
            raise ConfigError(
                f"{flag} with --stage {sharded[0]}: local SGD and DiLoCo keep the whole model on every replica and "
                f"sync it every H steps, {sharded[0]} shards it and syncs every step; they do not combine: "
                f"pick --stage {' or '.join(takers)}"
            )
        raise ConfigError(f"{flag} applies to --stage {' and '.join(takers)} only; add one of them or drop {flag}")
    if cfg.sync_every is None:  # no slow-link stage in this run
        return
    slow = [s for s in stages if s in SLOW_LINK_OPTIONS["sync_every"][1]]
    try:
        check_schedule(
            cfg.sync_every,
            cfg.fragments or 1,
            cfg.fragment_delay or 0,
            0.0 if cfg.fragment_alpha is None else cfg.fragment_alpha,
            names=SLOW_LINK_FLAGS,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.outer_momentum is not None and cfg.outer_momentum >= 1:
        raise ConfigError(
            f"--outer-momentum {cfg.outer_momentum:g} is not below 1: the outer step would never forget; give 0 "
            "to 0.99 (DiLoCo's is 0.9)"
        )
    if cfg.hook not in SLOW_LINK_HOOKS:
        raise ConfigError(
            f"--hook {cfg.hook} with --stage {slow[0]}: its messages go through {', '.join(SLOW_LINK_HOOKS)} only "
            "(PowerSGD's error feedback and warm start follow gradients step by step); pick one of those"
        )


def compile_unavailable(stage: str, bucket_cap_mb: float | str | None) -> str | None:
    """Why ``stage`` cannot train compiled (one line), or None if it can (docs/ddp.md, *Compiled*)."""
    if stage == "fsdp":
        return (
            "minddp's fsdp does not compile: it gathers each unit in module hooks and a saved-tensor hook, where "
            "Dynamo breaks the graph at every unit and recompiles every step (zero2 shards and compiles)"
        )
    if stage == "ft":
        return "ft does not compile: its ranks restart and rejoin mid-run, and each would compile again"
    if stage == "torch" and (bucket_cap_mb == "auto" or bucket_cap_mb < 1):
        return (
            f"torch's DDP does not compile with --bucket-cap-mb {bucket_cap_mb}: its DDPOptimizer refuses caps "
            "below 1 MiB ('First bucket should be smaller/equal to other buckets'; minddp's stages take any cap)"
        )
    return None
