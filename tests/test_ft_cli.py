"""``--stage ft`` and ``--inject`` in the train command: named only, checked before any rank starts."""

from __future__ import annotations

import json

import pytest
from processes import CXX_LINE, fd_captured

from minddp.ft.faults import Fault, parse_faults
from minddp.train.config import ConfigError, parse_args


def test_ft_is_named_only_never_part_of_all():
    assert "ft" not in parse_args(["--stage", "all"]).stages()
    assert parse_args(["--stage", "ft", "--inject", "kill@3:1,coord@5"]).stages() == ["ft"]


def test_inject_is_refused_on_a_stage_that_ends_the_run():
    with pytest.raises(ConfigError, match="--inject needs --stage ft"):
        parse_args(["--stage", "ddp", "--inject", "kill@3:1"])


@pytest.mark.parametrize(
    "spec, message",
    [
        ("kill@3", "write KIND@STEP:SLOT"),
        ("explode@3:1", "write KIND@STEP:SLOT"),
        ("kill@3:5", "slot 5 does not exist with --world-size 2"),
    ],
)
def test_a_bad_fault_is_named_with_the_form(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--stage", "ft", "--inject", spec])


def test_ft_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError, match="without torchrun, --resume and --save-every"):
        parse_args(["--stage", "ft", "--save-every", "5"])


def test_parse_faults():
    assert parse_faults("kill@3:1, stop@9:0,raise@12:1,coord@15") == [
        Fault("kill", 3, 1),
        Fault("stop", 9, 0),
        Fault("raise", 12, 1),
        Fault("coord", 15),
    ]
    assert parse_faults(None) == [] and parse_faults("") == []


@pytest.mark.timeout(180)
def test_the_train_command_trains_through_faults_saying_one_line_each_and_nothing_of_torchs_cxx_side(tmp_path):
    # The user's path, end to end: python -m minddp.train --stage ft --inject ... (run in this process). A killed
    # rank (started again), a collective that raised and the coordinator killed: the run commits every step, says
    # one line per fault, in order, and the summary holds a loss per committed step. The connections those faults
    # broke used to print torch's C++ warnings with native stacks from the ranks and the coordinator (~100 lines);
    # none is left, while the run's own lines are all there.
    from minddp.train import run as train

    out = tmp_path / "summary.json"
    faults = "kill@2:1,raise@3:0,coord@4"
    argv = ["--stage", "ft", "--inject", faults, "--steps", "6", "--run-name", "ft", "--batch-size", "4"]
    argv += ["--max-seq-len", "16", "--eval-examples", "16", "--no-progress", "--hang-timeout", "5"]
    with fd_captured(2) as stderr:  # this process's and its ranks' (tests/processes.py)
        rc = train.main(argv + ["--trace-dir", str(tmp_path), "--summary-json", str(out)])
    err = stderr.text
    assert rc == 0, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("minddp.train: fault ")]
    assert [line.split()[2].rstrip(":") for line in lines] == faults.split(","), err[-2000:]
    assert "minddp.train: stage ft: 6 steps committed" in err, err[-2000:]
    assert not [line for line in err.splitlines() if CXX_LINE.search(line)], err[-3000:]
    losses = json.loads(out.read_text())["stages"]["ft"]["losses"]
    assert len(losses) == 6
    metrics = [json.loads(line) for line in (tmp_path / "ft" / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss"] for m in metrics if m["kind"] == "step"] == losses  # the metrics file, ft's too
    assert [m["step"] for m in metrics if m["kind"] == "eval"] == [6]
