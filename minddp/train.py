"""``python -m minddp.train``: fine-tune a sequence classifier with one DDP stage, or all of them.

What one run does:

1. **validate** every option in this process, before any rank starts
   (a usage line and one error line, exit code 2): each value finite and in
   range, the outputs writable with room for what the run will write
   (:mod:`minddp.outputs`), a ``--resume`` file read whole and checked against
   the model this run builds;
2. **prepare** the model name (the offline default if a hub model cannot be
   had) and the data (tokenized once, here, then handed to every rank);
3. for each stage: **launch** the ranks (``single`` is one process on the
   global batch; under ``torchrun`` this process is one rank of the job);
   each rank builds the same seeded model, wraps it in the stage, and trains
   on its shard of every global batch with :func:`minddp.loop.train_step`,
   under the profiler for the first steps; it then measures held-out accuracy;
4. **report**: a summary table on rank 0, ``summary.json`` and each stage's
   ``config.json`` beside the traces, and optionally ``python -m minddp.analyze``.
   The table comes first and each file is written on its own, so one that
   cannot be written (a full disk) is named and hides nothing; the exit code
   is then 1, as for a failed rank (whose table of finished stages is kept too).

Example::

    $ python -m minddp.train --stage bucket-async                 # offline default, 2 ranks on CPU
    $ python -m minddp.train --stage all --steps 30               # every stage, same data and seeds
    $ torchrun --nproc-per-node 4 -m minddp.train --model HuggingFaceTB/SmolLM2-360M-Instruct \\
          --dtype bf16 --dataset glue/mrpc --batch-size 16 --steps 6 --stage bucket-async
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from minddp.cli import bar_drawn, fail, fresh_line
from minddp.config import ConfigError, TrainConfig, build_parser, parse_args
from minddp.data import DataError, Encoded, PreparedData, eval_batches, prepare_data, step_batches
from minddp.device import DEFAULT_TIMEOUT_S, Placement, choose
from minddp.hang import DEFAULT_HANG_S
from minddp.launch import RankError, in_torchrun, launch
from minddp.models import build_model, resolve_model
from minddp.profiling import StepProfiler, write_json

PROG = "minddp.train"


def say(message: str) -> None:
    """One line to stderr, on a line of its own (after a progress bar), on rank 0 only under torchrun."""
    if os.environ.get("RANK", "0") == "0" or not in_torchrun():
        print(f"{fresh_line()}{PROG}: {message}", file=sys.stderr, flush=True)


# -- inside a rank --------------------------------------------------------------------------------

def torch_hook_unavailable(hook: str, backend: str, bucket_cap_mb: float | None = None,
                           device_type: str = "cpu") -> str | None:
    """Why torch's DDP cannot run ``hook`` here (one line), or None if it can.

    Each reason is a failure of torch 2.13 seen on this backend, not a guess:
    its bf16 hooks refuse gloo; its batched PowerSGD hook hands a 2-D matrix to
    a 3-D-only orthogonalization (a bare AssertionError); its PowerSGD hook
    issues the second all_reduce from a future callback, so with several
    buckets in flight on gloo the ranks pair different collectives and gloo
    aborts the process ("op.preamble.length <= op.nbytes").
    """
    from minddp.ladder import torch_hook
    try:
        torch_hook(hook)
    except ValueError as exc:
        return str(exc)
    base = hook.rpartition("+")[2]
    if "bf16" in hook and backend != "nccl":
        return f"torch's bf16 hooks need NCCL, this run uses {backend}"
    if "powersgd" in base and device_type == "cpu" and torch.cuda.is_available():
        return ("torch's PowerSGD hooks call torch.cuda.synchronize on the CPU tensors' device when CUDA is "
                "available, which fails; run on the GPUs (--backend auto) to compare with them")
    if base == "batched-powersgd":
        return "torch's batched_powerSGD_hook fails in torch 2.13 (2-D input to a 3-D orthogonalization)"
    if base == "powersgd" and backend == "gloo" and (bucket_cap_mb or 0) < 25:
        return ("torch's powerSGD_hook mis-pairs collectives on gloo when several buckets are in flight "
                "(gloo aborts); add --bucket-cap-mb 25 (one bucket on the offline model) to compare with it")
    return None


def _loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


@torch.no_grad()
def evaluate(model: nn.Module, data: Encoded, replicas: int, rank: int, device: torch.device,
             pad_token_id: int, batch_size: int = 64) -> float:
    """Accuracy on the held-out split; each rank scores a disjoint share, counts are summed."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in eval_batches(data, batch_size, replicas, rank, pad_token_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        counts += torch.tensor([(logits.argmax(-1) == batch["labels"]).sum().item(), len(batch["labels"])],
                               dtype=torch.float64, device=device)
    if replicas > 1:
        dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1])


