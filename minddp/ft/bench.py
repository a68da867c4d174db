"""``python -m minddp.ft.bench``: recovery over many injected faults; fault tolerance vs checkpoint-restart.

One run of the toy task (:class:`~minddp.ft.task.ToyTask`) on ``--world-size``
slots with a fault every ``--every`` steps, cycling through ``kill``,
``raise``, ``stop`` and ``coord`` (each fault's step first waits for the
whole world, so every fault meets a full world); one fault-free run of the
same steps for the throughput baseline. It prints, as Markdown:

1. per fault kind: count, median and worst time from the fault to the next
   committed step, attempts discarded, and time until the lost rank was back
   (healed);
2. throughput: committed steps per second with and without faults;
3. heal memory: bytes of the serialized state one heal sends (parameters +
   AdamW's two moments + step) for the toy model and for the train command's
   offline model;
4. a projection: the fraction of a large run's time lost to failures, with
   checkpoint-restart (lost work since the last checkpoint + a restart) and
   with fault tolerance (the measured recovery), for a failure rate per
   GPU-hour given as a parameter.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch

from minddp.ft.faults import Fault
from minddp.ft.launch import launch_ft
from minddp.ft.task import ToyTask
from minddp.runtime.cli import described

KINDS = ("kill", "raise", "stop", "kill", "raise", "coord")


def fault_script(n: int, every: int, world: int) -> list[Fault]:
    faults = []
    for i in range(n):
        kind, step = KINDS[i % len(KINDS)], every * (i + 1)
        faults.append(Fault(kind, step) if kind == "coord" else Fault(kind, step, (i % (world - 1)) + 1))
    return faults


def measure(n: int, every: int, world: int, hang_s: float, compute_s: float) -> dict:
    faults = fault_script(n, every, world)
    steps = every * (n + 1) + 1
    task = ToyTask(compute_s=compute_s)
    t = time.perf_counter()
    clean = launch_ft(task, steps, world_size=world, hang_s=hang_s, run_timeout_s=1800)
    clean_s = time.perf_counter() - t
    run = launch_ft(
        task,
        steps,
        world_size=world,
        faults=faults,
        hang_s=hang_s,
        run_timeout_s=3600,
        full_world_at=tuple(f.step for f in faults),
        rejoin_before_end=True,
    )
    return {"faults": faults, "run": run, "clean": clean, "clean_s": clean_s, "steps": steps}


def recoveries(run) -> list[dict]:
    """Per fault: seconds to the next commit, attempts discarded, seconds until the lost rank was healed."""
    decisions = [e for e in run.events if e[0] == "decision"]
    quorums = [e for e in run.events if e[0] == "quorum"]
    out = []
    for fault, t in zip(run.faults, run.fired_at):
        if t is None:
            continue
        commit = next((d for d in decisions if d[5] >= t and d[3] == "commit"), None)
        lost = sum(1 for d in decisions if d[5] >= t and d[3] == "discard" and (commit is None or d[5] <= commit[5]))
        back = None
        if fault.kind in ("kill", "stop"):
            rejoin = next(
                (q for q in quorums if q[4] > t and fault.slot in q[2] and q[3][fault.slot] < max(q[3].values())),
                None,
            )
            back = None if rejoin is None else rejoin[4] - t
        out.append(
            {
                "kind": fault.kind,
                "went_on_s": None if commit is None else commit[5] - t,
                "lost": lost,
                "back_s": back,
            }
        )
    return out


def first_commit_s(run) -> float:
    """Cold start: from the coordinator listening to the first committed step (what a restart costs here)."""
    start = next(e[3] for e in run.events if e[0] == "listening")
    first = next(e[5] for e in run.events if e[0] == "decision" and e[3] == "commit")
    return first - start


def heal_bytes() -> dict[str, int]:
    """Bytes one heal sends: the serialized (model, AdamW state, step), after a step (the moments exist)."""
    from minddp.train.models import OFFLINE_MODEL, build_model

    sizes = {}
    for name, model in (
        ("toy MLP", ToyTask().build_model()),
        (OFFLINE_MODEL, build_model(OFFLINE_MODEL, 1000, 0, 0, "fp32")),
    ):
        optimizer = torch.optim.AdamW(model.parameters())
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}, buf)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        sizes[name] = (len(buf.getvalue()), params)
    return sizes


def projection(
    recovery_s: float,
    rejoin_s: float,
    restart_s: float,
    step_s: float,
    rate: float,
    interval_min: float,
    gpus: list[int],
) -> list[str]:
    """Fraction of wall time lost to failures, per world size (failures ~ rate * gpus per hour).

    checkpoint-restart loses, per failure, the work since the last checkpoint
    (half the interval on average) plus a restart (``restart_s``); fault
    tolerance loses the recovery (``recovery_s``: the step discarded and the
    group rebuilt, all ranks idle) plus one rank's share of the time until the
    replacement is back (``rejoin_s / gpus``: the others keep training).
    """
    rows = [
        "| GPUs | failures / h | checkpoint-restart: time lost | fault-tolerant: time lost | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in gpus:
        per_hour = rate * n
        cr = per_hour * (interval_min * 60 / 2 + restart_s) / 3600
        ft = per_hour * (recovery_s + rejoin_s / n) / 3600
        rows.append(
            f"| {n} | {per_hour:.3g} | {min(cr, 1):.2%} | {min(ft, 1):.2%} | {cr / ft if ft else float('inf'):.0f}x |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minddp.ft.bench", description=described(__doc__))
    p.add_argument("--faults", type=int, default=24, help="faults to inject (cycling kill, raise, stop, coord)")
    p.add_argument("--every", type=int, default=4, help="steps between two faults")
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--hang-timeout", type=float, default=2.0, help="the hang bound (a frozen rank's eviction)")
    p.add_argument("--compute-s", type=float, default=0.01, help="pause per step standing in for compute")
    p.add_argument(
        "--rate",
        type=float,
        default=2e-5,
        help="failures per GPU-hour for the projection (2e-5: Llama 3's 419 interruptions in 54 days on 16384 GPUs)",
    )
    p.add_argument("--checkpoint-minutes", type=float, default=30.0, help="checkpoint interval for the projection")
    args = p.parse_args(argv)
    m = measure(args.faults, args.every, args.world_size, args.hang_timeout, args.compute_s)
    run, rec = m["run"], recoveries(m["run"])
    print(
        f"## Recovery over {len(rec)} injected faults ({args.world_size} ranks, toy task, hang bound "
        f"{args.hang_timeout:g} s)\n"
    )
    print("| fault | n | to next commit: median | worst | attempts discarded | lost rank back (healed): median |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("kill", "raise", "stop", "coord", "all"):
        rows = [r for r in rec if kind in (r["kind"], "all") and r["went_on_s"] is not None]
        if not rows:
            continue
        went = [r["went_on_s"] for r in rows]
        back = [r["back_s"] for r in rows if r["back_s"] is not None]
        print(
            f"| {kind} | {len(rows)} | {statistics.median(went):.2f} s | {max(went):.2f} s | "
            f"{sum(r['lost'] for r in rows)} | {f'{statistics.median(back):.2f} s' if back else '-'} |"
        )
    ft_s = run.wall_s
    clean_step = m["clean_s"] / m["steps"]
    print(
        f"\nThroughput over {m['steps']} committed steps: fault-free {m['steps'] / m['clean_s']:.2f} steps/s "
        f"({m['clean_s']:.1f} s); with {len(rec)} faults {m['steps'] / ft_s:.2f} steps/s ({ft_s:.1f} s, each "
        f"fault's step waiting for the whole world first): {(ft_s - m['clean_s']) / len(rec):.2f} s lost per fault."
    )
    restart = first_commit_s(m["clean"])
    print(f"Cold start (coordinator up to first committed step, {args.world_size} ranks): {restart:.2f} s.\n")
    print("## Heal memory (bytes one heal sends = one extra serialized copy on sender and receiver)\n")
    print("| model | parameter bytes | heal payload |")
    print("|---|---:|---:|")
    for name, (payload, params) in heal_bytes().items():
        print(f"| {name} | {params:,} | {payload:,} ({payload / params:.2f}x) |")
    all_went = [r["went_on_s"] for r in rec if r["went_on_s"] is not None]
    backs = [r["back_s"] for r in rec if r["back_s"] is not None]
    print(
        f"\n## Projection: failure rate {args.rate:g} per GPU-hour, "
        f"checkpoint every {args.checkpoint_minutes:g} "
        f"min, restart {restart:.1f} s, recovery {statistics.median(all_went):.2f} s, rejoin "
        f"{statistics.median(backs) if backs else 0:.1f} s (as measured here)\n"
    )
    print(
        "\n".join(
            projection(
                statistics.median(all_went),
                statistics.median(backs) if backs else 0.0,
                restart,
                clean_step,
                args.rate,
                args.checkpoint_minutes,
                [8, 512, 4096, 16384, 100_000],
            )
        )
    )
    for line in run.report():
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
