"""Outputs checked before any rank starts; a write that fails at the end hides no result and leaves no partial file.

Oracles: the file system itself. Paths that cannot be folders (a file in the
way) are real; a read-only folder is a real read-only mount where permission
bits cannot stop the user (root), else a real ``chmod``; a tiny or full disk is
a real tmpfs of a few MiB, mounted in a private mount namespace
(``unshare -rm``) so nothing outside the test sees it. Where the machine
allows no mount namespace those cases say so and skip, and two portable
stand-ins still run: the free-space figure patched (the estimate and the
message are what is tested), and a per-process file size limit
(``RLIMIT_FSIZE``, a real kernel write failure) in the ranks for a trace that
cannot be written.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from cli_checks import usage_error

from minddp.train import run as train

TESTS = os.path.dirname(__file__)
SMALL = [
    "--stage",
    "bucket-async",
    "--batch-size",
    "2",
    "--grad-accum",
    "1",
    "--max-seq-len",
    "16",
    "--eval-examples",
    "8",
    "--no-progress",
    "--timeout",
    "60",
]


def _no_launch(*a, **k):
    raise AssertionError("a rank was started although an output cannot be written")


# -- before any rank: paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, cause",
    [
        ("checkpoint-dir-is-a-file", "--checkpoint-dir '{f}' is a file, not a folder"),
        ("trace-dir-under-a-file", "--trace-dir '{f}/traces' cannot be created: '{f}' is a file"),
        ("summary-json-is-a-folder", "--summary-json '{d}' is a folder; give a file path"),
        ("summary-json-under-a-file", "--summary-json '{f}/s.json' cannot be created: '{f}' is a file"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_any_rank(case, cause, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train, "launch", _no_launch)
    f, d = tmp_path / "a-file", tmp_path / "a-folder"
    f.write_text("x")
    d.mkdir()
    extra = {
        "checkpoint-dir-is-a-file": ["--checkpoint-dir", str(f), "--save-every", "1"],
        "trace-dir-under-a-file": ["--trace-dir", str(f / "traces")],
        "summary-json-is-a-folder": ["--summary-json", str(d)],
        "summary-json-under-a-file": ["--summary-json", str(f / "s.json")],
    }[case]
    assert train.main(SMALL + ["--steps", "2"] + extra) == 2
    usage_error(capsys.readouterr().err, "train", cause.format(f=f, d=d))


def _mount_namespace_works(tmp_path) -> bool:
    """Can this machine give the test a private mount namespace with its own tmpfs?"""
    target = tmp_path / "probe-mount"
    target.mkdir()
    try:
        proc = subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m none {shlex.quote(str(target))}"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _in_tmpfs(mount: Path, options: str, argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``argv`` in a private mount namespace where ``mount`` is a fresh tmpfs (``options``: size, ro)."""
    script = f"mount -t tmpfs -o {options} none {shlex.quote(str(mount))} && exec {shlex.join(argv)}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_a_read_only_folder_is_refused_before_any_rank(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        bypassed = os.access(folder, os.W_OK)  # root ignores permission bits: a real read-only mount then
    finally:
        folder.chmod(0o755)
    if not bypassed:
        folder.chmod(0o555)
        monkeypatch.setattr(train, "launch", _no_launch)
        try:
            assert (
                train.main(SMALL + ["--steps", "2", "--checkpoint-dir", str(folder / "ck"), "--save-every", "1"]) == 2
            )
        finally:
            folder.chmod(0o755)
        usage_error(capsys.readouterr().err, "train", "is not writable (Permission denied)")
        return
    if not _mount_namespace_works(tmp_path):
        pytest.skip("running as root (permission bits do not bind) and no mount namespace for a read-only mount")
    proc = _in_tmpfs(
        folder,
        "ro,size=1m",
        [
            sys.executable,
            "-m",
            "minddp.train",
            *SMALL,
            "--steps",
            "2",
            "--checkpoint-dir",
            str(folder / "ck"),
            "--save-every",
            "1",
        ],
    )
    assert proc.returncode == 2
    usage_error(
        proc.stderr,
        "train",
        f"--checkpoint-dir '{folder}/ck' (its existing parent '{folder}') is not writable (Read-only file system)",
    )


# -- before any rank: room --------------------------------------------------------------------------


def test_outputs_that_will_not_fit_are_refused_naming_both_figures(tmp_path, capsys, monkeypatch):
    import minddp.train.outputs

    free = {"bytes": 3 * 2**20}
    monkeypatch.setattr(train, "launch", _no_launch)
    monkeypatch.setattr(minddp.train.outputs, "free_bytes", lambda folder: free["bytes"])
    argv = SMALL + ["--steps", "10", "--profile-steps", "5", "--no-trace-gzip", "--trace-dir", str(tmp_path)]
    assert train.main(argv) == 2
    err = usage_error(capsys.readouterr().err, "train", "not enough free space: --trace-dir will need about")
    need = float(err.split("need about ")[1].split(" MiB")[0])
    # the estimate (minddp.train.outputs.trace_bytes) is of the size such traces really have: 2 ranks x about 8.7 MB
    # for 5 profiled steps of tiny-llama (measured), not a guess off by orders of magnitude
    assert 10 < need < 40 and "which has 3.0 MiB free" in err
    # with room for it, the same run passes the checks and reaches the launcher
    free["bytes"] = 100 * 2**20
    with pytest.raises(AssertionError, match="a rank was started"):
        train.main(argv)


