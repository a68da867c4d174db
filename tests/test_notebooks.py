"""The notebooks: each runs top to bottom from its ``.py`` source, and each ``.ipynb`` is that source, run.

* **Runs**: every ``notebooks/NN_*.py`` is executed in a fresh kernel on 2 real
  ranks, as a reader would run it (:func:`minddp.notebook.refresh.execute`).
  The oracle for "runs": nbclient raises on an error in any cell not tagged
  ``raises-exception``, and a tagged cell must fail with the text recorded in
  its ``minddp.expected_error`` metadata, so a "broken on purpose" cell that
  silently passes fails here. The checks *inside* the notebooks compare with
  independent oracles (02: the single-process gradient and parameters; the
  exercise checker: a single process and torch's DDP), so a wrong number fails
  its cell.
* **Pairs**: every ``.ipynb`` has the cells of its ``.py`` (sources, tags,
  metadata) and outputs from one top-to-bottom run (execution counts 1, 2, 3,
  ...), so what a reader sees committed is what the source produces.

Refresh the committed outputs with ``python -m minddp.notebook.refresh``.
"""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from minddp.notebook import refresh

SOURCES = refresh.sources()


def test_every_notebook_has_its_source():
    assert [p.name[:2] for p in SOURCES] == ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]
    paired = {p.with_suffix(".ipynb").name for p in SOURCES}
    assert {p.name for p in refresh.NOTEBOOKS.glob("*.ipynb")} == paired


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_committed_notebook_is_its_source_run(source):
    assert refresh.pair_problems(source) == []


@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source):
    nb, took = refresh.execute(source)  # raises NotebookError on any unexpected outcome
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    print(f"{source.name}: {took:.0f} s")


