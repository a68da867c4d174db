"""``python -m minddp.bench.slow_links``: step time of DDP, DiLoCo and streaming DiLoCo on slow links, beside the model.

A benchmark, not a test: it measures and predicts, it asserts nothing. For each ``--links`` link:

1. **measured**: the train command (:mod:`minddp.train`) trains ``ddp``, ``diloco`` (H = ``--sync-every``)
   and streaming ``diloco`` (``--fragments``, ``--fragment-delay``) with ``--link`` that link, its messages
   carried by the emulated NIC (:mod:`minddp.comm.link`). A step's time is read from each stage's metrics
   file: the **mean over the optimizer steps** after the first period of H (the warm-up and the one
   profiled step; a slow-link rung's cost lands on its sync steps only, so a median would miss it), and,
   for the rungs, the **compute** as the median of the steps that sent nothing. ``--steps`` is a multiple
   of H, so the steps averaged hold whole periods;
2. **predicted**: the step-time model (:mod:`minddp.costmodel.slow_link`) from a compute profile of the
   same model and batches (:func:`minddp.costmodel.compute.probe` in this process, one thread as a rank:
   when each gradient is ready, the optimizer, the copies), its times scaled so that an inner step takes
   what the ``diloco`` run's quiet steps took on this link (a shared machine's speed drifts between the
   probe and the runs; the model is asked what the *link* adds): DDP's step with its buckets, and one
   period of each rung replayed on the link;
3. **utilisation**, as Streaming DiLoCo reports it: the share of the time a replica computes, measured
   (that compute over the configuration's mean step) and predicted.

The table goes to stdout and, with ``--out``, to ``slow_links.md`` and ``slow_links.json``.
``docs/benchmarks.md`` (*Slow links*) has a run and the machine it ran on.

Example::

    $ python -m minddp.bench.slow_links                               # wan and home, ~3 minutes on 2 CPU cores
    $ python -m minddp.bench.slow_links --links home --steps 30 --sync-every 10 --fragments 2 --fragment-delay 4
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import torch

PROG = "python -m minddp.bench.slow_links"


def measured(link: str, args, folder: str) -> dict:
    """Step 1: the three configurations on ``link``; per configuration its mean step and compute (seconds)."""
    from minddp.train import run as train

    common = ["--link", link, "--steps", str(args.steps), "--sync-every", str(args.sync_every), "--profile-steps", "1"]
    common += ["--no-progress", "--seed", str(args.seed), "--trace-dir", folder, "--eval-examples", "16"]
    runs = {
        "plain": ["--stage", "ddp,diloco"],
        "streaming": ["--stage", "diloco", "--fragments", str(args.fragments)]
        + ["--fragment-delay", str(args.fragment_delay)],
    }
    out = {}
    for run, argv in runs.items():
        name = f"{link}-{run}"
        if train.main([*argv, *common, "--run-name", name]) != 0:
            raise RuntimeError(f"the train command failed on {link} ({' '.join(argv)}); its message is above")
        for stage in ("ddp", "diloco") if run == "plain" else ("diloco",):
            lines = read_metrics(os.path.join(folder, name, stage))
            steps = [line for line in lines if line["kind"] == "step"][args.sync_every :]
            quiet = [s["time_s"] for s in steps if not s["bytes"]]
            key = "streaming" if run == "streaming" else stage
            out[key] = {
                "step_s": statistics.mean(s["time_s"] for s in steps),
                "compute_s": statistics.median(quiet) if quiet else None,
                "bytes_per_step": statistics.mean(s["bytes"] for s in steps),
            }
    return out


def read_metrics(stage_folder: str) -> list[dict]:
    from minddp.train.metrics import FILENAME

    with open(os.path.join(stage_folder, FILENAME)) as f:
        return [json.loads(line) for line in f]


def compute_profile(args):
    """Step 2's input: the train command's model and one step's micro-batches, timed bare (one thread)."""
    from minddp.costmodel.compute import probe
    from minddp.train.config import parse_args
    from minddp.train.data import prepare_data, step_batches
    from minddp.train.models import build_model

    cfg = parse_args(["--seed", str(args.seed)])
    data = prepare_data(cfg.dataset, model=cfg.model, seed=cfg.seed, max_seq_len=cfg.max_seq_len)
    model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype)
    micro = next(step_batches(data.train, cfg.batch_size, cfg.grad_accum, 2, 0, cfg.seed, data.pad_token_id))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cp = probe(model, micro, lambda m, b: m(**b).loss, repeats=5, measure_network=False)
    finally:
        torch.set_num_threads(threads)
    return model, cp, cfg.bucket_cap_mb


