"""Notebook 09's exercise: after which compiled piece each bucket is handed over, checked without ranks.

:func:`check_handover` checks a learner's ``handed_over_after(pieces, cap)``: ``pieces`` the compiled pieces
in the order backward runs them, each a list of its gradients' sizes in bytes in the order they arrive;
``cap`` the bucket cap in bytes. ddp fills buckets in that order, closing a bucket at the first gradient
that takes it to the cap or past it; the gradients left after the last full bucket make one more bucket. The
answer: for each bucket, the index of the piece after whose backward it is handed over. The function is called
on every case of :data:`CASES` and compared with the model answer
(:func:`~minddp.exercises.solutions.handed_over_after`); an answer that matches one of the usual mistakes
(:data:`MISTAKES`) on every case without an empty piece or a zero-byte gradient (:data:`PLAIN`) is named by it,
one that matches two of them made together (:data:`PAIRS`) by both, one right but for a last bucket given the last
piece where that piece is empty by that (:data:`LAST_PIECE`), one that drops the empty pieces by that
(:data:`EMPTY_DROPPED`), one that drops a last bucket of zero bytes by that (:data:`ZERO_BYTES`), one that drops a
zero-byte last bucket and makes the mistake of :data:`LAST_PIECE` or :data:`EMPTY_DROPPED` too by both, one that
fills the buckets right but at one cap of its own in every case (a typed ``2 * 2**20``, say) by that
(:data:`CAP_IGNORED`), one that closes the bucket still open at piece 0's end by that (:data:`FIRST_AT_PIECE_0`), any
other by its first case that differs. A few pairs give the same answer as one mistake
alone on every input (never past with strictly past, say): they are named by that one, which says what the answer
does.

Example (pure Python, no ranks)::

    >>> from minddp.exercises import check_handover, solutions
    >>> check_handover(solutions.handed_over_after).ok
    True
    >>> check_handover(lambda pieces, cap: [len(pieces) - 1] * 2).line[:52]
    '✗ handover: with pieces [[4, 4], [4, 4], [4, 4]] and'
"""

from __future__ import annotations

import math

from minddp.exercises import solutions
from minddp.exercises.checker import Verdict

#: (pieces, cap): each tells a mistake of :data:`MISTAKES` from the model answer, or the cut from no cut
CASES = [
    ([[4, 4], [4, 4], [4, 4]], 8),  # every bucket reaches the cap exactly at a piece's end
    ([[1, 8, 1], [8]], 8),  # a bucket past the cap, one open across a piece's end
    ([[3, 3, 3, 3, 3]], 6),  # one piece: the graph compiled whole
    ([[5], [5], [2]], 8),  # a bucket over two pieces, and a last bucket not full
    ([[2, 2, 2], [2, 2, 2], [2, 2, 2]], 4),  # a piece that fills one bucket and opens the next
    ([[3, 1]], 3),  # a piece whose gradients, taken in the wrong order, fill its buckets otherwise
    ([[1, 4], [1], [2, 5]], 3),  # gradients past the cap, a piece that fills none: tells two mistakes from one
    ([[6], [3, 1], [2]], 8),  # a last bucket not full, opened in one piece and ended in a later one
    ([[2**19, 2**19], [2**19, 2**19, 2**19]], 1),  # a cap of one byte: tells the cap read as MiB (with > or >=)
    # from a cap never checked
    ([[2**20, 2**20]] * 4, 2 * 2**20),  # notebook 09's step: 1 MiB gradients, a 2 MiB cap; tells a 1 MiB first bucket
    ([[2, 2, 3], [1], [4]], 4),  # a piece that fills a bucket past its middle: tells each piece once from cap at end
    ([[4], [], [2], []], 8),  # pieces without a gradient: the last bucket goes after piece 2, not the last piece
    ([[8], [0]], 8),  # a zero-byte gradient (a parameter without elements) left at the end: a last bucket still
]

