"""``python -m minddp.train``: fine-tune a sequence classifier with one DDP stage, or all of them.

What one run does:

1. **validate** every option in this process, before any rank starts
   (a usage line and one error line, exit code 2): each value finite and in
   range, the outputs writable with room for what the run will write
   (:mod:`minddp.train.outputs`), a ``--resume`` file read whole and checked against
   the model this run builds;
2. **prepare** the model name (the offline default if a hub model cannot be
   had) and the data (tokenized once, here, then handed to every rank);
3. for each stage: **launch** the ranks (``single`` is one process on the
   global batch; under ``torchrun`` this process is one rank of the job);
   each rank builds the same seeded model, wraps it in the stage, and trains
   on its shard of every global batch with :func:`minddp.ladder.loop.train_step`,
   under the profiler for the first steps (``local-sgd`` and ``diloco`` train the model
   unwrapped and sync in the optimizer's post-hook: :func:`minddp.ladder.slow_link`); it
   measures the held-out loss and accuracy every ``--eval-every`` steps and at the end;
4. **report**: a summary table on rank 0, ``summary.json`` and each stage's
   ``config.json`` and ``metrics.jsonl`` (every step's loss, the held-out measurements:
   :mod:`minddp.train.metrics`) beside the traces, and optionally ``python -m minddp.analyze``.
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
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from minddp.collectives import TRANSPORTS
from minddp.comm.link import Link
from minddp.comm.powerSGD_hook import check_start_iter
from minddp.comm.registry import torch_hook
from minddp.comm.wire import Traffic, Wire
from minddp.costmodel.auto import choose_bucket_cap
from minddp.ddp import DistributedDataParallel
from minddp.diloco import DiLoCo, LocalSGD
from minddp.ladder import SHARDED_GRADIENTS, SHARDED_OPTIMIZER, SLOW_LINKS, make_optimizer, slow_link, wrap
from minddp.ladder.loop import train_step
from minddp.runtime.cli import bar_drawn, fail, fresh_line
from minddp.runtime.compat import meta_device
from minddp.runtime.device import DEFAULT_TIMEOUT_S, Placement, choose, current_device, synchronize
from minddp.runtime.hang import DEFAULT_HANG_S
from minddp.runtime.launch import RankError, in_torchrun, launch, report_step, watch_torchrun_agent
from minddp.runtime.nested import map_tensors
from minddp.runtime.processes import Stopped, say_safely, stop_reason, stop_signals
from minddp.runtime.profiling import StepProfiler, write_json
from minddp.sharding.hooks import check_name
from minddp.sharding.memory import Probe, format_summary
from minddp.train import checkpoint, outputs, sharded_checkpoint
from minddp.train.config import (
    SLOW_LINK_OPTIONS,
    ConfigError,
    TrainConfig,
    build_parser,
    compile_unavailable,
    parse_args,
)
from minddp.train.data import DataError, Encoded, PreparedData, held_out, prepare_data, step_batches
from minddp.train.metrics import FILENAME as METRICS_FILE
from minddp.train.metrics import write_metrics
from minddp.train.models import DTYPES, OFFLINE_PRESETS, build_model, resolve_model

PROG = "minddp.train"

#: What the ranks import besides this module (:func:`minddp.runtime.launch.rank_imports`): the offline presets'
#: model class, which takes seconds to import; the process server imports it once for every stage's ranks.
RANK_IMPORTS = ("transformers.models.llama.modeling_llama",)


def say(message: str) -> None:
    """One line to stderr, on a line of its own (after a progress bar), on rank 0 only under torchrun."""
    if os.environ.get("RANK", "0") == "0" or not in_torchrun():
        print(f"{fresh_line()}{PROG}: {message}", file=sys.stderr, flush=True)


# -- inside a rank --------------------------------------------------------------------------------


def torch_hook_unavailable(
    hook: str, backend: str, bucket_cap_mb: float | None = None, device_type: str = "cpu"
) -> str | None:
    """Why torch's DDP cannot run ``hook`` here (one line), or None if it can.

    Each reason is a failure of torch 2.13 seen on this backend, not a guess:
    its bf16 hooks refuse gloo; its batched PowerSGD hook hands a 2-D matrix to
    a 3-D-only orthogonalization (a bare AssertionError); its PowerSGD hook
    issues the second all_reduce from a future callback, so with several
    buckets in flight on gloo the ranks pair different collectives and gloo
    aborts the process ("op.preamble.length <= op.nbytes").
    """
    try:
        torch_hook(hook)
    except ValueError as exc:
        return str(exc)
    base = hook.rpartition("+")[2]
    if "bf16" in hook and backend != "nccl":
        return f"torch's bf16 hooks need NCCL, this run uses {backend}"
    if "powersgd" in base and device_type == "cpu" and torch.cuda.is_available():
        return (
            "torch's PowerSGD hooks call torch.cuda.synchronize on the CPU tensors' device when CUDA is "
            "available, which fails; run on the GPUs (--backend auto) to compare with them"
        )
    if base == "batched-powersgd":
        return "torch's batched_powerSGD_hook fails in torch 2.13 (2-D input to a 3-D orthogonalization)"
    if base == "powersgd" and backend == "gloo" and (bucket_cap_mb or 0) < 25:
        return (
            "torch's powerSGD_hook mis-pairs collectives on gloo when several buckets are in flight "
            "(gloo aborts); add --bucket-cap-mb 25 (one bucket on the offline model) to compare with it"
        )
    return None


def _loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def checkpoint_config(cfg: TrainConfig, stage: str, replicas: int) -> dict:
    """The settings a checkpoint records (and a resume must match): this stage, its number of ranks; of the slow-link
    options those this stage takes (a local-sgd run saved beside a streamed diloco resumes without --fragments)."""
    unused = {name: None for name, (_, takers) in SLOW_LINK_OPTIONS.items() if stage not in takers}
    return {**cfg.to_dict(), "stage": stage, "world_size": replicas, **unused}


def checkpoint_path(cfg: TrainConfig, stage: str) -> str:
    """``<dir>/<stage>.pt``; a folder ``<dir>/<stage>`` for the sharded stages (every rank writes its part)."""
    return os.path.join(cfg.checkpoint_dir, stage if stage in SHARDED_OPTIMIZER + SHARDED_GRADIENTS else f"{stage}.pt")


class Checkpoints:
    """A stage's checkpoints, whole or sharded: one object to resume from and to save to.

    The replicated stages write one file that every rank can load (rank 0 writes it); the sharded
    ones (zero1, zero2, fsdp) write a folder in which each rank saves its part
    (:mod:`minddp.train.sharded_checkpoint`). Each rank's part also keeps its comm hook's state
    (PowerSGD's memory) and, for ``ddp`` and ``zero1``, the bucket plan that memory was made for,
    which the resumed wrapper starts from (docs/ddp.md, *Checkpoints*). The slow-link stages
    (``local-sgd``, ``diloco``) write the one file too, and each rank's part holds that replica's own
    weights, inner optimizer and rung state (the synced weights, the outer optimizer's state, a
    fragment in flight): between syncs every replica's are its own (docs/diloco.md, *Checkpoints*).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        stage: str,
        replicas: int,
        wrapped: nn.Module,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        rung: LocalSGD | DiLoCo | None = None,
    ):
        self.sharded = stage in SHARDED_OPTIMIZER + SHARDED_GRADIENTS
        self.rung = rung
        self.path, self.every = checkpoint_path(cfg, stage), cfg.save_every
        self.config = checkpoint_config(cfg, stage, replicas)
        self.wrapped, self.model, self.optimizer = wrapped, model, optimizer
        self.hook_state = getattr(wrapped, "minddp_hook_state", None)  # PowerSGD's memory, say
        self.device = next(model.parameters()).device

    def resume(self, path: str) -> tuple[int, list[float]]:
        """Load ``path`` into the model, optimizer, hook state and RNGs: the step to go on from, the losses so far."""
        if self.sharded:
            first, mine = sharded_checkpoint.load(path, self.wrapped, self.model, self.optimizer)
            checkpoint.restore_hook_state(self.hook_state, mine.get("hook_state"), self.device)
            checkpoint.set_rng_state(mine["rng"])
        else:  # every rank loads the same weights, so the replicas stay identical
            ckpt = checkpoint.load_checkpoint(path, model=self.model, config=self.config, rank=dist.get_rank())
            checkpoint.restore(ckpt, optimizer=self.optimizer, hook_state=self.hook_state)
            first, mine = ckpt["step"], ckpt["rank"]
        if self.rung is not None:  # this replica's own weights, inner optimizer, synced weights and outer state
            self._load_replica(path, mine.get("replica"))
        if isinstance(self.wrapped, DistributedDataParallel):
            self._load_bucket_plan(path, mine.get("bucket_plan"))
        return first, list(mine["losses"])

    def _load_bucket_plan(self, path: str, plan: list[list[int]] | None) -> None:
        """``ddp``/``zero1``: start from the saved plan, so the saved per-bucket hook memory fits its buckets."""
        if plan is None:
            if checkpoint.hook_state_data(self.hook_state) is not None:  # a file of a minddp that saved no plan
                raise checkpoint.CheckpointError(
                    f"checkpoint {path!r} holds no bucket plan, so its per-bucket comm hook memory would not "
                    "fit this wrapper's buckets; start afresh, or resume with the minddp that wrote it"
                )
            return  # a stateless hook: the first plan and its rebuild, as a fresh wrapper
        try:
            self.wrapped.bucket_plan = plan
        except ValueError as exc:
            raise checkpoint.CheckpointError(f"checkpoint {path!r}: {exc}") from None

    def _load_replica(self, path: str, replica: dict | None) -> None:
        if replica is None:
            raise checkpoint.CheckpointError(
                f"checkpoint {path!r} holds no replica state (it was not saved by --stage local-sgd or diloco); "
                "resume it with the stage it was saved by"
            )
        self.model.load_state_dict(replica["model"])
        self.optimizer.load_state_dict(replica["inner"])
        try:
            self.rung.load_state_dict(map_tensors(lambda t: t.to(self.device), replica["rung"]))
        except ValueError as exc:
            raise checkpoint.CheckpointError(f"checkpoint {path!r}: {exc}") from None

    def _extra(self, losses: list[float]) -> dict:
        """This rank's values besides model and optimizer (collective for ``ddp``/``zero1``: every rank calls)."""
        extra = {"losses": losses}
        if self.rung is not None:  # each replica's own: between syncs its weights and inner state are its alone
            extra["replica"] = {
                "model": self.model.state_dict(),
                "inner": self.optimizer.state_dict(),
                "rung": self.rung.state_dict(),
            }
        if isinstance(self.wrapped, DistributedDataParallel):
            extra["bucket_plan"] = self.wrapped.reducer.settled_plan()
        if self.sharded:  # the whole file keeps the hook state beside the RNG already (checkpoint._rank_state)
            extra["hook_state"] = checkpoint.hook_state_data(self.hook_state)
        return extra

    def after_step(self, done: int, losses: list[float]) -> None:
        """Save after every ``--save-every``-th step (``done`` steps are complete)."""
        if not self.every or done % self.every:
            return
        if self.sharded:
            sharded_checkpoint.save(
                self.path,
                self.wrapped,
                self.model,
                self.optimizer,
                step=done,
                config=self.config,
                extra=self._extra(losses),
            )
        else:
            checkpoint.save_checkpoint(
                self.path,
                model=self.model,
                optimizer=self.optimizer,
                step=done,
                config=self.config,
                hook_state=self.hook_state,
                extra=self._extra(losses),
            )