def checkpoint_config(cfg: TrainConfig, stage: str, replicas: int) -> dict:
    """The settings a checkpoint records (and a resume must match): this stage, its number of ranks."""
    return {**cfg.to_dict(), "stage": stage, "world_size": replicas}


def checkpoint_path(cfg: TrainConfig, stage: str) -> str:
    """``<dir>/<stage>.pt``; a folder ``<dir>/<stage>`` for the sharded stages (every rank writes its part)."""
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER
    sharded = stage in SHARDED_OPTIMIZER + SHARDED_GRADIENTS
    return os.path.join(cfg.checkpoint_dir, stage if sharded else f"{stage}.pt")


def train_rank(cfg: TrainConfig, stage: str, data: PreparedData, folder: str) -> dict:
    """One rank of one stage: build, wrap, train ``cfg.steps`` steps under the profiler, evaluate.

    With ``--resume`` the model, optimizer, hook state, RNGs, losses and data
    position come from the checkpoint and training goes on from its step;
    with ``--save-every N`` a checkpoint is written after every N-th step.
    """
    from minddp import checkpoint
    from minddp.collectives import TRANSPORTS
    from minddp.comm.link import Link
    from minddp.comm.wire import Traffic, Wire
    from minddp.device import current_device, synchronize
    from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, make_optimizer, wrap
    from minddp.launch import report_step
    from minddp.loop import train_step
    from minddp.sharding import checkpoint as sharded_checkpoint
    from minddp.sharding.memory import Probe

    rank, world = dist.get_rank(), dist.get_world_size()
    if in_torchrun() and world > 1:  # one folder for the whole job: rank 0's clock names it
        box = [folder]
        dist.broadcast_object_list(box, src=0)
        folder = box[0]
    single = stage == "single"
    # `single` is one process on the global batch; under torchrun every rank computes it (same result).
    replicas, shard = (1, 0) if single else (world, rank)
    batch_size = cfg.batch_size * (cfg.effective_world_size() if single else 1)
    device = current_device()
    traffic = Traffic()           # what this rank's hooks send, counted per step
    link = None if single or cfg.link is None else Link(cfg.link)     # this rank's emulated NIC
    model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype).to(device)
    model.train()
    bucket_cap_mb, why = (None if single and cfg.bucket_cap_mb == "auto" else cfg.bucket_cap_mb), None
    if bucket_cap_mb == "auto":
        from minddp.model.auto import choose_bucket_cap
        bucket_cap_mb, why = choose_bucket_cap(model, stage, step_batches(data.train, batch_size, cfg.grad_accum,
                                                                           replicas, shard, cfg.seed,
                                                                           data.pad_token_id),
                                               _loss, link, device, say=say if rank == 0 else None)
    wire = None if single else Wire(None, TRANSPORTS[cfg.collective], traffic, link)
    wrapped = wrap(stage, model, hook=cfg.hook, bucket_cap_mb=bucket_cap_mb,
                   powersgd_options=cfg.powersgd_options(), wire=wire)
    optimizer = make_optimizer(stage, model, torch.optim.AdamW, hook=cfg.hook, wire=wire, lr=cfg.lr)
    sharded = stage in SHARDED_OPTIMIZER + SHARDED_GRADIENTS   # each rank saves its own part (DCP)
    hook_state = getattr(wrapped, "minddp_hook_state", None)
    ckpt_config = checkpoint_config(cfg, stage, replicas)
    first, losses = 0, []
    if cfg.resume and sharded:
        first, mine = sharded_checkpoint.load(cfg.resume, wrapped, model, optimizer)
        checkpoint.set_rng_state(mine["rng"])
        losses = list(mine["losses"])
    elif cfg.resume:  # every rank loads the same weights, so the replicas stay identical
        ckpt = checkpoint.load_checkpoint(cfg.resume, model=model, config=ckpt_config, rank=rank)
        checkpoint.restore(ckpt, optimizer=optimizer, hook_state=hook_state)
        first, losses = ckpt["step"], list(ckpt["rank"]["losses"])
    batches = step_batches(data.train, batch_size, cfg.grad_accum, replicas, shard, cfg.seed, data.pad_token_id,
                           start_step=first)
    global_batch = batch_size * cfg.grad_accum * replicas
    times, calls, nbytes = [], [], []
    stage_dir = os.path.join(folder, stage)
    profiler = StepProfiler(stage_dir, rank, cfg.steps - first, cfg.profile_steps, gzip=cfg.trace_gzip,
                            enabled=profiling(cfg) and (rank == 0 or not single), cuda=device.type == "cuda")
    bar = _progress(cfg, stage, rank, first)
    probe = None                  # measures memory on the last step (minddp.sharding.memory)
    with profiler:
        for step in range(first, cfg.steps):
            report_step(step)  # a failure report then says where it happened
            micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
            traffic.reset()
            probe = Probe(wrapped, model, optimizer) if step == cfg.steps - 1 and not single else None
            synchronize(device)
            start = time.perf_counter()
            with torch.profiler.record_function(f"minddp.train_step#{step}"):
                loss = train_step(wrapped, optimizer, micro, _loss)
            synchronize(device)
            times.append(time.perf_counter() - start)
            calls.append(traffic.calls)
            nbytes.append(traffic.bytes)
            losses.append(loss)
            profiler.step()
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and sharded:
                sharded_checkpoint.save(checkpoint_path(cfg, stage), wrapped, model, optimizer, step=step + 1,
                                        config=ckpt_config, extra={"losses": losses})
            elif cfg.save_every and (step + 1) % cfg.save_every == 0:
                checkpoint.save_checkpoint(checkpoint_path(cfg, stage), model=model, optimizer=optimizer,
                                           step=step + 1, config=ckpt_config, hook_state=hook_state,
                                           extra={"losses": losses})
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{global_batch / times[-1]:.0f}", refresh=False)
                bar.update()
    if bar is not None:
        bar.close()
    if link is not None:
        if profiler.written:
            link.annotate_trace(profiler.written)   # the link's transfers, as ranges on a thread of their own
        link.close()
    mean_losses = torch.tensor(losses, dtype=torch.float64, device=device)
    if replicas > 1:  # each rank's loss is its shard's mean; the global batch's is their mean
        dist.all_reduce(mean_losses)
        mean_losses /= replicas
    eval_data = data.eval
    accuracy = evaluate(model, eval_data, replicas, shard, device, data.pad_token_id)
    trace_errors = [profiler.error]
    if world > 1 and profiling(cfg):   # every rank's export failure reaches rank 0's report
        trace_errors = [None] * world
        dist.all_gather_object(trace_errors, profiler.error)
    return {"stage": stage, "losses": mean_losses.tolist(), "step_times_s": times, "accuracy": accuracy,
            "all_reduce_calls": calls, "all_reduce_bytes": nbytes, "global_batch": global_batch,
            "ranks": replicas, "trace": profiler.written, "metered": stage != "torch" or link is not None, "folder": folder,
            "bucket_cap_mb": bucket_cap_mb, "bucket_cap_why": why,
            "trace_errors": {r: e for r, e in enumerate(trace_errors) if e},
            "memory": probe.result() if probe is not None else None}


