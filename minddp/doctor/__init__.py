"""``python -m minddp.doctor``: does this machine run minddp, and how?

One command for a new machine (a laptop, a hosted notebook with one GPU, a box with eight):

1. **what is here**: Python, torch, CUDA, NCCL, the GPUs, and where each rank would compute;
2. **every rung trains right** at the ranks the machine allows (no GPU: 2 ranks on the CPU; one GPU: 1 rank
   under NCCL, then 2 ranks sharing it over gloo; N GPUs: also N ranks under NCCL): a few steps of every
   stage of the ladder, torch's DDP and the sharded rungs, each compared with one process on the global
   batch on the same device; then the fp16, bf16 and PowerSGD hooks on ``ddp``;
3. **a profiled step** of the train command, read by minddp's analysis and, for GPU traces, by
   HolisticTraceAnalysis;
4. a table of what passed and how long it took; exit status 1 if anything failed.

On a GPU machine (one's own, or one lent for a few minutes), ``--gpu-report DIR`` runs these checks and the
rest of the GPU path (benchmark, profiled stages read by HTA, the GPU tests) within a time budget
(:mod:`.gpu_report`).

Example::

    $ python -m minddp.doctor            # about half a minute on a 2-core laptop
    $ python -m minddp.doctor --quick    # the ladder at the first configuration only
    $ python -m minddp.doctor --gpu-report gpu-report --tar gpu-report.tgz   # on a GPU: minutes, all of it
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from minddp.runtime.cli import described
from minddp.runtime.device import choose, current_device, gpu_count

STEPS, MICRO, ROWS, LR = 4, 2, 8, 0.1  # optimizer steps, micro-batches per step, rows per rank per micro-batch
WIDTH = 32
HOOKS = ("fp16", "bf16", "powersgd")
#: A compressing hook rounds each gradient element once: its relative error is at most this (round to nearest).
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}


@dataclass
class Check:
    config: str
    name: str
    ok: bool | None  # None: not run here, ``detail`` says why
    seconds: float
    detail: str = ""


# ------------------------------------------------------------------------------- 1. what is here
def environment() -> list[str]:
    """Step 1: the versions and devices, one line each."""
    cuda = torch.version.cuda or "none (a CPU build of torch)"
    lines = [f"python {platform.python_version()}, torch {torch.__version__}, CUDA {cuda}"]
    nccl = "not in this torch"
    if dist.is_nccl_available() and torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    elif dist.is_nccl_available():
        nccl = "in this torch, no GPU to run it on"
    lines.append(f"NCCL {nccl}, gloo {'yes' if dist.is_gloo_available() else 'no'}")
    gpus = gpu_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) if gpus else "none"
    lines.append(f"GPUs: {gpus} ({names})")
    return lines


def configurations(gpus: int) -> list[tuple[str, str, int]]:
    """The (label, backend, ranks) this machine allows: what a user of it would run."""
    if gpus == 0:
        return [("2 ranks, CPU", "auto", 2)]
    configs = [
        ("1 rank, NCCL", "nccl", 1),
        (f"{gpus + 1} ranks sharing {gpus} GPU{'s' if gpus > 1 else ''}", "auto", gpus + 1),
    ]
    if gpus > 1:
        configs.insert(1, (f"{gpus} ranks, NCCL", "nccl", gpus))
    return configs


# --------------------------------------------------------------------------- 2. training checks
class Net(nn.Module):
    """A small stack of blocks (an ``nn.ModuleList``, so ``fsdp`` has units to shard)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def global_batches(world: int, device: torch.device) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every step's micro-batches over all ranks (rank r's rows are r::world of each), the same everywhere."""
    g = torch.Generator().manual_seed(1234)
    rows = ROWS * world
    return [
        [
            (torch.randn(rows, WIDTH, generator=g).to(device), torch.randint(0, 4, (rows,), generator=g).to(device))
            for _ in range(MICRO)
        ]
        for _ in range(STEPS)
    ]


def train(stage: str, hook: str, batches, rank: int, world: int) -> torch.Tensor:
    """``STEPS`` steps of ``stage`` (``single``: this process on the global batch); the parameters, flat."""
    from minddp.ladder import make_optimizer, wrap
    from minddp.ladder.loop import train_step

    torch.manual_seed(rank if stage != "single" else 0)  # different weights per rank: the broadcast fixes them
    inner = Net().to(current_device())
    names = [name for name, _ in inner.named_parameters()]
    model = wrap(
        stage,
        inner,
        hook=hook,
        bucket_cap_mb=0.002,  # a few buckets on this small model
        powersgd_options={"start_powerSGD_iter": 2},
    )  # 2 plain steps, then 2 compressed ones
    optimizer = make_optimizer(stage, model, torch.optim.SGD, hook=hook, lr=LR)
    for step in batches:
        micro = step if stage == "single" else [(x[rank::world], y[rank::world]) for x, y in step]
        train_step(model, optimizer, micro, loss)
    full = model.full_parameters() if hasattr(model, "full_parameters") else dict(inner.named_parameters())
    return torch.cat([full[name].detach().reshape(-1).float() for name in names])


def loss(model, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def single_gradient_bound(batches) -> float:
    """The largest gradient element of one process on the global batch, over the run (before each step)."""
    torch.manual_seed(0)
    model = Net().to(current_device())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    largest = 0.0
    for step in batches:
        for batch in step:
            (loss(model, batch) / len(step)).backward()
        largest = max(largest, max(p.grad.abs().max().item() for p in model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
    return largest


def agree(flat: torch.Tensor) -> bool:
    """Do all ranks hold exactly these values?"""
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], other) for other in everyone)


def check_rank(stages: list[str]) -> list[tuple[str, bool, float, str]]:
    """Step 2 on every rank: (check, passed, seconds, detail) for each stage, then each hook on ``ddp``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = current_device()
    batches = global_batches(world, device)
    reference = train("single", "allreduce", batches, rank, world)
    gmax = single_gradient_bound(batches)
    rows = []
    for stage, hook in [(s, "allreduce") for s in stages] + [("ddp", h) for h in HOOKS]:
        name = stage if hook == "allreduce" else f"ddp + {hook} hook"
        start = time.perf_counter()
        try:
            flat = train(stage, hook, batches, rank, world)
            same = agree(flat)
            diff = (flat - reference).abs().max().item()
            if hook in UNIT_ROUNDOFF:
                # each step's averaged gradient is off by at most u * |g| per element (one rounding of the
                # value sent, one of the sum), so after STEPS SGD steps a weight is off by at most
                # STEPS * LR * 2u * gmax, plus float32 noise (1e-5)
                bound = STEPS * LR * 2 * UNIT_ROUNDOFF[hook] * gmax + 1e-5
            elif hook == "powersgd":
                bound = float("inf")  # a low-rank approximation: no elementwise bound; the ranks must agree
            else:
                # one process sums ROWS*world rows where the ranks sum ROWS and average: a few float32
                # roundings per element through STEPS steps; 1e-4 leaves room for GPU reduction orders and
                # fails on a missing average (a factor of ``world``) or a lost micro-batch
                bound = 1e-4 * max(1.0, reference.abs().max().item())
            ok = same and diff <= bound
            detail = (
                f"max |w - single| {diff:.1e} (bound {bound:.1e})"
                if bound != float("inf")
                else f"max |w - single| {diff:.1e} (low-rank: ranks agree)"
            )
            if not same:
                detail = "the ranks' weights differ; " + detail
        except Exception as exc:  # noqa: BLE001 - reported in the table, the other checks go on
            ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append((name, ok, time.perf_counter() - start, detail))
    return rows