#: the cases every mistake of :data:`MISTAKES` and :data:`PAIRS` is matched on: those without an empty piece (a
#: learner's answer with one mistake may give a last bucket the last piece there, as most do) or a zero-byte gradient
#: (it may keep a last bucket by its bytes, as most do)
PLAIN = [k for k, (pieces, _) in enumerate(CASES) if all(piece and 0 not in piece for piece in pieces)]
#: the cases :data:`LAST_PIECE` and :data:`EMPTY_DROPPED` are matched on: those without a zero-byte gradient
NONZERO = [k for k, (pieces, _) in enumerate(CASES) if all(0 not in piece for piece in pieces)]

#: what the verdict says to an answer right but where the last pieces are empty: its last bucket given the last piece
LAST_PIECE = (
    "the last bucket was given the last piece (`len(pieces) - 1`, or the loop's last index): it is handed over "
    "after the piece of its last gradient, and a piece can have no gradient (an empty list)"
)

#: what the verdict says to an answer right but where a piece is empty: the empty pieces dropped before numbering
EMPTY_DROPPED = (
    "the empty pieces were dropped before the pieces were numbered: an empty piece (no gradient) still has its "
    "index, so number the pieces as given"
)

#: what the verdict says to an answer right but where the gradients left at the end have 0 bytes: no last bucket
ZERO_BYTES = (
    "the last bucket was kept only when its bytes were not 0: the gradients left after the last full bucket make "
    "one more bucket whatever their bytes (a parameter without elements has a gradient of 0 bytes), so keep it when "
    "any gradient is left"
)


#: what the verdict says to an answer that fills the buckets at one cap of its own, whatever ``cap`` it is given
CAP_IGNORED = (
    "the `cap` argument was not used: your buckets close at the same cap in every case (a number typed in?), but "
    "each case gives its own `cap`, in bytes; close each bucket at the first gradient that takes it to `cap` or past it"
)

#: what the verdict says to an answer that closes the bucket still open when piece 0 ends, then fills by bytes
FIRST_AT_PIECE_0 = (
    "the bucket still open when piece 0 ended was closed there: piece 0 and bucket 0 hold the same gradients only "
    "when piece 0 is cut at the cap (as in the notebook); here any piece holds any gradients, and every bucket, "
    "bucket 0 included, closes at the first gradient that takes it to `cap` or past it"
)


def _walk(
    pieces,
    cap,
    *,
    past: bool = False,
    before: bool = False,
    last: bool = True,
    empty: bool = False,
    first: bool = False,
    per_piece: bool = False,
    shift: int = 0,
    carry: bool = False,
    at_end: bool = False,
    forward: bool = False,
    within: bool = False,
    mirror: bool = False,
    gradient: bool = False,
    bucket: bool = False,
    last_opened: bool = False,
    forget: bool = False,
    kept: bool = False,
    late: bool = False,
    exact: bool = False,
) -> list[int]:
    """The model answer's walk (its last bucket kept by its bytes, which differs only where a zero-byte gradient is left
    at the end) with one mistake switched on: close only past the cap (``past``), before the gradient that would pass it
    (``before``), drop the last bucket (``last=False``), add a last one even when nothing is left (``empty``), note the
    piece of a bucket's first gradient (``first``), close the open bucket at each piece's end (``per_piece``), number
    from ``shift``, carry the bytes past the cap into the next bucket (``carry``), check the cap only at each piece's
    end (``at_end``), take the pieces in the forward's order (``forward``), take a piece's gradients in reverse
    (``within``); or give each bucket, in place of its piece's index, that index counted from the forward's end
    (``mirror``), its last gradient's index in arrival order (``gradient``), the bucket's own index (``bucket``); give
    the last bucket the piece where it opened (``last_opened``); or start each piece from 0 bytes, dropping the open
    bucket's bytes (``forget``); never set the bytes back to 0 when a bucket closes (``kept``); check the cap before
    adding each gradient, closing one late and noting the next gradient's piece (``late``); close only at the cap
    exactly (``exact``)."""

    def full(filled) -> bool:
        return filled == cap if exact else filled > cap if past else filled >= cap

    after, filled, opened, at, g = [], 0, (0, 0), (0, 0), -1  # (piece, gradient) pairs; g counts the gradients
    for i, piece in reversed(list(enumerate(pieces))) if forward else enumerate(pieces):
        filled = 0 if forget else filled
        for j, size in enumerate(piece[::-1] if within else piece):
            g += 1
            if late and full(filled):
                after.append(opened if first else (i, g))
                filled = filled - cap if carry else 0
            if before and filled and filled + size > cap:
                after.append(at)
                filled = 0
            opened = (i, g) if filled == 0 else opened
            filled, at = filled + size, (i, g)
            if late or at_end and j < len(piece) - 1:
                continue
            if full(filled):
                after.append(opened if first else at)
                filled = filled - cap if carry else filled if kept else 0
        if per_piece and filled:
            after.append(at)
            filled = 0
    if (filled or empty) and last:
        after.append(opened if first or last_opened else at)
    if bucket:
        return [k + shift for k in range(len(after))]
    return [(n if gradient else len(pieces) - 1 - i if mirror else i) + shift for i, n in after]


