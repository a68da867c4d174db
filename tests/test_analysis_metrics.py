"""Metric definitions on intervals and on hand-made traces with answers worked out by hand."""

import math
import random

import pytest
from analysis_fixtures import half_covered_step, write_stage

from minddp.analysis import analyze_run, metrics


def _cover(intervals, grid):
    """Oracle: the set of unit cells of a 0..grid line that some interval covers."""
    return {t for s, e in intervals for t in range(grid) if s <= t and t + 1 <= e}


def _random_set(rng, most, last_start, lengths):
    """Up to ``most`` intervals with integer ends, starting in 0..last_start, of a length drawn from ``lengths``."""
    out = []
    for _ in range(rng.randint(0, most)):
        s = rng.randint(0, last_start)
        out.append((s, s + rng.randint(*lengths)))
    return out


def test_interval_algebra_matches_a_brute_force_grid():
    rng = random.Random(0)
    for _ in range(200):
        a, b = _random_set(rng, 5, 30, (0, 10)), _random_set(rng, 5, 30, (0, 10))
        ca, cb = _cover(a, 50), _cover(b, 50)
        assert metrics.length(a) == len(ca)
        assert metrics.length(metrics.intersect(a, b)) == len(ca & cb)
        assert metrics.length(metrics.subtract(a, b)) == len(ca - cb)
        assert metrics.length(a + b) == len(ca | cb)


def _runs(cells):
    """Oracle: a set of unit cells as its maximal runs of consecutive cells, ``(start, end)`` in floats."""
    out = []
    for t in sorted(cells):
        if out and out[-1][1] == t:
            out[-1][1] = t + 1
        else:
            out.append([t, t + 1])
    return [(float(s), float(e)) for s, e in out]


def test_interval_sets_are_exactly_the_covered_cells_and_stay_merged():
    # integer ends, so each result is exactly the runs of cells it covers (touching intervals joined);
    # up to 12 intervals a set, so one interval of b often spans several of a and the other way round
    rng = random.Random(1)
    for _ in range(300):
        # lengths from -2: some empty or reversed, which are dropped
        a, b = _random_set(rng, 12, 40, (-2, 8)), _random_set(rng, 12, 40, (-2, 8))
        ca, cb = _cover(a, 60), _cover(b, 60)
        for got, cells in [
            (metrics.merge(a), ca),
            (metrics.intersect(a, b), ca & cb),
            (metrics.subtract(a, b), ca - cb),
            (metrics.subtract(b, a), cb - ca),
        ]:
            assert got == _runs(cells)
            assert metrics.merge(got) == got  # merged already, merge gives it back unchanged
            assert metrics.merge(list(got)) == got  # and sorting it afresh finds the same


def test_half_covered_comm_is_50_percent_overlap():
    assert metrics.overlap_pct(comm=[(0, 10)], compute=[(5, 20)]) == 50.0
    assert metrics.overlap_pct(comm=[(0, 10)], compute=[]) == 0.0
    assert metrics.overlap_pct(comm=[], compute=[(0, 10)]) == 0.0
    assert metrics.overlap_pct(comm=[(0, 4), (6, 10)], compute=[(0, 10)]) == 100.0


def test_breakdown_parts_add_up_and_clip_to_the_window():
    b = metrics.breakdown(window=[(0, 10)], compute=[(-5, 4)], comm=[(2, 8), (9, 30)])
    # compute inside the window: 0..4; comm not under compute: 4..8 and 9..10; idle: 8..9
    assert (b["compute_time_us"], b["non_compute_time_us"], b["idle_time_us"]) == (4, 5, 1)
    assert b["compute_pctg"] + b["non_compute_pctg"] + b["idle_pctg"] == pytest.approx(100)


def test_hand_made_trace_gives_the_hand_computed_numbers(tmp_path):
    run = tmp_path / "handmade"
    events = {0: half_covered_step(), 1: half_covered_step(offset=3)}
    write_stage(run / "simple", events, stage="simple", world_size=2, run_name="handmade")
    result = analyze_run(run)
    row = result.summary.iloc[0]
    assert (row["device"], row["source"], row["rank"]) == ("cpu", "minddp", 0)
    assert row["total_time_us"] == 100
    assert row["compute_time_us"] == 40
    assert row["non_compute_time_us"] == 20
    assert row["idle_time_us"] == 40
    assert row["comm_comp_overlap_pctg"] == 50
    assert row["allreduce_calls_per_step"] == 1
    assert row["allreduce_bytes_per_step"] == 10 * 4
    assert row["comm_time_per_step_us"] == 40
    assert row["step_time_us"] == 100
    bucket = result.buckets[result.buckets["rank"] == 1].iloc[0]
    assert (bucket["bucket"], bucket["numel"], bucket["hook"]) == (0, 10, "allreduce_hook")
    assert (bucket["ready_us"], bucket["launched_us"]) == (15, 25)
    assert (bucket["comm_start_us"], bucket["comm_end_us"]) == (20, 60)
    kinds = dict(zip(result.kernels["kernel_type"], result.kernels["sum"]))
    assert kinds == {"COMPUTATION": 20, "COMMUNICATION": 20, "COMPUTATION overlapping COMMUNICATION": 20}
    assert not math.isnan(result.stages.loc["simple", "comm_comp_overlap_pctg"])
