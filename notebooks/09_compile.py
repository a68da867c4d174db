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
# # 09 · Compiled: `torch.compile` and messages during backward
#
# nanoGPT compiles its model, then wraps it: `model = torch.compile(model)`, then `DDP(model)`.
# Compiling changes what backward looks like to autograd: the compiled forward is *one* autograd
# node, and so is its backward, which produces every gradient at its very end.
# A bucket can only be handed over once its last gradient is there, so with one compiled backward no
# bucket is handed over before all of backward's compute is done, and no message can travel while
# backward computes: what the ladder built up from `hook-async` on (`03_build_up`) is gone.
#
# torch's answer is in Dynamo: while torch's DDP runs its module, Dynamo's `DDPOptimizer`
# (`torch/_dynamo/backends/distributed.py`) **cuts the compiled graph into pieces**, closing a piece
# once its parameters reach a bucket's bytes, counted from the end of the forward, and compiles each
# piece apart. Backward then runs piece after piece (in this notebook pieces are numbered in that
# order: piece 0 is the forward's last layers, which backward runs first). Once a piece's backward
# has produced its gradients, the reducer copies them into buckets and hands each full bucket to gloo
# before the next piece's backward begins, so the pieces backward runs after it, the forward's
# earlier layers, can compute while it travels. minddp's `ddp` presents its buckets to Dynamo too
# (`minddp/runtime/compiling.py`), with its own first piece (*Buckets below 1 MiB* says how it
# differs), and so do the bucketed stages when the train command builds them around a compiled
# model (`tests/test_compile.py` checks those).
#
# This notebook shows one step of `ddp` three ways on one time axis, eager, compiled without the
# cut and compiled with it; then where the cuts fall; then the graph breaks; then buckets below
# 1 MiB. The model is a small MLP of our own class (eight 1 MiB layers), not the shared workload:
# its layers make the pieces easy to name, and compiling it costs one first step (the cell after
# the one that starts the ranks prints how long it took here). The backend is `aot_eager`: the graph
# is traced and cut as with Inductor, then run with eager's own aten operations, fused into none, so
# all three trainings give the same bits.
#
# Words, kept apart. A bucket is *handed over* (to gloo: the tick in the figure) when the reducer
# calls `all_reduce` on it. It is *in flight* (`docs/analysis.md`) from the start of gloo's
# `all_reduce` range to its end (the orange bar), not from the tick; on a CPU the range includes gloo
# waiting for the other rank and for a free core. *In flight while backward
# computed* is the time during which a message was in flight and the training thread ran an aten op
# inside one of backward's *nodes* (its autograd nodes other than `AccumulateGrad`; a compiled piece's
# backward is one node). In this notebook *computed* always means an aten op ran. `ddp` waits for its
# messages at the end of backward: the reducer has autograd call `_finalize_backward`
# (`minddp/ddp/reducer.py`) once every node, `AccumulateGrad` included, has run, and it waits there
# for every message, so `loss.backward()` returns after the last one.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import os
import time
import traceback

