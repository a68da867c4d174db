"""``python -m minddp.bench.memory``: memory per rank of ddp, zero1, zero2 and fsdp, measured and plotted.

It trains each stage for a few steps at each world size, counts what a rank holds with
:class:`minddp.sharding.memory.Probe`, and writes a table (MiB per rank beside the ZeRO formulas)
and a plot. ``docs/sharding.md`` shows and explains the result.

Example::

    python -m minddp.bench.memory --model small-llama --world-sizes 2,3,4 --out results/memory
"""

from __future__ import annotations

import json
import os
from argparse import ArgumentTypeError

import torch

from minddp.sharding.memory import KINDS, STAGES, Probe, formula_bytes


def measure_rank(model_name: str, stages: list[str], steps: int = 2, batch: int = 8, seq: int = 32) -> dict:
    """On every rank: each stage trains ``steps`` steps of an offline model; the last step is probed."""
    import torch.distributed as dist

    from minddp.ladder import make_optimizer, wrap
    from minddp.ladder.loop import train_step
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
    for stage in stages:
        model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)
        wrapped = wrap(stage, model, bucket_cap_mb=25.0)
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, lr=1e-3)
        probe = None
        for i, b in enumerate(batches):
            if i == steps - 1:
                probe = Probe(wrapped, model, optimizer)
            train_step(wrapped, optimizer, [b], lambda m, b: m(**b).loss)
        out[stage] = probe.result()
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one row per (world size, stage), MiB, measured model state beside the formula."""
    mib = 2**20
    lines = [
        "| ranks | stage | parameters (MiB) | gradients (MiB) | optimizer (MiB) | model state (MiB) "
        "| formula (MiB) | measured / formula | activations (MiB) | gathered, peak (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        state = r["parameters"] + r["gradients"] + r["optimizer"]
        lines.append(
            f"| {r['world']} | {r['stage']} | {r['parameters'] / mib:.3f} | {r['gradients'] / mib:.3f} | "
            f"{r['optimizer'] / mib:.3f} | {state / mib:.3f} | {r['formula'] / mib:.3f} | "
            f"{state / r['formula']:.4f} | {r['activations'] / mib:.3f} | {r['gathered'] / mib:.3f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Stacked bars per (ranks, stage): parameters, gradients, optimizer state, gathered units; formula as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4))
    colors = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868", "gathered": "#c7c7c7"}
    for x, r in enumerate(rows):
        bottom = 0.0
        for kind, color in colors.items():
            value = r[kind] / 2**20
            ax.bar(x, value, bottom=bottom, color=color, label=kind if x == 0 else None)
            bottom += value
        ax.plot(
            [x - 0.4, x + 0.4],
            [r["formula"] / 2**20] * 2,
            color="black",
            lw=2,
            label="formula (model state)" if x == 0 else None,
        )
    ax.set_xticks(range(len(rows)), [f"{r['stage']}\n{r['world']} ranks" for r in rows], fontsize=7)
    ax.set_ylabel("MiB per rank")
    ax.set_title("Memory per rank, measured from the tensors")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
        ],
        description="Memory per rank of ddp, zero1, zero2 and fsdp, measured from the tensors, beside the ZeRO "
        "formulas.",
    )
    parser.add_argument(
        "--model", metavar="NAME", default="tiny-llama", help=f"an offline preset: {', '.join(OFFLINE_PRESETS)}"
    )
    parser.add_argument("--world-sizes", metavar="LIST", default="2,3,4", help="comma list of rank counts")
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
    rows = []
    for world in worlds:
        per_rank = launch(measure_rank, args.model, list(STAGES), world_size=world, backend="gloo")
        for stage in STAGES:
            worst = {k: max(r[stage][k] for r in per_rank) for k in KINDS}
            rep, psi = per_rank[0][stage]["replicated"], per_rank[0][stage]["psi"]
            rows.append(
                {
                    "world": world,
                    "stage": stage,
                    **worst,
                    "psi": psi,
                    "replicated": rep,
                    "formula": formula_bytes(stage, psi, world, rep if stage == "fsdp" else 0),
                }
            )
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
