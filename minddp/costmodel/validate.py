"""``python -m minddp.model validate``: predicted against measured step time, every stage, ranks, link and cap.

A benchmark, not a test: it measures and reports, it asserts nothing. For each world size, inside
every rank:

1. **build** every configuration once (each stage, each cap of ``--caps``), all on the same
   micro-batches;
2. **auto**: let :func:`~minddp.costmodel.auto.best_cap` pick a cap per link, built as one more
   configuration;
3. **profile** each configuration a few steps on ``loopback`` and read its
   :class:`~minddp.costmodel.step.StepProfile`\\ s (:mod:`minddp.costmodel.trace`);
4. **measure** without the profiler: shuffled rounds, one step per configuration on each link;
5. in the parent, **predict** every (configuration, link) from the loopback profiles alone (*raw*,
   and *calibrated* for the profiler's overhead) and compare with the median measured step.

Outputs in ``--out``: ``validation.csv``, ``.md``, ``.json``, ``predicted_vs_measured.png``,
``whatif.png``. The method and the figures measured: ``docs/scaling.md`` (Validation).

Example::

    $ python -m minddp.model validate                                     # ~10 minutes on 2 busy cores
    $ python -m minddp.model validate --world-sizes 2 --links 1gbit --steps 2 --warmup 1   # smoke
"""

from __future__ import annotations

import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from minddp.costmodel.auto import BUCKETED
from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER

STAGES = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async", "ddp", "torch"]
#: Also read from traces (``--stages zero1,zero2,fsdp``); not in the default sweep, whose figures the docs quote.
SHARDED = list(SHARDED_OPTIMIZER + SHARDED_GRADIENTS)
#: The stages whose ``--bucket-cap-mb auto`` pick is checked against the swept caps (step 2).
AUTO = ("bucket-async", "zero2")


def config_name(stage: str, cap) -> str:
    return stage if cap is None else f"{stage}@{cap:g}"


