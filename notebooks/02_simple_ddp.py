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
# # 02 · From one process to `SimpleDDP`
#
# Data parallelism runs one copy of the model per rank, each on its own shard of the global batch.
# Two things must hold for the copies to stay one model:
#
# 1. **same start**: every copy has the same parameters;
# 2. **same update**: every copy applies the same gradient, the average over ranks.
#
# We break both on purpose and watch a check fail; then we write `SimpleDDP`, the whole idea in one
# short class on `torch.distributed` (a broadcast, an all_reduce, a division), check it against one
# process on the same examples, and watch two replicas drift apart when the average is left out.
# Last, `minddp.stages.SimpleDDP`, the first of the stages `03_build_up` builds one on another: the
# same idea with what every later stage needs around it, and why. At the end it is your turn, and a checker runs your code on real ranks.
#
# Every notebook from here to `06` trains the same workload with the same settings
# (`minddp.notebook.lesson`), so that a number in one notebook means what it means in the next: a
# small Llama-architecture classifier on a generated paraphrase task, nothing downloaded. The cell
# below prints what it is, in these words: a *micro-batch* is the examples one rank runs through one
# forward and backward; k micro-batches make one optimizer step (gradient accumulation, `03_build_up`);
# the *global batch* is every example of one optimizer step, on every rank, and a rank's *shard* is its
# part of it, its k micro-batches; a *sync* averages every gradient over the ranks once. (Its bucket
# size is for `03_build_up`'s bucketed stages, and is a threshold, torch's `bucket_cap_mb`, not a maximum: a bucket
# closes at the first gradient that brings it to that size or past it, so a bucket can hold more.)

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.notebook import lesson
from minddp.ladder.loop import train_step


def check_in_sync(tensors, what):
    """Compare every tensor with rank 0's copy; name the mismatches (every rank joins every broadcast)."""
    tensors = list(tensors)
    bad = []
    for i, t in enumerate(tensors):
        rank0 = t.detach().clone()
        dist.broadcast(rank0, src=0)
        if not torch.equal(t, rank0):
            bad.append(i)
    if bad:
        raise ValueError(f"{what} are not in sync with rank 0: {len(bad)} of {len(tensors)} tensors differ")
    print(f"all {len(tensors)} {what} equal rank 0's")


def flat(parameters):
    return torch.cat([p.detach().reshape(-1) for p in parameters])


def apart(module):
    """How far the replicas are apart: the largest distance (L2 norm) from a rank's parameters to rank 0's."""
    mine = flat(module.parameters())
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    distance = (mine - rank0).norm().reshape(1)
    dist.all_reduce(distance, op=dist.ReduceOp.MAX)  # the same number on every rank
    return distance.item()


lesson.say(lesson.describe())

# %% [markdown]
# ## 1. Parameters out of sync
#
# Each rank builds its model with its own random initialisation (here: a different seed per rank,
# as two processes that never set one would). The check compares every parameter tensor with rank
# 0's; rank 0 compares with itself and passes, rank 1 fails. Not every tensor differs: the norm
# layers' weights start at 1 whatever the seed, so they agree on every rank (rank 0's ✓ line below counts them).
# This cell is expected to fail (it is tagged `raises-exception`, so *Run All* goes on past it).