import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from minddp import DistributedDataParallel
from minddp.analysis import live, metrics
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
    load = os.getloadavg()[0]  # the 1-minute load average as the profiled step ended
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    handovers = [e.time_range.start for e in events if e.name == live.CALL]  # each bucket handed to gloo
    view = live.step_view(prof)
    view.update(first_step_s=first_step_s, load=load)
    view["matmuls_after_first_handover"] = sum(
        e.name == "aten::mm" and e.time_range.start > handovers[0] for e in events
    )
    # the compiled pieces' backward in the second micro-batch (the first runs inside no_sync: nothing is handed over)
    micro = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "minddp.forward_backward")
    second = [
        (e.time_range.start, e.time_range.end) for e in events if e.name == PIECE and e.time_range.start > micro[-1][0]
    ]
    view["pieces_ended_at_handover"] = [sum(end <= t for _, end in second) for t in handovers]
    view["pieces_begun_at_handover"] = [sum(start <= t for start, _ in second) for t in handovers]
    # backward's nodes: every autograd node but AccumulateGrad (a compiled piece is one), not the AccumulateGrad
    # nodes after them, where the reducer's hooks copy gradients into buckets and hand them over
    node = "autograd::engine::evaluate_function"
    nodes = [
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name.startswith(node) and "AccumulateGrad" not in e.name
    ]
    main = next(e.thread for e in events if e.name == "minddp.forward_backward")  # the training thread

    def ms(start, end):
        return (start - micro[0][0]) / 1e3, (end - micro[0][0]) / 1e3

    view["row"]["backward"] = [ms(s, e) for s, e in nodes]  # drawn: one blue bar per node (step_view: per backward)
    ops = [ms(e.time_range.start, e.time_range.end) for e in events if e.thread == main and e.name.startswith("aten::")]
    # each hand-over: whether it ran inside an AccumulateGrad node
    accumulate = [
        (e.time_range.start, e.time_range.end) for e in events if e.name.startswith(node) and "AccumulateGrad" in e.name
    ]
    view["inside_accumulate"] = [any(s <= t <= e for s, e in accumulate) for t in handovers]
    # backward computed: the training thread's aten ops inside backward's nodes
    computed = metrics.intersect(view["row"]["backward"], ops)
    under, _ = metrics.overlap_parts(view["row"]["messages"], computed, [(0.0, view["row"]["end"])])
    view["in flight while backward computed, ms"] = under
    view["row"]["finish"] = []  # ddp waits inside backward (markdown at the top): its finish is not drawn
    view["buckets"] = [[ddp.reducer.names[i].removeprefix("_orig_mod.") for i in b] for b in ddp.bucket_plan]
    view["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return ddp, view


NAMES = {"eager": "eager", "compiled, no cut": "compiled without the cut", "compiled, cut": "compiled with the cut"}


def each(values: dict, unit: str = "ms", digits: int = 0) -> str:
    """``values`` (one number per way) in words: each way's name and its number, the unit once at the end."""
    return ", ".join(f"{NAMES[label]} {x:.{digits}f}" for label, x in values.items()) + f" {unit}".rstrip()


looks = {}
for label, compiled, cut in (("eager", False, True), ("compiled, no cut", True, False), ("compiled, cut", True, True)):
    ddp, looks[label] = one_step(compiled, cut)
    looks[label]["row"].update(label=label, stage=label)
lesson.say(
    f"ddp on {world_size} ranks, an MLP of {DEPTH} layers of {WIDTH}×{WIDTH} (1 MiB of float32 weights each) and "
    f"a head, buckets of {CAP:g} MiB, two micro-batches a step; compiled with the {BACKEND} backend."
)
lesson.say(
    f"This machine: {os.cpu_count()} cores, shared by both ranks, gloo's threads and every other process; the "
    "1-minute load average when each profiled step ended: "
    + each({label: v["load"] for label, v in looks.items()}, unit="", digits=1)
    + "."
)
lesson.say(
    "The first step of the compiled MLP with the cut, which compiles it, took "
    f"{looks['compiled, cut']['first_step_s']:.1f} s "
    f"(eager's first step: {looks['eager']['first_step_s']:.2f} s)."
)


# %% [markdown]
# ## One step, three ways, on one time axis
#
# Each row is the profiled step of one way, rank 0, from its start to the black line where it ends:
# the forward (pale) and backward's nodes (blue) of each micro-batch (the first runs inside
# `no_sync()`, so only the second hands buckets over), a tick when a bucket was handed over, an
# orange bar for each message in flight, and the optimizer step (green). Blue shows when one of
# backward's nodes ran (eager: one node per operation; compiled: one per piece, after the loss's
# few eager ones). The `AccumulateGrad` nodes, where the reducer's hook hands buckets over (a claim
# below), are not blue. Bars that overlap, or lie closer together than a pixel (about a thousandth
# of the time axis), draw as one, and a bar shorter than a pixel does not show. The lengths are one
# step on the machine printed above, its cores shared with everything else that runs; the order of
# the events is what the cut changes, and what the claims below count.
#
# The cut is torch's design for GPUs, where backward's kernels run on the GPU while NCCL carries the
# buckets on a stream of its own. This notebook runs no GPU: what the cut does to a GPU step is not
# shown here.

# %%
# %%distributed
figure = lesson.picture(looks, "", rows=list(looks), title="ddp: eager, compiled without the cut, compiled with it")
if figure is not None:  # rank 0 draws: the legend in this notebook's words
    words = {
        "backward": "backward's nodes",
        "handed to the wire": "handed over",
        "collective in flight (its waits included)": "in flight (gloo's all_reduce range)",
    }
    for text in figure.axes[0].get_legend().get_texts():
        text.set_text(words.get(text.get_text(), text.get_text()))
after = {label: v["matmuls_after_first_handover"] for label, v in looks.items()}
# orders of events on the training thread (program order), not timings: they hold on any machine
lesson.claim(
    after["compiled, no cut"] == 0,
    "Compiled without the cut, no backward matrix multiply (aten::mm) began after the first bucket was handed over: "
    "every bucket is handed over after backward's matrix multiplies.",
)
lesson.claim(
    after["compiled, cut"] > 0 and after["eager"] > 0,
    "Compiled with the cut, as eager, backward matrix multiplies began after the first bucket was handed over: a "
    "message can again travel while backward computes.",
)
# the reducer's hook runs in each parameter's AccumulateGrad node, after the gradient is accumulated
lesson.claim(
    all(all(v["inside_accumulate"]) for v in looks.values()),
    "In every way each bucket was handed over inside an AccumulateGrad node, where the reducer's hook runs.",
)
lesson.claim(
    all(torch.equal(v["params"], looks["eager"]["params"]) for v in looks.values()),
    "The three trainings end with the same parameters, to the bit (aot_eager computes with eager's aten ops).",
)
# a time measured in one step on a shared machine: said, never asserted (the load can change it)
lesson.say(
    "In flight while backward computed: "
    + each({label: v["in flight while backward computed, ms"] for label, v in looks.items()}, digits=1)
    + "."
)

# %% [markdown]
# ## Where the cuts fall
#
# The pieces are visible to autograd: each is a `CompiledFunctionBackward` node, and the parameters
# whose gradients it produces hang off it (their `AccumulateGrad` nodes). Walking the graph of one
# forward from its output lists them, in the order backward runs them. Beside them, the buckets of
# `ddp` (`bucket_plan`, rebuilt after the first step from the order gradients arrived in, each bucket
# listing its parameters in that order). A compiled piece produces all its gradients at its end,
# so within a piece that order is the autograd engine's order of its `AccumulateGrad` nodes, not the
# layers' order. A bucket closes at the first gradient that takes it to the cap or past it; a piece is cut between
# operations, so a layer's weight and bias share a piece, and a piece can fill more than one bucket.


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
    cut = pieces(ddp(torch.randn(32, WIDTH)))  # the training's shape
buckets = looks["compiled, cut"]["buckets"]
for i, piece in enumerate(cut):
    lesson.say(f"piece {i} (backward runs it {'first' if i == 0 else 'next'}): {', '.join(piece)}")
for i, bucket in enumerate(buckets):
    lesson.say(f"bucket {i}: {', '.join(bucket)}")
lesson.claim(
    len(cut) > 1 and sum(map(len, cut)) == sum(map(len, buckets)) == 2 * DEPTH + 2,
    f"The compiled graph is cut into {len(cut)} pieces, which together produce the gradients of all "
    f"{2 * DEPTH + 2} parameters, each once.",
)
piece_of = {name: i for i, piece in enumerate(cut) for name in piece}
homes = [sorted({piece_of[name] for name in bucket}) for bucket in buckets]
# bucket k's parameters all lie in one piece, in backward order: it is full when that piece's backward ends
lesson.claim(
    all(len(home) == 1 for home in homes) and [h[0] for h in homes] == sorted(h[0] for h in homes),
    "Every bucket lies within one piece, in backward order: each bucket's gradients are all there once the "
    "backward of its piece has ended.",
)
# program order on the training thread in the profiled step above: holds on any machine
ended, begun = (looks["compiled, cut"][key] for key in ("pieces_ended_at_handover", "pieces_begun_at_handover"))
lesson.claim(
    ended == begun == [home[0] + 1 for home in homes],
    "In the profiled step each bucket was handed over (its tick) after the backward of its piece ended and before "
    "the backward of the piece backward runs next began.",
)
size = {n.removeprefix("_orig_mod."): p.numel() * p.element_size() for n, p in ddp.module.named_parameters()}
shared = {i: [k for k, home in enumerate(homes) if home == [i]] for i in range(len(cut))}
lesson.say(
    f"{len(cut)} pieces, {len(buckets)} buckets. "
    + " ".join(
        f"Piece {i} fills buckets {', '.join(map(str, ks))}: bucket {ks[0]} closed at "
        f"{sum(size[name] for name in buckets[ks[0]])} bytes (the cap: {int(CAP * 2**20)} bytes)."
        for i, ks in shared.items()
        if len(ks) > 1
    )
)

# %% [markdown]
# ## Graph breaks
#
# The other pattern compiles the wrapper itself: `torch.compile(DDP(model))`. Dynamo then meets the
# wrapper's own Python first. A graph break is a place where Dynamo stops the graph, runs Python, and
# starts a new one. minddp's `ddp` runs its own lines eagerly and lets Dynamo compile only the
# module. Each wrapper is compiled around an MLP of two 1 MiB layers and the head, for one training
# step, and Dynamo counts the breaks.


# %%
# %%distributed
def breaks(wrap) -> int:
    """Dynamo's count of graph breaks in one training step of ``torch.compile(wrap(MLP(depth=2)))``."""
    torch._dynamo.reset()
    counters.clear()
    model = MLP(depth=2)  # two layers compile sooner than eight
    compiled = torch.compile(wrap(model), backend=BACKEND)
    train_step(compiled, torch.optim.SGD(model.parameters(), lr=0.01), next(batches()), loss_fn)
    return sum(counters["graph_break"].values())


counts = {
    "the MLP alone": breaks(lambda m: m),
    "minddp's ddp": breaks(lambda m: DistributedDataParallel(m, bucket_cap_mb=CAP)),
    "torch's DDP": breaks(lambda m: torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=CAP)),
}
lesson.say(
    f"Graph breaks in one step of torch.compile(wrapper(MLP(depth=2))), bucket_cap_mb={CAP:g}: "
    + ", ".join(f"{k} {v}" for k, v in counts.items())
)
lesson.claim(counts["minddp's ddp"] == counts["the MLP alone"], "minddp's ddp adds no graph break to the model's own.")
lesson.claim(
    counts["torch's DDP"] > counts["the MLP alone"], "torch's DDP, compiled whole, adds graph breaks to the model's."
)

