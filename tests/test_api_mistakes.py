"""The Python API's first mistakes get one line naming the fix, before anything starts.

1. ``minddp.launch`` of a function the ranks cannot get (a lambda, a closure, one defined in a
   notebook or inside the script's ``if __name__ == "__main__":`` block) or from a script that
   launches without that guard: refused before any rank starts (the rendezvous store, step 1 of
   launch, is never opened: the test makes opening it fail loudly);
2. ``bucket_cap_mb`` that the train command's ``--bucket-cap-mb`` refuses (0, -1, nan) is refused by
   every constructor that takes one, and so is a string ("25") or a bool; the oracle for *which*
   values are wrong is the CLI's own parser, asked the same values.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
import torch.distributed as dist
from test_doctests import one_rank_group  # noqa: F401 - a fixture: a gloo world of one process

import minddp
from minddp.runtime import launch as launch_module

GUARD = 'if __name__ == "__main__":'


@pytest.fixture
def no_rank_may_start(monkeypatch):
    """Opening the rendezvous store (launch's step 1, before any rank) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("launch went on to start ranks")

    monkeypatch.setattr(launch_module, "open_store", refuse)


def _closure():
    def inner():
        return 1

    return inner


@pytest.mark.parametrize(
    "fn, says",
    [(lambda: 0, "it is a lambda"), (_closure(), "defined inside another function")],
    ids=["lambda", "closure"],
)
def test_launch_refuses_a_function_without_a_name_the_ranks_can_import(no_rank_may_start, fn, says):
    with pytest.raises(TypeError) as info:
        minddp.launch(fn, world_size=2)
    text = str(info.value)
    assert "\n" not in text and says in text and "define it with def at the top level of a module" in text


def test_launch_refuses_arguments_pickle_cannot_carry(no_rank_may_start):
    with pytest.raises(TypeError, match="pickle cannot carry it or its arguments") as info:
        minddp.launch(dist.get_rank, lambda: 0, world_size=2)
    assert "\n" not in str(info.value)


def _as_main(monkeypatch, tmp_path, source: str) -> types.ModuleType:
    """``source`` saved as a script and run as ``__main__`` in this process (what ``python script.py`` does)."""
    script = tmp_path / "train_script.py"
    script.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compile(source, str(script), "exec"), vars(main))
    return main


def test_launch_refuses_a_script_without_the_main_guard(monkeypatch, tmp_path, no_rank_may_start):
    source = "import minddp\n\ndef train():\n    return 1\n\nminddp.launch(train, world_size=2)\n"
    with pytest.raises(RuntimeError) as info:
        _as_main(monkeypatch, tmp_path, source)
    text = str(info.value)
    assert "\n" not in text and "train_script.py (line 6)" in text and f"put the launch under {GUARD}" in text


def test_launch_refuses_a_function_defined_under_the_main_guard(monkeypatch, tmp_path, no_rank_may_start):
    source = f"import minddp\n\n{GUARD}\n    def train():\n        return 1\n\n    minddp.launch(train, world_size=2)\n"
    with pytest.raises(TypeError) as info:
        _as_main(monkeypatch, tmp_path, source)
    assert "\n" not in str(info.value) and f"it is defined inside {GUARD}" in str(info.value)


def test_launch_refuses_a_function_of_an_interactive_session(monkeypatch, no_rank_may_start):
    main = types.ModuleType("__main__")  # a notebook's or the REPL's: no file to import
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec("def train():\n    return 1\n", vars(main))
    with pytest.raises(TypeError, match="defined in an interactive session"):
        minddp.launch(main.train, world_size=2)


def _cli_refuses(value) -> bool:
    """The train command's parser, asked the same value as text (its oracle for a bad cap)."""
    from minddp.train.config import ConfigError, parse_args

    try:
        parse_args(["--bucket-cap-mb", str(value), "--no-profile"])
    except (ConfigError, SystemExit):
        return True
    return False


def _constructors():
    from minddp.ladder import wrap

    return {
        "bucket": lambda cap: minddp.BucketDDP(torch.nn.Linear(4, 2), bucket_cap_mb=cap),
        "bucket-async": lambda cap: minddp.AsyncBucketDDP(torch.nn.Linear(4, 2), bucket_cap_mb=cap),
        "zero2": lambda cap: minddp.Zero2DDP(torch.nn.Linear(4, 2), bucket_cap_mb=cap),
        "ddp": lambda cap: minddp.DistributedDataParallel(torch.nn.Linear(4, 2), bucket_cap_mb=cap),
        "torch (ladder.wrap)": lambda cap: wrap("torch", torch.nn.Linear(4, 2), bucket_cap_mb=cap),
    }


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("cap", [0, -1, math.nan, math.inf, "25", True], ids=repr)
def test_every_constructor_refuses_a_bad_bucket_cap_in_one_line(capsys, cap):
    if not isinstance(cap, (str, bool)):
        assert _cli_refuses(cap)  # the CLI refuses it too: the same rule
        capsys.readouterr()
    for name, build in _constructors().items():
        with pytest.raises((TypeError, ValueError)) as info:
            build(cap)
        text = str(info.value)
        assert "\n" not in text and text.startswith("bucket_cap_mb must be"), (name, text)
        assert repr(cap) in text and ("pass bucket_cap_mb=25" in text if cap == "25" else "pass " in text), name


@pytest.mark.usefixtures("one_rank_group")
def test_every_constructor_takes_a_good_bucket_cap():
    assert not _cli_refuses(0.5)
    for name, build in _constructors().items():
        for cap in (0.5, 25, None):
            build(cap)  # a real cap, an int, and None (torch's default, or one bucket) build
