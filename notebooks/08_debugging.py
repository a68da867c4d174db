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
# # 08 · When data parallelism goes wrong: `MINDDP_DEBUG=1`
#
# A data-parallel script can be wrong in ways a single process never is, and torch's DDP says little
# about them: replicas that drift apart train on in silence, a collective with another shape on one
# rank meets its partner's but the two never match, so both wait; a rank that runs out of data leaves
# the others waiting. We break DDP on purpose: nine bugs in six sections, and for each bug we run three
# things on the two ranks:
#
# 1. **torch**, debug mode off: what torch's DDP says (or, for the script's own collectives, torch's
#    `dist.all_reduce`). A call that no partner will ever match runs on a process group whose timeout
#    is 3 s, so the wait ends (a real job waits 30 minutes, gloo's default); a rank that fails leaves
#    its groups, as a job's process ends when it raises, so a partner waiting on it fails at once;
# 2. **minddp in debug mode**: minddp's DDP for the model's bugs, and for the script's own
#    collectives the collective check alone (no wrapper needed). What it says is one line on every
#    rank, printed alone (rank 0's; each rank says its own, and the cell checks that every rank did):
#    the cause, the tensor or call, the rank(s), the step, and the fix. For eight bugs the line is an
#    error that stops every rank at the same point; for a bug that spoils nothing (section 3, every
#    rank reading the same data) it is a warning, said once, and training goes on;
# 3. **the fix**: the same script corrected, in debug mode, which then says nothing.
#
# Steps count from 0, in the loops and in debug mode's lines: "after step 1" is after the second step.
#
# Where a line names a place in this notebook, `<In [N], rank R>:L` is line L (the `%%distributed`
# line is line 1) of the cell Jupyter shows as `In [N]` (run top to bottom: the N-th code cell), as
# rank R ran it.
#
# Debug mode is off unless asked for: `MINDDP_DEBUG=1 torchrun ... train.py` (or
# `minddp.debug.enable()`); off, it installs nothing and costs nothing.
# What each check does and costs: `docs/debugging.md`.
#
# The bugs do not need a large model: a two-layer network on random data, a few steps, is enough.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %% [markdown]
# Every rank sets the switch, as `MINDDP_DEBUG=1` on the command line would, and gets the same small
# model, its own batches (a different random stream per rank: its shard of the data), a helper that
# reads how far the replicas are apart (for the runs where nothing else would tell us), and the
# helpers that run a script each way: `torch_does` (debug mode off; each rank's outcome in a line: the
# error's first two sentences, and the parameter indices when torch lists them; and
# `torch_drifts` for the bugs torch trains through), `minddp_says` (the line debug mode raised, checked
# on every rank) and `fixed` (the corrected script: nothing said, the replicas equal).

# %%
# %%distributed
import contextlib
import time
import warnings
from datetime import timedelta

from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import minddp.debug
from minddp import DistributedDataParallel
from minddp.notebook import lesson

minddp.debug.enable()  # what `MINDDP_DEBUG=1 torchrun ...` does for every rank when it imports minddp
WAIT_S = 3  # torch's waits for a call no partner will match end here (the calls that pair have no such limit)


class Net(nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.encoder, self.head = nn.Linear(8, 16), nn.Linear(16, 4)
        self.extra = nn.Linear(16, 4) if extra else None

    def forward(self, x, use_extra: bool = False):
        h = torch.tanh(self.encoder(x))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def build(wrapper=DistributedDataParallel, extra=False, **kwargs):
    torch.manual_seed(0)
    model = Net(extra).to(device)
    ddp = wrapper(model, **kwargs)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.1)


def batch(step, same_on_every_rank=False):
    g = torch.Generator().manual_seed(step if same_on_every_rank else 100 * step + rank)
    return torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)