#: name -> (the mistake as the model answer's walk with its switches, what the verdict says)
WALKS = {
    "strictly past": (
        {"past": True},
        "a bucket that reaches the cap exactly stays open (`> cap`): it closes at the first gradient that takes "
        "it to the cap or past it (`>= cap`)",
    ),
    "only at the cap exactly": (
        {"exact": True},
        "a bucket closed only when it reached the cap exactly (`== cap`), so one that went past it stayed open: it "
        "closes at the first gradient that takes it to the cap or past it (`>= cap`)",
    ),
    "never past": (
        {"before": True},
        "a bucket closed before the gradient that would take it past the cap: ddp adds that gradient and closes "
        "the bucket after it, so a bucket can end past the cap",
    ),
    "no last bucket": (
        {"last": False},
        "the gradients after the last full bucket were dropped: they make one more bucket, handed over with the "
        "last of them",
    ),
    "empty last bucket": (
        {"empty": True},
        "an empty last bucket was added: one more bucket is made only of gradients left after the last full one, "
        "and when none is left there is none",
    ),
    "first gradient": (
        {"first": True},
        "each bucket was given the piece of its first gradient: a bucket is handed over when its last gradient "
        "is there, after the backward of the piece that produces it",
    ),
    "closed at piece end": (
        {"per_piece": True},
        "a bucket was closed at each piece's end: buckets are cut by bytes alone, so one open when a piece ends "
        "takes the next piece's gradients too",
    ),
    "next piece": (
        {"shift": 1},
        "each bucket was given the piece after the one that fills it (or pieces numbered from 1): the answer is the "
        "piece whose backward's end completes the bucket, numbered from 0 in the order backward runs them",
    ),
    "carried over": (
        {"carry": True},
        "the bytes past the cap were carried into the next bucket: a gradient is never split, so a bucket that "
        "passes the cap closes with all of that gradient and the next bucket starts empty",
    ),
    "cap at piece end": (
        {"at_end": True},
        "the cap was checked only at each piece's end: ddp checks it at every gradient, so one piece can fill "
        "several buckets",
    ),
    "forward order": (
        {"forward": True},
        "the pieces were taken in the forward's order: `pieces` lists them in the order backward runs them, "
        "piece 0 first, and buckets fill in that order",
    ),
    "reversed in a piece": (
        {"within": True},
        "each piece's gradients were taken in reverse: `pieces` lists each piece's gradients in the order they "
        "arrive in backward, and buckets fill in that order, as given",
    ),
    "numbered from the forward": (
        {"mirror": True},
        "the pieces were numbered in the forward's order: number them in the order backward runs them, piece 0 "
        "(the forward's last layers) first",
    ),
    "gradient index": (
        {"gradient": True},
        "each bucket was given the index of its last gradient, as if each gradient were a piece of its own (as in "
        "eager): a compiled piece produces all its gradients at its end; the answer is that piece's index",
    ),
    "bucket index": (
        {"bucket": True},
        "each bucket was given its own index: the answer is the index of the piece after whose backward it is "
        "handed over, and one piece can fill none, one or several buckets",
    ),
    "last bucket where it opened": (
        {"last_opened": True},
        "the last bucket was given the piece where it opened: like every bucket it is handed over when its last "
        "gradient is there, after the backward of the piece of its last gradient",
    ),
    "bytes dropped at piece end": (
        {"forget": True},
        "the bytes of a bucket still open at a piece's end were dropped (set to 0 without closing the bucket): "
        "the open bucket keeps its bytes and takes the next piece's gradients too",
    ),
    "bytes never reset": (
        {"kept": True},
        "the bytes were not set back to 0 when a bucket closed, so after the first bucket every gradient closed "
        "one of its own: each bucket starts empty",
    ),
    "cap before adding": (
        {"late": True},
        "the cap was checked before each gradient was added, so each bucket closed one gradient late, given the "
        "piece of the gradient after: add the gradient, then check the cap, and note that gradient's piece",
    ),
}