def validate_rank(
    cfg,
    data,
    stages: list[str],
    caps: list[float],
    links: list[str],
    steps: int,
    warmup: int,
    profile_steps: int,
    trace_dir: str | None,
    auto: bool,
    auto_rounds: int = 0,
) -> dict:
    """Steps 1-4 on one rank; returns profiles, measured times and the auto picks."""
    from minddp.comm.link import Link
    from minddp.comm.wire import Wire
    from minddp.costmodel.auto import best_cap
    from minddp.costmodel.compute import plan_for, probe
    from minddp.costmodel.trace import step_profiles
    from minddp.ladder import make_optimizer, wrap
    from minddp.ladder.loop import train_step
    from minddp.train.data import step_batches
    from minddp.train.models import build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    wires = {name: Link(name) for name in ["loopback", *links]}  # this rank's NIC, one per link
    batches = step_batches(data.train, cfg.batch_size, cfg.grad_accum, world, rank, cfg.seed, data.pad_token_id)
    micro = list(next(batches))  # step 1: every step trains on these

    def loss_fn(model, batch):
        return model(**batch).loss

    def fresh_model():
        model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype)
        model.train()
        return model

    configs = [(s, c) for s in stages for c in (caps if s in BUCKETED else [None])]
    picks, compute_profile = {}, None  # picks: {stage: {link: cap}}
    if auto and set(AUTO) & set(stages):  # step 2
        compute_profile = probe(fresh_model(), micro, loss_fn)
        for stage in [s for s in AUTO if s in stages]:
            mine = picks[stage] = {name: best_cap(compute_profile, stage, world, name).cap_mb for name in links}
            for name, cap in mine.items():  # a pick that builds the same buckets as a swept cap *is* that run
                same = [c for c in caps if plan_for(compute_profile, stage, c) == plan_for(compute_profile, stage, cap)]
                mine[name] = same[0] if same else cap
        box = [picks]
        dist.broadcast_object_list(box, src=0)
        picks = box[0]
    picked = [(stage, c) for stage, mine in picks.items() for c in sorted(set(mine.values()))]
    runs = {}
    for stage, cap in configs + picked:
        name = config_name(stage, cap)
        if name in runs:
            continue
        model = fresh_model()
        wire = Wire(None, link=wires["loopback"])
        wrapped = wrap(stage, model, bucket_cap_mb=cap, wire=wire)
        runs[name] = (stage, wrapped, make_optimizer(stage, wrapped, torch.optim.AdamW, wire=wire, lr=cfg.lr), wire)

    def one_step(name: str, link: str) -> float:
        stage, wrapped, optimizer, wire = runs[name]
        wire.link = wires[link]
        dist.barrier()
        start = time.perf_counter()
        train_step(wrapped, optimizer, micro, loss_fn)
        return time.perf_counter() - start

    profiles = {}
    folder = trace_dir or tempfile.mkdtemp(prefix="minddp-validate-")
    for name in runs:  # step 3
        for _ in range(2):
            one_step(name, "loopback")
        path = os.path.join(folder, f"n{world}", name, f"rank{rank}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _profiled(lambda: one_step(name, "loopback"), profile_steps, path)
        wires["loopback"].annotate_trace(path)
        profiles[name] = step_profiles(path, runs[name][0], world, rank)
    # the sweep on every link; an auto pick outside it on loopback and on the link(s) that picked it
    plan = {config_name(s, c): ["loopback", *links] for s, c in configs}
    for stage, mine in picks.items():
        for link, cap in mine.items():
            on = plan.setdefault(config_name(stage, cap), ["loopback"])
            if link not in on:
                on.append(link)
    times = {(name, link): [] for name, on in plan.items() for link in on}
    for r in range(warmup + steps):  # step 4
        order = random.Random(f"{cfg.seed}/{r}").sample(sorted(plan), len(plan))
        for name in order:
            for link in plan[name]:
                seconds = one_step(name, link)
                if r >= warmup:
                    times[(name, link)].append(seconds)
    compared = {
        name: [link for link in on if link != "loopback"]
        for name, on in plan.items()
        if name.partition("@")[0] in picks
    }
    for r in range(auto_rounds):  # step 4, auto
        for name in random.Random(f"{cfg.seed}/auto/{r}").sample(sorted(compared), len(compared)):
            for link in compared[name]:
                times[(name, link)].append(one_step(name, link))
    for link in wires.values():
        link.close()
    return {
        "profiles": profiles,
        "times": {f"{n}|{link}": t for (n, link), t in times.items() if t},
        "picks": picks,
        "compute_profile": compute_profile,
        "sweep": [config_name(s, c) for s, c in configs],
    }


def _profiled(step, active: int, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    from minddp.runtime.profiling import quiet_kineto

    quiet_kineto()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(1 + active):
            step()
            prof.step()


# -- in the parent: predictions, the table, the plots ---------------------------------------------------------

#: ``--calibration``: which configurations share one profiler-overhead factor (step 5).
CALIBRATIONS = {"config": lambda name: name, "stage": lambda name: name.split("@")[0], "launch": lambda name: ""}


def overhead_factors(rank: dict, calibration: str) -> dict[str, float]:
    """How much faster compute runs without the profiler, per group of configurations of one rank (step 5).

    For each profiled step, the factor that makes it give the step measured on
    loopback without the profiler; the median over the group's steps. Groups:
    each configuration alone (``config``: its own profiled and plain steps, what
    a user has), each stage over its caps, or the whole launch.
    """
    from minddp.costmodel.step import predict

    group, found = CALIBRATIONS[calibration], {}
    for name, profiles in rank["profiles"].items():
        home = statistics.median(rank["times"][f"{name}|loopback"])
        found.setdefault(group(name), []).extend((home - predict(p, "loopback").exposed) / p.compute for p in profiles)
    return {g: max(0.1, statistics.median(f)) for g, f in found.items()}


def compare(per_world: dict[int, list[dict]], links: list[str], calibration: str = "config") -> list[dict]:
    """Step 5: one row per (configuration, link, ranks)."""
    from minddp.costmodel.step import predict

    rows, group = [], CALIBRATIONS[calibration]
    for world, ranks in sorted(per_world.items()):
        factors = [overhead_factors(rank, calibration) for rank in ranks]
        for name in ranks[0]["profiles"]:
            stage, _, cap = name.partition("@")
            for link in ["loopback", *links]:
                key = f"{name}|{link}"
                if key not in ranks[0]["times"]:
                    continue
                measured, raw, calibrated, parts = [], [], [], []
                for rank, by_group in zip(ranks, factors):
                    mine, factor = statistics.median(rank["times"][key]), by_group[group(name)]
                    each = []
                    for profile in rank["profiles"][name]:  # every profiled step; the median prediction
                        each.append((predict(profile.scaled(factor), link), predict(profile, link).step))
                    p = sorted(each, key=lambda e: e[0].step)[(len(each) - 1) // 2][0]
                    measured.append(mine)
                    raw.append(statistics.median(r for _, r in each))
                    calibrated.append(p.step)
                    parts.append(p)
                m, c, r = statistics.mean(measured), statistics.mean(calibrated), statistics.mean(raw)
                rows.append(
                    {
                        "ranks": world,
                        "stage": stage,
                        "cap_mb": float(cap) if cap else None,
                        "link": link,
                        "auto": ranks[0]["picks"].get(stage, {}).get(link) == (float(cap) if cap else None),
                        "sweep": name in ranks[0]["sweep"],
                        "measured_ms": 1e3 * m,
                        "predicted_ms": 1e3 * c,
                        "error_pct": 100 * (c - m) / m,
                        "predicted_raw_ms": 1e3 * r,
                        "error_raw_pct": 100 * (r - m) / m,
                        "predicted_exposed_ms": 1e3 * statistics.mean(p.exposed for p in parts),
                        "predicted_overlap_pct": statistics.mean(p.overlap_pct for p in parts),
                        "profiled_compute_ms": 1e3
                        * statistics.mean(statistics.median(p.compute for p in rk["profiles"][name]) for rk in ranks),
                        "steps": len(ranks[0]["times"][key]),
                        "spread_pct": statistics.mean(
                            100 * _iqr(rk["times"][key]) / statistics.median(rk["times"][key]) for rk in ranks
                        ),
                    }
                )
    return rows


def _iqr(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(3 * (len(ordered) - 1)) // 4] - ordered[(len(ordered) - 1) // 4]


def auto_check(rows: list[dict], per_world: dict[int, list[dict]], caps: list[float]) -> list[dict]:
    """For each (stage, ranks, link): the auto pick's measured step against the best swept cap's."""
    out = []
    for world, ranks in sorted(per_world.items()):
        for stage, mine in ranks[0]["picks"].items():
            for link, cap in mine.items():
                here = [r for r in rows if r["ranks"] == world and r["link"] == link and r["stage"] == stage]
                swept = [r for r in here if r["sweep"]]
                chosen = [r for r in here if r["cap_mb"] == cap]
                if not swept or not chosen:
                    continue
                best = min(swept, key=lambda r: r["measured_ms"])
                out.append(
                    {
                        "stage": stage,
                        "ranks": world,
                        "link": link,
                        "auto_cap_mb": cap,
                        "auto_ms": chosen[0]["measured_ms"],
                        "best_cap_mb": best["cap_mb"],
                        "best_ms": best["measured_ms"],
                        "ratio": chosen[0]["measured_ms"] / best["measured_ms"],
                        "steps": chosen[0]["steps"],
                        "spread_pct": chosen[0].get("spread_pct", float("nan")),
                    }
                )
    return out


def summary(rows: list[dict], links: list[str]) -> dict:
    judged = [r for r in rows if r["link"] in links and r["sweep"]]
    errors = [abs(r["error_pct"]) for r in judged]
    raw = [abs(r["error_raw_pct"]) for r in judged]
    return {
        "configurations": len(judged),
        "median_abs_error_pct": statistics.median(errors) if errors else float("nan"),
        "p90_abs_error_pct": sorted(errors)[int(0.9 * (len(errors) - 1))] if errors else float("nan"),
        "median_abs_error_raw_pct": statistics.median(raw) if raw else float("nan"),
    }


def markdown(rows: list[dict], checks: list[dict], stats: dict, meta: dict) -> str:
    lines = [
        f"# Step-time model against the emulated link ({meta['date']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; load (1 min) before/after: "
        f"{meta['load']}; wall {meta['wall_s']:.0f} s. Measured under whatever else ran there.",
        "",
        f"**Median absolute error of predicted step time: {stats['median_abs_error_pct']:.1f} %** over "
        f"{stats['configurations']} configurations (stage × cap × ranks × link; loopback rows not counted); "
        f"90th percentile {stats['p90_abs_error_pct']:.1f} %; profiler overhead calibrated per "
        f"{meta.get('calibration', 'config')}; without that calibration {stats['median_abs_error_raw_pct']:.1f} %.",
        "",
    ]
    if checks:
        within = sum(c["ratio"] <= 1.03 for c in checks)
        lines += [
            "## `--bucket-cap-mb auto`",
            "",
            f"The pick's measured step is within 1.03 × the best swept cap's in {within} of {len(checks)} settings.",
            "",
            "Measured: the median of the steps (rounds kept, plus `--auto-rounds`); spread: the interquartile "
            "range of the pick's steps over their median.",
            "",
            "| stage | ranks | link | auto cap (MiB) | step, measured (ms) | best swept cap (MiB) "
            "| its step (ms) | ratio | steps | spread (%) |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {c['stage']} | {c['ranks']} | {c['link']} | {c['auto_cap_mb']:g} | {c['auto_ms']:.1f} | "
            f"{c['best_cap_mb']:g} | {c['best_ms']:.1f} | {c['ratio']:.3f} | {c.get('steps', '-')} | "
            f"{c.get('spread_pct', float('nan')):.0f} |"
            for c in checks
        ]
        lines.append("")
    lines += [
        "## Every configuration",
        "",
        "| ranks | stage | cap (MiB) | link | step, measured (ms) | step, predicted (ms) | error (%) "
        "| error without the profiler correction (%) | predicted exposed comm (ms) "
        "| predicted overlap of comm by compute (%) |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cap = "-" if r["cap_mb"] is None else f"{r['cap_mb']:g}" + (" (auto)" if r["auto"] else "")
        lines.append(
            f"| {r['ranks']} | {r['stage']} | {cap} | {r['link']} | {r['measured_ms']:.1f} | "
            f"{r['predicted_ms']:.1f} | {r['error_pct']:+.1f} | {r['error_raw_pct']:+.1f} | "
            f"{r['predicted_exposed_ms']:.1f} | {r['predicted_overlap_pct']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plots(rows: list[dict], per_world: dict[int, list[dict]], links: list[str], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minddp.costmodel.auto import CANDIDATES
    from minddp.costmodel.compute import plan_for, synthesize
    from minddp.costmodel.step import predict

    paths = []
    fig, ax = plt.subplots(figsize=(6, 6))
    for link, marker in zip(["loopback", *links], "osD^v<>"):
        mine = [r for r in rows if r["link"] == link]
        ax.scatter(
            [r["measured_ms"] for r in mine], [r["predicted_ms"] for r in mine], marker=marker, label=link, alpha=0.7
        )
    top = max(max(r["measured_ms"], r["predicted_ms"]) for r in rows) * 1.05
    ax.plot([0, top], [0, top], "k-", lw=0.8)
    ax.plot([0, top], [0, 1.1 * top], "k:", lw=0.6)
    ax.plot([0, top], [0, 0.9 * top], "k:", lw=0.6)
    ax.set(
        xlabel="measured step (ms)",
        ylabel="predicted step (ms)",
        title="step-time model vs emulated link",
        xlim=(0, top),
        ylim=(0, top),
    )
    ax.legend()
    paths.append(os.path.join(out, "predicted_vs_measured.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    worlds = [w for w, ranks in sorted(per_world.items()) if ranks[0]["compute_profile"] is not None]
    for stage in [s for s in AUTO if worlds and any(r["stage"] == s for r in rows)]:
        fig, axes = plt.subplots(len(worlds), len(links), figsize=(4 * len(links), 3.2 * len(worlds)), squeeze=False)
        grid = sorted(set(CANDIDATES) | {c / 2 for c in CANDIDATES} | {c * 2 for c in CANDIDATES})
        for i, world in enumerate(worlds):
            cp = per_world[world][0]["compute_profile"]
            for j, link in enumerate(links):
                ax = axes[i][j]
                here = [r for r in rows if r["ranks"] == world and r["link"] == link and r["stage"] == stage]

                def probed(c):
                    return 1e3 * predict(synthesize(cp, stage, c, world), link).step

                # the probe times the bare model: the stage's own per-step work (its checks, its hooks'
                # Python) is missing, so the curve is moved to the level of the profiled steps' predictions
                level = statistics.median(r["predicted_ms"] - probed(r["cap_mb"]) for r in here) if here else 0.0
                ax.plot(grid, [probed(c) + level for c in grid], "-", label="predicted (probe, level of the profiles)")
                ax.plot([r["cap_mb"] for r in here], [r["measured_ms"] for r in here], "o", label="measured")
                ax.plot(
                    [r["cap_mb"] for r in here],
                    [r["predicted_ms"] for r in here],
                    "x",
                    label="predicted (profiled step)",
                )
                for r in here:
                    if r["auto"]:
                        ax.annotate(
                            "auto",
                            (r["cap_mb"], r["measured_ms"]),
                            textcoords="offset points",
                            xytext=(4, 6),
                            fontsize=8,
                        )
                ax.set_xscale("log")
                ax.set_title(
                    f"{stage}, {world} ranks, {link} ({len(plan_for(cp, stage, 0.025))} buckets at 0.025)", fontsize=9
                )
                ax.set_xlabel("bucket cap (MiB)")
                ax.set_ylabel("step (ms)")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(out, "whatif.png" if stage == "bucket-async" else f"whatif-{stage}.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def main(argv: list[str]) -> int:
    from minddp.bench.report import machine
    from minddp.runtime.cli import Parser, UsageError, described
    from minddp.runtime.launch import RankError, launch
    from minddp.train.config import parse_args
    from minddp.train.run import prepare

    p = Parser(prog="python -m minddp.model validate", description=described(__doc__))
    p.add_argument("--world-sizes", default="2,3,4", help="comma list of rank counts, one launch each")
    p.add_argument(
        "--links",
        default="100mbit,1gbit,10gbit",
        help="comma list of links to predict and measure (presets, or bandwidth,latency such as 100mbit,2ms)",
    )
    p.add_argument("--caps", default="0.025,0.1,1", help="bucket caps (MiB) of the bucketed stages")
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma list of stages (torch = torch's DDP; also {', '.join(SHARDED)})",
    )
    p.add_argument("--steps", type=int, default=7, help="measured rounds (each: every configuration on every link)")
    p.add_argument("--warmup", type=int, default=1, help="rounds measured but dropped first")
    p.add_argument("--profile-steps", type=int, default=3, help="profiled steps per configuration (one is kept)")
    p.add_argument("--no-auto", dest="auto", action="store_false", help="skip the --bucket-cap-mb auto check")
    p.add_argument(
        "--auto-rounds",
        type=int,
        default=20,
        help="extra measured rounds of the configurations the auto check compares",
    )
    p.add_argument("--model", default=None, help="as python -m minddp.train --model (default: its default)")
    p.add_argument("--out", default=None, help="results folder (default: results/model-validate-<date-time>)")
    p.add_argument("--keep-traces", action="store_true", help="keep the profiled traces under OUT/traces")
    p.add_argument(
        "--calibration",
        default="config",
        choices=list(CALIBRATIONS),
        help="which configurations share one profiler-overhead factor (module doc, step 5)",
    )
    p.add_argument(
        "--rejudge",
        default=None,
        metavar="RAW_PKL",
        help="run nothing: predict and compare again from a saved OUT/raw.pkl (writes to --out)",
    )
    ns = p.parse_args(argv)
    if ns.rejudge:
        return rejudge(ns.rejudge, ns.out or os.path.dirname(ns.rejudge), argv, ns.calibration)
    try:
        from minddp.comm.link import parse_links

        worlds = [int(w) for w in ns.world_sizes.split(",")]
        links = [spec.name for spec in parse_links(ns.links)]
        caps = [float(c) for c in ns.caps.split(",")]
        stages = [s.strip() for s in ns.stages.split(",")]
        bad = [s for s in stages if s not in STAGES + SHARDED]
        if bad or min(worlds) < 2 or ns.steps < 1 or ns.profile_steps < 1 or min(caps) <= 0 or ns.auto_rounds < 0:
            raise UsageError(
                f"need stages from {', '.join(STAGES + SHARDED)} (got {bad or 'ok'}), world sizes >= 2, "
                "caps > 0, "
                "--steps and --profile-steps >= 1, --auto-rounds >= 0"
            )
        cfg = parse_args(["--no-profile", "--no-progress"] + (["--model", ns.model] if ns.model else []))
        data, _, _ = prepare(cfg)
    except (ValueError, UsageError) as exc:
        print(f"minddp.model validate: error: {exc}", file=sys.stderr)
        return 2
    out = ns.out or os.path.join("results", f"model-validate-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    trace_dir = os.path.join(out, "traces") if ns.keep_traces else None
    load, start, per_world = os.getloadavg()[0], time.perf_counter(), {}
    for world in worlds:
        print(f"minddp.model validate: {world} ranks ...", file=sys.stderr, flush=True)
        try:
            per_world[world] = launch(
                validate_rank,
                cfg,
                data,
                stages,
                caps,
                links,
                ns.steps,
                ns.warmup,
                ns.profile_steps,
                trace_dir,
                ns.auto,
                ns.auto_rounds,
                world_size=world,
                backend=cfg.backend,
                timeout_s=900,
            )  # chosen per world size
        except RankError as exc:
            print(f"minddp.model validate: {exc}", file=sys.stderr)
            return 1
    with open(os.path.join(out, "raw.pkl"), "wb") as f:  # profiles and times: re-judge without re-running
        pickle.dump({"per_world": per_world, "links": links, "caps": caps}, f)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m minddp.model validate " + " ".join(argv),
        "machine": machine(),
        "load": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
        "wall_s": time.perf_counter() - start,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)
    return report(per_world, links, caps, meta, out, ns.calibration)


#: What a saved ``raw.pkl`` may name: the step-time model's own records (numbers, strings and lists inside).
RAW_GLOBALS = {
    ("minddp.costmodel.step", "StepProfile"),
    ("minddp.costmodel.step", "Message"),
    ("minddp.costmodel.compute", "ComputeProfile"),
}


def rejudge(raw: str, out: str, argv: list[str], calibration: str) -> int:
    """``--rejudge``: step 5 again on saved profiles and times (the file read as data: nothing in it runs)."""
    from minddp.runtime.untrusted import NotData, load_pickle_data, refusal

    try:
        with open(raw, "rb") as f:
            saved = load_pickle_data(f, lambda module, name: (module, name) in RAW_GLOBALS)
    except NotData as exc:
        fix = "give the raw.pkl that python -m minddp.model validate wrote"
        print(f"minddp.model validate: error: {refusal(raw, exc, fix)}", file=sys.stderr)
        return 2
    for ranks in saved["per_world"].values():  # saved before zero2 had picks too: {link: cap} were bucket-async's
        for rank in ranks:
            if rank["picks"] and not isinstance(next(iter(rank["picks"].values())), dict):
                rank["picks"] = {"bucket-async": rank["picks"]}
    meta_path = os.path.join(os.path.dirname(raw), "meta.json")
    meta = (
        json.load(open(meta_path))
        if os.path.exists(meta_path)
        else {"date": "?", "command": "?", "machine": "?", "load": "?", "wall_s": 0.0}
    )
    meta["command"] += f"  (re-judged: python -m minddp.model validate {' '.join(argv)})"
    os.makedirs(out, exist_ok=True)
    return report(saved["per_world"], saved["links"], saved["caps"], meta, out, calibration)


def report(per_world: dict, links: list[str], caps: list[float], meta: dict, out: str, calibration: str) -> int:
    """Step 5 and the outputs."""
    rows = compare(per_world, links, calibration)
    meta = dict(meta, calibration=calibration)
    checks = auto_check(rows, per_world, caps)
    stats = summary(rows, links)
    text = markdown(rows, checks, stats, meta)
    from minddp.bench.collectives import save_table

    save_table(out, "validation", rows, text)
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump({"meta": meta, "summary": stats, "auto": checks, "rows": rows}, f, indent=1)
    paths = plots(rows, per_world, links, out)
    print(text)
    print(
        f"minddp.model validate: wrote {out}/validation.md, .csv, .json, {', '.join(map(os.path.basename, paths))}",
        file=sys.stderr,
    )
    return 0
