"""``python -m minddp.doctor --gpu-report``'s dry run: every step a GPU runs, here on the CPU, so a short
chance on a GPU cannot fail on anything a CPU could have caught.

One dry run serves every test of its results: the command ``docs/devices.md`` prepares for a lent GPU, its
options as written there, with ``CUDA_VISIBLE_DEVICES=`` and the smallest settings. It also is the test of
``python -m minddp.doctor`` itself on the CPU: its doctor step runs that command whole (with ``--json``).
The oracles: the doctor's table (each check against one process), the train command's own meter of
all_reduces beside the traces' count of them, pytest's collection of ``tests/test_gpu.py``, the process table
for a step cut at its limit, and a copy of the package installed alone (as a wheel installs it).
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
from cli_checks import usage_error
from processes import descendants

from minddp.doctor import gpu_report
from minddp.doctor.gpu_report import STEPS, WHEELS, Settings, Step, bench_argv, prune_traces, run_report
from minddp.ladder import STAGES

ROOT = Path(__file__).resolve().parent.parent
#: The dry run: every step but the benchmark's launch (tests/test_bench.py launches it; its arguments are
#: checked here), which would add a third launch of ranks for no path of its own.
DRY_STEPS = ["env", "doctor", "train", "analyze", "tests"]


def device_command() -> tuple[str, list[str]]:
    """The one command of docs/devices.md's *How to run it on a lent GPU*: its install part, the report's argv."""
    section = (ROOT / "docs" / "devices.md").read_text().split("## How to run it on a lent GPU")[1].split("\n## ")[0]
    command = [line.strip() for line in section.splitlines() if line.strip().startswith("python3 -m pip install")]
    assert len(command) == 1 and len(command[0]) <= 2000, command  # the device tool's limit on a command
    install, report = command[0].split(" || exit; ")
    return install, shlex.split(report.split("python3 -m minddp.doctor ")[1].split(";")[0])


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu-report") / "report"
    tar = folder.parent / "report.tgz"
    paths = {"/tmp/gpu-report": str(folder), "$OUT/gpu-report.tgz": str(tar)}
    argv = [paths.get(a, a) for a in device_command()[1]]  # the prepared command's own options, in this folder
    assert argv.count(str(folder)) == argv.count(str(tar)) == 1, argv
    done = subprocess.run(
        [sys.executable, "-m", "minddp.doctor", *argv, "--quick"]
        + ["--steps", ",".join(DRY_STEPS), "--tests", "tests/test_gpu.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # a dry run on any machine
    )
    summary = json.loads((folder / "summary.json").read_text())
    return done, folder, tar, {r["step"]: r for r in summary["steps"]}, summary


def test_every_step_runs_on_the_cpu_and_the_last_line_says_what_could_not(dry_run):
    done, folder, _, steps, _ = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {name: r["status"] for name, r in steps.items()} == dict.fromkeys(DRY_STEPS, "ok")
    last = done.stdout.strip().splitlines()[-2]  # the packing line follows it
    assert last.startswith("could not: use a GPU (none visible here"), last
    env = steps["env"]["result"]
    assert env["gpus"] == [] and env["torch_in_range"] and env["missing"] == []
    assert env["placements"] == {"1": "1 rank, no GPU: gloo on the CPU", "2": "2 ranks, no GPU: gloo on the CPU"}


def test_the_doctor_step_is_the_doctor_command_and_every_check_passes(dry_run):
    _, folder, _, steps, _ = dry_run
    checks = {(c["name"], c["ok"]) for c in steps["doctor"]["result"]["checks"] if c["config"] == "2 ranks, CPU"}
    expected = [*STAGES, "torch", "ddp + fp16 hook", "ddp + bf16 hook", "ddp + powersgd hook"]
    for name in expected + ["train command, profiled", "trace read by minddp"]:
        assert (name, True) in checks, (name, checks)
    assert ("trace read by HTA", None) in checks  # CPU traces: HTA reads GPU traces only
    log = (folder / steps["doctor"]["log"]).read_text()
    assert re.search(r"^\d+ of \d+ checks passed or skipped, 0 failed", log, re.M), log[-2000:]  # the CLI's last line


def test_train_and_analyze_read_the_stage_both_ways_and_every_gradient_is_sent_once_a_step(dry_run):
    _, _, _, steps, _ = dry_run
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
    _, _, _, steps, _ = dry_run
    result = steps["tests"]["result"]
    tree = ast.parse((ROOT / "tests" / "test_gpu.py").read_text())
    collected = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    ran = [t for t in collected if f"tests/test_gpu.py::{t}" != gpu_report.DOCTOR_TEST]  # the doctor step's twin
    assert (result["passed"], result["failed"]) == (0, [])
    assert sorted(s.split("::")[1].split(":")[0] for s in result["skipped"]) == sorted(ran)


def test_the_folder_packs_into_one_file_with_the_summary_logs_and_a_stages_traces(dry_run):
    _, folder, tar, steps, _ = dry_run
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
    _, folder, _, _, _ = dry_run
    run = tmp_path / "traces" / "all"
    traces = folder / "traces" / "all" / "ddp"
    for stage in ("ddp", "bucket", "simple"):
        (run / stage).mkdir(parents=True)
        for r in (0, 1):
            (run / stage / f"rank{r}.pt.trace.json.gz").write_bytes((traces / f"rank{r}.pt.trace.json.gz").read_bytes())
    one_stage = sum(p.stat().st_size for p in (run / "ddp").iterdir())
    (tmp_path / "bench.json").write_bytes(b"x" * one_stage)  # the folder's other files count too
    room = Settings(str(tmp_path), max_mib=3 * one_stage / 2**20)  # room for the other file and two stages of three
    assert prune_traces(room) == ["ddp", "simple"]  # ddp first, then in the ladder's order
    assert sorted(p.name for p in (run / "bucket").iterdir()) == []
    assert prune_traces(Settings(str(tmp_path), max_mib=one_stage / 2**20 / 2)) == ["ddp"]  # ddp's stay, always
    assert sorted(p.name for p in (run / "simple").iterdir()) == []


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


def test_the_device_command_in_the_docs_installs_the_wheels_alone_and_runs_this_report_within_the_tools_limits():
    install, report = device_command()
    assert "--no-index --no-deps" in install and install.endswith(
        "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site"
    )
    ns = gpu_report.build_parser().parse_args(report)
    assert ns.gpu_report == "/tmp/gpu-report" and ns.tar == "$OUT/gpu-report.tgz" and not ns.quick
    # the device tool's limits (docs/devices.md): 600 s a command with the start and the packing; 16 MiB a file
    assert ns.budget is not None and ns.budget <= 480 and ns.max_mib < 16
    section = (ROOT / "docs" / "devices.md").read_text().split("## How to run it on a lent GPU")[1]
    assert all(f"{name}=={version}" in section for name, version in WHEELS.items())
    assert "--gpu-wheels .whl --python 3.12" in section  # the lent machines' Python, named where it is run


def test_the_dry_run_kept_the_folder_under_the_size_asked_and_named_no_machine(dry_run):
    done, folder, tar, _, summary = dry_run
    settings = summary["settings"]
    assert settings["max_mib"] == 12 and settings["budget_s"] == 470  # the prepared command's, as written there
    assert settings["checkout"] == str(ROOT) and settings["tests"] == ["tests/test_gpu.py"]
    assert gpu_report.folder_bytes(folder) < 12 * 2**20 and tar.stat().st_size < 16 * 2**20


def test_defaults_belong_to_no_machine(tmp_path):
    s = Settings(str(tmp_path))
    assert s.budget_s is None and s.budget() == sum(step.limit_s for step in STEPS.values())  # each step's own
    assert Settings(str(tmp_path), steps=["env", "tests"]).budget() == STEPS["env"].limit_s + STEPS["tests"].limit_s
    ns = gpu_report.build_parser().parse_args(["--gpu-wheels", str(tmp_path)])
    assert ns.python is None and gpu_report.this_python() == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert gpu_report.build_parser().parse_args(["--gpu-report", "x"]).max_mib == gpu_report.DEFAULT_MAX_MIB
    source = Path(gpu_report.__file__).read_text()
    for machine_specific in ("/work/", "470", "16 MiB", '"3.12"', 'parents[2] / "tests"'):
        assert machine_specific not in source, machine_specific


# -- where the tests come from ------------------------------------------------------------------


def test_the_checkout_is_the_clone_the_package_runs_from_and_none_for_an_installed_package(tmp_path):
    assert gpu_report.find_checkout() == ROOT
    site = tmp_path / "site-packages"
    (site / "minddp").mkdir(parents=True)
    (site / "tests").mkdir()  # another package's tests/, as sloppy wheels leave in site-packages
    assert gpu_report.find_checkout(site) is None
    (site / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert gpu_report.find_checkout(site) is None
    (site / "pyproject.toml").write_text('[project]\nname = "minddp"\n')
    assert gpu_report.find_checkout(site) == site


def test_run_from_an_installed_package_the_tests_step_is_skipped_saying_why(tmp_path):
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "minddp", site / "minddp", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "tests").mkdir()  # another package's, beside the installed one: not minddp's tests
    (site / "tests" / "test_gpu.py").write_text("def test_other():\n    assert False, 'not minddp'\n")
    folder = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "minddp.doctor", "--gpu-report", str(folder), "--quick", "--steps", "tests"],
        cwd=tmp_path,  # not a clone: minddp comes from the copy alone
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["settings"]["checkout"] is None
    (row,) = summary["steps"]
    assert (row["step"], row["status"]) == ("tests", "skipped")
    why = f"minddp runs from an installed package ({site / 'minddp'}), which ships no tests"
    assert row["result"]["why"].startswith(why)
    assert done.stdout.strip().splitlines()[-1].startswith(f"could not: run step tests ({why}")


@pytest.mark.parametrize(
    "extra, cause",
    [
        (["--tests", "tests/test_nope.py"], "--tests: no tests/test_nope.py in "),
        (["--tests", " , "], "--tests: an empty list"),
        (["--steps", "env", "--tests", "tests/test_gpu.py"], "--tests has no effect without the tests step"),
    ],
)
def test_a_test_selection_that_cannot_run_is_refused_in_one_line_before_any_step(extra, cause, tmp_path, capsys):
    assert gpu_report.main(["--gpu-report", str(tmp_path / "r"), *extra]) == 2
    usage_error(capsys.readouterr().err, "doctor --gpu-report", cause)
    assert not (tmp_path / "r").exists()
