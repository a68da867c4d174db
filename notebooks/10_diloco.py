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
# # 10 · Slow links: local SGD → DiLoCo → streaming DiLoCo
#
# Every rung so far sends a message every step. On a slow link that all_reduce can take longer than the
# step's compute. The rungs of this notebook **talk rarely**: each replica
# trains alone for H steps (its *inner* steps), then the replicas **sync**: they average what they
# learnt and each applies the result.
#
# 1. **Local SGD**: every H steps, average the weights (`minddp.LocalSGD`);
# 2. **DiLoCo** (Douillard et al., 2023, arXiv 2311.08105): every H steps, average the *pseudo-gradient* (the
#    synced weights, those all replicas agreed on at the last sync, minus the local ones), put the synced
#    weights back, and let an *outer* optimizer (SGD with Nesterov momentum) step with it (`minddp.DiLoCo`);
# 3. **Streaming DiLoCo** (Douillard et al., 2025, arXiv 2501.18512): the model in *fragments* that sync one
#    after another, each fragment's message handed over τ inner steps before the step that applies it; the
#    replica trains on from a mix of synced and local weights, α the local ones' share (notebook 01's α, a
#    hop's fixed cost, is here the link's *latency*).
#
# The task is the one *the bench* measures (`python -m minddp.bench.convergence`): language modelling of a
# Markov chain. Its **entropy floor** (the lowest loss any model can reach) is known exactly, and
# so is any model's **expected loss**: its cross-entropy over every context, each
# weighted by how often the chain is in it, with no evaluation noise. Two ranks, one replica
# each.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
import torch

from minddp import DiLoCo, LocalSGD
from minddp.bench.convergence import MarkovTask, build_student
from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.wire import Traffic, Wire
from minddp.notebook import lesson

torch.manual_seed(0)
task = MarkovTask()
chains = task.chains(seed=0, replica=rank, batch=32)  # each replica its own chains


def inner_step(model, inner):
    context, token = next(chains)
    inner.zero_grad()
    torch.nn.functional.cross_entropy(model(context), token).backward()
    inner.step()  # the slow-link rungs act right after it (a hook on the optimizer, defined below)


