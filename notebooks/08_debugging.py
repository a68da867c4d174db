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
# rank hangs, a rank that runs out of data leaves the others waiting. We break DDP on purpose, six
# ways, and read the one line that debug mode prints on every rank for each: the cause, the tensor
# or call, the rank(s), the step, and the fix. Then we fix each bug and watch the line go away.
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
# model, its own batches (a different random stream per rank: its shard of the data), and a helper
# that reads how far the replicas are apart, for the runs where nothing else would tell us.

# %%
# %%distributed
import contextlib
import warnings

from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import minddp.debug
from minddp import DistributedDataParallel
from minddp.notebook import lesson

minddp.debug.enable()  # what `MINDDP_DEBUG=1 torchrun ...` does for every rank when it imports minddp


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


def apart(model) -> float:
    """The largest difference between this rank's parameters and rank 0's (0: the replicas agree)."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    gap = (mine - rank0).abs().max().reshape(1)
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return gap.item()


print(f"rank {rank}: debug mode on, {sum(p.numel() for p in Net().parameters())} parameters")

# %% [markdown]
# ## 1. Replicas that drift apart
#
# DDP keeps the replicas equal by starting them equal and giving each the same averaged gradient.
# Anything that changes a parameter on some ranks only breaks that for good: an in-place edit, a
# `load_state_dict` on rank 0 only, an optimizer with another learning rate on one rank. Here rank 1
# nudges one weight after step 1. Under torch's DDP the loop runs to the end without a word:


# %%
# %%distributed
def drifting_loop(ddp, model, optimizer, steps=4):
    for step in range(steps):
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1 and rank == 1:
            with torch.no_grad():
                model.head.weight[0, 0] += 1e-3  # the bug: one rank edits its replica


model, ddp, optimizer = build(TorchDDP)
drifting_loop(ddp, model, optimizer)
gap = apart(model)
lesson.claim(gap > 0, f"torch's DDP trained 4 steps without an error, and its replicas now differ by up to {gap:.1e}")

# %% [markdown]
# The same loop on `minddp.DistributedDataParallel` in debug mode. Before each forward that will sync,
# every rank sends a fingerprint of each parameter (its bits, weighted by place) in one small all_gather; on a
# mismatch the first differing tensor is compared in full. Every rank stops at the same point, with
# the same line:

# %% tags=["raises-exception"] minddp={"expected_error": "replicas drifted apart: parameter 'head.weight' differs across ranks at step 2"}
# %%distributed
model, ddp, optimizer = build()
drifting_loop(ddp, model, optimizer)

# %% [markdown]
# ## 2. Gradients that were never averaged
#
# DDP averages the gradients of a backward whose forward went through the wrapper. Call the module
# itself (`ddp.module(x)`, or a submodule of it) and backward leaves each rank its own gradient; the
# optimizer then steps each replica its own way. torch's DDP says nothing; minddp checks, before
# each `optimizer.step()` over the wrapped parameters, that the gradients are equal on every rank,
# and says why they are not:

# %% tags=["raises-exception"] minddp={"expected_error": "gradients never averaged: the gradient of 'encoder.weight' differs across ranks"}
# %%distributed
model, ddp, optimizer = build()
x, y = batch(0)
nn.functional.mse_loss(ddp.module(x), y).backward()  # the bug: the module, not the wrapper
optimizer.step()

# %% [markdown]
# The other way to get there: gradient accumulation with every micro-batch inside `no_sync()`,
# the last one included. `no_sync()` only accumulates; the micro-batch that ends a step must sync.

# %% tags=["raises-exception"] minddp={"expected_error": "the step's last backward ran inside no_sync()"}
# %%distributed
model, ddp, optimizer = build()
for micro in range(3):
    with ddp.no_sync():  # the bug: the last micro-batch too
        x, y = batch(micro)
        nn.functional.mse_loss(ddp(x), y).backward()
optimizer.step()

# %% [markdown]
# The fix: the last micro-batch outside `no_sync()`. The check passes, and it found nothing to say:

# %%
# %%distributed
model, ddp, optimizer = build()
for micro in range(3):
    with ddp.no_sync() if micro < 2 else contextlib.nullcontext():
        x, y = batch(micro)
        nn.functional.mse_loss(ddp(x), y).backward()
optimizer.step()
lesson.claim(apart(model) == 0, "after the step every replica holds the same parameters")

# %% [markdown]
# ## 3. Every rank reading the same data
#
# Without a `DistributedSampler` (or any other shard), every rank reads the same batches: nothing is
# corrupted, the world just computes one batch twice. Debug mode sees it from the local gradients,
# fingerprinted before they are averaged: bit-identical on every rank three steps in a row. It is a
# warning, and training goes on:

# %%
# %%distributed
model, ddp, optimizer = build()
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for step in range(4):
        x, y = batch(step, same_on_every_rank=True)  # the bug: no shard per rank
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
lines = [str(w.message) for w in said if "minddp debug" in str(w.message)]
print(lines[0])
lesson.claim(len(lines) == 1, "debug mode warned once, and the 4 steps ran to the end")

# %% [markdown]
# ## 4. Mismatched collectives, the script's own included
#
# A script's own collectives must match across ranks too: the same op, shape and dtype, in the same
# order. Here rank 0 logs two metrics and rank 1 one. Under torch, gloo pairs an all_reduce of 2 values
# with one of 1 and waits (the recorded runs in `docs/debugging.md` show what each such script does
# under torch's DDP; a notebook cell would wait as long). In debug mode every `torch.distributed`
# collective is compared across ranks on a side channel (the process group's store) before it is
# sent, so both ranks stop at once, naming each rank's call and the line it came from:

# %% tags=["raises-exception"] minddp={"expected_error": "mismatched collectives"}
# %%distributed
metrics = torch.tensor([0.5, 0.9] if rank == 0 else [0.5], device=device)  # the bug: loss, accuracy on rank 0 only
dist.all_reduce(metrics)

# %% [markdown]
# A collective made on some ranks only is the same bug seen one call later: rank 0 logs its loss
# with an all_reduce that rank 1 never makes, so rank 0's all_reduce meets whatever rank 1 sends next
# (here the step check's all_gather):

# %% tags=["raises-exception"] minddp={"expected_error": "another op"}
# %%distributed
model, ddp, optimizer = build()
x, y = batch(0)
loss = nn.functional.mse_loss(ddp(x), y)
loss.backward()
if rank == 0:  # the bug: a collective on rank 0 only
    dist.all_reduce(loss.detach().reshape(1))
optimizer.step()

# %% [markdown]
# ## 5. Uneven inputs
#
# Rank 1 has one batch fewer. It leaves its loop and waits at the script's final barrier, while rank
# 0 starts a step whose collectives rank 1 will never make. torch's DDP waits until the timeout. Debug
# mode sees a rank in a step on one side and a rank out of its loop on the other:

# %% tags=["raises-exception"] minddp={"expected_error": "uneven inputs: rank 1 left the training loop after step 2"}
# %%distributed
model, ddp, optimizer = build()
for step in range(4 if rank == 0 else 3):  # the bug: rank 1 runs out of data first
    x, y = batch(step)
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()

# %% [markdown]
# The fix is the one the line names: `model.join()`, which has a rank that ran out shadow the
# collectives of the others' steps (or equal batches per rank: `DistributedSampler(...,
# drop_last=True)`). Debug mode's checks pause while a rank has joined; nothing is said:

# %%
# %%distributed
model, ddp, optimizer = build()
with ddp.join():
    for step in range(4 if rank == 0 else 3):
        x, y = batch(step)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
dist.barrier()
lesson.claim(apart(model) == 0, "with join() both ranks end with the same parameters")

# %% [markdown]
# ## 6. A layer frozen on some ranks is not an unused parameter
#
# Two bugs give the same symptom, a parameter without a gradient on some ranks, and need different
# fixes. A layer frozen on rank 0 only (here after wrapping) makes the ranks disagree on what they
# send; `find_unused_parameters=True` would average rank 0's zeros in. Debug mode compares
# `requires_grad` across ranks before each step:

# %% tags=["raises-exception"] minddp={"expected_error": "requires_grad differs across ranks: parameter 'head.weight'"}
# %%distributed
model, ddp, optimizer = build()
if rank == 0:
    model.head.requires_grad_(False)  # the bug: frozen on one rank
x, y = batch(0)
nn.functional.mse_loss(ddp(x), y).backward()

# %% [markdown]
# A branch of the model taken on rank 0 only is the other bug, and here `find_unused_parameters=True`
# *is* the fix: the line says so.

# %% tags=["raises-exception"] minddp={"expected_error": "Fix: pass find_unused_parameters=True"}
# %%distributed
model, ddp, optimizer = build(extra=True)
x, y = batch(0)
nn.functional.mse_loss(ddp(x, use_extra=rank == 0), y).backward()  # the bug: a branch on rank 0 only
optimizer.step()

# %% [markdown]
# With the flag the same forward trains, and the replicas stay one model:

# %%
# %%distributed
model, ddp, optimizer = build(extra=True, find_unused_parameters=True)
for step in range(3):
    x, y = batch(step)
    nn.functional.mse_loss(ddp(x, use_extra=rank == 0), y).backward()
    optimizer.step()
    optimizer.zero_grad()
lesson.claim(apart(model) == 0, "with find_unused_parameters=True the replicas agree after 3 steps")

# %% [markdown]
# ## What it costs, and where to read more
#
# Off, debug mode is not there at all: no hook, no message, the same bits and speed. On, each
# collective costs a few store round trips, each step two small all_gathers and a pass over the
# parameters and gradients; `docs/benchmarks.md` has the measured cost per step. `docs/debugging.md`
# has each check, what torch's DDP does on each bug (recorded under torchrun), and what debug mode
# does not see.

# %%
# %dist_shutdown