def test_the_checks_catch_a_cell_that_should_have_failed_and_a_pair_out_of_sync(tmp_path):
    quiet = new_code_cell("1 + 1", metadata={"tags": ["raises-exception"], "minddp": {"expected_error": "boom"}})
    quiet.outputs = [new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    wrong = new_code_cell(
        "raise ValueError('bang')", metadata={"tags": ["raises-exception"], "minddp": {"expected_error": "boom"}}
    )
    wrong.outputs = [new_output("error", ename="ValueError", evalue="bang", traceback=["ValueError: bang"])]
    loose = new_code_cell("raise ValueError('boom')")
    loose.outputs = [new_output("error", ename="ValueError", evalue="boom", traceback=["ValueError: boom"])]
    problems = refresh.expected_error_problems(new_notebook(cells=[quiet, wrong, loose]))
    assert problems == [
        "cell 0 should have failed with 'boom' but did not",
        "cell 1 failed, but 'boom' is not in its traceback (ValueError: bang)",
        "cell 2 failed without being tagged raises-exception",
    ]

    source = tmp_path / "07_demo.py"
    source.write_text("# %% [markdown]\n# A title\n\n# %%\nx = 1\n")
    assert "07_demo.ipynb is missing" in refresh.pair_problems(source)[0]
    nb = refresh.read_source(source)
    nb.cells[1].execution_count = 1
    refresh.write(nb, source)
    assert refresh.pair_problems(source) == []
    source.write_text("# %% [markdown]\n# A title\n\n# %%\nx = 2\n")  # edited, not re-run
    assert refresh.pair_problems(source) == [
        "cell 1 differs between 07_demo.py and 07_demo.ipynb: run python -m minddp.notebook.refresh 07"
    ]
    nb.cells[1].execution_count = None  # saved without running
    nbformat.write(nb, source.with_suffix(".ipynb"))
    source.write_text("# %% [markdown]\n# A title\n\n# %%\nx = 1\n")
    assert "not from one top-to-bottom run" in refresh.pair_problems(source)[0]


@pytest.mark.timeout(300)
def test_a_refresh_fails_when_a_claim_of_the_notebook_no_longer_holds(tmp_path):
    """A comparing sentence is checked by the notebook itself (``lesson.claim``): when the run it is made about
    contradicts it, executing the notebook (what the refresh and this suite do) fails, naming the claim."""
    source = tmp_path / "07_claims.py"
    source.write_text(
        "# %%\nfrom minddp.notebook import lesson\nsteps = {'ga': 66, 'simple': 198}\n\n"
        "# %%\nlesson.claim(steps['ga'] * 3 == steps['simple'], 'ga makes a third of simple s calls')\n\n"
        "# %%\nsteps['ga'] = 70                    # a later run whose numbers reverse the sentence\n\n"
        "# %%\nlesson.claim(steps['ga'] * 3 == steps['simple'], 'ga makes a third of simple s calls')\n"
    )
    with pytest.raises(refresh.NotebookError) as failed:
        refresh.execute(source, timeout_s=120)
    message = str(failed.value)
    assert "07_claims.py: a cell failed" in message
    assert "claim no longer holds for the run shown: ga makes a third of simple s calls" in message
    assert "AssertionError" in message


def test_what_changed_between_two_stages_is_read_from_the_package():
    """The notebooks' diffs come from the code that runs: a changed method diffs, an inherited one does not."""
    import inspect

    from minddp.ladder import STAGES
    from minddp.notebook.source import stage_diff

    hook, hook_async = STAGES["hook"], STAGES["hook-async"]
    diff = stage_diff(hook, hook_async)
    removed = next(ln for ln in inspect.getsource(hook._sent).splitlines() if "future.wait()" in ln).strip()
    added = next(ln for ln in inspect.getsource(hook_async._sent).splitlines() if "append" in ln).strip()
    assert f"-    {removed}" in diff and f"+    {added}" in diff
    assert "--- HookDDP._sent  (minddp/stages/hook.py)" in diff
    unchanged = diff.splitlines()[-1]
    assert unchanged.startswith("# unchanged:") and "_grad_ready" in unchanged and "_sent" not in unchanged
    assert "calls super()" in diff  # hook-async's finish runs hook's inside it


def test_a_diff_between_stages_that_are_not_parent_and_child_says_which_method_super_reaches():
    """BucketDDP derives from HookDDP, not from AsyncHookDDP: its diff from hook-async must not say that
    AsyncHookDDP's __init__, finish or forward still run inside BucketDDP's (they do not; issue 49, read 3 of 03)."""
    from minddp.ladder import STAGES
    from minddp.notebook.source import stage_diff

    before, after = STAGES["hook-async"], STAGES["bucket"]
    assert before not in after.__mro__  # the premise: hook-async is not bucket's parent
    diff = stage_diff(before, after)
    for name in ("__init__", "finish_gradient_synchronization", "forward"):
        assert f"AsyncHookDDP.{name} still runs" not in diff
        reached = next(c for c in after.__mro__[1:] if name in vars(c))  # what super() reaches, read from the MRO
        assert f"calls super(), which runs {reached.__name__}.{name}, not AsyncHookDDP.{name}" in diff
    # and where the stage before IS the parent, the diff still says it runs inside
    assert "AsyncHookDDP.finish_gradient_synchronization still runs" not in stage_diff(STAGES["hook"], before)
    assert "HookDDP.finish_gradient_synchronization still runs, inside it" in stage_diff(STAGES["hook"], before)


def test_a_method_that_calls_super_is_shown_extended_not_replaced():
    """HookDDP.__init__ runs SimpleDDP.__init__ (its broadcast included) through super(): its diff removes no line of
    it, marks the super() call as kept, and every other line as added (issue 49: a diff true to the code)."""
    from minddp.ladder import STAGES
    from minddp.notebook.source import stage_diff

    init = stage_diff(STAGES["ga"], STAGES["hook"]).split("\n\n")[0]
    assert init.startswith("--- SimpleDDP.__init__") and "+++ HookDDP.__init__" in init
    body = [line for line in init.splitlines()[2:] if not line.startswith("#")]
    assert not any(line.startswith("-") for line in body)  # the broadcast still runs: not shown as removed
    assert [line for line in body if line.startswith(" ")] == ["     super().__init__(module, process_group)"]
    assert all(line.startswith(("+", " ")) for line in body)
