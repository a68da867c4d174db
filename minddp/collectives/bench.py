"""Bandwidth of the hand-written all_reduces against the backend's own, over message sizes.

Not a test (timings on a shared machine are noise for assertions), a tool::

    python -m minddp.collectives.bench                       # 2 ranks, 4 KiB .. 16 MiB
    python -m minddp.collectives.bench --world-size 4 --max-mib 64 --out traces/allreduce_bw.csv

For each size and transport: the median of ``--iters`` timed calls (after
warm-up), and two bandwidths (as nccl-tests reports them):

* ``algbw`` = bytes / time: how fast a tensor of that size gets reduced;
* ``busbw`` = algbw · 2 (n - 1) / n: the bytes each rank actually moves per
  second under the ring's cost model, comparable across world sizes and to
  the link's speed.

Expect the ring to lose to gloo on small messages (``2 (n - 1)`` Python-level
message round trips) and to come closer as messages grow; ``naive`` falls
behind as ``n`` grows, because rank 0 carries ``n`` times the ring's bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from minddp.collectives import TRANSPORTS
from minddp.device import current_device, synchronize
from minddp.launch import launch


def _torch_all_reduce(tensor: torch.Tensor, group) -> None:
    dist.all_reduce(tensor, group=group)


def measure(sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """On every rank: time each transport on each size (bytes); rows are identical on all ranks (max over ranks)."""
    group, n = dist.group.WORLD, dist.get_world_size()
    device = current_device()
    transports = {"gloo/nccl": _torch_all_reduce, "ring": TRANSPORTS["ring"], "naive": TRANSPORTS["naive"]}
    rows = []
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        for name, fn in transports.items():
            times = []
            for i in range(warmup + iters):
                dist.barrier(group)
                synchronize(device)
                start = time.perf_counter()
                fn(tensor, group)
                synchronize(device)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
            seconds = torch.tensor([statistics.median(times)])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)   # the slowest rank sets the pace
            t = float(seconds)
            rows.append({"transport": name, "bytes": nbytes, "ranks": n, "median_ms": t * 1e3,
                         "algbw_GBps": nbytes / t / 1e9, "busbw_GBps": nbytes / t / 1e9 * 2 * (n - 1) / n})
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'size':>10} {'transport':>10} {'median ms':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        size = f"{r['bytes'] / 1024:.0f} KiB" if r["bytes"] < 1 << 20 else f"{r['bytes'] / (1 << 20):.0f} MiB"
        lines.append(f"{size:>10} {r['transport']:>10} {r['median_ms']:>10.3f} {r['algbw_GBps']:>11.3f} "
                     f"{r['busbw_GBps']:>11.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-mib", type=int, default=16)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the rows as CSV here")
    args = parser.parse_args(argv)
    if args.min_kib < 1 or args.max_mib * 1024 < args.min_kib:
        parser.error("need 1 <= --min-kib <= --max-mib * 1024")
    sizes, size = [], args.min_kib * 1024
    while size <= args.max_mib << 20:
        sizes.append(size)
        size *= 4
    rows = launch(measure, sizes, args.iters, args.warmup, world_size=args.world_size, backend=args.backend)[0]
    print(format_table(rows))
    if args.out:
        import csv
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
