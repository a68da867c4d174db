"""Run the notebooks from their sources and save them with the outputs of that run.

    python -m minddp.notebook.refresh                    # every notebook, in order
    python -m minddp.notebook.refresh 03 05              # those whose name starts so
    python -m minddp.notebook.refresh --check            # run and check, write nothing

A notebook's source is ``notebooks/NN_name.py`` (jupytext's *percent* format); the ``.ipynb``
beside it is its pair, the same cells plus the outputs of a real run. This command:

1. reads the ``.py`` with jupytext;
2. executes it top to bottom in a fresh kernel (nbclient, in ``notebooks/``, this checkout first
   on the kernel's ``PYTHONPATH``);
3. checks that each cell tagged ``raises-exception`` fails with the text of its
   ``minddp.expected_error`` metadata; any other error stops the run;
4. writes the ``.ipynb`` (cell ids stable) and prints how long the notebook took.

``notebooks/README.md`` (*Sources and pairs*, *The format*) shows the format and what
``tests/test_notebooks.py`` checks. A failing-on-purpose cell in a ``.py`` source::

    # %% tags=["raises-exception"] minddp={"expected_error": "parameters are not in sync"}
    # %%distributed
    check_in_sync(model.parameters(), "parameters")
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
FORMAT = "py:percent"


class NotebookError(RuntimeError):
    """A notebook failed where it should not have, or did not fail where it should; says which cell."""


def sources(prefixes: list[str] | None = None) -> list[Path]:
    """The notebook sources, ``notebooks/[0-9][0-9]_*.py``, in order (those starting with a prefix)."""
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if prefixes:
        found = [p for p in found if any(p.name.startswith(x) for x in prefixes)]
    return found


def read_source(source: Path):
    """Step 1: the notebook the ``.py`` describes (no outputs), with stable cell ids."""
    import jupytext

    nb = jupytext.read(source, fmt=FORMAT)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{source.stem[:2]}-{i:02d}"
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    return nb


def execute(source: Path, timeout_s: int = 600):
    """Steps 1-3: the executed notebook and how long it took (seconds); raises :class:`NotebookError`."""
    import nbclient
    from jupyter_client.manager import KernelManager

    nb = read_source(source)
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):  # the kernel imports this checkout
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)

    # The kernel talks to this process over Unix sockets (ipc), not TCP: nothing of a refresh listens on a port.
    class UnixSocketKernel(KernelManager):  # nbclient builds (and shuts down) the kernel's manager from this class
        def __init__(self, **kwargs):
            super().__init__(transport="ipc", ip=os.path.join(sockets, "kernel"), **kwargs)

    client = nbclient.NotebookClient(
        nb,
        kernel_manager_class=UnixSocketKernel,
        timeout=timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(source.parent)}},
    )
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as sockets:
            client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        raise NotebookError(f"{source.name}: a cell failed that is not tagged raises-exception:\n{exc}") from None
    took = time.monotonic() - start
    problems = expected_error_problems(nb)
    if problems:
        raise NotebookError(f"{source.name}: " + "; ".join(problems))
    return nb, took


def expected_error_problems(nb) -> list[str]:
    """Step 3: every tagged cell failed with its expected text; no other cell failed."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        tagged = "raises-exception" in cell.metadata.get("tags", [])
        expected = cell.metadata.get("minddp", {}).get("expected_error")
        if tagged != (expected is not None):
            problems.append(
                f"cell {index}: a raises-exception tag needs minddp.expected_error, and the other way round"
            )
        elif not tagged and errors:
            problems.append(f"cell {index} failed without being tagged raises-exception")
        elif tagged and len(errors) != 1:
            problems.append(f"cell {index} should have failed with {expected!r} but did not")
        elif tagged and expected not in "\n".join(errors[0].traceback):
            problems.append(
                f"cell {index} failed, but {expected!r} is not in its traceback ({errors[0].ename}: {errors[0].evalue})"
            )
    return problems


def pair_problems(source: Path) -> list[str]:
    """What differs between a ``.py`` source and its ``.ipynb`` (cells, their tags and metadata, the run)."""
    import nbformat

    paired = source.with_suffix(".ipynb")
    if not paired.exists():
        return [f"{paired.name} is missing: run python -m minddp.notebook.refresh {source.name[:2]}"]
    want, have = read_source(source), nbformat.read(paired, as_version=4)
    fix = f"run python -m minddp.notebook.refresh {source.name[:2]}"
    if len(want.cells) != len(have.cells):
        return [f"{source.name} has {len(want.cells)} cells, {paired.name} {len(have.cells)}: {fix}"]
    problems = []
    for index, (a, b) in enumerate(zip(want.cells, have.cells)):
        keys = ("tags", "minddp")
        if (a.cell_type, a.source.strip(), {k: a.metadata.get(k) for k in keys}) != (
            b.cell_type,
            b.source.strip(),
            {k: b.metadata.get(k) for k in keys},
        ):
            problems.append(f"cell {index} differs between {source.name} and {paired.name}: {fix}")
    counts = [c.get("execution_count") for c in have.cells if c.cell_type == "code"]
    if counts != list(range(1, len(counts) + 1)):
        problems.append(
            f"{paired.name}'s outputs are not from one top-to-bottom run (execution counts {counts}): {fix}"
        )
    return problems


def write(nb, source: Path) -> Path:
    """Step 4: the ``.ipynb`` beside ``source``, paired with it."""
    import jupytext

    nb.metadata["jupytext"] = {"formats": f"ipynb,{FORMAT}"}
    target = source.with_suffix(".ipynb")
    jupytext.write(nb, target, fmt="ipynb")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minddp.notebook.refresh",
        description="Run the notebooks from their .py sources and save the .ipynb with the outputs of that run.",
    )
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 03 (default: all)")
    parser.add_argument("--check", action="store_true", help="run and check only; write nothing")
    args = parser.parse_args(argv)
    chosen = sources(args.names)
    if not chosen:
        print(f"no notebook in {NOTEBOOKS} starts with {' or '.join(args.names)}", file=sys.stderr)
        return 2
    total = 0.0
    for source in chosen:
        try:
            nb, took = execute(source)
        except NotebookError as exc:
            print(exc, file=sys.stderr)
            return 1
        total += took
        done = "checked" if args.check else f"wrote {write(nb, source).relative_to(ROOT)}"
        print(f"{source.name}: ran in {took:.0f} s; {done}", flush=True)
    print(f"{len(chosen)} notebook(s) in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
