"""Each stage is a small delta over the last: hold every stage file to a line budget.

Counted: lines that are neither blank nor part of the module docstring, so
teaching prose is free and code is not.
"""

import ast
import inspect

from minddp.stages import STAGES

BUDGET = 130            # non-blank code lines per stage file
BUDGET_OVERRIDES = {"ddp": 260}


def code_lines(path: str) -> int:
    source = open(path).read()
    doc = ast.get_docstring(ast.parse(source), clean=False) or ""
    return sum(1 for line in source.replace(doc, "", 1).splitlines() if line.strip())


def test_every_stage_file_fits_its_budget():
    seen = set()
    for name, cls in STAGES.items():
        path = inspect.getsourcefile(cls)
        if path in seen:
            continue
        seen.add(path)
        n = code_lines(path)
        budget = BUDGET_OVERRIDES.get(name, BUDGET)
        assert n <= budget, f"stage {name!r} ({path}) has {n} code lines, over its budget of {budget}"


def test_each_stage_subclasses_the_one_before():
    order = [STAGES[n] for n in ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]]
    assert issubclass(order[1], order[0]) and issubclass(order[2], order[1])
    assert issubclass(order[3], order[2]) and issubclass(order[4], order[2]) and issubclass(order[5], order[4])
