"""From per-rank step times and traces to one row per configuration, a table, a CSV/JSON and a chart.

The columns (docs/benchmarks.md, "Method", defines each in full):

1. **step time**: per step the slowest rank; median, quartiles, min/max over all timed steps;
2. **ratio**: median over torch's DDP's with the same hook, with a 90 % interval (:func:`ratio_interval`);
3. **comm cost**: median minus the same stage's with ``noop_hook`` (:func:`minddp.analysis.metrics.comm_cost`: all
   that sending adds, not the *exposed* time of a trace over an emulated link, which is the link's part alone);
4. **overlap %**: collective time under compute over all of it, pooled over ranks and rounds
   (:func:`minddp.analysis.metrics.pooled_overlap_pct`), with the rounds' range;
5. **all_reduce calls and bytes per step**, from the wire's meter, a wrapped all_reduce or the trace;
6. **training-thread CPU**: the median over steps of the ranks' mean thread CPU time;
7. **peak memory**: the high-water of tensor bytes from building a configuration through its steps.

Example (one rank's samples, made by hand: three timed steps of torch's DDP and of ``ddp``)::

    >>> from minddp.bench.configs import BenchConfig
    >>> configs = [BenchConfig("torch", "torch"), BenchConfig("ddp", "ddp", ref="torch")]
    >>> def samples(ms, hidden):          # what bench_rank returns for a configuration (times in s)
    ...     return {"times": [t / 1e3 for t in ms], "cpu": [t / 2e3 for t in ms], "overlap": [(hidden, 10.0)],
    ...             "calls": [2, 2, 2], "bytes": [4096] * 3, "trace_traffic": [(2, 4096)] * 3}
    >>> rows = summarize(configs, [{"torch": samples([10, 11, 12], 5.0), "ddp": samples([10, 10.5, 11], 6.0)}])
    >>> [(r["config"], r["median_ms"], round(r["ratio_to_torch"], 3), r["overlap_pct"]) for r in rows]
    [('torch', 11.0, 1.0, 50.0), ('ddp', 10.5, 0.955, 60.0)]
    >>> print(markdown_table(rows).splitlines()[-1])
    | ddp | 10.50 | 10.25–10.75 | 10.00–11.00 | 0.955 (0.92–1.00) | – | 60.0 | 5.25 | 2.0 | 0.004 | – |
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics

from minddp.analysis import metrics
from minddp.analysis.metrics import pooled_overlap_pct

COLUMNS = [
    "config",
    "stage",
    "hook",
    "median_ms",
    "q1_ms",
    "q3_ms",
    "min_ms",
    "max_ms",
    "steps",
    "train_cpu_ms",
    "ratio_to_torch",
    "ratio_lo",
    "ratio_hi",
    "ref",
    "comm_cost_ms",
    "overlap_pct",
    "overlap_min_pct",
    "overlap_max_pct",
    "allreduce_calls_per_step",
    "allreduce_bytes_per_step",
    "traffic_source",
    "peak_mib",
]


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, statistics.median(values), q3


def max_total_allocated(trace_file: str) -> int:
    """Step 6: how far ``Total Allocated`` rose above its value before the trace's first ``[memory]`` event.

    The counter is process-wide and does not restart with each profiler
    session, so the baseline is the first event's total minus its own bytes.
    """
    with open(trace_file) as f:
        events = json.load(f)["traceEvents"]
    memory = sorted(
        (e for e in events if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})),
        key=lambda e: e["ts"],
    )
    if not memory:
        return 0
    base = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in memory) - base


def round_parts(per_rank_overlap: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Step 4: each round's ``(hidden, comm)``, summed over ranks, from each rank's per-round pairs."""
    return [(sum(h for h, _ in r), sum(c for _, c in r)) for r in zip(*per_rank_overlap)]


def overlap_of_rounds(parts: list[tuple[float, float]]) -> tuple:
    """Step 4 from per-round ``(hidden, comm)`` (ranks already summed); ``(None, None, None)`` without any."""
    if not parts:
        return None, None, None
    per_round = [pooled_overlap_pct([p]) for p in parts]
    return pooled_overlap_pct(parts), min(per_round), max(per_round)


