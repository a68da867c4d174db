"""Every ``>>> from minddp... import ...`` line in the package's docstrings imports names that exist.

The examples in docstrings are read by people before any code; an example that imports a name the
package does not have (``minddp.comm``'s did: ``traffic``) fails the reader on its first line. The
oracle is Python's own import: each line is executed as written.
"""

from __future__ import annotations

import ast
import importlib
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
    assert len(EXAMPLES) >= 5, EXAMPLES  # the scan finds them (a broken regex would find none)


def imported(statement: str) -> list[str]:
    """The names an import statement needs that cannot be imported (``[]``: it runs)."""
    if statement.startswith("import "):
        modules, names = [m.split(" as ")[0].strip() for m in statement[len("import ") :].split(",")], []
    else:
        module, _, rest = statement[len("from ") :].partition(" import ")
        modules, names = [module.strip()], [n.split(" as ")[0].strip() for n in rest.strip("() ").split(",")]
    missing = []
    for module in modules:
        try:
            loaded = importlib.import_module(module)
        except ImportError:
            missing.append(module)
            continue
        for name in names:
            if not hasattr(loaded, name):
                try:
                    importlib.import_module(f"{module}.{name}")  # a submodule: from minddp.comm import wire
                except ImportError:
                    missing.append(f"{module}.{name}")
    return missing


@pytest.mark.parametrize("where,line", EXAMPLES, ids=[f"{w}:{line[:40]}" for w, line in EXAMPLES])
def test_each_import_in_a_docstring_example_runs(where, line):
    statement = line.split(";")[0].strip()
    assert imported(statement) == [], f"{where}: the docstring example `{statement}` imports names that do not exist"


def test_the_check_finds_a_name_that_does_not_exist():
    assert imported("from minddp.comm import powerSGD_hook as powerSGD, traffic") == ["minddp.comm.traffic"]
