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
# We break DDP on purpose,
# nine bugs in six sections, each on the two ranks:
#
# 1. **torch** (*under torch*): debug mode *paused* (`minddp.debug.disable()`), torch's debug
#    level (`TORCH_DISTRIBUTED_DEBUG`) at its default, OFF: what torch says. The script's own
#    collectives run on a group, `short` (*the short group*), whose calls give up after seconds, and
#    torch's DDP on another, `group`, with torch's default timeout; a rank that fails
#    destroys both, so a partner waiting on `group` fails at once;
# 2. **minddp in debug mode**, every collective on the *default group* (all ranks; a call without `group=` uses it):
#    its DDP's checks, and the
#    *collective check* of the `torch.distributed` collectives called. A
#    `DebugError` is raised on every rank at the first check that sees the bug (for every rank reading the same
#    data, a `DebugWarning`, and training goes on);
# 3. **the fix**: the script corrected, in debug mode.
#
# Steps count from 0.
#
# A place is named `<In [N], rank R>:L`: line L (the `%%distributed` line is line 1) of the cell
# Jupyter shows as `In [N]` (run top to bottom, the N-th code cell), as rank R ran it.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %% [markdown]
# The set-up cell's helpers (`minddp/notebook/lesson_08.py`) give every rank the same model (its
# *replica*), `build()`'s `Net` (`encoder`, `head`; `Net(extra=True)` adds a second head,
# `extra`, used given `use_extra=True`), wrapped (`model`, *the wrapper*, is the DDP object;
# `model.module` is the `Net` it wraps), and its own batches (its shard). They run each script:
#
# * `torch_drifts`: `script(model, optimizer)` under torch's DDP, debug mode paused; its ✓ line: nothing raised;
#   the replicas' largest parameter gap after it, and where (debug mode's line: the first parameter or gradient,
#   in the set-up cell's order, that differs, and by how much);
# * `torch_does`: `script(group, short)` with debug mode paused; what each rank raised, cut (…), after the
#   notebook's note in brackets: its step in `train()` (`torch_step`), the seconds from start
#   (`torch_took`); or "raised nothing";
# * `minddp_says`: the `DebugError` debug mode raised on rank 0, then whether each other rank raised
#   the same; its ✓ line: every rank raised one containing the cell's cause;
# * `fixed`: the corrected script in debug mode.

# %%
# %%distributed
import contextlib
import re
import warnings

from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import minddp.debug
from minddp import DistributedDataParallel
from minddp.ddp.debug_reducer import DebugReducer
from minddp.notebook import lesson  # lesson.say(text) prints text; lesson.claim(holds, text) prints ✓ text
from minddp.notebook.lesson_08 import (
    DEFAULT_WAIT_S,
    WAIT_S,
    Net,
    apart,  # apart(model): the largest difference between a rank's parameters and rank 0's
    batch,  # batch(step): this rank's (x, y) of that step; same_on_every_rank=True: the same on every rank
    build,
    cpp_warnings,  # yields the torch C++ warnings written in a block, as "file:line: message"
    each_rank,  # every rank's value, in rank order
    fixed,
    gist,  # a torch C++ warning's first sentence and its advice
    minddp_says,
    mismatched,  # mismatched(script, size): section 4's first bug under torch at OFF, in debug mode, at DETAIL
    peer_gone,  # whether an error says its partner closed the connection ("closed by peer", "reset by peer", ...)
    quiet,  # `with quiet() as said:` said lists the DebugWarnings the block raised (a DebugError raises through)
    say_each,  # rank 0's line printed, then whether each other rank's is the same
    torch_does,
    torch_drifts,  # torch_drifts(script): script(model, optimizer) under torch's DDP; how far its replicas ended apart
    torch_step,
    torch_took,
    train,  # train(model, optimizer, steps, **kw): that many correct steps on this rank's batches, kw to each forward
)
from minddp.runtime.compat import default_group_sequence  # torch's count of the collectives this rank sent

minddp.debug.enable()  # what `MINDDP_DEBUG=1 torchrun ...` does for every rank when it imports minddp
lesson.say(f"Net(extra=True)'s parameters, in order: {', '.join(n for n, _ in Net(extra=True).named_parameters())}")
lesson.say(
    f"Timeouts: the short group's {WAIT_S} s, `group`'s {DEFAULT_WAIT_S / 60:.0f} min (torch's default). "
    f"torch's debug level: {dist.get_debug_level().name}."
)

