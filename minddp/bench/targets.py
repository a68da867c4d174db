"""The performance targets minddp holds itself to, checked on one benchmark run.

Each target compares rows of the same run and is skipped when the run lacks a configuration it needs
(docs/benchmarks.md, "Method", gives each in full, with the same numbers):

1. median step against torch's DDP: ``ddp`` ≤ 1.05 × (≤ 1.03 × where compute dominates),
   ``bucket-async`` ≤ 1.10 ×;
2. ``ddp``'s comm cost (step − the same with ``noop_hook``) is no more than ``torch+pyhook``'s, and it hides at least as
   large a share;
3. PowerSGD rank 1: ≥ 20 × fewer bytes than averaging, step ≤ 1.10 × torch's ``powerSGD_hook``;
4. ``ddp+gabv``'s peak memory ≤ torch's + 10 %;
5. the blog's ordering: ``simple`` slowest, ``bucket-async`` fastest of the blog's six;
6. the sharded rungs against ``ddp`` and torch's ZeRO-1, and ``fsdp``'s overlap > 0;
7. each async stage hides more than its blocking twin.

The ``verdict`` is ``yes`` when the point value meets the target, ``no`` when it and its whole 90 %
interval (:func:`minddp.bench.report.paired_bootstrap`) miss, ``within noise`` when it misses but the
interval reaches the target (docs/benchmarks.md, "The ratios").

Example (rows of one rank's samples, made by hand: torch's DDP and ``ddp``, three timed steps each)::

    >>> from minddp.bench.configs import BenchConfig
    >>> from minddp.bench.report import summarize
    >>> def samples(ms, hidden):          # what bench_rank returns for a configuration (times in s)
    ...     return {"times": [t / 1e3 for t in ms], "cpu": [t / 2e3 for t in ms], "overlap": [(hidden, 10.0)],
    ...             "calls": [2, 2, 2], "bytes": [4096] * 3, "trace_traffic": [(2, 4096)] * 3}
    >>> rows = summarize([BenchConfig("torch", "torch"), BenchConfig("ddp", "ddp", ref="torch")],
    ...                  [{"torch": samples([10, 11, 12], 5.0), "ddp": samples([10, 10.5, 11], 6.0)}])
    >>> for t in check_targets(rows): print(t["target"], "|", t["measured"], "|", t["verdict"])
    ddp step ≤ 1.05 × torch | 0.955 × (90 % CI 0.92–1.00) | yes
    context: ddp overlap ≥ torch's C++ default | 60.0 vs 50.0 % (rounds 60–60 vs 50–50) | yes
"""

from __future__ import annotations

import statistics

from minddp.analysis import metrics
from minddp.analysis.metrics import pooled_overlap_pct
from minddp.bench.report import launches_of, paired_bootstrap

BLOG_STAGES = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
#: Marks a row that is not one of the targets but puts one in context (judged the same way).
CONTEXT = "context: "


#: Step 1's limits (× torch's DDP) by ``--preset`` (None: the train command's default model, tiny).
#: ``bucket-async`` is the plain teaching stage (no speed work: that lives in ``ddp``), so it gets 10 % on
#: every model; on tiny, where a step is mostly Python around little compute, its plain code shows most.
STEP_LIMITS = {
    None: {"ddp": 1.05, "bucket-async": 1.10},
    "tiny": {"ddp": 1.05, "bucket-async": 1.10},
    "small": {"ddp": 1.03, "bucket-async": 1.10},
    "medium": {"ddp": 1.03, "bucket-async": 1.10},
}


#: Step 1's limits when every configuration runs a compiled model (``--compile``): the issue's 5 % on every preset.
COMPILED_STEP_LIMITS = {"ddp": 1.05, "bucket-async": 1.10}