def apart(model) -> float:
    """The largest difference between this replica's weights and any other's, value by value (0: the same)."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    theirs = [torch.empty_like(mine) for _ in range(world_size)]
    torch.distributed.all_gather(theirs, mine)
    return float(max((t - mine).abs().max() for t in theirs))


lesson.say(f"the chain's entropy floor: {task.floor:.4f} nats")

# %% [markdown]
# ## Local SGD: weights every H steps
#
# `LocalSGD(model, optimizer, sync_every=H)` wraps an ordinary loop: a post-hook on the optimizer counts the
# steps and, after every H-th, averages the weights over the replicas. The sync goes through a comm hook: here
# `allreduce_hook` on `Wire(None, traffic=traffic)`,
# which all_reduces over the default process group and counts each call and the bytes of the tensor it was
# handed: the *payload*. A ring all_reduce on 2 ranks takes 2 *hops* (one rank handing a chunk to the other), each
# paying the link's latency once, and moves the payload once per rank.

# %%
# %%distributed
H = 10
model = build_student(seed=0)
inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
traffic = Traffic()  # counts the calls and the payload bytes handed to the all_reduce
rung = LocalSGD(model, inner, sync_every=H)
rung.register_comm_hook(Wire(None, traffic=traffic), allreduce_hook)  # one all_reduce of one flat bucket, metered
seen = {}
with rung:
    for step in range(1, 2 * H + 1):
        inner_step(model, inner)
        if step in (H - 5, H, 2 * H - 5, 2 * H):
            seen[step] = apart(model)
params = sum(p.numel() for p in model.parameters())
lesson.claim(
    all((diff == 0) == (step % H == 0) for step, diff in seen.items()),
    "between syncs the replicas' weights differ; right after each sync (steps 10 and 20) they are equal, every value",
)
lesson.claim(
    rung.syncs == 2 and traffic.calls == 2 and traffic.bytes == 2 * params * 4,
    f"in 20 steps local SGD sent 2 messages, each the whole model ({params} float32 values)",
)

# %% [markdown]
# ## DiLoCo: an outer optimizer on what the replicas learnt
#
# Averaging the weights is the same as taking the synced weights θ and stepping them by the replicas' average of
# `θ − local` with learning rate 1 and no momentum. DiLoCo gives that quantity, the **pseudo-gradient**, to a real
# optimizer, the outer one: SGD with Nesterov momentum (`DiLoCo`'s default: lr 0.7, momentum 0.9). Below,
# `diloco.py`'s own list of what it does (items 1 to 3), then the change from
# `local_sgd.py` for DiLoCo not streamed: `-` local SGD's lines, `+` diloco.py's (`average`: the averaged weights;
# `mean_pseudo`: the averaged pseudo-gradient):

# %%
import inspect

from minddp.diloco import diloco

doc = inspect.getdoc(diloco)
print(doc[doc.index("1. **synced") : doc.index("With outer SGD")].rstrip())
print(doc.split("a few left out::")[1].split("Example")[0].rstrip())

# %% [markdown]
# One run of local SGD and of DiLoCo on the two ranks, DDP beside them, from the same start
# on the same chains (300 steps, H = 10), and the payload each handed over:

# %%
# %%distributed
from minddp.bench.convergence import train_config

# train_config's inner optimizer: AdamW, its lr falling from lr to lr / 10 along a half cosine over the steps
runs = {name: train_config(name, task, seed=0, steps=300, batch=32, lr=3e-3, eval_every=100) for name in
        ("ddp", "local-sgd-h10", "diloco-h10")}  # fmt: skip
lesson.say("after 300 steps, payload bytes:")
for name, run in runs.items():
    lesson.say(f"{name:>14}: {int(run['bytes'][-1]):>10,}")
lesson.claim(
    runs["ddp"]["bytes"][-1] == 10 * runs["diloco-h10"]["bytes"][-1] == 10 * runs["local-sgd-h10"]["bytes"][-1],
    "with H = 10 both rungs send exactly 10 times fewer bytes than DDP",
)

# %% [markdown]
# The comparisons below are of the bench's means: 2000 steps on 4 replicas, 5 *seeds* (a seed: a start and
# chains that every run shares), its committed results (`docs/diloco/convergence.json`). Its
# runs: `ddp`; `single` (a quarter of the data, nothing sent); `local-sgd-hH` and `diloco-hH` (H = 10, 50, 100);
# `diloco-h100-lrL` (outer lr L; not plotted);
# `streaming-h100` (H = 100, 2 fragments, τ = 5, α = 0.5; its syncs are
# *fragment syncs*, one fragment's each, 2 every H steps). Each is trained as the run above and scored every 50
# steps by the expected loss of DDP's weights, local SGD's last average (before its first sync, rank 0's own
# weights), DiLoCo's synced weights (streaming DiLoCo: each fragment as of its last sync).
#
# The figure plots DDP and
# the runs at H = 10 and 100 against the steps (left) and the payload each replica handed over (right: the
# scores at 0 bytes left out), each a staircase: the run's last score by that step or payload.

# %%
import json
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from minddp.bench.convergence import build_student
from minddp.diloco.fragments import split_fragments
from minddp.notebook import lesson, lesson_10

results = json.loads(Path("../docs/diloco/convergence.json").read_text())
curves, floor = results["curves"], results["floor"]


def final(name):
    return [c["loss"][-1] for c in curves[name]]


def mean_of(name, key):  # the mean over the seeds at each score: "loss" or "bytes"
    return lesson_10.mean_over_seeds(curves, name, key)


# %% jupyter={"source_hidden": true}
# The figure and the lines under it (this cell's code collapsed).
plotted = [("ddp", "black"), ("local-sgd-h10", "tab:orange"), ("local-sgd-h100", "tab:orange"),
         ("diloco-h10", "tab:blue"), ("diloco-h100", "tab:blue"), ("streaming-h100", "tab:green")]  # fmt: skip
lesson_10.loss_against_steps_and_bytes(results, plotted)
plt.show()
spread = {n: (min(final(n)), max(final(n))) for n in curves}
sweep = sorted(n for n in curves if n.startswith("diloco-h100-lr"))  # DiLoCo at H = 100, other outer lrs
shown = ("ddp", "single", *(f"{r}-h{h}" for h in (10, 50, 100) for r in ("local-sgd", "diloco")), *sweep,
         "streaming-h100")  # fmt: skip
print("the final expected loss over the seeds: mean (lowest to highest)")
for name in shown:
    low, high = spread[name]
    print(f"{name:>17}: {statistics.mean(final(name)):.4f} ({low:.4f} to {high:.4f})")
steps = curves["ddp"][0]["step"]  # the scores' steps, the same in every run
payload, ddp_first = mean_of("ddp", "bytes")[1], mean_of("ddp", "loss")[1]  # DDP's first score after the start
within = {  # each plotted run that talks rarely, its last score with no more payload than that: (step, bytes, loss)
    n: max((s, b, lo) for s, b, lo in zip(steps, mean_of(n, "bytes"), mean_of(n, "loss")) if b <= payload)
    for n, _ in plotted[1:]
}


def sync_interval(n):  # the steps from one of run n's syncs to the next (fragment syncs for streaming)
    config = results["configs"][n]
    return config["sync_every"] // config.get("fragments", 1)


step_for_step = all(  # at every score after the start (step 0, where every run scores the same weights)
    all(d < lo for d, lo in zip(mean_of("ddp", "loss")[1:], mean_of(n, "loss")[1:])) for n in within
)
lesson.claim(
    ddp_first > max(lo for _, _, lo in within.values()) and step_for_step,
    f"by step {steps[1]} DDP has handed over {payload / 1e6:.2f} MB, its mean expected loss {ddp_first:.3f}; "
    f"with no more payload, each of the {len(within)} plotted runs that talk rarely gets below it: "
    + ", ".join(f"{n} {lo:.3f} (step {s})" for n, (s, _, lo) in within.items())
    + ". At every score after the start DDP's mean is below each of theirs",
)
early = {n: mean_of(n, "loss")[1] for n in ("local-sgd-h100", "diloco-h100")}  # step 50, before a sync
lesson.claim(
    all(lo["loss"][1] == one["loss"][1] for lo, one in zip(curves["local-sgd-h100"], curves["single"]))
    and all(d["loss"][1] == d["loss"][0] for d in curves["diloco-h100"]),
    f"at step {steps[1]}, before their first sync, local SGD at H = 100 scores rank 0's own weights "
    f"({early['local-sgd-h100']:.3f}, as `single`) and DiLoCo the untrained start ({early['diloco-h100']:.3f})",
)

# %% jupyter={"source_hidden": true}
# The claims the takeaway rests on (this cell's code collapsed).
ddp_bytes = statistics.mean(c["bytes"][-1] for c in curves["ddp"])

lesson.claim(
    all(
        round(ddp_bytes / statistics.mean(c["bytes"][-1] for c in curves[f"{r}-h{h}"])) == h
        for h in (10, 50, 100)
        for r in ("local-sgd", "diloco")
    ),
    "local SGD and DiLoCo each send H times fewer bytes than DDP",
)
gap = round(statistics.mean(final("diloco-h10")), 4) - round(statistics.mean(final("local-sgd-h10")), 4)  # as printed
paired = [d > lo for d, lo in zip(final("diloco-h10"), final("local-sgd-h10"))]  # seed by seed
lesson.claim(
    gap > 0 and len(paired) / 2 < sum(paired) < len(paired),  # the takeaway's "most seeds but not all"
    f"at H = 10 DiLoCo's final mean is {gap:.4f} nats above local SGD's, above in {sum(paired)} of {len(paired)} seeds",
)
lesson.claim(
    all(max(final(f"local-sgd-h{h}")) < min(final("single")) for h in (10, 50, 100)),
    "local SGD ends below one replica alone at every H, in every seed",
)
outer_lr = {n: results["configs"][n]["outer"]["lr"] for n in ("diloco-h100", *sweep)}  # from the file
lesson.claim(
    all(min(final(n)) > max(final("single")) for n in outer_lr),
    "but DiLoCo at H = 100 ends worse than one replica alone, in every seed, at every outer lr tried: "
    + ", ".join(
        f"{lr:g}" + " (diloco-h100)" * (n == "diloco-h100")
        for n, lr in sorted(outer_lr.items(), key=lambda item: item[1])
    ),
)
by_mean = sorted(outer_lr, key=lambda n: statistics.mean(final(n)))  # the outer lrs tried, lowest final mean first
best, rival = by_mean[0], (by_mean[1] if by_mean[0] == "diloco-h100" else "diloco-h100")  # against the default 0.7
apart_lr = spread[best][1] < spread[rival][0]  # every seed of the lowest below every seed of the other


def lr_of(n):  # the outer lr as printed, the default named
    return f"{outer_lr[n]:g}" + " (the default)" * (n == "diloco-h100")


lesson.say(
    f"of those, {lr_of(best)} ended lowest on average; "
    + (
        f"each of its seeds below each seed of {lr_of(rival)}"
        if apart_lr
        else f"its seeds' range overlaps that of {lr_of(rival)}, so these {len(final(best))} seeds do not order the two"
    )
)
higher = {r: round(statistics.mean(final(f"{r}-h100")), 4) - round(statistics.mean(final(f"{r}-h10")), 4)
          for r in ("diloco", "local-sgd")}  # fmt: skip
lesson.claim(
    all(all(d > lo for d, lo in zip(final(f"diloco-h{h}"), final(f"local-sgd-h{h}"))) for h in (50, 100))
    and higher["diloco"] > 5 * higher["local-sgd"] > 0,
    f"at H = 50 and 100 DiLoCo ends above local SGD in every seed; from H = 10 to 100 its mean final loss rises "
    f"far more: {higher['diloco']:.4f} nats, local SGD's {higher['local-sgd']:.4f}",
)
rare = [n for n in curves if n not in ("ddp", "single")]  # the file's runs that talk rarely, the lr sweep's too
closest = min(rare, key=lambda n: statistics.mean(final(n)))
streaming = results["configs"]["streaming-h100"]
tau, alpha = streaming["fragment_delay"], streaming["fragment_alpha"]  # the bench's names for τ and α
K = streaming["fragments"]
split = [sum(p.numel() * p.element_size() for p in f) for f in split_fragments(build_student(0), K)]  # bytes
share = [f"{100 * b / sum(split):.0f} %" for b in split]  # each fragment's share of the student's bytes
lesson.claim(  # a score every sync interval: between two scores, one fragment sync's bytes, the fragments in turn
    closest == "streaming-h100"
    and all(statistics.mean(final(n)) > statistics.mean(final("ddp")) for n in rare)
    and results["eval_every"] == sync_interval("streaming-h100")
    and all(
        [b - a for a, b in zip(c["bytes"], c["bytes"][1:])] == [split[i % K] for i in range(len(c["bytes"]) - 1)]
        for c in curves["streaming-h100"]
    ),
    f"of the file's {len(rare)} runs that talk rarely, streaming DiLoCo ends closest to DDP; it differs "
    f"from diloco-h100 in 3 settings: {K} fragments ({lesson.listed(share)} of the model), τ = {tau} and α = {alpha}",
)

rose = {  # each run's means: (step, rise) wherever a score is above the one before
    n: [(steps[i], b - a) for i, (a, b) in enumerate(zip(m, m[1:]), 1) if b > a]
    for n in curves
    for m in [mean_of(n, "loss")]
}
risen = [n for n in within if rose[n]]  # the plotted runs that talk rarely whose mean rose
lrs = sorted(sweep, key=lambda n: outer_lr[n])  # DiLoCo at H = 100, the other outer lrs
top = mean_of(lrs[-1], "loss")  # the highest outer lr's means: [0] the untrained start, [2] just after its first sync


def which(n, t):  # streaming-h100: the fragment whose turn ends at step t (its sync), named by its share
    return f" (its {share[(t - 1) // sync_interval(n) % K]} fragment)" if n == "streaming-h100" else ""


lesson.claim(  # a score every eval_every <= sync interval steps, so a score before a sync is of the weights it starts from
    all(results["configs"][n]["rung"] == "diloco" for n in risen)
    and {"diloco-h100", "streaming-h100"} <= set(risen)
    and all(rose[n] for n in lrs)
    and all(
        results["eval_every"] <= sync_interval(n) and t % sync_interval(n) == 0
        for n in (*risen, *lrs)
        for t, _ in rose[n]
    )
    and steps[2] == sync_interval(lrs[-1])
    and top[2] > top[0],
    f"of the {len(within)} plotted runs that talk rarely, only "
    + " and ".join(risen)
    + " had a mean that rose from one score to the next, as did DiLoCo's at every other outer lr; each rise is at a sync, "
    "scored on the synced weights, so that sync left them worse (step +nats): "
    + "; ".join(f"{n} " + ", ".join(f"{t} +{d:.3f}" + which(n, t) for t, d in rose[n]) for n in (*risen, *lrs))
    + f". At outer lr {outer_lr[lrs[-1]]:g} the first sync took the mean to {top[2]:.3f}, above the untrained "
    f"start's {top[0]:.3f}",
)


# %% [markdown]
# ### Your turn: DiLoCo's outer sync
#
# Write the sync DiLoCo runs after the H-th inner step, on every replica: `params` are the model's (local)
# weights, `synced` the weights of the last sync (copies), `outer` the outer optimizer over `params`. Average
# the pseudo-gradient over the replicas, put the synced weights back, let `outer` step, and keep the result as
# the new synced weights. `check_outer_sync` trains a small network on 2 real ranks with your sync and, once
# it passes there, again on 3.

# %%
import torch
import torch.distributed as dist

from minddp.exercises import check_outer_sync


def my_outer_sync(params, synced, outer):
    # Your turn: average (synced - local) over the ranks, put the synced weights back, outer.step(), keep them.
    raise NotImplementedError("average the pseudo-gradient, step the outer optimizer from the synced weights")


check_outer_sync(my_outer_sync)

# %% [markdown]
# Stuck? The model answer (`minddp.exercises.solutions.outer_sync`) and the checker's verdict on it, collapsed:

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions
from minddp.notebook.source import show_source

show_source(solutions.outer_sync)
print(check_outer_sync(solutions.outer_sync))

# %% [markdown]
# ## Streaming DiLoCo: each fragment sent τ steps early
#
# Streaming DiLoCo cuts the
# model into K fragments (`fragments=K`) that take turns: each fragment's *turn* is H/K steps, fragment 0's first,
# and it syncs once in its turn (K fragment syncs every H steps). A fragment is a run of whole
# tensors in the model's order, fragment i (from 0) closed once fragments 0 to i hold (i + 1)/K of the model, so
# one large tensor makes them unequal. Each fragment's pseudo-gradient leaves `fragment_sync_delay` (τ) inner steps
# *before* its turn ends; at the turn's end the
# outer step uses it, its result is kept as the new synced weights, and the replica goes on training from
# `(1 − α)·synced + α·local` (`fragment_update_alpha`). Here K counts fragments (06's K counted bytes of
# optimizer state per parameter). `diloco.py`'s items 4 to 6:

# %%
print(doc[doc.index("4. a fragment") : doc.index("The schedule, the signs")].rstrip())

# %% [markdown]
# Below, one rank's inner steps 9 to 24 under the profiler, over an emulated link of 5 Mbit/s and 5 ms per hop:
# H = 16, 2 fragments (turns of 8 steps: fragment 0's are steps 1 to 8 and 17 to 24, fragment 1's steps 9 to
# 16), τ = 6, α = 0.5. A message's time on the
# link is modeled: 2 hops, each paying the latency, plus its bytes at the bandwidth; it is delivered once the
# link's thread, asleep until that modeled end, wakes and takes the real all_reduce's result.
#
# Each inner step is its forward and backward (blue) and optimizer step (green: AdamW's update and a
# post-hook, which hands a fragment's pseudo-gradient to the link at a tall tick, applies one at a triangle, and
# elsewhere only counts the step; no line here rests on a green's width, a hand-over's included);
# white, none of these. Orange: a message's modeled transfer on the link, from its tick; red, and nothing else,
# the training thread waiting for one, drawn over its step's green.

# %%
# %%distributed
from minddp.analysis import live
from minddp.comm.link import Link
from minddp.ladder.loop import train_step

H, FRAGMENTS, TAU = 16, 2, 6
model = build_student(seed=0)
inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
link = Link("5mbit,5ms")  # an emulated link: each message's modeled transfer, logged
streamed = DiLoCo(  # no outer optimizer given: DiLoCo's default, SGD (lr 0.7, Nesterov momentum 0.9)
    model, inner, sync_every=H, fragments=FRAGMENTS, fragment_sync_delay=TAU, fragment_update_alpha=0.5
)
streamed.register_comm_hook(Wire(None, link=link), allreduce_hook)
big = task.chains(seed=1, replica=rank, batch=1024)  # 32 times the 32 chains above


def loss_fn(m, batch):
    return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])


WARM = H // FRAGMENTS  # steps 1 to 8, before the profiler: one turn
with streamed:
    for _ in range(WARM):
        train_step(model, inner, [next(big)], loss_fn)
    batches = [[next(big)] for _ in range(H)]  # sampled before the profiler: it records the steps alone
    with live.profiler() as prof:
        for batch in batches:  # H steps: each fragment is handed over once and applied once
            train_step(model, inner, batch, loss_fn)
link.close()
events = sorted(prof.events(), key=lambda e: e.time_range.start)
order = [e.name for e in events if e.name.startswith(("minddp.fragment_", "minddp.optimizer_step"))]

# %% jupyter={"source_hidden": true}
# %%distributed
# The figure (its code collapsed): the profiled steps' row, each hand-over and apply marked.
from minddp.notebook import lesson_10

view = live.step_view(prof, link)  # the row to draw
if rank == 0:
    fig = lesson_10.streaming_steps(
        dict(view["row"], label="rank 0", stage="streaming DiLoCo"),
        events,
        WARM,
        title=f"streaming DiLoCo: inner steps {WARM + 1} to {WARM + H}, H = {H}, {FRAGMENTS} fragments, α = "
        f"{streamed.alpha}, each handed over {TAU} steps before the step that applies it",
    )

# %% jupyter={"source_hidden": true}
# %%distributed
# The lines under the figure (this cell's code collapsed).
from minddp.analysis import metrics

sends = [i for i, n in enumerate(order) if n.startswith("minddp.fragment_send")]
applies = [i for i, n in enumerate(order) if n.startswith("minddp.fragment_apply")]


def step_of(i):  # the inner step (counted from the run's first) whose optimizer step holds event i
    return WARM + sum(n == "minddp.optimizer_step" for n in order[: i + 1])


sizes = [sum(p.numel() * p.element_size() for p in fragment) for fragment in streamed.fragments]
lesson.claim(
    len(sends) == len(applies) == FRAGMENTS and all(step_of(a) - step_of(s) == TAU for s, a in zip(sends, applies)),
    f"each fragment was applied τ = {TAU} steps after its hand-over",
)
row, spec = view["row"], link.spec
assert len(link.log) == len(row["sent"]) == len(sends)  # one message per fragment sync, each logged in the profile
lesson.say("on the figure's axis:")


def axis(m, sent, t):  # time t of message m on the link's clock (s), on the figure's axis (ms), rounded as printed
    return round(sent + (t - m["handed_over"]) * 1e3, 1)


waits = {}  # fragment: (ms on the figure's axis: hand-over, delivery, wait() call; ms waited)
for m, sent, s, a in zip(link.log, row["sent"], sends, applies):
    fragment = int(order[s].rpartition("#")[2])
    modeled = 2 * spec.latency + m["bytes"] / spec.bandwidth  # 2 hops on 2 ranks, then the bytes once
    assert m["bytes"] == sizes[fragment] and abs(m["modeled_end"] - m["start"] - modeled) < 1e-9
    # rounded as printed first, so that the printed numbers add up: the modeled end, then the delivery after it
    on, took = axis(m, sent, m["start"]), round(modeled * 1e3, 1)
    late = round((m["delivered"] - m["modeled_end"]) * 1e3, 1)
    handed, asked, delivered = (
        axis(m, sent, m["handed_over"]),
        axis(m, sent, link.asked[m["seq"]]),
        round(on + took + late, 1),
    )
    waits[fragment] = handed, delivered, asked, metrics.waited([(asked, max(asked, delivered))])
    between = f"{abs(delivered - asked):.1f} ms "  # between the wait() call and the delivery
    fit = f"{asked - handed:.1f} ms (τ steps) after the hand-over and " + (
        between + f"before the delivery, so it waited {waits[fragment][3]:.1f} ms"
        if delivered > asked
        else (between + "after" if delivered < asked else "at")
        + f" the delivery: it waited {waits[fragment][3]:.1f} ms"
    )
    lesson.say(
        f"fragment {fragment} ({100 * m['bytes'] / sum(sizes):.0f} % of the model): handed over in step {step_of(s)} at "
        f"{handed:.1f} ms; on the link (modeled: 2 hops × {spec.latency * 1e3:g} ms + {m['bytes'] / 1e3:.1f} kB "
        f"at {spec.bandwidth * 8 / 1e6:g} Mbit/s = {took:.1f} ms) from {on:.1f} ms; delivered at {delivered:.1f} ms, "
        f"{late:.1f} ms after the modeled end; "
        f"step {step_of(a)} called wait() at {asked:.1f} ms, {fit}"
    )
longer = [f for f, (_, d, a, _) in waits.items() if d > a]  # the messages still on the link at their wait()
lesson.say(
    "here "
    + (
        "every message fit in its τ steps, so no apply step waited"
        if not longer
        else "no message fit in its τ steps, so each apply step waited for the rest"
        if len(longer) == len(waits)
        else " and ".join(f"fragment {f}'s" for f in longer) + " message did not fit in its τ steps, so only its "
        "apply step waited"
    )
    + "; the step-time model below makes this comparison on each link"
)


# %% [markdown]
# ### Your turn: the fragment schedule
#
# Write `fragment_to_send(step, sync_every, fragments, delay)`: the fragment whose pseudo-gradient
# leaves after inner step `step` (1, 2, ...), or `None`. A turn is `sync_every // fragments` steps,
# fragment 0 first, each fragment sent `delay` (τ) steps before its turn ends. The checker runs it on 2
# real ranks for steps 1 to 2H at three settings and compares it with streaming
# DiLoCo's schedule: a schedule that differs across replicas is named first.

# %%
from minddp.exercises import check_fragment_schedule


def my_fragment_to_send(step, sync_every, fragments, delay):
    # Your turn: which fragment leaves after `step`? The same answer on every replica.
    raise NotImplementedError("the fragment, or None")


check_fragment_schedule(my_fragment_to_send)

# %% [markdown]
# Stuck? The model answer (`minddp.exercises.solutions.fragment_to_send`) and the checker's verdict on
# it, collapsed:

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.fragment_to_send)
print(check_fragment_schedule(solutions.fragment_to_send))

# %% [markdown]
# ## Compute utilisation on slow links
#
# The step-time model (`minddp.costmodel.slow_link`) replays one period of H inner steps on a link:
# their compute as assumed, every step alike, each fragment's message
# handed over when its schedule says and applied at its turn's end. Its **compute utilisation** is Streaming
# DiLoCo's measure: the share of the period a replica computes (DDP's period is its one step); it measures time,
# not progress. Here for a model of SmolLM2-360M's size (fp32 pseudo-gradients and gradients, 1.44 GB, taken as
# 32 equal tensors), 2 replicas, each 16,384 tokens per step at an assumed 300 TFLOP/s, a step's compute taken
# as 6 FLOPs per parameter and token: DDP, DiLoCo not streamed with H = 100, and streaming DiLoCo with H = 100,
# 4 equal fragments and τ = 10, on seven preset links, widest first.

# %%
from minddp.comm.link import PRESETS
from minddp.costmodel.compute import from_throughput, synthesize
from minddp.costmodel.slow_link import ddp_step, per_step

PARAMS, TOKENS, FLOPS = 360_000_000, 16_384, 300e12
QUARTER_BYTES = 4 * PARAMS // 4  # a fragment of a quarter of the parameters, 4 bytes each (`fragments`: byte sizes)
cp = from_throughput([4 * PARAMS // 32] * 32, PARAMS, TOKENS, FLOPS, micro_batches=1)  # 32 equal gradients
links = sorted(
    ["nvlink", "100gbit-ib", "10gbit", "1gbit", "wan", "100mbit", "home"], key=lambda n: -PRESETS[n].bandwidth
)
table = {}
for name in links:
    table[name] = {
        "ddp": ddp_step(cp, name),
        "diloco": per_step(cp, name, sync_every=100),
        "streaming": per_step(cp, name, sync_every=100, fragments=[QUARTER_BYTES] * 4, delay=10),
    }
print(
    f"compute per step: 6 × {PARAMS / 1e6:.0f} M parameters × {TOKENS} tokens / {FLOPS / 1e12:.0f} TFLOP/s = "
    f"{table['nvlink']['ddp']['compute_s'] * 1e3:.0f} ms: forward {cp.forward * 1e3:.1f} ms (2 of the 6 FLOPs), backward "
    f"{cp.backward * 1e3:.1f} ms"
)


def pct(share):  # a share under 0.1 % in g format, so that it does not print as 0.0 %
    return f"{100 * share:.1f} %" if share >= 0.001 or share == 0 else f"{100 * share:.2g} %"


print("the compute utilisation on each link:")
print(f"{'link':>11} {'Gbit/s':>7} {'ms/hop':>6} | {'DDP':>7} | {'DiLoCo H=100':>12} | {'stream. H=100 K=4 τ=10':>22}")
for name, row in table.items():
    spec = PRESETS[name]
    print(
        f"{name:>11} {spec.bandwidth * 8 / 1e9:>7g} {spec.latency * 1e3:>6g} | "
        + " | ".join(f"{pct(r['utilisation']):>{w}}" for r, w in zip(row.values(), (7, 12, 22)))
    )

# %% jupyter={"source_hidden": true}
# The lines that take the table apart (this cell's code collapsed).
first = next(name for name in links if table[name]["ddp"]["utilisation"] < 0.05)
spec = PRESETS[first]
lesson.claim(
    all(table[name]["ddp"]["utilisation"] < 0.05 for name in links[links.index(first) :]),
    f"DDP computes less than 5 % of the time from '{first}' ({pct(table[first]['ddp']['utilisation'])}) down",
)
CAP_MIB = 25.0  # DDP's default bucket cap: a bucket closes once it reaches it, so a larger tensor is a bucket alone
buckets = synthesize(cp, "ddp", CAP_MIB, 2).messages  # the messages ddp_step replays: one per bucket
size, start = buckets[0].nbytes, min(m.at for m in buckets)
each = 2 * spec.latency + size / spec.bandwidth  # 2 hops, each paying the latency; on 2 ranks 1× the bytes per rank
assert len(buckets) == 32 and all(m.nbytes > CAP_MIB * 2**20 for m in buckets)  # one bucket per tensor
assert abs(start - (cp.forward + cp.backward / 32)) < 1e-12  # the forward, then the last tensor's 1/32 of the backward
print(
    f"DDP on '{first}': {len(buckets)} messages a step (each gradient tensor is over the {CAP_MIB:g} MiB bucket cap), "
    f"one after another, each 2 hops × {spec.latency * 1e3:g} ms + {size / 1e6:.0f} MB at "
    f"{spec.bandwidth * 8 / 1e9:g} Gbit/s = {each * 1e3:.1f} ms; the first handed over at {start * 1e3:.1f} ms, the "
    f"last delivered at {start * 1e3:.1f} + {len(buckets)} × {each * 1e3:.1f} = {(start + len(buckets) * each) * 1e3:.0f} "
    f"ms, the step's end: it computes {table[first]['ddp']['compute_s'] * 1e3:.0f} ms of it "
    f"({pct(table[first]['ddp']['utilisation'])})"
)
computing = 100 * table[first]["diloco"]["compute_s"]  # a period's compute: 100 inner steps' (s)
sync_wait = 100 * table[first]["diloco"]["exposed_s"]  # and the wait for its one whole-model sync (s)
lesson.say(
    f"DiLoCo not streamed on '{first}': a period computes 100 × "
    f"{table[first]['diloco']['compute_s'] * 1e3:.2f} ms = {computing:.3f} s, then the replica waits {sync_wait:.3f} s "
    f"for its sync (one message: 2 hops × {spec.latency * 1e3:g} ms + {4 * PARAMS / 1e9:.2f} GB at "
    f"{spec.bandwidth * 8 / 1e9:g} Gbit/s = {(2 * spec.latency + 4 * PARAMS / spec.bandwidth):.3f} s): "
    f"{computing:.3f} / ({computing:.3f} + {sync_wait:.3f}) = {pct(table[first]['diloco']['utilisation'])}"
)
tau_s = 10 * table[first]["diloco"]["compute_s"]  # τ = 10 inner steps' compute (s)


def fragment_on(name):  # one of streaming's 4 fragments (360 MB) on the link: 2 hops + its bytes at the link's rate
    return 2 * PRESETS[name].latency + QUARTER_BYTES / PRESETS[name].bandwidth


slower = [name for name in links if fragment_on(name) > tau_s]
gain = {n: table[n]["streaming"]["utilisation"] - table[n]["diloco"]["utilisation"] for n in links}  # in points/100
wait = {n: {r: 100 * table[n][r]["exposed_s"] for r in ("diloco", "streaming")} for n in links}  # a period's (s)
lesson.claim(  # a fragment's message travels only during the τ steps from its hand-over to its apply
    all((table[name]["streaming"]["utilisation"] == 1.0) == (name not in slower) for name in links)
    and all(gain[name] > 0 for name in slower)
    and all(0 < wait[n]["diloco"] - wait[n]["streaming"] <= 4 * tau_s + 1e-9 for n in slower)
    and [n for n in slower if gain[n] < 0.01] == ["100mbit", "home"],  # the takeaway's "less than one point"
    f"streaming DiLoCo computes 100.0 % of the time on exactly the links where one fragment's time on the link "
    f"fits in its τ = 10 steps ({tau_s:.2f} s). On "
    + ", ".join(f"'{name}'" for name in slower)
    + " it takes "
    + ", ".join(f"{fragment_on(name):.1f}" for name in slower)
    + " s. Only its τ steps run while a fragment's message travels, so streaming cuts at most 4 × "
    f"{tau_s:.2f} = {4 * tau_s:.2f} s a period off DiLoCo not streamed's wait (there "
    + ", ".join(f"{wait[name]['diloco']:.2f}" for name in slower)
    + " s) and computes "
    + ", ".join(f"{100 * gain[name]:.2f}" for name in slower)
    + " percentage points more of the time",
)


# %% [markdown]
# ## What to take away
#
# * Local SGD and DiLoCo send H times fewer bytes than DDP. In the bench, with no more payload than DDP has handed
#   over by step 50, each plotted run that talks rarely (H = 10 and 100) gets below DDP's step-50 loss; at every
#   score after the start DDP's mean is below each of theirs.
# * In the bench DiLoCo not streamed ended above local SGD, in most seeds but not all at H = 10 and in every
#   seed at H = 50 and 100, rising far more with H; at H = 100, at every outer lr tried, it ended worse than one
#   replica alone in every seed; local SGD ended below one replica alone at every H, in every seed. At H = 100 a sync
#   left the synced weights worse (the mean rose) in DiLoCo at every outer lr tried (at lr 1, worse than the
#   untrained start) and in streaming DiLoCo. Of the bench's runs that talk rarely,
#   `streaming-h100` ended closest to DDP; which of its three settings helps was not separated.
# * The pseudo-gradient is `synced − local`, and the outer step starts from the **synced** weights.
# * Streaming DiLoCo sends one fragment at a time, τ steps before the step that applies it; that step waits for
#   what is still on the link.
# * The step-time model, times only (a 360 M-parameter model, H = 100; not the bench's settings), *predicts*: on
#   `wan` DDP computes less than 5 % of the time; streaming DiLoCo (4 equal fragments, τ = 10) computes all of
#   it exactly where a fragment's time on the link fits in its τ steps, and on `100mbit` and `home` less than
#   one percentage point more than DiLoCo not streamed: each fragment hides at most its τ steps of a long wait.

# %%
# %dist_shutdown
