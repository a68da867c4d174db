"""docs/debugging.md quotes debug mode's lines as recorded from tests/debug_bugs.py, each naming the line of the
script it came from (``at tests/debug_bugs.py:72``): every such citation must point at a line that makes the call
it names, so an edit of the script that moves its lines fails here instead of leaving the page wrong."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = "tests/debug_bugs.py"

# ``<call>(...) at tests/debug_bugs.py:N``, ``<call> at ...:N``, ``... called directly at ...:N``, and minddp's own
# collectives, said with the part of the script they belong to (``... at ...:N in minddp debug's step check``)
CITATION = re.compile(
    r"(?P<call>[A-Za-z_]+)(?:\([^)]*\))? at "
    + re.escape(CITED)
    + r":(?P<line>\d+)(?P<part> in minddp debug's \w+ check)?"
)
PART = {" in minddp debug's step check": "optimizer.step(", " in minddp debug's forward check": "ddp(x"}


def citation_problems(text: str, lines: list[str]) -> list[str]:
    """Each citation in ``text`` whose line of ``lines`` (the cited file) does not make the call it names."""
    problems = []
    for m in CITATION.finditer(" ".join(text.split())):
        number, call = int(m["line"]), m["call"]
        must = PART.get(m["part"]) or (".module(" if call == "directly" else f"{call}(")
        line = lines[number - 1] if 0 < number <= len(lines) else ""
        if must not in line:
            problems.append(f"{CITED}:{number} is cited for `{must}` but reads: {line.strip()!r}")
    return problems


def test_every_line_the_debugging_page_cites_makes_the_call_it_names():
    text = (ROOT / "docs" / "debugging.md").read_text()
    lines = (ROOT / CITED).read_text().splitlines()
    assert len(CITATION.findall(" ".join(text.split()))) >= 10  # the page's recorded lines are all read
    assert citation_problems(text, lines) == []


def test_a_citation_that_drifted_is_caught():
    lines = (ROOT / CITED).read_text().splitlines()
    barrier = next(i for i, line in enumerate(lines, 1) if "dist.barrier()" in line)
    drifted = f"its collective #19 is barrier() at {CITED}:{barrier + 1} (step 2)"
    assert citation_problems(drifted, lines) == [
        f"{CITED}:{barrier + 1} is cited for `barrier(` but reads: {lines[barrier].strip()!r}"
    ]
    assert citation_problems(f"barrier() at {CITED}:{barrier} (step 2)", lines) == []
