"""``python -m minddp.bench collectives``: collective times over message sizes, and an α-β fit per collective.

A benchmark, not a test. On the ranks it starts, for each network (``gloo`` as it is here, and gloo
under each emulated ``--links``, :mod:`minddp.comm.link`), each collective (``all_reduce``,
``reduce_scatter``, ``all_gather``, ``broadcast``) and each payload size (1 KiB to 64 MiB, doubling), it:

1. **times** ``--iters`` calls, all ranks starting together; a size's time is the median of the
   slowest rank's;
2. **fits** ``t = a + b·S`` twice per (network, collective): the **α-β fit** (least squares on the
   times, large sizes dominate) and the **relative fit** (every size alike: what a small message
   costs), each read under the ring model of :meth:`~minddp.comm.link.LinkSpec.seconds`;
3. **writes** ``collectives.csv``, ``collectives.md`` and ``collectives.png`` to ``--out``.

``--transports ring,naive,wire`` adds minddp's hand-written collectives and the comm layer's
:class:`~minddp.comm.wire.Wire` as networks of their own. ``docs/scaling.md`` (*2. Collectives over
message sizes*) says what each fit is for, what ``S`` counts, and what was measured.

Example::

    $ python -m minddp.bench collectives                          # gloo and 1gbit, 2 ranks, ~70 s
    $ python -m minddp.bench collectives --links 1gbit,10gbit --world-size 4 --max-mib 16
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from minddp.runtime import compat
from minddp.runtime.cli import Parser, UsageError, described
from minddp.runtime.device import current_device, message_device, synchronize

PROG = "minddp.bench collectives"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def _start(kind: str, nbytes: int, world: int, transport=None):
    """Buffers for one ``kind`` collective of ``nbytes`` payload, and a function starting it.

    The function returns the collective's ``Work`` (gloo's reduce_scatter has no
    Future; a Work's ``wait()`` is all the link and the timer need).
    """
    chunk = max(1, nbytes // 4 // world)
    dev = current_device()  # the rank's device: a GPU's collectives where the ranks have GPUs
    if kind == "all_reduce":
        t = torch.ones(chunk * world, device=dev)
        if transport is not None:
            return t.numel() * 4, lambda: _Done(transport(t, dist.group.WORLD))
        return t.numel() * 4, lambda: dist.all_reduce(t, async_op=True)
    if kind == "reduce_scatter":
        src, dst = torch.ones(chunk * world, device=dev), torch.empty(chunk, device=dev)
        if transport is not None:
            return src.numel() * 4, lambda: _Done(transport.reduce_scatter(dst, src, dist.group.WORLD))
        return src.numel() * 4, lambda: compat.reduce_scatter_single(dst, src, async_op=True)
    if kind == "all_gather":
        src, dst = torch.ones(chunk, device=dev), torch.empty(chunk * world, device=dev)
        if transport is not None:
            return dst.numel() * 4, lambda: _Done(transport.all_gather(dst, src, dist.group.WORLD))
        return dst.numel() * 4, lambda: compat.all_gather_single(dst, src, async_op=True)
    t = torch.ones(chunk * world, device=dev)
    return t.numel() * 4, lambda: dist.broadcast(t, src=0, async_op=True)


class _Done:
    """A finished collective (a point-to-point transport runs to the end before it returns)."""

    def __init__(self, value=None):
        self.value = value

    def wait(self):
        return self.value


class _WireTransport:
    """:class:`~minddp.comm.wire.Wire` with torch's transport, as a transport: each call started and waited."""

    def __init__(self):
        from minddp.comm.wire import Wire

        self.wire = Wire(dist.group.WORLD)

    def __call__(self, tensor, group):
        self.wire.all_reduce(tensor).wait()

    def reduce_scatter(self, output, input, group):
        self.wire.reduce_scatter(output, input).wait()

    def all_gather(self, output, input, group):
        self.wire.all_gather(output, input).wait()


