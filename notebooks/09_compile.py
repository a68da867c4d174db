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
# # 09 · Compiled: `torch.compile` and sending during backward
#
# Practitioners compile their model, most often as nanoGPT does: `model = torch.compile(model)`,
# then `DDP(model)`. Compiling changes what backward looks like to autograd: the compiled forward
# is *one* autograd node, and so is its backward, which hands over every gradient at its very end.
# A bucket can only be sent once its last gradient is there, so with one compiled backward no
# bucket is handed over before all of backward's compute is done, and no message can travel while
# backward computes: what the ladder built up from `hook-async` on (`03_build_up`) is gone.
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
# cut and compiled with it; then where the cuts fall; then the graph breaks; then buckets below
# 1 MiB. The model is a small MLP of our own class (eight 1 MiB layers), not the shared workload:
# its layers make the pieces easy to name, and compiling it costs one first step (the cell after
# the one that starts the ranks prints how long it took here). The backend is `aot_eager`: the graph is traced and cut as
# with Inductor, then run with eager's own aten operations, fused into none (Inductor's kernels
# would fuse them), so all three trainings give the same bits, and compiling is not meant to make
# the step faster here.
#
# Two measures of `docs/analysis.md` appear below, and one of this notebook's own, named apart:
# *in flight* (the time gloo's `all_reduce` ranges ran, their waits for the other rank and for a
# core included), *overlap* (the share of the time in flight during which the training thread ran
# an `aten::` op, any op) and *backward overlap* (the share of the time in flight during which
# backward computed: the same function, `metrics.overlap_pct`, with backward's computing nodes as
# the compute). The ladder's idea, and what compiling takes away, is the backward overlap.

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


def phases(row, computing) -> dict:
    """Each phase of a step row: ``name -> (ms, whether a message was in flight during it)``. A backward runs from its
    first computing node to its last (``computing``, one span per micro-batch: the blue bars and the gaps between
    them); "after backward" from there to the optimizer step (the last AccumulateGrad nodes, where the reducer copies
    gradients into buckets and hands them over, and the wait for the last messages)."""
    (f1, f2), (b1, b2), optimizer = row["forward"], computing, row["optimizer"][-1]
    spans = {"forward 1": f1, "backward 1": b1, "forward 2": f2, "backward 2": b2}
    spans.update({"after backward": (b2[1], optimizer[0]), "optimizer": optimizer})
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
    view.update(trace_measures(prof), first_step_s=first_step_s)
    view["matmuls_after_first_send"] = sum(e.name == "aten::mm" and e.time_range.start > sends[0] for e in events)
    view["matmuls"] = sum(e.name in ("aten::mm", "aten::addmm") for e in events)
    view["aten_ops"] = sum(e.name.startswith("aten::") for e in events)
    # the compiled pieces' backward in the second micro-batch (the first runs inside no_sync: nothing is sent)
    micro = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "minddp.forward_backward")
    nodes = [
        (e.time_range.start, e.time_range.end) for e in events if e.name == PIECE and e.time_range.start > micro[-1][0]
    ]
    view["pieces"] = len(nodes)
    view["pieces_ended_at_send"] = [sum(end <= t for _, end in nodes) for t in sends]
    view["pieces_begun_at_send"] = [sum(start <= t for start, _ in nodes) for t in sends]
    # backward as the computing nodes only (a compiled piece is one): not the AccumulateGrad nodes after them,
    # where the reducer's hooks copy gradients into buckets and send them
    computing = [
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and "AccumulateGrad" not in e.name
    ]

    def ms(start, end):
        return (start - micro[0][0]) / 1e3, (end - micro[0][0]) / 1e3

    view["row"]["backward"] = [ms(s, e) for s, e in computing]
    spans = [[(s, e) for s, e in computing if a <= s <= b] for a, b in micro]
    view["phases"] = phases(view["row"], [ms(min(s for s, _ in c), max(e for _, e in c)) for c in spans])
    view["backward overlap, %"] = metrics.overlap_pct(
        view["row"]["messages"], view["row"]["backward"], [(0.0, view["row"]["end"])]
    )
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
# was handed to the wire, an orange bar while gloo's `all_reduce` range ran (in flight: its waits for
# the other rank and for a core included, so not only time on the wire), then the optimizer step
# (green). Backward is drawn where it computes: eager, node after node; compiled, one bar per
# compiled piece. The gaps between them are the `AccumulateGrad` nodes: in the second micro-batch
# the reducer's hooks there copy gradients into buckets and send full ones; in the first they only
# add each gradient into `.grad`. The lengths of the bars are one step on the
# machine printed above, its cores shared with everything else that runs; the order of the events
# is what the cut changes, and what the claims below count.
#
# Above the figure, two tables. The first gives each way's step, the time its backward computed
# (the blue bars), and the three measures named at the top: *in flight* and *overlap*, read off the
# step's trace by the code of `python -m minddp.analyze`, and *backward overlap*, from the drawn
# row. They differ because overlap counts every `aten::` op of the training thread as compute:
# forward, backward, the optimizer and the reducer's copies into buckets alike. Without the cut,
# the first buckets travel while the reducer copies the later ones, so that step can show overlap
# with no backward beside its messages; the backward overlap counts backward's computing nodes only.
#
# The second table splits each step into phases: each forward; each backward, from its first
# computing node to its last (the blue bars and the gaps between them); *after backward*, from
# there to the optimizer step (the last `AccumulateGrad` nodes, with the reducer's copies and
# hand-overs, and the time until the last message is done); the optimizer step. A phase marked •
# had a message in flight during it; a phase with nothing in flight in two ways is where those two
# steps can be compared with the messages left out.
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
    + " (the rows of the figure)."
)
# orders of events on the training thread (program order), not timings: they hold on any machine
lesson.claim(
    after["compiled, no cut"] == 0,
    "Compiled without the cut, no bucket is handed over before the compiled backward is over: every gradient "
    "arrives at its end, and every message comes after backward's compute.",
)
lesson.claim(
    after["compiled, cut"] > 0 and after["eager"] > 0,
    "Compiled with the cut, as eager, the first bucket is handed over while backward still has matrix multiplies "
    "to run: a message can again travel while backward computes.",
)
same = all(torch.equal(v["params"], looks["eager"]["params"]) for v in looks.values())
lesson.claim(
    same, "The three trainings end with the same parameters, to the bit (aot_eager computes with eager's aten ops)."
)
drawn = sum(len(v["row"]["finish"]) for v in looks.values())
lesson.say(
    f"finish_gradient_synchronization took at most {max(v['finish_ms'] for v in looks.values()):.2f} ms in any of "
    + (
        "the three: under 1 % of a step, too short to see, so not drawn."
        if not drawn
        else f"the three; drawn in purple where it lasted 1 % of its step or more ({drawn} bar(s)). In ddp the "
        "end-of-backward callback has already waited for the messages, so this call finds nothing left to wait for: "
        "its length is the machine's load, not a sync."
    )
)

