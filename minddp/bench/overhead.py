"""``python -m minddp.bench overhead``: the host (Python) cost of a DDP wrapper per micro-batch, ours against torch's.

A benchmark, not a test. On a GPU that launches kernels faster than Python can issue them, every
microsecond a wrapper spends per parameter lands on the step; on a CPU that cost can be measured on
its own, as the training thread's CPU time (``time.thread_time``, not its waits) per micro-batch:

1. **model**: ``--blocks`` blocks of ``Linear(w, w)`` + ``LayerNorm(w)``, many tiny parameters;
2. **configurations**: no wrapper, torch's DDP, and each minddp stage in ``--stage`` (default ``ddp``);
3. **steps**: ``--accum`` micro-batches, all but the last under ``no_sync()``, the configurations
   taking turns step by step, each micro-batch timed apart;
4. **report** (:func:`summarize`): each wrapper's overhead over no wrapper and over torch's DDP, per
   micro-batch and per parameter, into ``overhead.md`` and ``overhead.csv`` under ``--out``.

``docs/benchmarks.md`` (*Host CPU per micro-batch*) says how a run goes and what it found.

Example::

    $ python -m minddp.bench overhead                       # 1000 parameters, 1 and 2 ranks, ~4 minutes
    $ python -m minddp.bench overhead --blocks 100 --world-size 2 --stage ddp,bucket-async
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from minddp.runtime.cli import Parser, UsageError, described, fail, number

PROG = "minddp.bench overhead"


def build_model(blocks: int, width: int, seed: int = 0) -> nn.Module:
    """Step 1: many small parameters, little compute."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width)]
    return nn.Sequential(*layers)


def _wrap(name: str, model: nn.Module) -> nn.Module:
    if name == "none":
        return model
    if name == "torch":
        return nn.parallel.DistributedDataParallel(model)
    from minddp.ladder import build_stage

    return build_stage(name, model)


def _stages() -> list[str]:
    """The DDP ladder's stages that accumulate under ``no_sync()`` (``simple`` has none; the sharded rungs
    shard their parameters, another cost)."""
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, STAGES

    return [
        n for n, cls in STAGES.items() if hasattr(cls, "no_sync") and n not in SHARDED_GRADIENTS + SHARDED_OPTIMIZER
    ]


def measure_rank(names: list[str], blocks: int, width: int, accum: int, steps: int, warmup: int) -> dict:
    """Steps 2-3 on this rank: ``{name: {"no_sync": [s, ...], "sync": [s, ...]}}`` of thread CPU seconds."""
    from minddp.runtime.device import current_device, synchronize

    device = current_device()
    rank = dist.get_rank()
    # One intra-op thread: these ops are too small to split, and a thread pool's spinning at its barriers
    # would count as this thread's CPU time (with 1 rank the launcher leaves torch all the cores).
    torch.set_num_threads(1)
    models = {n: _wrap(n, build_model(blocks, width).to(device)) for n in names}
    x = torch.randn(1, width, device=device)
    out = {n: {"no_sync": [], "sync": []} for n in names}
    for step in range(warmup + steps):
        for name in random.Random(f"overhead/{step}").sample(names, len(names)):  # same order on every rank
            model = models[name]
            dist.barrier()
            for m in range(accum):
                sync = m == accum - 1
                quiet = contextlib.nullcontext() if sync or name == "none" else model.no_sync()
                start = time.thread_time()
                with quiet:
                    model(x).sum().backward()
                    finish = getattr(model, "finish_gradient_synchronization", None)  # the teaching stages'
                    if finish is not None:
                        finish()
                seconds = time.thread_time() - start
                if step >= warmup:
                    out[name]["sync" if sync else "no_sync"].append(seconds)
            synchronize(device)
            for p in model.parameters():
                p.grad = None
    out["_rank"] = rank
    return out


def summarize(per_rank: list[dict], names: list[str], n_params: int) -> list[dict]:
    """Step 4: one row per (configuration, kind of micro-batch).

    A difference between two configurations is taken micro-batch by
    micro-batch (they ran within milliseconds of each other, in the same
    step), and its median over steps and ranks is reported with the usual
    95 % interval of a median, ``± 1.58 · IQR / √n``: the machine's drift,
    which moves both alike, cancels out of each pair.
    """
    rows = []
    for kind in ("no_sync", "sync"):
        for n in names:
            row = {
                "config": n,
                "micro_batch": kind,
                "cpu_us": round(statistics.median(t for r in per_rank for t in r[n][kind]) * 1e6, 1),
            }
            for base in ("none", "torch"):
                diff, half = _paired(per_rank, n, base, kind) if base in names else (None, None)
                row[f"over_{'no_wrapper' if base == 'none' else base}_us"] = diff
                row[f"over_{'no_wrapper' if base == 'none' else base}_pm_us"] = half
            row["over_torch_ns_per_param"] = (
                None if row["over_torch_us"] is None else round(row["over_torch_us"] * 1e3 / n_params)
            )
            rows.append(row)
    return rows