#: the switches that say what a bucket is given in place of its piece's index: two of them contradict each other
_SAYS = ("first", "mirror", "gradient", "bucket")


def _all_at_the_end(pieces, cap):
    return [len(pieces) - 1] * len(solutions.handed_over_after(pieces, cap))


def _one_per_piece(pieces, cap):
    return list(range(len(pieces)))


def _after_backward(pieces, cap):
    full = _walk(pieces, cap, last=False)  # the buckets that reached the cap
    return full + [len(pieces)] * (len(solutions.handed_over_after(pieces, cap)) > len(full))


def _first_at_one_mib(pieces, cap, *, whatever_the_cap: bool = False):
    """The model answer's rule with the first bucket capped at ``min(cap, 1 MiB)``, or at 1 MiB above the cap too
    (``whatever_the_cap``)."""
    after, filled = [], 0
    for i, piece in enumerate(pieces):
        for size in piece:
            filled += size
            if filled >= (cap if after else 2**20 if whatever_the_cap else min(cap, 2**20)):
                after.append(i)
                filled = 0
    return after + [len(pieces) - 1] * (filled > 0)


def _piece_cut_by_bytes(pieces, cap):
    """A bucket ended at each multiple of ``cap`` in the bytes so far (a piece's added at once, or a running
    total): a gradient split between two."""
    after, filled = [], 0
    for i, piece in enumerate(pieces):
        filled += sum(piece)
        while filled >= cap:
            after.append(i)
            filled -= cap
    return after + [len(pieces) - 1] * (filled > 0)


def _in_flight_next(pieces, cap):
    return [min(i + 1, len(pieces) - 1) for i in solutions.handed_over_after(pieces, cap)]


def _per_piece_counts(pieces, cap):
    after = solutions.handed_over_after(pieces, cap)
    return [after.count(i) for i in range(len(pieces))]


def _last_unless_last_piece_closed(pieces, cap):
    """The model answer's rule with the last bucket added only when the last piece closed no bucket."""
    full = _walk(pieces, cap, last=False)
    rest = len(solutions.handed_over_after(pieces, cap)) > len(full)
    return full + [len(pieces) - 1] * (rest and (not full or full[-1] != len(pieces) - 1))


def _last_bucket_at_the_last_piece(pieces, cap):
    """The model answer's rule with a last bucket not full given the last piece, whatever piece its last gradient
    is in."""
    full = _walk(pieces, cap, last=False)
    return full + [len(pieces) - 1] * (len(solutions.handed_over_after(pieces, cap)) > len(full))


def _empty_pieces_dropped(pieces, cap):
    """The model answer run on the pieces with the empty ones dropped, so numbered without them."""
    return solutions.handed_over_after([p for p in pieces if p], cap)


def _bytes_kept(rule):
    """``rule`` with its last bucket kept only when its bytes are not 0 (:data:`ZERO_BYTES`): where the gradients
    left at the end have 0 bytes, its answer without that last bucket's entry."""

    def kept(pieces, cap):
        got = rule(pieces, cap)
        return got[:-1] if len(_walk(pieces, cap)) < len(solutions.handed_over_after(pieces, cap)) else got

    return kept