table = {
    label: {
        "step, ms": v["row"]["end"],
        "backward computing, ms": metrics.length(v["row"]["backward"]),
        "in flight, ms": v["in flight, ms"],
        "overlap, %": v["overlap, %"],
        "backward overlap, %": v["backward overlap, %"],
    }
    for label, v in looks.items()
}
lesson.say(pd.DataFrame(table).T.round(1).to_string())
bo = {label: v["backward overlap, %"] for label, v in looks.items()}
lesson.say(
    f"Backward overlap: eager {bo['eager']:.0f} %, compiled without the cut {bo['compiled, no cut']:.0f} %, with it "
    f"{bo['compiled, cut']:.0f} % of the time in flight"
    + (
        ": the cut brought back messages travelling beside backward's compute, which compiling without it took away."
        if bo["compiled, cut"] > 0 and bo["compiled, no cut"] == 0
        else ": in this run gloo did not start a message while the cut's backward still computed (a gloo thread "
        "waits for a core like every other), so the handed-over order above did not become backward overlap here."
        if bo["compiled, cut"] == 0
        else "."
    )
)
lesson.say("\nEach phase of the step, ms (• a message was in flight during it):")
marked = {
    label: {name: f"{ms:.1f}{' •' if busy else ''}" for name, (ms, busy) in v["phases"].items()}
    for label, v in looks.items()
}
lesson.say(pd.DataFrame(marked).T.to_string())

# timings of one step on a shared machine: said from the run, never asserted (the load can reorder them)
NAMES = {"eager": "eager", "compiled, no cut": "compiled without the cut", "compiled, cut": "compiled with the cut"}


def each(values: dict, unit: str = "ms", digits: int = 0) -> str:
    """``values`` (one per way) in words: "eager 602, compiled without the cut 1699, compiled with the cut 849 ms"."""
    return ", ".join(f"{NAMES[label]} {x:.{digits}f}" for label, x in values.items()) + f" {unit}".rstrip()


step = {label: v["row"]["end"] for label, v in looks.items()}
order = sorted(step, key=step.get)
matmuls, ops = ({label: v[key] for label, v in looks.items()} for key in ("matmuls", "aten_ops"))
lesson.say(
    "\nSteps, shortest first: "
    + each({label: step[label] for label in order})
    + f" (one profiled step each, the three ways one after the other, at load {os.getloadavg()[0]:.1f}). "
    + (
        f"Every way ran the same {matmuls['eager']} matrix multiplies"
        if len(set(matmuls.values())) == 1
        else "The matrix multiplies: " + each(matmuls, unit="")
    )
    + "; aot_eager fuses none of them (Inductor would), and the compiled ways add work of their own: more aten ops ("
    + each(ops, unit="")
    + "), AOTAutograd's wrapper around each compiled piece, Dynamo's guards before each call. On a CPU nothing here "
    "is meant to make a compiled step shorter than eager's."
)
by_phase = {label: v["phases"] for label, v in looks.items()}


def where(a: str, b: str) -> str:
    """Where ``b``'s step differs from ``a``'s, phase by phase, largest first."""
    diff = {name: by_phase[b][name][0] - by_phase[a][name][0] for name in by_phase[a]}
    big = sorted(diff, key=lambda n: -abs(diff[n]))
    return ", ".join(f"{name} {diff[name]:+.0f}" for name in big[:3]) + (
        f"; the other {len(big) - 3} phases {sum(diff[n] for n in big[3:]):+.0f} ms together"
    )


