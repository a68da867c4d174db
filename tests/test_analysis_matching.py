"""Each queued all_reduce matched to the gloo range that ran it, when gloo's ranges are open at once.

ProcessGroupGloo runs its queue on more than one worker thread (two by default): the threads take the
collectives up in the order they were queued, but a range held open (until the other rank joins it) lets the
next ones open and end beside it. ``minddp.analysis.cpu.bucket_timeline`` pairs each ``c10d::allreduce_`` call
with the first free ``gloo:all_reduce`` of the same size that opened at or after it (docs/analysis.md, step 5).
The trace below is made by hand, each range tagged with the bucket it ran (a tag the analysis does not read), so
the test's oracle is the tag, not the matching.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import GLOO, MAIN, x

from minddp.analysis.cpu import bucket_timeline
from minddp.analysis.events import RankTrace

OTHER = GLOO + 1  # gloo's second worker thread

#: bucket -> (numel, queued at, gloo thread, range start, range end) in µs. Bucket 0's range is held open past all
#: the others (they open and end inside it, on the other thread); bucket 2 has bucket 0's size and ends first;
#: bucket 1's range is recorded opening 1 µs before bucket 0's (two threads taking two queued collectives up at
#: once: only the sizes tell which is which).
BUCKETS = {
    0: (1000, 10.0, GLOO, 23.0, 300.0),
    1: (500, 20.0, OTHER, 22.0, 60.0),
    2: (1000, 30.0, OTHER, 61.0, 100.0),
    3: (250, 40.0, OTHER, 101.0, 150.0),
}


def _trace(with_launch_ranges: bool) -> RankTrace:
    events = [x("ProfilerStep#1", 0.0, 400.0)]
    for bucket, (numel, queued, thread, start, end) in BUCKETS.items():
        if with_launch_ranges:  # minddp's stages: a launch range around the call
            events.append(x(f"minddp.bucket_launch#{bucket} numel={numel} dtype=float32 hook=h", queued - 1, 3.0))
        call = {"Input Dims": [[[numel]], []], "Input type": ["TensorList", ""]}
        events.append(x("c10d::allreduce_", queued, 1.0, tid=MAIN, **call))
        ran = {"Input Dims": [[numel]], "Input type": ["float"], "ran_bucket": bucket}  # the oracle's tag
        events.append(x("gloo:all_reduce", start, end - start, tid=thread, **ran))
    events.sort(key=lambda e: e["ts"])
    return RankTrace(rank=0, path=Path("rank0.pt.trace.json"), events=events)


@pytest.mark.parametrize("with_launch_ranges", [True, False], ids=["minddp-launch", "torch-reducer"])
def test_each_call_gets_its_own_range_when_ranges_overlap_and_end_out_of_order(with_launch_ranges):
    rows = bucket_timeline(_trace(with_launch_ranges))
    assert len(rows) == len(BUCKETS)
    for row, (bucket, (numel, queued, _, start, end)) in zip(rows, BUCKETS.items()):
        assert row["numel"] == numel
        assert row["ready_us"] == pytest.approx(queued - 1 if with_launch_ranges else queued)
        assert (row["comm_start_us"], row["comm_end_us"]) == (start, end), f"bucket {bucket}"