@dataclass
class RankRun:
    """What one rank trains for one stage: built once (:func:`build`), then stepped (:func:`train_steps`)."""

    stage: str
    replicas: int  # ranks that split the global batch (1 for ``single``)
    shard: int  # this rank's share of it
    batch_size: int  # per rank, per micro-batch
    device: torch.device
    model: nn.Module
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    traffic: Traffic  # what this rank's hooks send, counted per step
    link: Link | None  # this rank's emulated NIC
    bucket_cap_mb: float | None
    bucket_cap_why: str | None
    checkpoints: Checkpoints
    rung: LocalSGD | DiLoCo | None = None  # --stage local-sgd / diloco: what syncs, in the optimizer's post-hook


def build(cfg: TrainConfig, stage: str, data: PreparedData) -> RankRun:
    """Step 1: the model on this rank's device, wrapped in ``stage``, its optimizer, the wire and the link."""
    rank, world = dist.get_rank(), dist.get_world_size()
    single = stage == "single"
    # `single` is one process on the global batch; under torchrun every rank computes it (same result).
    replicas, shard = (1, 0) if single else (world, rank)
    batch_size = cfg.batch_size * (cfg.effective_world_size() if single else 1)
    device = current_device()
    traffic = Traffic()
    link = None if single or cfg.link is None else Link(cfg.link)
    model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed, cfg.dtype).to(device)
    model.train()
    slow = stage in SLOW_LINKS  # no buckets: the whole model (or a fragment) travels every --sync-every steps
    bucket_cap_mb, why = (None if slow or (single and cfg.bucket_cap_mb == "auto") else cfg.bucket_cap_mb), None
    if bucket_cap_mb == "auto":
        probe_batches = step_batches(
            data.train, batch_size, cfg.grad_accum, replicas, shard, cfg.seed, data.pad_token_id
        )
        bucket_cap_mb, why = choose_bucket_cap(
            model, stage, probe_batches, _loss, link, device, say=say if rank == 0 else None
        )
    wire = None if single else Wire(None, TRANSPORTS[cfg.collective], traffic, link)
    # --compile: as nanoGPT, the model compiled, then wrapped; the model itself is what is saved and evaluated
    compiled = torch.compile(model, backend=cfg.compile_backend) if cfg.compile else model
    rung = None
    if slow:  # each replica trains alone, unwrapped; the rung syncs in its optimizer's post-hook
        wrapped = compiled
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, lr=cfg.lr)
        rung = slow_link(
            stage,
            model,
            optimizer,
            cfg.sync_every,
            outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum,
            fragments=cfg.fragments,
            fragment_delay=cfg.fragment_delay,
            fragment_alpha=cfg.fragment_alpha,
            hook=cfg.hook,
            wire=wire,
        )
    else:
        wrapped = wrap(
            stage,
            compiled,
            hook=cfg.hook,
            bucket_cap_mb=bucket_cap_mb,
            powersgd_options=cfg.powersgd_options(),
            wire=wire,
        )
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, hook=cfg.hook, wire=wire, lr=cfg.lr)
    checkpoints = Checkpoints(cfg, stage, replicas, wrapped, model, optimizer, rung)
    return RankRun(
        stage,
        replicas,
        shard,
        batch_size,
        device,
        model,
        wrapped,
        optimizer,
        traffic,
        link,
        bucket_cap_mb,
        why,
        checkpoints,
        rung,
    )


