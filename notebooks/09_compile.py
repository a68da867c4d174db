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
# # 09 · Compiled: `torch.compile` with DDP
#
# Autograd runs the backward pass as *nodes* of two kinds. A parameter's `AccumulateGrad` node adds its gradient
# into the parameter's `.grad`; `ddp` (minddp's `DistributedDataParallel`) hooks its *reducer* in there, which groups
# the gradients into *buckets* and averages each bucket over the ranks with one `all_reduce`. A bucket closes at the
# gradient that takes it to the *bucket cap* or past it. Every other node is a *gradient node*: it
# computes gradients (the model's nodes, and the loss's).
#
# A bucket is *handed over* (the tick in the figure) when the reducer calls `all_reduce` on it, once its last gradient
# is there and every earlier bucket has been handed over: buckets are numbered from 0 in that order. A bucket's
# `all_reduce` can run while gradients are still computed only if a gradient node ends after its hand-over; this
# notebook checks that order, not whether the `all_reduce`s did.
#
# nanoGPT's *pattern* is to compile the model, then wrap it: `model = torch.compile(model)`, then `DDP(model)`.
# `torch.compile` has two parts: *Dynamo* captures the model's Python as a *graph*, and a *backend* compiles the
# graph. Compiled as one graph, the model records one gradient node for its whole forward, producing every gradient
# at its end, so every bucket is handed over when no gradient node is left to run.
#
# With the cut on (`torch._dynamo.config.optimize_ddp`, on by default; more conditions below), while `ddp` runs its
# module compiled, Dynamo's `DDPOptimizer` **cuts the graph into pieces** and compiles each piece apart, each with a
# gradient node of its own; uncut, the graph is one piece. The backward pass runs piece after piece, numbered here in
# that order: piece 0 holds the forward's last layers; a *piece's backward* is the run of its gradient node. A bucket
# whose last gradient a piece produces can then be handed over before the next piece's backward begins.
#
# `ddp` *rebuilds* its buckets once, in step 2, filling them in the order the gradients arrived in step 1. The figure
# shows step 3's backward pass, with neither a compile nor a rebuild in it, in three runs:
# eager (not compiled), compiled without the cut (`optimize_ddp = False`) and compiled with it. The model: an MLP of
# 1 MiB layers without biases; the backend: `aot_eager` (torch's own kernels).

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import torch._dynamo
from torch import nn

from minddp import DistributedDataParallel
from minddp.notebook import lesson, lesson_09, nodes

WIDTH, DEPTH, CAP_MIB, BACKEND = 512, 8, 2.0, "aot_eager"  # 1 MiB layers, buckets of 2 MiB


class MLP(nn.Module):
    def __init__(self, depth: int = DEPTH):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x


def batches():
    generator = torch.Generator().manual_seed(rank)  # each rank its own shard
    while True:
        yield [torch.randn(32, WIDTH, generator=generator)]  # one batch of 32 samples a step


def loss_fn(model, x):
    return model(x).square().mean()


def one_step(compiled: bool, cut: bool = True):
    """ddp on a fresh MLP, compiled or not (the cut on or off): its third training step, profiled."""
    torch._dynamo.reset()  # every MLP shares Dynamo's compiled code (one class): compile each run anew, its cut too
    torch._dynamo.config.optimize_ddp = cut
    model = MLP()
    ddp = DistributedDataParallel(torch.compile(model, backend=BACKEND) if compiled else model, bucket_cap_mb=CAP_MIB)
    view = lesson_09.third_step(ddp, model, batches(), loss_fn)  # the step's autograd nodes and hand-overs
    torch._dynamo.config.optimize_ddp = True  # back to the default
    return ddp, view


assert torch._dynamo.config.optimize_ddp is True  # the cut is on by default
NO_CUT, CUT = "compiled without the cut", "compiled with the cut"
looks, ddps = {}, {}
for label, compiled, cut in (("eager", False, True), (NO_CUT, True, False), (CUT, True, True)):
    ddps[label], looks[label] = one_step(compiled, cut)
    n = looks[label]["pieces_run"]
    pieces = f"{n} piece{'s' * (n > 1)}, " if compiled else ""  # uncut, the graph is one piece
    # the figure's row label, two lines: the run; its pieces (if compiled) and its buckets (one tick each)
    looks[label]["row"].update(label=f"{label}\n{pieces}{looks[label]['calls']} buckets", stage=label)
# per step: the frames Dynamo compiled, and whether ddp rebuilt its buckets (in arrival order, after the first step)
lesson.claim(
    all(v["compiled"][2] == 0 and v["rebuilt"] == [False, True, False] for v in looks.values()),
    "In each run, step 2 rebuilt ddp's buckets; step 3 had no rebuild, no Dynamo compile.",
)


