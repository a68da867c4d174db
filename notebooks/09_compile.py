# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Compiled: `torch.compile` and DDP's overlap
#
# Practitioners compile their model, most often as nanoGPT does: `model = torch.compile(model)`,
# then `DDP(model)`. Compiling changes what backward looks like to autograd: the compiled forward
# is *one* autograd node, and so is its backward, which hands over every gradient at its very end.
# A bucket can only be sent once its last gradient is there, so with one compiled backward no
# bucket leaves before all of backward is done: the overlap the ladder built up (`03_build_up`) is
# gone.
#
# torch's answer is in Dynamo: while torch's DDP runs its module, Dynamo's `DDPOptimizer`
# (`torch/_dynamo/backends/distributed.py`) **cuts the compiled graph into pieces** of about one
# bucket of parameters each, counted from the end of the forward, and compiles each piece apart.
# Backward then runs piece after piece; each piece hands over its gradients, their bucket is sent,
# and the pieces before it keep computing meanwhile. minddp's `ddp` presents its buckets to Dynamo
# the same way (`minddp/runtime/compiling.py`), and so do the bucketed stages when the train command
# builds them around a compiled model (`tests/test_compile.py` checks those).
#
# This notebook shows one step of `ddp` three ways on one time axis, eager, compiled without the
# cut and compiled with it; then where the cuts fall; then the graph breaks; then buckets below 1 MiB. The model is a small
# MLP of our own class (eight 1 MiB layers), not the shared workload: it compiles quickly (the first
# cell prints how long its compiling step took), and its layers make the pieces easy to name. The
# backend is `aot_eager`: the graph is traced and cut as with Inductor, then run with eager's own aten
# operations, fused into none (Inductor's kernels would fuse them), so all three trainings give the
# same bits, and compiling is not meant to make the step faster here.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import os
import tempfile
import time

import pandas as pd
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from minddp import DistributedDataParallel
from minddp.analysis import live, metrics
from minddp.analysis.cpu import rank_metrics
from minddp.analysis.events import read_trace
from minddp.ladder.loop import train_step
from minddp.notebook import lesson

WIDTH, DEPTH, CAP, BACKEND = 512, 8, 2.0, "aot_eager"  # 1 MiB weights, buckets of 2 MiB
PIECE = "autograd::engine::evaluate_function: CompiledFunctionBackward"  # the backward of one compiled piece


class MLP(nn.Module):
    def __init__(self, depth: int = DEPTH):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return self.head(x)


def batches():
    generator = torch.Generator().manual_seed(rank)  # each rank its own shard
    while True:
        yield [torch.randn(32, WIDTH, generator=generator) for _ in range(2)]  # two micro-batches a step


def loss_fn(model, x):
    return model(x).square().mean()


def trace_measures(prof) -> dict:
    """*In flight* (ms) and *overlap* (%) of the profiled step as docs/analysis.md defines them, read off its trace by
    the code of ``python -m minddp.analyze``: comm is gloo's ranges, compute the training thread's aten ops."""
    with tempfile.TemporaryDirectory() as folder:
        prof.export_chrome_trace(f"{folder}/rank{rank}.json")
        measured = rank_metrics(read_trace(f"{folder}/rank{rank}.json", rank))
    return {"in flight, ms": measured["comm_time_per_step_us"] / 1e3, "overlap, %": measured["comm_comp_overlap_pctg"]}


def phases(row) -> dict:
    """Each phase of a step row: ``name -> (ms, whether a message was in flight during it)``."""
    (f1, f2), (b1, b2), optimizer = row["forward"], row["backward"], row["optimizer"][-1]
    spans = {"forward 1": f1, "backward 1": b1, "forward 2": f2, "backward 2": b2}
    spans.update({"until the optimizer": (b2[1], optimizer[0]), "optimizer": optimizer})
    return {name: (e - s, bool(metrics.intersect([(s, e)], row["messages"]))) for name, (s, e) in spans.items()}


