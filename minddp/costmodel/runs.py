"""``python -m minddp.model predict RUN``: a run's profiled steps replayed on other links and rank counts.

Profile once on the machine at hand, ask about the network you do not have::

    $ python -m minddp.train --stage all --steps 12 --link loopback      # traces with the link's ranges
    $ python -m minddp.model predict traces/<run> --links 100mbit,1gbit,10gbit --ranks 2,8

For each stage folder of the run and each rank's trace, every profiled step
becomes a :class:`~minddp.costmodel.step.StepProfile` (:mod:`minddp.costmodel.trace`);
the table gives, per stage, the profiled step (median over steps, mean over
ranks) and the median predicted step, exposed communication and overlap on
each link, at the run's rank count and at each ``--ranks`` (the same
per-rank work on more ranks). ``--real-network`` drops what belongs to this
machine (its real collectives' times, the emulation's delivery delay): a
forecast for real hardware rather than for this emulator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minddp.costmodel.step import predict
from minddp.costmodel.trace import ProfileError, step_profiles


def predict_run(run: Path, links: list[str], ranks: list[int], real_network: bool) -> list[dict]:
    from minddp.analysis import stage_sort_key

    rows = []
    for folder in sorted((p for p in run.iterdir() if p.is_dir()), key=lambda p: stage_sort_key(p.name)):
        config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
        traces = sorted(folder.glob("rank*.pt.trace.json*"))
        stage, world = config.get("stage", folder.name), int(config.get("ranks", len(traces)))
        if not traces or stage == "single":
            continue
        profiles = []
        for path in traces:
            rank = int(path.name[4:].split(".")[0])
            profiles += step_profiles(path, stage, world, rank)
        if real_network:
            profiles = [p.on_real_network() for p in profiles]
        for n in [world, *[r for r in ranks if r != world]]:
            for link in links:
                preds = sorted((predict(p, link, n) for p in profiles), key=lambda x: x.step)
                mid = preds[(len(preds) - 1) // 2]
                rows.append({"stage": stage, "ranks": n, "link": link, **mid.row()})
    return rows


def main(argv: list[str]) -> int:
    from minddp.comm.link import parse_links
    from minddp.runtime.cli import Parser, described

    p = Parser(prog="python -m minddp.model predict", description=described(__doc__))
    p.add_argument("run", help="a run folder written by python -m minddp.train --link ... (traces/<run>)")
    p.add_argument("--links", default="100mbit,1gbit,10gbit,100gbit-ib")
    p.add_argument("--ranks", default="", help="comma list of rank counts besides the run's own")
    p.add_argument("--real-network", action="store_true", help="forecast real hardware (see the module doc)")
    ns = p.parse_args(argv)
    try:
        links = [spec.name for spec in parse_links(ns.links)]
        ranks = [int(x) for x in ns.ranks.split(",") if x]
        run = Path(ns.run)
        if not run.is_dir():
            raise ProfileError(f"{run} is not a folder: pass traces/<run> from python -m minddp.train --link ...")
        rows = predict_run(run, links, ranks, ns.real_network)
    except (ValueError, OSError) as exc:
        print(f"minddp.model predict: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(
        f"{'stage':<13}{'ranks':>6} {'link':<12}{'compute (ms)':>13}{'step (ms)':>11}{'exposed (ms)':>13}"
        f"{'overlap (%)':>12}{'comm share (%)':>15}"
    )
    for r in rows:
        print(
            f"{r['stage']:<13}{r['ranks']:>6} {r['link']:<12}{r['compute_ms']:>13.1f}{r['step_ms']:>11.1f}"
            f"{r['exposed_ms']:>13.1f}{r['overlap_pct']:>12.0f}{r['comm_share_pct']:>15.0f}"
        )
    print("overlap = share of communication time under compute; comm share = communication time over the step")
    return 0
