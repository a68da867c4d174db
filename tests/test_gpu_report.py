"""``python -m minddp.doctor --gpu-report``'s dry run: every step a lent GPU runs, here on the CPU, so the one
chance on a GPU cannot fail on anything a CPU could have caught.

One dry run (``CUDA_VISIBLE_DEVICES=``, the smallest settings) serves every test of its results. It also is the
test of ``python -m minddp.doctor`` itself on the CPU: its doctor step runs that command whole (with ``--json``).
The oracles: the doctor's table (each check against one process), the train command's own meter of
all_reduces beside the traces' count of them, pytest's collection of ``tests/test_gpu.py``, the process table
for a step cut at its limit.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from processes import descendants

from minddp.doctor import gpu_report
from minddp.doctor.gpu_report import STEPS, WHEELS, Settings, Step, bench_argv, prune_traces, run_report
from minddp.ladder import STAGES

ROOT = Path(__file__).resolve().parent.parent
#: The dry run: every step but the benchmark's launch (tests/test_bench.py launches it; its arguments are
#: checked here), which would add a third launch of ranks for no path of its own.
DRY_STEPS = ["env", "doctor", "train", "analyze", "tests"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu-report") / "report"
    tar = folder.parent / "report.tgz"
    done = subprocess.run(
        [sys.executable, "-m", "minddp.doctor", "--gpu-report", str(folder), "--quick"]
        + ["--steps", ",".join(DRY_STEPS), "--tar", str(tar)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # a dry run on any machine
    )
    summary = json.loads((folder / "summary.json").read_text())
    return done, folder, tar, {r["step"]: r for r in summary["steps"]}


def test_every_step_runs_on_the_cpu_and_the_last_line_says_what_could_not(dry_run):
    done, folder, _, steps = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {name: r["status"] for name, r in steps.items()} == dict.fromkeys(DRY_STEPS, "ok")
    last = done.stdout.strip().splitlines()[-2]  # the packing line follows it
    assert last.startswith("could not: use a GPU (none visible here"), last
    env = steps["env"]["result"]
    assert env["gpus"] == [] and env["torch_in_range"] and env["missing"] == []
    assert env["placements"] == {"1": "1 rank, no GPU: gloo on the CPU", "2": "2 ranks, no GPU: gloo on the CPU"}


def test_the_doctor_step_is_the_doctor_command_and_every_check_passes(dry_run):
    _, folder, _, steps = dry_run
    checks = {(c["name"], c["ok"]) for c in steps["doctor"]["result"]["checks"] if c["config"] == "2 ranks, CPU"}
    expected = [*STAGES, "torch", "ddp + fp16 hook", "ddp + bf16 hook", "ddp + powersgd hook"]
    for name in expected + ["train command, profiled", "trace read by minddp"]:
        assert (name, True) in checks, (name, checks)
    assert ("trace read by HTA", None) in checks  # CPU traces: HTA reads GPU traces only
    log = (folder / steps["doctor"]["log"]).read_text()
    assert re.search(r"^\d+ of \d+ checks passed or skipped, 0 failed", log, re.M), log[-2000:]  # the CLI's last line


def test_train_and_analyze_read_the_stage_both_ways_and_every_gradient_is_sent_once_a_step(dry_run):
    _, _, _, steps = dry_run
    trained = steps["train"]["result"]["summary"]["stages"]["ddp"]
    read = steps["analyze"]["result"]
    own = read["run"]["own"]["ddp"]
    assert [r["rank"] for r in own] == [0, 1] and all(r["steps"] == 1 for r in own)  # --profile-steps 1
    # averaging every fp32 gradient once per optimizer step: the trace's all_reduce bytes are the parameters' bytes
    assert all(r["allreduce_bytes_per_step"] == trained["memory"]["parameters"] for r in own), own
    assert read["run"]["sources"] == ["minddp"]  # CPU traces
    assert read["hta_sample"]["sources"] == ["hta"]  # HTA checked on its own GPU traces, here too
    assert [r["rank"] for r in read["hta_sample"]["own"]["hta-gpu-traces"]] == [0, 1]


def test_the_tests_step_ran_pytest_on_the_gpu_tests(dry_run):
    _, _, _, steps = dry_run
    result = steps["tests"]["result"]
    tree = ast.parse((ROOT / "tests" / "test_gpu.py").read_text())
    collected = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    ran = [t for t in collected if f"tests/test_gpu.py::{t}" != gpu_report.DOCTOR_TEST]  # the doctor step's twin
    assert (result["passed"], result["failed"]) == (0, [])
    assert sorted(s.split("::")[1].split(":")[0] for s in result["skipped"]) == sorted(ran)


def test_the_folder_packs_into_one_file_with_the_summary_logs_and_a_stages_traces(dry_run):
    _, folder, tar, steps = dry_run
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert {"report/summary.json", "report/report.txt", "report/traces/all/ddp/rank0.pt.trace.json.gz"} <= names
    assert {f"report/{r['log']}" for r in steps.values()} <= names


def test_the_bench_step_asks_for_the_three_at_one_rank_on_the_model_asked(tmp_path):
    from minddp.bench.__main__ import parse

    for settings, model, dtype in (
        (Settings(str(tmp_path)), "smollm2-360m", "bf16"),  # the GPU run's
        (Settings.smallest(str(tmp_path)), "tiny-llama", "fp32"),  # the dry run's
    ):
        ns, cfg, configs = parse(bench_argv(settings, dtype))
        assert [c.name for c in configs] == ["ddp", "bucket-async", "torch"]
        assert (cfg.world_size, cfg.model, cfg.dtype, ns.rounds, ns.launches) == (1, model, dtype, settings.rounds, 1)
        assert cfg.bucket_cap_mb == (settings.bucket_cap_mb or 0.1)  # torch's 25 MiB on the 360M model


def test_only_one_stages_traces_are_kept_when_all_would_not_fit(dry_run, tmp_path, monkeypatch):
    _, folder, _, _ = dry_run
    run = tmp_path / "traces" / "all"
    traces = folder / "traces" / "all" / "ddp"
    for stage in ("ddp", "bucket", "simple"):
        (run / stage).mkdir(parents=True)
        for r in (0, 1):
            (run / stage / f"rank{r}.pt.trace.json.gz").write_bytes((traces / f"rank{r}.pt.trace.json.gz").read_bytes())
    one_stage = sum(p.stat().st_size for p in (run / "ddp").iterdir())
    monkeypatch.setattr(gpu_report, "TRACE_BYTES", 2 * one_stage)  # room for two stages of three
    assert prune_traces(Settings(str(tmp_path))) == ["ddp", "simple"]  # ddp first, then in the ladder's order
    assert sorted(p.name for p in (run / "bucket").iterdir()) == []


SLEEPER = """
import subprocess, time

