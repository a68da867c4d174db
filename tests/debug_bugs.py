"""Small two-rank training scripts, each with one classic data-parallel bug (``docs/debugging.md``).

One ordinary DDP script, :func:`train`, with the bug named by ``kind`` switched on. Run it as a user
would, under torchrun, with torch's DDP or minddp's, with and without ``MINDDP_DEBUG=1``::

    python -m torch.distributed.run --nproc-per-node 2 tests/debug_bugs.py drift torch
    MINDDP_DEBUG=1 python -m torch.distributed.run --nproc-per-node 2 tests/debug_bugs.py drift minddp

``tests/test_debug.py`` runs the same function inside ``minddp.launch`` worlds (several kinds per
world) and under torchrun.
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn

#: kind -> the bug it plants, as docs/debugging.md names it.
KINDS = {
    "none": "no bug: the reference run",
    "drift": "rank 1 edits a parameter in place after step 1 (replicas drift apart)",
    "buffers": "BatchNorm with broadcast_buffers=False (each rank keeps its own running statistics)",
    "direct": "the forward calls model.module(x), not the wrapper (gradients never averaged)",
    "no_sync": "the last step's backward runs inside no_sync(), then optimizer.step() (gradients never averaged)",
    "same-data": "every rank reads the same batches (no DistributedSampler)",
    "coll-shape": "the script's own all_reduce of metrics: 2 values on rank 0, 1 on rank 1",
    "coll-dtype": "the script's own all_reduce: float32 on rank 0, int64 on rank 1",
    "coll-op": "the script's own collective: all_reduce on rank 0, broadcast on rank 1",
    "coll-missing": "the script's own all_reduce of the loss, on rank 0 only (logging)",
    "uneven": "rank 1 has one batch fewer, leaves its loop and ends its script",
    "uneven-barrier": "rank 1 has one batch fewer, leaves its loop and waits in a barrier",
    "join": "no bug: rank 1 has one batch fewer, and the loop runs under model.join() (the fix)",
    "frozen": "a layer frozen (requires_grad=False) on rank 0 only, before wrapping",
    "frozen-late": "a layer frozen on rank 0 only after wrapping, before step 1",
    "unused": "a branch of the model used on rank 0 only (find_unused_parameters=True is the fix)",
}
STEPS = 4


class Net(nn.Module):
    """An encoder and a head; optionally a BatchNorm between them, and a branch ``extra`` used when told to."""

    def __init__(self, norm: bool = False, extra: bool = False):
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16) if norm else nn.Identity()
        self.head = nn.Linear(16, 4)
        self.extra = nn.Linear(16, 4) if extra else None

    def forward(self, x, use_extra: bool = False):
        h = torch.tanh(self.norm(self.encoder(x)))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def batches(kind: str, rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's shard of the data: its own batches (the same on every rank for ``same-data``)."""
    g = torch.Generator().manual_seed(0 if kind == "same-data" else 100 + rank)
    mine = steps - 1 if kind in ("uneven", "uneven-barrier", "join") and rank == 1 else steps
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(mine)]


def log_metrics(kind: str, rank: int, loss: torch.Tensor) -> None:
    """What a script does after a step to log its loss across ranks, with the ``coll-*`` bugs in it."""
    if kind == "coll-shape":
        dist.all_reduce(torch.tensor([loss.item(), 1.0] if rank == 0 else [loss.item()]))
    elif kind == "coll-dtype":
        dist.all_reduce(torch.tensor([1.0]) if rank == 0 else torch.tensor([1]))
    elif kind == "coll-op":
        metric = loss.detach().reshape(1)
        dist.all_reduce(metric) if rank == 0 else dist.broadcast(metric, src=0)
    elif kind == "coll-missing" and rank == 0:
        dist.all_reduce(loss.detach().reshape(1))


