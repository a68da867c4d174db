"""The analysis CLI: ``python -m minddp.analyze traces/<run> [--report] [--compare RUN_A RUN_B]``.

1. analyse each run folder (GPU traces through HTA, CPU/gloo traces through
   minddp's own analysis: :mod:`minddp.analysis`); a run folder is one the train
   command wrote, or any folder of per-rank profiler traces
   (:mod:`minddp.analysis.events` finds them and their ranks); two folders of one
   stage each are compared as one stage (:func:`one_row`);
2. print, in at most 120 columns, the verdict (the stages ranked by non-compute
   time and step time, with their spread and why: :mod:`minddp.analysis.verdict`)
   and the stages side by side; with ``--compare``, what changed between the runs
   (settings, then A, B, Δ and B/A per stage and number: :mod:`minddp.analysis.compare`);
   each the same block the report's page shows (:mod:`minddp.analysis.blocks`);
3. with ``--report``, write ``report.html`` and PNG plots into the run folder
   (with ``--compare``, into RUN_A's folder under ``compare-<B>/``).

Bad input (missing or empty folder, truncated trace, traces of different
runs mixed) prints one line naming the problem and exits with status 2.

Example::

    $ python -m minddp.analyze traces/demo --report
    $ python -m minddp.analyze --compare traces/allreduce traces/powersgd --report
    $ python -m minddp.analyze my_torch_traces/     # rank traces of any torch job, named anyhow
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from minddp.analysis.names import KINDS, STARRED
from minddp.runtime.cli import Parser, UsageError, fail

PROG = "minddp.analyze"
#: The side-by-side columns the console prints (120 columns at most), with their console headers, short enough to
#: fit (report.html and stages.csv hold every column, spelled out).
SHORT = {
    "step_time_us": "step ms",
    "compute_pctg": "compute %",
    "non_compute_pctg": "non-comp %",
    "idle_pctg": "idle %",
    "comm_comp_overlap_pctg": "overlap %",
    **{f"{kind.key}_calls_per_step": kind.short for kind in KINDS},
    "comm_time_per_step_us": "comm ms",
}
SHOWN = list(SHORT)


EXAMPLES = [
    "python -m minddp.analyze traces/demo                 # the stages of one run side by side",
    "python -m minddp.analyze traces/demo --report        # and report.html + PNG plots in traces/demo",
    "python -m minddp.analyze --compare traces/allreduce traces/powersgd --report",
    "python -m minddp.analyze my_traces/          # any folder of per-rank torch profiler traces (*.json[.gz])",
    "python -m minddp.analyze --compare my_traces/ traces/demo/ddp   # one folder of traces against one stage",
]


def build_parser() -> Parser:
    p = Parser(
        prog="python -m minddp.analyze",
        usage="python -m minddp.analyze (RUN | --compare RUN_A RUN_B) [--report]",
        description="Trace metrics of a run written by python -m minddp.train, or of any folder of "
        "per-rank torch profiler traces (GPU traces through HolisticTraceAnalysis, CPU traces through "
        "minddp's own analysis). Bad input exits with code 2.",
        examples=EXAMPLES,
    )
    what = p.add_argument_group("what to analyse (one of)")
    what.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="a run folder, traces/<run> (or one stage folder of it), or any folder of per-rank profiler traces "
        "(the rank of each from its distributedInfo, else from rank<N> in its name)",
    )
    what.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="put two runs side by side")
    out = p.add_argument_group("outputs")
    out.add_argument(
        "--report",
        action="store_true",
        help="write report.html and PNG plots into the run folder (with --compare: into RUN_A/compare-<RUN_B>/)",
    )
    return p


def one_row(results: list) -> list:
    """Two runs of one stage each, named differently, compared as one stage: two stage folders (``ddp vs
    bucket``), or two folders of traces, whose one stage is named as the folder (``traces``: the runs are A and B).

    Runs of several stages are compared stage by stage, as they are.
    """
    names = [list(r.stages.index) for r in results]
    if any(len(n) != 1 for n in names) or names[0] == names[1]:
        return results
    bare = all(n[0] == r.run.split(":", 1)[-1] for n, r in zip(names, results))
    label = "traces" if bare else f"{names[0][0]} vs {names[1][0]}"

    def relabel(frame):
        if "stage" in frame.columns:
            frame = frame.assign(stage=label)
        return frame.rename(index={frame.index[0]: label}) if frame.index.name == "stage" and len(frame) else frame

    tables = ("summary", "stages", "per_step", "kernels", "buckets", "phases")
    return [
        replace(r, configs={label: c for c in r.configs.values()}, **{t: relabel(getattr(r, t)) for t in tables})
        for r in results
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if (args.run is None) == (args.compare is None):
            parser.error("give one run folder, or --compare RUN_A RUN_B")
    except UsageError as exc:
        return fail(PROG, exc, parser)
    from minddp.analysis import TraceError, analyze_run
    from minddp.analysis.report import write_report

    try:
        if args.compare:  # step 1
            results = [analyze_run(p) for p in args.compare]
            if results[0].run == results[1].run:  # same name: tell them apart in tables and legends
                results = [replace(r, run=f"{tag}:{r.run}") for tag, r in zip("AB", results)]
            results = one_row(results)
            out_dir = Path(args.compare[0]) / f"compare-{Path(args.compare[1]).name}"
        else:
            results = [analyze_run(args.run)]
            out_dir = Path(args.run)
    except TraceError as exc:
        return fail(PROG, exc, parser)
    print_tables(results)  # step 2
    if args.report:  # step 3
        page = write_report(results, out_dir)
        print(f"report: {page}")
    return 0


def print_tables(results) -> None:
    """Step 2, at most 120 columns: one run's verdict and side-by-side table, or two runs' differences."""
    from minddp.analysis.blocks import console_lines
    from minddp.analysis.compare import changes_block
    from minddp.analysis.verdict import verdict_block

    if len(results) == 2:
        print("\n".join(console_lines(changes_block(*results))))
        print("the same per run, and the figures: add --report")
        return
    result = results[0]
    print("\n".join(console_lines(verdict_block(result))))
    table = result.stages[SHOWN].rename(columns=SHORT)
    for column in SHOWN:
        header, factor = SHORT[column], 1e-3 if column.endswith("_us") else 1.0
        table[header] = (table[header] * factor).round(1)
    print(f"\nrun {result.run}: stages side by side, means over ranks of the profiled steps (calls per step)")
    print(table.to_string())
    print(STARRED)
    print("every column, and the figures: add --report (report.html, stages.csv)")


if __name__ == "__main__":
    sys.exit(main())
