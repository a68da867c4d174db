"""``python -m minddp.bench.debug``: what debug mode (``MINDDP_DEBUG=1``) costs a training step.

A benchmark, not a test. Debug mode is a switch of the process (``minddp.debug.enable``/``disable``), so one run
can hold a wrapper built with it and one without, and turn it on only for the steps of the first:

1. **build**, on every rank, each ``--stage`` twice from the same seeded model of the ``--preset``
   (the train command's, as ``python -m minddp.bench`` builds it): once in debug mode (its checks
   hooked in, its collectives checked), once plain;
2. **rounds**: the configurations take turns step by step (``--warmup`` untimed steps, then
   ``--steps-per-round`` timed ones of :func:`minddp.ladder.loop.train_step`, a barrier before each), in an
   order shuffled each round, debug mode on for exactly the steps of the debug configuration; a
   step's time is its slowest rank's;
3. **report**: each configuration's median step, and debug over plain with a 90 % interval that
   resamples whole rounds (:func:`minddp.bench.report.ratio_interval`), with the machine and the load.

``docs/benchmarks.md`` (*Debug mode*) holds what it measured.

Example::

    $ python -m minddp.bench.debug                                  # small preset, ddp, ~10 minutes on 2 cores
    $ python -m minddp.bench.debug --preset tiny --stage ddp,bucket-async --rounds 3
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

from minddp.runtime.cli import Parser, UsageError, described, fail, number

PROG = "minddp.bench.debug"


def debug_rank(stages: list[str], cfg, data, rounds: int, steps: int, warmup: int) -> dict:
    """Steps 1-2 on this rank: ``{(stage, debug on): [slowest rank's step seconds, ...]}``, round after round."""
    from minddp import debug
    from minddp.bench.configs import BenchConfig, optimizer, wrap
    from minddp.bench.worker import _loss
    from minddp.ladder.loop import train_step
    from minddp.runtime.device import current_device, synchronize
    from minddp.train.data import step_batches
    from minddp.train.models import build_model

    device, rank, world = current_device(), dist.get_rank(), dist.get_world_size()
    was_on, runs, times = debug.enabled(), {}, {}
    for stage in stages:  # step 1
        for on in (False, True):
            debug.enable() if on else debug.disable()  # as the wrapper is built: its checks are hooked in, or not
            model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype).to(device)
            config = BenchConfig(stage, stage)
            batches = step_batches(data.train, cfg.batch_size, cfg.grad_accum, world, rank, cfg.seed, data.pad_token_id)
            runs[stage, on] = (wrap(config, model, cfg), optimizer(config, model, cfg), batches)
            times[stage, on] = []
    debug.disable()
    slowest = torch.zeros(
        1, dtype=torch.float64, device=device
    )  # the slowest rank's time, all_reduced (NCCL: on the GPU)
    for r in range(rounds):  # step 2
        order = random.Random(f"{cfg.seed}/{r}").sample(list(runs), len(runs))
        for i in range(warmup + steps):
            for key in order:
                wrapped, opt, batches = runs[key]
                micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
                dist.barrier()
                debug.enable() if key[1] else debug.disable()
                start = time.perf_counter()
                train_step(wrapped, opt, micro, _loss)
                synchronize(device)
                slowest[0] = time.perf_counter() - start
                debug.disable()
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if i >= warmup:
                    times[key].append(slowest.item())
    debug.enable() if was_on else debug.disable()
    return times


def report(times: dict, stages: list[str], rounds: int, meta: dict) -> str:
    """Step 3: a markdown table, debug over plain per stage, with its interval."""
    from minddp.bench.report import ratio_interval

    lines = [
        "| stage | step, plain (ms, median) | step, debug mode (ms, median) | debug ÷ plain (90 % CI) |",
        "|---|---|---|---|",
    ]
    for stage in stages:
        plain, on = times[stage, False], times[stage, True]
        low, high = ratio_interval(on, plain, rounds)
        ratio = statistics.median(on) / statistics.median(plain)
        lines.append(
            f"| {stage} | {statistics.median(plain) * 1e3:.1f} | {statistics.median(on) * 1e3:.1f} | "
            f"{ratio:.3f} ({low:.2f}–{high:.2f}) |"
        )
    return "\n".join([*lines, "", *(f"* {k}: {v}" for k, v in meta.items())])


def main(argv: list[str] | None = None) -> int:
    from minddp.bench.report import machine
    from minddp.ladder import STAGES
    from minddp.runtime.launch import RankError, launch
    from minddp.train.config import ConfigError, TrainConfig
    from minddp.train.data import DataError
    from minddp.train.run import prepare

    p = Parser(
        prog=f"python -m {PROG}",
        description=described(__doc__),
        usage=f"python -m {PROG} [--preset tiny|small|medium] [--stage NAME[,...]] [options]",
    )
    p.add_argument("--preset", default="small", help="tiny, small (default) or medium: python -m minddp.bench's")
    p.add_argument("--stage", "--stages", dest="stages", default="ddp", help="comma list of minddp stages (ddp)")
    p.add_argument("--rounds", type=number(int, low=1), default=6, help="rounds of turns (default 6)")
    p.add_argument(
        "--steps-per-round", type=number(int, low=1), default=5, help="timed steps per configuration per round (5)"
    )
    p.add_argument("--warmup", type=number(int, low=0), default=1, help="untimed steps per round first")
    try:
        from minddp.bench.__main__ import PRESETS

        ns = p.parse_args(argv)
        if ns.preset not in PRESETS:
            raise UsageError(f"--preset: {ns.preset!r} is not one of {', '.join(PRESETS)}")
        stages = [s for s in ns.stages.split(",") if s]
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise UsageError(f"--stage: unknown {unknown or 'empty list'}; choose from {', '.join(STAGES)}")
        cfg = TrainConfig(**PRESETS[ns.preset], profile_steps=0)
        data, placement, _ = prepare(cfg)
    except (UsageError, ConfigError, DataError) as exc:
        return fail(PROG, exc, p)
    load, start = os.getloadavg()[0], time.perf_counter()
    try:
        times = launch(
            debug_rank,
            stages,
            cfg,
            data,
            ns.rounds,
            ns.steps_per_round,
            ns.warmup,
            world_size=cfg.world_size,
            backend=placement,
        )[0]
    except RankError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    meta = {
        "machine": machine(),
        "command": f"python -m {PROG} " + " ".join(sys.argv[1:] if argv is None else argv),
        "preset": f"{ns.preset} ({cfg.model}, batch {cfg.batch_size} x {cfg.max_seq_len} tokens per rank, "
        f"{cfg.grad_accum} micro-batches, {cfg.world_size} ranks)",
        "steps timed per configuration": ns.rounds * ns.steps_per_round,
        "load (1 min) before / after": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
        "wall": f"{time.perf_counter() - start:.0f} s",
    }
    print(report(times, stages, ns.rounds, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
