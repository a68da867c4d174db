"""Show per-rank outputs in a notebook: each rank's block under its own label, in rank order.

1. A rank with nothing to show is skipped; every other rank gets a header
   line ``[rank r]``.
2. Under it: the rank's stdout, then its stderr (on the notebook's stderr,
   so it is tinted like any warning), then a note if the runner had to step
   in (released, restarted), then the cell's value, then its figures.
3. Values that can be rebuilt in the notebook (a tensor, a pandas table) are
   displayed as themselves, so tables render as tables; others as their repr.

While a long cell runs, :class:`LiveView` prints each line a rank prints,
as ``[rank r] line``, as soon as it arrives; when the cell ends it clears
them, so the notebook keeps only the complete blocks above.

Tracebacks are not shown here: :class:`~minddp.notebook.cluster.CellError`
carries them to the notebook's error output, so a failing cell looks failed.

Example (what ``cluster.run("rank * 10")`` returns on two ranks)::

    >>> from minddp.notebook.cluster import RankOutput
    >>> print(render_text([RankOutput(0, value_repr="0"), RankOutput(1, value_repr="10")]))
    [rank 0]
    0
    [rank 1]
    10
"""

from __future__ import annotations

import sys
import time

from minddp.notebook.cluster import RankOutput


def label(rank: int) -> str:
    return f"[rank {rank}]"


def render_text(outputs: list[RankOutput]) -> str:
    """Everything the ranks showed as one labelled text (figures as a count): for plain Python."""
    lines = []
    for out in outputs:
        body = _text_parts(out) + [f"<{len(out.figures)} figure(s)>"] * bool(out.figures)
        if out.error:
            body.append(out.error.rstrip("\n"))
        if body:
            lines.append(label(out.rank))
            lines.extend(body)
    return "\n".join(lines)


def show(outputs: list[RankOutput]) -> None:
    """Steps 1-3 with IPython's display machinery (figures as images)."""
    from IPython.display import Image, display

    for out in outputs:
        if not (_text_parts(out) or out.figures or out.value_repr is not None):
            continue  # step 1
        print(label(out.rank), flush=True)
        if out.stdout:  # step 2
            print(out.stdout, end="" if out.stdout.endswith("\n") else "\n", flush=True)
        if out.stderr:
            print(out.stderr, end="" if out.stderr.endswith("\n") else "\n", file=sys.stderr, flush=True)
        if out.note:
            print(f"({out.note})", file=sys.stderr, flush=True)
        if out.value_repr is not None:  # step 3
            try:
                value = out.value
            except Exception:  # noqa: BLE001 - a class that only exists on the rank
                value = None
            if value is None:
                print(out.value_repr, flush=True)
            else:
                display(value)
        for png in out.figures:
            display(Image(data=png, format="png"))


def _text_parts(out: RankOutput) -> list[str]:
    parts = [s.rstrip("\n") for s in (out.stdout, out.stderr) if s]
    if out.note:
        parts.append(f"({out.note})")
    if out.value_repr is not None:
        parts.append(out.value_repr)
    return parts


class LiveView:
    """Follow a running cell: complete lines as ``[rank r] line``, once it has run ``delay_s``.

    1. :meth:`write` (the cluster's ``on_stream``) splits each rank's text
       into lines, keeping a partial last line until its newline comes;
    2. lines are held back until the cell has run ``delay_s``, so a quick
       cell shows nothing twice; after that they print at once (stderr lines
       on stderr);
    3. :meth:`close` clears what was printed (``clear_output(wait=True)``:
       the notebook clears it when the final blocks arrive), so the saved
       notebook holds the complete per-rank blocks only.
    """

    def __init__(self, delay_s: float = 1.0):
        self.start, self.delay_s = time.monotonic(), delay_s
        self.shown = False
        self._partial: dict[tuple[int, str], str] = {}
        self._held: list[tuple[int, str, str]] = []

    def write(self, rank: int, kind: str, text: str) -> None:
        *lines, self._partial[(rank, kind)] = (self._partial.get((rank, kind), "") + text).split("\n")  # step 1
        self._held += [(rank, kind, line) for line in lines]
        if time.monotonic() - self.start < self.delay_s:  # step 2
            return
        for rank_, kind_, line in self._held:
            print(f"{label(rank_)} {line}", file=sys.stderr if kind_ == "stderr" else sys.stdout, flush=True)
            self.shown = True
        self._held = []

    def close(self) -> None:
        if self.shown:  # step 3
            from IPython.display import clear_output

            clear_output(wait=True)