# %% [markdown]
# ## The backward pass of each run
#
# Read it for orders, not timings: nothing here measures why a bar or gap has its length. Pale, where no bar covers a
# row, is the loss's nodes and time between nodes. Each green span, edged dark, is one AccumulateGrad node. In one with
# a tick, the reducer's hook copies the bucket's gradients into one buffer and scales them (`Reducer._launch`), then,
# at the tick, calls `all_reduce`, which queues the sum for gloo's thread and returns.
# Autograd runs one node at a time here: the next node (with the cut, the next piece's backward) starts once the hook
# returns. The reducer waits for the sums after the last node (`Reducer.wait_and_write_back`).

# %%
# %%distributed
title = (
    f"ddp on rank 0, buckets of {CAP_MIB:g} MiB: the third step's backward pass of each run, scaled to its own length"
)
nodes.picture(looks, title)  # rank 0 draws
# orders of events, not timings: without the cut every tick comes in an AccumulateGrad node, which runs once
# the graph's one gradient node, the last gradient node, has produced its gradient
after = {label: v["node_after_handover"] for label, v in looks.items()}  # per bucket: a gradient node ended after it
# autograd's order, not a timing: a bucket's last AccumulateGrad node runs before the next gradient nodes (with the
# cut, why: "The pieces and the buckets" below), and no gradient node is left after the last bucket's
lesson.claim(
    not any(after[NO_CUT])
    and all(after[label][:-1] == [True] * (len(after[label]) - 1) and not after[label][-1] for label in ("eager", CUT)),
    "A gradient node ended after each hand-over but the last with the cut and in eager; after none without it.",
)
# the reducer's hook runs in each parameter's AccumulateGrad node, after the gradient is accumulated
lesson.claim(
    all(all(v["inside_accumulate"]) for v in looks.values()),
    "Every hand-over came inside an AccumulateGrad node.",
)


# %% [markdown]
# ## The pieces and the buckets
#
# Each piece records one gradient node, `CompiledFunctionBackward`. The cell lists the cut run's pieces (of one more
# forward) in backward order, each as its layers in forward order.
#
# Dynamo cuts only if torch's DDP's class attribute `_active_ddp_module` is set when it compiles (torch's DDP sets it);
# it reads the bucket cap from it and caps piece 0 at the global `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`. While
# its module runs compiled, minddp's `ddp` sets the attribute to a stand-in holding its bucket cap, and the global to
# that cap (`compat.ddp_optimizer_caps`), so piece 0 closes where bucket 0 does.
#
# Why a bucket is handed over before the next piece's backward: when the piece's gradient node ends, its gradients'
# `AccumulateGrad` nodes and the next piece's gradient node are all ready to run, and autograd's queue of ready
# nodes runs first the node of highest *sequence number* (the forward numbers the nodes it records in order); an
# `AccumulateGrad` node's is set to the largest there is (`torch/csrc/autograd/node.h`). Among nodes of one number, the
# queue, a heap (`engine.h`), keeps its own order, not the layers': uncut, the eight AccumulateGrad nodes, ready
# together when the one gradient node ends, fill the buckets in the heap's order, in step 3 as in step 1 (asserted
# below). The cell prints each run's buckets' layers in arrival order.


# %%
# %%distributed
from itertools import accumulate

ddp = ddps[CUT]
with ddp.no_sync():  # no_sync(): the reducer expects no gradients from this forward, whose backward never runs
    pieces = nodes.compiled_pieces(ddp(torch.randn(32, WIDTH)), ddp.module)  # the training's shape
buckets = looks[CUT]["buckets"]
for i, piece in enumerate(pieces):
    lesson.say(f"piece {i}: {', '.join(piece)}")
size = nodes.parameter_bytes(ddp.module)  # each parameter's bytes, by its name in the model
# bucket i and piece i hold the same parameters, every parameter once, each bucket at the cap
same = len(pieces) > 1 and [sorted(b) for b in buckets] == [sorted(p) for p in pieces]
lesson.claim(
    same
    and sorted(sum(buckets, [])) == sorted(size)
    and all(sum(size[n] for n in b) == CAP_MIB * 2**20 for b in buckets),
    f"Bucket i holds piece i's gradients: {CAP_MIB:g} MiB, the bucket cap.",
)
runs = {label: looks[label]["pieces_run"] for label in (NO_CUT, CUT)}
lesson.claim(
    runs == {NO_CUT: 1, CUT: len(pieces)},
    "One CompiledFunctionBackward node ran per piece.",
)
# an order autograd keeps (a ready AccumulateGrad node runs first: markdown above), not a timing
ended, begun = (looks[CUT][key] for key in ("pieces_ended_at_handover", "pieces_begun_at_handover"))
lesson.claim(
    ended == begun == list(range(1, len(buckets) + 1)),  # bucket i: after piece i ended, before piece i + 1 began
    "Bucket i was handed over after piece i's backward ended, before any later piece's began.",
)
# each run's buckets, in hand-over order, each as its layers' numbers in step 1's arrival order; uncut, compared with
# eager's (with the cut, the claim below compares)
layers = {label: lesson_09.layer_numbers(v["buckets"]) for label, v in looks.items()}
pairs = {label: [set(g) for g in groups] for label, groups in layers.items()}  # each bucket's layers, in any order
for label, groups in layers.items():
    note = "" if label != NO_CUT else "; eager's layers" if pairs[label] == pairs["eager"] else "; not eager's layers"
    lesson.say(f"{label}, buckets 0 to {len(groups) - 1}: layers {', '.join(map(str, groups))}{note}")