# %% [markdown]
# ## 1. Replicas that drift apart
#
# DDP keeps the replicas equal by starting them equal and giving each the same averaged gradient.
# Anything that changes a parameter on some ranks only breaks that: here rank 1 nudges one weight
# after step 1. In debug mode, before each forward whose backward will average the gradients (the
# *forward check*), every rank all-gathers a row of integers, `int64[8]` for `Net()`: its 4 parameter
# tensors' `requires_grad` flags, then each one's *fingerprint* (a checksum of its 16-bit words). The fix: change
# parameters the same way on every rank.


# %%
# %%distributed
def drifting_loop(model, optimizer, edit=True):
    for step in range(4):
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if edit and step == 1 and rank == 1:
            with torch.no_grad():
                model.module.head.weight[0, 0] += 1e-3  # the bug: one rank edits its replica


torch_drifts(drifting_loop)
minddp_says(
    lambda: drifting_loop(*build()), "replicas drifted apart: parameter 'head.weight' differs across ranks at step 2"
)
fixed(drifting_loop, "without the edit", edit=False)

# %% [markdown]
# ## 2. Gradients that were never averaged
#
# DDP averages the gradients of a backward whose forward went through the wrapper. Call the module
# itself (`model.module(x)`, or a submodule) and backward leaves each rank its own gradient; the
# optimizer then steps each replica its own way. Before each `optimizer.step()` the *step check*
# all-gathers another row, `int64[17]` for `Net()`: one integer of bits (among them: a forward bypassed the
# wrapper; the step's last forward ran in `no_sync()`, the wrapper's context where a forward's backward does not
# average), then 4 per parameter: has a gradient, its fingerprint, this step's backward computed its *local
# gradient* (this rank's, before averaging), that one's fingerprint. The fix: call the wrapper.


# %%
# %%distributed
def one_step(model, optimizer, through_wrapper=False):
    x, y = batch(0)
    nn.functional.mse_loss((model if through_wrapper else model.module)(x), y).backward()  # the bug: model.module
    optimizer.step()


torch_drifts(one_step)
minddp_says(lambda: one_step(*build()), "the forward did not go through the wrapper")
fixed(one_step, "through the wrapper", through_wrapper=True)

# %% [markdown]
# Gradient accumulation gets there too: step 0 sums the gradients of three *micro-batches*, all inside
# `no_sync()`. The fix: the last micro-batch's forward and backward outside it.


# %%
# %%distributed
def accumulate(model, optimizer, last_syncs=False):
    for micro in range(3):
        with contextlib.nullcontext() if last_syncs and micro == 2 else model.no_sync():  # the bug: all 3 inside
            x, y = batch(micro)
            nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


torch_drifts(accumulate)
minddp_says(lambda: accumulate(*build()), "the step's last forward ran inside no_sync()")
fixed(accumulate, "the last micro-batch synced", last_syncs=True)

# %% [markdown]
# ## 3. Every rank reading the same data
#
# Without a `DistributedSampler` (or another shard), every rank reads the same batches. The step check
# sees it from the local gradients' fingerprints: the same on every rank three steps in a row. The fix:
# a shard per rank.