def train(kind: str, impl: str, steps: int = STEPS) -> torch.Tensor:
    """The script: build, wrap, train ``steps`` steps with the bug ``kind``; this rank's parameters at the end."""
    if impl == "torch":
        from torch.nn.parallel import DistributedDataParallel as DDP
    elif impl == "minddp":
        from minddp import DistributedDataParallel as DDP
    elif impl.startswith("class:"):  # a stage built by its class (``class:simple`` is SimpleDDP(model))
        from minddp.ladder import STAGES

        DDP = STAGES[impl.removeprefix("class:")]
    else:  # a teaching stage (``ga``, ``bucket-async``, ...), which averages in finish_gradient_synchronization()
        from minddp import build_stage

        DDP = functools.partial(build_stage, impl)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net(norm=kind == "buffers", extra=kind == "unused")
    if kind == "frozen" and rank == 0:
        model.head.requires_grad_(False)
    ddp = DDP(model, **({"broadcast_buffers": False} if kind == "buffers" else {}))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with ddp.join() if kind == "join" else contextlib.nullcontext():
        for step, (x, y) in enumerate(batches(kind, rank, steps)):
            if kind == "frozen-late" and step == 1 and rank == 0:
                model.head.requires_grad_(False)
            local = kind == "no_sync" and step == steps - 1
            with ddp.no_sync() if local else contextlib.nullcontext():
                out = ddp.module(x) if kind == "direct" else ddp(x, use_extra=kind == "unused" and rank == 0)
                loss = nn.functional.mse_loss(out, y)
                loss.backward()
            if impl not in ("torch", "minddp"):
                ddp.finish_gradient_synchronization()
            log_metrics(kind, rank, loss)
            optimizer.step()
            optimizer.zero_grad()
            if kind == "drift" and step == 1 and rank == 1:
                with torch.no_grad():
                    model.head.weight[0, 0] += 1e-3
    if kind == "uneven-barrier":
        dist.barrier()
    return torch.cat([t.detach().reshape(-1) for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()])


#: The recorded runs: (column title, DDP, environment).
RECORDED = [
    ("torch's DDP", "torch", {"MINDDP_DEBUG": "0"}),
    (
        "torch's DDP, `TORCH_DISTRIBUTED_DEBUG=DETAIL`",
        "torch",
        {"MINDDP_DEBUG": "0", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    ),
    ("minddp's DDP, `MINDDP_DEBUG=1`", "minddp", {"MINDDP_DEBUG": "1"}),
]


def record(kinds: list[str], bound_s: float = 90.0) -> None:
    """Print a markdown table: what each script does under torchrun with torch's DDP and with minddp's in debug mode.

    Each job is bounded (``bound_s``); a job still running then is ended (every process it started) and
    recorded as a hang. ``docs/debugging.md`` holds the table this printed.
    """
    import os
    import subprocess

    from processes import run_torchrun, torchrun_args

    print("| script | " + " | ".join(title for title, _, _ in RECORDED) + " |")
    print("|---" * (len(RECORDED) + 1) + "|")
    for kind in kinds:
        cells = []
        for _, impl, extra in RECORDED:
            env = dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(sys.path))
            try:
                done = run_torchrun(torchrun_args(__file__, kind, impl), timeout=bound_s, env=env)
                cells.append(_outcome(done.returncode, done.stdout + done.stderr))
            except subprocess.TimeoutExpired:
                cells.append(f"still running after {bound_s:.0f} s: hangs (ended by the recorder)")
        print(f"| `{kind}`: {KINDS[kind]} | " + " | ".join(cells) + " |", flush=True)


def _outcome(code: int, output: str) -> str:
    """A job's exit and why: minddp's debug line, else each rank's last error, else how the ranks' parameters end."""
    said = [line[line.index("minddp debug (rank") :] for line in output.splitlines() if "minddp debug (rank" in line]
    last: dict[str, str] = {}
    for rank, line in re.findall(r"^\[rank(\d+)\]: (.*)$", output, re.M):
        if re.match(r"^[\w.]*(Error|Exception)\b.*: ", line):
            last[rank] = line
    if not last:  # a crash without a Python error: torchrun's summary says each rank's exit code (-N: signal N)
        codes = re.findall(r"rank\s*: (\d+).*?\n.*?exitcode\s*: (-?\d+)", output)
        last = {rank: f"died of {signal.Signals(-int(c)).name}" for rank, c in codes if int(c) < 0}
    sums = re.findall(r"rank \d+: done, parameter checksum (-?[\d.]+)", output)  # the ranks' lines may interleave
    if said:
        why = _short(said[0])
    elif last:
        why = "; ".join(f"rank {rank}: {_short(line, 220)}" for rank, line in sorted(last.items()))
    elif len(sums) < 2:
        why = "nothing said"
    elif len(set(sums)) > 1:
        why = "nothing said; the ranks end with different parameters or buffers"
    else:
        why = "nothing said; the ranks end with the same parameters and buffers"
    return f"exit {code}: {why.replace('|', '/')}"


def _short(line: str, most: int = 300) -> str:
    return line if len(line) <= most else line[: most - 3] + "..."


if __name__ == "__main__":
    if sys.argv[1] == "--record":  # python tests/debug_bugs.py --record [kind ...]
        record(sys.argv[2:] or list(KINDS))
        sys.exit(0)
    kind, impl = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "minddp"
    dist.init_process_group("gloo")
    params = train(kind, impl)
    print(f"rank {dist.get_rank()}: done, parameter checksum {params.double().sum().item():.9f}", flush=True)
    dist.destroy_process_group()
