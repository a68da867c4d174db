"""The CLI of :mod:`minddp.bench` (steps 1-3 of its module doc). Exit 2 with one line on bad input."""

from __future__ import annotations

import argparse
import os
import sys
import time

from minddp.bench.configs import SHARDED_BENCH, TORCH_SHARDED, VARIANTS, bench_configs
from minddp.bench.report import machine, markdown_table, pool, summarize, write_outputs
from minddp.bench.targets import check_targets, targets_markdown
from minddp.runtime.cli import Parser, UsageError, fail, number

PROG = "minddp.bench"
#: What a --quick run says instead of its targets' verdicts.
SMOKE = (
    "smoke run: targets not judged (--quick times 3 steps in 1 round: no interval, no verdict; "
    "drop --quick for the benchmark)"
)
#: ``--preset``: model and per-rank batch (examples x tokens) in one word.
PRESETS = {
    "tiny": {"model": "tiny-llama", "batch_size": 8, "max_seq_len": 64},
    "small": {"model": "small-llama", "batch_size": 16, "max_seq_len": 64},
    "medium": {"model": "medium-llama", "batch_size": 16, "max_seq_len": 64},
}


def _names(text: str, allowed: list[str], flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise UsageError(f"{flag}: unknown {unknown or 'empty list'}; choose a comma list of {', '.join(allowed)}")
    return names


EXAMPLES = [
    "python -m minddp.bench --quick                        # 1 launch, 1 round, 3 steps: a smoke run",
    "python -m minddp.bench --stage ddp,torch --variants noop --rounds 10",
    "python -m minddp.bench --preset small --stage bucket-async,ddp,torch --variants none",
    "python -m minddp.bench --preset small --stage sharded --variants noop   # the sharded rungs and their targets",
    "python -m minddp.bench --pool results/bench-A results/bench-B   # two saved runs judged as one",
    "python -m minddp.bench --compile --preset small --stage ddp,torch --variants noop --bucket-cap-mb 1",
    "python -m minddp.bench overhead      # host CPU per no_sync and sync micro-batch, ddp vs torch's DDP",
    "python -m minddp.bench collectives   # collective times over sizes and their alpha-beta fits",
]

#: Options the benchmark shares with the train command: the same flag, metavar, type and meaning.
SHARED = (
    "model",
    "dtype",
    "batch_size",
    "grad_accum",
    "max_seq_len",
    "bucket_cap_mb",
    "link",
    "world_size",
    "backend",
    "timeout",
    "hang_timeout",
    "compile",
    "compile_backend",
)


def _bench_stages() -> list[str]:
    """Every name --stage takes: minddp's stages, torch's DDP, torch's own sharding."""
    from minddp.ladder import STAGES

    return list(STAGES) + ["torch"] + list(TORCH_SHARDED)


def _ddp_ladder() -> list[str]:
    """``--stage all``: the DDP ladder and torch's DDP (the sharded rungs are ``--stage sharded``)."""
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, STAGES

    return [s for s in STAGES if s not in SHARDED_OPTIMIZER + SHARDED_GRADIENTS] + ["torch"]


def build_parser() -> argparse.ArgumentParser:
    from minddp.train.config import TrainConfig, field_option, stage_list

    p = Parser(
        prog="python -m minddp.bench",
        usage="python -m minddp.bench [--stage NAME[,...]] [--quick] [options]",
        examples=EXAMPLES,
        description="Benchmark every minddp stage against torch's DDP and the no-communication limit. Bad "
        "options exit with code 2 before any rank starts.",
    )
    what = p.add_argument_group("what to run")
    what.add_argument(
        "--stage",
        "--stages",
        dest="stages",
        metavar="NAME[,...]",
        default="all",
        type=stage_list(lambda: _bench_stages() + ["all", "sharded"]),
        help="stages to run, as in python -m minddp.train --stage: a comma list of "
        f"{', '.join(_bench_stages())} (torch = torch's DDP, the reference; torch-zero1, "
        "torch-fsdp = torch's ZeroRedundancyOptimizer and fully_shard), all (the DDP ladder "
        f"and torch), or sharded ({','.join(SHARDED_BENCH)})",
    )
    what.add_argument(
        "--variants",
        metavar="LIST",
        default=",".join(VARIANTS),
        help="comma list of extras: noop (every stage with noop_hook), powersgd (r1, r4), fp16, "
        "gabv (gradient_as_bucket_view), pyhook (torch averaging through its Python "
        "allreduce_hook); 'none' for none",
    )
    what.add_argument(
        "--preset",
        metavar="NAME",
        default=None,
        type=_choice(list(PRESETS)),
        help="model and batch in one word: tiny (the train command's default tiny-llama, 8 x 64 "
        "tokens per rank), small (small-llama, 5 M parameters, 16 x 64), medium (medium-llama, "
        "25 M, 16 x 64); --model/--batch-size/--max-seq-len override it",
    )
    long = p.add_argument_group("how long")
    long.add_argument(
        "--rounds",
        type=number(int, low=1),
        metavar="N",
        default=12,
        help="rounds in all; each runs every configuration in turn",
    )
    long.add_argument(
        "--launches",
        type=number(int, low=1),
        metavar="N",
        default=3,
        help="fresh launches of the ranks the rounds are shared out over (each launch is its own "
        "draw of cores, memory and threads; the intervals resample launches, then rounds)",
    )
    long.add_argument(
        "--steps-per-round",
        type=number(int, low=1),
        metavar="N",
        default=10,
        help="timed optimizer steps per configuration per round (train's --steps is the whole run of a stage)",
    )
    long.add_argument("--steps", dest="old_steps", default=None, help=argparse.SUPPRESS)
    long.add_argument(
        "--warmup", type=number(int, low=0), metavar="N", default=2, help="untimed steps before them, per round"
    )
    long.add_argument(
        "--profile-steps",
        type=number(int, low=0),
        metavar="N",
        default=2,
        help="profiled steps after one warm-up step, as in train, but for every configuration in "
        "every round, hence fewer than train's 5 (0 = none)",
    )
    long.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 launch, 1 round, 3 steps per round, 1 warm-up, 1 profiled step; it measures and "
        "prints, but judges no target and shows no interval (too few steps for either)",
    )
    shared = p.add_argument_group("model and ranks (as in python -m minddp.train)")
    defaults = TrainConfig()
    for name in SHARED:
        flag, kwargs = field_option(name)
        default = getattr(defaults, name)
        if name == "batch_size":  # train's help names --global-batch-size, which the benchmark has not
            kwargs["help"] = "examples per rank per micro-batch"
        note = {
            "model": f"{default}, or the --preset's",
            "batch_size": "8, or the --preset's",
            "max_seq_len": f"{default}, or the --preset's",
        }.get(name, default)
        if note is not None and "(default" not in kwargs["help"]:
            kwargs["help"] += f" (default: {note})"
        shared.add_argument(flag, **{**kwargs, "default": None})  # None: not given (a preset may fill it)
    out = p.add_argument_group("outputs")
    out.add_argument("--out", metavar="DIR", default=None, help="results folder (default: results/bench-<date-time>)")
    out.add_argument(
        "--pool",
        nargs="+",
        metavar="DIR",
        default=None,
        help="run nothing: judge the runs saved in these results folders as one run, their rounds "
        "put together (tighter intervals); writes to --out if given",
    )
    return p