def _never_past_next_gradient(pieces, cap):
    """A bucket closed before the gradient that would take it past the cap, given that gradient's piece."""
    after, filled, i = [], 0, 0
    for i, piece in enumerate(pieces):
        for size in piece:
            if filled and filled + size > cap:
                after.append(i)
                filled = 0
            filled += size
            if filled >= cap:
                after.append(i)
                filled = 0
    return after + [i] * (filled > 0)


def _left_merged_into_previous(pieces, cap):
    """The model answer's rule with the gradients left at the end added to the last full bucket (handed over after
    the piece of the last of them) in place of a last bucket of their own."""
    full, right = _walk(pieces, cap, last=False), solutions.handed_over_after(pieces, cap)
    return full[:-1] + right[-1:] if full and len(right) > len(full) else right


def _numbered_by_index(pieces, cap):
    """The model answer with each piece numbered by ``pieces.index(piece)``: pieces equal to an earlier one get its
    index."""
    return [pieces.index(pieces[i]) for i in solutions.handed_over_after(pieces, cap)]


def _open_bucket_closed_at_piece_0_end(pieces, cap):
    """The model answer's rule with the bucket still open when piece 0 ends closed there (:data:`FIRST_AT_PIECE_0`)."""
    after, filled, left, last = [], 0, False, 0
    for i, piece in enumerate(pieces):
        for size in piece:
            filled, left, last = filled + size, True, i
            if filled >= cap:
                after, filled, left = after + [i], 0, False
        if i == 0 and left:
            after, filled, left = after + [0], 0, False
    return after + [last] * left