def profiling(cfg: TrainConfig) -> bool:
    """Does this run write traces (--profile, and at least one profiled step)?"""
    return cfg.profile and cfg.profile_steps > 0


def _progress(cfg: TrainConfig, stage: str, rank: int, first: int = 0):
    if rank != 0 or not cfg.progress:
        return None
    import threading

    from tqdm import tqdm
    # tqdm's default lock is a multiprocessing semaphore; a rank ended mid-run (Ctrl-C, a failed peer)
    # cannot release it, and Python's resource tracker then warns of a leaked semaphore at exit.
    # One rank draws one bar: a thread lock is all it needs.
    tqdm.set_lock(threading.RLock())
    return tqdm(total=cfg.steps, initial=first, desc=f"{stage:>12}", unit="step", file=sys.stderr, dynamic_ncols=True)


# -- in the parent ----------------------------------------------------------------------------------

def run_stage(cfg: TrainConfig, stage: str, data: PreparedData, folder: str, placement: Placement) -> dict:
    """Step 3 for one stage: launch the ranks (or join torchrun's), return rank 0's result."""
    if stage == "ft":              # its own launcher: trains through a lost rank (minddp.ft)
        from minddp.ft.train import run_ft_stage
        return run_ft_stage(cfg, data, folder, say)
    world = 1 if stage == "single" else cfg.world_size
    # Ranks announce every step; a job with no new step for twice the collective timeout (plus a
    # minute for evaluation and saving) is hung somewhere the collective timeout cannot see. A rank
    # that stops while the others wait is named far sooner, after --hang-timeout (minddp.hang).
    timeout = DEFAULT_TIMEOUT_S if cfg.timeout is None else cfg.timeout
    hang_s = DEFAULT_HANG_S if cfg.hang_timeout is None else cfg.hang_timeout
    results = launch(train_rank, cfg, stage, data, folder, world_size=world, backend=placement,
                     timeout_s=cfg.timeout, stall_s=2 * timeout + 60, hang_s=hang_s or None)
    return results[0]