def train(model, ddp, optimizer, steps, **forward):
    for step in range(steps):
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x, **forward), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def apart(model) -> float:
    """The largest difference between this rank's parameters and rank 0's (0: the replicas agree)."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    gap = (mine - rank0).abs().max().reshape(1)
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return gap.item()


def torch_does(script) -> list[str]:
    """Run ``script(group, short)`` with debug mode off; every rank's outcome, each said in a line (an error: its
    first two sentences, and the line naming the parameter indices if it has one).

    ``group``: a new group for the calls that pair, without a short limit; ``short``: one whose calls give up after
    ``WAIT_S``, for the calls no partner will ever match. A rank that fails leaves both, as a job's process ends
    when it raises: a partner waiting on it then fails at once ("Connection closed by peer", or reset).
    """
    minddp.debug.disable()
    # the short group is made right after the other, whose making the ranks leave together
    groups = [dist.new_group(), dist.new_group(timeout=timedelta(seconds=WAIT_S))]
    start = time.perf_counter()
    try:
        script(*groups)
        mine = "said nothing"
    except RuntimeError as error:  # torch's and gloo's errors: the lines the docstring names
        lines = str(error).strip().splitlines()
        said = ". ".join(lines[0].split(". ")[:2]) + "".join(f" ({x.strip()})" for x in lines if "indices" in x)
        mine = f"{type(error).__name__} after {time.perf_counter() - start:.1f} s: {said}"
        for g in groups:
            dist.destroy_process_group(g)  # where this rank's process would end
        groups = []
    finally:
        minddp.debug.enable()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    for g in groups:
        dist.destroy_process_group(g)
    for r, outcome in enumerate(everyone):
        lesson.say(f"torch, rank {r}: {outcome}")
    return everyone


def peer_left(said: str) -> bool:
    """Did this rank fail because its partner's process left? gloo says the connection was closed by the peer, or
    reset by it when the socket was torn down first: which of the two comes is the operating system's timing."""
    return "Connection closed by peer" in said or "Connection reset by peer" in said


def minddp_says(script, cause: str, verdict: str = "debug mode stopped every rank") -> None:
    """Run ``script()`` in debug mode; print the line it raised (rank 0's), and claim every rank raised ``cause``."""
    try:
        script()
    except minddp.debug.DebugError as finding:
        line = str(finding)
    else:
        line = None
    lesson.say(line or "minddp said nothing")
    lesson.claim(line is not None and cause in line, verdict)


def torch_drifts(script) -> None:
    """``script(model, ddp, optimizer)`` on torch's DDP: it says nothing, and the replicas end apart."""
    model, *rest = build(TorchDDP)
    said = torch_does(lambda group, short: script(model, *rest))
    gap = apart(model)
    lesson.claim(
        said == ["said nothing"] * world_size and gap > 0,
        f"torch's DDP trained without a word, and its replicas now differ by up to {gap:.1e}",
    )


def fixed(script, fix: str, **corrected) -> None:
    """``script(model, ddp, optimizer, **corrected)`` in debug mode: nothing said, and the replicas agree."""
    model, *rest = build()
    script(model, *rest, **corrected)
    lesson.claim(apart(model) == 0, f"the fix: {fix}, debug mode says nothing and the replicas agree")


print(f"rank {rank}: debug mode on, {sum(p.numel() for p in Net().parameters())} parameters")

# %% [markdown]
# ## 1. Replicas that drift apart
#
# DDP keeps the replicas equal by starting them equal and giving each the same averaged gradient.
# Anything that changes a parameter on some ranks only breaks that for good: an in-place edit, a
# `load_state_dict` on rank 0 only, an optimizer with another learning rate on one rank. Here rank 1
# nudges one weight after step 1 (the second step). In debug mode, before each forward that will sync
# (the *forward check*), every rank all-gathers one small row of integers: for each parameter its
# `requires_grad` flag and a fingerprint (its bits, weighted by place; `docs/debugging.md` says what a
# fingerprint is sure to see), so with this model's 4 parameter tensors (and no buffers) a row of 8,
# `int64[8]`. On a
# mismatch the first differing tensor is compared in full, and every rank stops at the same point.
# Before each `optimizer.step()` the *step check* gathers another row, `int64[17]` here: a word of
# notes, then per parameter whether it has a gradient, the gradient's fingerprint, whether its
# backward hook ran, and the local gradient's fingerprint (from before averaging). The fix: change
# parameters the same way on every rank (here: not at all).


