"""The suite's one machine-wide choice: it runs on the CPU over gloo, on any machine.

``MINDDP_BACKEND=gloo`` makes every ``auto`` choice in minddp (the launcher, the train command
started as a subprocess, the notebook runner) pick gloo on the CPU, so a test's verdict is the
same on a laptop and on a GPU machine. Tests of the GPU path (``tests/test_gpu.py``) take the
variable away for their own launches and skip where there is no GPU.
"""

import os

os.environ["MINDDP_BACKEND"] = "gloo"

import pytest

# The longest tests first, so that neither worker ends with a long one still to run (seconds on a quiet
# 2-core machine: the notebooks' own runs, each tens of seconds to two minutes; the GPU report's dry run, one;
# the resume runs, about two).
# pyproject's addopts keep this order (--no-loadscope-reorder: xdist would otherwise put the files with the
# most tests first, and so every notebook, one test each, last).
FIRST = ["test_notebooks.py", "test_gpu_report.py", "test_train.py", "test_bench.py", "test_resume.py"]
#: The notebooks by their run's length, longest first (the rest follow in their order).
LONGEST_NOTEBOOKS = ["03_build_up", "06_sharding", "04_comm_hooks", "05_reading_traces", "02_simple_ddp"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, pyproject's addopts) a file runs on one worker.

    A file's module-scoped fixtures launch their ranks once that way (a test file split over two workers
    would launch them twice); the notebooks, one test each and the longest of all, are spread one by one.
    Without xdist (``-p no:xdist``) the marks do nothing and the order is the only change.

    ``tryfirst``: each xdist worker turns the ``xdist_group`` marks into node ids in its own
    ``pytest_collection_modifyitems``, which pluggy would otherwise call before this one (it was registered
    later): the marks came too late, every test was scheduled alone, and a module's fixtures ran on both workers.
    """
    for item in items:
        if item.path.name != "test_notebooks.py":
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    rank = {name: i for i, name in enumerate(FIRST)}
    runs = {f"test_notebook_runs_top_to_bottom[{name}]": i for i, name in enumerate(LONGEST_NOTEBOOKS)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order
    items.sort(key=lambda item: runs.get(item.name, len(runs)))  # the longest notebooks before all else


@pytest.fixture(scope="session", autouse=True)
def rank_server():
    """This process's process server, started as the train command starts its own: importing what its ranks need.

    The first launch in a process starts the server that forks every later rank (``rank_context``). Started here
    with the train command's imports (``rank_imports``), it spares every rank of every test those seconds of
    imports, whichever test launches first.
    """
    from minddp.runtime.launch import rank_imports
    from minddp.runtime.processes import rank_context
    from minddp.train.run import train_rank

    rank_context(rank_imports(train_rank))
