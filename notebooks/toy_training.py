"""The small training job the notebooks run on every rank: a toy task, a tiny MLP, one loop.

It is glue, not a stage: every stage comes from :mod:`minddp.stages`, every
step from :func:`minddp.loop.train_step`, every trace from
:class:`minddp.profiling.StepProfiler`. What this file adds is a task small
enough for a 2-core laptop:

1. **model**: an MLP of ``depth`` square layers, built from a fixed seed (so a
   single process and every rank can build the very same one);
2. **data**: random inputs, labelled by which of their first two features
   is larger (a task the MLP learns in a few dozen steps); every rank draws the
   same *global* batch from the same seed and keeps its shard
   ``x[rank::world_size]``, so the ranks together see exactly the batch a
   single process would;
3. **run**: wrap the model in a stage, optionally register a comm hook, train
   ``steps`` steps under the profiler, and return the per-step losses and
   what went over the wire (from a :class:`minddp.comm.wire.Traffic` meter).

Traces land in ``traces/notebooks/<run>/<stage>/rank<r>.pt.trace.json`` with a
``config.json``, the layout :func:`minddp.analysis.analyze_run` reads (git
ignores ``traces/``).

Example::

    >>> losses, wire_stats = run("bucket-async", steps=6, run_name="demo")
    >>> analyze_run(trace_dir("demo")).stages     # in the notebook process
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.measure import error_measured
from minddp.comm.registry import make_hook
from minddp.comm.wire import Traffic, Wire
from minddp.ladder import build_stage
from minddp.loop import train_step
from minddp.profiling import StepProfiler, write_json

WIDTH, CLASSES = 128, 2
TRACE_ROOT = Path(__file__).resolve().parents[1] / "traces" / "notebooks"


def trace_dir(run_name: str) -> Path:
    """Where the traces of ``run_name`` go (and where the analysis reads them)."""
    return TRACE_ROOT / run_name


def make_model(depth: int = 6, seed: int = 0) -> nn.Module:
    """Step 1: the same weights in every process that passes the same seed."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def global_batches(steps: int, accum: int = 1, per_rank: int = 32, seed: int = 1):
    """Step 2: yield, per step, ``accum`` micro-batches ``(x, y)`` of this rank's shard."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        micro = []
        for _ in range(accum):
            x = torch.randn(per_rank * world, WIDTH, generator=g)  # the global batch, same on every rank
            y = x[:, :CLASSES].argmax(dim=1)
            micro.append((x[rank::world], y[rank::world]))         # this rank's shard
        yield micro


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def wrap(stage: str, model: nn.Module, bucket_cap_mb: float) -> nn.Module:
    """A minddp stage by name, or ``torch``: torch's own DDP, the baseline."""
    if stage == "torch":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    return build_stage(stage, model, bucket_cap_mb=bucket_cap_mb)


def run(stage: str, steps: int = 8, accum: int = 1, hook: str | None = None, run_name: str | None = None,
        bucket_cap_mb: float = 0.1, lr: float = 3e-3, measure_error: bool = False, **hook_options):
    """Step 3: train ``steps`` steps of ``stage``; return (losses, wire stats per step).

    ``hook`` is a name from :func:`minddp.comm.registry.make_hook` (``fp16``,
    ``powersgd``, ...). With ``run_name`` the steps after the first are
    profiled into :func:`trace_dir` ``(run_name)/<stage>``.
    """
    model = wrap(stage, make_model(), bucket_cap_mb)
    traffic = Traffic()
    if stage != "torch":
        state, fn = make_hook(hook or "allreduce", Wire(None, traffic=traffic), **hook_options)
        model.register_comm_hook(state, error_measured(fn, traffic) if measure_error else fn)
    elif hook is not None:
        model.register_comm_hook(*make_hook(hook, None, **hook_options))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    folder = trace_dir(run_name) / stage if run_name else None
    profiler = StepProfiler(str(folder), dist.get_rank(), steps, active=steps - 1, enabled=folder is not None)
    losses, wire_stats = [], []
    with profiler:
        for micro in global_batches(steps, accum):
            traffic.reset()
            losses.append(train_step(model, optimizer, micro, loss_fn))
            wire_stats.append(traffic.snapshot())
            profiler.step()
    if folder is not None and dist.get_rank() == 0:
        write_json(os.path.join(folder, "config.json"),
                   {"run_name": run_name, "stage": stage, "world_size": dist.get_world_size(),
                    "steps": steps, "grad_accum": accum, "hook": hook, "bucket_cap_mb": bucket_cap_mb})
    return losses, wire_stats
