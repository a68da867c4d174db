"""One vocabulary, one function per measure (docs/analysis.md, "The measures").

Each measure of :mod:`minddp.analysis.metrics` is checked against an independent oracle (unit cells of a line,
counted by hand), then followed through everything that shows it: the per-step table of a hand-made trace over an
emulated link (every number worked out by hand in ``analysis_fixtures.linked_step``), the console's verdict and the
report's page, a live step row. Last, the source itself: no module but ``metrics`` turns a set of spans into a time,
every function named after a measure elsewhere hands over to the one in ``metrics``, and the table in
docs/analysis.md names each measure's function once.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from analysis_fixtures import linked_step, write_stage

from minddp.analysis import analyze_run, metrics
from minddp.analysis.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
#: The measures, by their function in metrics.
MEASURES = ["in_flight", "non_compute", "overlap_pct", "interleaved", "waited", "exposed", "link_time", "comm_cost"]


def _cells(intervals):
    """Oracle: the unit cells of the line that some interval covers (intervals with integer ends)."""
    return {t for s, e in intervals for t in range(int(s), int(e))}


def _random_set(rng, most=5):
    out = []
    for _ in range(rng.randint(0, most)):
        start = rng.randint(0, 40)
        out.append((start, start + rng.randint(1, 12)))
    return out


def test_each_measure_is_its_definition_on_random_sets():
    """Against the cells each set covers: |comm ∩ W|, |(comm ∖ compute) ∩ W|, the share under compute,
    |(comm ∖ compute) ∩ backward|, |waits ∩ W|, |link ∩ waits ∩ W|."""
    rng = random.Random(0)
    for _ in range(300):
        window, compute, comm, backward, waits, link = (_random_set(rng) for _ in range(6))
        w, c, m, b, wt, ln = (_cells(x) for x in (window, compute, comm, backward, waits, link))
        assert metrics.in_flight(comm, window) == len(m & w)
        assert metrics.in_flight(comm) == len(m)
        assert metrics.non_compute(window, compute, comm) == len((m - c) & w)
        assert metrics.overlap_pct(comm, compute, window) == pytest.approx(
            100 * len(m & c & w) / len(m & w) if m & w else 0.0
        )
        assert metrics.interleaved(comm, compute, backward) == len((m - c) & b)
        assert metrics.waited(waits, window) == len(wt & w)
        assert metrics.exposed(link, waits, window) == len(ln & wt & w)


def test_overlap_pools_as_one_ratio_and_link_time_adds_the_models_messages():
    parts = [metrics.overlap_parts([(0, 10)], [(0, 5)]), metrics.overlap_parts([(0, 30)], [])]  # 5 of 10, 0 of 30
    assert parts == [(5.0, 10.0), (0.0, 30.0)]
    assert metrics.pooled_overlap_pct(parts) == 12.5  # 5 of 40: not the mean of 50 % and 0 %
    assert metrics.pooled_overlap_pct([]) == 0.0

    class Priced:  # 1 s a message plus 1 s a byte
        def seconds(self, kind, nbytes, ranks):
            return 1.0 + nbytes

    assert metrics.link_time(Priced(), [("all_reduce", 2, 2), ("all_reduce", 3, 2)]) == 7.0


@pytest.fixture(scope="module")
def linked_run(tmp_path_factory):
    """The hand-made step of ``linked_step`` on two ranks (the second 1 µs later), as a run folder ``linked``."""
    run = tmp_path_factory.mktemp("measures") / "linked"
    write_stage(run / "hook", {0: linked_step(), 1: linked_step(1.0)}, stage="hook", world_size=2, run_name="linked")
    return run


#: linked_step's measures, worked out by hand (ms).
BY_HAND = {"in flight": 34.0, "non-compute": 22.0, "interleaved": 10.0, "waited": 7.0, "exposed": 3.0}
OVERLAP = 100 * 12 / 34


def test_the_trace_analysis_reads_every_measure_off_a_linked_step(linked_run):
    step = analyze_run(linked_run).per_step.iloc[0]
    got = {
        "in flight": step["comm_time_us"],
        "non-compute": step["non_compute_us"],
        "interleaved": step["interleaved_us"],
        "waited": step["waited_us"],
        "exposed": step["exposed_us"],
    }
    assert {k: v / 1e3 for k, v in got.items()} == BY_HAND
    assert step["overlap_pctg"] == pytest.approx(OVERLAP)


def test_a_trace_without_a_link_leaves_waited_and_exposed_unknown(tmp_path):
    """No link transfer records a wait: the trace cannot say how long the thread waited, so it does not say 0."""
    events = [e for e in linked_step() if not e["name"].startswith("minddp.link")]
    write_stage(tmp_path / "plain" / "hook", {0: events}, stage="hook", world_size=1, run_name="plain")
    step = analyze_run(tmp_path / "plain").per_step.iloc[0]
    assert step[["waited_us", "exposed_us"]].isna().all()
    assert step["non_compute_us"] == 6e3  # by hand: comm is gloo's 28..36 alone, compute covers 28..30


def test_the_command_and_the_report_show_the_numbers_the_functions_give(linked_run, capsys):
    """The verdict's row, in the console and on the page, holds the measures of the trace's own sets, computed by
    metrics' functions here, which are the hand-made numbers."""
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_run

    iv = rank_intervals(load_run(linked_run).stages["hook"].ranks[0])
    window = [(s, e) for _, s, e in iv.steps]
    backward = [(20e3, 50e3)]
    functions = {
        "non-compute": metrics.non_compute(window, iv.compute, iv.comm),
        "waited": metrics.waited(iv.waits, window),
        "exposed": metrics.exposed(iv.link, iv.waits, window),
        "interleaved": metrics.interleaved(iv.comm, iv.compute, backward),
        "in flight": metrics.in_flight(iv.comm, window),
    }
    assert {k: v / 1e3 for k, v in functions.items()} == BY_HAND

    assert main([str(linked_run), "--report"]) == 0
    console = capsys.readouterr().out.splitlines()
    header = next(line for line in console if line.lstrip().startswith("# stage"))
    row = next(line for line in console if re.match(r"^\s*1 hook\b", line))
    assert "waited (ms)" in header and "exposed (ms)" in header and "overlap (%)" in header
    # rank, stage, non-compute (with its spread), step, rank by step, overlap, in backward, waited, exposed
    cells = row.split()
    assert cells[2] == "22.0" and cells[-2:] == ["7.0", "3.0"] and cells[-4] == f"{OVERLAP:.0f}", row
    page = (linked_run / "report.html").read_text()
    ranking = page[page.index("<table class='ranking'") : page.index("</table>", page.index("<table class='ranking'"))]
    heads = re.findall(r"<th[^>]*>(.*?)</th>", ranking)
    tds = dict(zip(heads, re.findall(r"<td[^>]*>(.*?)</td>", ranking)))
    assert tds["non-compute (ms)"].startswith("22.0 (") and tds["overlap (%)"].startswith(f"{OVERLAP:.0f} (")
    assert tds["waited (ms)"].startswith("7.0 (") and tds["exposed (ms)"].startswith("3.0 (")