def _choice(choices: list[str]):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {text!r}; choose from {', '.join(choices)}")
        return text

    parse.__name__ = "name"
    return parse


def parse(argv: list[str] | None):
    """The bench options, and the train command's config for model, data and settings."""
    from minddp.train.config import ConfigError, parse_args

    ns = build_parser().parse_args(argv)
    if ns.old_steps is not None:
        raise UsageError(
            "--steps is the train command's optimizer steps per stage; the benchmark's timed steps "
            f"are --steps-per-round (e.g. --steps-per-round {ns.old_steps})"
        )
    if ns.quick:
        ns.launches, ns.rounds, ns.steps_per_round, ns.warmup = 1, 1, 3, 1
        ns.profile_steps = min(ns.profile_steps, 1)
    if ns.launches > ns.rounds:
        raise UsageError(
            f"--launches ({ns.launches}) must not exceed --rounds ({ns.rounds}): every launch runs at least one round"
        )
    stages = (
        _ddp_ladder() if ns.stages == "all" else list(SHARDED_BENCH) if ns.stages == "sharded" else ns.stages.split(",")
    )
    variants = [] if ns.variants == "none" else _names(ns.variants, list(VARIANTS), "--variants")
    if ns.variants != ",".join(VARIANTS):  # named by the user (not the default): each must add a run
        plain = len(bench_configs(stages, []))
        idle = [v for v in variants if len(bench_configs(stages, [v])) == plain]
        if idle:
            wanted = "torch" if "pyhook" in idle else "ddp or torch"  # torch's DDP takes every variant
            raise UsageError(
                f"--variants {','.join(idle)} adds no configuration to --stage {ns.stages}; add {wanted} to --stage"
            )
    for flag, value in PRESETS.get(ns.preset, {}).items():
        if getattr(ns, flag) is None:
            setattr(ns, flag, value)
    train_args = ["--no-profile", "--no-progress"]
    for flag in SHARED:
        value = getattr(ns, flag)
        if isinstance(value, bool):  # --x / --no-x
            train_args.append(("--" if value else "--no-") + flag.replace("_", "-"))
        elif value is not None:
            train_args += ["--" + flag.replace("_", "-"), str(value)]
    try:
        cfg = parse_args(train_args)
    except ConfigError as exc:
        raise UsageError(str(exc).replace("minddp.train", PROG)) from None
    if cfg.compile:
        variants = check_compiled(stages, variants, cfg.bucket_cap_mb, named=ns.variants != ",".join(VARIANTS))
    if cfg.bucket_cap_mb == "auto":
        raise UsageError(
            "--bucket-cap-mb auto chooses a cap at the start of a training run (python -m minddp.train); "
            "the benchmark compares fixed caps: give a number of MiB"
        )
    import torch

    from minddp.runtime import compat

    if "torch-fsdp" in stages and not compat.TORCH_FULLY_SHARD_ON_CPU and not torch.cuda.is_available():
        raise UsageError(
            f"--stage torch-fsdp: torch {torch.__version__}'s fully_shard has no CPU path "
            "(torch.cpu.Stream.record_event); run it on a GPU or with torch 2.13 or later"
        )
    if cfg.link is not None and set(stages) & set(TORCH_SHARDED):
        raise UsageError(
            f"--link cannot reach {', '.join(s for s in stages if s in TORCH_SHARDED)} (torch's sharding "
            "calls its collectives itself, with no comm hook to carry them); drop it from --stage or "
            "drop --link"
        )
    return ns, cfg, bench_configs(stages, variants)


