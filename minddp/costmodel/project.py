"""``python -m minddp.model project``: each stage's step at 2 … 1024 ranks on real links, from a compute profile.

Data parallelism keeps the work per rank fixed (weak scaling): only the communication changes with
the rank count, so one compute profile predicts the whole ladder at any size. docs/scaling.md,
section 5, numbers the same steps and shows the results:

1. **a compute profile** (:class:`~minddp.costmodel.compute.ComputeProfile`), *given* (``--setting
   blog``, or ``--model`` with ``--tflops``) or *measured* here (``--measure``);
2. **each stage's step** built from it (:func:`~minddp.costmodel.compute.synthesize`) and replayed on
   each link at each rank count (:func:`~minddp.costmodel.step.predict`), as on a real network;
3. **report** per (link, stage, ranks): step time, scaling efficiency, communication, exposed and
   overlap shares, and the bandwidth each stage needs for 90 % efficiency (``projection.md``/``.csv``/``.png``).

Example::

    $ python -m minddp.model project --setting blog
    $ python -m minddp.model project --measure --links 1gbit,10gbit --ranks 2,4,8,16,32
"""

from __future__ import annotations

import os
import sys
import time

from minddp.costmodel.compute import ComputeProfile, from_throughput, synthesize
from minddp.costmodel.step import WAITS, predict

#: SmolLM2-360M's shape (its public config): Llama, tied embeddings; a 2-label classification head.
SMOLLM2_360M = dict(
    vocab_size=49152,
    hidden_size=960,
    intermediate_size=2560,
    num_hidden_layers=32,
    num_attention_heads=15,
    num_key_value_heads=5,
    num_labels=2,
)
#: The blog's run: 4 × T4, bf16, batch 16 per GPU, 3 micro-batches per optimizer step, MRPC pairs.
BLOG = dict(
    arch=SMOLLM2_360M,
    dtype_bytes=2,
    examples=16,
    tokens_per_example=88,
    micro_batches=3,
    ranks=4,
    link="pcie-t4",
    tflops=3.0,
    optimizer_s=0.015,
)
#: What the blog reports (HolisticTraceAnalysis on rank 0's GPU trace): non-compute % and comm/comp overlap %.
BLOG_NUMBERS = {"simple": (15, 0), "ga": (5, 0), "hook": (None, 0), "hook-async": (2, 90), "bucket-async": (2, 90)}
DEFAULT_RANKS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
DEFAULT_LINKS = ["1gbit", "10gbit", "100gbit-ib", "pcie-t4", "nvlink"]


def llama_parameter_bytes(arch: dict, dtype_bytes: int) -> list[int]:
    """Bytes of each trainable parameter of a Llama sequence classifier, in registration order."""
    h, i, kv = arch["hidden_size"], arch["intermediate_size"], arch["num_key_value_heads"]
    head = h // arch["num_attention_heads"]
    layer = [h * h, h * kv * head, h * kv * head, h * h, h * i, h * i, i * h, h, h]  # q k v o gate up down 2 norms
    sizes = [arch["vocab_size"] * h] + layer * arch["num_hidden_layers"] + [h, arch["num_labels"] * h]
    return [n * dtype_bytes for n in sizes]


def blog_profile(tflops: float | None = None) -> ComputeProfile:
    """Step 1 for ``--setting blog`` (the numbers are in :data:`BLOG`; ``tflops`` overrides its speed)."""
    nbytes = llama_parameter_bytes(BLOG["arch"], BLOG["dtype_bytes"])
    return from_throughput(
        nbytes,
        sum(nbytes) // BLOG["dtype_bytes"],
        BLOG["examples"] * BLOG["tokens_per_example"],
        (tflops or BLOG["tflops"]) * 1e12,
        BLOG["micro_batches"],
        BLOG["optimizer_s"],
    )


#: Links inside one machine, and the most ranks one machine holds: a projection stops there.
ONE_MACHINE = {"pcie-t4": 8, "nvlink": 8}