def test_the_report_and_the_command_call_the_measure_functions(linked_run, monkeypatch, capsys):
    """Each measure the page and the console show is computed by its function in metrics: with each one counted,
    one run of the command with --report calls every one."""
    calls = dict.fromkeys(MEASURES[:-2], 0)  # all but link time and comm cost, which a trace does not give
    for name in calls:
        real = getattr(metrics, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(metrics, name, counted)
    assert main([str(linked_run), "--report"]) == 0
    capsys.readouterr()
    assert all(calls.values()), calls


def test_a_live_step_over_a_link_measures_with_the_same_functions():
    """``live.step_view``'s link part, on a fake profiler and link: one message carried 10..30 ms (modeled), waited
    for from 25 ms to its delivery at 32 ms, backward 0..20 ms: waited 7, exposed 5 (the link's 25..30)."""
    from minddp.analysis.live import _on_link

    def event(name, start_us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=start_us))

    s = 1e-3  # the link logs seconds; the marker below puts its clock on the profiler's (µs) with offset 0
    log = [{"seq": 0, "kind": "all_reduce", "bytes": 4, "ranks": 2}]
    log[0].update(handed_over=10 * s, start=10 * s, modeled_end=30 * s, delivered=32 * s)
    link = SimpleNamespace(log=log, asked={0: 25 * s}, spec=SimpleNamespace(name="fake"), seconds=lambda *a: 20 * s)
    row = {"sent": [], "waits": [], "messages": []}
    seen = _on_link([event("minddp.link_send#0", 10e3)], link, row, 0.0, [(0.0, 20e3)])
    assert (seen["link_ms"], seen["waited_ms"], seen["exposed_ms"]) == pytest.approx((20.0, 7.0, 5.0))
    assert row["link"] == "fake" and row["waits"] == [(25.0, 32.0)]
    from minddp.analysis.timeline import row_measures

    both = row_measures(dict(row, forward=[], backward=[(0.0, 20.0)], end=40.0))
    assert (both["waited_ms"], both["exposed_ms"]) == pytest.approx((seen["waited_ms"], seen["exposed_ms"]))


def test_a_wait_is_inside_a_backward_by_its_own_range_on_the_backwards_clock():
    """Claims audit (round 19) entry 7: ``waits_in_backward`` reads each first wait's start off its
    ``minddp.link_wait#<n>`` range (the training thread, the profiler's clock), not off ``perf_counter`` mapped
    there through the send markers' median offset. Here the mapping is 1 ms off: it puts message 0's wait at
    19.5 ms, inside the 0..20 ms backward, though its range starts at 20.5 ms, after the backward's last node;
    message 1's range starts at 15 ms, inside it."""
    from minddp.analysis.live import _on_link

    def event(name, start_us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=start_us))

    s = 1e-3
    log = [{"seq": n, "kind": "all_reduce", "bytes": 4, "ranks": 2} for n in (0, 1)]
    for m, at in zip(log, (5, 10)):
        m.update(handed_over=at * s, start=at * s, modeled_end=(at + 1) * s, delivered=22 * s)
    link = SimpleNamespace(log=log, asked={0: 19.5 * s, 1: 14 * s}, spec=SimpleNamespace(name="fake"),
                           seconds=lambda *a: 1 * s)  # fmt: skip
    events = [event("minddp.link_send#0", 5e3), event("minddp.link_send#1", 10e3)]
    events += [event("minddp.link_wait#0", 20.5e3), event("minddp.link_wait#1", 15e3)]
    seen = _on_link(events, link, {"sent": [], "waits": [], "messages": []}, 0.0, [(0.0, 20e3)])
    assert (seen["waits"], seen["waits_in_backward"]) == (2, 1)


