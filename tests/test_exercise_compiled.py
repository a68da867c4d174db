"""Notebook 09's exercise (which piece's end hands each bucket over): no ranks, pure Python.

Oracle for the model answer: torch's reducer's own bucket assignment (``dist._compute_bucket_assignment_by_size``)
over the gradients in the order they arrive, each bucket handed over after the piece of its last gradient. The
wrong answers below are written as a learner would, each with one mistake; each verdict must name it.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from minddp.exercises import check_handover, solutions
from minddp.exercises.compiled import CASES


def torch_handover(pieces: list[list[int]], cap: int) -> list[int]:
    """torch's bucket assignment over one uint8 tensor per gradient (its size in bytes), in arrival order; each
    bucket's piece is that of its last gradient."""
    sizes = [s for piece in pieces for s in piece]
    piece_of = [i for i, piece in enumerate(pieces) for _ in piece]
    tensors = [torch.empty(s, dtype=torch.uint8) for s in sizes]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [cap], [], list(range(len(sizes))))
    return sorted(piece_of[max(b)] for b in buckets)


@pytest.mark.parametrize("seed", range(30))
def test_the_model_answer_is_torchs_bucket_assignment(seed):
    rng = random.Random(seed)
    pieces = [[rng.choice([0, 1, 2, 3, 5, 8, 13]) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 5))]
    cap = rng.choice([1, 4, 8, 10, 21])
    assert solutions.handed_over_after(pieces, cap) == torch_handover(pieces, cap)


def test_a_last_bucket_goes_with_its_last_gradient_when_the_last_piece_has_none():
    # a piece without parameters produces no gradient: the last bucket is handed over after piece 0, not 1
    assert solutions.handed_over_after([[8, 2], []], 8) == torch_handover([[8, 2], []], 8) == [0, 0]


def test_a_zero_byte_gradient_left_at_the_end_makes_a_last_bucket():
    # read 17-b 7: the model answer kept the last bucket by its bytes; torch keeps any gradient left (failed before)
    assert solutions.handed_over_after([[8], [0]], 8) == torch_handover([[8], [0]], 8) == [0, 1]


def test_the_cases_are_torchs_too_and_the_model_answer_passes():
    assert all(solutions.handed_over_after(p, c) == torch_handover(p, c) for p, c in CASES)
    verdict = check_handover(solutions.handed_over_after)
    assert verdict.ok and verdict.line.startswith("✓ handover:"), verdict.line


# Each wrong answer as a learner might write it: the gradients as (piece, bytes) in arrival order.
def arrivals(pieces):
    return [(i, size) for i, piece in enumerate(pieces) for size in piece]