def summarize(result: dict) -> dict:
    """Numbers for the table: final loss, accuracy, median step time, throughput, traffic per step."""
    losses, times = result["losses"], result["step_times_s"]
    tail = losses[-min(10, len(losses)):]
    steady = times[1:] or times  # the first step pays one-off costs
    median = statistics.median(steady)
    metered = result["metered"]
    return {"final_loss": sum(tail) / len(tail), "accuracy": result["accuracy"], "median_step_s": median,
            "samples_per_s": result["global_batch"] / median,
            "all_reduce_calls_per_step": statistics.mean(result["all_reduce_calls"]) if metered else None,
            "all_reduce_bytes_per_step": statistics.mean(result["all_reduce_bytes"]) if metered else None,
            "trace": result["trace"]}


def format_table(rows: dict[str, dict]) -> str:
    head = f"{'stage':<13}{'loss*':>8}{'acc':>7}{'step ms':>9}{'samples/s':>11}{'AR calls':>10}{'AR MB':>9}"
    lines = [head, "-" * len(head)]
    for stage, s in rows.items():
        calls = "-" if s["all_reduce_calls_per_step"] is None else f"{s['all_reduce_calls_per_step']:.1f}"
        mb = "-" if s["all_reduce_bytes_per_step"] is None else f"{s['all_reduce_bytes_per_step'] / 2**20:.3f}"
        lines.append(f"{stage:<13}{s['final_loss']:>8.4f}{s['accuracy']:>7.3f}{s['median_step_s'] * 1e3:>9.1f}"
                     f"{s['samples_per_s']:>11.0f}{calls:>10}{mb:>9}")
    lines.append("loss* = mean of the last 10 steps; acc = held-out accuracy; AR = all_reduce per step "
                 "through minddp's hook layer ('-': torch's DDP, not metered)")
    return "\n".join(lines)


def prepare(cfg: TrainConfig) -> tuple[PreparedData, Placement, str]:
    """Steps 1-2 that need the world: backend and devices, model, data, run folder. Raises ConfigError."""
    try:
        placement = choose(cfg.backend, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size)))
        cfg.model = resolve_model(cfg.model, say)
        data = prepare_data(cfg.dataset, cfg.model, cfg.seed, cfg.max_seq_len, say)
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    if cfg.eval_examples:
        data.eval = Encoded(data.eval.input_ids[:cfg.eval_examples], data.eval.labels[:cfg.eval_examples])
    need = cfg.batch_size * cfg.effective_world_size()
    if len(data.train) < need:
        raise ConfigError(f"the training split has {len(data.train)} examples, fewer than one global batch "
                          f"of {need}; lower --batch-size or use more data")
    return data, placement, os.path.join(cfg.trace_dir, run_name(cfg, data.source))


