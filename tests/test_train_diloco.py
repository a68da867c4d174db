"""``python -m minddp.train --stage local-sgd`` and ``--stage diloco``: the flags, the refusals, the summary, the
metrics file, the fragments in the traces, and ``--save-every``/``--resume`` bit for bit.

One run trains both stages (4 steps, H = 4; diloco streamed: 2 fragments, τ = 1, α = 0.5) over the ``wan``
link. The oracles are the schedule the options define (which step sends, which step applies, how many
syncs), the bytes of the model (a whole-model sync sends every trainable parameter once, in either rung), and
the run's own summary (the metrics file must hold the same losses and evaluations, line by line). What each
rung computes is checked against DDP, torch and torchft in ``tests/test_diloco.py`` and ``test_diloco_torchft.py``.
"""

from __future__ import annotations

import gzip
import io
import json

import pytest
import torch
from cli_checks import SMALL_RUN, refused_before_any_rank, usage_error

from minddp.runtime.untrusted import load_torch_data
from minddp.train import run as train
from minddp.train.checkpoint import read_checkpoint

STEPS = 4
ARGV = [
    *("--stage", "local-sgd,diloco", "--steps", str(STEPS), "--sync-every", "4"),
    *("--fragments", "2", "--fragment-delay", "1", "--fragment-alpha", "0.5", "--link", "wan"),
    *("--eval-every", "2", "--profile-steps", "3", "--run-name", "slow", *SMALL_RUN),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow_links")
    out = tmp / "summary.json"
    assert train.main([*ARGV, "--trace-dir", str(tmp), "--summary-json", str(out)]) == 0
    return tmp / "slow", json.loads(out.read_text())


def metrics(folder, stage: str) -> list[dict]:
    return [json.loads(line) for line in (folder / stage / "metrics.jsonl").read_text().splitlines()]


def test_the_summary_reports_outer_syncs_and_bytes_per_optimizer_step(run):
    _, summary = run
    local, diloco = summary["stages"]["local-sgd"], summary["stages"]["diloco"]
    assert summary["config"]["sync_every"] == 4 and summary["config"]["fragments"] == 2
    assert summary["config"]["outer_lr"] == 0.7 and summary["config"]["outer_momentum"] == 0.9  # DiLoCo's defaults
    assert local["outer_syncs"] == 1  # after step 4
    assert diloco["outer_syncs"] == 2  # fragment 0 applied at step 2, fragment 1 at step 4
    # every trainable parameter travels once, in one message (local-sgd) or two fragments (diloco): the same bytes
    assert local["all_reduce_bytes_per_step"] == diloco["all_reduce_bytes_per_step"] > 0
    assert local["all_reduce_calls_per_step"] == 1 / STEPS and diloco["all_reduce_calls_per_step"] == 2 / STEPS
    for row in (local, diloco):
        assert row["held_out_loss"] == row["evals"][-1]["loss"] and row["accuracy"] == row["evals"][-1]["accuracy"]


def test_the_metrics_file_holds_every_step_and_every_evaluation(run):
    folder, summary = run
    for stage, sends, syncs in (("local-sgd", [4], [0, 0, 0, 1]), ("diloco", [1, 3], [0, 1, 1, 2])):
        lines = metrics(folder, stage)
        steps = [line for line in lines if line["kind"] == "step"]
        evals = [line for line in lines if line["kind"] == "eval"]
        assert [line["kind"] for line in lines] == ["step", "step", "eval", "step", "step", "eval"]
        assert [s["step"] for s in steps] == [1, 2, 3, 4] and [e["step"] for e in evals] == [2, 4]
        assert [s["loss"] for s in steps] == summary["stages"][stage]["losses"]
        assert [{"kind": "eval", **e} for e in summary["stages"][stage]["evals"]] == evals
        assert [s["outer_syncs"] for s in steps] == syncs
        assert [s["step"] for s in steps if s["bytes"]] == sends  # what left when: the schedule of the options
        total = sum(s["bytes"] for s in steps)
        assert total == summary["stages"][stage]["all_reduce_bytes_per_step"] * STEPS
        assert all(s["time_s"] > 0 for s in steps) and all(0 <= e["accuracy"] <= 1 for e in evals)
        assert all(e["examples"] == 16 for e in evals)  # --eval-examples 16


def test_the_traces_show_when_each_fragment_left_and_landed(run):
    folder, _ = run
    # profiled: steps 2-4 (after one warm-up step); fragment 1 leaves at step 3 and lands at step 4
    for rank in (0, 1):
        with gzip.open(folder / "diloco" / f"rank{rank}.pt.trace.json.gz", "rt") as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        names = [e["name"] for e in events]
        assert "minddp.fragment_send#1" in names and "minddp.fragment_apply#1" in names
        send = next(e for e in events if e["name"] == "minddp.fragment_send#1")
        apply = next(e for e in events if e["name"] == "minddp.fragment_apply#1")
        assert send["ts"] + send["dur"] <= apply["ts"]  # sent a step before it was applied
        link = [e for e in events if e["name"] == "minddp.link:all_reduce"]
        assert link and all(e["args"]["link"] == "wan" for e in link)  # the message on the emulated WAN


@pytest.mark.parametrize(
    "argv, cause",
    [
        (["--stage", "diloco", "--sync-every", "10", "--fragments", "3"], "--sync-every=10 is not divisible by"),
        (
            ["--stage", "diloco", "--sync-every", "6", "--fragments", "3", "--fragment-delay", "2"],
            "--fragment-delay=2 is not a whole number of steps below a turn's",
        ),
        (["--stage", "diloco", "--fragment-alpha", "1.5"], "--fragment-alpha=1.5 is outside [0, 1]"),
        (["--stage", "diloco", "--fragment-alpha", "nan"], "argument --fragment-alpha: 'nan' is not a finite"),
        (["--stage", "diloco", "--outer-momentum", "1"], "--outer-momentum 1 is not below 1"),
        (["--stage", "diloco", "--outer-lr", "0"], "argument --outer-lr: must be above 0"),
        (["--stage", "local-sgd", "--sync-every", "0"], "argument --sync-every: must be at least 1"),
        (["--stage", "zero2", "--sync-every", "4"], "--sync-every with --stage zero2: local SGD and DiLoCo keep"),
        (["--stage", "fsdp", "--fragments", "2"], "--fragments with --stage fsdp"),
        (["--stage", "ddp", "--sync-every", "4"], "--sync-every applies to --stage local-sgd and diloco only"),
        (["--stage", "local-sgd", "--outer-lr", "1"], "--outer-lr applies to --stage diloco only"),
        (["--stage", "all", "--sync-every", "4"], "--sync-every applies to"),
        (["--stage", "diloco", "--hook", "powersgd"], "--hook powersgd with --stage diloco"),
    ],
)
def test_bad_slow_link_options_are_refused_before_any_rank(argv, cause, capsys, monkeypatch):
    refused_before_any_rank(argv, cause, capsys, monkeypatch)


def test_the_slow_link_stages_are_named_only_never_in_all():
    from minddp.train.config import parse_args

    assert "diloco" not in parse_args(["--stage", "all"]).stages()
    cfg = parse_args(["--stage", "ddp,diloco"])
    assert cfg.stages() == ["ddp", "diloco"] and cfg.sync_every == 10 and cfg.fragment_alpha == 0.0
    assert parse_args(["--stage", "ddp"]).sync_every is None  # no slow-link stage: nothing filled in


# -- checkpoints: each replica's own state, resumed bit for bit -------------------------------------------------

#: H = 4 in 2 fragments, tau = 1: fragment 0 leaves at steps 1 and 5, fragment 1 at step 3, each lands a step
#: later; saved after step 3, fragment 1 is in flight.
RESUME = ["--sync-every", "4", "--seed", "3", "--no-profile", *SMALL_RUN]
STREAMED = ["--fragments", "2", "--fragment-delay", "1", "--fragment-alpha", "0.5"]
SAVED_AT, RESUME_STEPS = 3, 6


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A: 6 steps straight, saved at 6; B: 3 steps, saved (a fragment in flight); C: B resumed to 6, saved."""
    tmp = tmp_path_factory.mktemp("slow_resume")

    def main(*argv):
        assert train.main([*RESUME, *argv]) == 0

    both = ["--stage", "local-sgd,diloco", *STREAMED]
    main(*both, "--steps", str(RESUME_STEPS), "--save-every", str(RESUME_STEPS), "--checkpoint-dir", str(tmp / "a"),
         "--summary-json", str(tmp / "a.json"))  # fmt: skip
    main(*both, "--steps", str(SAVED_AT), "--save-every", str(SAVED_AT), "--checkpoint-dir", str(tmp / "b"))
    for stage, options in (("local-sgd", []), ("diloco", STREAMED)):
        main("--stage", stage, *options, "--steps", str(RESUME_STEPS), "--save-every", str(RESUME_STEPS),
             "--resume", str(tmp / "b" / f"{stage}.pt"), "--checkpoint-dir", str(tmp / "c"),
             "--summary-json", str(tmp / f"c-{stage}.json"))  # fmt: skip
    return tmp


def replicas(path) -> list[dict]:
    """Every rank's replica state in a checkpoint (its weights, inner optimizer, rung state), read as data."""
    return [load_torch_data(io.BytesIO(share))["replica"] for share in read_checkpoint(str(path))["ranks"]]


def same(a, b) -> bool:
    """Equal to the bit: tensors by ``torch.equal``, containers element by element, anything else by ``==``."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_checkpoint_holds_each_replicas_weights_synced_weights_outer_state_and_the_fragment_in_flight(resumed):
    local, diloco = replicas(resumed / "b" / "local-sgd.pt"), replicas(resumed / "b" / "diloco.pt")
    assert len(diloco) == 2
    # between syncs the replicas' weights and inner optimizers differ: each rank keeps its own
    assert not same(diloco[0]["model"], diloco[1]["model"]) and not same(local[0]["inner"], local[1]["inner"])
    for rank in diloco:  # what torchft's users missed: the synced weights and the outer momentum; and a message
        assert sorted(rank["rung"]["synced"]) == sorted(rank["model"])
        assert rank["rung"]["outer"][0]["state"]  # fragment 0 was applied at step 2: its momentum exists
        assert rank["rung"]["in_flight"]["fragment"] == 1 and rank["rung"]["steps"] == SAVED_AT
    assert same(diloco[0]["rung"]["synced"], diloco[1]["rung"]["synced"])  # what the replicas agree on


@pytest.mark.parametrize("stage", ["local-sgd", "diloco"])
def test_resumed_equals_the_uninterrupted_run_bit_for_bit(resumed, stage):
    straight = json.loads((resumed / "a.json").read_text())["stages"][stage]
    again = json.loads((resumed / f"c-{stage}.json").read_text())["stages"][stage]
    assert again["losses"] == straight["losses"] and again["outer_syncs"] == straight["outer_syncs"]
    a, c = replicas(resumed / "a" / f"{stage}.pt"), replicas(resumed / "c" / f"{stage}.pt")
    assert all(same(x, y) for x, y in zip(a, c))


def test_a_checkpoint_of_another_schedule_is_refused_in_one_line(resumed, capsys):
    saved = resumed / "b" / "diloco.pt"
    argv = [*RESUME, "--stage", "diloco", *STREAMED, "--sync-every", "8", "--steps", "6", "--resume", str(saved)]
    assert train.main([*argv, "--checkpoint-dir", str(resumed / "d")]) == 2
    usage_error(capsys.readouterr().err, "train", "--sync-every 4 there, 8 here")
