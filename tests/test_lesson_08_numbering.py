"""Notebook 08's "collectives, numbered" lines: two ranks' listings part exactly where their calls differ."""

from minddp.debug.collective_check import Call
from minddp.notebook.lesson_08 import numbering, stretches


def _all_reduce(n: int, seq: int) -> Call:
    return Call(
        "all_reduce", [["tensor", f"float32[{n}]"], ["op", "SUM"]], ["float32"], [[n]], seq=seq, step=3, after=True
    )


def test_calls_that_differ_only_in_shape_make_different_stretches():
    rank_0, rank_1 = stretches([_all_reduce(2, 141)]), stretches([_all_reduce(1, 141)])
    assert rank_0 != rank_1  # the listing compares what the collective check compares: op, dtypes and shapes
    assert "all_reduce(float32[2], op=SUM) (after step 3)" in numbering(rank_0)
    assert "all_reduce(float32[1], op=SUM) (after step 3)" in numbering(rank_1)
    assert numbering(rank_0).startswith("#0–#140 before this run")


def test_equal_calls_make_equal_stretches():
    assert stretches([_all_reduce(2, 5)]) == stretches([_all_reduce(2, 5)])