# %%
# %%distributed
def drifting_loop(model, ddp, optimizer, edit=True):
    for step in range(4):
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if edit and step == 1 and rank == 1:
            with torch.no_grad():
                model.head.weight[0, 0] += 1e-3  # the bug: one rank edits its replica


torch_drifts(drifting_loop)
minddp_says(
    lambda: drifting_loop(*build()), "replicas drifted apart: parameter 'head.weight' differs across ranks at step 2"
)
fixed(drifting_loop, "without the edit", edit=False)

# %% [markdown]
# ## 2. Gradients that were never averaged
#
# DDP averages the gradients of a backward whose forward went through the wrapper. Call the module
# itself (`ddp.module(x)`, or a submodule of it) and backward leaves each rank its own gradient; the
# optimizer then steps each replica its own way. minddp checks, before each `optimizer.step()` over
# the wrapped parameters, that the gradients are equal on every rank, and says why they are not. The
# fix: call the wrapper.


# %%
# %%distributed
def one_step(model, ddp, optimizer, through_wrapper=False):
    x, y = batch(0)
    nn.functional.mse_loss((ddp if through_wrapper else ddp.module)(x), y).backward()  # the bug: ddp.module
    optimizer.step()


torch_drifts(one_step)
minddp_says(lambda: one_step(*build()), "the forward did not go through the wrapper")
fixed(one_step, "through the wrapper", through_wrapper=True)

# %% [markdown]
# The other way to get there: gradient accumulation with every micro-batch inside `no_sync()`,
# the last one included. `no_sync()` only accumulates; the micro-batch that ends a step must sync.
# The fix: the last micro-batch outside `no_sync()`.


# %%
# %%distributed
def accumulate(model, ddp, optimizer, last_syncs=False):
    for micro in range(3):
        with contextlib.nullcontext() if last_syncs and micro == 2 else ddp.no_sync():  # the bug: all 3 inside
            x, y = batch(micro)
            nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()


torch_drifts(accumulate)
minddp_says(lambda: accumulate(*build()), "the step's last backward ran inside no_sync()")
fixed(accumulate, "the last micro-batch synced", last_syncs=True)

# %% [markdown]
# ## 3. Every rank reading the same data
#
# Without a `DistributedSampler` (or any other shard), every rank reads the same batches: nothing is
# corrupted, the world just computes one batch twice. Debug mode sees it from the local gradients,
# fingerprinted before they are averaged: bit-identical on every rank three steps in a row. It is a
# warning, and training goes on. The fix: a shard per rank.


