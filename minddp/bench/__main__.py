"""The CLI of :mod:`minddp.bench` (steps 1-3 of its module doc). Exit 2 with one line on bad input."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from minddp.bench.configs import VARIANTS, bench_configs
from minddp.cli import Parser, UsageError
from minddp.bench.report import markdown_table, pool, summarize, write_outputs
from minddp.bench.targets import check_targets, targets_markdown

PROG = "minddp.bench"
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


def build_parser() -> argparse.ArgumentParser:
    from minddp.ladder import STAGES
    p = Parser(prog="python -m minddp.bench",
                description="Benchmark every minddp stage against torch's DDP and the no-communication limit.")
    p.add_argument("--stages", default=",".join(list(STAGES) + ["torch"]),
                   help="comma list of stages to run (torch = torch's DDP, the reference)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma list of extras: noop (every stage with noop_hook), powersgd (r1, r4), fp16, "
                        "gabv (gradient_as_bucket_view), pyhook (torch averaging through its Python allreduce_hook); "
                        "'none' for none")
    p.add_argument("--rounds", type=int, default=12, help="rounds in all; each runs every configuration in turn")
    p.add_argument("--launches", type=int, default=3,
                   help="fresh launches of the ranks the rounds are shared out over (each launch is its own "
                        "draw of cores, memory and threads; the intervals resample launches, then rounds)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them, per round")
    p.add_argument("--profile-steps", type=int, default=2, help="profiled steps per configuration (0: none)")
    p.add_argument("--quick", action="store_true", help="1 launch, 1 round, 3 steps, 1 warm-up, 1 profiled step")
    p.add_argument("--out", default=None, help="results folder (default: results/bench-<date-time>)")
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="model and batch in one word: tiny (the train command's default tiny-llama, 8 x 64 tokens "
                        "per rank), small (small-llama, 5 M parameters, 16 x 64), medium (medium-llama, 25 M, "
                        "16 x 64); --model/--batch-size/--max-seq-len override it")
    p.add_argument("--model", default=None, help="as python -m minddp.train --model (default: its default)")
    p.add_argument("--world-size", type=int, default=2, help="ranks, started by minddp's launcher")
    p.add_argument("--backend", default="auto", help="auto (NCCL when every rank has a GPU, else gloo), gloo or nccl")
    for flag in ("--batch-size", "--grad-accum", "--max-seq-len"):
        p.add_argument(flag, type=int, default=None, help="as in python -m minddp.train (default: its default)")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="as in python -m minddp.train (default: its default, 0.1)")
    p.add_argument("--timeout", type=float, default=None, help="seconds a collective may wait (default: the train command's)")
    p.add_argument("--pool", nargs="+", metavar="RESULTS_DIR", default=None,
                   help="run nothing: judge the runs saved in these results folders as one run, their rounds "
                        "put together (tighter intervals); writes to --out if given")
    return p


def parse(argv: list[str] | None):
    """The bench options, and the train command's config for model, data and settings."""
    from minddp.config import ConfigError, parse_args
    from minddp.ladder import STAGES
    ns = build_parser().parse_args(argv)
    if ns.quick:
        ns.launches, ns.rounds, ns.steps, ns.warmup, ns.profile_steps = 1, 1, 3, 1, min(ns.profile_steps, 1)
    for name in ("rounds", "steps", "launches"):
        if getattr(ns, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(ns, name)}")
    if ns.launches > ns.rounds:
        raise UsageError(f"--launches ({ns.launches}) must not exceed --rounds ({ns.rounds}): "
                         "every launch runs at least one round")
    if ns.warmup < 0 or ns.profile_steps < 0:
        raise UsageError("--warmup and --profile-steps must be 0 or more")
    stages = _names(ns.stages, list(STAGES) + ["torch"], "--stages")
    variants = [] if ns.variants == "none" else _names(ns.variants, list(VARIANTS), "--variants")
    if ns.variants != ",".join(VARIANTS):     # named by the user (not the default): each must add a run
        plain = len(bench_configs(stages, []))
        idle = [v for v in variants if len(bench_configs(stages, [v])) == plain]
        if idle:
            wanted = "torch" if "pyhook" in idle else "ddp or torch"     # torch's DDP takes every variant
            raise UsageError(f"--variants {','.join(idle)} adds no configuration to --stages {ns.stages}; "
                             f"add {wanted} to --stages")
    for flag, value in PRESETS.get(ns.preset, {}).items():
        if getattr(ns, flag) is None:
            setattr(ns, flag, value)
    train_args = ["--world-size", str(ns.world_size), "--backend", ns.backend, "--no-profile", "--no-progress"]
    for flag in ("model", "batch_size", "grad_accum", "max_seq_len", "bucket_cap_mb", "timeout"):
        if getattr(ns, flag) is not None:
            train_args += ["--" + flag.replace("_", "-"), str(getattr(ns, flag))]
    try:
        cfg = parse_args(train_args)
    except ConfigError as exc:
        raise UsageError(str(exc).replace("minddp.train", PROG)) from None
    return ns, cfg, bench_configs(stages, variants)