def project(cp: ComputeProfile, stages: list[str], links: list[str], ranks: list[int], cap: float | None) -> list[dict]:
    """Steps 2-3: one row per (link, stage, ranks); links inside one machine stop at its size."""
    rows = []
    for link in links:
        for stage in stages:
            for n in [n for n in ranks if n <= ONE_MACHINE.get(link, n)]:
                profile = synthesize(cp, stage, cap, n).on_real_network()
                p = predict(profile, link)
                rows.append(
                    {
                        "link": link,
                        "stage": stage,
                        "ranks": n,
                        **p.row(),
                        "efficiency": p.compute / p.step,
                        "speedup": n * p.compute / p.step,
                    }
                )
    return rows


def required_bandwidth(
    cp: ComputeProfile, stage: str, ranks: int, cap: float | None, latency: float, target: float = 0.9
) -> float:
    """Bytes/s a link of per-hop ``latency`` needs for ``stage`` to keep ``target`` scaling efficiency at ``ranks``.

    ``inf`` when no bandwidth is enough (the per-message latency alone costs
    more than the target allows). Bisection on a log scale: efficiency only
    grows with bandwidth.
    """
    from minddp.comm.link import LinkSpec

    profile = synthesize(cp, stage, cap, ranks).on_real_network()

    def efficiency(bandwidth: float) -> float:
        p = predict(profile, LinkSpec("probe", bandwidth, latency), ranks)
        return p.compute / p.step

    lo, hi = 1e5, 1e14
    if efficiency(hi) < target:
        return float("inf")
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if efficiency(mid) < target else (lo, mid)
    return hi


def bandwidth_table(
    cp: ComputeProfile, stages: list[str], ranks: list[int], cap: float | None, latency: float, target: float = 0.9
) -> str:
    """Markdown: the link bandwidth (Gbit/s) each stage needs for ``target`` efficiency, per rank count."""
    lines = [
        f"## Link bandwidth for {100 * target:.0f} % scaling efficiency (Gbit/s; {1e6 * latency:g} µs per hop)",
        "",
        "| stage | " + " | ".join(str(n) for n in ranks) + " |",
        "|---|" + "---:|" * len(ranks),
    ]
    for stage in stages:
        cells = []
        for n in ranks:
            b = required_bandwidth(cp, stage, n, cap, latency, target)
            cells.append("latency-bound" if b == float("inf") else f"{8 * b / 1e9:.3g}")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "latency-bound: even an infinitely fast link misses the target, the per-message latency alone "
        "costs too much (too many messages, or too many ring hops).",
    ]
    return "\n".join(lines) + "\n"


def implied_tflops(cp: ComputeProfile, tflops: float, link: str, ranks: int, stage: str, share_pct: float) -> float:
    """The compute speed at which ``stage``'s predicted non-compute share would be ``share_pct`` (bisection)."""
    lo, hi = 0.01, 1000.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        scaled = cp_scaled(cp, tflops / mid)
        share = predict(synthesize(scaled, stage, None, ranks).on_real_network(), link).non_compute_pct
        lo, hi = (mid, hi) if share < share_pct else (lo, mid)  # faster compute -> larger share
    return (lo * hi) ** 0.5


def cp_scaled(cp: ComputeProfile, factor: float) -> ComputeProfile:
    """The same profile with every compute time times ``factor``."""
    from dataclasses import replace

    return replace(
        cp,
        forward=cp.forward * factor,
        backward=cp.backward * factor,
        ready=[r * factor for r in cp.ready],
        optimizer=cp.optimizer * factor,
    )