def train_steps(
    cfg: TrainConfig, run: RankRun, data: PreparedData, stage_dir: str, first: int, losses: list[float]
) -> dict:
    """Step 3: steps ``first`` .. ``cfg.steps - 1`` under the profiler; each step's time, calls, bytes, loss."""
    single, rank = run.stage == "single", dist.get_rank()
    batches = step_batches(
        data.train,
        run.batch_size,
        cfg.grad_accum,
        run.replicas,
        run.shard,
        cfg.seed,
        data.pad_token_id,
        start_step=first,
    )
    global_batch = run.batch_size * cfg.grad_accum * run.replicas
    times, calls, nbytes, by_op, probe = [], [], [], [], None  # the probe measures memory on the last step
    syncs, evals = [], []  # the slow-link rung's outer syncs so far, after each step; held-out measurements
    profiler = StepProfiler(
        stage_dir,
        rank,
        cfg.steps - first,
        cfg.profile_steps,
        gzip=cfg.trace_gzip,
        enabled=profiling(cfg) and (rank == 0 or not single),
        cuda=run.device.type == "cuda",
    )
    bar = _progress(cfg, run.stage, rank, first)
    with profiler:
        for step in range(first, cfg.steps):
            report_step(step)  # a failure report then says where it happened
            micro = [{k: v.to(run.device) for k, v in b.items()} for b in next(batches)]
            run.traffic.reset()
            # (not the slow-link rungs: their synced weights and outer state are not among what the probe sees)
            last = step == cfg.steps - 1 and not single and run.rung is None
            probe = Probe(run.wrapped, run.model, run.optimizer) if last else None
            synchronize(run.device)
            start = time.perf_counter()
            with torch.profiler.record_function(f"minddp.train_step#{step}"):
                loss = train_step(run.wrapped, run.optimizer, micro, _loss)
            synchronize(run.device)
            times.append(time.perf_counter() - start)
            calls.append(run.traffic.calls)
            nbytes.append(run.traffic.bytes)
            by_op.append({op: n for op, (n, _) in run.traffic.by_op.items()})  # calls by kind
            losses.append(loss)
            syncs.append(None if run.rung is None else run.rung.syncs)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:  # the last: train_rank
                evals.append({"step": step + 1, **measure(run, data)})
            profiler.step()
            run.checkpoints.after_step(step + 1, losses)
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{global_batch / times[-1]:.0f}", refresh=False)
                bar.update()
    if bar is not None:
        bar.close()
    if run.rung is not None:
        run.rung.close()  # a fragment still in flight is waited for: no collective left behind
    if run.link is not None:
        if profiler.written:
            run.link.annotate_trace(profiler.written)  # the link's transfers, as ranges on a thread of their own
        run.link.close()
    return {
        "step_times_s": times,
        "all_reduce_calls": calls,
        "all_reduce_bytes": nbytes,
        "calls_by_op": by_op,
        "losses": losses,
        "first_step": first,
        "outer_syncs": syncs if run.rung is not None else None,
        "evals": evals,
        "global_batch": global_batch,
        "trace": profiler.written,
        "trace_error": profiler.error,
        "memory": probe.result() if probe is not None else None,
    }