def test_a_real_tiny_disk_is_refused_before_any_rank(tmp_path):
    if not _mount_namespace_works(tmp_path):
        pytest.skip("no mount namespace (unshare -rm) on this machine for a tiny tmpfs")
    disk = tmp_path / "tiny"
    disk.mkdir()
    proc = _in_tmpfs(
        disk,
        "size=512k",
        [sys.executable, "-m", "minddp.train", *SMALL, "--steps", "10", "--no-trace-gzip", "--trace-dir", str(disk)],
    )
    assert proc.returncode == 2
    usage_error(proc.stderr, "train", "MiB on the file system of")


# -- at the end: a failed write hides nothing -----------------------------------------------------------


def fill_disk(filler):
    """On rank 0: fill the disk that holds ``filler`` (another job's log, say); a fault for rank_faults."""
    if dist.get_rank() == 0:
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 2**16)
                    f.flush()
            except OSError:  # ENOSPC: the disk is full now
                pass


FILL_DRIVER = """
import json, os, sys
sys.path.insert(0, {tests!r})
from minddp.train import run as train
import test_reliability_outputs as t
from rank_faults import train_rank_with_fault

if __name__ == "__main__":
    real = train.launch
    train.launch = lambda fn, *a, **k: real(train_rank_with_fault, *a, t.fill_disk, 2, {filler!r}, **k)
    rc = train.main(sys.argv[1:])
    left = sorted(os.path.relpath(os.path.join(d, n), {disk!r}) for d, _, names in os.walk({disk!r}) for n in names)
    with open({report!r}, "w") as f:
        json.dump({{"rc": rc, "left": left}}, f)
"""


@pytest.mark.timeout(240)
def test_a_disk_that_fills_during_the_run_loses_no_result(tmp_path):
    # The worst case: the trace disk fills while training (at step 1); before, the trace export failed
    # silently leaving truncated .tmp files, then writing config.json crashed the launcher: no table,
    # no --summary-json although its own disk had room.
    if not _mount_namespace_works(tmp_path):
        pytest.skip("no mount namespace (unshare -rm) on this machine for a small tmpfs to fill")
    disk, summary, report = tmp_path / "disk", tmp_path / "summary.json", tmp_path / "report.json"
    disk.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(FILL_DRIVER.format(tests=TESTS, filler=str(disk / "filler"), disk=str(disk), report=str(report)))
    proc = _in_tmpfs(
        disk,
        "size=24m",
        [
            sys.executable,
            str(driver),
            *SMALL,
            "--steps",
            "4",
            "--profile-steps",
            "2",
            "--no-trace-gzip",
            "--trace-dir",
            str(disk),
            "--run-name",
            "run",
            "--summary-json",
            str(summary),
        ],
    )
    assert report.exists(), proc.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["rc"] == 1, proc.stderr[-3000:]
    assert "bucket-async" in proc.stdout and "loss*" in proc.stdout  # the table was printed
    saved = json.loads(summary.read_text())  # and --summary-json written
    assert len(saved["stages"]["bucket-async"]["losses"]) == 4
    lost = " ".join(saved["not_written"])
    for what in ("rank 0's trace", "rank 1's trace", "config.json", "summary.json"):
        assert what in lost, (what, saved["not_written"])
    assert got["left"] == ["filler"], got["left"]  # no partial file left behind
    for line in saved["not_written"]:
        assert f"minddp.train: {line}" in proc.stderr


def trace_over_a_size_limit(cfg, stage, data, folder):
    """train_rank in a rank that may write no file over 100 kB (a real EFBIG from the kernel)."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing the rank
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    return train.train_rank(cfg, stage, data, folder)


@pytest.mark.timeout(120)
def test_a_trace_that_cannot_be_written_is_named_and_the_results_are_kept(tmp_path, capsys, monkeypatch):
    real = train.launch
    monkeypatch.setattr(train, "launch", lambda fn, *a, **k: real(trace_over_a_size_limit, *a, **k))
    summary = tmp_path / "summary.json"
    rc = train.main(
        SMALL
        + [
            "--steps",
            "4",
            "--profile-steps",
            "2",
            "--trace-dir",
            str(tmp_path / "traces"),
            "--run-name",
            "run",
            "--summary-json",
            str(summary),
        ]
    )
    out = capsys.readouterr()
    assert rc == 1 and "loss*" in out.out
    saved = json.loads(summary.read_text())
    assert [line.split(" (")[0] for line in saved["not_written"]] == [
        "stage bucket-async: rank 0's trace was not written",
        "stage bucket-async: rank 1's trace was not written",
    ]
    assert "minddp.train: stage bucket-async: rank 0's trace was not written" in out.err
    stage_dir = tmp_path / "traces" / "run" / "bucket-async"
    assert sorted(os.listdir(stage_dir)) == ["config.json", "metrics.jsonl"]  # the partial traces were removed
    assert saved["stages"]["bucket-async"]["trace"] is None