lesson.say(
    f"Compiled without the cut against eager, by phase (ms): {where('eager', 'compiled, no cut')}. The optimizer step "
    "runs the same uncompiled SGD in all three ways and took "
    + each({label: x["optimizer"][0] for label, x in by_phase.items()}, digits=1)
    + "; the first forward, the same operations compiled or not, "
    + each({label: x["forward 1"][0] for label, x in by_phase.items()})
    + ": that is how far the same work moved between these three steps, taken at different moments of the "
    "machine's load. One step each cannot tell the compiled ways' own work from those swings."
)
c, w = by_phase["compiled, cut"], by_phase["compiled, no cut"]
quiet = [name for name in c if not c[name][1] and not w[name][1]]
q_cut, q_whole = (sum(x[name][0] for name in quiet) for x in (c, w))
(b_cut, _), (b_whole, _) = c["backward 2"], w["backward 2"]
(t_cut, _), (t_whole, _) = c["after backward"], w["after backward"]
pieces = looks["compiled, cut"]["pieces"], looks["compiled, no cut"]["pieces"]
flight = looks["compiled, cut"]["in flight, ms"], looks["compiled, no cut"]["in flight, ms"]
longer = step["compiled, cut"] - step["compiled, no cut"]
lesson.say(
    f"With the cut the step took {step['compiled, cut']:.0f} ms, against {step['compiled, no cut']:.0f} ms without "
    f"it. In the phases where neither had a message in flight ({', '.join(quiet)}) it took {q_cut:.0f} ms against "
    f"{q_whole:.0f} ms ({q_cut / q_whole:.2f}×): no message can be the cause there; the machine's load at the time "
    f"can, and so can the cut's own work ({pieces[0]} compiled pieces in a backward, each with its wrapper and "
    f"guards, against {pieces[1]}). The second backward, with the cut's messages in flight beside it, took "
    f"{b_cut:.0f} ms against {b_whole:.0f} ms ({b_cut / b_whole:.2f}×)"
    + (
        ", a larger ratio than the quiet phases': consistent with a send taking a core from backward (the "
        f"{os.cpu_count()} cores run both ranks' backward and gloo's threads), which one step on a loaded machine "
        "cannot tell from the load's swings"
        if b_cut / b_whole > q_cut / q_whole
        else ", no larger a ratio than the quiet phases': this run does not show the sends taking cores from backward"
    )
    + f". After backward's compute the step spent {t_cut:.0f} ms before its optimizer step, against {t_whole:.0f} ms "
    + (
        "without the cut: its messages were handed over earlier, yet the last ended further after backward's "
        f"compute (in flight {flight[0]:.0f} ms against {flight[1]:.0f} ms). An early message waits in gloo for the "
        "other rank to hand over the same bucket, and for a core; rank 0's trace alone cannot say which."
        if t_cut > t_whole
        else "without the cut: handed over earlier, its messages left less to wait for after backward's compute."
    )
)
lesson.say(
    f"So in this run the step with the cut was {abs(longer):.0f} ms {'longer' if longer > 0 else 'shorter'} than "
    f"without it, {abs(q_cut - q_whole):.0f} ms {'longer' if q_cut > q_whole else 'shorter'} in the phases where "
    "no message of either ran"
    + (": here the cut brought back the order of events (the claims above), not a shorter step." if longer > 0 else ".")
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
    cut = pieces(ddp(torch.randn(32, WIDTH)))  # the training's shape: Dynamo runs the compiled graph, no recompile
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
# count is the model's own. torch's DDP, compiled whole, breaks on its own code. Each wrapper is
# compiled around an MLP of two 1 MiB layers and the head (a break is in the wrapper's code, whatever
# the model's depth), for one training step.


# %%
# %%distributed
def breaks(wrap) -> int:
    """Dynamo's count of graph breaks in one training step of ``torch.compile(wrap(MLP(depth=2)))``."""
    torch._dynamo.reset()
    counters.clear()
    model = MLP(depth=2)  # a break is in the wrapper's code, not the model's depth: two layers compile sooner
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
#   `ddp` cuts the compiled graph where its buckets fill, so buckets are handed over during backward
#   as in eager and a message can travel beside backward's compute again (the claims above). The
#   cut restores that order of events; whether it shortens a step depends on the machine: on a GPU it
#   is expected to (NCCL on a stream of its own beside the compute), and on this notebook's shared
#   CPU the first section says what it did to the step in this run. `tests/test_compile.py` shows the
#   same order of events for `zero2` around a compiled model, and for the teaching stages `bucket`
#   and `bucket-async` built by name (`minddp.ladder.build_stage`, as `--compile` does) or passed
#   through `compile_ready`; their own files stay free of it.
# * `torch.compile(ddp)` trains too, and adds no graph break to the model's own (the count in
#   *Graph breaks*, at 2 MiB), where torch's DDP, compiled whole, breaks on its own code.
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