# %%
# %%distributed
def read(model, ddp, optimizer, same=True) -> list[str]:
    """Four steps; debug mode's warnings."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step in range(4):
            x, y = batch(step, same_on_every_rank=same)  # the bug: no shard per rank
            nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return [str(w.message) for w in said if "minddp debug" in str(w.message)]


torch_warned = []
said = torch_does(lambda group, short: torch_warned.extend(read(*build(TorchDDP))))
lesson.claim(
    said == ["said nothing"] * world_size and torch_warned == [], "torch's DDP trained the 4 steps without a word"
)
lines = read(*build())
lesson.say(lines[0] if lines else "minddp said nothing")
lesson.claim(len(lines) == 1, "debug mode warned once, and the 4 steps ran to the end")
lesson.claim(read(*build(), same=False) == [], "the fix: with a shard per rank, debug mode says nothing")

# %% [markdown]
# ## 4. Mismatched collectives, the script's own included
#
# A script's own collectives must match across ranks too: the same op, shape and dtype, in the same
# order. Here rank 0 logs two metrics and rank 1 one. Under torch, gloo pairs an all_reduce of 2
# values with one of 1 and both ranks wait, until the group's timeout. In debug mode every
# `torch.distributed` collective is compared across ranks on a side channel (the default group's
# store, a key-value table every rank reaches) before it is sent, so both ranks stop at once, naming
# each rank's call and the line it came from. The fix: the same metrics on every rank.
#
# The line numbers the call: *collective #N* is the group's sequence number, counting from 0 the
# group's collectives that debug mode has checked (here the default group's, since debug mode was
# turned on in the set-up cell: the earlier sections' count too, torch's runs with it off do not).
# A call is said as op(shapes): for an all_gather, the output list and then the input, so
# `all_gather(2 × int64[17], int64[17])` gathers a row of 17 from each of the 2 ranks.

# %%
# %%distributed
logged = [0.5, 0.9] if rank == 0 else [0.5]  # the bug: loss and accuracy on rank 0, the loss alone on rank 1
said = torch_does(lambda group, short: dist.all_reduce(torch.tensor(logged, device=device), group=short))
lesson.claim(all("Timed out" in s for s in said), f"under torch both ranks waited, until the {WAIT_S} s timeout")
minddp_says(
    lambda: dist.all_reduce(torch.tensor(logged, device=device)),
    "mismatched collectives",
    "debug mode stopped both ranks before the collective",
)
metrics = torch.tensor([0.5, 0.9], device=device)
dist.all_reduce(metrics)
lesson.claim(
    torch.equal(metrics, 2 * torch.tensor([0.5, 0.9], device=device)),
    "the fix: the same two metrics on every rank, summed, and nothing said",
)

# %% [markdown]
# A collective made on some ranks only is the same bug seen one call later: rank 0 logs its loss
# with an all_reduce that rank 1 never makes, so rank 0's all_reduce meets whatever rank 1 sends next
# (under torch nothing: it waits; in debug mode, the step check's all_gather). The fix: log on every
# rank (or log rank 0's loss without a collective).


# %%
# %%distributed
def log_loss(model, ddp, optimizer, group=None, everywhere=False):
    x, y = batch(0)
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    if everywhere or rank == 0:  # the bug: a collective on rank 0 only
        dist.all_reduce(loss.detach().reshape(1), group=group)
    optimizer.step()


said = torch_does(lambda group, short: log_loss(*build(TorchDDP, process_group=group), group=short))
lesson.claim(
    "Timed out" in said[0] and said[1] == "said nothing",
    f"under torch rank 0 waited until the {WAIT_S} s timeout; rank 1 stepped on without a word",
)
minddp_says(lambda: log_loss(*build()), "mismatched collectives", "debug mode stopped both ranks before the collective")
fixed(log_loss, "the loss logged on every rank", everywhere=True)

# %% [markdown]
# ## 5. Uneven inputs
#
# Rank 1 has one batch fewer. It leaves its loop and waits at the script's final barrier, while rank
# 0 starts a step whose collectives rank 1 will never make. Under torch both wait: rank 1 in its
# barrier until the timeout (3 s here), and when it fails and leaves, rank 0's step fails with
# "Connection closed by peer"; neither says which rank ran out, or when.
# Debug mode sees a rank in a step on one side and a rank out of its loop on the other. The fix is
# the one the line names: `model.join()`, which has a rank that ran out shadow the collectives of
# the others' steps (or equal batches per rank: `DistributedSampler(..., drop_last=True)`). Debug
# mode's checks pause while a rank has joined.


# %%
# %%distributed
def uneven(model, ddp, optimizer, group=None):
    for step in range(4 if rank == 0 else 3):  # the bug: rank 1 runs out of data first
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier(group=group)


said = torch_does(lambda group, short: uneven(*build(TorchDDP, process_group=group), group=short))
lesson.claim(
    peer_left(said[0]) and "Timed out" in said[1],
    f"under torch rank 1 waited in its barrier until the {WAIT_S} s timeout, and rank 0 in step 3 until rank 1 left",
)
minddp_says(lambda: uneven(*build()), "uneven inputs: rank 1 left the training loop after step 2")
model, ddp, optimizer = build()
with ddp.join():
    for step in range(4 if rank == 0 else 3):
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
dist.barrier()
lesson.claim(apart(model) == 0, "the fix: under join() nothing is said and both ranks end with the same parameters")

# %% [markdown]
# ## 6. A layer frozen on some ranks is not an unused parameter
#
# Two bugs give the same symptom, a parameter without a gradient on some ranks, and need different
# fixes. A layer frozen on rank 0 only (here after wrapping) makes the ranks disagree on what they
# send; `find_unused_parameters=True` would average rank 0's zeros in. Debug mode compares
# `requires_grad` across ranks before each forward (the forward check). Under torch, the rank that has
# every gradient sends and waits; the other fails at its next forward, saying its module has
# parameters not used in producing loss, and their indices (counted from 0 in the model's order: 2
# and 3 are `head.weight` and `head.bias`), and leaves, so the waiting rank fails too ("Connection
# closed by peer"). The fix: freeze the layer on every rank, before wrapping.


# %%
# %%distributed
def freeze_on_rank_0(wrap, everywhere=False):
    torch.manual_seed(0)
    model = Net().to(device)
    if everywhere:
        model.head.requires_grad_(False)  # the fix: frozen on every rank, before wrapping
    ddp = wrap(model)
    if rank == 0 and not everywhere:
        model.head.requires_grad_(False)  # the bug: frozen on one rank, after wrapping
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    train(model, ddp, optimizer, steps=2)
    return model


said = torch_does(lambda group, short: freeze_on_rank_0(lambda m: TorchDDP(m, process_group=group)))
lesson.claim(
    "not used in producing loss" in said[0] and "indices" in said[0] and peer_left(said[1]),
    "under torch rank 0 failed at its second forward, naming unused parameters by index; rank 1 waited until it left",
)
minddp_says(
    lambda: freeze_on_rank_0(DistributedDataParallel), "requires_grad differs across ranks: parameter 'head.weight'"
)
model = freeze_on_rank_0(DistributedDataParallel, everywhere=True)
lesson.claim(apart(model) == 0, "the fix: frozen on every rank, nothing is said and the replicas agree")

# %% [markdown]
# A branch of the model taken on rank 0 only is the other bug, and here `find_unused_parameters=True`
# *is* the fix: the line says so. Under torch, rank 0 (the one with the branch's gradient) sends and
# waits; rank 1 fails at its next forward (indices 4 and 5: `extra.weight`, `extra.bias`), and when
# it leaves, rank 0 fails too.

# %%
# %%distributed
said = torch_does(lambda group, short: train(*build(TorchDDP, extra=True, process_group=group), 2, use_extra=rank == 0))
lesson.claim(
    peer_left(said[0]) and "not used in producing loss" in said[1] and "indices" in said[1],
    "under torch rank 1 failed at its second forward, naming unused parameters by index; rank 0 waited until it left",
)
# the bug: a branch on rank 0 only
minddp_says(lambda: train(*build(extra=True), 1, use_extra=rank == 0), "Fix: pass find_unused_parameters=True")
model, *rest = build(extra=True, find_unused_parameters=True)
train(model, *rest, 3, use_extra=rank == 0)
lesson.claim(apart(model) == 0, "the fix: with find_unused_parameters=True nothing is said, the replicas agree")

# %% [markdown]
# ## What it costs, and where to read more
#
# Off, debug mode is not there at all: no hook, no message, the same bits and speed. On, each
# collective first costs one store write and one read of the partners' posts when they have posted
# (the read repeats, 0.1 ms to 5 ms apart, while one has not); each step adds the two small
# all_gathers (forward check, step check) with a fingerprint pass over the parameters and the
# gradients, and a fingerprint of each local gradient. minddp's DDP also compares its bucket plan and
# launch order across ranks each step (one more small gather) and sends its buckets one at a time,
# waiting for each, so it overlaps less. What that costs a whole step was measured with an earlier,
# cheaper fingerprint only (`docs/benchmarks.md`, *Debug mode*). `docs/debugging.md` has each check,
# what torch's DDP does on each bug as a script under torchrun (recorded), and what debug mode does
# not see.

# %%
# %dist_shutdown
