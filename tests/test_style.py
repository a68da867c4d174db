"""One formatter and one linter for the whole tree (ruff; the settings are in pyproject.toml).

``ruff format --check`` fails on a file the formatter would change; ``ruff check`` on an unused import,
an undefined name, imports out of order or a line over the limit. Fix with ``ruff format . && ruff check --fix .``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_tree_is_formatted():
    done = ruff("format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout}{done.stderr}"


def test_the_linter_finds_nothing():
    done = ruff("check", ".")
    assert done.returncode == 0, f"run `ruff check --fix .`, then fix the rest by hand:\n{done.stdout}{done.stderr}"


def test_the_checks_see_a_bad_file(tmp_path):
    # The oracle itself: a file with an unused import and a long unformatted line must fail both checks.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = {'a':1}\n" + "y = " + " + ".join(["1"] * 60) + "\n")
    config = ["--config", str(ROOT / "pyproject.toml")]
    assert ruff("format", "--check", *config, str(bad)).returncode == 1
    assert ruff("check", *config, str(bad)).returncode == 1