def train_rank(cfg: TrainConfig, stage: str, data: PreparedData, folder: str) -> dict:
    """One rank of one stage: build, resume, train ``cfg.steps`` steps under the profiler, evaluate.

    1. build the model, the stage's wrapper and optimizer (:func:`build`);
    2. with ``--resume``, take the model, optimizer, hook state, RNGs, losses and data position from the
       checkpoint and go on from its step (with ``--save-every N``, a checkpoint follows every N-th step);
    3. train (:func:`train_steps`);
    4. evaluate, and average the losses over the ranks.
    """
    world = dist.get_world_size()
    if in_torchrun() and world > 1:  # one folder for the whole job: rank 0's clock names it
        box = [folder]
        dist.broadcast_object_list(box, src=0)
        folder = box[0]
    run = build(cfg, stage, data)  # step 1
    first, losses = run.checkpoints.resume(cfg.resume) if cfg.resume else (0, [])  # step 2
    out = train_steps(cfg, run, data, os.path.join(folder, stage), first, losses)  # step 3
    mean_losses = torch.tensor(out["losses"], dtype=torch.float64, device=run.device)  # step 4
    if run.replicas > 1:  # each rank's loss is its shard's mean; the global batch's is their mean
        dist.all_reduce(mean_losses)
        mean_losses /= run.replicas
    final = measure(run, data)
    out["evals"].append({"step": cfg.steps, **final})
    error = out.pop("trace_error")
    trace_errors = [error]
    if world > 1 and profiling(cfg):  # every rank's export failure reaches rank 0's report
        trace_errors = [None] * world
        dist.all_gather_object(trace_errors, error)
    return {
        **out,
        "stage": stage,
        "losses": mean_losses.tolist(),
        "accuracy": final["accuracy"],
        "ranks": run.replicas,
        "metered": stage != "torch" or run.link is not None,
        "folder": folder,
        "bucket_cap_mb": run.bucket_cap_mb,
        "bucket_cap_why": run.bucket_cap_why,
        "trace_errors": {r: e for r, e in enumerate(trace_errors) if e},
    }