# %%
# %%distributed
def read(model, optimizer, same=True) -> list[str]:
    """Four steps; every Python warning raised in them (a warning torch's C++ code prints to stderr is not one: see
    section 6)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            x, y = batch(step, same_on_every_rank=same)  # the bug: no shard per rank
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


torch_warned = []
raised = torch_does(lambda group, short: torch_warned.extend(read(*build(TorchDDP, process_group=group))), say=False)
lesson.claim(
    raised == ["raised nothing"] * world_size and torch_warned == [],
    "torch's DDP raised nothing and issued no Python warning",
)
lines = read(*build())
say_each(lines[0] if lines else None, "warned")
lesson.claim(
    len(lines) == 1 and lines[0].startswith("DebugWarning: minddp debug"),
    "debug mode warned once on every rank, and all 4 steps ran",
)
lesson.claim(read(*build(), same=False) == [], "the fix: with a shard per rank, no warning")

# %% [markdown]
# ## 4. Mismatched collectives, the script's own included
#
# The bugs: rank 0 all-reduces loss and accuracy, rank 1 the loss alone; then only rank 0 all-reduces its loss.
# Each fix: the same calls on every rank.
#
# Debug mode numbers each rank's collective calls, group by group, while it is on (*collective #K*;
# the lesson helpers' calls count too), and compares the ranks' calls of the same
# number through torch's key-value store, not a collective.
# A call is written op(dtype[shape], ...) at its place, then its step:
# `(step 0)` in a wrapper's step, `(after step S)` after the last step any wrapper, an earlier cell's too, took on that rank.
# At debug level DETAIL, torch first compares each call's op and shapes across ranks (here on this bug alone,
# which builds no torch DDP; scripts that do crashed: `docs/debugging.md`, section 4).

# %%
# %%distributed
logged = [0.5, 0.9] if rank == 0 else [0.5]  # the bug: loss and accuracy on rank 0, the loss alone on rank 1


def log(group=None):
    dist.all_reduce(torch.tensor(logged, device=device), group=group)


# under torch at OFF, in debug mode, under torch at DETAIL (in a script: dist.set_debug_level(dist.DebugLevel.DETAIL)
# before the groups are made, or TORCH_DISTRIBUTED_DEBUG=DETAIL before init_process_group)
mismatched(log, len(logged))
metrics = torch.tensor([0.5, 0.9], device=device)
with quiet() as said:
    dist.all_reduce(metrics)
lesson.claim(
    not said and torch.equal(metrics, 2 * torch.tensor([0.5, 0.9], device=device)),
    "the fix: the same two metrics on every rank, summed, nothing said",
)

# %% [markdown]
# Under torch rank 0's call, on the short group, has no partner, and rank 1, whose calls are all on `group`, finishes
# (on one group torch hangs: `docs/debugging.md`). minddp's own call is placed at the script's line that led to it;
# an all_gather lists the output (ranks × the input's shape), then the input.


# %%
# %%distributed
def log_loss(model, optimizer, short=None, everywhere=False):
    x, y = batch(0)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if everywhere or rank == 0:  # the bug: a collective on rank 0 only
        dist.all_reduce(loss.detach().reshape(1), group=short)
    optimizer.step()


raised = torch_does(lambda group, short: log_loss(*build(TorchDDP, process_group=group), short=short), say=False)
lesson.say(f"torch, rank 0: {raised[0]}")
lesson.claim(
    "Timed out" in raised[0] and torch_took[0] >= WAIT_S and raised[1] == "raised nothing",
    f"under torch rank 0 timed out at {WAIT_S} s; rank 1 raised nothing",
)
minddp_says(lambda: log_loss(*build()), "mismatched collectives")
fixed(log_loss, "the loss logged on every rank", everywhere=True)

# %% [markdown]
# ## 5. Uneven inputs
#
# Rank 1 has one batch fewer: it waits at the script's final barrier while rank 0 starts a step whose
# collectives rank 1 will never make. The fix: the wrapper's `join()` around the loop, the
# barrier after it: a rank that has run out makes the others' remaining collectives. Inside `join()` the forward
# and step checks pause; the collective check still runs.


# %%
# %%distributed
def uneven(model, optimizer, short=None, joined=False):
    with model.join() if joined else contextlib.nullcontext():  # the fix: under the wrapper's join()
        for step in range(4 if rank == 0 else 3):  # the bug: rank 1 runs out of data first
            x, y = batch(step)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.barrier(group=short)
    return model


raised = torch_does(lambda group, short: uneven(*build(TorchDDP, process_group=group), short=short))
lesson.claim(
    peer_gone(raised[0])
    and "Timed out" in raised[1]
    and torch_took[1] >= WAIT_S
    and not any(re.search(r"rank|step", s, re.I) for s in raised),
    f"under torch rank 1 timed out at {WAIT_S} s, rank 0 lost its partner; neither named a rank or a step",
)
minddp_says(
    lambda: uneven(*build()),
    "uneven inputs: rank 1 left the training loop after step 2",
    "debug mode stopped every rank, naming the rank that ran out and its last step",
)
models = []  # the fix under torch's DDP, its parameters the oracle for minddp's
raised = torch_does(
    lambda group, short: models.append(uneven(*build(TorchDDP, process_group=group), short=short, joined=True)),
    say=False,
)
model, optimizer = build()
with quiet() as said, minddp.debug.collective_check.recorded() as calls:
    model = uneven(model, optimizer, joined=True)
checked = all(each_rank(any(c.op != "barrier" for c in calls)))  # a call inside join(), not the final barrier
# exact: both average 2 ranks' gradients by halving and adding, which round the same in either order
same = all(each_rank(all(torch.equal(a, b) for a, b in zip(model.parameters(), models[0].parameters()))))
lesson.claim(
    raised == ["raised nothing"] * world_size and not said and checked and same,
    "the fix: under join() torch's DDP raised nothing, the collective check compared each rank's calls and said "
    "nothing, and each rank's parameters equal torch's bit for bit",
)

# %% [markdown]
# ## 6. A layer frozen on some ranks is not an unused parameter
#
# Two bugs give the same symptom, a parameter without a gradient on some ranks, and need different
# fixes. A layer frozen on rank 0 only makes the ranks disagree on what they send. torch's errors count parameters from 0 in the set-up
# cell's list (2 and 3 are `head.weight` and `head.bias`); the second cell below tries torch's advice,
# `find_unused_parameters=True`.


# %%
# %%distributed
def freeze_on_rank_0(wrap, everywhere=False):
    torch.manual_seed(0)
    model = Net().to(device)
    if everywhere:
        model.head.requires_grad_(False)  # the fix: frozen on every rank, before wrapping
    model = wrap(model)
    if rank == 0 and not everywhere:
        model.module.head.requires_grad_(False)  # the bug: frozen on one rank, after wrapping
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    train(model, optimizer, steps=2)
    return model


raised = torch_does(lambda group, short: freeze_on_rank_0(lambda m: TorchDDP(m, process_group=group)), say=False)
lesson.say(f"torch, rank 0: {raised[0]}")
lesson.claim(
    "indices which did not receive grad" in raised[0] and peer_gone(raised[1]) and torch_step == [1, 0],
    "under torch rank 0 raised in step 1; rank 1 lost its partner in step 0",
)
minddp_says(
    lambda: freeze_on_rank_0(DistributedDataParallel),
    ("requires_grad differs across ranks: parameters 'head.weight' and 'head.bias'", "at step 0"),
    "debug mode stopped every rank in step 0, naming both parameters; torch gave their indices in step 1",
    also=torch_step[0] == 1,
)
with quiet() as said:
    model = freeze_on_rank_0(DistributedDataParallel, everywhere=True)
lesson.claim(not said and apart(model) == 0, "the fix: frozen on every rank, nothing is said and the replicas agree")


# %%
# %%distributed
def advised(group, short):
    models.append(freeze_on_rank_0(lambda m: TorchDDP(m, process_group=group, find_unused_parameters=True)))


models = []
with cpp_warnings() as warned:
    raised = torch_does(advised, say=False)
model = models[0]
torch.manual_seed(0)
moved = each_rank(not torch.equal(model.module.head.weight, Net().to(device).head.weight))  # Net(): head as built
lesson.claim(
    raised == ["raised nothing"] * world_size and moved == [False, True] and apart(model) > 0,
    "with find_unused_parameters=True torch's DDP raised nothing, but only rank 1's head.weight moved: the "
    "replicas ended apart",
)
warnings_of = each_rank(warned)
lesson.claim(
    warnings_of[0] == []
    and len(warnings_of[1]) == 1
    and "did not find any unused parameters" in warnings_of[1][0]
    and not ("head" in warnings_of[1][0] or "requires_grad" in warnings_of[1][0]),
    "torch's C++ code warned once, on rank 1 only, of the flag, not the frozen layer:",
)
lesson.say(gist(warnings_of[1][0]))

# %% [markdown]
# A branch (`extra`) taken on rank 0 only is the other bug, and here `find_unused_parameters=True`
# *is* the fix: a rank that did not take the branch has a true gradient of zero for it.

# %%
# %%distributed
off = torch_does(  # the flag off, torch's default
    lambda group, short: train(*build(TorchDDP, extra=True, process_group=group), 2, use_extra=rank == 0), say=False
)
indices = re.search(r"Parameter indices which did not receive grad for rank \d+:[\d ]*\d", off[1])
lesson.say(f"torch, rank 1: {off[1].split('. ')[0]}. … {indices[0] if indices else ''} …")
lesson.claim(
    peer_gone(off[0])
    and torch_step == [0, 1]
    and "did not receive grad for rank 1: 4 5" in off[1]
    and [n for n, _ in Net(extra=True).named_parameters()][4:] == ["extra.weight", "extra.bias"],
    "rank 1 raised in step 1 (4 and 5 are extra.weight and extra.bias); rank 0 lost its partner in step 0",
)
# the bug: a branch on rank 0 only
minddp_says(
    lambda: train(*build(extra=True), 1, use_extra=rank == 0),
    ("Fix: pass find_unused_parameters=True", "parameters 'extra.weight' and 'extra.bias'", "in step 0"),
    "debug mode stopped every rank in step 0, naming both parameters; torch gave their indices in step 1",
    also=torch_step[1] == 1,
)


def flagged(wrapper, **kwargs):
    """The fix: 3 steps, the branch still on rank 0 only, with find_unused_parameters=True."""
    model, optimizer = build(wrapper, extra=True, find_unused_parameters=True, **kwargs)
    train(model, optimizer, 3, use_extra=rank == 0)
    return model


models = []
with cpp_warnings():  # torch's C++ warnings caught, not printed
    raised = torch_does(lambda group, short: models.append(flagged(TorchDDP, process_group=group)), say=False)
with quiet() as said:
    model = flagged(DistributedDataParallel)
lesson.claim(
    raised == ["raised nothing"] * world_size and apart(models[0]) == 0 and not said and apart(model) == 0,
    "the fix: with find_unused_parameters=True torch's DDP raised nothing, debug mode said nothing, and under both "
    "the replicas agree",
)

# %% [markdown]
# ## The collectives it adds
#
# A wrapper built in debug mode has a `DebugReducer` as its *Reducer* (which averages the gradients in *buckets*):
# each bucket goes through the collective check as a blocking all_reduce. It adds three collectives to each step
# like step 4 (one forward, backward and `optimizer.step()`, outside `join()`): the forward and step checks'
# all_gathers and, at the end of backward, the *consistency guard*'s all_gather_object (2 all_gathers in torch's
# count, `default_group_sequence()`), comparing the ranks' bucket plans (which parameters each bucket holds) and
# launch orders (the order buckets are sent). Nothing here timed them.


# %%
# %%distributed
def five_steps(on: bool):
    """5 steps of the correct script with debug mode on or paused: the wrapper, its parameters, and in step 4 the
    calls the collective check compared and the collectives this rank sent."""
    (minddp.debug.enable if on else minddp.debug.disable)()
    model, optimizer = build()
    train(model, optimizer, steps=4)
    sent = default_group_sequence()
    with minddp.debug.collective_check.recorded() as calls:
        x, y = batch(4)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    sent = default_group_sequence() - sent
    minddp.debug.enable()
    return model, [p.detach().clone() for p in model.parameters()], calls, sent


(paused, paused_params, _, paused_sent), (on, on_params, checked, on_sent) = five_steps(False), five_steps(True)
added = {"forward check": "all_gather", "end of backward": "all_gather_object", "step check": "all_gather"}
debug_calls = [c for c in checked if "bucket" not in c.where]
buckets = len(checked) - len(debug_calls)  # the buckets' all_reduces
lesson.claim(
    [c.op for c in debug_calls] == list(added.values())
    and all(name in c.where for name, c in zip(added, debug_calls))
    and [c.op for c in checked if "bucket" in c.where] == ["all_reduce"] * buckets
    and paused_sent == buckets == len(on.reducer.plan) == len(paused.reducer.plan) == 1  # plan: a reducer's buckets
    and on_sent == len(checked) + 1  # keep.all_gather_object: an all_gather of the sizes, then one of the bytes
    and isinstance(on.reducer, DebugReducer)
    and not isinstance(paused.reducer, DebugReducer)
    and on.check_consistency  # the consistency guard
    and not paused.check_consistency,
    f"in step 4 the paused wrapper sent {paused_sent} collective, one per bucket; debug mode's sent {len(checked)} "
    "through the collective check: its bucket's all_reduce, the forward and step checks' all_gathers and the "
    f"guard's all_gather_object ({on_sent} by torch's count)",
)
# exact: both reducers halve each gradient, then add the 2 ranks', which rounds the same in either order
lesson.claim(
    all(each_rank(all(torch.equal(a, b) for a, b in zip(paused_params, on_params)))),
    "each rank's parameters ended bit for bit as when paused",
)

# %%
# %dist_shutdown