def measure_rank(networks: list[str], collectives: list[str], sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """Step 1 on every rank; the rows (identical on all ranks) of every (network, collective, size)."""
    from minddp.collectives import TRANSPORTS
    from minddp.comm.link import Link

    world = dist.get_world_size()
    rows = []
    for network in networks:
        link = Link(network) if network not in ("gloo", "wire", *TRANSPORTS) else None
        transport = _WireTransport() if network == "wire" else TRANSPORTS.get(network)
        for kind in collectives if transport is None else [k for k in collectives if k != "broadcast"]:
            for size in sizes:
                payload, start = _start(kind, size, world, transport)
                times = []
                repeats = iters * (3 if size <= 1 << 20 else 1)  # small sizes are cheap and the noisiest
                for i in range(warmup + repeats):
                    dist.barrier()
                    t0 = time.perf_counter()
                    fut = start()
                    (fut if link is None else link.carry(fut, payload, world, kind)).wait()
                    synchronize(current_device())  # a GPU collective's wait() only orders the stream
                    if i >= warmup:
                        times.append(time.perf_counter() - t0)
                slowest = torch.tensor(times, dtype=torch.float64, device=message_device())
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective takes as long as its slowest rank
                rows.append(
                    {
                        "network": network,
                        "collective": kind,
                        "ranks": world,
                        "bytes": payload,
                        "median_s": statistics.median(slowest.tolist()),
                        "min_s": min(slowest.tolist()),
                    }
                )
        if link is not None:
            link.close()
    return rows


def fit(points: list[tuple[float, float]]) -> dict:
    """Step 2: ``t = a + b·S`` twice, on ``(bytes, seconds)`` points.

    ``a_s``, ``b_s_per_byte``, ``r2``: least squares on the times with ``a ≥ 0``
    (the α-β fit). ``rel_a_s``, ``rel_b_s_per_byte``, ``r2_log``,
    ``max_rel_miss``: least squares on relative error (the relative fit).
    """
    xs = torch.tensor([s for s, _ in points], dtype=torch.float64)
    ys = torch.tensor([t for _, t in points], dtype=torch.float64)

    def line(weights):
        design = torch.stack([torch.ones_like(xs), xs], dim=1) * weights[:, None]
        return torch.linalg.lstsq(design, (ys * weights)[:, None]).solution.view(-1).tolist()

    a, b = line(torch.ones_like(ys))
    if a < 0:  # the best line through the origin instead: a = 0
        a, b = 0.0, float((xs * ys).sum() / (xs * xs).sum())
    ss_tot = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - float(((ys - (a + b * xs)) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    rel_a, rel_b = line(1.0 / ys)  # rows scaled by 1/t: relative residuals
    predicted = rel_a + rel_b * xs
    logs, fitted_logs = ys.log(), predicted.clamp(min=1e-12).log()
    ss_log = float(((logs - logs.mean()) ** 2).sum())
    return {
        "a_s": a,
        "b_s_per_byte": b,
        "r2": r2,
        "rel_a_s": rel_a,
        "rel_b_s_per_byte": rel_b,
        "r2_log": 1.0 - float(((logs - fitted_logs) ** 2).sum()) / ss_log if ss_log > 0 else float("nan"),
        "max_rel_miss": float(((predicted - ys).abs() / ys).max()),
    }


def fits(rows: list[dict]) -> list[dict]:
    from minddp.comm.link import COLLECTIVES as RING

    out = []
    keys = sorted({(r["network"], r["collective"]) for r in rows}, key=lambda k: (k[0] != "gloo", k))
    for network, kind in keys:
        mine = [r for r in rows if (r["network"], r["collective"]) == (network, kind)]
        n = mine[0]["ranks"]
        f = fit([(r["bytes"], r["median_s"]) for r in mine])
        hops, crossings = RING[kind]
        share = 1.0 if crossings is None else crossings * (n - 1) / n
        f.update(
            network=network,
            collective=kind,
            ranks=n,
            sizes=len(mine),
            alpha_us=1e6 * f["a_s"] / (hops * (n - 1)),
            rel_alpha_us=1e6 * f["rel_a_s"] / (hops * (n - 1)),
            busbw_GBps=share / f["b_s_per_byte"] / 1e9 if f["b_s_per_byte"] > 0 else float("inf"),
            rel_busbw_GBps=share / f["rel_b_s_per_byte"] / 1e9 if f["rel_b_s_per_byte"] > 0 else float("inf"),
        )
        out.append(f)
    return out


def markdown(rows: list[dict], fitted: list[dict], meta: dict) -> str:
    from minddp.comm.link import PRESETS

    lines = [
        f"# Collectives over message sizes, and α-β fits ({meta['date']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; load (1 min) before/after "
        f"{meta['load']}; wall {meta['wall_s']:.0f} s. Measured under whatever else ran there.",
        "",
        "Two fits of `t = a + b·S`: the **α-β fit** (least squares on the times, `a ≥ 0`; judged by `R²`) "
        "and the **relative fit** (least squares on relative error, every size alike; judged by `R²` of the "
        "logarithms and its largest relative miss). α = a / hops and busbw = share / b under the ring model "
        "(all_reduce: 2(N−1) hops, share 2(N−1)/N; reduce_scatter and all_gather: N−1, (N−1)/N; broadcast: "
        "N−1, 1).",
        "",
        "| network | collective | ranks | α-β fit: α (µs/hop) | busbw (GB/s) | nominal busbw | R² | "
        "relative fit: α (µs/hop) | busbw (GB/s) | R² (log) | max rel. miss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in fitted:
        nominal = PRESETS.get(f["network"])
        nom = f"{nominal.bandwidth / 1e9:g}" if nominal is not None else "-"
        lines.append(
            f"| {f['network']} | {f['collective']} | {f['ranks']} | {f['alpha_us']:.0f} | "
            f"{f['busbw_GBps']:.3g} | {nom} | {f['r2']:.4f} | {f['rel_alpha_us']:.0f} | "
            f"{f['rel_busbw_GBps']:.3g} | {f['r2_log']:.3f} | {100 * f['max_rel_miss']:.0f} % |"
        )
    lines += [
        "",
        "Median time per size (ms):",
        "",
        "| network | collective | " + " | ".join(_size(s) for s in sorted({r["bytes"] for r in rows})) + " |",
        "|---|---|" + "---:|" * len({r["bytes"] for r in rows}),
    ]
    for network, kind in sorted({(r["network"], r["collective"]) for r in rows}):
        by = {r["bytes"]: r["median_s"] for r in rows if (r["network"], r["collective"]) == (network, kind)}
        lines.append(
            f"| {network} | {kind} | "
            + " | ".join(f"{1e3 * by[s]:.3g}" if s in by else "-" for s in sorted({r["bytes"] for r in rows}))
            + " |"
        )
    return "\n".join(lines) + "\n"


def _size(nbytes: int) -> str:
    return f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"


def plot(rows: list[dict], fitted: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in COLLECTIVES if any(r["collective"] == k for r in rows)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for f in [f for f in fitted if f["collective"] == kind]:
            mine = sorted(
                (r["bytes"], r["median_s"]) for r in rows if (r["network"], r["collective"]) == (f["network"], kind)
            )
            xs = [s for s, _ in mine]
            (line,) = ax.plot(xs, [1e3 * t for _, t in mine], "o", ms=4, label=f"{f['network']} (R² {f['r2']:.3f})")
            ax.plot(xs, [1e3 * (f["a_s"] + f["b_s_per_byte"] * s) for s in xs], "-", color=line.get_color(), lw=1)
            ax.plot(
                xs, [1e3 * (f["rel_a_s"] + f["rel_b_s_per_byte"] * s) for s in xs], ":", color=line.get_color(), lw=1
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="payload S (bytes)",
            ylabel="time (ms)",
            title=f"{kind}, {rows[0]['ranks']} ranks",
        )
        ax.legend(fontsize=7, title="— α-β fit, ··· relative fit", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_table(out: str, stem: str, rows: list[dict], text: str) -> None:
    """``<out>/<stem>.csv`` (one line per row) and ``<out>/<stem>.md`` (``text``): what each of these tools keeps."""
    import csv

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    from minddp.bench.report import machine
    from minddp.collectives import TRANSPORTS
    from minddp.comm.link import parse_links
    from minddp.runtime.launch import RankError, launch

    p = Parser(prog="python -m minddp.bench collectives", description=described(__doc__))
    p.add_argument(
        "--links",
        default="1gbit",
        help="comma list of emulated links to measure besides gloo (presets, or bandwidth,latency such as "
        "100mbit,2ms; 'none': gloo only)",
    )
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma list of collectives")
    p.add_argument(
        "--transports",
        default="",
        help="also minddp's hand-written collectives and the wire's: comma list of ring, naive, wire",
    )
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--min-kib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=64)
    p.add_argument(
        "--iters",
        type=int,
        default=15,
        help="timed calls per size above 1 MiB (three times as many "
        "up to 1 MiB); the large sizes' medians set R², and 5 calls left it to chance",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None, help="results folder (default: results/collectives-<date-time>)")
    ns = p.parse_args(argv)
    try:
        links = [] if ns.links == "none" else [spec.name for spec in parse_links(ns.links)]
        kinds = [k for k in ns.collectives.split(",") if k]
        transports = [t for t in ns.transports.split(",") if t]
        if set(kinds) - set(COLLECTIVES) or set(transports) - (set(TRANSPORTS) - {"torch"} | {"wire"}):
            raise UsageError(f"--collectives takes {', '.join(COLLECTIVES)}; --transports takes ring, naive, wire")
        if ns.world_size < 2 or ns.iters < 1 or ns.min_kib < 1 or ns.max_mib * 1024 < ns.min_kib:
            raise UsageError("need --world-size >= 2, --iters >= 1, 1 <= --min-kib <= --max-mib * 1024")
    except (ValueError, UsageError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    sizes, size = [], ns.min_kib * 1024
    while size <= ns.max_mib << 20:
        sizes.append(size)
        size *= 2
    out = ns.out or os.path.join("results", f"collectives-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    load, start = os.getloadavg()[0], time.perf_counter()
    try:
        rows = launch(
            measure_rank,
            ["gloo", *transports, *links],
            kinds,
            sizes,
            ns.iters,
            ns.warmup,
            world_size=ns.world_size,
            backend="gloo",
            timeout_s=1200,
        )[0]
    except RankError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    fitted = fits(rows)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "command": "python -m minddp.bench collectives " + " ".join(sys.argv[2:] if argv is None else argv),
        "load": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
        "wall_s": time.perf_counter() - start,
    }
    text = markdown(rows, fitted, meta)
    save_table(out, "collectives", rows, text)
    plot(rows, fitted, os.path.join(out, "collectives.png"))
    print(text)
    print(f"{PROG}: wrote {out}/collectives.md, .csv, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
