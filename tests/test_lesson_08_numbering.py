"""Notebook 08's "collectives, numbered" lines: two ranks' listings part exactly where their calls differ."""

from minddp.debug.collective_check import Call
from minddp.notebook.lesson_08 import numbering, parted, stretches


def _all_reduce(n: int, seq: int) -> Call:
    return Call(
        "all_reduce", [["tensor", f"float32[{n}]"], ["op", "SUM"]], ["float32"], [[n]], seq=seq, step=3, after=True
    )


def test_calls_that_differ_only_in_shape_make_different_stretches():
    rank_0, rank_1 = stretches([_all_reduce(2, 141)]), stretches([_all_reduce(1, 141)])
    assert rank_0 != rank_1  # the listing compares what the collective check compares: op, dtypes and shapes
    assert "all_reduce(float32[2], op=SUM) (after step 3 of a wrapper from before this run)" in numbering(rank_0)
    assert "all_reduce(float32[1], op=SUM) (after step 3 of a wrapper from before this run)" in numbering(rank_1)
    assert numbering(rank_0).startswith("#0–#140 before this run")


def test_a_step_is_said_to_be_an_earlier_wrappers_only_when_the_run_made_no_wrapper_call():
    # notebook 08's section 4: a lone all_reduce after section 3's wrapper took its steps 0-3 said "(after step 3)",
    # and a reader took step 3 for one of this cell's. Here a wrapper of this run makes a call first: its step.
    check = Call("all_gather", [["tensor", "int64[8]"]], ["int64"], [[8]], seq=7, step=0)
    check.where, check.ours = "<In [1], rank 0>:3 in minddp debug's forward check of DistributedDataParallel", True
    listed = numbering(stretches([check, _all_reduce(2, 8)]))
    assert listed.endswith("#8 the script's all_reduce(float32[2], op=SUM) (after step 3)")
    assert "before this run)" not in listed


def test_equal_calls_make_equal_stretches():
    assert stretches([_all_reduce(2, 5)]) == stretches([_all_reduce(2, 5)])


def test_a_rank_parts_from_rank_0_at_the_first_call_that_differs_not_at_its_stretch():
    # notebook 08's section 4: rank 1's step-0 stretch held one call more (its step check, where rank 0 made the
    # script's all_reduce), and the line said the ranks parted at the stretch's first call, #151, while the finding
    # named #155.
    def own(seq, label, op="all_gather"):
        call = Call(op, [["tensor", "int64[8]"]], ["int64"], [[8]], seq=seq, step=0)
        call.where, call.ours = f"<In [1], rank 0>:3 in minddp debug's {label} of DistributedDataParallel", True
        return call

    both = [own(151, "forward check"), own(152, "plan check")]
    rank_0 = stretches([*both, _all_reduce(2, 153)])
    rank_1 = stretches([*both, own(153, "step check")])
    said = parted(rank_1, rank_0)
    assert said.startswith("as rank 0's to #152, then #153 the wrapper's step 0 (step check)"), said
    assert parted(rank_0, rank_0) == "as rank 0's"