# ---------------------------------------------------------------------------- 3. profiled step
def profile_check(backend: str, world: int, folder: str) -> list[tuple[str, bool | None, float, str]]:
    """Step 3: ``ddp`` for a few steps under the train command, profiled, then read back."""
    from minddp.analysis import cpu, gpu
    from minddp.analysis.events import load_run
    from minddp.analysis.steps import per_step
    from minddp.train import run as train_command

    rows = []
    start = time.perf_counter()
    argv = [
        "--stage",
        "ddp",
        "--steps",
        "3",
        "--profile-steps",
        "1",
        "--world-size",
        str(world),
        "--backend",
        backend,
        "--trace-dir",
        folder,
        "--run-name",
        "doctor",
        "--no-progress",
        "--eval-examples",
        "16",
        "--no-trace-gzip",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = train_command.main(argv)
    rows.append(
        (
            "train command, profiled",
            code == 0,
            time.perf_counter() - start,
            "python -m minddp.train " + " ".join(argv) if code == 0 else out.getvalue().strip()[-200:],
        )
    )
    if code != 0:
        return rows
    start = time.perf_counter()
    stage = load_run(os.path.join(folder, "doctor")).stages["ddp"]
    on_gpu = any(gpu.is_gpu_trace(t) for t in stage.ranks.values())
    reader = gpu if on_gpu else cpu
    steps = {r: per_step(reader.rank_intervals(t)) for r, t in stage.ranks.items()}
    found = all(len(s) >= 1 and all(x["step_time_us"] > 0 for x in s) for s in steps.values())
    kind = "GPU kernels" if on_gpu else "CPU ops"
    rows.append(
        (
            "trace read by minddp",
            found,
            time.perf_counter() - start,
            f"{len(steps)} rank trace(s) of {kind}, {min(len(s) for s in steps.values())} step(s) each",
        )
    )
    start = time.perf_counter()
    if not on_gpu:
        rows.append(("trace read by HTA", None, 0.0, "HTA reads GPU traces; these are CPU traces"))
    else:
        try:
            import hta  # noqa: F401
        except ImportError:
            rows.append(("trace read by HTA", None, 0.0, "HolisticTraceAnalysis is not installed"))
            return rows
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", gpu.HTAViewFailed)
            warnings.simplefilter("always", gpu.HTAViewReadAgain)
            hta_rows, _ = gpu.analyze_stage(stage)
        failed = [str(w.message) for w in caught if issubclass(w.category, gpu.HTAViewFailed)]
        again = [f" ({gpu.NS_ROUNDING_OFF}=1: {w.message})" for w in caught if w.category is gpu.HTAViewReadAgain]
        fine = not failed and all(r["compute_time_us"] > 0 for r in hta_rows)
        rows.append(
            (
                "trace read by HTA",
                fine,
                time.perf_counter() - start,
                failed[0]
                if failed
                else "temporal breakdown"
                + "".join(again)
                + ", overlap "
                + ", ".join(f"{r['comm_comp_overlap_pctg']:.0f} %" for r in hta_rows),
            )
        )
    return rows


# ------------------------------------------------------------------------------------ 4. the table
def table(checks: list[Check]) -> str:
    lines = [f"{'configuration':<28}{'check':<26}{'result':<8}{'time (s)':>9}  detail"]
    for c in checks:
        result = "skipped" if c.ok is None else ("ok" if c.ok else "FAILED")
        lines.append(f"{c.config:<28}{c.name:<26}{result:<8}{c.seconds:>9.1f}  {c.detail}")
    return "\n".join(lines)


def run(quick: bool = False, say=print) -> list[Check]:
    """Steps 1-3; every check of every configuration this machine allows."""
    from minddp.ladder import STAGES
    from minddp.runtime.launch import RankError, launch

    for line in environment():
        say(line)
    checks = []
    configs = configurations(gpu_count())
    for i, (label, backend, world) in enumerate(configs[:1] if quick else configs):
        placement = choose(backend, local_world_size=world)
        say(f"{label}: {placement.why}")
        stages = [*STAGES, "torch"]
        start = time.perf_counter()
        try:
            per_rank = launch(check_rank, stages, world_size=world, backend=placement, timeout_s=120)
        except RankError as exc:
            checks.append(Check(label, "every stage", False, time.perf_counter() - start, str(exc).splitlines()[0]))
            continue
        for rows in zip(*per_rank):  # a check passes when it passed on every rank
            failed = [r for r in rows if not r[1]]
            name, ok, seconds, detail = failed[0] if failed else rows[0]
            checks.append(Check(label, name, not failed, max(r[2] for r in rows), detail))
        if quick or i > 0 and world > 1 and backend == "nccl":
            continue  # one profiled run per kind of placement is enough
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as folder:
                checks += [Check(label, *row) for row in profile_check(backend, world, folder)]
        except Exception as exc:  # one broken check is reported; the configurations after it still run
            cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'}"
            checks.append(Check(label, "profiled run", False, time.perf_counter() - start, cause))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minddp.doctor", description=described(__doc__))
    parser.add_argument("--quick", action="store_true", help="the first configuration only, no profiled run")
    parser.add_argument(
        "--json", metavar="FILE", help="also write the checks to FILE (one object per row of the table)"
    )
    gpu = parser.add_argument_group("on a GPU machine (minddp.doctor.gpu_report; --gpu-report DIR --help)")
    gpu.add_argument("--gpu-report", metavar="DIR", help="check the whole GPU path in minutes, everything into DIR")
    gpu.add_argument("--gpu-wheels", metavar="DIR", help="download the wheels a GPU machine without internet needs")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        checks = run(quick=args.quick)
    except KeyboardInterrupt:
        print("minddp.doctor: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    print(table(checks))
    if args.json:
        from minddp.runtime.profiling import write_json

        write_json(args.json, [asdict(c) for c in checks])
    failed = [c for c in checks if c.ok is False]
    print(
        f"{len(checks) - len(failed)} of {len(checks)} checks passed or skipped, {len(failed)} failed, "
        f"in {time.perf_counter() - start:.0f} s"
    )
    return 1 if failed else 0
