"""The performance targets minddp holds itself to, checked on one benchmark run.

Each target compares rows of the same run (so machine noise hits both
sides), and is skipped when the run lacks a configuration it needs:

1. ``ddp`` and ``bucket-async``: median step time ≤ 1.05 × torch's DDP;
2. ``ddp`` exposes no more communication than torch's DDP (exposed comm =
   step − the same stage with ``noop_hook``), and hides at least as large a
   share of it (overlap %);
3. PowerSGD rank 1: at least 20 × fewer bytes per step than plain
   averaging, and a step ≤ 1.10 × torch's own ``powerSGD_hook``;
4. ``ddp`` with ``gradient_as_bucket_view``: peak memory per rank ≤ torch's
   with the same flag + 10 %;
5. the blog's ordering: ``simple`` is the slowest distributed stage and
   ``bucket-async`` the fastest of the blog's six.

A verdict is only as good as the run: read it next to the 90 % interval of
the ratio and the overlap's per-round range in the table.

Example::

    >>> for t in check_targets(rows): print(t["target"], t["measured"], t["met"])
"""

from __future__ import annotations

BLOG_STAGES = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]


def check_targets(rows: list[dict]) -> list[dict]:
    """Steps 1-5 on ``rows`` (from :func:`minddp.bench.report.summarize`); one dict per target."""
    by = {r["config"]: r for r in rows}
    out = []

    def add(target: str, needs: list[str], measure):
        if all(n in by and by[n].get("median_ms") is not None for n in needs):
            measured, met = measure(*(by[n] for n in needs))
            out.append({"target": target, "measured": measured, "met": bool(met)})

    for stage in ("ddp", "bucket-async"):                                                   # step 1
        add(f"{stage} step ≤ 1.05 × torch", [stage, "torch"],
            lambda a, t: (f"{a['ratio_to_torch']:.3f} × (90 % CI {a['ratio_lo']:.2f}–{a['ratio_hi']:.2f})",
                          a["ratio_to_torch"] <= 1.05))
    add("ddp exposed comm ≤ torch's", ["ddp", "torch", "ddp+noop", "torch+noop"],           # step 2
        lambda a, t, *_: (f"{a['exposed_comm_ms']:.2f} vs {t['exposed_comm_ms']:.2f} ms",
                          a["exposed_comm_ms"] <= t["exposed_comm_ms"]))
    if all(by.get(n, {}).get("overlap_pct") is not None for n in ("ddp", "torch")):
        add("ddp overlap ≥ torch's", ["ddp", "torch"],
            lambda a, t: (f"{a['overlap_pct']:.1f} vs {t['overlap_pct']:.1f} % (rounds {a['overlap_min_pct']:.0f}–"
                          f"{a['overlap_max_pct']:.0f} vs {t['overlap_min_pct']:.0f}–{t['overlap_max_pct']:.0f})",
                          a["overlap_pct"] >= t["overlap_pct"]))
    add("PowerSGD r1 bytes ≥ 20 × fewer than allreduce", ["ddp+powersgd-r1", "ddp"],        # step 3
        lambda p, a: (f"{a['allreduce_bytes_per_step'] / p['allreduce_bytes_per_step']:.1f} × fewer",
                      a["allreduce_bytes_per_step"] >= 20 * p["allreduce_bytes_per_step"]))
    add("PowerSGD r1 step ≤ 1.10 × torch's hook", ["ddp+powersgd-r1", "torch+powersgd-r1"],
        lambda p, t: (f"{p['ratio_to_torch']:.3f} × (90 % CI {p['ratio_lo']:.2f}–{p['ratio_hi']:.2f})",
                      p["ratio_to_torch"] <= 1.10))
    if all(by.get(n, {}).get("peak_mib") is not None for n in ("ddp+gabv", "torch+gabv")):  # step 4
        add("ddp gradient_as_bucket_view memory ≤ torch's + 10 %", ["ddp+gabv", "torch+gabv"],
            lambda a, t: (f"{a['peak_mib']:.2f} vs {t['peak_mib']:.2f} MiB", a["peak_mib"] <= 1.10 * t["peak_mib"]))
    distributed = [n for n in BLOG_STAGES + ["ddp", "torch"] if n in by]                     # step 5
    if "simple" in by and len(distributed) > 1:
        slowest = max(distributed, key=lambda n: by[n]["median_ms"])
        add("simple is the slowest distributed stage", ["simple"],
            lambda s: (f"slowest: {slowest} ({by[slowest]['median_ms']:.1f} ms)", slowest == "simple"))
    blog = [n for n in BLOG_STAGES if n in by]
    if "bucket-async" in by and len(blog) > 1:
        fastest = min(blog, key=lambda n: by[n]["median_ms"])
        runner_up = min((n for n in blog if n != "bucket-async"), key=lambda n: by[n]["median_ms"])
        add("bucket-async is the fastest of the blog's stages", ["bucket-async"],
            lambda b: (f"bucket-async {b['median_ms']:.1f} ms, next {runner_up} {by[runner_up]['median_ms']:.1f} ms",
                       fastest == "bucket-async"))
    return out


def targets_markdown(results: list[dict]) -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |" for t in results]
    return "\n".join(lines)