def one_step(compiled: bool, cut: bool = True):
    """ddp on a fresh MLP, compiled or not (the cut on or off), two warm-up steps, then one profiled step."""
    torch._dynamo.reset()  # every MLP shares Dynamo's cache (one class, one code): start each anew
    torch._dynamo.config.optimize_ddp = cut
    model = MLP()
    ddp = DistributedDataParallel(torch.compile(model, backend=BACKEND) if compiled else model, bucket_cap_mb=CAP)
    optimizer, data = torch.optim.SGD(model.parameters(), lr=0.01), batches()
    started = time.perf_counter()
    train_step(ddp, optimizer, next(data), loss_fn)  # the first step compiles
    first_step_s = time.perf_counter() - started
    train_step(ddp, optimizer, next(data), loss_fn)  # the second runs on the plan rebuilt from the first's order
    with live.profiler() as prof:
        train_step(ddp, optimizer, next(data), loss_fn)
    torch._dynamo.config.optimize_ddp = True
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    sends = [e.time_range.start for e in events if e.name == live.CALL]
    view = live.step_view(prof)
    view.update(trace_measures(prof), first_step_s=first_step_s, phases=phases(view["row"]))
    view["matmuls_after_first_send"] = sum(e.name == "aten::mm" and e.time_range.start > sends[0] for e in events)
    view["matmuls"] = sum(e.name in ("aten::mm", "aten::addmm") for e in events)
    view["aten_ops"] = sum(e.name.startswith("aten::") for e in events)
    # the compiled pieces' backward in the second micro-batch (the first runs inside no_sync: nothing is sent)
    last = max(e.time_range.start for e in events if e.name == "minddp.forward_backward")
    nodes = [(e.time_range.start, e.time_range.end) for e in events if e.name == PIECE and e.time_range.start > last]
    view["pieces_ended_at_send"] = [sum(end <= t for _, end in nodes) for t in sends]
    view["pieces_begun_at_send"] = [sum(start <= t for start, _ in nodes) for t in sends]
    # backward as the computing nodes only (a compiled piece is one): not the AccumulateGrad nodes after them,
    # where the reducer's hooks copy gradients into buckets and send them
    t0 = min(e.time_range.start for e in events if e.name == "minddp.forward_backward")
    view["row"]["backward"] = [
        ((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3)
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and "AccumulateGrad" not in e.name
    ]
    view["finish_ms"] = max(e - s for s, e in view["row"]["finish"])
    # a span under 1 % of the step is too short to see: not drawn, so not named in the legend (said below)
    view["row"]["finish"] = [(s, e) for s, e in view["row"]["finish"] if e - s >= 0.01 * view["row"]["end"]]
    view["buckets"] = [[ddp.reducer.names[i].removeprefix("_orig_mod.") for i in b] for b in ddp.bucket_plan]
    view["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return ddp, view


looks = {}
for label, compiled, cut in (("eager", False, True), ("compiled, no cut", True, False), ("compiled, cut", True, True)):
    ddp, looks[label] = one_step(compiled, cut)
    looks[label]["row"].update(label=label, stage=label)
lesson.say(
    f"ddp on {world_size} ranks, an MLP of {DEPTH} layers of {WIDTH}×{WIDTH} (1 MiB of float32 weights each) and "
    f"a head, buckets of {CAP:g} MiB, two micro-batches a step; compiled with the {BACKEND} backend."
)
lesson.say(
    f"This machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} over the last minute (both ranks, "
    "gloo's threads and every other process share those cores)."
)
lesson.say(
    f"The first step of the compiled MLP with the cut, which compiles it, took {looks['compiled, cut']['first_step_s']:.1f} s "
    f"(eager's first step: {looks['eager']['first_step_s']:.2f} s)."
)


# %% [markdown]
# ## One step, three ways, on one time axis
#
# Each row is the profiled step of one way, rank 0: the forward (pale) and backward (blue) of each
# micro-batch (the first runs inside `no_sync()`, so only the second sends), a tick when a bucket
# was handed to the wire, a bar while gloo ran its `all_reduce`, then the optimizer step (green).
# Backward is drawn where it computes: eager, node after node; compiled, one bar per compiled piece.
# The gaps between them are the `AccumulateGrad` nodes, where the reducer's hooks copy gradients
# into buckets and send full ones. The lengths of the bars are one step on the machine printed
# above, its cores shared with everything else that runs; the order of the events is what the cut
# changes, and what the claims below count. Above the figure, two tables. The first gives each way's
# step, the time its backward computed (the blue bars), and two of the measures of
# `docs/analysis.md`, read off the step's trace by the code of `python -m minddp.analyze`: *in flight*
# (the time gloo's `all_reduce` ranges ran, their wait for the other rank and for a core included) and
# *overlap* (the share of that time during which the training thread ran an `aten::` op: forward,
# backward, the optimizer and the reducer's copies into buckets alike: without the cut, the first
# buckets travel while the reducer copies the later ones, so that step can show overlap with no
# backward beside its messages). The last column, named apart for that reason, is the time in flight
# beside backward's compute alone (the blue bars): the overlap the cut brings back. The second splits each step
# into its phases, marking those during which a message was in flight: a phase with nothing in flight
# in both ways is where the two steps can be compared with the messages left out.
#
# On a GPU, which this notebook does not run on, the cut is expected to pay: backward's kernels run
# on the GPU while NCCL carries the buckets on a stream of its own, so a message in flight does not
# take compute from backward the way it can take a core here.

# %%
# %%distributed
lesson.picture(looks, "", rows=list(looks), title="ddp: eager, compiled without the cut, compiled with it")
after = {label: v["matmuls_after_first_send"] for label, v in looks.items()}
lesson.say(
    "Backward matrix multiplies still to run when the first bucket was handed over: "
    + ", ".join(f"{label} {n}" for label, n in after.items())
    + "."
)
# orders of events on the training thread (program order), not timings: they hold on any machine
lesson.claim(
    after["compiled, no cut"] == 0,
    "Compiled without the cut, no bucket leaves before the compiled backward is over: every gradient "
    "arrives at its end, and all the messages come after it.",
)
lesson.claim(
    after["compiled, cut"] > 0 and after["eager"] > 0,
    "Compiled with the cut, as eager, the first bucket leaves while backward still has matrix multiplies to "
    "run: the overlap is back.",
)
same = all(torch.equal(v["params"], looks["eager"]["params"]) for v in looks.values())
lesson.claim(
    same, "The three trainings end with the same parameters, to the bit (aot_eager computes with eager's aten ops)."
)
lesson.say(
    f"finish_gradient_synchronization took at most {max(v['finish_ms'] for v in looks.values()):.2f} ms in any of "
    + (
        "the three: under 1 % of a step, too short to see, so not drawn."
        if not any(v["row"]["finish"] for v in looks.values())
        else "the three (the purple bars)."
    )
)

table = {
    label: {
        "step, ms": v["row"]["end"],
        "backward computing, ms": metrics.length(v["row"]["backward"]),
        "in flight, ms": v["in flight, ms"],
        "overlap, %": v["overlap, %"],
        "in flight beside the blue bars, ms": metrics.in_flight(v["row"]["messages"], v["row"]["backward"]),
    }
    for label, v in looks.items()
}
lesson.say(pd.DataFrame(table).T.round(1).to_string())
lesson.say("\nEach phase of the step, ms (• a message was in flight during it):")
marked = {
    label: {name: f"{ms:.1f}{' •' if busy else ''}" for name, (ms, busy) in v["phases"].items()}
    for label, v in looks.items()
}
lesson.say(pd.DataFrame(marked).T.to_string())

# timings of one step on a shared machine: said from the run, never asserted (the load can reorder them)
step = {label: v["row"]["end"] for label, v in looks.items()}
fastest = min(step, key=step.get)
matmuls, ops = ({label: v[key] for label, v in looks.items()} for key in ("matmuls", "aten_ops"))
forward_1 = ", ".join(f"{v['phases']['forward 1'][0]:.0f}" for v in looks.values())
lesson.say(
    f"\nThe {fastest} step was the shortest here: {step[fastest]:.0f} ms, against "
    + " and ".join(f"{s:.0f} ms ({label})" for label, s in step.items() if label != fastest)
    + (
        ". aot_eager can be slower than eager on a CPU: "
        if fastest == "eager"
        else ". aot_eager does not make eager's work faster on a CPU, so that comes from the load and the messages: "
    )
    + (
        f"every way ran the same {matmuls['eager']} matrix multiplies"
        if len(set(matmuls.values())) == 1
        else "the matrix multiplies: " + ", ".join(f"{label} {n}" for label, n in matmuls.items())
    )
    + "; aot_eager fuses none of them (Inductor would) and adds work of its own around them: more aten ops in the "
    "step ("
    + ", ".join(f"{label} {n}" for label, n in ops.items())
    + "), AOTAutograd's wrappers around each compiled piece, Dynamo's guards before each call. On a CPU nothing "
    "pays that back. Each way also ran at its own moment of the machine's load: the first micro-batch's forward, "
    f"the same operations in all three, took {forward_1} ms."
)
cut_, whole = looks["compiled, cut"]["phases"], looks["compiled, no cut"]["phases"]
quiet = [name for name in cut_ if not cut_[name][1] and not whole[name][1]]
q_cut, q_whole = (sum(p[name][0] for name in quiet) for p in (cut_, whole))
(b_cut, _), (b_whole, _) = cut_["backward 2"], whole["backward 2"]
(w_cut, _), (w_whole, _) = cut_["until the optimizer"], whole["until the optimizer"]
lesson.say(
    f"With the cut the step took {step['compiled, cut']:.0f} ms, against {step['compiled, no cut']:.0f} ms without "
    f"it. In the phases where neither had a message in flight ({', '.join(quiet)}) it took {q_cut:.0f} ms against "
    f"{q_whole:.0f} ms ({q_cut / q_whole:.2f}×): there the cut's messages cannot be the cause, only the machine's "
    f"speed at the time. The second backward, with messages in flight, took {b_cut:.0f} ms against {b_whole:.0f} ms "
    f"({b_cut / b_whole:.2f}×)"
    + (
        ", slowed more than the quiet phases: consistent with a send taking a core from backward (the "
        f"{os.cpu_count()} cores run both ranks' backward and gloo's threads), which one step on a loaded machine "
        "cannot tell from the load's swings"
        if b_cut / b_whole > q_cut / q_whole
        else ", slowed no more than the quiet phases: this run does not show the sends taking cores from backward"
    )
    + f". From the end of backward to the optimizer, the step waited {w_cut:.0f} ms for its last messages against "
    f"{w_whole:.0f} ms. A message's time in flight includes gloo waiting for the other rank and for a core: rank "
    "0's trace alone cannot say which."
)


# %% [markdown]
# ## Where the cuts fall
#
# The pieces are visible to autograd: each is a `CompiledFunctionBackward` node, and the parameters
# whose gradients it hands over hang off it (their `AccumulateGrad` nodes). Walking the graph of one
# forward from its output lists them, in the order backward runs them. Beside them, the buckets of
# `ddp` (`bucket_plan`, rebuilt after the first step from the order gradients arrived in).


# %%
# %%distributed
def pieces(output) -> list[list[str]]:
    """The compiled pieces reached from ``output``, in backward order, each with its parameters' names."""
    names = {id(p): n.removeprefix("_orig_mod.") for n, p in ddp.module.named_parameters()}
    found, node = [], output.grad_fn
    while node is not None:
        if "CompiledFunction" in node.name():
            found.append([names[id(n.variable)] for n, _ in node.next_functions if hasattr(n, "variable")])
        earlier = [n for n, _ in node.next_functions if n is not None and not hasattr(n, "variable")]
        node = earlier[0] if earlier else None
    return found


with ddp.no_sync():  # a forward whose backward will not run: nothing for the reducer to expect
    cut = pieces(ddp(torch.randn(4, WIDTH)))
buckets = looks["compiled, cut"]["buckets"]
for i, piece in enumerate(cut):
    lesson.say(f"piece {i} (backward runs it {'first' if i == 0 else 'next'}): {', '.join(piece)}")
for i, bucket in enumerate(buckets):
    lesson.say(f"bucket {i}: {', '.join(bucket)}")
lesson.claim(
    len(cut) > 1 and sum(map(len, cut)) == sum(map(len, buckets)) == 2 * DEPTH + 2,
    f"The compiled graph is cut into {len(cut)} pieces, which together hand over all {2 * DEPTH + 2} "
    "parameters, each once.",
)
piece_of = {name: i for i, piece in enumerate(cut) for name in piece}
homes = [sorted({piece_of[name] for name in bucket}) for bucket in buckets]
# bucket k's parameters all lie in one piece, in backward order: it is full when that piece's backward ends
lesson.claim(
    all(len(home) == 1 for home in homes) and [h[0] for h in homes] == sorted(h[0] for h in homes),
    "Every bucket lies within one piece, in backward order: each bucket is full once the backward of its piece "
    "has ended.",
)
# program order on the training thread in the profiled step above: holds on any machine
ended, begun = (looks["compiled, cut"][key] for key in ("pieces_ended_at_send", "pieces_begun_at_send"))
lesson.claim(
    ended == begun == [home[0] + 1 for home in homes],
    "In the profiled step each bucket was handed to the wire (its tick) after the backward of its piece ended and "
    "before the next piece's began. Handed over is not carried: when gloo ran its all_reduce (its bar) was up to "
    "the cores and the other rank.",
)
size = {n.removeprefix("_orig_mod."): p.numel() * p.element_size() for n, p in ddp.module.named_parameters()}
cap = int(CAP * 2**20)
for i in range(len(cut)):
    inside = [k for k, home in enumerate(homes) if home == [i]]
    if len(inside) > 1:
        first, rest = inside[0], inside[1:]
        lesson.say(
            f"{len(cut)} pieces but {len(buckets)} buckets, both cut at {CAP:g} MiB ({cap} bytes), because they "
            "close at different grains. A piece is cut between operations of the graph, so a layer's weight and "
            "bias (one matrix multiply and add) always share a piece; a bucket closes at the parameter whose "
            f"gradient brings it to the cap. In piece {i}, bucket {first} ({', '.join(buckets[first])}) reached "
            f"{sum(size[n] for n in buckets[first])} bytes, "
            + ("the cap exactly" if sum(size[n] for n in buckets[first]) == cap else "past the cap")
            + ", so the gradients that came after it ("
            + "; ".join(f"{', '.join(buckets[k])}: {sum(size[n] for n in buckets[k])} bytes" for k in rest)
            + f") opened bucket {rest[0]}{'' if len(rest) == 1 else ' and on'}."
        )

# %% [markdown]
# ## Graph breaks
#
# The other pattern compiles the wrapper itself: `torch.compile(DDP(model))`. Dynamo then meets the
# wrapper's own Python first (which backward syncs, the graph walk of `find_unused_parameters`, the
# end-of-backward callback). A graph break is a place where Dynamo stops the graph, runs Python,
# and starts a new one: each costs a compiled piece and guards, and would put cuts where no bucket
# ends. minddp's `ddp` runs its own lines eagerly and lets Dynamo compile only the module, so its
# count is the model's own. torch's DDP, compiled whole, breaks on its own
# code.


# %%
# %%distributed
def breaks(wrap) -> int:
    """Dynamo's count of graph breaks in one training step of ``torch.compile(wrap(MLP()))``."""
    torch._dynamo.reset()
    counters.clear()
    model = MLP()
    compiled = torch.compile(wrap(model), backend=BACKEND)
    train_step(compiled, torch.optim.SGD(model.parameters(), lr=0.01), next(batches()), loss_fn)
    return sum(counters["graph_break"].values())


counts = {
    "the MLP alone": breaks(lambda m: m),
    "minddp's ddp": breaks(lambda m: DistributedDataParallel(m, bucket_cap_mb=CAP)),
    "torch's DDP": breaks(lambda m: torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=CAP)),
}
lesson.say(
    "Graph breaks in one step of torch.compile(wrapper(MLP())): " + ", ".join(f"{k} {v}" for k, v in counts.items())
)
lesson.claim(counts["minddp's ddp"] == counts["the MLP alone"], "minddp's ddp adds no graph break to the model's own.")
lesson.claim(
    counts["torch's DDP"] > counts["the MLP alone"], "torch's DDP, compiled whole, breaks the graph on its own code."
)

# %% [markdown]
# ## Buckets below 1 MiB
#
# Dynamo's cut makes its first piece 1 MiB (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`), as
# torch's DDP makes its first bucket, and refuses a cap below it. minddp gives Dynamo the first piece
# itself (the cap, when one is given) around the module it wraps. Each wrapper, both ways (the model
# compiled, then wrapped; the wrapper compiled), at 0.5 MiB on an MLP of two 1 MiB layers and the
# head, one training step each:


# %%
# %%distributed
SMALL = 0.5  # MiB


def compile_at(wrapper, model_first: bool) -> str:
    """One training step of a two-layer MLP, compiled and wrapped at ``SMALL`` MiB: what happened, in a line."""
    torch._dynamo.reset()
    counters.clear()
    model = MLP(depth=2)
    if model_first:
        wrapped = wrapper(torch.compile(model, backend=BACKEND), bucket_cap_mb=SMALL)
    else:
        wrapped = torch.compile(wrapper(model, bucket_cap_mb=SMALL), backend=BACKEND)
    try:
        train_step(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), next(batches()), loss_fn)
    except Exception as error:  # what torch raises, said in one line
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return f"trained a step; the graph was compiled in {counters['aot_autograd']['total']} pieces"