def run_name(cfg: TrainConfig, source: str) -> str:
    """--run-name, or ``<model>-<data>-<date-time>``."""
    return cfg.run_name or (f"{os.path.basename(cfg.model.rstrip('/'))}-{os.path.basename(source.rstrip('/'))}"
                            f"-{time.strftime('%Y%m%d-%H%M%S')}")


def check_combination(cfg: TrainConfig) -> None:
    """Contradictions between options that argparse cannot see."""
    if cfg.analyze and not profiling(cfg):
        raise ConfigError("--analyze reads the traces, but --no-profile (or --profile-steps 0) writes none; "
                          "drop one of them")
    if "powersgd" in cfg.hook:
        from minddp.comm.powerSGD_hook import check_start_iter
        try:
            check_start_iter(cfg.powersgd_start_iter, cfg.powersgd_error_feedback, cfg.powersgd_warm_start)
        except ValueError as exc:
            raise ConfigError(f"--powersgd-start-iter: {exc}") from None
    sharded = [s for s in cfg.stages() if s in ("zero2", "fsdp")]
    if sharded:
        from minddp.sharding.hooks import check_name
        try:
            check_name(cfg.hook)
        except ValueError as exc:
            raise ConfigError(f"--stage {sharded[0]}: {exc}") from None
    if in_torchrun() and "--world-size" in sys.argv[1:]:
        say("under torchrun the world size comes from torchrun; --world-size is ignored")


def model_shapes(cfg: TrainConfig, data: PreparedData) -> dict[str, tuple[tuple[int, ...], torch.dtype, bool]]:
    """Name -> (shape, dtype, trainable) of every entry of the model this run builds, without its weights.

    Built on the meta device (no memory, no weights read): what the resume
    check compares a checkpoint with, and what the output estimates count.
    """
    from minddp.compat import meta_device
    from minddp.models import DTYPES, OFFLINE_PRESETS
    with meta_device():
        if cfg.model in OFFLINE_PRESETS:
            model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype)
        else:
            from transformers import AutoConfig, AutoModelForSequenceClassification
            config = AutoConfig.from_pretrained(os.path.expanduser(cfg.model), num_labels=2)
            model = AutoModelForSequenceClassification.from_config(config).to(DTYPES[cfg.dtype])
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {name: (tuple(t.shape), t.dtype, name in trainable) for name, t in model.state_dict().items()}


def check_resume(cfg: TrainConfig, shapes: dict) -> None:
    """Before any rank starts: the whole --resume file is read and checked against this run and its model."""
    from minddp import checkpoint
    stage = cfg.stages()[0]
    replicas = 1 if stage == "single" else cfg.effective_world_size()
    try:
        ckpt = checkpoint.read_checkpoint(cfg.resume)
        checkpoint.check_run(ckpt, cfg.resume, checkpoint_config(cfg, stage, replicas))
        checkpoint.check_shapes(ckpt, cfg.resume, {k: v[:2] for k, v in shapes.items()})
        checkpoint.check_contents(ckpt, cfg.resume, params=sum(1 for v in shapes.values() if v[2]))
    except checkpoint.CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    if ckpt["step"] >= cfg.steps:
        raise ConfigError(f"checkpoint {cfg.resume!r} is at step {ckpt['step']} already; give --steps above "
                          f"{ckpt['step']} to train on")


