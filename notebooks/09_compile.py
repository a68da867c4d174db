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
# builds them around a compiled model.
#
# This notebook shows one step of `ddp` three ways on one time axis, eager, compiled without the
# cut and compiled with it; then where the cuts fall; then the graph breaks. The model is a small
# MLP of our own class (eight 1 MiB layers), not the shared workload: compiling it takes seconds on
# a CPU where the Llama takes minutes, and its layers make the pieces easy to name. The backend is
# `aot_eager`: the graph is traced and cut as with Inductor, then run as eager, so all three
# trainings give the same bits.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from minddp import DistributedDataParallel
from minddp.analysis import live
from minddp.ladder.loop import train_step
from minddp.notebook import lesson

WIDTH, DEPTH, CAP, BACKEND = 512, 8, 2.0, "aot_eager"  # 1 MiB weights, buckets of 2 MiB


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
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
    for _ in range(2):  # the first compiles; the second runs on the plan rebuilt from the first's order
        train_step(ddp, optimizer, next(data), loss_fn)
    with live.profiler() as prof:
        train_step(ddp, optimizer, next(data), loss_fn)
    torch._dynamo.config.optimize_ddp = True
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    first_send = next(e.time_range.start for e in events if e.name == live.CALL)
    view = live.step_view(prof)
    view["matmuls_after_first_send"] = sum(e.name == "aten::mm" and e.time_range.start > first_send for e in events)
    # backward as the computing nodes only (a compiled piece is one): not the AccumulateGrad nodes after them,
    # where the reducer's hooks copy gradients into buckets and send them
    t0 = min(e.time_range.start for e in events if e.name == "minddp.forward_backward")
    view["row"]["backward"] = [
        ((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3)
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and "AccumulateGrad" not in e.name
    ]
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

# %% [markdown]
# ## One step, three ways, on one time axis
#
# Each row is the profiled step of one way, rank 0: the forward (pale) and backward (blue) of each
# micro-batch (the first runs inside `no_sync()`, so only the second sends), a tick when a bucket
# was handed to the wire, a bar while gloo ran its `all_reduce`, then the optimizer step (green).
# Backward is drawn where it computes: eager, node after node; compiled, one bar per compiled piece.
# The gaps between them are the `AccumulateGrad` nodes, where the reducer's hooks copy gradients
# into buckets and send full ones. The lengths of the bars are one step of a shared 2-core CPU;
# the order of the events is what the cut changes, and what the sentences below count.

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
lesson.claim(same, "The three trainings end with the same parameters, to the bit (aot_eager runs eager's operations).")

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
# bucket k's parameters all lie in pieces 0 to k: it is full when piece k's backward ends (docs/ddp.md, Compiled)
lesson.claim(
    all(set(bucket) <= set(sum(cut[: k + 1], [])) for k, bucket in enumerate(buckets)),
    "Every bucket k is full once the backward of piece k has ended: pieces and buckets are cut at the same "
    f"size ({CAP:g} MiB), the first included, so bucket k leaves before piece k + 1 computes.",
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
# ## What to take away
#
# * Compile the model, then wrap it (`model = torch.compile(model)`, then the stage): minddp's
#   `ddp` (and `zero1`, `zero2`) cut the compiled graph where their buckets fill, so buckets leave
#   during backward as in eager. `torch.compile(ddp)` works too. The teaching stages `bucket` and
#   `bucket-async` do the same when built by name (`minddp.ladder.build_stage`, as `--compile` does)
#   or passed through `compile_ready`; their own files stay free of it.
# * The per-parameter stages (`hook`, `hook-async`) ask for no cut: compiled, their gradients
#   arrive at the end of backward. `fsdp` is not compiled (its hooks gather every unit).
# * Below 1 MiB buckets torch refuses to compile its DDP; minddp cuts there too.
# * The train command and the benchmark take `--compile` (`--compile-backend aot_eager` for quick
#   runs). `docs/ddp.md` (*Compiled*) gives the details, the limits and why minddp uses Dynamo's
#   cut rather than compiled autograd.

# %%
# %dist_shutdown