#: name -> (the mistake as code, what the verdict says): each walk above, then the mistakes of another shape
MISTAKES = {
    **{
        name: (lambda p, c, switches=switches: _walk(p, c, **switches), says)
        for name, (switches, says) in WALKS.items()
    },
    "one per piece": (
        _one_per_piece,
        "one bucket per piece: buckets are cut by bytes, not by pieces; a bucket closes at the first gradient that "
        "takes it to the cap or past it, in whatever piece that is, so a piece can fill none, one or several",
    ),
    "never closed": (
        lambda pieces, cap: _walk(pieces, math.inf),
        "no bucket was ever closed: every gradient went into one bucket; check the cap at every gradient and close "
        "the bucket at the first one that takes it to the cap or past it",
    ),
    "last bucket after backward": (
        _after_backward,
        "the last bucket, not full, was given `len(pieces)`, as if handed over after backward: it is handed over "
        "when its last gradient is there, after the backward of the piece of its last gradient",
    ),
    "cap in MiB": (
        lambda pieces, cap: _walk(pieces, cap * 2**20),
        "the cap was read as MiB: `cap` is in bytes, as the gradients' sizes are",
    ),
    "cap in MiB, strictly past": (
        lambda pieces, cap: _walk(pieces, cap * 2**20, past=True),
        "two mistakes: the cap was read as MiB: `cap` is in bytes, as the gradients' sizes are; and "
        + WALKS["strictly past"][1],
    ),
    "in flight next": (
        _in_flight_next,
        "each bucket was given the piece during whose backward its message can be in flight (the next one, the last "
        "piece for the last bucket): the answer is the piece after whose backward it is handed over, the one that "
        "fills it",
    ),
    "all at the end": (
        _all_at_the_end,
        "every bucket after the last piece: that is the graph compiled whole (one piece); with the cut a bucket "
        "goes once the piece that fills it has ended",
    ),
    "first bucket at 1 MiB": (
        _first_at_one_mib,
        "the first bucket was capped at 1 MiB (Dynamo's cap for the first piece under torch's DDP, and torch's DDP's "
        "own first bucket only when no `bucket_cap_mb` is given): here `cap` caps every bucket, the first included, "
        "as a `bucket_cap_mb` does in torch's DDP and in minddp's ddp",
    ),
    "first bucket at 1 MiB, whatever the cap": (
        lambda pieces, cap: _first_at_one_mib(pieces, cap, whatever_the_cap=True),
        "the first bucket was capped at 1 MiB (Dynamo's cap for the first piece under torch's DDP, and torch's DDP's "
        "own first bucket only when no `bucket_cap_mb` is given), even where `cap` is smaller: here `cap` caps every "
        "bucket, the first included, as a `bucket_cap_mb` does in torch's DDP and in minddp's ddp",
    ),
    "a bucket per gradient": (
        lambda pieces, cap: _walk(pieces, cap / 2**20),
        "every gradient closed a bucket of its own, as if the cap were below every gradient's size (`cap / 2**20`, "
        "say): `cap` is in bytes, as the gradients' sizes are, and a bucket takes gradients until one takes it to "
        "the cap or past it",
    ),
    "each piece once": (
        lambda pieces, cap: sorted(set(solutions.handed_over_after(pieces, cap))),
        "each piece that hands a bucket over was listed once: the answer has one entry per bucket, so a piece that "
        "fills several buckets is listed as many times, and one that fills none is not listed",
    ),
    "piece cut by bytes": (
        _piece_cut_by_bytes,
        "a bucket ended at each multiple of the cap in the bytes so far, splitting a gradient between two "
        "buckets: a gradient is never split; a bucket holds whole gradients, in the order they arrive, and "
        "closes at the first that takes it to the cap or past it",
    ),
    "counts per piece": (
        _per_piece_counts,
        "one count per piece, how many buckets it hands over: the answer has one entry per bucket, the index of the "
        "piece after whose backward that bucket is handed over",
    ),
    "last bucket only after a piece that closed none": (
        _last_unless_last_piece_closed,
        "the last bucket was dropped when the last piece had closed a bucket: the gradients left after the last "
        "full bucket always make one more bucket, whichever piece closed the one before",
    ),
    "buckets listed last first": (
        lambda pieces, cap: solutions.handed_over_after(pieces, cap)[::-1],
        "the buckets were listed last first: list them in the order they fill, bucket 0 (the first to close, in "
        "piece 0 or later) first",
    ),
    "never past, the next gradient's piece": (
        _never_past_next_gradient,
        "a bucket was closed before the gradient that would take it past the cap, and given that gradient's "
        "piece: ddp adds that gradient and closes the bucket after it, so a bucket can end past the cap, handed "
        "over after the piece of its last gradient",
    ),
    "left merged into the previous bucket": (
        _left_merged_into_previous,
        "the gradients left after the last full bucket were merged into it: a full bucket is handed over as soon as "
        "it closes, so those left make one more bucket of their own",
    ),
    "numbered by pieces.index": (
        _numbered_by_index,
        "the pieces were numbered by `pieces.index(piece)`, which finds the first piece equal to it: pieces can be "
        "alike ([4, 4] twice), so number them by position (`enumerate`)",
    ),
}


def _fills(cases) -> list:
    """Every byte count a bucket can reach in ``cases`` (a run of consecutive gradients' sizes), then infinity: a
    walk at any one cap closes its buckets as the walk at one of these does."""
    reached = set()
    for k in cases:
        sizes = [size for piece in CASES[k][0] for size in piece]
        reached |= {sum(sizes[i:j]) for i in range(len(sizes)) for j in range(i + 1, len(sizes) + 1)}
    return [*sorted(reached), math.inf]


def _contradict(a: str, b: str) -> bool:
    """Whether walk mistakes ``a`` and ``b`` cannot be made together: no last bucket with an empty one, two tests of
    the cap (``>`` and ``==``), or two answers in place of the piece's index (the piece of the first gradient alone
    can be counted otherwise)."""
    says = [k for name in (a, b) for k in WALKS[name][0] if k in _SAYS]
    if {a, b} in ({"no last bucket", "empty last bucket"}, {"strictly past", "only at the cap exactly"}):
        return True
    return len(says) == 2 and says != ["first", "mirror"]