def _other_nodes():
    """``(place, node)`` for every syntax node of every package module but metrics.py."""
    home = ROOT / "minddp" / "analysis" / "metrics.py"
    for path in sorted((ROOT / "minddp").rglob("*.py")):
        if path != home:
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}", node


def test_no_module_but_metrics_turns_spans_into_a_time():
    """The interval algebra's ``length`` (a set of spans -> the time it covers) is where every measured time comes
    from: outside metrics.py no module calls or imports it, so none can compute a measure a second way."""
    found = []
    for place, node in _other_nodes():
        if isinstance(node, ast.Attribute) and node.attr == "length" and getattr(node.value, "id", "") == "metrics":
            found.append(place)
        if isinstance(node, ast.ImportFrom) and node.module == "minddp.analysis.metrics":
            found += [place for a in node.names if a.name == "length"]
    assert not found, f"a time computed outside minddp.analysis.metrics: {found}"


def test_a_function_named_after_a_measure_hands_over_to_metrics():
    """Outside metrics.py, a function or property named like a measure (a look's, the step-time model's, a lesson's
    measure in its unit: ``link_ms`` for link time in ms, ``exposed_ms``) calls the one in metrics
    (``metrics.<name>``) rather than computing it again."""
    names = set(MEASURES) | {"non_compute_pct", "pooled_overlap_pct", "overlap_parts"}
    units = ("ms", "s", "seconds", "pct")
    named = (
        names
        | {f"{m.removesuffix('_time')}_{u}" for m in MEASURES for u in units}
        | {f"{m}_{u}" for m in MEASURES for u in units}
    )
    found = []
    for place, node in _other_nodes():
        if isinstance(node, ast.FunctionDef) and node.name in named:
            called = {
                n.func.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in names
            }
            if not called:
                found.append(f"{place} {node.name}")
    assert not found, f"a measure defined again: {found}"


def _doc_table() -> list[str]:
    """The rows of docs/analysis.md's table of measures (header and rule left out)."""
    doc = (ROOT / "docs" / "analysis.md").read_text()
    section = doc[doc.index("## The measures") :]
    section = section[: section.index("\n## ", 3)]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]


def test_the_vocabulary_table_names_each_measure_once():
    """docs/analysis.md's table of measures: one row a measure, each naming its function in metrics, which exists;
    every measure function of metrics has its row."""
    rows = _doc_table()
    named = [re.search(r"`metrics\.(\w+)\(", row).group(1) for row in rows]
    assert sorted(named) == sorted(MEASURES), named
    for name in named:
        assert callable(getattr(metrics, name))
    for row in rows:
        assert len(row.strip("|").split(" | ")) == 4, row  # name, definition, function, unit


def test_notebook_01_holds_the_docs_table_word_for_word():
    """One vocabulary: the table notebook 01 teaches (a markdown cell of its jupytext source) is docs/analysis.md's,
    header and rows, so a definition cannot drift in one place only."""
    source = (ROOT / "notebooks" / "01_collectives.py").read_text().splitlines()
    cells = [line[2:] for line in source if line.startswith("# | ")]
    header = "| name | definition | function | unit |"
    assert header in cells, "notebook 01 lost its table of measures"
    start = cells.index(header)
    rows = [line for line in cells[start + 2 : start + 2 + len(_doc_table())]]
    assert rows == _doc_table()


def test_the_benchmarks_comm_cost_is_the_measure_function(monkeypatch):
    """The benchmark's comm cost column (a stage's median step minus the same stage's with noop_hook) is computed by
    metrics.comm_cost, not by a subtraction of its own: with the function replaced, the column follows it."""
    from minddp.bench import report
    from minddp.bench.configs import BenchConfig

    monkeypatch.setattr(metrics, "comm_cost", lambda step, free_step: 1000 * step + free_step)  # a tell-tale
    configs = [BenchConfig("ddp", "ddp", noop="ddp+noop"), BenchConfig("ddp+noop", "ddp", hook="noop")]
    sample = {"cpu": [0.001] * 3, "overlap": [(1.0, 2.0)], "calls": [1] * 3, "bytes": [4] * 3}
    rows = report.summarize(
        configs, [{"ddp": {**sample, "times": [0.012] * 3}, "ddp+noop": {**sample, "times": [0.010] * 3}}]
    )
    assert rows[0]["comm_cost_ms"] == pytest.approx(1000 * 12.0 + 10.0)
    assert rows[1]["comm_cost_ms"] is None  # no noop twin of its own
