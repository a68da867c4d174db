"""Every ``>>> from minddp... import ...`` line in the package's docstrings imports names that exist.

The examples in docstrings are read by people before any code; an example that imports a name the
package does not have (``minddp.comm``'s did: ``traffic``) fails the reader on its first line. The
oracle is Python's own import: each line is executed as written.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import minddp

ROOT = pathlib.Path(minddp.__file__).parent
IMPORT = re.compile(r"^\s*>>> ((?:from minddp[\w.]* import [^#]+)|(?:import minddp[\w.]*[^#]*))")


def example_imports() -> list[tuple[str, str]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                for line in doc.splitlines():
                    m = IMPORT.match(line)
                    if m:
                        found.append((f"{path.relative_to(ROOT.parent)}", m.group(1).strip().rstrip(";")))
    return found


EXAMPLES = example_imports()


def test_the_docstrings_have_import_examples():
    assert len(EXAMPLES) >= 5, EXAMPLES         # the scan finds them (a broken regex would find none)


@pytest.mark.parametrize("where,line", EXAMPLES, ids=[f"{w}:{line[:40]}" for w, line in EXAMPLES])
def test_each_import_in_a_docstring_example_runs(where, line):
    statement = line.split(";")[0].strip()
    try:
        exec(statement, {})
    except ImportError as exc:
        pytest.fail(f"{where}: the docstring example `{statement}` fails: {exc}")