def check_outputs(cfg: TrainConfig, run_dir: str | None = None, shapes: dict | None = None,
                  gpu: bool = False) -> None:
    """Before any rank starts: every output path is writable and (given the model) its disk has room.

    Called twice: first with the paths alone (fails fast, before the data and
    model are prepared), then with the run folder and the model's shapes for
    the space estimate (:mod:`minddp.outputs`).
    """
    from minddp import outputs
    plan = outputs.Outputs()
    stages = cfg.stages()
    rank0 = not in_torchrun() or os.environ.get("RANK") == "0"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size)) if in_torchrun() else cfg.world_size
    tensors = sum(1 for v in (shapes or {}).values() if v[2])
    param_bytes = sum(math.prod(v[0]) * v[1].itemsize for v in (shapes or {}).values() if v[2])
    if profiling(cfg):
        kept = peak = 0
        for stage in stages:
            ranks = 1 if stage == "single" else local
            one, writing = outputs.trace_bytes(tensors, min(cfg.profile_steps, cfg.steps), cfg.grad_accum,
                                               cfg.trace_gzip, gpu=gpu)
            peak = max(peak, kept + ranks * writing)
            kept += ranks * one
        plan.folder("--trace-dir", run_dir or cfg.trace_dir, need=max(peak, kept) + 64 * 1024 * len(stages))
    if cfg.save_every and rank0:
        size = outputs.checkpoint_bytes(param_bytes, cfg.effective_world_size(), "powersgd" in cfg.hook)
        replaced = sum(os.path.getsize(p) for p in (checkpoint_path(cfg, s) for s in stages) if os.path.isfile(p))
        plan.folder("--checkpoint-dir", cfg.checkpoint_dir, need=max(0, size * (len(stages) + 1) - replaced))
    if cfg.summary_json and rank0:
        plan.file("--summary-json", cfg.summary_json, need=64 * 1024 + 32 * cfg.steps * len(stages))
    if shapes is not None:
        plan.check_room()


def warn_if_oversubscribed(cfg: TrainConfig) -> None:
    """Say so when this machine's ranks outnumber its CPU cores (they then take turns on them)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size)) if in_torchrun() else cfg.world_size
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if local > cores:
        say(f"warning: {local} ranks on {cores} CPU cores: the ranks take turns on the cores and every "
            "collective waits for the rank that is not running, so steps will be slow and timings will not "
            f"mean much; --world-size {cores} or fewer avoids it")


def write_outputs(cfg: TrainConfig, summary: dict, run_dir: str, lost: list[str]) -> None:
    """Step 4's files, each on its own: one that cannot be written is named in ``lost``, the others still are."""
    targets = []
    if profiling(cfg) and summary["stages"]:
        targets.append((os.path.join(run_dir, "summary.json"), "the run's summary.json"))
    if cfg.summary_json:
        targets.append((cfg.summary_json, "--summary-json"))
    for path, what in targets:
        _write_or_note(path, summary, what, lost)


def _write_or_note(path: str, payload: dict, what: str, lost: list[str]) -> None:
    try:
        write_json(path, payload)
    except OSError as exc:
        lost.append(f"{what} {path!r} was not written ({exc.strerror or exc})")