def check_targets(rows: list[dict], preset: str | None = None, compiled: bool = False) -> list[dict]:
    """Steps 1-7 on ``rows`` (from :func:`minddp.bench.report.summarize`); one dict per target."""
    by = {r["config"]: r for r in rows}
    out = []

    def add(target: str, needs: list[str], measure, interval=None, reaches=None, quantity: str = ""):
        """``interval(*rows)``: (lo, hi) of ``quantity`` or None; ``reaches(lo, hi)``: whether it meets the target."""
        if all(n in by and by[n].get("median_ms") is not None for n in needs):
            picked = [by[n] for n in needs]
            measured, met = measure(*picked)
            bounds = interval(*picked) if interval else None
            verdict = "yes" if met else "within noise" if bounds and reaches(*bounds) else "no"
            out.append(
                {
                    "target": target,
                    "measured": measured,
                    "met": bool(met),
                    "verdict": verdict,
                    "interval": None if bounds is None else [float(b) for b in bounds],
                    "quantity": quantity,
                }
            )

    for stage in [s for s in ("ddp", "bucket-async") if by.get(s, {}).get("ratio_to_torch") is not None]:  # 1
        limit = (COMPILED_STEP_LIMITS if compiled else STEP_LIMITS.get(preset, STEP_LIMITS[None]))[stage]
        add(
            f"{stage} step ≤ {limit:.2f} × torch",
            [stage, "torch"],
            lambda a, t, limit=limit: (
                f"{a['ratio_to_torch']:.3f} × (90 % CI {a['ratio_lo']:.2f}–{a['ratio_hi']:.2f})",
                a["ratio_to_torch"] <= limit,
            ),
            _ratio_bounds,
            lambda lo, hi, limit=limit: lo <= limit,
            "× torch",
        )
    for target, reference in (
        ("ddp comm cost ≤ torch's with its Python allreduce_hook", "torch+pyhook"),  # 2
        (f"{CONTEXT}ddp comm cost ≤ torch's C++ default", "torch"),
    ):
        add(
            target,
            ["ddp", reference, "ddp+noop", "torch+noop"],
            lambda a, t, *_: (
                f"{a['comm_cost_ms']:.2f} vs {t['comm_cost_ms']:.2f} ms",
                a["comm_cost_ms"] <= t["comm_cost_ms"],
            ),
            lambda *four: _bootstrap(
                four,
                "times_ms",
                lambda a, t, an, tn: (
                    metrics.comm_cost(statistics.median(a), statistics.median(an))
                    - metrics.comm_cost(statistics.median(t), statistics.median(tn))
                ),
            ),
            lambda lo, hi: lo <= 0,
            "ddp − torch, ms",
        )
    for target, reference in (
        ("ddp overlap ≥ torch's with its Python allreduce_hook", "torch+pyhook"),
        (f"{CONTEXT}ddp overlap ≥ torch's C++ default", "torch"),
    ):
        if any(by.get(n, {}).get("overlap_pct") is None for n in ("ddp", reference)):
            continue
        add(
            target,
            ["ddp", reference],
            lambda a, t: (
                f"{a['overlap_pct']:.1f} vs {t['overlap_pct']:.1f} % (rounds {a['overlap_min_pct']:.0f}–"
                f"{a['overlap_max_pct']:.0f} vs {t['overlap_min_pct']:.0f}–{t['overlap_max_pct']:.0f})",
                a["overlap_pct"] >= t["overlap_pct"],
            ),
            lambda a, t: _bootstrap(
                [a, t], "overlap_rounds", lambda x, y: pooled_overlap_pct(x) - pooled_overlap_pct(y)
            ),
            lambda lo, hi: hi >= 0,
            "ddp − torch, points",
        )
    add(
        "PowerSGD r1 bytes ≥ 20 × fewer than allreduce",
        ["ddp+powersgd-r1", "ddp"],  # step 3
        lambda p, a: (
            f"{a['allreduce_bytes_per_step'] / p['allreduce_bytes_per_step']:.1f} × fewer",
            a["allreduce_bytes_per_step"] >= 20 * p["allreduce_bytes_per_step"],
        ),
    )
    add(
        "PowerSGD r1 step ≤ 1.10 × torch's hook",
        ["ddp+powersgd-r1", "torch+powersgd-r1"],
        lambda p, t: (
            f"{p['ratio_to_torch']:.3f} × (90 % CI {p['ratio_lo']:.2f}–{p['ratio_hi']:.2f})",
            p["ratio_to_torch"] <= 1.10,
        ),
        _ratio_bounds,
        lambda lo, hi: lo <= 1.10,
        "× torch's hook",
    )
    if all(by.get(n, {}).get("peak_mib") is not None for n in ("ddp+gabv", "torch+gabv")):  # step 4
        add(
            "ddp gradient_as_bucket_view memory ≤ torch's + 10 %",
            ["ddp+gabv", "torch+gabv"],
            lambda a, t: (f"{a['peak_mib']:.2f} vs {t['peak_mib']:.2f} MiB", a["peak_mib"] <= 1.10 * t["peak_mib"]),
        )
    distributed = [n for n in BLOG_STAGES + ["ddp", "torch"] if n in by]  # step 5
    if "simple" in by and len(distributed) > 1:
        slowest = max(distributed, key=lambda n: by[n]["median_ms"])
        add(
            "simple is the slowest distributed stage",
            ["simple"],
            lambda s: (f"slowest: {slowest} ({by[slowest]['median_ms']:.1f} ms)", slowest == "simple"),
        )
    blog = [n for n in BLOG_STAGES if n in by]
    if "bucket-async" in by and len(blog) > 1:
        fastest = min(blog, key=lambda n: by[n]["median_ms"])
        runner_up = min((n for n in blog if n != "bucket-async"), key=lambda n: by[n]["median_ms"])
        add(
            "bucket-async is the fastest of the blog's stages",
            ["bucket-async", runner_up],
            lambda b, r: (
                f"bucket-async {b['median_ms']:.1f} ms, next {runner_up} {r['median_ms']:.1f} ms "
                f"({b['median_ms'] / r['median_ms']:.3f} ×)",
                fastest == "bucket-async",
            ),
            lambda b, r: _bootstrap([b, r], "times_ms", lambda x, y: statistics.median(x) / statistics.median(y)),
            lambda lo, hi: lo < 1.0,
            f"bucket-async / {runner_up}",
        )
    for stage, reference, bound in (("zero2", "ddp", 1.10), ("fsdp", "ddp", 1.30), ("zero1", "torch-zero1", 1.0)):
        add(
            f"{stage} step ≤ {bound:.2f} × {reference}",
            [stage, reference],  # step 6
            lambda a, r, b=bound: (
                f"{a['median_ms'] / r['median_ms']:.3f} × ({a['median_ms']:.1f} vs {r['median_ms']:.1f} ms)",
                a["median_ms"] <= b * r["median_ms"],
            ),
            lambda a, r: _bootstrap([a, r], "times_ms", lambda x, y: statistics.median(x) / statistics.median(y)),
            lambda lo, hi, b=bound: lo <= b,
            f"{stage} / {reference}",
        )
    if by.get("fsdp", {}).get("overlap_pct") is not None:
        add(
            "fsdp's all-gathers run under compute (overlap > 0)",
            ["fsdp"],
            lambda f: (
                f"{f['overlap_pct']:.1f} % (rounds {f['overlap_min_pct']:.0f}–{f['overlap_max_pct']:.0f})",
                f["overlap_pct"] > 0,
            ),
        )
    for stage, blocking in (("hook-async", "hook"), ("bucket-async", "bucket")):  # step 7
        if all(by.get(n, {}).get("overlap_pct") is not None for n in (stage, blocking)):
            add(
                f"{stage} overlap > {blocking}'s",
                [stage, blocking],
                lambda a, b: (
                    f"{a['overlap_pct']:.1f} vs {b['overlap_pct']:.1f} %",
                    a["overlap_pct"] > b["overlap_pct"],
                ),
                lambda a, b: _bootstrap(
                    [a, b], "overlap_rounds", lambda x, y: pooled_overlap_pct(x) - pooled_overlap_pct(y)
                ),
                lambda lo, hi: hi > 0,
                f"{stage} − {blocking}, points",
            )
    if all(by.get(n, {}).get("overlap_pct") is not None for n in ("zero2", "ddp")):
        add(
            "zero2 overlap ≥ ddp's",
            ["zero2", "ddp"],
            lambda a, d: (f"{a['overlap_pct']:.1f} vs {d['overlap_pct']:.1f} %", a["overlap_pct"] >= d["overlap_pct"]),
            lambda a, d: _bootstrap(
                [a, d], "overlap_rounds", lambda x, y: pooled_overlap_pct(x) - pooled_overlap_pct(y)
            ),
            lambda lo, hi: hi >= 0,
            "zero2 − ddp, points",
        )
    return out