def _paired(per_rank: list[dict], name: str, base: str, kind: str) -> tuple[float, float]:
    """Median over steps and ranks of ``name``'s micro-batch minus ``base``'s in the same step, and its ± (µs)."""
    diffs = [a - b for r in per_rank for a, b in zip(r[name][kind], r[base][kind])]
    if len(diffs) < 2:
        return round(diffs[0] * 1e6, 1), 0.0
    q = statistics.quantiles(diffs, n=4)
    return round(statistics.median(diffs) * 1e6, 1), round(1.58 * (q[2] - q[0]) / len(diffs) ** 0.5 * 1e6, 1)


def markdown(tables: dict[int, list[dict]], meta: dict) -> str:
    lines = [
        f"# Host CPU per micro-batch: DDP wrappers ({meta['params']} parameters)",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        "Training-thread CPU time per micro-batch (median over steps and ranks). 'over X': this "
        "configuration's micro-batch minus X's in the same step, median over steps and ranks, ± its 95 % "
        "interval.",
        "",
    ]
    for world, rows in tables.items():
        lines += [
            f"## {world} rank{'s' if world > 1 else ''}",
            "",
            "| configuration | micro-batch | CPU µs | over no wrapper µs | over torch's DDP µs | over torch ns/param |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['config']} | {r['micro_batch']} | {r['cpu_us']:.0f} | "
                f"{_num(r['over_no_wrapper_us'], r['over_no_wrapper_pm_us'])} | "
                f"{_num(r['over_torch_us'], r['over_torch_pm_us'])} | {_num(r['over_torch_ns_per_param'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def _num(value, pm=None) -> str:
    if value is None:
        return "-"
    return f"{value:+.0f}" if pm is None else f"{value:+.0f} ± {pm:.0f}"


def main(argv: list[str] | None = None) -> int:
    from minddp.bench.collectives import save_table
    from minddp.bench.report import machine
    from minddp.runtime.launch import RankError, launch

    p = Parser(
        prog="python -m minddp.bench overhead",
        description=described(__doc__),
        usage="python -m minddp.bench overhead [--stage NAME[,...]] [--blocks N] [--world-size N[,...]] [options]",
    )
    p.add_argument(
        "--stage",
        "--stages",
        dest="stages",
        default="ddp",
        help="comma list of minddp stages to compare with torch's DDP and no wrapper (default: ddp)",
    )
    p.add_argument("--blocks", type=number(int, low=1), default=250, help="Linear+LayerNorm blocks (4 parameters each)")
    p.add_argument("--width", type=number(int, low=1), default=8, help="features per layer (small: compute stays tiny)")
    p.add_argument(
        "--accum", type=number(int, low=2), default=3, help="micro-batches per step, all but the last under no_sync"
    )
    p.add_argument("--steps", type=number(int, low=1), default=150, help="timed steps per configuration")
    p.add_argument("--warmup", type=number(int, low=0), default=5, help="untimed steps first")
    p.add_argument("--world-size", default="1,2", help="comma list of world sizes, one launch each")
    p.add_argument("--backend", default="auto", help="as in python -m minddp.train (auto: gloo on a CPU)")
    p.add_argument("--out", default=None, help="results folder (default: results/overhead-<date-time>)")
    try:
        ns = p.parse_args(argv)
        stages = [s for s in ns.stages.split(",") if s]
        unknown = [s for s in stages if s not in _stages()]
        if unknown or not stages:
            raise UsageError(f"--stage: unknown {unknown or 'empty list'}; choose from {', '.join(_stages())}")
        worlds = [int(w) for w in ns.world_size.split(",") if w.strip().isdigit() and int(w) >= 1]
        if len(worlds) != len(ns.world_size.split(",")):
            raise UsageError(f"--world-size: {ns.world_size!r} is not a comma list of whole numbers >= 1")
    except UsageError as exc:
        return fail(PROG, exc, p)
    names = ["none", "torch", *stages]
    n_params = len(list(build_model(ns.blocks, ns.width).parameters()))
    out = ns.out or os.path.join("results", f"overhead-{time.strftime('%Y%m%d-%H%M%S')}")
    load, start = os.getloadavg()[0], time.perf_counter()
    tables = {}
    for world in worlds:
        try:
            per_rank = launch(
                measure_rank,
                names,
                ns.blocks,
                ns.width,
                ns.accum,
                ns.steps,
                ns.warmup,
                world_size=world,
                backend=ns.backend,
                timeout_s=600,
            )
        except RankError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        tables[world] = summarize(per_rank, names, n_params)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "command": "python -m minddp.bench overhead " + " ".join(sys.argv[2:] if argv is None else argv),
        "params": n_params,
        "model": f"{ns.blocks} x (Linear({ns.width}, {ns.width}) + LayerNorm({ns.width})), 1 row",
        "micro_batches_per_step": ns.accum,
        "steps": ns.steps,
        "load_1min_before_after": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
        "wall_s": round(time.perf_counter() - start, 1),
    }
    text = markdown(tables, meta)
    save_table(out, "overhead", [{"world_size": w, **r} for w, rows in tables.items() for r in rows], text)
    print(text)
    print(f"{PROG}: wrote {out}/overhead.md, .csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