def strictly_past(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total > cap:  # the mistake: == cap keeps the bucket open
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def never_past(pieces, cap):
    out, bucket = [], []
    for i, size in arrivals(pieces):
        if bucket and sum(b for _, b in bucket) + size > cap:  # the mistake: never let a bucket pass the cap
            out.append(bucket[-1][0])
            bucket = []
        bucket.append((i, size))
        if sum(b for _, b in bucket) == cap:
            out.append(i)
            bucket = []
    return out + ([bucket[-1][0]] if bucket else [])


def no_last_bucket(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out.append(i)
            total = 0
    return out  # the mistake: what is left is never handed over


def first_gradient(pieces, cap):
    out, bucket = [], []
    for i, size in arrivals(pieces):
        bucket.append((i, size))
        if sum(b for _, b in bucket) >= cap:
            out.append(bucket[0][0])  # the mistake: the piece of the first gradient
            bucket = []
    return out + ([bucket[0][0]] if bucket else [])


def closed_at_piece_end(pieces, cap):
    out = []
    for i, piece in enumerate(pieces):  # the mistake: a fresh bucket for every piece
        total = 0
        for size in piece:
            total += size
            if total >= cap:
                out.append(i)
                total = 0
        out += [i] * (total > 0)
    return out


def from_one(pieces, cap):
    return [i + 1 for i in solutions.handed_over_after(pieces, cap)]


def all_at_the_end(pieces, cap):
    return [len(pieces) - 1 for _ in solutions.handed_over_after(pieces, cap)]


def next_piece(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i + 1], 0  # the mistake: the piece during which the bucket is in flight
    return out + [len(pieces)] * (total > 0)


def one_per_piece(pieces, cap):
    return list(range(len(pieces)))  # the mistake: bucket k with piece k, as the notebook's own run pairs them


def empty_last_bucket(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [len(pieces) - 1]  # the mistake: one more bucket at the end, even when nothing is left


def carried_over(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], total - cap  # the mistake: the bytes past the cap start the next bucket
    return out + [len(pieces) - 1] * (total > 0)


def cap_checked_at_piece_end(pieces, cap):
    out, total = [], 0
    for i, piece in enumerate(pieces):
        total += sum(piece)
        if total >= cap:  # the mistake: the cap checked once a piece has ended, so a piece fills one bucket at most
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def pieces_in_forward_order(pieces, cap):
    out, total, at = [], 0, 0
    for i, piece in reversed(list(enumerate(pieces))):  # the mistake: the last piece first, as the forward runs
        for size in piece:
            total, at = total + size, i
            if total >= cap:
                out, total = out + [i], 0
    return out + [at] * (total > 0)


def reversed_in_a_piece(pieces, cap):
    out, total = [], 0
    for i, piece in enumerate(pieces):
        for size in reversed(piece):  # the mistake: a piece's gradients taken in reverse
            total += size
            if total >= cap:
                out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def last_bucket_where_it_opened(pieces, cap):
    out, total, opened = [], 0, 0
    for i, size in arrivals(pieces):
        opened = i if total == 0 else opened
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [opened] * (total > 0)  # the mistake: the last bucket given the piece where it opened


def cap_read_as_mib(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap * 2**20:  # the mistake: the cap taken in MiB, the sizes in bytes
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def cap_typed_from_the_notebook(pieces, cap):  # read 20-p 2: got only the first case that differs before
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= 2 * 2**20:  # the mistake: the notebook's cap typed in, the `cap` argument never used
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def cap_typed_in_mib_past(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total > 2:  # the mistake: a cap of 2 (MiB) typed in, passed strictly
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def cap_read_as_mib_strictly_past(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total > cap * 2**20:  # two mistakes: the cap taken in MiB, and == cap keeps the bucket open
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def cap_never_checked(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size  # the mistake: no check of the cap, so no bucket closes before the end
    return out + [len(pieces) - 1] * (total > 0)


def last_bucket_after_backward(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [len(pieces)] * (total > 0)  # the mistake: the last bucket "after backward ends", past the last piece


def bytes_forgotten_at_piece_end(pieces, cap):
    out = []
    for i, piece in enumerate(pieces):
        total = (
            0  # the mistake: each piece starts from 0 bytes, the open bucket's bytes dropped (the bucket not closed)
        )
        for size in piece:
            total += size
            if total >= cap:
                out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def strictly_past_and_no_last_bucket(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total > cap:  # two mistakes: == cap keeps the bucket open, and what is left is dropped
            out, total = out + [i], 0
    return out


def numbered_from_the_forward(pieces, cap):
    return [len(pieces) - 1 - i for i in solutions.handed_over_after(pieces, cap)]  # the mistake: piece 0 the first


def bucket_indices(pieces, cap):
    return list(range(len(solutions.handed_over_after(pieces, cap))))  # the mistake: the bucket's own index


def gradient_indices(pieces, cap):
    out, total, g = [], 0, -1
    for _, size in arrivals(pieces):  # the mistake: eager's view, each gradient a piece of its own
        total, g = total + size, g + 1
        if total >= cap:
            out, total = out + [g], 0
    return out + [g] * (total > 0)


def strictly_past_and_reversed_in_a_piece(pieces, cap):
    out, total = [], 0
    for i, piece in enumerate(pieces):
        for size in reversed(piece):  # two mistakes: a piece's gradients reversed, and > cap
            total += size
            if total > cap:
                out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def never_past_and_carried_over(pieces, cap):
    out, total, at = [], 0, 0
    for i, size in arrivals(pieces):
        if total and total + size > cap:  # two mistakes: closed before the gradient that would pass the cap
            out, total = out + [at], 0
        total, at = total + size, i
        if total >= cap:
            out, total = out + [i], total - cap  # and the bytes past the cap start the next bucket
    return out + [at] * (total > 0)


def carried_over_and_no_last_bucket(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], total - cap  # two mistakes: the bytes past the cap carried, the rest dropped
    return out


def closed_at_piece_end_and_carried_over(pieces, cap):
    out = []
    for i, piece in enumerate(pieces):
        total = 0  # two mistakes: a fresh bucket for every piece, and the bytes past the cap carried within it
        for size in piece:
            total += size
            if total >= cap:
                out, total = out + [i], total - cap
        out += [i] * (total > 0)
    return out


def bytes_never_reset(pieces, cap):
    out, filled = [], 0
    for i, piece in enumerate(pieces):
        for size in piece:
            filled += size
            if filled >= cap:  # the mistake: filled is not set back to 0, so every later gradient closes a bucket
                out.append(i)
    return out + [len(pieces) - 1] * (filled > 0)


def bytes_never_reset_and_no_last_bucket(pieces, cap):  # the reader's version: [0, 1, 1, 2, 2] on the first case
    out, filled = [], 0
    for i, piece in enumerate(pieces):
        for size in piece:
            filled += size
            if filled >= cap:
                out.append(i)
    return out


def cap_checked_before_adding(pieces, cap):
    out, filled = [], 0
    for i, piece in enumerate(pieces):
        for size in piece:
            if filled >= cap:  # the mistake: checked before this gradient is added, so the bucket closes one late
                out.append(i)
                filled = 0
            filled += size
    return out + [len(pieces) - 1] * (filled > 0)


def in_flight_during_next_piece(pieces, cap):
    """Handover read as "in flight during the next piece": each bucket the piece after its own, the last clamped."""
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out.append(min(i + 1, len(pieces) - 1))
            total = 0
    return out + [len(pieces) - 1] * (total > 0)


def first_bucket_at_one_mib(pieces, cap):
    """torch's DDP's 1 MiB first bucket (``_DEFAULT_FIRST_BUCKET_BYTES``) read into the exercise's rule."""
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= (cap if out else min(cap, 2**20)):  # the mistake: the first bucket capped at 1 MiB
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def first_bucket_at_one_mib_whatever_the_cap(pieces, cap):
    """The first bucket capped at 1 MiB, as cell 0 of notebook 09 says Dynamo caps the first piece under torch's DDP."""
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= (cap if out else 2**20):  # the mistake: the first bucket at 1 MiB, above or below the cap
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def whole_piece_cut_by_bytes(pieces, cap):
    """A piece's gradients all arrive at its end, so its bytes are added at once and cut into buckets at the cap."""
    out, filled = [], 0
    for i, piece in enumerate(pieces):
        filled += sum(piece)
        while filled >= cap:  # the mistake: a gradient split between two buckets
            out.append(i)
            filled -= cap
    return out + [len(pieces) - 1] * (filled > 0)


def cut_at_multiples_of_the_cap(pieces, cap):
    """A running total of the bytes, a bucket ending at each multiple of the cap it reaches: the same split."""
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        while total >= (len(out) + 1) * cap:  # the mistake: a gradient split between two buckets
            out.append(i)
    return out + [len(pieces) - 1] * (total > len(out) * cap)


def cap_converted_to_mib(pieces, cap):
    """The cap converted the wrong way (bytes to MiB): every gradient is past it and closes a bucket of its own."""
    cap = cap / 2**20  # the mistake
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


def pieces_that_hand_over(pieces, cap):
    """The pieces after which something is handed over, each once: one entry per piece, not per bucket."""
    out, total = set(), 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out.add(i)  # the mistake: a set, so a piece that fills two buckets is listed once
            total = 0
    return sorted(out | {len(pieces) - 1} if total else out)


def buckets_per_piece(pieces, cap):
    counts, total = [0] * len(pieces), 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            counts[i] += 1  # the mistake: how many buckets each piece hands over, not each bucket's piece
            total = 0
    counts[-1] += total > 0
    return counts


def last_bucket_unless_the_last_piece_closed_one(pieces, cap):  # the reader's version
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], 0
    if total and (not out or out[-1] != len(pieces) - 1):  # the mistake: the rest dropped after a full bucket
        out.append(len(pieces) - 1)
    return out


def last_bucket_at_the_loop_variable(pieces, cap):  # read 16-b 5: passed before the checker had an empty piece
    out, total = [], 0
    for i, piece in enumerate(pieces):
        for size in piece:
            total += size
            if total >= cap:
                out, total = out + [i], 0
    if total:
        out.append(i)  # the mistake: the loop's last index, the last piece, though it may hold no gradient
    return out


def last_bucket_at_the_last_piece(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)  # the mistake: the last piece, not that of the last gradient


def buckets_listed_last_first(pieces, cap):  # read 16-b 5: got only the first case that differs before
    return solutions.handed_over_after(pieces, cap)[::-1]  # the mistake: bucket of layers.0 first


def never_past_noting_the_next_gradient(pieces, cap):
    out, total = [], 0
    for i, size in arrivals(pieces):
        if total and total + size > cap:
            out, total = out + [i], 0  # the mistake: closed before this gradient, but given its piece
        total += size
        if total >= cap:
            out, total = out + [i], 0
    return out + [len(pieces) - 1] * (total > 0)


@pytest.mark.parametrize(
    "fn, named",
    [
        (strictly_past, "reaches the cap exactly stays open (`> cap`)"),
        (never_past, "closed before the gradient that would take it past the cap"),
        (no_last_bucket, "the gradients after the last full bucket were dropped"),
        (first_gradient, "the piece of its first gradient"),
        (closed_at_piece_end, "closed at each piece's end"),
        (from_one, "pieces numbered from 1"),
        (all_at_the_end, "that is the graph compiled whole"),
        (next_piece, "the piece after the one that fills it"),
        (one_per_piece, "one bucket per piece"),
        (empty_last_bucket, "an empty last bucket"),
        (carried_over, "the bytes past the cap were carried into the next bucket"),
        (cap_checked_at_piece_end, "the cap was checked only at each piece's end"),
        (pieces_in_forward_order, "the pieces were taken in the forward's order"),
        (reversed_in_a_piece, "each piece's gradients were taken in reverse"),
        (reversed_in_a_piece, "in the order they arrive in backward, and buckets fill in that order, as given"),
        (strictly_past_and_no_last_bucket, "two mistakes: a bucket that reaches the cap exactly stays open"),
        (strictly_past_and_no_last_bucket, "and the gradients after the last full bucket were dropped"),
        (numbered_from_the_forward, "the pieces were numbered in the forward's order"),
        (bucket_indices, "each bucket was given its own index"),
        (gradient_indices, "the index of its last gradient, as if each gradient were a piece of its own"),
        (strictly_past_and_reversed_in_a_piece, "two mistakes: a bucket that reaches the cap exactly stays open"),
        (strictly_past_and_reversed_in_a_piece, "and each piece's gradients were taken in reverse"),
        (never_past_and_carried_over, "two mistakes: a bucket closed before the gradient that would take it past"),
        (never_past_and_carried_over, "and the bytes past the cap were carried into the next bucket"),
        (carried_over_and_no_last_bucket, "two mistakes: the gradients after the last full bucket were dropped"),
        (carried_over_and_no_last_bucket, "; and the bytes past the cap were carried into the next bucket"),
        (closed_at_piece_end_and_carried_over, "a bucket was closed at each piece's end"),
        (closed_at_piece_end_and_carried_over, "; and the bytes past the cap were carried into the next bucket"),
        (last_bucket_where_it_opened, "the last bucket was given the piece where it opened"),
        (cap_read_as_mib, "the cap was read as MiB"),
        (cap_read_as_mib_strictly_past, "two mistakes: the cap was read as MiB"),
        (cap_read_as_mib_strictly_past, "; and a bucket that reaches the cap exactly stays open (`> cap`)"),
        (cap_never_checked, "no bucket was ever closed"),
        (last_bucket_after_backward, "the last bucket, not full, was given `len(pieces)`"),
        (bytes_forgotten_at_piece_end, "the bytes of a bucket still open at a piece's end were dropped"),
        (bytes_never_reset, "the bytes were not set back to 0 when a bucket closed"),
        (bytes_never_reset_and_no_last_bucket, "the bytes were not set back to 0 when a bucket closed"),
        (bytes_never_reset_and_no_last_bucket, "the gradients after the last full bucket were dropped"),
        (cap_checked_before_adding, "the cap was checked before each gradient was added"),
        (in_flight_during_next_piece, "the piece during whose backward its message can be in flight"),
        (first_bucket_at_one_mib, "the first bucket was capped at 1 MiB"),
        (first_bucket_at_one_mib_whatever_the_cap, "the first bucket was capped at 1 MiB"),
        # torch's DDP given a bucket_cap_mb caps its first bucket at it too: only its default first bucket is 1 MiB
        (first_bucket_at_one_mib, "own first bucket only when no `bucket_cap_mb` is given"),
        (first_bucket_at_one_mib, "as a `bucket_cap_mb` does in torch's DDP and in minddp's ddp"),
        (first_bucket_at_one_mib_whatever_the_cap, "own first bucket only when no `bucket_cap_mb` is given"),
        (whole_piece_cut_by_bytes, "a gradient is never split"),
        (whole_piece_cut_by_bytes, "a bucket ended at each multiple of the cap in the bytes so far"),
        (cut_at_multiples_of_the_cap, "a bucket ended at each multiple of the cap in the bytes so far"),
        (cap_converted_to_mib, "every gradient closed a bucket of its own"),
        (pieces_that_hand_over, "each piece that hands a bucket over was listed once"),
        (buckets_per_piece, "one count per piece, how many buckets it hands over"),
        (last_bucket_unless_the_last_piece_closed_one, "the last bucket was dropped when the last piece had closed"),
        (
            never_past_noting_the_next_gradient,
            "a bucket was closed before the gradient that would take it past the cap, and given that gradient's piece",
        ),
        (last_bucket_at_the_loop_variable, "the last bucket was given the last piece"),
        (last_bucket_at_the_last_piece, "a piece can have no gradient (an empty list)"),
        (buckets_listed_last_first, "the buckets were listed last first"),
        (cap_typed_from_the_notebook, "the `cap` argument was not used"),
        (cap_typed_in_mib_past, "the `cap` argument was not used"),
    ],
)
def test_each_handover_mistake_is_named(fn, named):
    verdict = check_handover(fn)
    assert not verdict.ok and named in verdict.line, verdict.line


@pytest.mark.parametrize("fn", [last_bucket_after_backward, last_bucket_where_it_opened])
def test_a_last_bucket_hint_points_to_the_piece_of_its_last_gradient(fn):
    # read 20-h 1: these verdicts said the last bucket goes after `len(pieces) - 1` ("the last piece"); a learner who
    # followed that wrote last_bucket_at_the_last_piece, which the next verdict marks wrong (a last piece can be empty)
    hint = check_handover(fn).line
    assert not check_handover(last_bucket_at_the_last_piece).ok
    assert "len(pieces) - 1" not in hint and "the last piece" not in hint, hint
    assert "after the backward of the piece of its last gradient" in hint, hint


def test_empty_pieces_dropped_before_numbering_is_named():
    # read 17-b 6: the empty pieces filtered out, then numbered; right wherever no piece is empty
    def drops_empty_pieces(pieces, cap):
        out, total, last = [], 0, 0
        for i, piece in enumerate([p for p in pieces if p]):  # the mistake: numbered without the empty pieces
            for size in piece:
                total, last = total + size, i
                if total >= cap:
                    out, total = out + [i], 0
        return out + [last] * (total > 0)

    verdict = check_handover(drops_empty_pieces)
    assert not verdict.ok and "an empty piece (no gradient) still has its index" in verdict.line, verdict.line


def test_a_last_bucket_kept_by_its_bytes_is_named():
    # read 17-b 7: right but for a last bucket of zero-byte gradients, dropped (passed as right before)
    def by_bytes(pieces, cap):
        out, total, last = [], 0, 0
        for i, size in arrivals(pieces):
            total, last = total + size, i
            if total >= cap:
                out, total = out + [i], 0
        return out + [last] * (total > 0)  # the mistake: no bytes left read as no gradient left

    verdict = check_handover(by_bytes)
    assert not verdict.ok and "the last bucket was kept only when its bytes were not 0" in verdict.line, verdict.line
    assert "(pieces [[8], [0]], cap 8: [0, 1])" in verdict.line, verdict.line


def test_the_natural_answer_with_both_last_bucket_mistakes_has_both_named():
    # read 18-b 7: the code hint's walk, with `if total:` and the loop's last index, is wrong on an empty last piece
    # and on a zero-byte gradient left at the end; the verdict named the first only, the second after a rerun
    verdict = check_handover(last_bucket_at_the_loop_variable)
    assert not verdict.ok and "two mistakes" in verdict.line, verdict.line
    assert "the last bucket was given the last piece" in verdict.line, verdict.line
    assert "(pieces [[4], [], [2], []], cap 8: [2])" in verdict.line, verdict.line
    assert "the last bucket was kept only when its bytes were not 0" in verdict.line, verdict.line
    assert "(pieces [[8], [0]], cap 8: [0, 1])" in verdict.line, verdict.line

    # the first mistake alone (a last bucket kept when any gradient is left) is named alone
    def last_piece_only(pieces, cap):
        out, total, left = [], 0, False
        for i, piece in enumerate(pieces):
            for size in piece:
                total, left = total + size, True
                if total >= cap:
                    out, total, left = out + [i], 0, False
        return out + [len(pieces) - 1] * left

    one = check_handover(last_piece_only).line
    assert "two mistakes" not in one and "the last bucket was given the last piece" in one, one


def test_an_unwritten_a_raising_a_mistyped_and_an_unknown_answer_are_told_apart():
    def unwritten(pieces, cap):
        raise NotImplementedError

    assert "not written yet" in check_handover(unwritten).line
    assert "raised ZeroDivisionError" in check_handover(lambda pieces, cap: 1 // 0).line
    assert "return a list of ints" in check_handover(lambda pieces, cap: None).line
    # right everywhere but where a piece is empty, which it cannot take (read 16-b 5: passed before)
    first_gradient_of_each = check_handover(lambda p, c: solutions.handed_over_after(p, c) if all(p) else [p[-1][0]])
    assert "with pieces [[4], [], [2], []] and a cap of 8 it raised IndexError" in first_gradient_of_each.line
    line = check_handover(lambda pieces, cap: [0]).line  # no mistake of the list: its first case that differs
    assert line.startswith("✗ handover: with pieces [[4, 4], [4, 4], [4, 4]] and a cap of 8 yours says [0]"), line


def test_bucket_0_closed_at_piece_0s_end_is_named():
    # read 20 (09) 3: "piece 0 closes at the bucket cap, as the rebuilt bucket 0 does" read as bucket 0 always ending
    # with piece 0; that answer got only the generic first-differing-case verdict
    def bucket_0_ends_with_piece_0(pieces, cap):
        out, total, left, last = [], 0, False, 0
        for i, piece in enumerate(pieces):
            for size in piece:
                total, left, last = total + size, True, i
                if total >= cap:
                    out, total, left = out + [i], 0, False
            if i == 0 and left:  # the mistake: the open bucket closed with piece 0
                out, total, left = out + [0], 0, False
        return out + [last] * left

    assert bucket_0_ends_with_piece_0([[1, 8, 1], [8]], 8) == [0, 0, 1]
    verdict = check_handover(bucket_0_ends_with_piece_0)
    assert not verdict.ok and "the bucket still open when piece 0 ended was closed there" in verdict.line, verdict.line


def test_pieces_numbered_by_index_is_named():
    # read 20 (09-t) 4: `pieces.index(piece)` for `enumerate` gives equal pieces the first one's index; that answer
    # got only the generic first-differing-case verdict
    def numbered_by_index(pieces, cap):
        out, total, last = [], 0, 0
        for piece in pieces:
            i = pieces.index(piece)  # the mistake: the first equal piece's index
            for size in piece:
                total, last = total + size, i
                if total >= cap:
                    out, total = out + [i], 0
        return out + [last] * (total > 0)

    assert numbered_by_index([[4, 4], [4, 4], [4, 4]], 8) == [0, 0, 0]
    verdict = check_handover(numbered_by_index)
    assert not verdict.ok and "numbered by `pieces.index(piece)`" in verdict.line, verdict.line


def test_the_gradients_left_merged_into_the_previous_bucket_is_named():
    # read 20 (09-zf) 3: the leftover added to the last full bucket, no last bucket of its own; that answer got only
    # the generic first-differing-case verdict
    def merged(pieces, cap):
        out, total, last = [], 0, 0
        for i, piece in enumerate(pieces):
            for size in piece:
                total, last = total + size, i
                if total >= cap:
                    out, total = out + [i], 0
        if total and out:  # the mistake: the gradients left join the last full bucket
            return out[:-1] + [last]
        return out + [last] * (total > 0)

    assert merged([[3, 3, 3, 3, 3]], 6) == [0, 0] and merged([[5], [5], [2]], 8) == [2]
    verdict = check_handover(merged)
    assert not verdict.ok and "were merged into it" in verdict.line, verdict.line


def test_a_bucket_closed_only_at_the_cap_exactly_is_named():
    # read 36 (09-zj) 5: `== cap` from "at the cap" without "or past it"; that answer got only the generic
    # first-differing-case verdict
    def exactly_at_the_cap(pieces, cap):
        out, total, last = [], 0, 0
        for i, size in arrivals(pieces):
            total, last = total + size, i
            if total == cap:  # the mistake: a bucket that goes past the cap stays open
                out, total = out + [i], 0
        return out + [last] * (total > 0)

    assert exactly_at_the_cap([[1, 8, 1], [8]], 8) == [1]
    verdict = check_handover(exactly_at_the_cap)
    assert not verdict.ok and "closed only when it reached the cap exactly (`== cap`)" in verdict.line, verdict.line