def check_compiled(stages: list[str], variants: list[str], bucket_cap_mb, named: bool) -> list[str]:
    """``--compile``: the variants to run (all compiled, with one cap: they share the compiled graph), or a refusal.

    Dynamo caches a compiled graph by the model's code, so the configurations of a run (one model class)
    all run the graph the first one compiled, cut at its cap: the same kernels for every one, and so the
    same cap for every one. PowerSGD's configurations have a cap of their own: left out of the default
    variants, refused when ``named``.
    """
    from minddp.train.config import compile_unavailable

    if "powersgd" in variants and not named:
        variants = [v for v in variants if v != "powersgd"]
    if "powersgd" in variants:
        raise UsageError(
            "--compile --variants powersgd: its configurations use their own 25 MiB cap, while every "
            "configuration of a run shares one compiled graph, cut at one cap; drop powersgd from --variants"
        )
    for stage in stages:
        if stage == "torch-fsdp":
            raise UsageError("--compile: torch's fully_shard is not benchmarked compiled; drop torch-fsdp from --stage")
        reason = compile_unavailable("torch" if stage == "torch-zero1" else stage, bucket_cap_mb)
        if reason is not None:
            fix = "give --bucket-cap-mb 1 or more" if stage.startswith("torch") else f"drop {stage} from --stage"
            raise UsageError(f"--compile: {reason}; {fix}, or drop --compile")
    return variants