def blog_comparison(cp: ComputeProfile, tflops: float) -> str:
    """The blog's 4 × T4 numbers beside the projection for that setting, and the speed they imply."""
    link, n = BLOG["link"], BLOG["ranks"]
    lines = [
        f"## Beside the blog (SmolLM2-360M, bf16, 16 × ~{BLOG['tokens_per_example']} tokens, 3 micro-batches, "
        f"{n} × T4, link {link}, {tflops:g} TFLOP/s assumed)",
        "",
        "| stage | blog: non-compute (% of step) | predicted non-compute (% of step) "
        "| blog: overlap of comm by compute (%) | predicted overlap of comm by compute (%) "
        "| predicted step (s) | TFLOP/s that would give the blog's % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for stage in ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async", "ddp", "torch"]:
        p = predict(
            synthesize(
                cp, stage, 25.0 if stage in ("bucket", "bucket-async", "ddp", "torch") else None, n
            ).on_real_network(),
            link,
        )
        share, overlap = BLOG_NUMBERS.get(stage, (None, None))
        # where nothing overlaps, the non-compute share is comm / (comm + compute): it pins the compute speed down
        implied = f"{implied_tflops(cp, tflops, link, n, stage, share):.1f}" if share and WAITS[stage] == "now" else "-"
        lines.append(
            f"| {stage} | {'-' if share is None else f'~{share}'} | {p.non_compute_pct:.1f} | "
            f"{'-' if overlap is None else f'~{overlap}'} | {p.overlap_pct:.0f} | {p.step:.2f} | {implied} |"
        )
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Projected step time, 2 … {max(r['ranks'] for r in rows)} ranks ({meta['date']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Compute profile: {meta['profile']}",
        "",
        "| link | stage | " + " | ".join(str(n) for n in sorted({r["ranks"] for r in rows})) + " |",
        "|---|---|" + "---:|" * len({r["ranks"] for r in rows}),
    ]
    for link in dict.fromkeys(r["link"] for r in rows):
        for stage in dict.fromkeys(r["stage"] for r in rows):
            mine = {r["ranks"]: r for r in rows if r["link"] == link and r["stage"] == stage}
            lines.append(
                f"| {link} | {stage} | "
                + " | ".join(
                    f"{mine[n]['step_ms']:.0f} ms, {100 * mine[n]['efficiency']:.0f} %, "
                    f"comm {mine[n]['comm_share_pct']:.0f} %"
                    if n in mine
                    else "-"
                    for n in sorted({r["ranks"] for r in rows})
                )
                + " |"
            )
    lines += [
        "",
        "Each cell: step time, scaling efficiency (compute / step), communication share (time on the link / "
        f"step). Links inside one machine stop at {max(ONE_MACHINE.values())} ranks.",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(2, len(links), figsize=(3.6 * len(links), 6.4), squeeze=False, sharex=True)
    for j, link in enumerate(links):
        for stage in dict.fromkeys(r["stage"] for r in rows):
            mine = sorted((r["ranks"], r) for r in rows if r["link"] == link and r["stage"] == stage)
            xs = [n for n, _ in mine]
            axes[0][j].plot(xs, [100 * r["efficiency"] for _, r in mine], "-o", ms=3, label=stage)
            axes[1][j].plot(xs, [r["comm_share_pct"] for _, r in mine], "-o", ms=3, label=stage)
        axes[0][j].set(title=link, xscale="log", ylim=(0, 105), ylabel="scaling efficiency %")
        axes[1][j].set(xscale="log", ylim=(0, 105), xlabel="ranks", ylabel="communication share %")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measured_here(model_name: str) -> tuple[ComputeProfile, str]:
    """Step 1, measured: the offline model probed on this CPU (one process, no network)."""
    import torch

    from minddp.costmodel.compute import probe
    from minddp.train.config import parse_args
    from minddp.train.data import step_batches
    from minddp.train.models import build_model
    from minddp.train.run import prepare

    torch.set_num_threads(1)  # as each of two ranks on a 2-core machine computes (minddp.launch's rule)
    cfg = parse_args(["--no-profile", "--model", model_name])
    data, _, _ = prepare(cfg)
    model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype)
    model.train()
    micro = next(step_batches(data.train, cfg.batch_size, cfg.grad_accum, 1, 0, cfg.seed, data.pad_token_id))
    cp = probe(model, list(micro), lambda m, b: m(**b).loss, measure_network=False)
    return cp, (
        f"{model_name} measured on this CPU (one process, one thread: {cfg.batch_size} examples × "
        f"up to {cfg.max_seq_len} "
        f"tokens per micro-batch, {cfg.grad_accum} micro-batches; forward {1e3 * cp.forward:.1f} ms, backward "
        f"{1e3 * cp.backward:.1f} ms, optimizer {1e3 * cp.optimizer:.1f} ms, host cost {1e6 * cp.per_message:.0f} "
        "µs per message)"
    )


def main(argv: list[str]) -> int:
    from minddp.comm.link import parse_links
    from minddp.runtime.cli import Parser, UsageError, described

    p = Parser(prog="python -m minddp.model project", description=described(__doc__))
    p.add_argument("--setting", choices=["blog"], default=None, help="the blog's model, batch and GPUs (module doc)")
    p.add_argument("--measure", action="store_true", help="probe --model on this CPU instead of a given speed")
    p.add_argument("--model", default="tiny-llama", help="offline preset to measure or size (with --tflops)")
    p.add_argument("--tflops", type=float, default=None, help="achieved compute per rank, TFLOP/s (blog: 3)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per micro-batch per rank (with --tflops)")
    p.add_argument("--micro-batches", type=int, default=3)
    p.add_argument("--links", default=",".join(DEFAULT_LINKS))
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)))
    p.add_argument("--stages", default=",".join(WAITS))
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="cap of the bucketed stages (torch's default)")
    p.add_argument(
        "--latency-us",
        type=float,
        default=5.0,
        help="per-hop latency of the link in the bandwidth-for-90%%-efficiency table",
    )
    p.add_argument("--out", default=None, help="results folder (default: results/project-<date-time>)")
    ns = p.parse_args(argv)
    try:
        links = [spec.name for spec in parse_links(ns.links)]
        ranks = sorted({int(x) for x in ns.ranks.split(",")})
        stages = [s for s in ns.stages.split(",") if s]
        if set(stages) - set(WAITS) or min(ranks) < 2:
            raise UsageError(f"--stages takes {', '.join(WAITS)}; --ranks must be 2 or more")
        if ns.setting == "blog":
            tflops = ns.tflops or BLOG["tflops"]
            cp = blog_profile(tflops)
            described = (
                f"the blog's setting: SmolLM2-360M ({sum(cp.nbytes) / 2 / 1e6:.0f} M parameters, bf16 "
                f"gradients), {BLOG['examples']} × {BLOG['tokens_per_example']} tokens per micro-batch, "
                f"{BLOG['micro_batches']} micro-batches, {tflops:g} TFLOP/s achieved per GPU (assumed; see "
                f"docs/scaling.md): {cp.forward + cp.backward:.2f} s per micro-batch"
            )
        elif ns.measure:
            cp, described = measured_here(ns.model)
        elif ns.tflops and ns.tokens:
            from minddp.train.models import OFFLINE_PRESETS

            if ns.model not in OFFLINE_PRESETS:
                raise UsageError(f"--model must be an offline preset ({', '.join(OFFLINE_PRESETS)}) here")
            cp, described = _sized(ns.model, ns.tflops, ns.tokens, ns.micro_batches)
        else:
            raise UsageError("give --setting blog, --measure, or --tflops and --tokens")
    except (ValueError, UsageError) as exc:
        print(f"minddp.model project: error: {exc}", file=sys.stderr)
        return 2
    rows = project(cp, stages, links, ranks, ns.bucket_cap_mb)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "profile": described,
        "command": "python -m minddp.model project " + " ".join(argv),
    }
    text = markdown(rows, meta) + "\n" + bandwidth_table(cp, stages, ranks, ns.bucket_cap_mb, ns.latency_us * 1e-6)
    if ns.setting == "blog":
        text += "\n" + blog_comparison(cp, ns.tflops or BLOG["tflops"])
    out = ns.out or os.path.join("results", f"project-{time.strftime('%Y%m%d-%H%M%S')}")
    from minddp.bench.collectives import save_table

    save_table(out, "projection", rows, text)
    plot(rows, os.path.join(out, "projection.png"))
    print(text)
    print(f"minddp.model project: wrote {out}/projection.md, .csv, .png", file=sys.stderr)
    return 0


def _sized(model_name: str, tflops: float, tokens: int, micro_batches: int) -> tuple[ComputeProfile, str]:
    from minddp.train.models import OFFLINE_PRESETS

    arch = dict({"vocab_size": 49152, **OFFLINE_PRESETS[model_name]}, num_labels=2)
    nbytes = llama_parameter_bytes(arch, 4)
    cp = from_throughput(nbytes, sum(nbytes) // 4, tokens, tflops * 1e12, micro_batches)
    return cp, f"{model_name} with a 49152-token vocabulary, fp32, {tokens} tokens per micro-batch, {tflops:g} TFLOP/s"