wrappers = {"torch's DDP": torch.nn.parallel.DistributedDataParallel, "minddp's ddp": DistributedDataParallel}
ways = {"the model compiled, then wrapped": True, "the wrapper compiled": False}
small = {(who, way): compile_at(wrapper, first) for who, wrapper in wrappers.items() for way, first in ways.items()}
for (who, way), outcome in small.items():
    lesson.say(f"{who}, {way}, bucket_cap_mb={SMALL:g}: {outcome}")
refused = "AssertionError: First bucket"
lesson.claim(
    all(small["torch's DDP", way].startswith(refused) for way in ways),
    "Below its 1 MiB first piece torch's DDP does not compile, either way (Dynamo's cut asserts).",
)
lesson.claim(
    all(
        small["minddp's ddp", way].startswith("trained") and int(small["minddp's ddp", way].split()[-2]) > 1
        for way in ways
    ),
    "minddp's ddp trains there, either way, its graph cut in pieces.",
)

# %% [markdown]
# ## What to take away
#
# * Compile the model, then wrap it (`model = torch.compile(model)`, then the stage): minddp's
#   `ddp` cuts the compiled graph where its buckets fill, so buckets leave during backward as in eager
#   (the runs above). `tests/test_compile.py` shows the same order of events for `zero2` around a
#   compiled model, and for the teaching stages `bucket` and `bucket-async` built by name
#   (`minddp.ladder.build_stage`, as `--compile` does) or passed through `compile_ready`; their own
#   files stay free of it. `torch.compile(ddp)` trains too (the graph breaks above, at 2 MiB).
# * The per-parameter stages (`hook`, `hook-async`) ask for no cut (`compile_ready` cuts only the
#   bucketed stages, `minddp/ladder/__init__.py`): compiled, their gradients arrive at the end of
#   backward, as in the row without the cut above. The train command refuses `--compile`
#   for `fsdp` in one line (`tests/test_compile.py`).
# * Below 1 MiB buckets torch's DDP does not compile (the runs above); minddp's `ddp` does, either
#   way, and cuts there.
# * The train command and the benchmark take `--compile` (`--compile-backend aot_eager` for quick
#   runs). `docs/ddp.md` (*Compiled*) gives the details, the limits and why minddp uses Dynamo's
#   cut rather than compiled autograd.

# %%
# %dist_shutdown
