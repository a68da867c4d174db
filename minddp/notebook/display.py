"""Show per-rank outputs in a notebook: each rank's block under its own label, in rank order.

1. A rank with nothing to show is skipped; every other rank gets a header
   line ``[rank r]``.
2. Under it: the rank's stdout, then its stderr (on the notebook's stderr,
   so it is tinted like any warning), then a note if the runner had to step
   in (released, restarted), then the cell's value, then its figures.
3. Values that can be rebuilt in the notebook (a tensor, a pandas table) are
   displayed as themselves, so tables render as tables; others as their repr.

Tracebacks are not shown here: :class:`~minddp.notebook.cluster.CellError`
carries them to the notebook's error output, so a failing cell looks failed.

Example::

    >>> print(render_text(cluster.run("rank * 10")))
    [rank 0]
    0
    [rank 1]
    10
"""

from __future__ import annotations

import sys

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
            continue                                                    # step 1
        print(label(out.rank), flush=True)
        if out.stdout:                                                  # step 2
            print(out.stdout, end="" if out.stdout.endswith("\n") else "\n", flush=True)
        if out.stderr:
            print(out.stderr, end="" if out.stderr.endswith("\n") else "\n", file=sys.stderr, flush=True)
        if out.note:
            print(f"({out.note})", file=sys.stderr, flush=True)
        if out.value_repr is not None:                                  # step 3
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