def launch_shares(rounds: int, launches: int) -> list[int]:
    """``rounds`` shared out over ``launches`` as evenly as they go (10 over 3: 4, 3, 3)."""
    return [rounds // launches + (1 if i < rounds % launches else 0) for i in range(launches)]


def machine() -> str:
    import torch
    cpu = platform.processor() or platform.machine()
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}){gpu}; torch {torch.__version__}"


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
            print(f"{PROG}: error: --pool: cannot read {path} ({type(exc).__name__}: {exc}); "
                  "give folders written by python -m minddp.bench", file=sys.stderr)
            return 2
    try:
        rows = pool(runs)
    except ValueError as exc:
        print(f"{PROG}: error: --pool: {exc}", file=sys.stderr)
        return 2
    presets = {m.get("preset") for m in metas}
    if len(presets) > 1:
        print(f"{PROG}: error: --pool: the runs used different presets ({sorted(map(str, presets))}); pool runs "
              "of one preset", file=sys.stderr)
        return 2
    targets = check_targets(rows, presets.pop())
    print(markdown_table(rows) + "\n\n" + targets_markdown(targets))
    if out:
        meta = {"pooled_from": ", ".join(folders), "rounds": rows[0]["rounds"],
                "launches": len(rows[0]["launch_rounds"]),
                "dates": ", ".join(m.get("date", "?") for m in metas), "machine": metas[0].get("machine", "?")}
        paths = write_outputs(rows, out, meta, targets, targets_markdown(targets) if targets else "")
        print(f"{PROG}: wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from minddp.bench.worker import bench_rank
    from minddp.config import ConfigError
    from minddp.data import DataError
    from minddp.launch import RankError, launch
    from minddp.train import prepare
    try:
        ns, cfg, configs = parse(argv)                                                     # step 1
        if ns.pool:
            return pool_main(ns.pool, ns.out)
        data, backend, _ = prepare(cfg)
    except (UsageError, ConfigError, DataError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    date = time.strftime("%Y-%m-%d %H:%M:%S")
    out = ns.out or os.path.join("results", f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    trace_dir = os.path.join(out, "traces") if ns.profile_steps else None
    shares = launch_shares(ns.rounds, ns.launches)
    print(f"{PROG}: {len(configs)} configurations x {ns.rounds} rounds ({' + '.join(map(str, shares))} in "
          f"{ns.launches} launch{'es' if ns.launches > 1 else ''}) x {ns.steps} steps on {cfg.world_size} "
          f"ranks ({backend}) -> {out}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    per_launch = []
    for index, rounds in enumerate(shares):                                                 # step 2
        try:
            per_rank = launch(bench_rank, configs, cfg, data, rounds, ns.steps, ns.warmup, trace_dir,
                              ns.profile_steps, index, index == 0,     # memory once: it does not depend on timing
                              world_size=cfg.world_size, backend=backend, timeout_s=cfg.timeout)
        except RankError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        per_launch.append(summarize(configs, per_rank, rounds))                             # step 3
    rows = pool(per_launch) if len(per_launch) > 1 else per_launch[0]
    meta = {"date": date, "command": "python -m minddp.bench " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine(), "model": cfg.model, "data": data.source, "world_size": cfg.world_size,
            "backend": backend, "launches": ns.launches, "rounds": ns.rounds, "rounds_per_launch": shares,
            "steps_per_round": ns.steps, "warmup_per_round": ns.warmup,
            "profiled_steps": ns.profile_steps, "batch_size_per_rank": cfg.batch_size, "grad_accum": cfg.grad_accum,
            "max_seq_len": cfg.max_seq_len, "bucket_cap_mb": cfg.bucket_cap_mb,
            "load_avg_1min_before_after": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",
            "preset": ns.preset, "wall_s": round(time.perf_counter() - start, 1)}
    targets = check_targets(rows, ns.preset)
    paths = write_outputs(rows, out, meta, targets, targets_markdown(targets) if targets else "")
    print(markdown_table(rows))
    if targets:
        print("\n" + targets_markdown(targets))
    print(f"{PROG}: wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