# autograd's order, not a timing: a ready AccumulateGrad node runs first (markdown above), in eager after its layer's
# gradient node, with the cut after its piece's
# uncut, step 3 handed bucket i over once its AccumulateGrad nodes had run exactly buckets 0 to i's layers (an order)
row = looks[NO_CUT]["row"]
assert [sum(start <= t for start, _ in row["accumulate"]) for t in row["sent"]] == list(accumulate(map(len, buckets)))
lesson.claim(pairs[CUT] == pairs["eager"], "With the cut, each bucket held eager's layers (as a set).")

# %% [markdown]
# ### Your turn: after which piece is each bucket handed over?
#
# Write `my_handed_over_after(pieces, cap)`: `pieces` lists pieces in the order the backward pass runs them, each as its
# gradients' sizes in bytes in the order they arrive; `cap` is the bucket cap in bytes, every bucket's, the first
# included. Pieces and gradients are any sizes, empty and 0 bytes too, not only those a cut at `cap` makes, so a bucket
# can take gradients from several pieces. Fill the buckets in arrival order (the gradients left at the end make one
# last bucket) and return, for each bucket, the index of the piece after whose backward it is handed over. On this
# notebook's step, four pieces of two 1 MiB gradients at `cap = 2 * 2**20`, the answer is `[0, 1, 2, 3]`.

# %%
from minddp.exercises import check_handover


def my_handed_over_after(pieces, cap):
    # Your turn: walk the gradients in order, close a bucket at the cap or past it, note its piece.
    raise NotImplementedError("one piece index per bucket")


check_handover(my_handed_over_after)

# %% [markdown]
# Stuck? A checked model answer is in the collapsed cell below.

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions
from minddp.notebook.source import show_source

show_source(solutions.handed_over_after)
print(check_handover(solutions.handed_over_after))

# %% [markdown]
# ## A bucket cap of 0.5 MiB, with either pattern
#
# Under torch's DDP, DDPOptimizer's cap for piece 0 must not be above the bucket cap. The cell tries each wrapper at a
# bucket cap below it, on an MLP of two 1 MiB layers, with each pattern: nanoGPT's and `torch.compile(DDP(model))`. At a
# *graph break* Dynamo ends a graph, runs Python and starts a new one; Dynamo's cut into pieces is not a graph break.
# Printed: the error raised (its "bucket" is Dynamo's piece), or a step's graph breaks and one more forward's pieces;
# each step is checked against one eager `ddp` step on the same model and batch, up to rounding from another summing
# order.


# %%
# %%distributed
import logging

logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # no warning that it ignores torch DDP's profiler range
SMALL_MIB = 0.5
torch_first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / 2**20  # MiB: Dynamo's piece 0 under torch's DDP
wrappers = {"torch's DDP": torch.nn.parallel.DistributedDataParallel, "minddp's ddp": DistributedDataParallel}
# each wrapper with each pattern: one training step on MLP(depth=2), printed; what the claims check, returned
theirs, ours = (
    lesson_09.both_patterns(who, wrapper, lambda: MLP(depth=2), next(batches()), loss_fn, SMALL_MIB, BACKEND)
    for who, wrapper in wrappers.items()
)
cut_file = "torch/_dynamo/backends/distributed.py"  # where Dynamo's DDPOptimizer, the cut, lives
lesson.claim(
    torch_first > SMALL_MIB and theirs["raised"] == [("AssertionError", cut_file)] * 2,
    f"Torch's DDP took no step at {SMALL_MIB:g} MiB, below DDPOptimizer's {torch_first:g} MiB cap for piece 0: "
    "Dynamo's cut raised.",
)
lesson.claim(
    ours["breaks"] == [0, 0] and min(ours["pieces"]) > 1 and ours["apart"] <= ours["bound"],
    f"minddp's ddp took one step with either pattern, cut in pieces without a graph break; "
    f"its parameters matched eager's {ours['near']}.",
)


# %% [markdown]
# ## What to take away
#
# * The model compiled, then wrapped (nanoGPT's pattern): with the cut, as in eager, a gradient node ended after each
#   bucket's hand-over but the last, the order those buckets' `all_reduce`s need to run
#   while gradients are still computed; without it, none did. With the cut, each bucket held eager's layers; uncut,
#   the layers autograd's heap ran in a row, in step 3 as in step 1.
#
# * At a bucket cap of 0.5 MiB, torch's DDP took no step with either pattern: Dynamo's cut raised, as DDPOptimizer's
#   cap for piece 0 is above the bucket cap. minddp's `ddp`, which sets that cap to its bucket cap, took one step with
#   both, cut in pieces without a graph break.

# %%
# %dist_shutdown
