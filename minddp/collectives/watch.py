"""Watch a hand-written all_reduce: what every rank sends, exchange by exchange, read from the real messages.

:func:`watch` runs on every rank (a ``%%distributed`` cell of notebook 01):

1. fill a tensor with this rank's **mark**, ``2**rank``, so a sum of marks says which ranks'
   marks it holds (:func:`ranks_in`);
2. run the algorithm (:func:`~minddp.collectives.ring.ring_all_reduce` or the star,
   :func:`~minddp.collectives.naive.naive_all_reduce`) with its ``exchange`` wrapped to write down
   every call: peers, bytes each way, the chunks sent and what they held;
3. gather every rank's record on every rank.

:func:`draw_ring` and :func:`draw_bytes` draw the records, :func:`ring_facts` checks what the
drawing shows; :func:`seconds` evaluates the α-β model on
them: each exchange costs its rank ``α + β · bytes``, a rank's exchanges run one after the other, and
the collective is done when the busiest rank is. ``docs/ddp.md`` (*Watching the ring*) says more.

Example (the ``watch`` lines on 4 ranks, as notebook 01 runs them; one process cannot show a ring)::

    >>> ring = watch("ring", numel=4 * 65536)          # doctest: +SKIP
    >>> [r["sent"] for r in ring]  # bytes each rank sent: 2 (n - 1) / n of 1 MiB  # doctest: +SKIP
    [1572864, 1572864, 1572864, 1572864]
    >>> ranks_in(5)                                     # a chunk marked 1 + 4 holds the marks of ranks 0 and 2
    [0, 2]
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from minddp.collectives import naive, ring
from minddp.runtime.device import current_device

#: The algorithms :func:`watch` can run: name -> (module whose ``exchange`` is watched, its all_reduce).
ALGORITHMS = {"ring": (ring, ring.ring_all_reduce), "naive": (naive, naive.naive_all_reduce)}


def ranks_in(mark: int) -> list[int]:
    """The ranks whose marks a sum of marks holds: 5 -> [0, 2]."""
    return [r for r in range(mark.bit_length()) if mark >> r & 1]


def _chunks_within(t: torch.Tensor | None, chunks: list[torch.Tensor]) -> list[int]:
    """The chunks of the watched tensor whose memory lies inside ``t`` (a chunk, or the whole tensor)."""
    if t is None or t.numel() == 0:
        return []
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return [i for i, c in enumerate(chunks) if lo <= c.data_ptr() and c.data_ptr() + c.numel() * c.element_size() <= hi]


@contextlib.contextmanager
def _recording(module, chunks: list[torch.Tensor], exchanges: list[dict]):
    """Step 2: ``module.exchange`` writes each call into ``exchanges`` before making it."""
    real = module.exchange

    def nbytes(t: torch.Tensor | None) -> int:
        return 0 if t is None else t.numel() * t.element_size()

    def exchange(send, dst, recv, src, group):
        exchanges.append(
            {
                "to": dst if nbytes(send) else None,
                "from": src if nbytes(recv) else None,
                "sent": nbytes(send),
                "received": nbytes(recv),
                "chunks": _chunks_within(send, chunks),
                "before": [int(c[0]) for c in chunks],
            }
        )
        real(send, dst, recv, src, group)

    module.exchange = exchange
    try:
        yield
    finally:
        module.exchange = real


def watch(algorithm: str = "ring", numel: int = 4 * 65536, group=None) -> list[dict]:
    """Steps 1-3 (module doc), on every rank of ``group``: every rank's record, in rank order.

    A record: ``rank``, ``exchanges`` (one dict per call of ``exchange``: ``to``,
    ``from``, ``sent`` and ``received`` bytes, ``chunks`` sent, the marks ``before``;
    a ring's call sends one message and receives one, the star's sends or receives one),
    ``after`` (the marks at the end), ``sent`` and ``received`` (bytes in all),
    ``chunk_bytes`` and ``ok`` (the result is the sum of every rank's mark).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"watch({algorithm!r}): choose one of {', '.join(ALGORITHMS)}")
    group = group or dist.group.WORLD
    module, all_reduce = ALGORITHMS[algorithm]
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n > 30:
        raise ValueError(f"watch() marks each rank with a bit of a float32 (exact up to 2**24): {n} ranks is too many")
    tensor = torch.full((numel,), float(2**rank), device=current_device())  # step 1
    chunks = list(tensor.tensor_split(n))
    exchanges: list[dict] = []
    with _recording(module, chunks, exchanges):  # step 2
        all_reduce(tensor, group)
    record = {
        "rank": rank,
        "world": n,
        "algorithm": algorithm,
        "numel": numel,
        "exchanges": exchanges,
        "after": [int(c[0]) for c in chunks],
        "chunk_bytes": chunks[0].numel() * chunks[0].element_size(),
        "sent": sum(s["sent"] for s in exchanges),
        "received": sum(s["received"] for s in exchanges),
        "ok": bool((tensor == 2**n - 1).all()),
    }
    everyone: list = [None] * n
    dist.all_gather_object(everyone, record, group=group)  # step 3
    return everyone


def seconds(records: list[dict], link) -> float:
    """The α-β time of the watched all_reduce on ``link`` (a :class:`~minddp.comm.link.LinkSpec`): module doc."""
    return max(
        sum(link.latency + max(s["sent"], s["received"]) / link.bandwidth for s in r["exchanges"]) for r in records
    )


def ring_facts(records: list[dict]) -> list[tuple[bool, str]]:
    """What notebook 01 says of the ring's drawing, each as (holds, sentence), read from :func:`watch`'s records.

    An exchange s of the n - 1 of the reduce-scatter sends a chunk holding s + 1 ranks' marks, so each
    rank ends it with one complete chunk, a different one on each; an exchange of the all-gather sends a
    complete chunk over its neighbour's partial copy, so every rank ends with every chunk complete.
    """
    n, complete = len(records), 2 ** len(records) - 1  # a chunk marked 2**n - 1 holds every rank's mark
    steps = 2 * (n - 1)

    def before(rank: int, s: int) -> list[int]:  # rank's marks just before its exchange s (s = steps: the end)
        return records[rank]["exchanges"][s]["before"] if s < steps else records[rank]["after"]

    def sends(rank: int, s: int) -> tuple[int, int]:  # (the chunk rank sends in its exchange s, where to)
        return records[rank]["exchanges"][s]["chunks"][0], records[rank]["exchanges"][s]["to"]

    full = [[c for c, mark in enumerate(before(r, n - 1)) if mark == complete] for r in range(n)]
    where = ", ".join(f"rank {r}: chunk {' and '.join(map(str, c)) or 'none'}" for r, c in enumerate(full))
    return [
        (
            all(len(ranks_in(before(r, s)[sends(r, s)[0]])) == s + 1 for r in range(n) for s in range(n - 1)),
            f"in the reduce-scatter, the chunk a rank sends in its exchanges 1 to {n - 1} holds 1 to {n - 1} ranks' "
            "marks: one more at every exchange",
        ),
        (
            all(len(c) == 1 for c in full) and len({c[0] for c in full}) == n,
            f"after the n − 1 = {n - 1} reduce-scatter exchanges each rank holds exactly one complete chunk, a "
            f"different one on each rank ({where})",
        ),
        (
            all(
                before(r, s)[c] == complete and before(to, s)[c] != complete and before(to, s + 1)[c] == complete
                for r in range(n)
                for s in range(n - 1, steps)
                for c, to in [sends(r, s)]
            ),
            "in the all-gather, every chunk a rank sends is complete, and it overwrites its neighbour's partial copy",
        ),
        (
            all(before(r, steps) == [complete] * n for r in range(n)),
            f"after the {n - 1} all-gather exchanges every rank holds all {n} chunks complete",
        ),
    ]


def _label(mark: int, n: int) -> str:
    who = ranks_in(mark)
    return "all" if len(who) == n else "+".join(map(str, who))


def draw_ring(records: list[dict]):
    """The ring's exchanges, one row each: every rank's chunks (whose marks each holds), and the chunk it sends.

    Rows come from the records: the marks every rank held just before each of its
    exchanges (and at the end), so a sum sent in one row first shows in the next;
    the chunk outlined in red is the one the rank sent in that exchange, to the
    rank its ``to`` names (the red caption); the darker a chunk's green, the more
    ranks' marks it holds.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = records[0]["world"]
    rows = len(records[0]["exchanges"]) + 1
    fig, ax = plt.subplots(figsize=(2.0 + 2.2 * n, 0.95 * rows + 0.6))
    shade = plt.get_cmap("Greens")
    width = n + 1.6  # one rank's box of n chunks, and the gap after it
    for row in range(rows):
        y = -row * 1.6
        if row < rows - 1:
            phase = "reduce-scatter" if row < n - 1 else "all-gather"
            name = f"{phase}\nexchange {row % (n - 1) + 1} of {n - 1}"
        else:
            name = "end"
        ax.text(-0.4, y + 0.5, name, ha="right", va="center", fontsize=8)
        for r in records:
            x0 = r["rank"] * width
            marks = r["exchanges"][row]["before"] if row < rows - 1 else r["after"]
            sent = r["exchanges"][row]["chunks"] if row < rows - 1 else []
            for c, mark in enumerate(marks):
                share = len(ranks_in(mark)) / n
                ax.add_patch(
                    Rectangle(
                        (x0 + c, y),
                        0.92,
                        0.92,
                        facecolor=shade(0.15 + 0.75 * share),
                        edgecolor="crimson" if c in sent else "white",
                        linewidth=2.2 if c in sent else 0.5,
                    )
                )
                label = _label(mark, n)
                ax.text(
                    x0 + c + 0.46,
                    y + 0.46,
                    label,
                    ha="center",
                    va="center",
                    fontsize=7 if len(label) < 5 else 6,
                    color="white" if share > 0.6 else "black",
                )
            if sent:
                step = r["exchanges"][row]
                ax.text(
                    x0 + n / 2,
                    y - 0.22,
                    f"chunk {sent[0]} → rank {step['to']} ({step['sent'] / 1024:.0f} KiB)",
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="crimson",
                )
    for r in records:
        ax.text(r["rank"] * width + n / 2, 1.25, f"rank {r['rank']}", ha="center", fontsize=9, weight="bold")
    ax.set_xlim(-2.6, n * width)
    ax.set_ylim(-(rows - 1) * 1.6 - 0.6, 1.7)
    ax.axis("off")
    ax.set_title(
        f"ring all_reduce on {n} ranks: each box is one chunk, a row of {n} boxes one rank's tensor as it was just "
        "before that exchange\n(in the last row, end: after the last one); a chunk's label names the ranks whose "
        "marks it holds (the darker, the more);\noutlined in red: the chunk the rank sends (where to: the red text "
        "beneath)",
        fontsize=8.5,
    )
    fig.tight_layout()
    return fig


def draw_bytes(ring_records: list[dict], star_records: list[dict]):
    """Bytes each rank sent and received, the ring beside the star (both watched on the same tensor)."""
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(ring_records)
    mib = 2**20
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    x = np.arange(n, dtype=float)
    for offset, records, name, color in (
        (-0.2, ring_records, "ring", "tab:green"),
        (0.2, star_records, "star (through rank 0)", "tab:gray"),
    ):
        ax.bar(x + offset, [r["sent"] / mib for r in records], 0.38, color=color, label=f"{name}: sent")
        ax.scatter(
            x + offset,
            [r["received"] / mib for r in records],
            color="black",
            marker="_",
            s=300,
            zorder=3,
            label="received" if offset > 0 else None,
        )
    ax.set_xticks(x.tolist(), [f"rank {r}" for r in range(n)])
    ax.set_ylabel("MiB per all_reduce")
    ax.set_title(f"all_reduce of {ring_records[0]['numel'] * 4 / mib:g} MiB per rank on {n} ranks", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig
