"""``python -m minddp.doctor --gpu-report DIR``: the whole GPU path checked in minutes, one command, one folder.

For anyone with a GPU (a workstation, a hosted notebook, a machine lent for a few minutes without
internet or HTA): this command checks the whole GPU path there and leaves everything in one folder.
Each step runs in a process of its own and is cut at its time limit (it is reported, and the next step
runs), all within ``--budget`` seconds (default: every step its own limit):

1. ``env``: versions, the GPUs, NCCL, bf16, what ``auto`` places where, and which packages are missing
   (with how to add each);
2. ``doctor``: the doctor's checks (every stage of the ladder, ``ddp``, torch's DDP, ``zero1``, ``zero2``,
   ``fsdp``, the fp16/bf16/PowerSGD hooks, each against one process) at 1 rank under NCCL and at 2 ranks
   sharing the GPU over gloo with CUDA tensors, and a profiled run read back;
3. ``bench``: ``ddp``, ``bucket-async`` and torch's DDP at 1 rank on ``--model smollm2-360m --dtype bf16``
   (:mod:`minddp.bench`: the three take turns in a new order each round; medians, ratios to torch's DDP
   with their intervals);
4. ``train``: ``--stage all`` for a few profiled steps;
5. ``analyze``: those traces read by minddp's own analysis and by HTA, and HTA's sample GPU traces
   (``tests/data/hta-gpu-traces``) read by both, so HTA is checked even where the run's traces are CPU ones;
6. ``tests``: ``tests/test_gpu.py`` and the suite's other files that behave differently where CUDA is
   (``--tests`` picks others), from the clone of minddp this command runs from; run from an installed
   package (which ships no tests) the step is skipped, saying so;
7. ``summary.json`` (every step's result, figures, what was skipped and why), ``report.txt``, each step's
   log, the traces of one stage (``ddp``), the others' while the folder stays under ``--max-mib``, and one
   line saying what could not be done and why. ``--tar FILE`` packs the folder into one file.

Without a GPU (``CUDA_VISIBLE_DEVICES=`` or a CPU build of torch) the same command is a dry run: every
step but the CUDA ones, on the CPU. ``--gpu-wheels DIR`` downloads the wheels a machine without internet
must be given (:data:`WHEELS`); ``docs/devices.md`` (*How to run it on a lent GPU*) has the command sized to
one lender's limits (its budget, what it brings back), given as options: nothing here assumes a machine.

Example (how a step's time limit comes out of what is left of the budget)::

    >>> step = STEPS["bench"]
    >>> step.limit_s, step.floor_s
    (180, 60)
    >>> time_for(step, left_s=400, later=["train", "analyze", "tests"])   # its own limit
    180
    >>> time_for(step, left_s=200, later=["train", "analyze", "tests"])   # what the later steps' floors leave
    105
    >>> time_for(step, left_s=140, later=["train", "analyze", "tests"]) is None   # less than its floor: skipped
    True

    $ python -m minddp.doctor --gpu-report gpu-report                                  # about 6 minutes on one GPU
    $ python -m minddp.doctor --gpu-report r --budget 300 --max-mib 12 --tar r.tgz     # 5 minutes, 12 MiB at most
    $ python -m minddp.doctor --gpu-report r --steps env,tests --tests tests/test_gpu.py
    $ CUDA_VISIBLE_DEVICES= python -m minddp.doctor --gpu-report /tmp/dry --quick      # the dry run, smallest
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROG = "minddp.doctor --gpu-report"
#: The folder that holds the running ``minddp`` package: a clone's root, or an installation's site-packages.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
#: The torch releases minddp declares (pyproject.toml, docs/torch-versions.md).
TORCH_RANGE = ((2, 6), (2, 15))
#: What a GPU machine without internet must be given, pinned to the versions this suite runs with: HTA and
#: the two packages it imports that GPU images often lack (pure-Python wheels).
WHEELS = {"holistictraceanalysis": "0.5.0", "plotly": "7.1.0", "pydot": "4.0.1"}
#: Modules the steps import: (module, pip name, what needs it).
PACKAGES = [
    ("torch", "torch", "everything"),
    ("transformers", "transformers", "the models of train and bench"),
    ("tokenizers", "tokenizers", "the offline data's tokenizer"),
    ("pandas", "pandas", "the analysis"),
    ("matplotlib", "matplotlib", "the plots of the analysis and the bench"),
    ("hta.trace_analysis", "holistictraceanalysis", "reading GPU traces through HTA"),
    ("pytest", "pytest", "the tests step"),
    ("xdist", "pytest-xdist", "the tests step (pyproject's -n)"),
    ("pytest_timeout", "pytest-timeout", "the tests step (pyproject's timeout)"),
]
#: The suite's files whose behaviour depends on CUDA being there (beyond ``tests/test_gpu.py``).
GPU_TESTS = [
    "tests/test_gpu.py",
    "tests/test_devices.py",
    "tests/test_analysis_gpu.py",
    "tests/test_analysis_folders.py",
    "tests/test_hooks_parity.py",
    "tests/test_sharding_torch.py",
    "tests/test_launch.py::test_ranks_fork_with_the_train_commands_imports_and_none_of_them_touches_cuda",
]
#: The doctor step runs this test's command already.
DOCTOR_TEST = "tests/test_gpu.py::test_the_doctor_passes_on_this_gpu_machine"
#: ``--max-mib``'s default: the folder's size, above which other stages' traces are dropped (``keep_stage``'s stay).
DEFAULT_MAX_MIB = 64.0


def find_checkout(folder: Path = PACKAGE_PARENT) -> Path | None:
    """The root of the clone of minddp the running package is part of; None for an installed package.

    A clone's root holds ``pyproject.toml`` naming the project ``minddp`` and ``tests/`` beside the package;
    a wheel installs the package alone (into site-packages, where a ``tests/`` folder may be another's).
    """
    try:
        project = (folder / "pyproject.toml").read_text()
    except OSError:
        return None
    named = re.search(r'^name\s*=\s*"minddp"\s*$', project, re.M)
    return folder if named and (folder / "tests").is_dir() and (folder / "minddp").is_dir() else None


@dataclass(frozen=True)
class Step:
    """One step of the report: its name, what it checks (one line), and its time limits."""

    name: str
    what: str
    limit_s: int  # the longest it may run
    floor_s: int  # not started with less time than this left for it


STEPS = {
    s.name: s
    for s in (
        Step("env", "versions, GPUs, NCCL, bf16, placements, packages", 60, 15),
        Step("doctor", "every rung and hook against one process, at each placement", 180, 60),
        Step("bench", "ddp, bucket-async and torch's DDP at 1 rank: medians, ratios", 180, 60),
        Step("train", "every stage for a few profiled steps", 150, 45),
        Step("analyze", "the traces read by minddp's analysis and by HTA", 120, 20),
        Step("tests", "tests/test_gpu.py and the suite's GPU-relevant files", 240, 30),
    )
}


def time_for(step: Step, left_s: float, later: list[str]) -> int | None:
    """Seconds ``step`` may run with ``left_s`` of the budget left and the steps ``later`` still to come.

    Its own limit, or what is left once each later step's floor is set aside; ``None`` (skip it) when that
    is under its own floor.
    """
    spare = int(left_s - sum(STEPS[n].floor_s for n in later))
    if spare < step.floor_s:
        return None
    return min(step.limit_s, spare)


@dataclass
class Settings:
    """What the steps run (the full run on a GPU; ``quick``: the smallest, for the dry-run test)."""

    folder: str
    budget_s: float | None = None  # None: every step its own limit (:meth:`budget`)
    max_mib: float = DEFAULT_MAX_MIB  # the folder's size, above which other stages' traces go (:func:`prune_traces`)
    checkout: str | None = field(default_factory=lambda: _str(find_checkout()))  # the tests' clone (None: none)
    quick: bool = False  # the smallest settings (:meth:`smallest`)
    model: str = "smollm2-360m"
    dtype: str = "bf16"
    rounds: int = 6
    steps_per_round: int = 10
    warmup: int = 3
    sizes: list[str] = field(default_factory=list)  # batch and sequence options for train and bench
    bucket_cap_mb: float | None = 25.0  # the bench's buckets: torch's default (None: the train command's 0.1)
    train_stages: str = "all"
    train_world_size: int = 2
    train_steps: int = 4
    profile_steps: int = 2
    keep_stage: str = "ddp"
    tests: list[str] = field(default_factory=lambda: list(GPU_TESTS))
    steps: list[str] = field(default_factory=lambda: list(STEPS))

    def budget(self) -> float:
        """``budget_s``, or the sum of the chosen steps' own limits."""
        return self.budget_s if self.budget_s is not None else float(sum(STEPS[n].limit_s for n in self.steps))

    @classmethod
    def smallest(cls, folder: str, **kw) -> Settings:
        """The dry run's settings: the tiny model on small batches, one round of one step, one stage, one test file."""
        small = dict(
            quick=True,
            model="tiny-llama",
            dtype="fp32",
            sizes=["--batch-size", "4", "--grad-accum", "2", "--max-seq-len", "32"],
            bucket_cap_mb=None,
            rounds=1,
            steps_per_round=1,
            warmup=0,
            train_stages="ddp",
            train_steps=2,
            profile_steps=1,
            tests=["tests/test_gpu.py"],
        )
        return cls(folder, **{**small, **kw})


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


# ------------------------------------------------------------------------------------------ the steps
def step_env(s: Settings) -> dict:
    """Step 1 (in its own process): what is here. Touches CUDA, so never in the process that starts steps."""
    import torch

    from minddp.doctor import environment
    from minddp.runtime.device import choose, gpu_count

    lines = environment()
    gpus = gpu_count()
    info: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    info["torch_in_range"] = TORCH_RANGE[0] <= version <= TORCH_RANGE[1]
    if not info["torch_in_range"]:
        lines.append(f"torch {torch.__version__} is outside the range minddp declares (2.6 to 2.15)")
    info["gpus"] = []
    for g in range(gpus):
        p = torch.cuda.get_device_properties(g)
        info["gpus"].append(
            {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1)}
        )
    info["bf16"] = bool(gpus) and torch.cuda.is_bf16_supported()
    info["nccl"] = torch.distributed.is_nccl_available() and gpus > 0
    if gpus:
        x = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16 if info["bf16"] else torch.float32)
        info["cuda_matmul"] = bool(torch.isfinite((x @ x).float()).all().item())  # the GPU computes at all
        lines.append(f"GPU 0: compute capability {info['gpus'][0]['capability']}, bf16 {info['bf16']}")
    info["placements"] = {n: choose("auto", local_world_size=n).why for n in sorted({1, 2, gpus + 1})}
    lines += [f"auto, {n} rank{'s' if n > 1 else ''}: {why}" for n, why in info["placements"].items()]
    info["missing"] = missing_packages()
    lines += [m["line"] for m in info["missing"]]
    info["lines"] = lines
    return {"ok": gpus == 0 or info["cuda_matmul"], **info}


def missing_packages() -> list[dict]:
    """The packages a step needs that are not here, each with why and how to add it.

    HTA is imported (what it imports in turn, plotly, may be missing); the others are only looked up.
    """
    import importlib
    import importlib.util

    out = []
    for module, pip_name, needed_for in PACKAGES:
        try:
            if module.startswith("hta"):
                importlib.import_module(module)
            elif importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}")
        except Exception as exc:  # noqa: BLE001 - ImportError, or a package broken by a missing one of its own
            carry = f"{pip_name}=={WHEELS[pip_name]}" if pip_name in WHEELS else pip_name
            out.append(
                {
                    "package": pip_name,
                    "needed_for": needed_for,
                    "error": f"{type(exc).__name__}: {exc}",
                    "line": f"missing {pip_name} ({type(exc).__name__}: {exc}), needed for {needed_for}: pip "
                    f"install {carry}, or without internet carry its wheels (python -m minddp.doctor --gpu-wheels "
                    ".whl; docs/devices.md)",
                }
            )
    return out


def step_doctor(s: Settings) -> dict:
    """Step 2: ``python -m minddp.doctor`` (:mod:`minddp.doctor`): every placement this machine allows."""
    from minddp.doctor import main

    path = Path(s.folder, "results", "doctor-checks.json")
    code = main(["--json", str(path)])
    rows = json.loads(path.read_text()) if path.exists() else []
    failed = [f"{c['config']}: {c['name']} ({c['detail']})" for c in rows if c["ok"] is False]
    skipped = [f"{c['config']}: {c['name']} ({c['detail']})" for c in rows if c["ok"] is None]
    return {"ok": code == 0 and bool(rows), "exit": code, "checks": rows, "failed": failed, "skipped": skipped}


def bench_argv(s: Settings, dtype: str) -> list[str]:
    """The benchmark's command line for step 3."""
    return [
        *f"--stage ddp,bucket-async,torch --variants none --model {s.model} --dtype {dtype} --world-size 1".split(),
        *f"--launches 1 --rounds {s.rounds} --steps-per-round {s.steps_per_round} --warmup {s.warmup}".split(),
        *["--profile-steps", "0", "--out", os.path.join(s.folder, "bench"), *s.sizes],
        *(["--bucket-cap-mb", str(s.bucket_cap_mb)] if s.bucket_cap_mb else []),
    ]


def step_bench(s: Settings) -> dict:
    """Step 3: ``python -m minddp.bench`` at 1 rank; its rows for the three, ratios judged against the goals."""
    import torch

    from minddp.bench.__main__ import main
    from minddp.bench.targets import STEP_LIMITS

    notes = []
    dtype = s.dtype
    if dtype == "bf16" and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        where = "this GPU" if torch.cuda.is_available() else "the CPU (no GPU)"
        notes.append(f"bf16 timed as fp32: {where} has no fast bf16")
        dtype = "fp32"
    argv = bench_argv(s, dtype)
    print("python -m minddp.bench " + " ".join(argv), flush=True)
    code = main(argv)
    path = os.path.join(s.folder, "bench", "results.json")
    if code != 0 or not os.path.exists(path):
        return {"ok": False, "exit": code, "notes": notes}
    with open(path) as f:
        saved = json.load(f)
    goals = STEP_LIMITS["medium"]  # compute-bound models: ddp ≤ 1.03, bucket-async ≤ 1.10 × torch's DDP
    rows = {}
    for r in saved["rows"]:
        rows[r["config"]] = {k: r.get(k) for k in ("median_ms", "q1_ms", "q3_ms", "ratio_to_torch", "ratio_lo")}
        rows[r["config"]]["ratio_hi"] = r.get("ratio_hi")
        if r["config"] in goals and r.get("ratio_to_torch") is not None:
            rows[r["config"]]["goal"] = goals[r["config"]]
            rows[r["config"]]["meets_goal"] = r["ratio_to_torch"] <= goals[r["config"]]
    return {"ok": True, "command": "python -m minddp.bench " + " ".join(argv), "meta": saved["meta"], "rows": rows}


def run_folder(s: Settings) -> Path:
    return Path(s.folder, "traces", "all")


def step_train(s: Settings) -> dict:
    """Step 4: the train command over ``--stage all``, a few profiled steps, traces into ``traces/all``."""
    from minddp.train.run import main

    argv = [
        *f"--stage {s.train_stages} --steps {s.train_steps} --profile-steps {s.profile_steps}".split(),
        *f"--world-size {s.train_world_size} --eval-examples 16 --no-progress".split(),
        *["--trace-dir", str(run_folder(s).parent), "--run-name", run_folder(s).name, *s.sizes],
    ]
    print("python -m minddp.train " + " ".join(argv), flush=True)
    code = main(argv)
    summary = run_folder(s) / "summary.json"
    out = {"ok": code == 0, "exit": code, "command": "python -m minddp.train " + " ".join(argv)}
    if summary.exists():
        out["summary"] = json.loads(summary.read_text())
    return out


def own_reading(stage) -> list[dict]:
    """minddp's own numbers for each rank of a stage (no HTA): steps, comm, all_reduces, overlap."""
    from minddp.analysis import cpu, gpu, metrics
    from minddp.analysis.steps import per_step_means

    rows = []
    for rank, trace in sorted(stage.ranks.items()):
        reader = gpu if gpu.is_gpu_trace(trace) else cpu
        iv = reader.rank_intervals(trace)
        row = {"rank": rank, "device": "gpu" if reader is gpu else "cpu", **per_step_means(iv)}
        row["overlap_pctg"] = metrics.overlap_pct(iv.comm, iv.compute, [(s, e) for _, s, e in iv.steps])
        rows.append(row)
    return rows


def read_folder(path: Path) -> dict:
    """One folder of traces read both ways: minddp's own per rank, and the analysis (HTA for GPU traces)."""
    from minddp.analysis import analyze_run
    from minddp.analysis.events import load_run
    from minddp.analysis.gpu import HTAViewFailed, HTAViewReadAgain

    run = load_run(path)  # once: both readings take it
    out = {"own": {name: own_reading(stage) for name, stage in run.stages.items()}}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HTAViewFailed)
            warnings.simplefilter("always", HTAViewReadAgain)
            result = analyze_run(run)
        failed = [str(w.message) for w in caught if issubclass(w.category, HTAViewFailed)]
        if failed:  # the views HTA could read stand; the ones it failed on are named
            out["analysis_error"] = " | ".join(failed)
        again = [str(w.message) for w in caught if issubclass(w.category, HTAViewReadAgain)]
        if again:  # read, but not as HTA reads by default: said beside the numbers
            out["analysis_note"] = " | ".join(again)
        out["analysis"] = json.loads(result.stages.reset_index().to_json(orient="records"))
        out["sources"] = sorted(set(result.summary["source"]))
        out["result"] = result
    except Exception as exc:  # noqa: BLE001 - HTA missing or failing: minddp's own reading stands
        out["analysis_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return out


def step_analyze(s: Settings) -> dict:
    """Step 5: the run's traces and HTA's sample traces, each read by minddp's analysis and (GPU traces) HTA."""
    from minddp.analysis.report import write_report

    out: dict = {"ok": True, "notes": []}
    folders = [("run", run_folder(s))]
    if s.checkout is None:  # the sample lives in the clone's tests/
        out["notes"].append("hta_sample: minddp runs from an installed package, without HTA's sample traces")
    else:
        folders.append(("hta_sample", Path(s.checkout, "tests", "data", "hta-gpu-traces")))
    for name, path in folders:
        if not path.is_dir():
            out["notes"].append(f"{name}: no traces at {path}")
            out["ok"] = False
            continue
        try:
            read = read_folder(path)
        except Exception as exc:  # noqa: BLE001 - reported; the other folder is still read
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            out["ok"] = False
            continue
        result = read.pop("result", None)
        out[name] = read
        if "analysis_error" in read:
            out["notes"].append(f"{name}: {read['analysis_error']}")
            out["ok"] = False
        if "analysis_note" in read:  # a note, not a failure: HTA read it with its own switch
            out["notes"].append(f"{name}: {read['analysis_note']}")
        if name == "run" and result is not None:  # also when HTA failed on one view: the page shows the rest
            try:
                out["report"] = str(write_report([result], path))  # report.html and its plots, to look at
            except Exception as exc:  # noqa: BLE001 - the numbers above stand without the page
                out["notes"].append(f"report page: {type(exc).__name__}: {exc}")
                out["ok"] = False
        print(f"{name} ({path}): " + json.dumps(read.get("analysis", read["own"]), default=str)[:2000], flush=True)
    return out


def step_tests(s: Settings) -> dict:
    """Step 6: pytest on ``s.tests`` in the clone this runs from, results from its JUnit XML."""
    if s.checkout is None:
        return {"ok": None, "why": no_tests_here()}
    report = Path(s.folder, "results", "tests.xml")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
    workers = min(4, (os.cpu_count() or 1) // 2) if len(s.tests) > 1 else 0  # xdist workers: a few, or none
    argv += ["-n", str(workers)]
    argv += ["--junitxml", str(report), *s.tests]
    if "doctor" in s.steps and any(t.startswith(DOCTOR_TEST.split("::")[0]) for t in s.tests):
        argv += ["--deselect", DOCTOR_TEST]  # the doctor step ran the same command
    print(" ".join(argv), flush=True)
    code = subprocess.run(argv, cwd=s.checkout).returncode
    return {"ok": code == 0, "exit": code, "command": " ".join(argv[1:]), **junit_counts(report)}


def no_tests_here() -> str:
    """Why the tests step cannot run: minddp is an installed package here, and a package ships no tests."""
    return (
        f"minddp runs from an installed package ({PACKAGE_PARENT / 'minddp'}), which ships no tests: run the "
        "report from a clone of minddp (its root as the current folder) to run them"
    )


def junit_counts(path: Path) -> dict:
    """Passed, failed and skipped tests in a JUnit XML report, with each failure's and skip's first line."""
    import xml.etree.ElementTree as ET

    if not path.exists():
        return {"passed": 0, "failed": [], "skipped": []}
    passed, failed, skipped = 0, [], []
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            failed.append(f"{name}: {(bad.get('message') or '').splitlines()[0] if bad.get('message') else ''}")
        elif skip is not None:
            skipped.append(f"{name}: {skip.get('message', '')}")
        else:
            passed += 1
    return {"passed": passed, "failed": failed, "skipped": skipped}


RUNS = {
    "env": step_env,
    "doctor": step_doctor,
    "bench": step_bench,
    "train": step_train,
    "analyze": step_analyze,
    "tests": step_tests,
}


def run_step(name: str, folder: str) -> int:
    """In a step's own process: run it, write ``results/<name>.json``; exit 0 when it passed."""
    s = load_settings(folder)
    try:
        result = RUNS[name](s)
    except Exception as exc:  # noqa: BLE001 - a step's failure is data for the summary
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    write_json(Path(folder, "results", f"{name}.json"), result)
    return 0 if result.get("ok") is not False else 1


# ------------------------------------------------------------------------------------ the runner
def load_settings(folder: str) -> Settings:
    return Settings(**json.loads(Path(folder, "settings.json").read_text()))


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))


def child_env() -> dict:
    """The steps' environment: this minddp first on the path, output unbuffered, and ``auto`` as a user gets it."""
    env = {k: v for k, v in os.environ.items() if k != "MINDDP_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def end_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End the step we started and every process it started (its own process group): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived its leader
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def launch_step(name: str, s: Settings, limit_s: int, index: int) -> dict:
    """Run one step in a new process group, cut at ``limit_s``; what happened, for the summary.

    A stop signal (Ctrl-C, SIGTERM, SIGHUP: :func:`minddp.runtime.processes.stop_signals`) ends the step's
    whole group, then goes on up.
    """
    from minddp.runtime.processes import stops_deferred

    log = Path(s.folder, "logs", f"{index}-{name}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        with stops_deferred():  # a step started is a step we can end
            proc = subprocess.Popen(
                [sys.executable, "-m", "minddp.doctor.gpu_report", "--step", name, s.folder],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=s.checkout or s.folder,  # not a folder holding another minddp: -m would import that one
                env=child_env(),
                start_new_session=True,  # its own group: cut with everything it started
            )
        try:
            code = proc.wait(timeout=limit_s)
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            end_group(proc)
            status = "timed out"
        except BaseException:  # a stop signal: the step goes with us
            end_group(proc)
            raise
    row = {"step": name, "status": status, "seconds": round(time.monotonic() - start, 1), "limit_s": limit_s}
    row["log"] = str(log.relative_to(s.folder))
    path = Path(s.folder, "results", f"{name}.json")
    if path.exists() and status != "timed out":
        row["result"] = json.loads(path.read_text())
        if row["result"].get("ok") is None:
            row["status"] = "skipped"
    if status != "ok":
        row["tail"] = log.read_text(errors="replace").strip().splitlines()[-8:]
    return row


def prune_traces(s: Settings) -> list[str]:
    """Keep ``keep_stage``'s rank traces, then other stages' (in the ladder's order) while the whole folder stays
    under ``s.max_mib`` (as the steps left it: ``summary.json`` and ``report.txt``, a few hundred kB, come after)."""
    from minddp.analysis import stage_sort_key
    from minddp.analysis.events import rank_files

    folder = run_folder(s)
    if not folder.is_dir():
        return []
    stages = {d.name: list(rank_files(d).values()) for d in folder.iterdir() if d.is_dir() and rank_files(d)}
    order = sorted(stages, key=lambda n: (n != s.keep_stage, stage_sort_key(n)))
    traces = sum(p.stat().st_size for paths in stages.values() for p in paths)
    size = folder_bytes(Path(s.folder)) - traces  # everything but the traces
    kept = []
    for name in order:
        more = sum(p.stat().st_size for p in stages[name])
        if name == s.keep_stage or size + more <= s.max_mib * 2**20:
            kept.append(name)
            size += more
        else:
            for p in stages[name]:
                p.unlink()
    return kept


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def could_not(rows: list[dict]) -> list[str]:
    """What the run could not do, and why, one phrase each."""
    out = []
    env = next((r.get("result", {}) for r in rows if r["step"] == "env"), {})
    if env and not env.get("gpus"):
        out.append("use a GPU (none visible here: a dry run, the CUDA steps ran on the CPU)")
    elif env and not env.get("nccl"):
        out.append("use NCCL (this torch has none)")
    out += [f"use {m['package']} ({m['error']})" for m in env.get("missing", [])]
    for r in rows:
        result = r.get("result", {})
        if r["status"] in ("failed", "timed out", "not run", "stopped"):
            why = (
                r.get("why")
                or result.get("error")
                or (f"cut at {r['limit_s']} s" if r["status"] == "timed out" else "")
            )
            out.append(f"finish step {r['step']} ({r['status']}{': ' + why if why else ''}; {r.get('log', '')})")
        elif r["status"] == "skipped":
            out.append(f"run step {r['step']} ({r.get('why') or result.get('why', '')})")
        out += [f"{r['step']}: {n}" for n in result.get("notes", [])]
    tests = next((r.get("result", {}) for r in rows if r["step"] == "tests"), {})
    out += [f"test {t}" for t in tests.get("skipped", [])]
    return out


def summary_lines(rows: list[dict], wall_s: float, budget_s: float) -> list[str]:
    lines = [f"{'step':<9}{'result':<11}{'time (s)':>9}{'limit':>7}  what"]
    for r in rows:
        lines.append(
            f"{r['step']:<9}{r['status']:<11}{r['seconds']:>9.0f}{r['limit_s'] or 0:>7}  {STEPS[r['step']].what}"
        )
    bench = next((r.get("result", {}) for r in rows if r["step"] == "bench"), {})
    for name, b in bench.get("rows", {}).items():
        ratio = "" if b.get("ratio_to_torch") is None else f", {b['ratio_to_torch']:.3f} x torch's DDP"
        if b.get("ratio_lo") is not None:
            ratio += f" (90 % CI {b['ratio_lo']:.3f}-{b['ratio_hi']:.3f})"
        goal = "" if "goal" in b and b["meets_goal"] else " (goal <= {:.2f})".format(b["goal"]) if "goal" in b else ""
        lines.append(f"bench {name}: median {b['median_ms']:.2f} ms{ratio}{goal}")
    lines.append(
        f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} steps ok in {wall_s:.0f} s (budget {budget_s:.0f} s)"
    )
    return lines


def say(line: str) -> None:
    print(line, flush=True)


def run_report(s: Settings) -> int:
    """Steps 1-7: every step in turn within the budget, then the summary, the pruned traces, the one line."""
    from minddp.runtime.processes import Stopped, stop_reason, stop_signals

    start, budget = time.monotonic(), s.budget()
    Path(s.folder).mkdir(parents=True, exist_ok=True)
    write_json(Path(s.folder, "settings.json"), asdict(s))
    for stale in Path(s.folder, "results").glob("*.json"):
        stale.unlink()
    rows: list[dict] = []
    stopped: BaseException | None = None
    with stop_signals():
        for index, name in enumerate(s.steps, 1):
            step = STEPS[name]
            limit = time_for(step, budget - (time.monotonic() - start), s.steps[index:])
            if stopped is not None or limit is None:
                why = stop_reason(stopped) if stopped is not None else "no time left in the budget"
                rows.append({"step": name, "status": "not run", "seconds": 0.0, "limit_s": None, "why": why})
                continue
            say(f"[{name}] {step.what} (at most {limit} s)")
            try:
                row = launch_step(name, s, limit, index)
            except (KeyboardInterrupt, Stopped) as exc:
                stopped = exc
                rows.append(
                    {"step": name, "status": "not run", "seconds": 0.0, "limit_s": limit, "why": stop_reason(exc)}
                )
                continue
            rows.append(row)
            for line in row.get("result", {}).get("lines", []):
                say(f"    {line}")
            say(f"[{name}] {row['status']} in {row['seconds']:.0f} s")
            for line in row.get("tail", []) if row["status"] != "ok" else []:
                say(f"    | {line}")
    kept = prune_traces(s)
    wall = time.monotonic() - start
    lines = summary_lines(rows, wall, budget)
    missing = could_not(rows)
    size = folder_bytes(Path(s.folder))
    if size > s.max_mib * 2**20:  # the kept stage's traces, or the other outputs, are over it by themselves
        missing.append(
            f"keep the folder under --max-mib {s.max_mib:g} (it is {size / 2**20:.1f} MiB, traces of {kept})"
        )
    lines.append("could not: " + ("; ".join(missing) if missing else "nothing: every step ran and passed"))
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m minddp.doctor --gpu-report " + s.folder,
        "settings": asdict(s),
        "wall_s": round(wall, 1),
        "steps": rows,
        "traces_kept": kept,
        "could_not": missing,
    }
    write_json(Path(s.folder, "summary.json"), summary)
    Path(s.folder, "report.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        say(line)
    if stopped is not None:
        return 130 if isinstance(stopped, KeyboardInterrupt) else stopped.code
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


def pack(folder: str, tar: str) -> str:
    """The report folder as one ``.tar.gz`` (a lent machine brings back a few files, not a tree)."""
    Path(tar).parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar, "w:gz") as t:
        t.add(folder, arcname=Path(folder).name)
    return tar


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def download_wheels(folder: str, python: str | None = None) -> int:
    """``--gpu-wheels DIR``: the wheels of :data:`WHEELS` for a Linux x86-64 machine's ``python`` (default: this
    one's version), into ``DIR``."""
    python = python or this_python()
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    argv += ["--python-version", python, "--implementation", "cp", "-d", folder]
    argv += [a for p in platforms for a in ("--platform", p)]
    argv += [f"{name}=={version}" for name, version in WHEELS.items()]
    print(" ".join(argv[1:]), flush=True)
    code = subprocess.run(argv).returncode
    if code == 0:
        files = sorted(Path(folder).glob("*.whl"))
        size = sum(f.stat().st_size for f in files)
        print(f"{PROG}: {len(files)} wheels, {size / 2**20:.1f} MiB in {folder}: {', '.join(f.name for f in files)}")
    return code