# %% [markdown]
# ## Buckets below 1 MiB
#
# Dynamo's cut makes its first piece 1 MiB (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`) and
# asserts when the cap is below it. minddp gives Dynamo the first piece itself (its own
# first bucket: the cap, when one is given) around the module it wraps. Each wrapper, both ways (the
# model compiled, then wrapped; the wrapper compiled), at 0.5 MiB on an MLP of two 1 MiB layers and
# the head, one training step each; a refusal is printed with the torch file that raised it:


# %%
# %%distributed
SMALL = 0.5  # MiB
TORCH = os.path.dirname(os.path.dirname(torch.__file__))  # file paths are said from torch's own folder


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
    except Exception as error:  # what torch raises, said in one line, with the file of torch's that raised it
        where = os.path.relpath(traceback.extract_tb(error.__traceback__)[-1].filename, TORCH)
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0]} (raised in {where})"
    return "trained a step"


wrappers = {"torch's DDP": torch.nn.parallel.DistributedDataParallel, "minddp's ddp": DistributedDataParallel}
ways = {"the model compiled, then wrapped": True, "the wrapper compiled": False}
small = {(who, way): compile_at(wrapper, first) for who, wrapper in wrappers.items() for way, first in ways.items()}
for (who, way), outcome in small.items():
    lesson.say(f"{who}, {way}, bucket_cap_mb={SMALL:g}: {outcome}")
