"""No run's number in a notebook's prose: a measured number is printed by the cell that measures it.

A notebook's markdown is written once; its outputs change with every run. A sentence such as "hook-async
waited 152 ms" in markdown is true of the run its writer saw and false after the next refresh, and no
``claim`` checks it. Nine rounds of learner reads found that class again and again. So every number with
a unit a run measures (a time, a percentage, a rate, a ratio written "3×") in a markdown cell must be one of
the few listed below with why it does not change from run to run: a setting the notebook passes, a constant
of the code or of the emulated link (computed from bytes and bandwidth, not timed), or a figure quoted from a
named source (the blog, a recorded benchmark page). Anything else is flagged with its notebook and text; the
fix is a cell that prints the sentence from the run's values (or a sentence without the number).

A listed phrase that no longer occurs in its notebook fails too, so the list cannot outlive the prose.
"""

from __future__ import annotations

import re

import pytest

from minddp.notebook import refresh

SOURCES = refresh.sources()

# A number, then a unit a run measures. The number is not part of a longer token (a name such as t4 or
# fp16, a version such as 2.13.0), and the unit ends the token (ms, not msg); a × between two numbers
# (2 × 1023 hops) is arithmetic, not a measured ratio.
UNITS = r"ns|µs|us|ms|s|min|%|Gbit/s|Mbit/s|GB/s|MB/s|kB/s|×|x"
RUN_NUMBER = re.compile(rf"(?<![\w.])\d+(?:[.,]\d+)?\s?(?:{UNITS})(?![\w/])(?!\s?\d)")

#: notebook stem -> the phrases (as the markdown has them, whitespace collapsed) whose numbers do not change
#: between runs, each with why. A hit is allowed when one of its notebook's phrases covers it.
SETTING = "a setting the notebook passes to its run"
LINK = "a constant of the emulated link (minddp.comm.link's table), not a timing"
MODELED = "modeled on the emulated link from the model's fixed gradient bytes and message count (not timed)"
STEADY: dict[str, dict[str, str]] = {
    "01_collectives": {
        "(`1gbit`: 1 Gbit/s = 125 MB/s)": LINK,
        "rank 1 sleeps 0.5 s before it arrives": SETTING,
        "rank 1's 0.5 s of sleep": "the setting above, named as what the printed wait need not equal",
        "over the 1 Gbit/s link": LINK,
        "join the second message late, at 80 ms": "a made-up step's input, not measured",
        "until 80 ms, and the wait after backward, from 70 ms,": "the made-up step's inputs, not measured",
    },
    "03_build_up": {
        "**emulated 1 Gbit/s link**": LINK,
        "**sized for 4 × T4**": "the blog's machine: four T4 GPUs",
        "over 100 Gbit/s InfiniBand": LINK,
    },
    "04_comm_hooks": {},
    "05_reading_traces": {
        "**emulated 1 Gbit/s link**": LINK,
        "preset's α = 50 µs and β = 8 ns a byte (1 Gbit/s)": LINK,
    },
    "07_fault_tolerance": {
        "a 10 ms pause per attempt": SETTING,
    },
    "08_debugging": {},
    "10_diloco": {
        "an emulated link of 5 Mbit/s and 5 ms per hop": SETTING,
        "DDP computes less than 5 % of the time": "the step-time model's estimate on that link (not timed)",
    },
}


def prose(source) -> list[str]:
    """The notebook's markdown cells, each with its whitespace collapsed (lines joined by one space)."""
    nb = refresh.read_source(source)
    return [" ".join(cell.source.split()) for cell in nb.cells if cell.cell_type == "markdown"]


def run_numbers(text: str, steady: dict[str, str]) -> list[str]:
    """The numbers with a measured unit in ``text`` that none of the ``steady`` phrases covers."""
    covered = [
        (m.start(), m.end()) for phrase in steady for m in re.finditer(re.escape(" ".join(phrase.split())), text)
    ]
    return [
        hit.group(0)
        for hit in RUN_NUMBER.finditer(text)
        if not any(start <= hit.start() and hit.end() <= end for start, end in covered)
    ]


def test_the_scan_finds_a_measured_number_and_passes_a_listed_setting():
    text = "Here the link is 1 Gbit/s. hook-async waited 152 ms (12.5 % of its step), 3× bucket's; fp16 is 2 bytes."
    assert run_numbers(text, {}) == ["1 Gbit/s", "152 ms", "12.5 %", "3×"]
    assert run_numbers(text, {"the link is 1 Gbit/s": "a setting"}) == ["152 ms", "12.5 %", "3×"]
    assert run_numbers("torch 2.13.0, a t4, 16 msgs, 2 ranks of 4 MiB, 2 × 1023 hops", {}) == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_no_run_number_in_a_notebooks_markdown(source):
    steady = STEADY.get(source.stem, {})
    cells = prose(source)
    found = [f"markdown cell {i}: {hit!r}" for i, text in enumerate(cells) for hit in run_numbers(text, steady)]
    assert found == [], (
        f"{source.name} states numbers a run measures in its markdown (a re-run makes them false): print them "
        f"from a cell, or drop them; a setting or a constant goes into STEADY with why: {found}"
    )
    whole = "\n".join(cells)
    stale = [phrase for phrase in steady if " ".join(phrase.split()) not in whole]
    assert stale == [], f"STEADY lists phrases {source.name} no longer has: {stale}"
