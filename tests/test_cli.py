"""One CLI style for train, bench and analyze, and the messages a user sees when a run is stopped.

Oracles: the parsers themselves (an option the tools share must be the same
action: flag, metavar, type, help), the help text the user reads, what each
tool prints on stderr for bad input, and for Ctrl-C the exit status, the
lines printed, and the operating system (every process of the run gone).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import pytest
from cli_checks import usage_error

from minddp.analysis.__main__ import build_parser as analyze_parser
from minddp.analysis.__main__ import main as analyze_main
from minddp.bench.__main__ import SHARED
from minddp.bench.__main__ import build_parser as bench_parser
from minddp.bench.__main__ import main as bench_main
from minddp.runtime.processes import alive
from minddp.train import run as train
from minddp.train.config import build_parser as train_parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def test_an_option_both_tools_have_means_the_same_in_both():
    t, b = _actions(train_parser()), _actions(bench_parser())
    for name in SHARED + ("stage", "profile_steps"):
        flag = "--" + name.replace("_", "-")
        ta, ba = t[flag], b[flag]
        assert ta.metavar == ba.metavar, flag
        borrowed = name in SHARED  # the same action; stage and profile-steps: the same meaning
        if borrowed and name != "batch_size":  # (train's batch help names --global-batch-size, bench has none)
            assert ba.help.startswith(ta.help.split(" (default")[0]), flag
        for text in ("nan", "inf", "-1", "0", "2", "ddp,torch", "hook,nope"):
            outcomes = []
            for action in (ta, ba):
                try:
                    outcomes.append(("ok", (action.type or str)(text)))
                except (argparse.ArgumentTypeError, ValueError) as exc:
                    outcomes.append(("refused", str(exc) if borrowed else ""))
            assert outcomes[0] == outcomes[1], (flag, text, outcomes)
    # bench's --steps was timed steps per round; the name now means what it means in train, and bench says so
    assert "--steps" not in _actions(bench_parser()) or _actions(bench_parser())["--steps"].help == argparse.SUPPRESS


@pytest.mark.parametrize(
    "parser, sections, default",
    [
        (
            train_parser,
            ["what to train:", "steps and batches:", "ranks and failures:", "checkpoints:"],
            "AdamW learning rate (default: 0.003)",
        ),
        (
            bench_parser,
            ["what to run:", "how long:", "model and ranks (as in python -m minddp.train):", "outputs:"],
            "(default: tiny-llama, or the --preset's)",
        ),
        (analyze_parser, ["what to analyse (one of):", "outputs:"], "put two runs side by side"),
    ],
)
def test_help_has_sections_examples_and_the_real_defaults(parser, sections, default):
    text = " ".join(parser().format_help().split())  # unwrapped, whatever the terminal width
    assert all(s in text for s in sections), text[:2000]
    assert "examples: python -m minddp." in text and default in text
    assert "its default" not in text and "(default: None)" not in text


@pytest.mark.parametrize(
    "main, prog, argv, cause",
    [
        (train.main, "train", ["--nope"], "unrecognized arguments: --nope"),
        (bench_main, "bench", ["--nope"], "unrecognized arguments: --nope"),
        (analyze_main, "analyze", ["--nope"], "unrecognized arguments: --nope"),
        (analyze_main, "analyze", [], "give one run folder, or --compare RUN_A RUN_B"),
        (
            bench_main,
            "bench",
            ["--steps", "3"],
            "--steps is the train command's optimizer steps per stage; the "
            "benchmark's timed steps are --steps-per-round",
        ),
        (bench_main, "bench", ["--stage", "single"], "unknown stage single"),
        (bench_main, "bench", ["--bucket-cap-mb", "nan"], "argument --bucket-cap-mb: 'nan' is not a finite number"),
        (bench_main, "bench", ["--pool", "/no/such/results"], "--pool: cannot read"),
    ],
)
def test_every_error_is_a_usage_line_and_one_error_line(main, prog, argv, cause, capsys):
    assert main(argv) == 2
    usage_error(capsys.readouterr().err, prog, cause)


def test_more_ranks_than_cores_is_said(monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    train.warn_if_oversubscribed(train.parse_args(["--world-size", "3"]))
    assert "warning: 3 ranks on 1 CPU cores" in capsys.readouterr().err
    train.warn_if_oversubscribed(train.parse_args(["--world-size", "1"]))
    assert capsys.readouterr().err == ""


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "sig, said",
    [
        (signal.SIGINT, "interrupted (Ctrl-C)"),
        (signal.SIGTERM, "terminated (SIGTERM)"),
        (signal.SIGHUP, "hung up (SIGHUP: the terminal closed)"),
    ],
    ids=["SIGINT", "SIGTERM", "SIGHUP"],
)
def test_ctrl_c_ends_the_run_with_one_line_and_leaves_nothing(tmp_path, sig, said):
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the train command and its
    # ranks; closing the terminal sends SIGHUP; `kill -TERM -PGID` SIGTERM. Before: a 25-line KeyboardInterrupt
    # traceback; then, with stderr a pipe not yet read (a CI runner, an IDE, this test), the launcher blocked
    # printing its line before it ended the ranks, and they ran on; SIGHUP killed the launcher on the spot.
    # Here the pipe is full (64 KiB the reader has not read) when the signal comes: the ranks (and the
    # checkpoint they write every step) must be ended without a single byte read, and the command's one line
    # and its exit follow once the pipe is read. The command is started as a terminal starts it (see
    # as_a_terminal_starts_it: pytest itself may have been started ignoring Ctrl-C).
    import threading

    from processes import as_a_terminal_starts_it, children, fill_pipe

    from minddp.train.checkpoint import read_checkpoint

    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minddp.train",
            "--steps",
            "100000",
            "--no-profile",
            "--batch-size",
            "2",
            "--grad-accum",
            "1",
            "--max-seq-len",
            "16",
            "--save-every",
            "1",
            "--checkpoint-dir",
            str(tmp_path),
            "--progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        start_new_session=True,
        preexec_fn=as_a_terminal_starts_it,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    run, chunks = [], []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")), daemon=True)
    try:
        deadline = time.monotonic() + 200
        while not (tmp_path / "bucket-async.pt").exists():  # training is under way: a step was saved
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or never saved a step"
            time.sleep(0.2)
        fill_pipe(write_end)  # the command's stderr, full and unread
        os.close(write_end)  # (the command's copy is the only one left)
        write_end = None
        helpers = children(proc.pid)  # the process server and resource tracker
        ranks = set().union(*(children(h) for h in helpers))
        run = sorted(ranks | helpers | {proc.pid})
        assert len(ranks) == 2, (helpers, ranks)
        os.killpg(proc.pid, sig)  # the group this test started
        deadline = time.monotonic() + 30  # launch() ends them at once: SIGTERM, 1 s, SIGKILL; the rest is margin
        while [pid for pid in ranks if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in ranks if alive(pid)], "the ranks outlived the signal while stderr was unread"
        reader.start()  # now read: the line comes, the command exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            still = [pid for pid in run if alive(pid)]
            os.kill(proc.pid, signal.SIGABRT)  # the command this test started: its stacks
            proc.wait(timeout=30)
            reader.join(10)
            pytest.fail(
                f"the command did not end within 60 s of its stderr being read; alive then: {still} of "
                f"{run}; its stderr ends:\n{b''.join(chunks).decode(errors='replace')[-4000:]}"
            )
        reader.join(10)
        err = b"".join(chunks).decode(errors="replace").replace("\0", "")
        assert proc.returncode == 128 + sig
        ours = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "step/s" not in line]
        assert ours == [f"minddp.launch: {said}; the ranks were ended"], err[-2000:]
        assert read_checkpoint(str(tmp_path / "bucket-async.pt"))["step"] >= 1  # the last complete one loads
        deadline = time.monotonic() + 10
        while [pid for pid in run if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in run if alive(pid)]
    finally:
        for pid in run:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if write_end is not None:
            os.close(write_end)
        if not reader.is_alive():
            os.close(read_end)
