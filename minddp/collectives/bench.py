"""Bandwidth of the hand-written collectives against the backend's own, over message sizes.

Not a test (timings on a shared machine are noise for assertions), a tool::

    python -m minddp.collectives.bench                       # 2 ranks, 4 KiB .. 16 MiB, all_reduce
    python -m minddp.collectives.bench --world-size 4 --max-mib 64 --out traces/allreduce_bw.csv
    python -m minddp.collectives.bench --op reduce_scatter   # also gloo's all_reduce + keep a chunk

``--op reduce_scatter`` / ``all_gather`` time the sharded stages' collectives
(sizes are the whole tensor); ``gloo/nccl`` is then ``reduce_scatter_single``
/ ``all_gather_single``, and for reduce_scatter ``all_reduce+chunk`` is what
minddp's wire does on gloo (:meth:`minddp.comm.wire.Wire.reduce_scatter`).

For each size and transport: the median of ``--iters`` timed calls (after
warm-up), and two bandwidths (as nccl-tests reports them):

* ``algbw`` = bytes / time: how fast a tensor of that size gets reduced;
* ``busbw`` = algbw · 2 (n - 1) / n (all_reduce; (n - 1) / n for the other
  two): the bytes each rank actually moves per
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


def _calls(op: str, whole: torch.Tensor, piece: torch.Tensor) -> dict:
    """``name -> (lambda group: ...)`` for every way to run ``op`` on these tensors."""
    if op == "all_reduce":
        return {"gloo/nccl": lambda g: _torch_all_reduce(whole, g), "ring": lambda g: TRANSPORTS["ring"](whole, g),
                "naive": lambda g: TRANSPORTS["naive"](whole, g)}
    if op == "reduce_scatter":
        rank = dist.get_rank()
        return {"gloo/nccl": lambda g: dist.reduce_scatter_single(piece, whole, group=g),
                "all_reduce+chunk": lambda g: (dist.all_reduce(whole, group=g),
                                               piece.copy_(whole.chunk(g.size())[rank])),
                "ring": lambda g: TRANSPORTS["ring"].reduce_scatter(piece, whole, g),
                "naive": lambda g: TRANSPORTS["naive"].reduce_scatter(piece, whole, g)}
    return {"gloo/nccl": lambda g: dist.all_gather_single(whole, piece, group=g),
            "ring": lambda g: TRANSPORTS["ring"].all_gather(whole, piece, g),
            "naive": lambda g: TRANSPORTS["naive"].all_gather(whole, piece, g)}


def measure(sizes: list[int], iters: int, warmup: int, op: str = "all_reduce") -> list[dict]:
    """On every rank: time each transport on each size (bytes); rows are identical on all ranks (max over ranks)."""
    group, n = dist.group.WORLD, dist.get_world_size()
    device = current_device()
    rows = []
    for nbytes in sizes:
        whole = torch.ones(nbytes // 4 // n * n, dtype=torch.float32, device=device)
        transports = _calls(op, whole, torch.ones(whole.numel() // n, dtype=torch.float32, device=device))
        for name, call in transports.items():
            times = []
            for i in range(warmup + iters):
                dist.barrier(group)
                synchronize(device)
                start = time.perf_counter()
                call(group)
                synchronize(device)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
            seconds = torch.tensor([statistics.median(times)])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)   # the slowest rank sets the pace
            t = float(seconds)
            factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n    # each pass moves (n-1)/n
            rows.append({"op": op, "transport": name, "bytes": nbytes, "ranks": n, "median_ms": t * 1e3,
                         "algbw_GBps": nbytes / t / 1e9, "busbw_GBps": nbytes / t / 1e9 * factor})
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'size':>10} {'transport':>16} {'median ms':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        size = f"{r['bytes'] / 1024:.0f} KiB" if r["bytes"] < 1 << 20 else f"{r['bytes'] / (1 << 20):.0f} MiB"
        lines.append(f"{size:>10} {r['transport']:>16} {r['median_ms']:>10.3f} {r['algbw_GBps']:>11.3f} "
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
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", "reduce_scatter", "all_gather"],
                        help="which collective (sizes are the whole tensor: a reduce-scatter's input, an "
                             "all-gather's output)")
    args = parser.parse_args(argv)
    if args.min_kib < 1 or args.max_mib * 1024 < args.min_kib:
        parser.error("need 1 <= --min-kib <= --max-mib * 1024")
    sizes, size = [], args.min_kib * 1024
    while size <= args.max_mib << 20:
        sizes.append(size)
        size *= 4
    rows = launch(measure, sizes, args.iters, args.warmup, args.op, world_size=args.world_size,
                  backend=args.backend)[0]
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