def measure(run: RankRun, data: PreparedData) -> dict:
    """The held-out loss and accuracy of the weights each rank holds now (each scores its share of the split).

    The slow-link rungs' replicas hold the same weights right after a whole-model sync (``diloco`` with one
    fragment and no delay, ``local-sgd``); between syncs, or with fragments synced one after another, each
    scores with its own.
    """
    with torch.profiler.record_function("minddp.held_out"):
        return held_out(run.model, data.eval, run.replicas, run.shard, run.device, data.pad_token_id)


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
    if stage == "ft":  # its own launcher: trains through a lost rank (minddp.ft)
        from minddp.train.ft import run_ft_stage

        return run_ft_stage(cfg, data, folder, say)
    world = 1 if stage == "single" else cfg.world_size
    # Ranks announce every step; a job with no new step for twice the collective timeout (plus a
    # minute for evaluation and saving) is hung somewhere the collective timeout cannot see. A rank
    # that stops while the others wait is named far sooner, after --hang-timeout (minddp.runtime.hang).
    timeout = DEFAULT_TIMEOUT_S if cfg.timeout is None else cfg.timeout
    hang_s = DEFAULT_HANG_S if cfg.hang_timeout is None else cfg.hang_timeout
    results = launch(
        train_rank,
        cfg,
        stage,
        data,
        folder,
        world_size=world,
        backend=placement,
        timeout_s=cfg.timeout,
        stall_s=2 * timeout + 60,
        hang_s=hang_s or None,
    )
    return results[0]