def test_never_ends():
    subprocess.Popen(["sleep", "600"])  # a process of the step's own, as ranks are
    time.sleep(600)
"""


def test_a_step_over_its_limit_is_cut_with_all_it_started_and_the_next_still_runs(tmp_path, monkeypatch):
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)  # a tests step that never ends
    monkeypatch.setitem(STEPS, "tests", Step("tests", "a test that never ends", limit_s=3, floor_s=1))
    before = descendants(os.getpid())  # the suite's own rank server, started before
    settings = Settings.smallest(str(tmp_path / "report"), steps=["tests", "env"], budget_s=120)
    settings.tests = [str(tmp_path / "test_sleeper.py")]
    code = run_report(settings)
    assert descendants(os.getpid()) <= before  # the step's process group is gone, its sleeper with it
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [(r["step"], r["status"]) for r in summary["steps"]] == [("tests", "timed out"), ("env", "ok")]
    assert code == 1 and any(c.startswith("finish step tests (timed out: cut at 3 s") for c in summary["could_not"])


def test_the_device_command_in_the_docs_installs_the_wheels_alone_and_runs_this_report():
    section = (ROOT / "docs" / "devices.md").read_text().split("## How to run it on a lent GPU")[1].split("\n## ")[0]
    command = [line.strip() for line in section.splitlines() if line.strip().startswith("python3 -m pip install")]
    assert len(command) == 1 and len(command[0]) <= 2000, command  # the device tool's limit on a command
    install, report = command[0].split(" || exit; ")
    assert "--no-index --no-deps" in install and install.endswith(
        "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site"
    )
    ns = gpu_report.build_parser().parse_args(shlex.split(report.split("python3 -m minddp.doctor ")[1].split(";")[0]))
    assert ns.gpu_report == "/tmp/gpu-report" and ns.tar == "$OUT/gpu-report.tgz" and not ns.quick
    assert all(f"{name}=={version}" in section for name, version in WHEELS.items())