#: two walk mistakes made together (those that do not contradict each other)
PAIRS = [(a, b) for k, a in enumerate(WALKS) for b in list(WALKS)[k + 1 :] if not _contradict(a, b)]


def check_handover(fn) -> Verdict:
    """Check ``handed_over_after(pieces, cap)`` (module doc) on every case of :data:`CASES`; one :class:`Verdict`."""
    name = "handover"
    answers = []
    for pieces, cap in CASES:
        try:
            got = fn([list(p) for p in pieces], cap)
        except NotImplementedError:
            return Verdict(False, f"✗ {name}: not written yet (it raises NotImplementedError)")
        except Exception as error:  # the learner's code: said in one line
            return Verdict(False, f"✗ {name}: with pieces {pieces} and a cap of {cap} it raised {error!r}")
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, int) for x in got):
            return Verdict(False, f"✗ {name}: return a list of ints, one piece index per bucket (got {got!r})")
        answers.append(list(got))
    right = [solutions.handed_over_after(p, c) for p, c in CASES]
    if answers == right:
        return Verdict(
            True,
            f"✓ {name}: every bucket handed over after the right piece in all {len(CASES)} cases",
        )

    def matches(wrong, cases=PLAIN) -> bool:  # by default on the cases without an empty piece or zero bytes
        return all(answers[k] == wrong(*CASES[k]) for k in cases)

    def shown(cases) -> str:  # the first of ``cases`` where the answer differs, with the right answer
        k = next(k for k in cases if answers[k] != right[k])
        return f"(pieces {CASES[k][0]}, cap {CASES[k][1]}: {right[k]})"

    everywhere, zero = range(len(CASES)), [k for k in range(len(CASES)) if k not in NONZERO]
    if matches(solutions.handed_over_after):  # wrong only where a piece is empty or a gradient has 0 bytes
        for rule, says in ((_last_bucket_at_the_last_piece, LAST_PIECE), (_empty_pieces_dropped, EMPTY_DROPPED)):
            if matches(_bytes_kept(rule), everywhere):  # that mistake and ZERO_BYTES together: both named
                return Verdict(
                    False, f"✗ {name}: two mistakes: {says} {shown(NONZERO)}; and {ZERO_BYTES} {shown(zero)}"
                )
            if matches(rule, NONZERO):
                return Verdict(False, f"✗ {name}: {says} {shown(everywhere)}")
        if matches(_walk, everywhere):  # the walk keeps a last bucket by its bytes
            return Verdict(False, f"✗ {name}: {ZERO_BYTES} {shown(everywhere)}")
    for mistake, (wrong, says) in MISTAKES.items():
        if matches(wrong):
            return Verdict(False, f"✗ {name}: {says}")
    for a, b in PAIRS:
        if matches(lambda p, c, a=a, b=b: _walk(p, c, **WALKS[a][0], **WALKS[b][0])):
            return Verdict(False, f"✗ {name}: two mistakes: {WALKS[a][1]}; and {WALKS[b][1]}")
    if any(matches(lambda p, c, mine=mine: _walk(p, mine)) for mine in _fills(PLAIN)):
        return Verdict(False, f"✗ {name}: {CAP_IGNORED}")
    if matches(_open_bucket_closed_at_piece_0_end):
        return Verdict(False, f"✗ {name}: {FIRST_AT_PIECE_0}")
    k = next(k for k, (a, r) in enumerate(zip(answers, right)) if a != r)
    pieces, cap = CASES[k]
    return Verdict(
        False,
        f"✗ {name}: with pieces {pieces} and a cap of {cap} yours says {answers[k]}, ddp hands its buckets over "
        f"after pieces {right[k]}",
    )


__all__ = [
    "check_handover",
    "CAP_IGNORED",
    "CASES",
    "EMPTY_DROPPED",
    "FIRST_AT_PIECE_0",
    "LAST_PIECE",
    "MISTAKES",
    "NONZERO",
    "PAIRS",
    "PLAIN",
    "WALKS",
    "ZERO_BYTES",
]
