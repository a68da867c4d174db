"""Write the step-through notebooks 01-05 from the Python source below, so they can be reviewed as code.

1. each notebook is a list of cells: ``md(text)``, ``code(text)``, or
   ``code(text, expect="...")`` for a cell that must fail (the blog shows
   broken states on purpose); such a cell is tagged ``raises-exception`` and
   records the text its error must contain, which ``tests/test_notebooks.py``
   checks;
2. the notebooks are written without outputs;
3. outputs come from a real run: ``MINDDP_WRITE_NOTEBOOKS=1 python -m pytest
   tests/test_notebooks.py`` executes each one in a fresh kernel and saves it.

Example::

    $ python tools/build_notebooks.py            # rewrite notebooks/01_*.ipynb ... 05_*.ipynb
    $ MINDDP_WRITE_NOTEBOOKS=1 python -m pytest tests/test_notebooks.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, expect: str | None = None):
    cell = new_code_cell(text.strip("\n"))
    if expect is not None:                                                   # step 1
        cell.metadata["tags"] = ["raises-exception"]
        cell.metadata["minddp"] = {"expected_error": expect}
    return cell


def show_source(expr: str):
    """A cell that prints, on rank 0, the source of ``expr`` (a stage class or method)."""
    return code(f"%%rank 0\nprint(inspect.getsource({expr}))")


def train_stage(stage: str, accum: int | None = None):
    """A cell that trains ``stage`` on every rank (notebook 03's toy run) and shows loss and traffic."""
    args = f", accum={accum}" if accum else ""
    return code(f'%%distributed\nshow(*run("{stage}"{args}, run_name="03_build_up"))')


START = code("%load_ext minddp.notebook\n%dist_init --world-size 2")
STOP = code("%dist_shutdown")

# ---------------------------------------------------------------------------------------------- 01
COLLECTIVES = [
    md("""
# 01 · Collectives on real ranks

Data parallelism needs only a handful of communication patterns. This notebook runs each one on
two real processes (*ranks*): gloo on a CPU, NCCL when every rank has a GPU. Every cell marked
`%%distributed` runs on every rank, and each rank's output appears under its label.

The patterns follow the *distributed training notes* in `shared/seeds/`: point-to-point first,
then the collectives, where every rank of the group takes part in the same call.
"""),
    START,
    md("""
## Point-to-point: `send` / `recv`

One rank sends a tensor, another receives it into a buffer of the same shape. Both calls block until
the transfer is done, so the two ranks must agree on who sends and who receives (otherwise both wait
forever).
"""),
    code("""
%%distributed
t = torch.zeros(3, device=device)
if rank == 0:
    t += torch.tensor([1.0, 2.0, 3.0], device=device)
    dist.send(t, dst=1)
else:
    dist.recv(t, src=0)
print(f"rank {rank} holds {t.tolist()}")
"""),
    md("""
## Non-blocking: `isend` / `irecv`

The `i` versions return at once with a *work* handle; the transfer runs in the background, and
`wait()` blocks until it is finished. In between, a rank can compute: this is the seed of
overlapping communication with computation, which the later DDP stages are built on.
"""),
    code("""
%%distributed
t = torch.full((3,), float(rank), device=device)
peer = 1 - rank
send_work = dist.isend(t.clone(), dst=peer)     # both ranks send and receive at the same time
received = torch.empty(3, device=device)
recv_work = dist.irecv(received, src=peer)
busy = (torch.randn(64, 64) @ torch.randn(64, 64)).sum()   # work done while the message travels
send_work.wait(); recv_work.wait()
print(f"rank {rank} got {received.tolist()} from rank {peer}")
"""),
    md("""
## `broadcast`: one rank's tensor to everyone

This is how every DDP wrapper makes the model replicas identical at the start: rank 0's parameters
are broadcast to all ranks.
"""),
    code("""
%%distributed
t = torch.tensor([10.0, 20.0], device=device) if rank == 0 else torch.zeros(2, device=device)
dist.broadcast(t, src=0)
t
"""),
    md("""
## `scatter`: rank 0 deals out one chunk per rank

Rank 0 holds a list with one tensor per rank; every rank receives its own. (A data loader that
shards a global batch does the same job without communication: every rank draws the same global
batch and keeps its share.)
"""),
    code("""
%%distributed
chunk = torch.zeros(2, device=device)
chunks = list(torch.arange(2.0 * world_size, device=device).chunk(world_size)) if rank == 0 else None
dist.scatter(chunk, scatter_list=chunks, src=0)
chunk
"""),
    md("""
## `reduce` and `gather`: everything to one rank

`reduce` sums (or takes the max, ...) every rank's tensor *into rank 0's*; `gather` collects the
tensors side by side on rank 0. The other ranks' buffers are not meaningful afterwards.
"""),
    code("""
%%distributed
t = torch.tensor([rank + 1.0], device=device)
dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
gathered = [torch.zeros(1, device=device) for _ in range(world_size)] if rank == 0 else None
dist.gather(torch.tensor([rank * 100.0], device=device), gather_list=gathered, dst=0)
print("reduce ->", t.item(), "| gather ->", gathered)
"""),
    md("""
## `all_reduce`: everybody gets the sum

The collective at the heart of DDP: after backward, each rank has the gradient of *its* shard;
`all_reduce` leaves the sum on every rank, and dividing by the world size gives the average
gradient: the gradient of the whole global batch.
"""),
    code("""
%%distributed
grad = torch.tensor([1.0, 2.0], device=device) * (rank + 1)   # a different "gradient" per rank
dist.all_reduce(grad, op=dist.ReduceOp.SUM)
grad / world_size
"""),
    md("""
## `all_gather` and `reduce_scatter`: the two halves of a ring all_reduce

`all_gather` gives every rank every rank's tensor. `reduce_scatter` is the opposite: each rank
ends up with the *sum* of one chunk. (gloo on CPU implements `reduce_scatter` in this torch
version; NCCL always has.)

Running a `reduce_scatter` then an `all_gather` is an `all_reduce`: that is how the ring algorithm
used by NCCL and gloo works, and `minddp.collectives.ring_all_reduce` writes it from plain
`send`/`recv` so you can read it.
"""),
    code("""
%%distributed
everyone = [torch.zeros(2, device=device) for _ in range(world_size)]
dist.all_gather(everyone, torch.full((2,), float(rank), device=device))
print("all_gather ->", [e.tolist() for e in everyone])

full = torch.arange(2.0 * world_size, device=device) + 10 * rank     # each rank's full vector
mine = torch.zeros(2, device=device)
dist.reduce_scatter(mine, list(full.chunk(world_size)))              # this rank's chunk, summed
print("reduce_scatter ->", mine.tolist())
"""),
    code("""
%%distributed
from minddp.collectives import ring_all_reduce
x = torch.arange(5.0, device=device) * (rank + 1)
expected = x.clone(); dist.all_reduce(expected)
ring_all_reduce(x, dist.group.WORLD)        # reduce-scatter, then all-gather, neighbour to neighbour
print("ring:", x.tolist(), "| equal to dist.all_reduce:", torch.equal(x, expected))
"""),
    md("""
## `barrier`: wait for everyone

No data moves; every rank waits until all have arrived. Here rank 1 is slow, and rank 0 waits for
it at the barrier.
"""),
    code("""
%%distributed
import time
start = time.perf_counter()
if rank == 1:
    time.sleep(0.5)
dist.barrier()
print(f"rank {rank} left the barrier after {time.perf_counter() - start:.1f} s")
"""),
    md("Next: `02_simple_ddp.ipynb` uses `broadcast` and `all_reduce` to turn one training process into data parallelism."),
    STOP,
]

# ---------------------------------------------------------------------------------------------- 02
SIMPLE = [
    md("""
# 02 · From one process to `SimpleDDP`

Data parallelism runs one copy of the model per rank, each on its own shard of the global batch.
Two things must hold for the copies to stay one model:

1. **same start**: every copy has the same parameters;
2. **same update**: every copy applies the same gradient, the average over ranks.

We break both on purpose, watch the check fail, and then let `minddp.stages.SimpleDDP` fix them.
The model and data come from `toy_training.py` next to this notebook (a tiny MLP on a toy
classification task, the same global batch on every rank, each rank keeping its shard).
"""),
    START,
    code("""
%%distributed
import inspect
from torch import nn
from minddp.stages import SimpleDDP
from toy_training import global_batches, loss_fn, make_model

def check_in_sync(tensors, what):
    \"\"\"Compare every tensor with rank 0's copy; list every mismatch (all ranks finish every broadcast).\"\"\"
    bad = []
    for i, t in enumerate(tensors):
        rank0 = t.detach().clone()
        dist.broadcast(rank0, src=0)
        if not torch.equal(t, rank0):
            bad.append(i)
    if bad:
        raise ValueError(f"{what} are not in sync with rank 0: tensors {bad} of {len(tensors)} differ")
    print(f"all {len(tensors)} {what} equal rank 0's")
"""),
    md("""
## 1. Parameters out of sync

Each rank builds its model with its own random initialisation (here: a different seed per rank,
as two processes that never set one would). Rank 0 compares with itself and passes; rank 1 fails.
This cell is expected to fail.
"""),
    code("""
%%distributed
model = make_model(seed=1234 + rank)
check_in_sync(list(model.parameters()), "parameters")
""", expect="parameters are not in sync"),
    md("""
## 2. `SimpleDDP` broadcasts rank 0's parameters

Wrapping the model broadcasts every parameter and buffer from rank 0 (step 1 of the class
docstring). Here is the constructor, then the same check, which now passes on every rank.
"""),
    code("""
%%rank 0
print(inspect.getsource(SimpleDDP.__init__))
"""),
    code("""
%%distributed
ddp = SimpleDDP(model)
check_in_sync(list(ddp.parameters()), "parameters")
"""),
    md("""
## 3. Gradients out of sync

Each rank runs forward and backward on its own shard, so each holds a different gradient. If the
ranks stepped now, their models would drift apart again. Expected to fail:
"""),
    code("""
%%distributed
(shard,) = next(global_batches(steps=1, accum=1))
loss = loss_fn(ddp, shard)
loss.backward()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")
""", expect="gradients are not in sync"),
    md("""
## 4. Averaging the gradients

`finish_gradient_synchronization()` all_reduces every gradient and divides by the world size.
The global-batch loss is the mean of the shard losses, so this average is exactly the gradient a
single process would compute on the whole global batch. We check that too: every rank also builds
the same model in one process and runs the global batch through it.
"""),
    code("""
%%rank 0
print(inspect.getsource(SimpleDDP.finish_gradient_synchronization))
"""),
    code("""
%%distributed
ddp.finish_gradient_synchronization()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")

# The oracle: one process, rank 0's initial weights, the whole global batch.
single = make_model(seed=1234)
x_shards = [torch.empty_like(shard[0]) for _ in range(world_size)]
y_shards = [torch.empty_like(shard[1]) for _ in range(world_size)]
dist.all_gather(x_shards, shard[0]); dist.all_gather(y_shards, shard[1])
loss_fn(single, (torch.cat(x_shards), torch.cat(y_shards))).backward()
max_diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(ddp.parameters(), single.parameters()))
print(f"largest difference to the single-process gradient: {max_diff:.2e}")
assert max_diff < 1e-5
"""),
    md("""
## 5. Training stays in sync

With the same start and the same update, a few optimizer steps keep the replicas identical.
`minddp.loop.train_step` is the loop every stage shares (forward, backward, finish, step).
"""),
    code("""
%%distributed
from minddp.loop import train_step
ddp.zero_grad(set_to_none=True)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
losses = [train_step(ddp, optimizer, micro, loss_fn) for micro in global_batches(steps=5)]
print("losses on this rank's shard:", [round(l, 4) for l in losses])
check_in_sync(list(ddp.parameters()), "parameters")
"""),
    md("Next: `03_build_up.ipynb` makes the same averaging cheaper and earlier, one idea per stage."),
    STOP,
]

# ---------------------------------------------------------------------------------------------- 03
BUILD_UP = [
    md("""
# 03 · The build-up: accumulation, hooks, futures, buckets

`SimpleDDP` waits until backward is over, then sends one all_reduce per parameter. Each stage
below changes one thing about *when* or *how much* is sent; none changes *what* is computed (the
test suite checks every stage against a single process and torch's DDP). Every stage trains the
same toy model for a few steps under the profiler, and at the end `minddp.analysis` compares
their traces.

The helper `run(stage, ...)` in `toy_training.py` builds the stage with
`minddp.stages.build_stage`, trains with `minddp.loop.train_step` and profiles with
`minddp.profiling.StepProfiler` into `traces/notebooks/03_build_up/<stage>/`:
"""),
    code("""
import inspect, shutil
import toy_training
from toy_training import trace_dir
shutil.rmtree(trace_dir("03_build_up"), ignore_errors=True)   # a fresh run folder
print(inspect.getsource(toy_training.run))
"""),
    START,
    code("""
%%distributed
import inspect
from minddp.ladder import STAGES
from toy_training import run
def show(losses, wire_stats):
    w = wire_stats[-1]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} | last step: {w['calls']} all_reduce calls, {w['bytes'] / 1e3:.0f} kB")
"""),
    md("""
### The reference: `simple`

We give `simple` three micro-batches per optimizer step, as `ga` will get. `SimpleDDP` has no
`no_sync()`, so the loop must sync after every micro-batch's backward: three rounds of
all_reduce calls per step.
"""),
    train_stage("simple", accum=3),
    md("""
## `ga`: gradient accumulation

With `accum` micro-batches per step, only the last micro-batch's gradients need averaging: the
others run inside `no_sync()` and just accumulate locally. Same result, a third of `simple`'s
all_reduce calls and bytes per optimizer step.
"""),
    show_source('STAGES["ga"].no_sync'),
    train_stage("ga", accum=3),
    md("""
## `hook`: sync each gradient as soon as it exists

A post-accumulate-grad hook on every parameter fires the moment autograd has written its
gradient, *during* backward; the hook sends it and (in this stage) waits for the result. The
communication now starts earlier, but backward is blocked while it runs.
"""),
    show_source('STAGES["hook"]._grad_ready'),
    train_stage("hook"),
    md("""
## `hook-async`: do not wait

The same hook, but it keeps the future instead of waiting on it: autograd goes on computing
earlier layers while gloo moves later layers' gradients. Everything is waited for once, before
`optimizer.step()`. The whole stage is one class attribute:
"""),
    show_source('STAGES["hook-async"]'),
    train_stage("hook-async"),
    md("""
## `bucket`: fewer, larger messages

One all_reduce per parameter pays the fixed cost of a message 14 times per step here. Buckets
group gradients (in reverse parameter order, the order backward produces them) until a bucket
holds `bucket_cap_mb` or more (torch's rule), and one all_reduce per full bucket moves the same
bytes in fewer calls. We use a small cap (0.1 MB) so the toy model gets several buckets.
"""),
    show_source('STAGES["bucket"]._grad_ready'),
    train_stage("bucket"),
    md("## `bucket-async`: buckets sent while backward goes on"),
    show_source('STAGES["bucket-async"]'),
    train_stage("bucket-async"),
    md("""
## Comparing the stages

`minddp.analysis.analyze_run` reads every stage's traces and computes the numbers
HolisticTraceAnalysis gives on GPUs (on a CPU/gloo trace HTA cannot, so minddp computes the same
metrics itself; definitions in `docs/analysis.md`). Times on a shared 2-core machine are noisy:
compare stages with each other, not with other machines.
"""),
    code("""
import pandas as pd
from IPython.display import Image, display
from minddp.analysis import analyze_run
from minddp.analysis.report import plot_comm, plot_overlap, plot_temporal

result = analyze_run(trace_dir("03_build_up"))
columns = ["step_time_us", "compute_pctg", "non_compute_pctg", "idle_pctg", "comm_comp_overlap_pctg",
           "allreduce_calls_per_step", "allreduce_bytes_per_step"]
result.stages[columns].round(1)
"""),
    code("""
folder = trace_dir("03_build_up")
plot_temporal([result], folder / "temporal_breakdown.png")
plot_comm([result], folder / "comm.png")
display(Image(filename=folder / "temporal_breakdown.png"), Image(filename=folder / "comm.png"))
"""),
    md("""
What to look for: the bucketed stages issue fewer all_reduce calls per step than the
per-parameter ones (3 buckets instead of 14 parameters) for the same bytes, and finish their steps
sooner; on the same three micro-batches per step `ga` sends a third of `simple`'s calls and
bytes. `05_reading_traces.ipynb` reads the overlap and the per-bucket
timeline in detail.
"""),
    STOP,
]

# ---------------------------------------------------------------------------------------------- 04
HOOKS = [
    md("""
# 04 · Communication hooks: fewer bytes on the wire

Every minddp stage sends gradients through a *comm hook* `hook(state, bucket) -> Future[Tensor]`,
the interface of torch's `register_comm_hook`. The default averages with a plain all_reduce;
others compress first:

* `fp16` / `bf16`: cast the bucket to 16 bits, all_reduce, cast back: half the bytes;
* `powersgd`: approximate each gradient matrix by a rank-`r` product `P Qᵀ` and all_reduce the
  two thin factors; with error feedback, what was lost is added back at the next step.

Here every hook trains the same model on the `bucket-async` stage. We read the bytes each rank put
on the wire (`minddp.comm.wire.traffic`) and the relative gradient error `‖g − ĝ‖ / ‖g‖`, and
compare the loss curves.
"""),
    START,
    code("""
%%distributed
from toy_training import run
HOOKS = {
    "allreduce": {},
    "fp16": {},
    "bf16": {},
    # as in torch: plain allreduce for the first steps, then rank-1 PowerSGD with error feedback
    "powersgd": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 3},
}
results = {}
for name, options in HOOKS.items():
    losses, wire_stats = run("bucket-async", steps=30, hook=name, measure_error=True, **options)
    # each rank's loss is its shard's; the global batch's loss is their mean
    losses = torch.tensor(losses)
    dist.all_reduce(losses)
    results[name] = ((losses / world_size).tolist(), wire_stats)
"""),
    md("""
## Bytes on the wire and gradient error

Numbers of the last step (PowerSGD compresses from step 3 on). Each rank measured its own
traffic; they are identical, so we show rank 0's.
"""),
    code("""
%%rank 0
import pandas as pd
rows = {}
for name, (losses, wire_stats) in results.items():
    last = wire_stats[-1]
    rows[name] = {"all_reduce calls": last["calls"], "kB sent": last["bytes"] / 1e3,
                  "vs allreduce": last["bytes"] / results["allreduce"][1][-1]["bytes"],
                  "relative grad error": last["relative_error"], "loss, last 5 steps": sum(losses[-5:]) / 5}
pd.DataFrame(rows).T.round(4)
"""),
    md("""
fp16 and bf16 halve the bytes; bf16 keeps fp32's range but fewer mantissa bits, so its error is
larger than fp16's on these small gradients. PowerSGD sends a small fraction of the bytes for a
much larger per-step error, which error feedback carries into later steps instead of losing it.
"""),
    md("## Loss curves side by side"),
    code("""
%%rank 0
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, (losses, _) in results.items():
    ax.plot(range(1, len(losses) + 1), losses, label=name)
ax.axvline(3, color="grey", ls=":", lw=1)
ax.text(3.2, ax.get_ylim()[1], "PowerSGD starts", va="top", fontsize=8, color="grey")
ax.set_xlabel("step"); ax.set_ylabel("training loss (global batch)")
ax.set_title("Same model, same data, four comm hooks (bucket-async, 2 ranks, 64 examples per step)")
ax.legend()
plt.show()
"""),
    md("""
The curves jump from step to step because each step sees only 64 fresh examples; what to compare is
how closely each compressed hook follows the `allreduce` curve. fp16 and bf16 are indistinguishable
from it here; PowerSGD drifts away once it starts, the price of sending a few percent of the bytes.

The hooks are torch-compatible: `register_comm_hook(state, hook)` on any minddp stage takes
`minddp.comm.default_hooks` / `minddp.comm.powerSGD_hook` functions *or* torch's own
`torch.distributed.algorithms.ddp_comm_hooks` ones. `python -m minddp.train --hook powersgd`
runs the same comparison on the tiny Llama.
"""),
    STOP,
]

# ---------------------------------------------------------------------------------------------- 05
TRACES = [
    md("""
# 05 · Reading traces: where does the time go?

Each rank records a profiler trace (open one in https://ui.perfetto.dev). This notebook profiles
every stage, then reads the traces with `minddp.analysis` the way the blog reads them with
HolisticTraceAnalysis:

* **temporal breakdown**: the share of the profiled time spent computing, communicating without
  computing, and idle;
* **overlap**: the share of communication time that ran while computation ran too (hidden);
* **per-bucket timeline**: for one step, when each bucket's gradients were ready, when its hook
  launched the all_reduce, and when the all_reduce ran.
"""),
    code("""
import shutil
from toy_training import trace_dir
RUN = "05_reading_traces"
shutil.rmtree(trace_dir(RUN), ignore_errors=True)
"""),
    START,
    code("""
%%distributed
from minddp.ladder import STAGES
from toy_training import run
for stage in [*STAGES, "torch"]:          # every minddp stage, then torch's own DDP
    losses, _ = run(stage, steps=8, accum=3 if stage == "ga" else 1, run_name="05_reading_traces")
print("profiled:", ", ".join([*STAGES, "torch"]))
"""),
    STOP,
    md("""
The ranks are done; the analysis runs here, in the notebook process. One row per (stage, rank)
first: the two ranks of a stage should tell a similar story.
"""),
    code("""
import pandas as pd
from IPython.display import Image, display
from minddp.analysis import analyze_run
from minddp.analysis.report import plot_buckets, plot_overlap, plot_temporal

result = analyze_run(trace_dir(RUN))
result.summary[["stage", "rank", "step_time_us", "compute_pctg", "non_compute_pctg", "idle_pctg",
                "comm_comp_overlap_pctg", "allreduce_calls_per_step"]].round(1)
"""),
    md("""
## Temporal breakdown and overlap, all stages

On a CPU, computation and gloo's communication threads share the same two cores, so
"non-compute" is time where only communication ran, and "idle" is time where the training thread
waited on something (a future, a peer) with nothing else running.
"""),
    code("""
folder = trace_dir(RUN)
plot_temporal([result], folder / "temporal_breakdown.png")
plot_overlap([result], folder / "overlap.png")
display(Image(filename=folder / "temporal_breakdown.png"), Image(filename=folder / "overlap.png"))
"""),
    md("""
By construction, `simple` and `ga` only communicate after backward, so any overlap they show is
incidental (the other rank's traffic, gloo's threads competing for the same two cores); the hook
stages start communicating during backward, and the async ones do not block while they do. On a toy
model whose step takes milliseconds on two shared cores these percentages are small and change
from run to run: read them as a rough ranking, and look at the per-bucket timeline below, which
shows the mechanism directly. (On the blog's GPUs the same plot separates the stages clearly.)

The kernel-type view (HTA's `get_gpu_kernel_breakdown`) splits the profiled time the same way:
"""),
    code("""
# % of the profiled time of rank 0, per stage
result.kernels.pivot_table(index="stage", columns="kernel_type", values="percentage", sort=False).round(1)
"""),
    md("""
## The per-bucket timeline

For the last profiled step of rank 0: a tick when a bucket became ready (its last gradient was
written), a thin bar while the hook launched it, a thick bar while its all_reduce ran; the dashed
line is the end of the step. Per-parameter stages have one "bucket" per parameter.

Read the ticks: in `simple` and `ga` they come after backward, one after the other, each waiting
for the previous all_reduce; in `hook` they are spread through backward but each waits for its own
all_reduce; in `hook-async` all ticks come quickly one after another (backward is not held up)
while the all_reduces run behind them; the bucket stages have 6 rows instead of 14.
"""),
    code("""
plot_buckets(result, folder / "bucket_timeline.png", rank=0)
display(Image(filename=folder / "bucket_timeline.png"))
"""),
    code("""
# the numbers behind the plot, for one stage
result.buckets[(result.buckets["stage"] == "bucket-async") & (result.buckets["rank"] == 0)].round(0)
"""),
    md("""
The same analysis from a shell, with an HTML report: `python -m minddp.analyze
traces/notebooks/05_reading_traces --report`. On a GPU run, the same columns come from HTA itself.
"""),
]

BOOKS = {
    "01_collectives.ipynb": COLLECTIVES,
    "02_simple_ddp.ipynb": SIMPLE,
    "03_build_up.ipynb": BUILD_UP,
    "04_comm_hooks.ipynb": HOOKS,
    "05_reading_traces.ipynb": TRACES,
}


def build(names=None) -> list[Path]:
    """Step 2: write the notebooks (all, or those named), outputs empty."""
    written = []
    for name, cells in BOOKS.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=[nbformat.from_dict(c) for c in cells])
        for i, cell in enumerate(nb.cells):
            cell.id = f"{name[:2]}-{i:02d}"  # stable ids: a rebuild diffs only where the text changed
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = NOTEBOOKS / name
        nbformat.write(nb, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in build(sys.argv[1:]):
        print(p)
