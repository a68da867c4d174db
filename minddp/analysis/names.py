"""The names every table and figure of the analysis shares: the stages' order, the collective kinds, the measures.

One table each, read by every place that needs it, so a stage, a kind of collective or a measure is ordered,
named and coloured the same in the per-step counts, the verdict's sentences, the comparison's rows, the console's
headers and the figures:

1. :data:`STAGE_ORDER` and :func:`stage_sort_key`: the stages in reading order (the build-up), then the others;
2. :data:`KINDS`: each kind of collective a step is counted by (its column prefix, its name in a sentence, its
   label, its console header, its colour, and whether gloo runs it as another kind: :data:`STARRED`);
3. :data:`MEASURES`: the per-step columns of the measures (:mod:`minddp.analysis.metrics`, docs/analysis.md,
   "The measures"), each with the label a table row or a figure's axis names it by and the factor from the
   stored unit (µs, %) to the printed one (ms, %).

Nothing here imports the rest of the analysis: every module of it may import this one.

Example::

    >>> sorted(["torch", "mine", "ddp", "simple"], key=stage_sort_key)
    ['simple', 'ddp', 'torch', 'mine']
    >>> [kind.count(n) for kind, n in zip(KINDS, (1, 3, 0))]
    ['1 all_reduce', '3 reduce-scatters', '0 all_gathers']
    >>> MEASURES["non_compute_us"]
    ('non-compute (ms)', 0.001)
"""

from __future__ import annotations

from dataclasses import dataclass

#: Stages in reading order (the build-up), then anything else alphabetically (step 1).
STAGE_ORDER = [
    "single",
    "simple",
    "ga",
    "hook",
    "hook-async",
    "bucket",
    "bucket-async",
    "ddp",
    "zero1",
    "zero2",
    "fsdp",
    "torch",
]


def stage_sort_key(name: str):
    """Step 1: the key that sorts stage names in reading order."""
    return (STAGE_ORDER.index(name), "") if name in STAGE_ORDER else (len(STAGE_ORDER), name)


@dataclass(frozen=True)
class Kind:
    """One kind of collective (step 2)."""

    key: str  # the columns' prefix: ``<key>_calls_per_step``, ``<key>_bytes``; the events: ``RankIntervals.<key>s``
    name: str  # one call, in a sentence
    label: str  # a figure's legend
    short: str  # a console header (at most 10 characters)
    color: str
    starred: bool  # gloo runs it as an all_reduce: :data:`STARRED` says so under every table that shows it

    def count(self, n: float) -> str:
        """``3 reduce-scatters``: ``n`` calls of this kind, in a sentence."""
        return f"{n:g} {self.name}{'s' if n != 1 else ''}"


#: Step 2: the collective kinds a step's messages are counted by, in the order every table lists them.
KINDS = (
    Kind("allreduce", "all_reduce", "all_reduce", "all_reduce", "#4c72b0", False),
    Kind("reducescatter", "reduce-scatter", "reduce-scatter (as all_reduce on gloo)", "red-scat*", "#937860", True),
    Kind("allgather", "all_gather", "all_gather", "all_gather", "#55a868", False),
)
#: The footnote of every starred kind.
STARRED = "* on gloo a reduce-scatter runs as an all_reduce of the whole bucket (Wire.reduce_scatter)"

#: Step 3: per-step column -> (the label a table row or an axis names it by, the factor from the stored unit).
MEASURES = {
    "step_time_us": ("step (ms)", 1e-3),
    "non_compute_us": ("non-compute (ms)", 1e-3),
    "comm_time_us": ("comm in flight (ms)", 1e-3),
    "overlap_pctg": ("overlap (%)", 1.0),
    "interleaved_us": ("interleaved (ms)", 1e-3),
    "waited_us": ("waited (ms)", 1e-3),
    "exposed_us": ("exposed (ms)", 1e-3),
}

#: Step 3 for the summary's columns that hold a measure: the header a table prints for each (the other columns
#: are named after themselves, :func:`minddp.analysis.report.readable_name`).
HEADERS = {
    "non_compute_time_us": "non-compute time (ms)",
    "non_compute_pctg": "non-compute (%)",
    "comm_comp_overlap_pctg": "overlap (%)",
    "comm_time_per_step_us": "comm in flight per step (ms)",
}

__all__ = ["STAGE_ORDER", "stage_sort_key", "Kind", "KINDS", "STARRED", "MEASURES", "HEADERS"]
