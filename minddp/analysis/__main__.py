"""The analysis CLI: ``python -m minddp.analyze traces/<run> [--report] [--compare RUN_A RUN_B]``.

1. analyse each run folder (GPU traces through HTA, CPU/gloo traces through
   minddp's own analysis: :mod:`minddp.analysis`); a run folder is one the train
   command wrote, or any folder of per-rank profiler traces
   (:mod:`minddp.analysis.events` finds them and their ranks);
2. print the stages side by side (with ``--compare``: metric by metric, run A
   next to run B);
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

from minddp.runtime.cli import Parser, UsageError, fail

PROG = "minddp.analyze"
SHOWN = [
    "step_time_us",
    "compute_pctg",
    "non_compute_pctg",
    "idle_pctg",
    "comm_comp_overlap_pctg",
    "allreduce_calls_per_step",
    "allreduce_bytes_per_step",
    "allgather_calls_per_step",
    "reducescatter_calls_per_step",
    "comm_time_per_step_us",
]


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
    """Two runs of one stage each, named differently (two folders of traces, two stages): one row, "A vs B".

    Runs of several stages are compared stage by stage, as they are.
    """
    names = [list(r.stages.index) for r in results]
    if any(len(n) != 1 for n in names) or names[0] == names[1]:
        return results
    label = f"{names[0][0]} vs {names[1][0]}"

    def relabel(frame):
        if "stage" in frame.columns:
            frame = frame.assign(stage=label)
        return frame.rename(index={frame.index[0]: label}) if frame.index.name == "stage" and len(frame) else frame

    return [
        replace(
            r,
            **{f: relabel(getattr(r, f)) for f in ("summary", "stages", "per_step", "kernels", "buckets", "phases")},
        )
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
    import pandas as pd

    from minddp.analysis import TraceError, analyze_run, compare_runs
    from minddp.analysis.report import write_report

    try:
        if args.compare:  # step 1
            results = [analyze_run(p) for p in args.compare]
            if results[0].run == results[1].run:  # same name: tell them apart in tables and legends
                results = [replace(r, run=f"{tag}:{r.run}") for tag, r in zip("AB", results)]
            results = one_row(results)
            table = compare_runs(*results)
            out_dir = Path(args.compare[0]) / f"compare-{Path(args.compare[1]).name}"
        else:
            results = [analyze_run(args.run)]
            table = results[0].stages
            out_dir = Path(args.run)
    except TraceError as exc:
        return fail(PROG, exc, parser)
    from minddp.analysis.report import readable

    with pd.option_context("display.width", 250, "display.max_columns", 50):  # step 2
        if args.compare:
            print(readable(table[[c for c in table.columns if c[0] in SHOWN]]).round(2).to_string())
        else:
            print(f"run {results[0].run}: stages side by side (mean over ranks)")
            print(readable(table[SHOWN]).round(2).to_string())
    if args.report:  # step 3
        page = write_report(results, out_dir)
        print(f"report: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
