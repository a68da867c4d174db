"""Every example in minddp's docstrings runs, and prints what it says.

Each minddp module's doctests (module, class and function docstrings) run with :mod:`doctest`, in
one process that holds a one-rank gloo process group, so the examples of the stages, the hooks and
the sharded rungs run as they are written (under :func:`minddp.launch` every rank runs the same);
``torch`` is imported for every example, as in any session that uses minddp.
An example that cannot run on one process (it needs several ranks, a GPU or files of a run) is
marked ``# doctest: +SKIP`` on its lines; the test counts them, so that skipping cannot quietly
become the rule.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import sys

import pytest
import torch
import torch.distributed as dist

import minddp
from minddp.runtime.compat import dynamo_reset

MODULES = sorted(m.name for m in pkgutil.walk_packages(minddp.__path__, "minddp.") if not m.name.endswith("__main__"))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.fixture(scope="module")
def one_rank_group():
    """A gloo world of one process, as ``minddp.launch(..., world_size=1)`` gives a rank."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        from minddp.exercises.checker import shutdown

        shutdown()  # the checker's ranks, which its examples start
        dist.destroy_process_group()


def examples(module) -> list[doctest.DocTest]:
    return [
        t for t in doctest.DocTestFinder(exclude_empty=True).find(module, extraglobs={"torch": torch}) if t.examples
    ]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_run(one_rank_group, monkeypatch, name):
    monkeypatch.delenv("MINDDP_BACKEND", raising=False)  # as a user runs them: the suite's gloo pin off
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []  # the failures of this one run (a second run could pass and hide a rare failure)
    for test in examples(module):
        torch.manual_seed(0)
        runner.run(test, out=report.append, clear_globs=False)
        # Dynamo puts names in the globals of code it compiled and deletes them when that code dies: it lets go
        # first (its cache emptied), then the globals are cleared, as the runner would have (else a KeyError from
        # Dynamo's callback lands in a later test as an unraisable warning)
        if "torch._dynamo" in sys.modules:
            dynamo_reset()
        test.globs.clear()
    result = runner.summarize(verbose=False)
    if result.failed:
        failed = f"{name}: {result.failed} of {result.attempted} examples failed:\n"
        pytest.fail(failed + "".join(report)[:6000])


def test_most_examples_run_rather_than_being_skipped():
    ran = skipped = 0
    for name in MODULES:
        for test in examples(importlib.import_module(name)):
            for example in test.examples:
                if example.options.get(doctest.SKIP):
                    skipped += 1
                else:
                    ran += 1
    assert ran >= 3 * skipped, f"{skipped} docstring examples are skipped and only {ran} run"
