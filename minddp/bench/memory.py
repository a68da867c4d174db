"""``python -m minddp.bench.memory``: memory per rank of ddp, zero1, zero2 and fsdp, measured and plotted.

It trains each stage for a few steps at each world size, counts what a rank holds with
:class:`minddp.sharding.memory.Probe`, and writes a table (MiB per rank beside the ZeRO formulas,
fp32 and bf16 compute with fp32 master weights) and a plot. ``--compute-dtype bf16`` adds fsdp
computing in bf16 (``compute_dtype``: its fp32 shards stay the master weights). ``docs/sharding.md``
shows and explains the result.

Example::

    python -m minddp.bench.memory --model small-llama --world-sizes 2,3,4 --compute-dtype bf16 --out results/memory
"""

from __future__ import annotations

import json
import os
from argparse import ArgumentTypeError

import torch

from minddp.sharding.memory import KINDS, STAGES, Probe, formula_bytes, formula_parts

#: ``--compute-dtype`` names: the dtype fsdp computes in (its shards, the master weights, stay fp32).
COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def measure_rank(model_name: str, stages: list[str], steps: int = 2, batch: int = 8, seq: int = 32) -> dict:
    """On every rank: each stage trains ``steps`` steps of an offline model; the last step is probed.

    A stage may be ``fsdp:bf16`` (or ``fsdp:fp16``): fsdp with that ``compute_dtype``; the result is
    keyed by the name as given.
    """
    import torch.distributed as dist

    from minddp.ladder import build_stage, make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.sharding.fsdp import blocks_of
    from minddp.train.models import build_model

    out = {}
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        {
            "input_ids": torch.randint(1, 92, (batch, seq), generator=g),
            "labels": torch.randint(0, 2, (batch,), generator=g),
        }
        for _ in range(steps)
    ]
    for name in stages:
        stage, _, dtype = name.partition(":")
        model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)
        if dtype:
            if stage != "fsdp" or dtype not in COMPUTE_DTYPES:
                raise ValueError(f"{name!r}: only fsdp takes a compute dtype ({', '.join(COMPUTE_DTYPES)})")
            wrapped = build_stage(stage, model, compute_dtype=COMPUTE_DTYPES[dtype], shard=blocks_of(model))
        else:
            wrapped = wrap(stage, model, bucket_cap_mb=25.0)
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, lr=1e-3)
        probe = None
        for i, b in enumerate(batches):
            if i == steps - 1:
                probe = Probe(wrapped, model, optimizer)
            train_step(wrapped, optimizer, [b], lambda m, b: m(**b).loss)
        out[name] = probe.result()
    return out


def row(world: int, name: str, measured: dict) -> dict:
    """One table row: a stage's measured bytes (largest over ranks, per kind) beside both formulas.

    ``formula`` is the fp32 one, which a stage computing in a 16-bit ``compute_dtype`` meets too (its
    fp32 parameters are the master copy); ``formula_mixed`` is the ZeRO paper's bf16 with fp32 master
    weights (2 + 2 + 12 bytes a parameter), ``formula_mixed_parts`` its parts by kind.
    """
    stage, _, dtype = name.partition(":")
    psi, rep = measured["psi"], measured["replicated"]
    return {
        "world": world,
        "stage": stage,
        "compute_dtype": dtype or "fp32",
        **{k: measured[k] for k in KINDS},
        "psi": psi,
        "replicated": rep,
        "formula": formula_bytes(stage, psi, world, rep),
        "formula_mixed": formula_bytes(stage, psi, world, rep, precision="bf16-mixed"),
        "formula_mixed_parts": formula_parts(stage, psi, world, rep, precision="bf16-mixed"),
    }


