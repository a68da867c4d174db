"""Every numbered notebook runs top to bottom in a fresh kernel on 2 real ranks, as a reader would run it.

The oracle for "runs": nbclient raises on any error in a cell that is not
tagged ``raises-exception``. A tagged cell must really fail, with a
:class:`~minddp.notebook.CellError` whose traceback holds the text recorded
in the cell's ``minddp.expected_error`` metadata (see tools/build_notebooks.py),
so a notebook whose "broken on purpose" cell silently passed fails here.
Checks *inside* the notebooks compare against independent oracles (e.g. the
single-process gradient in 02), so a wrong number fails the cell.

``MINDDP_WRITE_NOTEBOOKS=1`` saves the executed notebook, outputs included,
back over the committed one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NUMBERED = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))


def test_the_five_step_through_notebooks_exist():
    assert [p.name[:2] for p in NUMBERED] == ["01", "02", "03", "04", "05"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path):
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on any unexpected error

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        expected = cell.metadata.get("minddp", {}).get("expected_error")
        if expected is None:
            assert not errors, f"cell {index} failed without being tagged as an expected error"
            continue
        assert "raises-exception" in cell.metadata.get("tags", []), f"cell {index}: expected error but no tag"
        assert len(errors) == 1, f"cell {index} should have failed with {expected!r} but did not"
        error = errors[0]
        assert error.ename == "CellError", f"cell {index}: {error.ename}: {error.evalue}"
        assert expected in "\n".join(error.traceback), f"cell {index}: {expected!r} not in the traceback"
    assert any(o.output_type != "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)

    if os.environ.get("MINDDP_WRITE_NOTEBOOKS"):  # refresh the committed outputs from this real run
        nbformat.write(nb, path)