def summarize(configs, per_rank: list[dict], rounds: int = 1) -> list[dict]:
    """One row per configuration (columns :data:`COLUMNS`), in the order of ``configs``, for one launch.

    ``rounds``: how many rounds the timed steps (stored round after round) came from.
    Several launches of the same configurations are put together with :func:`pool`.
    """
    rows = []
    for c in configs:
        runs = [r[c.name] for r in per_rank]
        if c.torch_cpp_default:  # torch's C++ default: from the traces, if any
            counted = runs[0].get("trace_traffic")
            calls, nbytes = (statistics.mean(x) for x in zip(*counted)) if counted else (None, None)  # step 5
            source = "trace"
        else:
            calls, nbytes = statistics.mean(runs[0]["calls"]), statistics.mean(runs[0]["bytes"])
            source = "hook" if c.stage == "torch" else "wire"
        peaks = [run["peak_bytes"] for run in runs if "peak_bytes" in run]
        peak = max(peaks) if peaks else None  # step 7
        rows.append(
            {
                "config": c.name,
                "stage": c.stage,
                "hook": c.hook
                + ("-py" if c.python_hook else "")
                + (f"-r{c.powersgd_rank}" if c.powersgd_rank else "")
                + ("+gabv" if c.gradient_as_bucket_view else ""),
                "times_ms": [max(ts) * 1e3 for ts in zip(*(run["times"] for run in runs))],  # step 1
                "cpu_times_ms": [statistics.mean(cs) * 1e3 for cs in zip(*(run["cpu"] for run in runs))],  # 6
                "overlap_rounds": round_parts([run["overlap"] for run in runs]),  # step 4
                "rounds": rounds,
                "launch_rounds": [rounds],
                "ref": c.ref,
                "noop": c.noop,
                "allreduce_calls_per_step": calls,
                "allreduce_bytes_per_step": nbytes,
                "traffic_source": source,
                "peak_mib": None if peak is None else peak / 2**20,
            }
        )
    return derive(rows)


def derive(rows: list[dict]) -> list[dict]:
    """Steps 1-4 and 6 from each row's raw samples (``times_ms``, ``cpu_times_ms``, ``overlap_rounds``,
    ``rounds``, ``launch_rounds``), in place.

    Separate from :func:`summarize` so that rows of several runs, their
    samples put together, are judged exactly like one run's (:func:`pool`).
    """
    by = {r["config"]: r for r in rows}
    for row in rows:
        times = row["times_ms"]
        row["q1_ms"], row["median_ms"], row["q3_ms"] = _quantiles(times)  # step 1
        row["min_ms"], row["max_ms"], row["steps"] = min(times), max(times), len(times)
        cpu = row.get("cpu_times_ms")  # absent from results saved before the column existed
        row["train_cpu_ms"] = statistics.median(cpu) if cpu else None  # step 6
        row["overlap_pct"], row["overlap_min_pct"], row["overlap_max_pct"] = overlap_of_rounds(
            row["overlap_rounds"]
        )  # step 4
    for row in rows:
        ref = by.get(row["ref"]) if row["ref"] else (row if row["stage"] == "torch" else None)
        row["ratio_to_torch"] = row["median_ms"] / ref["median_ms"] if ref else None  # step 2
        compared = ref is not None and ref is not row  # torch against itself: 1 exactly, no interval
        row["ratio_lo"], row["ratio_hi"] = (
            ratio_interval(row["times_ms"], ref["times_ms"], row["rounds"], launches=launches_of(row))
            if compared
            else (None, None)
        )
        noop = by.get(row.get("noop")) if row.get("noop") else None
        row["comm_cost_ms"] = metrics.comm_cost(row["median_ms"], noop["median_ms"]) if noop else None  # step 3
    return rows


def launches_of(row: dict) -> list[int]:
    """How many of the row's rounds each launch ran, in order (results saved before launches: one)."""
    return row.get("launch_rounds") or [row["rounds"]]


