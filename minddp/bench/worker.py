"""Inside one rank: train every configuration, alternating, and time each step.

1. **build** every configuration once: the same seeded model, wrapped as the
   configuration says (:func:`~minddp.bench.configs.wrap`), with its own AdamW
   and its own copy of this rank's data stream (same batches for all);
2. **rounds**: in each round, every configuration in turn runs ``warmup``
   untimed steps, then ``steps`` timed ones (:func:`minddp.loop.train_step`,
   the loop the train command uses). The order rotates by one each round, so
   no configuration always follows the same neighbour, and a burst of noise
   on the machine lands on all of them alike. Each timed step records its
   wall time and what :data:`minddp.comm.wire.traffic` counted (torch's
   hooks bypass our wire: :func:`counting_torch_all_reduce` counts them);
3. **profile** (optional): after the rounds, each configuration runs
   ``1 + profile_steps`` more steps under the profiler (the first is its
   warm-up), with memory events on; the trace goes to
   ``<trace_dir>/<config>/rank<r>.pt.trace.json`` for
   :mod:`minddp.analysis` (overlap, calls and bytes for torch's DDP too) and
   for the memory high-water (:func:`minddp.bench.report.step_peak_bytes`).

Example::

    >>> launch(bench_rank, configs, cfg, data, rounds=3, steps=10, warmup=2, trace_dir=None)
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist

from minddp.bench.configs import BenchConfig, wrap
from minddp.config import TrainConfig
from minddp.data import PreparedData, step_batches


def _loss(model, batch):
    return model(**batch).loss


@contextlib.contextmanager
def counting_torch_all_reduce(traffic):
    """Count torch's hooks' collectives in ``traffic``: they call ``dist.all_reduce``, not our wire.

    torch's DDP calls its comm hook from C++, and its Python hooks (allreduce,
    fp16, PowerSGD) send through ``torch.distributed.all_reduce``, looked up
    at call time, so wrapping that one function sees every byte they send.
    Only around torch's configurations: ours already count in the wire.
    """
    original = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        traffic.record(tensor)
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        yield
    finally:
        dist.all_reduce = original


def bench_rank(configs: list[BenchConfig], cfg: TrainConfig, data: PreparedData, rounds: int, steps: int,
               warmup: int, trace_dir: str | None, profile_steps: int = 2) -> dict:
    """Steps 1-3 on this rank; returns ``{config name: {"times": [...], "calls": [...], "bytes": [...]}}``."""
    from minddp.comm import wire
    from minddp.device import current_device, synchronize
    from minddp.loop import train_step
    from minddp.models import build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    device = current_device()
    runs = {}
    for config in configs:                                                                  # step 1
        model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype).to(device)
        model.train()
        wrapped = wrap(config, model, cfg, device)
        batches = step_batches(data.train, cfg.batch_size, cfg.grad_accum, world, rank, cfg.seed,
                               data.pad_token_id)
        meter = (lambda: counting_torch_all_reduce(wire.traffic)) if config.stage == "torch" else contextlib.nullcontext
        runs[config.name] = (wrapped, torch.optim.AdamW(model.parameters(), lr=cfg.lr), batches, meter)
    out = {c.name: {"times": [], "calls": [], "bytes": []} for c in configs}

    def one_step(name: str) -> float:
        wrapped, optimizer, batches, meter = runs[name]
        micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
        wire.traffic.reset()
        synchronize(device)
        with meter():
            start = time.perf_counter()
            train_step(wrapped, optimizer, micro, _loss)
            synchronize(device)
            return time.perf_counter() - start

    for r in range(rounds):                                                                 # step 2
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for config in order:
            dist.barrier()         # start together: a rank still busy elsewhere is not this config's cost
            for _ in range(warmup):
                one_step(config.name)
            for _ in range(steps):
                seconds = one_step(config.name)
                rec = out[config.name]
                rec["times"].append(seconds)
                rec["calls"].append(wire.traffic.calls)
                rec["bytes"].append(wire.traffic.bytes)
    if trace_dir is not None:                                                               # step 3
        from minddp.profiling import StepProfiler
        for config in configs:
            dist.barrier()
            folder = os.path.join(trace_dir, config.name)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            with StepProfiler(folder, rank, 1 + profile_steps, profile_steps,
                              cuda=device.type == "cuda") as prof:
                for _ in range(1 + profile_steps):
                    one_step(config.name)
                    prof.step()
            if device.type == "cuda":
                # The same definition as on CPU: high-water above what was live before the steps.
                out[config.name]["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    return out