# %% tags=["raises-exception"] minddp={"expected_error": "parameter tensors are not in sync"}
# %%distributed
model = lesson.make_model(seed=lesson.SETTINGS.seed + rank)
if rank == 0:
    norms = [m.weight for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    total = len(list(model.parameters()))
    lesson.claim(
        all(bool((w == 1).all()) for w in norms),
        f"the model's {len(norms)} norm layers' weights are all 1.0: only the other {total - len(norms)} of its "
        f"{total} tensors are drawn from the seed",
    )
check_in_sync(model.parameters(), "parameter tensors")

# %% [markdown]
# ## 2. `SimpleDDP`, the whole idea
#
# A wrapper around the model, with one job for each condition:
#
# 1. **same start**: when it is built, it broadcasts every parameter and buffer from rank 0, so
#    every rank overwrites its own random start with rank 0's;
# 2. **same update**: after `backward()`, `finish_gradient_synchronization()` all_reduces each
#    gradient, which leaves the *sum* over the ranks on every rank, and divides it by the number of
#    ranks: the average.
#
# Forward is the model's own. The cell defines the class on every rank, wraps the model, and checks
# again: the parameters now agree.

# %%
# %%distributed
from torch import nn


class SimpleDDP(nn.Module):
    """Same start: rank 0's weights everywhere. Same update: every gradient averaged over the ranks."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():  # rank 0's values are no part of training: keep autograd out of the write
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)  # 1. rank 0's values, on every rank

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):  # call after backward()
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)  # 2. the sum over the ranks...
                param.grad /= dist.get_world_size()  # ...divided: the average


ddp = SimpleDDP(model)
check_in_sync(ddp.parameters(), "parameter tensors")

# %% [markdown]
# ## 3. Gradients out of sync
#
# Each rank runs forward and backward on its first micro-batch (the `lesson` data gives every rank
# different examples of the same global batch), so each holds a different gradient. If the ranks
# stepped now, their models would drift apart again (section 5 shows how far). Expected to fail:

# %% tags=["raises-exception"] minddp={"expected_error": "gradients are not in sync"}
# %%distributed
micro_batches = next(lesson.step_batches())  # this rank's shard of the first step: its k micro-batches
loss = lesson.loss_fn(ddp, micro_batches[0])
loss.backward()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")

# %% [markdown]
# ## 4. Averaging the gradients
#
# The loss over the ranks' first micro-batches taken together is the mean of their losses (they hold
# as many examples), so the average of their gradients is the gradient one process would compute on
# all of them at once. The next cell averages, checks that the ranks agree, and checks that claim
# too: every rank also builds the same model in one process (rank 0's seed) and runs every rank's
# first micro-batch through it in one backward.

# %%
# %%distributed
ddp.finish_gradient_synchronization()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")

single = lesson.make_model()  # the oracle: rank 0's weights, one process
whole = next(lesson.step_batches(whole=True))  # the same first step, every rank's micro-batches at once
lesson.loss_fn(single, whole[0]).backward()
largest = max((p.grad - q.grad).abs().max().item() for p, q in zip(ddp.module.parameters(), single.parameters()))
scale = max(q.grad.abs().max().item() for q in single.parameters())
per_rank = lesson.SETTINGS.batch_size
lesson.say(
    f"Largest difference to the single-process gradient: {largest:.1e}, against gradients up to {scale:.1e}. "
    f"The single process computes the gradient of the {world_size} ranks' first micro-batches, "
    f"{per_rank * world_size} examples, in one backward; each rank computes that of its own {per_rank}, and the "
    "all_reduce adds the ranks' results: the same sum in another order, which float32 rounds differently."
)
# Another order of a float32 sum moves it by a few units of float32's 1.2e-7 per term added; 1e-4 of the largest
# gradient is ~800 of them, and a wrong average (a sum, a missing rank) is off by a factor, not by 1e-4.
lesson.claim(largest <= 1e-4 * scale, "SimpleDDP's averaged gradient is the single process's, up to float rounding")

# %% [markdown]
# ## 5. Training: in sync with the average, drifting apart without it
#
# With the same start and the same update, training keeps the replicas identical.
# `minddp.ladder.loop.train_step` is the loop every stage of `03_build_up` (the *ladder*) shares: for
# each micro-batch, forward, the loss divided by k, backward (for all but the last micro-batch inside the
# stage's `no_sync()`, where the stage has one: a context in which the gradients only add up locally, which
# `03_build_up`'s `ga` (gradient accumulation) stage brings; `SimpleDDP` has none),
# `finish_gradient_synchronization()`; then `optimizer.step()`. Dividing by k makes the k backwards, which add into `.grad`, give the gradient of
# the mean loss over the rank's k micro-batches. `SimpleDDP` averages at every
# `finish_gradient_synchronization()`, so after every micro-batch's backward. That is still right, up to
# float rounding: the part of `.grad` already averaged is the same on every rank, so averaging `.grad` again
# keeps that part and averages the new micro-batch's, and after the last micro-batch `.grad` holds the
# average of every micro-batch's part. The cell trains it
# for two steps beside the single process on each step's global batch, measures after every step
# how far apart the ranks' parameters are, and counts the all_reduce calls (by wrapping `dist.all_reduce`).

# %%
# %%distributed
from minddp.bench.worker import counting_torch_all_reduce  # wraps dist.all_reduce: counts calls and bytes
from minddp.comm.wire import Traffic

STEPS = 2  # the unaveraged replicas' distance (next cell) is printed after each
ddp.zero_grad(set_to_none=True)
single.zero_grad(set_to_none=True)
start = flat(single.parameters())
opt = torch.optim.AdamW(ddp.parameters(), lr=lesson.SETTINGS.lr)
opt_single = torch.optim.AdamW(single.parameters(), lr=lesson.SETTINGS.lr)
mine, everyone = lesson.step_batches(), lesson.step_batches(whole=True)
traffic = Traffic()
averaged, moved = [apart(ddp)], [0.0]
for step in range(STEPS):
    with counting_torch_all_reduce(traffic):
        train_step(ddp, opt, next(mine), lesson.loss_fn)
    train_step(single, opt_single, next(everyone), lesson.loss_fn)
    averaged.append(apart(ddp))
    moved.append((flat(single.parameters()) - start).norm().item())  # how far the single process moved

off = (flat(ddp.module.parameters()) - flat(single.parameters())).norm().item()
tensors = sum(1 for p in ddp.parameters() if p.requires_grad)
one_sync = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)  # every gradient once
k = lesson.SETTINGS.grad_accum
lesson.claim(
    all(d == 0 for d in averaged),
    f"with the average, the replicas stayed exactly equal: distance 0 after each of the {STEPS} steps",
)
# The bound is loose on purpose: section 4's gradients differ by float rounding, and AdamW's steps carry that
# further. 1e-2 of the distance moved is far below the unaveraged replicas' distance (next cell).
lesson.claim(
    off <= 1e-2 * moved[-1],
    f"on the same global batches, SimpleDDP's parameters end {off:.1e} from the single process's, which moved "
    f"{moved[-1]:.2f} from its start (the check allows 1e-2 of that)",
)
lesson.claim(
    traffic.calls == STEPS * k * tensors and traffic.bytes == STEPS * k * one_sync,
    f"in its {STEPS} steps SimpleDDP made {traffic.calls} all_reduce calls, {STEPS} × {k} × {tensors} (steps × "
    f"micro-batches a step × gradient tensors), and all_reduced {STEPS} × {k} × {lesson.mib(one_sync)} (the bytes of every "
    "gradient tensor once)",
)

# %% [markdown]
# Then the same without the average: every rank starts from the same weights (rank 0's seed, so no
# broadcast is needed) and trains the bare model on its own shard, each stepping on its own gradient.

# %%
# %%distributed
alone = lesson.make_model()  # rank 0's start, on every rank
opt_alone = torch.optim.AdamW(alone.parameters(), lr=lesson.SETTINGS.lr)
batches = lesson.step_batches()  # the same shards as SimpleDDP's
drifted = [apart(alone)]
for step in range(STEPS):
    train_step(alone, opt_alone, next(batches), lesson.loss_fn)  # no wrapper: no average
    drifted.append(apart(alone))
# Each rank adds its own update every step, so they differ after each. Whether the distance grows from one step
# to the next depends on the updates: it is printed, not checked.
lesson.claim(
    drifted[0] == 0 and all(d > 0 for d in drifted[1:]),
    "without the average, the replicas started equal and were "
    + ", then ".join(f"{d:.2f}" for d in drifted[1:])
    + f" apart after the {STEPS} steps",
)
lesson.say(  # the comparisons the figure draws (red against grey), computed
    f"Their distance {'grew' if drifted[-1] > drifted[1] else 'did not grow'} from step 1 to step {STEPS}. For "
    "scale, the single process moved "
    + ", then ".join(f"{m:.2f}" for m in moved[1:])
    + " from its start: "
    + "; ".join(
        f"after step {i} the replicas were {'farther apart than' if d > m else 'no farther apart than'} that"
        for i, (d, m) in enumerate(zip(drifted[1:], moved[1:]), 1)
    )
    + "."
)

# %%
# %%rank 0
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.2))
steps = range(STEPS + 1)
ax.plot(steps, drifted, "o-", color="crimson", label="no average: each rank steps on its own gradient")
ax.plot(steps, averaged, "o-", color="tab:green", label="SimpleDDP: the average (distance exactly 0)")
ax.plot(steps, moved, "--", color="gray", label="for scale: how far the single process moved from the start")
ax.set_xlabel("optimizer step")
ax.set_ylabel("parameter distance\n(L2 norm of the difference)")
ax.set_title(
    f"{world_size} ranks, {lesson.SETTINGS.model}: how far apart the replicas are (red, green),\n"
    "and how far the single process moved from its start (grey)",
    fontsize=9,
)
ax.set_xticks(list(steps))
ax.legend(fontsize=8, frameon=False)
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look for: the averaged replicas are equal to the bit (the distance is exactly zero: every rank
# applies the same all_reduce result to the same weights with the same AdamW update), and
# they end near the single process's parameters (the first training cell prints how near). The
# replicas left to themselves part after every step (the ✓ line above the figure), and the line printed under it
# says whether their distance grew from step to step, and how it compares with how far the single process moved
# from its start (the red line against the grey). Where it says *farther apart than that*, the two replicas, which
# started equal, differ by more than the single process had moved from its start by that step: without the
# average they are no longer one model.
# And `SimpleDDP` all_reduces more than it needs: every gradient after every micro-batch, k syncs a
# step (the first training cell counts their calls and bytes), although only the average over the whole
# step matters. `03_build_up` changes what is sent and when, one idea per stage, and measures
# what each idea changes.
#
# ## 6. The ladder's `SimpleDDP`: the same idea, and what every stage needs around it
#
# `minddp.stages.SimpleDDP` is the first rung of the ladder that `03_build_up` climbs. It keeps the
# broadcast and the average above, and three things come around them, each for a reason that shows later:
#
# * **a comm hook.** `finish_gradient_synchronization()` does not call `all_reduce` itself: it hands
#   each gradient, wrapped in a `GradBucket` of that one gradient, to `hook(state, bucket)`, which returns a *Future*
#   (its `wait()` returns the averaged gradient). (`GradBucket` is minddp's own class, `minddp/comm/grad_bucket.py`, with the
#   method names of `torch.distributed.GradBucket`, what torch's DDP hands its hooks.) The default hook, `allreduce_hook`, divides by the number of
#   ranks and all_reduces: the same average up to float rounding, the division first (a check below the
#   code compares the two orders; on 2 ranks they agree to the bit, as dividing by 2 is exact in float32). Every later stage sends through this one call,
#   so `04_comm_hooks` sends any stage's gradients in fp16 or through
#   PowerSGD by registering another hook;
# * **two checks that compare the ranks before any gradient is sent.** At construction every rank's
#   parameter names, shapes, dtypes and `requires_grad` are compared (`check_same_model`, one `all_gather_object`), and
#   at every `finish_gradient_synchronization()` (after every micro-batch, for this class) the
#   parameters that each rank's forwards since the last one used (`ParameterUse`, one `all_gather`);
#   a mismatch raises the same error on every rank;
# * **debug mode's checks** (`attach(self)`, `minddp/debug`), which `08_debugging` turns on and shows.
#
# It also takes a `process_group` (all ranks by default), as torch's DDP does; its `broadcast` and the
# default hook are the plain calls of `minddp/comm/plain.py`. The code (its comment "1. same start" and
# docstring "2. same update" mark the two conditions), then the default hook:

# %%
from minddp import stages
from minddp.comm.plain import allreduce_hook
from minddp.notebook.source import show_source

show_source(stages.SimpleDDP)
show_source(allreduce_hook)

# %% [markdown]
# Through its hook, the ladder's version makes one all_reduce per gradient, as the class above (its
# checks' `all_gather_object` and `all_gather` come besides, not counted here), and leaves the same average
# up to float rounding. The cell below checks both on one micro-batch's
# backward: the ladder's version averages while the wrapper of `dist.all_reduce` of section 5 counts
# its calls, then the rank's own gradients are put back and the class above averages them.

# %%
# %%distributed
from minddp import stages

net = lesson.make_model()
ladder, plain = stages.SimpleDDP(net), SimpleDDP(net)  # two wrappers of one model: one set of gradients
lesson.loss_fn(ladder, next(lesson.step_batches())[0]).backward()
local = [p.grad.clone() for p in net.parameters()]  # this rank's own gradients
meter = Traffic()
with counting_torch_all_reduce(meter):
    ladder.finish_gradient_synchronization()  # through its default hook, allreduce_hook
by_hook = [p.grad.clone() for p in net.parameters()]
for p, g in zip(net.parameters(), local):
    p.grad.copy_(g)  # the same gradients again, for the class above
plain.finish_gradient_synchronization()

tensors = [p for p in net.parameters() if p.requires_grad]
largest = max((a - p.grad).abs().max().item() for a, p in zip(by_hook, net.parameters()))
biggest = torch.tensor([max(g.abs().max().item() for g in local)], device=device)
dist.all_reduce(biggest, op=dist.ReduceOp.MAX)  # the largest gradient on any rank
eps = torch.finfo(torch.float32).eps
lesson.claim(
    meter.calls == len(tensors) and meter.bytes == sum(4 * p.numel() for p in tensors),
    f"the ladder's SimpleDDP made one all_reduce per gradient tensor ({meter.calls}), {lesson.mib(meter.bytes)}: "
    "every float32 gradient once",
)
# Dividing before the sum or after it rounds differently: each of the n terms and the sum round once, so the two
# averages may differ by about n float32 epsilons of the largest gradient (with 2 ranks, halving is exact: 0).
lesson.claim(
    largest <= world_size * eps * biggest.item(),
    f"on these {world_size} ranks the ladder's average (divided, then summed) is the class above's (summed, then "
    f"divided): largest difference {largest:.1e}, where float32 rounding allows {world_size * eps * biggest.item():.1e}"
    f" ({world_size} × float32's eps × {biggest.item():.2f}, the largest of the ranks' own gradients before the "
    "average, not section 4's averaged ones)",
)

# %% [markdown]
# And a check at work: rank 1 builds a model with one output more than rank 0's. The ladder's
# `SimpleDDP` refuses on every rank, saying why; the cell prints the error each rank raised. Its words name
# `DistributedDataParallel`: the ladder's stages share the check with `minddp.DistributedDataParallel`.

# %%
# %%distributed
from minddp.debug.findings import CrossRankError

try:
    stages.SimpleDDP(torch.nn.Linear(8, 2 + rank).to(device))
except CrossRankError as error:
    print(f"{type(error).__name__}: {error}")
else:
    raise AssertionError("the ladder's SimpleDDP wrapped two different models without a word")

# %% [markdown]
# ## Your turn: write `SimpleDDP`
#
# Fill in the two methods below with plain `torch.distributed` calls:
#
# 1. `__init__`: broadcast every parameter **and every buffer** of the module from rank 0 (the class above does it
#    under `torch.no_grad()`, which keeps autograd out of the write: some torch builds refuse an in-place write
#    into a parameter otherwise; the checker does not ask for it);
# 2. `finish_gradient_synchronization()`: all_reduce each parameter's `.grad` in place, one call per
#    tensor, and divide it by `dist.get_world_size()` (before the all_reduce or after it: the
#    checker accepts either); skip a parameter whose `.grad` is None, as the class above does (one the loss
#    did not reach in this step).
#
# `check` trains your class on two ranks of its own beside a single process on the global batch, on a network
# of its own (three `Linear` layers and a buffer: its verdict counts that network's tensors, not the
# workload's), with plain SGD. (It trains torch's own DDP there too, but does not judge your class against it.)
# It compares three things: every rank's parameters right
# after your `__init__`, with rank 0's initial ones (a missing broadcast is named from this); every `.grad` as your
# finish left it, with the true average it computes itself (a wrong gradient is named from this); and
# the parameters after the steps, with the single process's. Its network gives every parameter a gradient, so
# it then sets one `.grad` to None before a last finish. It says in one line what is wrong, naming the usual mistakes (a missing broadcast, a sum
# not divided, rank 0's gradients broadcast instead of averaged, and more), or that your class matches.
# It also counts your collectives: one all_reduce per gradient tensor per micro-batch, as above, and no
# broadcast after `__init__`. A rank left waiting in a collective is reported as "a rank hung" after a
# timeout, so your notebook never hangs. A class that passes on two ranks is checked for one more step
# on three: a world size written as a number (`/ 2`) is right on two ranks only.
#
# As it stands the class raises `NotImplementedError`; the checker catches it and says so.

# %%
import torch
import torch.distributed as dist
from torch import nn
from minddp.exercises import check


class MySimpleDDP(nn.Module):
    def __init__(self, module, process_group=None):
        super().__init__()
        self.module = module
        # Your turn: make every rank start from rank 0's parameters and buffers.
        raise NotImplementedError("broadcast rank 0's parameters and buffers")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        # Your turn: replace every .grad by its average over the ranks.
        raise NotImplementedError("average every gradient")


check(MySimpleDDP, like="simple")

# %% [markdown]
# Stuck? The next cell holds a model answer (`minddp.exercises.solutions`) and what the checker says
# about it. In Jupyter the whole cell is collapsed, its code and its output (the answer is an output),
# so as not to give it away: click the collapsed cell to open it.

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions

show_source(solutions.SimpleDDP)
check(solutions.SimpleDDP, like="simple")

# %% [markdown]
# One mistake to know: `all_reduce` *sums*. Without the division every rank holds the same sum (in 01's
# `all_reduce` cell every rank printed the same average, the sum divided by 4: the sums were equal too), so comparing the ranks with each other cannot tell
# it from the average. The checker compares each `.grad` with the true average, and with the usual mistakes, the
# sum among them:


# %%
class ForgotTheDivision(solutions.SimpleDDP):
    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)


check(ForgotTheDivision, like="simple")

# %% [markdown]
# Next: `03_build_up` changes when and in what pieces the same average is sent, one idea per stage.

# %%
# %dist_shutdown