def pool(runs: list[list[dict]]) -> list[dict]:
    """Rows of several launches (or runs) of the same configurations as one run: samples and rounds put together.

    Rounds stay whole (each run's steps are stored round after round), and
    so do launches: each run's launches are kept as launches
    (``launch_rounds``), so the intervals resample launches, then rounds
    within them. Calls, bytes and memory are taken from the first run (they
    do not depend on timing).
    """
    first = runs[0]
    names = [r["config"] for r in first]
    for run in runs[1:]:
        if sorted(r["config"] for r in run) != sorted(names):
            raise ValueError(
                "the runs to pool must have the same configurations: "
                f"{sorted(names)} vs {sorted(r['config'] for r in run)}"
            )
    per_run = [{r["config"]: r for r in run} for run in runs]
    steps = {len(by[n]["times_ms"]) // by[n]["rounds"] for by in per_run for n in names}
    if len(steps) != 1:
        raise ValueError(
            f"the runs to pool must time the same number of steps per round (--steps), got {sorted(steps)}"
        )
    rows = []
    for row in first:
        merged = dict(row)
        if "noop" not in merged:  # results.json written before rows named their noop run
            noop = f"{row['stage']}+noop"
            merged["noop"] = noop if row["hook"] == "allreduce" and noop in names else None
        merged["times_ms"] = [t for by in per_run for t in by[row["config"]]["times_ms"]]
        cpu = [by[row["config"]].get("cpu_times_ms") for by in per_run]
        merged["cpu_times_ms"] = [t for c in cpu for t in c] if all(cpu) else None
        merged["overlap_rounds"] = [p for by in per_run for p in by[row["config"]]["overlap_rounds"]]
        merged["rounds"] = sum(by[row["config"]]["rounds"] for by in per_run)
        merged["launch_rounds"] = [n for by in per_run for n in launches_of(by[row["config"]])]
        rows.append(merged)
    return derive(rows)


def paired_bootstrap(
    series: list[list],
    rounds: int,
    statistic,
    level: float = 0.90,
    resamples: int = 1000,
    seed: int = 0,
    launches: list[int] | None = None,
) -> tuple[float, float]:
    """A bootstrap interval for ``statistic(*series)`` that resamples whole rounds, the same ones for every series.

    1. cut each series into its ``rounds`` blocks (values are stored round
       after round: step times, or one ``(hidden, comm)`` per round); with one
       round, or lengths that do not divide, each value is its own block;
    2. draw blocks with replacement, the *same* blocks for every series
       (configurations of one round shared the machine's state, so they are
       resampled together). With several ``launches`` (rounds per launch, in
       order), first draw as many launches as there are, with replacement,
       then, inside each drawn launch, as many of its rounds as it has: a
       launch is its own sample of the machine (which cores, which memory,
       which threads the processes got), and rounds of one launch share it;
    3. compute the statistic on the drawn blocks;
    4. repeat ``resamples`` times; the middle ``level`` of the values is the interval.
    """
    import random

    n = len(series[0])
    blocks = rounds if rounds > 1 and n % rounds == 0 else n  # step 1
    size = n // blocks
    groups = list(launches) if launches and len(launches) > 1 and sum(launches) == blocks else [blocks]
    starts = [sum(groups[:g]) for g in range(len(groups))]
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        drawn = rng.choices(range(len(groups)), k=len(groups)) if len(groups) > 1 else [0]  # step 2
        picks = [starts[g] + i for g in drawn for i in rng.choices(range(groups[g]), k=groups[g])]
        values.append(statistic(*([x for b in picks for x in s[b * size : (b + 1) * size]] for s in series)))  # 3
    return _middle(values, level)  # step 4


def _middle(values: list[float], level: float) -> tuple[float, float]:
    """The bounds of the middle ``level`` share of ``values`` (a bootstrap's interval)."""
    values = sorted(values)
    cut = int((1 - level) / 2 * len(values))
    return values[cut], values[len(values) - 1 - cut]


def ratio_interval(
    times: list[float],
    ref_times: list[float],
    rounds: int = 1,
    level: float = 0.90,
    resamples: int = 1000,
    seed: int = 0,
    launches: list[int] | None = None,
) -> tuple[float, float]:
    """Step 2: a bootstrap interval for ``median(times) / median(ref_times)``, paired by round (and launch).

    Both lists come from the same rounds of one run (or of pooled runs), so
    they are resampled together (:func:`paired_bootstrap`). On a noisy machine
    it says whether "1.02 x torch" means slower or the same.
    """
    if len(times) != len(ref_times):
        raise ValueError(f"paired samples must have the same length, got {len(times)} and {len(ref_times)}")
    return paired_bootstrap(
        [times, ref_times],
        rounds,
        lambda a, r: statistics.median(a) / statistics.median(r),
        level,
        resamples,
        seed,
        launches,
    )


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _ratio_cell(r: dict) -> str:
    if r["ratio_to_torch"] is None:
        return "–"
    if r["ratio_lo"] is None:
        return f"{r['ratio_to_torch']:.3f}"
    return f"{r['ratio_to_torch']:.3f} ({r['ratio_lo']:.2f}–{r['ratio_hi']:.2f})"


def _overlap_cell(r: dict) -> str:
    if r["overlap_pct"] is None:
        return "–"
    if r.get("rounds", 1) < 2:  # one round: its range is the value itself, no spread to show
        return f"{r['overlap_pct']:.1f}"
    return f"{r['overlap_pct']:.1f} ({r['overlap_min_pct']:.0f}–{r['overlap_max_pct']:.0f})"


def markdown_table(rows: list[dict]) -> str:
    ci = " (90 % CI)" if any(r.get("ratio_lo") is not None for r in rows) else ""  # none: no interval to name
    ranges = ", rounds" if any(r.get("rounds", 1) > 1 for r in rows) else ""
    head = (
        f"| config | step, median (ms) | step, IQR (ms) | step, min–max (ms) | step × torch{ci} "
        f"| comm cost (ms) | overlap of comm by compute (%{ranges}) | train-thread CPU (ms) "
        "| all_reduce calls per step | all_reduce per step (MiB) | peak memory (MiB) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        mib = None if r["allreduce_bytes_per_step"] is None else r["allreduce_bytes_per_step"] / 2**20
        calls = _fmt(r["allreduce_calls_per_step"], ".1f")
        lines.append(
            f"| {r['config']} | {r['median_ms']:.2f} | {r['q1_ms']:.2f}–{r['q3_ms']:.2f} "
            f"| {r['min_ms']:.2f}–{r['max_ms']:.2f} | {_ratio_cell(r)} "
            f"| {_fmt(r['comm_cost_ms'], '.2f')} | {_overlap_cell(r)} | {_fmt(r.get('train_cpu_ms'), '.2f')} "
            f"| {calls} "
            f"| {_fmt(mib, '.3f')} | {_fmt(r['peak_mib'], '.2f')} |"
        )
    return "\n".join(lines)


def write_outputs(
    rows: list[dict], folder: str, meta: dict, targets: list[dict] = (), targets_md: str = ""
) -> dict[str, str]:
    """``results.md`` (table, targets, settings), ``results.csv``, ``results.json``, ``step_times.png``.

    ``targets``: :func:`minddp.bench.targets.check_targets` of ``rows``; ``targets_md``: the same as
    :func:`minddp.bench.targets.targets_markdown` writes it.
    """
    os.makedirs(folder, exist_ok=True)
    paths = {k: os.path.join(folder, f"results.{k}") for k in ("md", "csv", "json")}
    with open(paths["md"], "w") as f:
        f.write(f"# minddp benchmark {meta.get('date', '')}\n\n{markdown_table(rows)}\n\n")
        if targets_md:
            f.write(f"## Targets\n\n{targets_md}\n\n")
        if meta.get("smoke_run"):
            f.write(f"**{meta['smoke_run']}**\n\n")
        f.write("".join(f"- {k}: {v}\n" for k, v in meta.items()))
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")  # raw step times: JSON only
        writer.writeheader()
        writer.writerows(rows)
    with open(paths["json"], "w") as f:
        json.dump({"meta": meta, "rows": rows, "targets": list(targets)}, f, indent=2)
    paths["png"] = os.path.join(folder, "step_times.png")
    plot(rows, paths["png"], meta)
    return paths


def plot(rows: list[dict], path: str, meta: dict) -> None:
    """Median step time with IQR whiskers per configuration, and the comm cost beside it.

    Colours: torch's DDP red, minddp's stages blue, ``noop_hook`` runs grey (the legend says so); a row
    whose comm cost was not measured (no ``noop_hook`` twin in the run) says "not measured"
    instead of drawing a bar of zero.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [r["config"] for r in rows][::-1]
    by = {r["config"]: r for r in rows}
    med = [by[n]["median_ms"] for n in names]
    err = [[by[n]["median_ms"] - by[n]["q1_ms"] for n in names], [by[n]["q3_ms"] - by[n]["median_ms"] for n in names]]
    kinds = {"tab:red": "torch's DDP", "tab:blue": "minddp", "tab:grey": "with noop_hook (no communication)"}
    colors = ["tab:grey" if "noop" in n else "tab:red" if by[n]["stage"] == "torch" else "tab:blue" for n in names]
    height = 0.32 * len(names) + 2.4
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, height), sharey=True)
    ax1.barh(names, med, xerr=err, color=colors, capsize=2)
    ax1.set_xlabel("step time, median (whiskers: IQR), ms")
    handles = [Patch(color=c, label=label) for c, label in kinds.items() if c in colors]
    torch_row = by.get("torch")
    if torch_row:
        handles.append(ax1.axvline(torch_row["median_ms"], color="tab:red", lw=0.8, ls="--", label="torch DDP median"))
    measured = [by[n]["comm_cost_ms"] for n in names]
    ax2.barh(names, [0.0 if m is None else m for m in measured], color=colors)
    for y, m in enumerate(measured):
        if m is None:
            ax2.text(
                0.01,
                y,
                "not measured (no noop_hook run)",
                transform=ax2.get_yaxis_transform(),
                va="center",
                fontsize=7,
                color="#666",
            )
    ax2.set_xlabel("comm cost = step − same stage with noop_hook, ms")
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    smoke = " — smoke run, targets not judged" if meta.get("smoke_run") else ""
    fig.suptitle(
        f"minddp vs torch DDP — {meta.get('model', '')}, {meta.get('world_size', '')} ranks, "
        f"{meta.get('backend', '')} ({meta.get('date', '')}){smoke}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))  # the legend's row below the axes
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    """The machine a benchmark ran on, in one line (system, CPU cores, GPU, torch release)."""
    import torch

    cpu = platform.processor() or platform.machine()
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}){gpu}; torch {torch.__version__}"
    )
