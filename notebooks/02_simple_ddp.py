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
# We break both on purpose, watch a check fail, and then let `minddp.stages.SimpleDDP` fix them.
# At the end it is your turn: you write `SimpleDDP`, and a checker runs it on real ranks.
#
# Every notebook from here on trains the same workload with the same settings
# (`minddp.notebook.lesson`), so that a number in one notebook means what it means in the next: a
# small Llama-architecture classifier on a generated paraphrase task, nothing downloaded. The cell
# below prints what it is.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.notebook import lesson
from minddp.stages import SimpleDDP
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


lesson.say(lesson.describe())

# %% [markdown]
# ## 1. Parameters out of sync
#
# Each rank builds its model with its own random initialisation (here: a different seed per rank,
# as two processes that never set one would). Rank 0 compares with itself and passes; rank 1 fails.
# This cell is expected to fail (it is tagged `raises-exception`, so *Run All* goes on past it).

# %% tags=["raises-exception"] minddp={"expected_error": "parameters are not in sync"}
# %%distributed
model = lesson.make_model(seed=lesson.SETTINGS.seed + rank)
check_in_sync(model.parameters(), "parameters")

# %% [markdown]
# ## 2. `SimpleDDP` broadcasts rank 0's parameters
#
# Wrapping the model broadcasts every parameter and buffer from rank 0 (step 1 of the class
# docstring). Here is the constructor, the real code of `minddp/stages/simple.py`; then the same
# check, which now passes on every rank. (`check_same_model` first makes sure every rank built the
# same architecture: a broadcast between two different models would hang or mix up tensors.)

# %%
from minddp.notebook.source import show_source
from minddp.stages import SimpleDDP

show_source(SimpleDDP.__init__)

# %%
# %%distributed
ddp = SimpleDDP(model)
check_in_sync(ddp.parameters(), "parameters")

# %% [markdown]
# ## 3. Gradients out of sync
#
# Each rank runs forward and backward on its own shard (the `lesson` data gives every rank a
# different slice of the same global batch), so each holds a different gradient. If the ranks
# stepped now, their models would drift apart again. Expected to fail:

# %% tags=["raises-exception"] minddp={"expected_error": "gradients are not in sync"}
# %%distributed
micro_batches = next(lesson.step_batches())  # this rank's shards of the first step
loss = lesson.loss_fn(ddp, micro_batches[0])
loss.backward()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")

# %% [markdown]
# ## 4. Averaging the gradients
#
# `finish_gradient_synchronization()` hands every gradient to the *comm hook*, waits for the
# result and writes it back. The default hook, `allreduce_hook`, divides by the world size and
# all_reduces (sums): the average. Both are below; the division sits in the hook.
#
# Three names in this code carry no idea of their own; each is here once, and means the same in
# every later stage:
#
# * `GradBucket(index, flat_tensor, parameters, is_last)`: what a comm hook is handed, with
#   torch's names (`minddp/comm/grad_bucket.py`). Here a bucket holds one gradient, flattened;
#   `bucket` (in `03_build_up`) puts several in one;
# * `send(hook, state, bucket)`: `hook(state, bucket)` inside a named profiler range, so that a
#   trace shows when each bucket was handed to the network (`minddp/comm/send.py`). The hook
#   returns a Future at once; `.wait()` is this stage's choice to wait for it right away;
# * `self.parameters_used.check()` (`ParameterUse`, set up in the constructor): before the first
#   gradient is sent, all the ranks check that their forwards used the same parameters; if one
#   rank skipped a layer, the ranks would pair unrelated gradients in their all_reduces, so the
#   check stops them with a message instead (`minddp/stages/checks.py`).
#
# In the constructor, `compat.broadcast` is `torch.distributed.broadcast` under the argument names
# every torch release from 2.6 to 2.15 accepts (`minddp/runtime/compat.py`).

# %%
from minddp.comm.default_hooks import allreduce_hook

show_source(SimpleDDP.finish_gradient_synchronization)
show_source(allreduce_hook)

# %% [markdown]
# The global batch's loss is the mean of the shard losses (the shards are the same size), so this
# average is exactly the gradient one process would compute on the whole global batch. The next
# cell checks that too: every rank also builds the same model in one process (rank 0's seed) and
# runs the whole global batch through it.

# %%
# %%distributed
ddp.finish_gradient_synchronization()
check_in_sync([p.grad for p in ddp.parameters()], "gradients")