def summarize(result: dict) -> dict:
    """Numbers for the table: final loss, accuracy, median step time, throughput, traffic per step.

    ``all_reduce_*_per_step`` count every collective the hooks sent (its old name), per optimizer step;
    ``calls_per_step_by_op`` splits the calls by kind (``all_reduce``, ``reduce_scatter``, ``all_gather``);
    ``outer_syncs``: the syncs a slow-link rung took (fragment syncs for ``diloco``; ``None`` for the other stages);
    ``held_out_loss``: the held-out mean cross-entropy at the end.
    """
    losses, times = result["losses"], result["step_times_s"]
    tail = losses[-min(10, len(losses)) :]
    steady = times[1:] or times  # the first step pays one-off costs
    median = statistics.median(steady)
    metered = result["metered"]
    steps = result.get("calls_by_op") or []
    kinds = sorted({op for step in steps for op in step})
    return {
        "final_loss": sum(tail) / len(tail),
        "accuracy": result["accuracy"],
        "median_step_s": median,
        "samples_per_s": result["global_batch"] / median,
        "all_reduce_calls_per_step": statistics.mean(result["all_reduce_calls"]) if metered else None,
        "all_reduce_bytes_per_step": statistics.mean(result["all_reduce_bytes"]) if metered else None,
        "calls_per_step_by_op": {op: statistics.mean(s.get(op, 0) for s in steps) for op in kinds} if metered else None,
        "outer_syncs": (result.get("outer_syncs") or [None])[-1],
        "held_out_loss": result["evals"][-1]["loss"] if result.get("evals") else None,
        "trace": result["trace"],
    }


def format_table(rows: dict[str, dict]) -> str:
    """The summary table (at most 120 columns): the step is the median of **all** steps, unprofiled ones included;
    collectives are counted per step by kind, through minddp's hook layer."""
    head = (
        f"{'stage':<13}{'loss*':>8}{'acc (%)':>9}{'step (ms)':>11}{'samples/s':>11}"
        f"{'all_reduce':>12}{'red-scat*':>11}{'all_gather':>12}{'MiB/step':>10}{'syncs':>7}"
    )
    lines = [head, "-" * len(head)]
    for stage, s in rows.items():
        by_op = s.get("calls_per_step_by_op")
        counts = [
            "-" if by_op is None else f"{by_op.get(op, 0.0):.1f}"
            for op in ("all_reduce", "reduce_scatter", "all_gather")
        ]
        mib = "-" if s["all_reduce_bytes_per_step"] is None else f"{s['all_reduce_bytes_per_step'] / 2**20:.3f}"
        syncs = "-" if s.get("outer_syncs") is None else str(s["outer_syncs"])
        lines.append(
            f"{stage:<13}{s['final_loss']:>8.4f}{s['accuracy'] * 100:>9.1f}{s['median_step_s'] * 1e3:>11.1f}"
            f"{s['samples_per_s']:>11.0f}{counts[0]:>12}{counts[1]:>11}{counts[2]:>12}{mib:>10}{syncs:>7}"
        )
    lines += [
        "loss* = mean of the last 10 steps; acc = held-out accuracy; step = median over all steps "
        "(analyze: profiled ones)",
        "calls per step by kind and MiB per step (all kinds), through minddp's hook layer "
        "('-': torch's DDP, not metered)",
        "* reduce-scatter: on gloo it runs as an all_reduce of the whole bucket",
    ]
    if any(s.get("outer_syncs") is not None for s in rows.values()):
        lines.append("syncs = the outer syncs of local-sgd and diloco (diloco: one per fragment sent and applied)")
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
        data.eval = Encoded(data.eval.input_ids[: cfg.eval_examples], data.eval.labels[: cfg.eval_examples])
    need = cfg.batch_size * cfg.effective_world_size()
    if len(data.train) < need:
        raise ConfigError(
            f"the training split has {len(data.train)} examples, fewer than one global batch "
            f"of {need}; lower --batch-size or use more data"
        )
    return data, placement, os.path.join(cfg.trace_dir, run_name(cfg, data.source))


