"""Inside one rank: train every configuration, alternating, and time each step.

docs/benchmarks.md, "Method", says why it is done this way; the steps:

1. **build** every configuration once: the same seeded model, wrapped as it says
   (:func:`~minddp.bench.configs.wrap`), its own AdamW and its own copy of this rank's data stream;
2. **rounds**: the configurations take turns *step by step* (``warmup`` untimed steps, then ``steps``
   timed ones of :func:`minddp.ladder.loop.train_step`, a barrier before each), in a seeded order
   shuffled each round; each timed step records its wall time, the training thread's CPU time and
   its wire's :class:`~minddp.comm.wire.Traffic` (torch's hooks: :func:`counting_torch_all_reduce`;
   torch's default, with no hook, from the traces of step 3);
3. **profile** (optional), each round after the timed steps: ``1 + profile_steps`` steps under the
   profiler to ``<trace_dir>/<config>/rank<r>.pt.trace.json``, read back for the overlap
   (:func:`minddp.analysis.overlap_parts`);
4. **memory** (after the rounds, when ``measure_memory``): each configuration built afresh under the
   profiler, for its high-water (:func:`fresh_peak_bytes`).

Example (one rank: torch's DDP with its Python ``allreduce_hook``, counted)::

    >>> from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    >>> from minddp.comm.wire import Traffic
    >>> ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    >>> ddp.register_comm_hook(None, allreduce_hook)
    >>> traffic = Traffic()
    >>> with counting_torch_all_reduce(traffic):
    ...     ddp(torch.ones(3, 4)).sum().backward()
    >>> traffic.calls, traffic.bytes                 # one bucket: (4·2 + 2) float32 gradients
    (1, 40)
    >>> from minddp.runtime.launch import launch     # the whole benchmark: ranks that train for minutes
    >>> launch(bench_rank, configs, cfg, data, rounds=4, steps=10, warmup=2, trace_dir=None)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import random
import time

import torch
import torch.distributed as dist

from minddp.bench.configs import BenchConfig, optimizer, wrap
from minddp.train.config import TrainConfig
from minddp.train.data import PreparedData, step_batches


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


def bench_rank(
    configs: list[BenchConfig],
    cfg: TrainConfig,
    data: PreparedData,
    rounds: int,
    steps: int,
    warmup: int,
    trace_dir: str | None,
    profile_steps: int = 2,
    launch_index: int = 0,
    measure_memory: bool = True,
) -> dict:
    """Steps 1-4 on this rank; returns ``{config name: {"times": [...], "cpu": [...], "calls": [...], ...}}``.

    ``launch_index`` (which of the benchmark's launches this is) only seeds the round orders.
    """
    from minddp.comm.link import Link
    from minddp.comm.wire import Traffic, Wire
    from minddp.ladder.loop import train_step
    from minddp.runtime.device import current_device, synchronize
    from minddp.train.models import build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    device = current_device()
    link = None if cfg.link is None else Link(cfg.link)  # --link: this rank's emulated NIC, shared by all
    runs = {}

    def build(config: BenchConfig):
        model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype).to(device)
        model.train()
        traffic = Traffic()
        wire = None if config.stage.startswith("torch") else Wire(None, traffic=traffic)
        compiled = torch.compile(model, backend=cfg.compile_backend) if cfg.compile else model  # as train's
        wrapped = wrap(config, compiled, cfg, wire=wire, link=link)
        batches = step_batches(data.train, cfg.batch_size, cfg.grad_accum, world, rank, cfg.seed, data.pad_token_id)
        meter = (lambda: counting_torch_all_reduce(traffic)) if config.stage == "torch" else contextlib.nullcontext
        return wrapped, optimizer(config, model, cfg, wire, link), batches, meter, traffic

    for config in configs:  # step 1
        runs[config.name] = build(config)
    out = {c.name: {"times": [], "cpu": [], "calls": [], "bytes": [], "overlap": []} for c in configs}

    def one_step(run) -> tuple[float, float]:
        """Train one step; its wall time and the training thread's CPU time, in seconds."""
        wrapped, optimizer, batches, meter, traffic = runs[run] if isinstance(run, str) else run
        micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
        traffic.reset()
        synchronize(device)
        with meter():
            start, cpu_start = time.perf_counter(), time.thread_time()
            train_step(wrapped, optimizer, micro, _loss)
            synchronize(device)
            return time.perf_counter() - start, time.thread_time() - cpu_start

    for r in range(rounds):  # step 2
        order = random.Random(f"{cfg.seed}/{launch_index}/{r}").sample(configs, len(configs))
        for i in range(warmup + steps):
            for config in order:
                dist.barrier()  # start together: a rank still busy elsewhere is not this step's cost
                seconds, cpu_seconds = one_step(config.name)
                if i >= warmup:
                    rec = out[config.name]
                    rec["times"].append(seconds)
                    rec["cpu"].append(cpu_seconds)
                    traffic = runs[config.name][4]
                    rec["calls"].append(traffic.calls)
                    rec["bytes"].append(traffic.bytes)
        for config in order if trace_dir is not None and profile_steps else []:  # step 3
            dist.barrier()
            folder = os.path.join(trace_dir, config.name)
            rec = out[config.name]
            rec["overlap"].append(
                profiled_overlap(lambda: one_step(config.name), profile_steps, folder, rank, device, link)
            )
            if config.torch_cpp_default:
                # torch's C++ default averages without a Python call to meter: count from the trace
                from minddp.analysis import trace_traffic
                from minddp.runtime.profiling import trace_path

                rec.setdefault("trace_traffic", []).append(trace_traffic(trace_path(folder, rank), rank))
    if trace_dir is not None and profile_steps and measure_memory:
        for config in configs:  # step 4
            dist.barrier()
            out[config.name]["peak_bytes"] = fresh_peak_bytes(
                lambda: build(config), one_step, 1 + profile_steps, os.path.join(trace_dir, config.name), rank, device
            )
    if link is not None:
        link.close()
    return out


def profiled_overlap(
    step, profile_steps: int, folder: str, rank: int, device: torch.device, link=None
) -> tuple[float, float]:
    """Step 3: run ``1 + profile_steps`` steps under the profiler; return ``(hidden, comm)`` µs of this rank.

    With a link, its transfers are written into the trace first, so they count as communication.
    """
    from minddp.analysis import overlap_parts
    from minddp.runtime.profiling import StepProfiler

    # No memory events here: overlap needs only the time ranges, and step 4 measures memory on its own.
    with StepProfiler(folder, rank, 1 + profile_steps, profile_steps, cuda=device.type == "cuda", memory=False) as prof:
        for _ in range(1 + profile_steps):
            step()
            prof.step()
    if link is not None:
        link.annotate_trace(prof.path)
    return overlap_parts(prof.path, rank)


def fresh_peak_bytes(build, one_step, steps: int, folder: str, rank: int, device: torch.device) -> int:
    """Step 4: high-water of tensor bytes this configuration allocates, from building it through ``steps`` steps.

    A fresh copy is built under the profiler, so the count covers what the
    configuration owns (parameters, gradients, buckets, optimizer state) and
    what a step allocates on top (activations, copies), and nothing the other
    configurations in this process hold. CPU: the highest ``Total Allocated``
    of the profiler's memory events (it counts from the profiler's start);
    GPU: ``torch.cuda.max_memory_allocated`` above what was allocated before.
    """
    from torch.profiler import ProfilerActivity, profile

    from minddp.bench.report import max_total_allocated
    from minddp.runtime.profiling import quiet_kineto

    quiet_kineto()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state = build()
        for _ in range(steps):
            one_step(state)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) - base
    path = os.path.join(folder, f"memory_rank{rank}.json")
    prof.export_chrome_trace(path)
    return max_total_allocated(path)
