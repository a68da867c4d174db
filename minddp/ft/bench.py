"""``python -m minddp.ft.bench``: recovery over many injected faults; fault tolerance vs checkpoint-restart.

One run of the toy task (:class:`~minddp.ft.task.ToyTask`) on ``--world-size``
slots with a fault every ``--every`` steps, cycling through ``kill``,
``raise``, ``stop`` and ``coord`` (each fault's step first waits for the
whole world, so every fault meets a full world); one fault-free run of the
same steps for the throughput baseline. It prints, as Markdown:

1. per fault kind: count; the median time from the fault to the first discard
   and to the first new quorum; the recovery (from the fault to the first commit
   of its step or a later one: median, mean, worst); attempts discarded; the
   rejoin (until the lost slot's new process was healed: median, mean), each as
   :mod:`minddp.ft.report` defines it;
2. throughput: committed steps per second with and without faults;
3. heal memory: bytes of the serialized state one heal sends (parameters +
   AdamW's two moments + step) for the toy model and for the train command's
   offline model;
4. a projection: the fraction of a large run's time lost to failures, with
   checkpoint-restart (lost work since the last checkpoint + a restart) and
   with fault tolerance (the mean recovery and rejoin measured here), for a
   failure rate per GPU-hour given as a parameter, and the break-even recovery.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch

from minddp.ft.faults import Fault
from minddp.ft.launch import launch_ft
from minddp.ft.report import cold_start_s, fault_outcomes
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


#: Failures per GPU-hour in the pre-training of Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs
#: (*The Llama 3 Herd of Models*, arXiv:2407.21783, section 3.3.4), one every 3.1 hours on all of them.
LLAMA3_RATE = 419 / (54 * 24 * 16384)


def projection(
    recovery_s: float,
    rejoin_s: float,
    restart_s: float,
    rate: float,
    interval_min: float,
    gpus: list[int],
) -> list[str]:
    """Fraction of wall time lost to failures, per world size (failures ~ rate * gpus per hour).

    checkpoint-restart loses, per failure, the work since the last checkpoint
    (half the interval on average) plus a restart (``restart_s``); fault
    tolerance loses the recovery (``recovery_s``, the mean: every rank waits
    through it, the step trained again included) plus one rank's share of the
    time until the replacement is back (``rejoin_s / gpus``, the mean: the
    others keep training). Both inputs are this machine's; see :func:`main`'s
    break-even line for how far a recovery at scale may grow.
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
            f"| {n} | {per_hour:.3g} | {100 * min(cr, 1):.3g}% | {100 * min(ft, 1):.3g}% "
            f"| {cr / ft if ft else float('inf'):.0f}x |"
        )
    return rows


def seconds(values: list) -> str:
    """``median`` of the values that exist, as a table cell."""
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.2f} s" if values else "-"


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
        default=LLAMA3_RATE,
        help=f"failures per GPU-hour for the projection (default {LLAMA3_RATE:.3g}: Llama 3's 419 interruptions in 54 "
        "days on 16384 GPUs)",
    )
    p.add_argument("--checkpoint-minutes", type=float, default=30.0, help="checkpoint interval for the projection")
    args = p.parse_args(argv)
    m = measure(args.faults, args.every, args.world_size, args.hang_timeout, args.compute_s)
    run = m["run"]
    outcomes = [o for o in fault_outcomes(run) if o.recovery_s is not None]
    print(
        f"## Recovery over {len(outcomes)} injected faults ({args.world_size} ranks, toy task, hang bound "
        f"{args.hang_timeout:g} s)\n"
    )
    print(
        "Seconds from the fault to: the first discard (`discard`), the first new quorum (`quorum`), the first "
        "commit of its step or a later one (`recovery`), the lost slot's new process healed (`rejoin`).\n"
    )
    print(
        "| fault | count | discard: median | quorum: median | recovery: median | mean | worst "
        "| attempts discarded | rejoin: median | mean |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in ("kill", "raise", "stop", "coord", "all"):
        rows = [o for o in outcomes if kind in (o.fault.kind, "all")]
        if not rows:
            continue
        went = [o.recovery_s for o in rows]
        back = [o.rejoin_s for o in rows if o.rejoin_s is not None]
        print(
            f"| {kind} | {len(rows)} | {seconds([o.discard_s for o in rows])} | {seconds([o.quorum_s for o in rows])} "
            f"| {statistics.median(went):.2f} s | {statistics.fmean(went):.2f} s | {max(went):.2f} s "
            f"| {sum(o.discarded for o in rows)} | {seconds(back)} "
            f"| {f'{statistics.fmean(back):.2f} s' if back else '-'} |"
        )
    ft_s = run.wall_s
    print(
        f"\nThroughput over {m['steps']} committed steps: fault-free {m['steps'] / m['clean_s']:.2f} steps/s "
        f"({m['clean_s']:.1f} s); with {len(outcomes)} faults {m['steps'] / ft_s:.2f} steps/s ({ft_s:.1f} s, each "
        f"fault's step waiting for the whole world first): {(ft_s - m['clean_s']) / len(outcomes):.2f} s of wall "
        "time added per fault."
    )
    restart = cold_start_s(m["clean"])
    print(f"Cold start (coordinator up to first committed step, {args.world_size} ranks): {restart:.2f} s.\n")
    print("## Heal memory (bytes one heal sends = one extra serialized copy on sender and receiver)\n")
    print("| model | parameter bytes | heal payload |")
    print("|---|---:|---:|")
    for name, (payload, params) in heal_bytes().items():
        print(f"| {name} | {params:,} | {payload:,} ({payload / params:.2f}x) |")
    recovery = statistics.fmean(o.recovery_s for o in outcomes)
    backs = [o.rejoin_s for o in outcomes if o.rejoin_s is not None]
    rejoin = statistics.fmean(backs) if backs else 0.0
    print(
        f"\n## Projection: failure rate {args.rate:g} per GPU-hour, checkpoint every {args.checkpoint_minutes:g} "
        f"min, restart {restart:.1f} s (the cold start), recovery {recovery:.2f} s and rejoin {rejoin:.2f} s (the "
        "means above); time lost as a fraction of wall time\n"
    )
    gpus = [8, 512, 4096, 16384, 100_000]
    print("\n".join(projection(recovery, rejoin, restart, args.rate, args.checkpoint_minutes, gpus)))
    even = args.checkpoint_minutes * 60 / 2 + restart - rejoin / gpus[0]
    print(
        f"\nBreak-even: at every size above, fault tolerance loses less than checkpoint-restart while its recovery "
        f"takes under {even:.0f} s per failure (half the checkpoint interval plus a restart, less one rank's share of "
        f"the rejoin at {gpus[0]} GPUs), against the {recovery:.2f} s mean measured here.\n"
    )
    for line in run.report():
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