single = lesson.make_model()  # the oracle: rank 0's weights, one process
whole = next(lesson.step_batches(whole=True))  # the same first step, every rank's shard at once
lesson.loss_fn(single, whole[0]).backward()
largest = max((p.grad - q.grad).abs().max().item() for p, q in zip(ddp.module.parameters(), single.parameters()))
scale = max(q.grad.abs().max().item() for q in single.parameters())
lesson.say(
    f"Largest difference to the single-process gradient: {largest:.1e}, against gradients up to "
    f"{scale:.1e}: the same up to float rounding (the shards and the global batch are padded "
    f"differently, so the sums run in a different order)."
)
assert largest <= 1e-4 * scale

# %% [markdown]
# ## 5. Training stays in sync
#
# With the same start and the same update, training keeps the replicas identical.
# `minddp.ladder.loop.train_step` is the loop every stage shares: forward and backward for each
# micro-batch, `finish_gradient_synchronization()`, `optimizer.step()`. `SimpleDDP` has no
# `no_sync()`, so the loop has it sync after every micro-batch's backward. A metered hook counts
# what goes over the wire (`Wire(None, traffic=...)`), and the single process trains beside it on the
# global batches.

# %%
# %%distributed
from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.wire import Traffic, Wire

traffic = Traffic()
ddp.register_comm_hook(Wire(None, traffic=traffic), allreduce_hook)
ddp.zero_grad(set_to_none=True)
single.zero_grad(set_to_none=True)
start = [p.detach().clone() for p in single.parameters()]
opt = torch.optim.AdamW(ddp.parameters(), lr=lesson.SETTINGS.lr)
opt_single = torch.optim.AdamW(single.parameters(), lr=lesson.SETTINGS.lr)
mine, everyone = lesson.step_batches(), lesson.step_batches(whole=True)
calls = []
for step in range(3):
    traffic.reset()
    train_step(ddp, opt, next(mine), lesson.loss_fn)
    train_step(single, opt_single, next(everyone), lesson.loss_fn)
    calls.append(traffic.calls)
check_in_sync(ddp.parameters(), "parameters")
flat = lambda params: torch.cat([p.detach().reshape(-1) for p in params])
moved = (flat(single.parameters()) - torch.cat([s.reshape(-1) for s in start])).norm().item()
apart = (flat(ddp.module.parameters()) - flat(single.parameters())).norm().item()
tensors = sum(1 for p in ddp.parameters() if p.requires_grad)
lesson.say(
    f"After {len(calls)} steps the single process's parameters moved by {moved:.2e} (the norm of the change); "
    f"SimpleDDP's are {apart:.1e} from them, {apart / moved:.1e} of that.",
    f"SimpleDDP made {calls[-1]} all_reduce calls a step: one per parameter tensor ({tensors}) after each of "
    f"the {lesson.SETTINGS.grad_accum} micro-batches ({tensors * lesson.SETTINGS.grad_accum}).",
)
assert apart <= 1e-2 * moved

# %% [markdown]
# What to look for: the replicas are equal to the bit (the check compares with `torch.equal`), and
# they follow the single process up to float rounding. (Adam divides each gradient by its own
# running size, so for the tiniest gradients a rounding difference can change an update by a
# good part of the learning rate: that is why the two drift apart a little faster than the
# gradients differ.) And `SimpleDDP` pays for its simplicity:
# it syncs every gradient after every micro-batch, although only the sum over the whole step
# matters. `03_build_up` removes that cost, and then others, one idea per stage.
#
# ## Your turn: write `SimpleDDP`
#
# Fill in the two methods below with plain `torch.distributed` calls (`dist.broadcast`,
# `dist.all_reduce`, `dist.get_world_size()`). `check` then trains your class on two fresh ranks
# (a small network, a few steps of a few micro-batches, a different random start on every rank)
# beside a single process on the global batch and torch's own DDP, and says in one line what is
# wrong, or that it matches: a missing broadcast, gradients summed instead of averaged, a rank
# left waiting in a collective the other never made (it gives up after a timeout, it never hangs),
# the wrong number of collectives.
#
# As it stands the cell raises `NotImplementedError`, and the checker says so.

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
# Stuck? Below is a model answer (`minddp.exercises.solutions`; its input is hidden in Jupyter,
# click to show it) and what the checker says about it.

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions

show_source(solutions.SimpleDDP)
check(solutions.SimpleDDP, like="simple")

# %% [markdown]
# The most common mistake, for the record: `all_reduce` *sums*. Forgetting the division trains
# every replica identically (the ranks still agree!), but on a gradient the world size times too
# large, which a check of the ranks against each other cannot see. The checker compares with
# a single process, so it can:


# %%
class ForgotTheDivision(solutions.SimpleDDP):
    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)


check(ForgotTheDivision, like="simple")

# %% [markdown]
# Next: `03_build_up` makes the same averaging cheaper and earlier, one idea per stage.

# %%
# %dist_shutdown