refused = "AssertionError: First bucket"
lesson.claim(
    all(
        small["torch's DDP", way].startswith(refused) and "(raised in torch/_dynamo/" in small["torch's DDP", way]
        for way in ways
    ),
    "At a cap below Dynamo's 1 MiB first piece torch's DDP does not compile, either way: Dynamo's code asserts.",
)
lesson.claim(
    all(small["minddp's ddp", way] == "trained a step" for way in ways),
    "minddp's ddp trains a step there, either way.",
)

# %% [markdown]
# ## What to take away
#
# * Compile the model, then wrap it (`model = torch.compile(model)`, then the stage): minddp's
#   `ddp` has Dynamo cut the compiled graph into pieces, each bucket lies within one piece, and it is
#   handed over before the next piece's backward begins, so a message can travel beside backward's
#   compute again (the claims above). `tests/test_compile.py` checks the same order of events for
#   `zero2` around a compiled model and for the bucketed teaching stages built for a compiled model.
# * `torch.compile(ddp)` trains too, and adds no graph break to the model's own (*Graph breaks*),
#   where torch's DDP, compiled whole, adds breaks.
# * Below 1 MiB buckets torch's DDP does not compile (the runs above, at 0.5 MiB); minddp's `ddp`
#   trains, either way.
# * The train command and the benchmark take `--compile` (`--compile-backend aot_eager` for quick
#   runs). `docs/ddp.md` (*Compiled*) gives the details, the limits and why minddp uses Dynamo's
#   cut rather than compiled autograd.

# %%
# %dist_shutdown