def run_name(cfg: TrainConfig, source: str) -> str:
    """--run-name, or ``<model>-<data>-<date-time>``."""
    return cfg.run_name or (
        f"{os.path.basename(cfg.model.rstrip('/'))}-{os.path.basename(source.rstrip('/'))}"
        f"-{time.strftime('%Y%m%d-%H%M%S')}"
    )


def skip_reason(cfg: TrainConfig, stage: str, placement: Placement) -> str | None:
    """Why this run skips ``stage`` (one line), or None: a hook torch's DDP cannot run here; with ``--compile``,
    a stage that does not compile, in ``--stage all`` or ``sharded`` (named, it is refused earlier: config.validate)."""
    if stage == "torch" and not cfg.link:  # with a link: minddp's hook (ladder.wrap)
        cap = None if cfg.bucket_cap_mb == "auto" else cfg.bucket_cap_mb
        reason = torch_hook_unavailable(cfg.hook, placement.backend, cap, placement.device_type)
        if reason:
            return reason
    return compile_unavailable(stage, cfg.bucket_cap_mb) if cfg.compile else None


def check_combination(cfg: TrainConfig) -> None:
    """Contradictions between options that argparse cannot see."""
    if cfg.analyze and not profiling(cfg):
        raise ConfigError(
            "--analyze reads the traces, but --no-profile (or --profile-steps 0) writes none; drop one of them"
        )
    if "powersgd" in cfg.hook:
        try:
            check_start_iter(cfg.powersgd_start_iter, cfg.powersgd_error_feedback, cfg.powersgd_warm_start)
        except ValueError as exc:
            raise ConfigError(f"--powersgd-start-iter: {exc}") from None
    sharded = [s for s in cfg.stages() if s in ("zero2", "fsdp")]
    if sharded:
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
        raise ConfigError(
            f"checkpoint {cfg.resume!r} is at step {ckpt['step']} already; give --steps above "
            f"{ckpt['step']} to train on"
        )


def check_outputs(cfg: TrainConfig, run_dir: str | None = None, shapes: dict | None = None, gpu: bool = False) -> None:
    """Before any rank starts: every output path is writable and (given the model) its disk has room.

    Called twice: first with the paths alone (fails fast, before the data and
    model are prepared), then with the run folder and the model's shapes for
    the space estimate (:mod:`minddp.train.outputs`).
    """
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
            one, writing = outputs.trace_bytes(
                tensors, min(cfg.profile_steps, cfg.steps), cfg.grad_accum, cfg.trace_gzip, gpu=gpu
            )
            peak = max(peak, kept + ranks * writing)
            kept += ranks * one
        metrics = 256 * cfg.steps  # a stage's metrics.jsonl: a line of about 130 bytes per step
        plan.folder("--trace-dir", run_dir or cfg.trace_dir, need=max(peak, kept) + (64 * 1024 + metrics) * len(stages))
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
        say(
            f"warning: {local} ranks on {cores} CPU cores: the ranks take turns on the cores and every "
            "collective waits for the rank that is not running, so steps will be slow and timings will not "
            f"mean much; --world-size {cores} or fewer avoids it"
        )