def launch_shares(rounds: int, launches: int) -> list[int]:
    """``rounds`` shared out over ``launches`` as evenly as they go (10 over 3: 4, 3, 3)."""
    return [rounds // launches + (1 if i < rounds % launches else 0) for i in range(launches)]


def pool_main(folders: list[str], out: str | None) -> int:
    """``--pool``: the saved runs' rows, pooled (:func:`minddp.bench.report.pool`), tabled and judged."""
    import json

    runs, metas = [], []
    for folder in folders:
        path = os.path.join(folder, "results.json")
        try:
            with open(path) as f:
                saved = json.load(f)
            runs.append(saved["rows"])
            metas.append(saved["meta"])
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(
                f"--pool: cannot read {path} ({type(exc).__name__}: {exc}); give folders written by "
                "python -m minddp.bench"
            ) from None
    try:
        rows = pool(runs)
    except ValueError as exc:
        raise UsageError(f"--pool: {exc}") from None
    presets = {m.get("preset") for m in metas}
    if len(presets) > 1:
        raise UsageError(
            f"--pool: the runs used different presets ({sorted(map(str, presets))}); pool runs of one preset"
        )
    compiled = {bool(m.get("compile")) for m in metas}
    if len(compiled) > 1:
        raise UsageError("--pool: some runs were compiled (--compile) and some not; pool runs of one kind")
    targets = check_targets(rows, presets.pop(), compiled=compiled.pop())
    print(markdown_table(rows) + "\n\n" + targets_markdown(targets))
    if out:
        meta = {
            "pooled_from": ", ".join(folders),
            "rounds": rows[0]["rounds"],
            "launches": len(rows[0]["launch_rounds"]),
            "dates": ", ".join(m.get("date", "?") for m in metas),
            "machine": metas[0].get("machine", "?"),
        }
        paths = write_outputs(rows, out, meta, targets, targets_markdown(targets) if targets else "")
        print(f"{PROG}: wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["collectives"]:  # python -m minddp.bench collectives: its own benchmark
        from minddp.bench.collectives import main as collectives_main

        return collectives_main(args[1:])
    if args[:1] == ["overhead"]:  # python -m minddp.bench overhead: host CPU per micro-batch
        from minddp.bench.overhead import main as overhead_main

        return overhead_main(args[1:])
    from minddp.bench.worker import bench_rank
    from minddp.runtime.hang import DEFAULT_HANG_S
    from minddp.runtime.launch import RankError, launch
    from minddp.train.config import ConfigError
    from minddp.train.data import DataError
    from minddp.train.outputs import Outputs
    from minddp.train.run import prepare

    try:
        ns, cfg, configs = parse(argv)  # step 1
        if ns.pool:
            return pool_main(ns.pool, ns.out)
        out = ns.out or os.path.join("results", f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
        Outputs().folder("--out", out)  # the results folder can be written, before minutes of measuring
        data, placement, _ = prepare(cfg)
    except (UsageError, ConfigError, DataError) as exc:
        return fail(PROG, exc, build_parser())
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (Ctrl-C) before measuring; nothing was started", file=sys.stderr)
        return 130
    date = time.strftime("%Y-%m-%d %H:%M:%S")
    trace_dir = os.path.join(out, "traces") if ns.profile_steps else None
    shares = launch_shares(ns.rounds, ns.launches)
    print(
        f"{PROG}: {len(configs)} configurations x {ns.rounds} rounds ({' + '.join(map(str, shares))} in "
        f"{ns.launches} launch{'es' if ns.launches > 1 else ''}) x {ns.steps_per_round} steps on {cfg.world_size} "
        f"ranks ({placement.why}) -> {out}",
        file=sys.stderr,
        flush=True,
    )
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    per_launch = []
    for index, rounds in enumerate(shares):  # step 2
        try:
            per_rank = launch(
                bench_rank,
                configs,
                cfg,
                data,
                rounds,
                ns.steps_per_round,
                ns.warmup,
                trace_dir,
                ns.profile_steps,
                index,
                index == 0,  # memory once: it does not depend on timing
                world_size=cfg.world_size,
                backend=placement,
                timeout_s=cfg.timeout,
                hang_s=DEFAULT_HANG_S if cfg.hang_timeout is None else cfg.hang_timeout or None,
            )
        except RankError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # the launcher has said so in one line and ended the ranks
            return 130
        per_launch.append(summarize(configs, per_rank, rounds))  # step 3
    rows = pool(per_launch) if len(per_launch) > 1 else per_launch[0]
    meta = {
        "date": date,
        "command": "python -m minddp.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "model": cfg.model,
        "dtype": cfg.dtype,
        "data": data.source,
        "world_size": cfg.world_size,
        "backend": placement.backend,
        "devices": placement.why,
        "launches": ns.launches,
        "rounds": ns.rounds,
        "rounds_per_launch": shares,
        "steps_per_round": ns.steps_per_round,
        "warmup_per_round": ns.warmup,
        "profiled_steps": ns.profile_steps,
        "batch_size_per_rank": cfg.batch_size,
        "grad_accum": cfg.grad_accum,
        "max_seq_len": cfg.max_seq_len,
        "bucket_cap_mb": cfg.bucket_cap_mb,
        "link": cfg.link,
        "compile": cfg.compile_backend if cfg.compile else None,
        "load_avg_1min_before_after": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",
        "preset": ns.preset,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    if ns.quick:  # one round of 3 steps: enough to see it run, too few to judge a target or bound an interval
        meta["smoke_run"] = SMOKE
        for row in rows:
            row["ratio_lo"] = row["ratio_hi"] = None
    targets = [] if ns.quick else check_targets(rows, ns.preset, compiled=cfg.compile)
    paths = write_outputs(rows, out, meta, targets, targets_markdown(targets) if targets else "")
    print(markdown_table(rows))
    if targets:
        print("\n" + targets_markdown(targets))
    if ns.quick:
        print("\n" + SMOKE)
    print(f"{PROG}: wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