def table(rows: list[dict]) -> str:
    """Markdown: one row per (world size, stage), MiB, measured model state beside the formulas."""
    mib = 2**20
    lines = [
        "| ranks | stage | computes in | parameters (MiB) | gradients (MiB) | optimizer (MiB) | model state (MiB) "
        "| formula, fp32 (MiB) | measured / formula | formula, bf16 + fp32 masters (MiB) | activations (MiB) "
        "| gathered, peak (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        state = r["parameters"] + r["gradients"] + r["optimizer"]
        lines.append(
            f"| {r['world']} | {r['stage']} | {r['compute_dtype']} | {r['parameters'] / mib:.3f} | "
            f"{r['gradients'] / mib:.3f} | {r['optimizer'] / mib:.3f} | {state / mib:.3f} | {r['formula'] / mib:.3f} | "
            f"{state / r['formula']:.4f} | {r['formula_mixed'] / mib:.3f} | {r['activations'] / mib:.3f} | "
            f"{r['gathered'] / mib:.3f} |"
        )
    return "\n".join(lines)


#: The colours of the memory picture, by kind (the notebooks' and docs' picture alike).
COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868", "gathered": "#c7c7c7"}


def plot(
    rows: list[dict],
    path: str | None = None,
    ax=None,
    title: str = "Memory per rank, measured from the tensors",
    ylabel: str = "MiB per rank",
):
    """Stacked bars per row: parameters, gradients, optimizer state, gathered units (measured; a kind the row
    leaves out is not drawn); each row's fp32 formula as a solid tick and the ZeRO paper's bf16-with-fp32-masters
    formula as a dashed one. A row's ``label`` names its bar (default: stage and ranks, and the compute dtype if
    not fp32); ``ylabel`` names the y axis. Saved to ``path`` if given; returns the figure."""
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(3, 0.7 * len(rows)) + 3.6, 4))
    top, labelled = 0.0, set()  # each formula's legend entry on the first bar that draws it
    for x, r in enumerate(rows):
        bottom = 0.0
        for kind, color in COLORS.items():
            if kind not in r:
                continue
            value = r[kind] / 2**20
            ax.bar(x, value, bottom=bottom, color=color, label=kind if x == 0 else None)
            bottom += value
        for key, style, color, label in (
            ("formula", "-", "black", "formula, fp32 (model state)"),
            ("formula_mixed", "--", "#b2182b", "formula, bf16 compute + fp32 masters (ZeRO, K = 12)"),
        ):
            if key in r:
                ax.plot(
                    [x - 0.4, x + 0.4],
                    [r[key] / 2**20] * 2,
                    style,
                    color=color,
                    lw=2,
                    label=None if key in labelled else label,
                )
                labelled.add(key)
        top = max(top, bottom, r.get("formula", 0) / 2**20)
    labels = [
        r.get("label")
        or f"{r['stage']}\n{r['world']} ranks"
        + (f"\n{r['compute_dtype']}" if r.get("compute_dtype", "fp32") != "fp32" else "")
        for r in rows
    ]
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("stage", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.05)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    if path is not None:
        ax.figure.savefig(path, dpi=120)
        plt.close(ax.figure)
    return ax.figure


def main(argv: list[str] | None = None) -> int:
    """The CLI (module doc): 0 on success, 2 with one line on bad input."""
    from minddp.runtime.cli import Parser, UsageError, fail, number
    from minddp.runtime.launch import launch
    from minddp.train.models import OFFLINE_PRESETS

    parser = Parser(
        prog="python -m minddp.bench.memory",
        examples=[
            "python -m minddp.bench.memory                              # tiny-llama at 2, 3 and 4 ranks",
            "python -m minddp.bench.memory --model small-llama --out results/memory   # table, JSON and plot",
            "python -m minddp.bench.memory --compute-dtype bf16     # and fsdp computing in bf16",
        ],
        description="Memory per rank of ddp, zero1, zero2 and fsdp, measured from the tensors, beside the ZeRO "
        "formulas.",
    )
    parser.add_argument(
        "--model", metavar="NAME", default="tiny-llama", help=f"an offline preset: {', '.join(OFFLINE_PRESETS)}"
    )
    parser.add_argument("--world-sizes", metavar="LIST", default="2,3,4", help="comma list of rank counts")
    parser.add_argument(
        "--compute-dtype",
        metavar="DTYPE",
        default="fp32",
        choices=list(COMPUTE_DTYPES),
        help="bf16 or fp16: also measure fsdp computing in it (compute_dtype; fp32 shards as master weights)",
    )
    parser.add_argument("--out", metavar="DIR", default=None, help="folder for memory.md, memory.json and memory.png")
    try:
        args = parser.parse_args(argv)
        if args.model not in OFFLINE_PRESETS:
            raise UsageError(f"--model {args.model!r}: choose an offline preset ({', '.join(OFFLINE_PRESETS)})")
        try:
            worlds = [number(int, low=1)(w) for w in args.world_sizes.split(",")]
        except ArgumentTypeError as exc:
            raise UsageError(f"--world-sizes {args.world_sizes!r}: {exc}; give a comma list like 2,3,4") from None
    except UsageError as exc:
        return fail("minddp.bench.memory", exc, parser)
    names = list(STAGES) + ([f"fsdp:{args.compute_dtype}"] if args.compute_dtype != "fp32" else [])
    rows = []
    for world in worlds:
        per_rank = launch(measure_rank, args.model, names, world_size=world, backend="gloo")
        for name in names:
            worst = {**per_rank[0][name], **{k: max(r[name][k] for r in per_rank) for k in KINDS}}
            rows.append(row(world, name, worst))
    print(table(rows))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "memory.md"), "w") as f:
            f.write(table(rows) + "\n")
        with open(os.path.join(args.out, "memory.json"), "w") as f:
            json.dump(rows, f, indent=1)
        plot(rows, os.path.join(args.out, "memory.png"))
        print(f"wrote {args.out}/memory.md, memory.json, memory.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