def predicted(link: str, args, model, cp, cap, compute_s: float) -> dict:
    """Step 2: the model's step for each configuration on ``link`` (2 ranks), an inner step taking ``compute_s``."""
    from dataclasses import replace

    from minddp.costmodel.slow_link import ddp_step, fragment_bytes, inner_step_seconds, per_step

    f = compute_s / inner_step_seconds(cp)
    cp = replace(cp, forward=cp.forward * f, backward=cp.backward * f, ready=[r * f for r in cp.ready],
                 optimizer=cp.optimizer * f, per_byte=cp.per_byte * f)  # fmt: skip
    streamed = fragment_bytes(model, args.fragments)
    return {
        "ddp": ddp_step(cp, link, world=2, bucket_cap_mb=cap if isinstance(cap, (int, float)) else 25.0),
        "diloco": per_step(cp, link, args.sync_every, world=2),
        "streaming": per_step(cp, link, args.sync_every, streamed, args.fragment_delay, world=2),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| link | run | compute (inner step) | measured step | predicted step | measured utilisation | "
        "predicted utilisation | bytes / step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['link']} | {r['run']} | {1e3 * r['compute_s']:.1f} ms | {1e3 * r['step_s']:.1f} ms | "
            f"{1e3 * r['predicted_step_s']:.1f} ms | "
            f"{100 * r['utilisation']:.0f} % | {100 * r['predicted_utilisation']:.0f} % | "
            f"{r['bytes_per_step'] / 1e3:.1f} kB |"
        )
    return "\n".join(lines) + "\n"


#: The examples of ``--help``.
EXAMPLES = [
    f"{PROG}                                  # wan and home: H = 20, 2 fragments, delay 5",
    f"{PROG} --links home --out results/slow  # one link; the table also in results/slow",
]


def build_parser():
    from minddp.runtime.cli import Parser, described, number

    parser = Parser(prog=PROG, usage=f"{PROG} [options]", description=described(__doc__), examples=EXAMPLES)
    parser.add_argument("--links", metavar="LIST", default="wan,home", help="emulated links (presets or B,latency)")
    parser.add_argument("--steps", metavar="N", type=number(int, low=2), default=60, help="steps of each run")
    parser.add_argument("--sync-every", metavar="N", type=number(int, low=1), default=20, help="DiLoCo's H")
    parser.add_argument("--fragments", metavar="N", type=number(int, low=1), default=2, help="streaming's K")
    parser.add_argument("--fragment-delay", metavar="N", type=number(int, low=0), default=5, help="streaming's tau")
    parser.add_argument("--seed", metavar="N", type=number(int, low=0), default=314, help="model and data seed")
    parser.add_argument("--out", metavar="DIR", default=None, help="folder for slow_links.md and slow_links.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring): 0 on success, 2 with one line on bad input."""
    from minddp.bench.report import machine
    from minddp.comm.link import parse_link
    from minddp.diloco.fragments import check_schedule
    from minddp.runtime.cli import UsageError, fail
    from minddp.train.config import SLOW_LINK_FLAGS

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        links = [name for name in args.links.replace(" ", "").split(",") if name]
        for name in links:
            parse_link(name)
        check_schedule(args.sync_every, args.fragments, args.fragment_delay, names=SLOW_LINK_FLAGS)
        if args.steps % args.sync_every or args.steps < 2 * args.sync_every:
            raise UsageError(
                f"--steps {args.steps}: give a multiple of --sync-every, at least two periods (the first is a warm-up)"
            )
    except (UsageError, ValueError) as exc:
        return fail("minddp.bench.slow_links", exc, parser)
    model, cp, cap = compute_profile(args)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for link in links:
            seen = measured(link, args, folder)
            compute = seen["diloco"]["compute_s"]  # an inner step, nothing sent: what DDP's step computes too
            model_says = predicted(link, args, model, cp, cap, compute)
            for run in ("ddp", "diloco", "streaming"):
                rows.append(
                    {
                        "link": link,
                        "run": run,
                        **seen[run],
                        "compute_s": compute,
                        "utilisation": min(1.0, compute / seen[run]["step_s"]),
                        "predicted_step_s": model_says[run]["step_s"],
                        "predicted_utilisation": model_says[run]["utilisation"],
                    }
                )
    text = table(rows)
    print(text)
    from minddp.costmodel.slow_link import inner_step_seconds

    print(f"machine: {machine()}; the probe's inner step: {1e3 * inner_step_seconds(cp):.1f} ms")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "slow_links.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "slow_links.json"), "w") as f:
            json.dump({"machine": machine(), "argv": argv or sys.argv[1:], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