def main(argv: list[str] | None = None) -> int:
    """The CLI: 0 on success, 2 on bad input (usage and one line on stderr), 1 when a rank failed or an
    output could not be written (the results are printed and the other outputs written first), 130 on Ctrl-C,
    143 on SIGTERM, 129 on SIGHUP (the terminal closed): one line, the ranks ended, the finished stages kept.
    """
    from minddp.processes import stop_signals
    with stop_signals():            # SIGTERM and SIGHUP unwind like Ctrl-C (minddp.processes)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    from minddp.launch import watch_torchrun_agent
    from minddp.processes import Stopped, say_safely, stop_reason
    watch_torchrun_agent()          # a worker whose torchrun agent is gone ends, from the start
    parser = build_parser()
    try:
        cfg = parse_args(argv)                                                              # step 1
        check_combination(cfg)
        check_outputs(cfg)          # the paths, before the slower data and model preparation
        data, placement, run_dir = prepare(cfg)                                             # step 2
        shapes = model_shapes(cfg, data)
        if cfg.resume:
            check_resume(cfg, shapes)
        check_outputs(cfg, run_dir, shapes, gpu=placement.device_type == "cuda")
        warn_if_oversubscribed(cfg)
    except (ConfigError, DataError) as exc:
        return fail(PROG, exc, parser)
    except (KeyboardInterrupt, Stopped) as exc:
        say_safely(f"{PROG}: {stop_reason(exc)} before training; nothing was started")
        return exc.code if isinstance(exc, Stopped) else 130
    rank0 = os.environ.get("RANK", "0") == "0" or not in_torchrun()
    rows, skipped, results, lost = {}, {}, {}, []
    failed = stopped = None
    bar_drawn(cfg.progress)
    try:
        for stage in cfg.stages():                                                          # step 3
            if stage == "torch":
                reason = None if cfg.link else torch_hook_unavailable(   # with a link: minddp's hook (ladder.wrap)
                    cfg.hook, placement.backend, None if cfg.bucket_cap_mb == "auto" else cfg.bucket_cap_mb,
                    placement.device_type)
                if reason:
                    say(f"skipping --stage torch: {reason}")
                    skipped[stage] = reason
                    continue
            try:
                result = run_stage(cfg, stage, data, run_dir, placement)
            except RankError as exc:
                print(f"{fresh_line()}{PROG}: stage {stage}: {exc}", file=sys.stderr, flush=True)
                failed = {"stage": stage, "rank": exc.rank, "step": exc.step, "error": str(exc).splitlines()[0]}
                break
            run_dir = result["folder"]  # under torchrun: rank 0's choice
            results[stage], rows[stage] = result, summarize(result)
            if profiling(cfg) and rank0:
                _write_or_note(os.path.join(run_dir, stage, "config.json"),
                               {**cfg.to_dict(), "stage": stage, "backend": placement.backend,
                                "devices": placement.why, "ranks": result["ranks"],
                                "bucket_cap_mb_used": result["bucket_cap_mb"], "bucket_cap_why": result["bucket_cap_why"],
                                "data_source": data.source}, f"stage {stage}'s config.json", lost)
    except (KeyboardInterrupt, Stopped) as exc:   # the launcher ended the ranks and said so; the stages done are kept
        failed = {"stage": "interrupted", "error": stop_reason(exc)}
        stopped = exc.code if isinstance(exc, Stopped) else 130
    finally:
        bar_drawn(False)
    if not rank0:                   # a torchrun worker that was stopped exits with the signal's status
        return 0 if stopped is None else stopped
    for stage, result in results.items():
        for rank, why in result.get("trace_errors", {}).items():
            lost.append(f"stage {stage}: rank {rank}'s trace was not written ({why}); training went on")
    summary = {"config": cfg.to_dict(), "backend": placement.backend, "devices": placement.why, "world_size": cfg.effective_world_size(),
               "data_source": data.source, "run_dir": run_dir if profiling(cfg) else None, "skipped": skipped,
               "stages": {s: {**rows[s], "losses": results[s]["losses"], "memory": results[s].get("memory")}
                          for s in rows},
               "failed": failed, "not_written": lost}
    show = print if stopped is None else _show_if_possible   # after SIGHUP the terminal may be gone
    if rows:                                                                                # step 4
        show(format_table(rows), flush=True)
        measured = {stage: results[stage]["memory"] for stage in rows if results[stage].get("memory")}
        if measured:
            from minddp.sharding.memory import format_summary
            show(format_summary(measured, cfg.effective_world_size()), flush=True)
    write_outputs(cfg, summary, run_dir, lost)
    if profiling(cfg) and rows and not all(r["trace"] is None for r in results.values()):
        show(f"traces: {run_dir}/<stage>/rank<r>.pt.trace.json{'.gz' if cfg.trace_gzip else ''}")
    for line in lost:
        if stopped is None:
            say(line)
        else:
            say_safely(f"{PROG}: {line}")
    if stopped is not None:
        return stopped
    if failed is not None:
        return 1
    if cfg.analyze and rows:
        if any("trace" in line for line in lost):
            say("--analyze skipped: some traces were not written")
            return 1
        try:
            from minddp.analyze import main as analyze_main
        except ImportError:
            say("--analyze: minddp.analyze is not available in this installation")
            return 1
        return analyze_main([run_dir]) or (1 if lost else 0)
    return 1 if lost else 0


def _show_if_possible(text: str, flush: bool = False) -> None:
    """print(), for a run that was stopped: a terminal that closed (EIO) is no reason for a traceback."""
    try:
        print(text, flush=flush)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