def _ratio_bounds(row: dict, ref: dict):
    """The ratio column's own interval (:func:`minddp.bench.report.ratio_interval`), if the row has one."""
    return None if row.get("ratio_lo") is None else (row["ratio_lo"], row["ratio_hi"])


def _bootstrap(rows, key: str, statistic):
    """Paired interval (by launch and round) of ``statistic`` over the rows' ``key`` series (None: none there)."""
    series = [r.get(key) for r in rows]
    rounds = rows[0].get("rounds") or 1
    if any(not s for s in series) or len({len(s) for s in series}) != 1:
        return None
    return paired_bootstrap(series, rounds, statistic, launches=launches_of(rows[0]) if rows[0].get("rounds") else None)


def _interval_text(t: dict) -> str:
    if t.get("interval") is None:
        return "–"
    lo, hi = t["interval"]
    return f"{lo:.3g} to {hi:.3g} ({t['quantity']})"


def targets_markdown(results: list[dict]) -> str:
    """The Targets table; the interval column is the judged quantity's 90 % interval (see the module doc)."""
    cell = {"yes": "yes", "no": "**no**", "within noise": "**no**, within noise"}
    lines = ["| target | measured | 90 % interval | met |", "|---|---|---|---|"]
    lines += [
        f"| {t['target']} | {t['measured']} | {_interval_text(t)} "
        f"| {cell[t.get('verdict', 'yes' if t['met'] else 'no')]} |"
        for t in results
    ]
    return "\n".join(lines)