def build_parser() -> argparse.ArgumentParser:
    from minddp.runtime.cli import Parser, described, number

    p = Parser(
        prog="python -m minddp.doctor --gpu-report",
        usage="python -m minddp.doctor --gpu-report DIR [--quick] [--budget S] [--max-mib N] [--steps LIST] "
        "[--tests LIST] [--tar FILE] | --gpu-wheels DIR [--python X.Y]",
        description=described(__doc__),
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu-report", metavar="DIR", help="run every step, writing into DIR")
    what.add_argument("--gpu-wheels", metavar="DIR", help=f"download the wheels to carry ({', '.join(WHEELS)})")
    what.add_argument("--step", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="the smallest settings (the dry-run test's)")
    every = sum(step.limit_s for step in STEPS.values())
    budget = "seconds for all steps; a step starts only while the later steps' floors still fit"
    p.add_argument("--budget", type=number(float, low=60), help=f"{budget} (default: each its own limit, {every} s)")
    size = "the folder's size in MiB: the ddp traces stay, the other stages' only while it fits"
    p.add_argument(
        "--max-mib", type=number(float, low=1), default=DEFAULT_MAX_MIB, help=f"{size} (default %(default)g)"
    )
    p.add_argument(
        "--steps", default=",".join(STEPS), help=f"comma list of steps to run, in order (default {','.join(STEPS)})"
    )
    p.add_argument(
        "--tests",
        metavar="LIST",
        default=None,
        help="comma list of the tests step's pytest files or node ids, in the clone this runs from (default: "
        "the suite's GPU-relevant files; --quick: tests/test_gpu.py)",
    )
    p.add_argument("--model", default=None, help="the bench's model (default smollm2-360m; --quick: tiny-llama)")
    p.add_argument("--dtype", default=None, help="the bench's dtype (default bf16; --quick: fp32)")
    p.add_argument("--tar", metavar="FILE", default=None, help="also pack DIR into FILE (.tar.gz)")
    p.add_argument(
        "--python",
        default=None,
        help=f"--gpu-wheels: the GPU machine's Python, X.Y (default this one's, {this_python()})",
    )
    return p


def chosen_tests(text: str, steps: list[str]) -> list[str]:
    """``--tests``: the comma list, each file checked in the clone this runs from (a UsageError names one missing)."""
    from minddp.runtime.cli import UsageError

    tests = [t.strip() for t in text.split(",") if t.strip()]
    if not tests:
        raise UsageError("--tests: an empty list; give pytest files or node ids, or drop the tests step with --steps")
    if "tests" not in steps:
        raise UsageError("--tests has no effect without the tests step; add it to --steps or drop --tests")
    root = find_checkout()
    if root is None:
        raise UsageError(f"--tests: {no_tests_here()}")
    missing = [t for t in tests if not (root / t.split("::")[0]).exists()]
    if missing:
        raise UsageError(f"--tests: no {missing[0]} in {root}; give paths relative to the clone's root (tests/...)")
    return tests


def main(argv: list[str] | None = None) -> int:
    from minddp.runtime.cli import UsageError, fail

    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        if ns.step:
            if ns.step[0] not in RUNS:
                raise UsageError(f"--step: unknown {ns.step[0]!r}")
            return run_step(*ns.step)
        if ns.gpu_wheels:
            return download_wheels(ns.gpu_wheels, ns.python)
        steps = [n.strip() for n in ns.steps.split(",") if n.strip()]
        unknown = [n for n in steps if n not in STEPS]
        if unknown or not steps:
            raise UsageError(f"--steps: unknown {unknown or 'empty list'}; choose from {','.join(STEPS)}")
        folder = os.path.abspath(ns.gpu_report)
        extra = {k: v for k, v in (("model", ns.model), ("dtype", ns.dtype)) if v is not None}
        extra.update(budget_s=ns.budget, max_mib=ns.max_mib)
        if ns.tests is not None:
            extra["tests"] = chosen_tests(ns.tests, steps)
        s = Settings.smallest(folder, steps=steps, **extra) if ns.quick else Settings(folder, steps=steps, **extra)
    except UsageError as exc:
        return fail(PROG, exc, parser)
    code = run_report(s)
    if ns.tar:
        print(f"{PROG}: packed {pack(folder, ns.tar)} ({os.path.getsize(ns.tar) / 2**20:.1f} MiB)", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