def write_outputs(cfg: TrainConfig, summary: dict, run_dir: str, lost: list[str]) -> None:
    """Step 4's files, each on its own: one that cannot be written is named in ``lost``, the others still are."""
    targets = []
    if profiling(cfg) and summary["stages"]:
        targets.append((os.path.join(run_dir, "summary.json"), "the run's summary.json"))
    if cfg.summary_json:
        targets.append((cfg.summary_json, "--summary-json"))
    for path, what in targets:
        _write_or_note(path, summary, what, lost)


def _write_or_note(path: str, payload: dict, what: str, lost: list[str], write=write_json) -> None:
    try:
        write(path, payload)
    except OSError as exc:
        lost.append(f"{what} {path!r} was not written ({exc.strerror or exc})")


def main(argv: list[str] | None = None) -> int:
    """The CLI: 0 on success, 2 on bad input (usage and one line on stderr), 1 when a rank failed or an
    output could not be written (the results are printed and the other outputs written first), 130 on Ctrl-C,
    143 on SIGTERM, 129 on SIGHUP (the terminal closed): one line, the ranks ended, the finished stages kept.
    """
    with stop_signals():  # SIGTERM and SIGHUP unwind like Ctrl-C (minddp.runtime.processes)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    watch_torchrun_agent()  # a worker whose torchrun agent is gone ends, from the start
    parser = build_parser()
    try:
        cfg = parse_args(argv)  # step 1
        check_combination(cfg)
        check_outputs(cfg)  # the paths, before the slower data and model preparation
        data, placement, run_dir = prepare(cfg)  # step 2
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
        for stage in cfg.stages():  # step 3
            reason = skip_reason(cfg, stage, placement)
            if reason:
                say(f"skipping --stage {stage}: {reason}")
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
            if profiling(cfg) and rank0:  # beside the traces: every step's loss and the held-out measurements
                _write_or_note(
                    os.path.join(run_dir, stage, METRICS_FILE),
                    result,
                    f"stage {stage}'s {METRICS_FILE}",
                    lost,
                    write=write_metrics,
                )
            if profiling(cfg) and rank0:
                _write_or_note(
                    os.path.join(run_dir, stage, "config.json"),
                    {
                        **cfg.to_dict(),
                        "stage": stage,
                        "backend": placement.backend,
                        "devices": placement.why,
                        "ranks": result["ranks"],
                        "bucket_cap_mb_used": result["bucket_cap_mb"],
                        "bucket_cap_why": result["bucket_cap_why"],
                        "data_source": data.source,
                    },
                    f"stage {stage}'s config.json",
                    lost,
                )
    except (KeyboardInterrupt, Stopped) as exc:  # the launcher ended the ranks and said so; the stages done are kept
        failed = {"stage": "interrupted", "error": stop_reason(exc)}
        stopped = exc.code if isinstance(exc, Stopped) else 130
    finally:
        bar_drawn(False)
    if not rank0:  # a torchrun worker that was stopped exits with the signal's status
        return 0 if stopped is None else stopped
    for stage, result in results.items():
        for rank, why in result.get("trace_errors", {}).items():
            lost.append(f"stage {stage}: rank {rank}'s trace was not written ({why}); training went on")
    summary = {
        "config": cfg.to_dict(),
        "backend": placement.backend,
        "devices": placement.why,
        "world_size": cfg.effective_world_size(),
        "data_source": data.source,
        "run_dir": run_dir if profiling(cfg) else None,
        "skipped": skipped,
        "stages": {
            s: {
                **rows[s],
                "losses": results[s]["losses"],
                "evals": results[s].get("evals"),
                "memory": results[s].get("memory"),
            }
            for s in rows
        },
        "failed": failed,
        "not_written": lost,
    }
    show = print if stopped is None else _show_if_possible  # after SIGHUP the terminal may be gone
    if rows:  # step 4
        show(format_table(rows), flush=True)
        measured = {stage: results[stage]["memory"] for stage in rows if results[stage].get("memory")}
        if measured:
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
            from minddp.analysis.__main__ import main as analyze_main
        except ImportError:
            say("--analyze: minddp.analysis is not available in this installation")
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
