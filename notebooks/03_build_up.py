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
# # 03 · The build-up: one idea per stage
#
# `SimpleDDP` waits until backward is over, then sends one all_reduce per parameter, after every
# micro-batch. Each stage below changes one thing about *when* or *how much* is sent, never the
# averaged gradients. The stages in this order, from `simple` up, are the *ladder*; each is a *rung*.
#
# Each stage from `ga` to `bucket-async` has five parts:
#
# 1. **the idea**, in words and, where it is new, in plain code;
# 2. **the code**: the stage's class in `minddp/stages/`, and **what changed** from the stage
#    before, method by method. Besides the idea's lines, a class sends its gradients
#    through the *comm hook* (`self.comm_hook(self.comm_state, GradBucket(...))`; `04_comm_hooks`
#    swaps it); once in each synced backward it checks that every rank's
#    forwards used the same parameters (`parameters_used.check()`, one all_gather: after backward for
#    `simple` and `ga`, at the backward's first gradient from `hook` on); and from `hook-async` on it
#    refuses a step whose last sync was left unfinished. A comment *step 1*,
#    *step 2* numbers the parts of the idea, not training steps;
# 3. **a run on real ranks**: one warm-up step, then one profiled step, and **a picture** of it, the
#    stage before faded above it;
# 4. **what to look for**: what the picture shows, and sentences printed from the run; those with a ✓
#    are asserted on the run shown (`lesson.claim`);
# 5. **your turn**: write the stage; the *checker* runs it on real ranks and says what is wrong.
#
# Until "The cap, swept", every stage trains the same network on the same batches: the workload
# printed below.

# %% [markdown]
# ### The link, and the words used below
#
# Notation and measures are those of `01_collectives` and `docs/analysis.md`; 03 adds these.
#
# **The link.** Every message, until "Links sized with two settings' ratios", goes over an **emulated 1 Gbit/s link**
# (`minddp.comm.link`): the real all_reduce runs, so every result is exact, but it completes no earlier
# than it would on Gigabit Ethernet, one message at a time. That time is *modeled*: the same on every run
# and machine. The training thread's waits are *measured*.
#
# **Measures**, 01's. α, β (1/bandwidth), n and m as there; k is the micro-batches of a step. A *message* is one
# all_reduce handed to the link (a gradient, or a *bucket*: several sent as one; the comm hook takes either as a
# `GradBucket`, torch's type); its *fixed cost* is 2(n−1)·α. Over
# the link's modeled transfers: *link time*, the step's messages' time on the link; *exposed*, the part
# of it the training thread stood waiting through. A *wait* is one call of a message's `wait()`, which
# may find it already back; *waited* is the
# measured time the thread stood still for its messages: the exposed part and any *waiting after the
# link had delivered* (for the other rank, or a core of this shared machine), which the link does not
# model. The time the parameters-used check (*the check*; not the checker) *holds* a rank is in neither.
#
# **Words of this notebook.** `hook` in code type is a stage. A *grad hook* is the function autograd
# calls when a parameter's gradient is ready (`register_post_accumulate_grad_hook`; `hook` and every
# stage after it sync from one). *The network* is what every stage trains; *the link* carries the
# messages (the *interconnect* of the blog this notebook follows, blog.underfit.ai/ddp-profiled). *Backward* is the span the
# pictures draw, from its first operator to its last; `loss.backward()` runs on after it (ddp's and torch's
# waits). The *step-time model* (`minddp.costmodel`)
# replays a step on the link.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.comm.link import parse_link
from minddp.notebook import lesson, lesson_03

LINK, looks, k = parse_link("1gbit"), {}, lesson.SETTINGS.grad_accum


def meet(stage, before=None):
    """Build `stage` on this rank (one warm-up step), take one profiled step over LINK, say and draw it."""
    looks[stage] = lesson.Trainee(stage, link=LINK).look()
    looks[stage]["row"]["checks"] = looks[stage]["check_spans"]  # drawn hatched red: the thread stood there too
    lesson.say_look(looks, stage)
    if stage in ("simple", "ga", "hook", "hook-async", "bucket", "bucket-async"):  # the stages with a check
        on_ranks = lesson_03.checks_on_ranks(looks, [stage])[stage]
        lesson_03.say_check(stage, on_ranks, looks[stage]["check_spans"])
    lesson_03.say_slow(stage, looks)  # a pass slowed past say_slow's bound, said
    title = f"{stage}" + (f" (below) and {before} (faded)" if before else "") + ", rank 0"
    lesson.picture(looks, stage, before, title=title)


lesson.say(lesson.describe())
lesson.say(lesson.machine())
fixed, per_mib = (LINK.seconds("all_reduce", m, world_size) * 1e3 for m in (0, 2**20))
lesson.say(
    f"The emulated link: {LINK.describe()}. One all_reduce of m bytes between n = {world_size} ranks takes "
    f"2(n−1)·α + 2(n−1)/n · m·β: {fixed:.1f} ms of fixed cost (2(n−1) hops of α = {LINK.latency * 1e6:g} µs) "
    f"plus {per_mib - fixed:.1f} ms per MiB."
)

# %%
import contextlib
import inspect
import sys

import torch  # torch, dist and nn: for your own stages in the exercises below
import torch.distributed as dist
from torch import nn

from minddp.exercises import check, solutions
from minddp.ladder import STAGES
from minddp.notebook.source import show_diff, show_doc, show_source

# %% [markdown]
# ## No communication at all (`single`)
#
# Here each rank trains its own shard and never talks to the other: not data parallelism (the
# replicas drift apart), with no message at all. The picture is one step: the forward (pale) and
# backward (blue) of each micro-batch, then the optimizer (green); the black line is the end of the
# step. A bar's length, here and below, is one step's on a shared machine.
# The stages below add messages (orange, the legend's *message on the wire*: the link's modeled transfer, two shades
# alternating; a tick under the row where each was handed over), waits (red: the thread standing still until a message's
# all_reduce returns), the parameters-used check (hatched red; the legend's *parameter check*: its all_gather holds a rank until the other rank joins it) and `finish_gradient_synchronization()` (a
# thin purple strip, the legend's *finish*).

# %%
# %%distributed
meet("single")

# %% [markdown]
# ## `simple`: average every gradient after every backward
#
# The stage of `02_simple_ddp`: broadcast at the start, and after each backward, every gradient
# through the comm hook, one at a time, waiting for each.

# %%
show_source(STAGES["simple"])

# %%
# %%distributed
meet("simple", before="single")
v = looks["simple"]
lesson.claim(
    v["calls"] == v["buckets"] * k,
    f"{v['calls']} all_reduce calls = {v['buckets']} parameter tensors × "
    f"{k} micro-batches: one message per gradient, after every micro-batch.",
)
lesson.claim(
    v["calls_in_backward"] == 0 == v["waits_in_backward"],
    "No message is sent, and none waited for, while a backward runs.",
)

# %% [markdown]
# What to look for: three bursts of messages, one after each backward, each waited for (red)
# before the next micro-batch may start.
#
# ## `ga`: gradient accumulation, `no_sync()`
#
# Autograd *adds* each micro-batch's gradient into `.grad`, and the loop divides each micro-batch's
# loss by k before its backward, so after the last one `.grad` holds the step's mean, not a sum over
# micro-batches. Averaging is linear, so syncing once, after the last micro-batch, gives the same
# gradient as syncing after every one. Inside `with model.no_sync():` a forward records that its
# backward must not sync; the last micro-batch runs outside the block. The idea, in a training step of k micro-batches, as the ladder's loop
# (`minddp.ladder.loop.train_step`) drives every stage:
#
# ```python
# no_sync = getattr(model, "no_sync", None)                          # simple has none
# finish = getattr(model, "finish_gradient_synchronization", None)   # torch's DDP has none
# for i, batch in enumerate(micro_batches):
#     quiet = no_sync is not None and i < len(micro_batches) - 1
#     with no_sync() if quiet else contextlib.nullcontext():
#         (loss_fn(model, batch) / k).backward()    # the forward records whether this backward syncs
#     if finish is not None:
#         finish()                                  # after every backward: syncs only after the last
# ```
#
# The loop calls `finish_gradient_synchronization()` after every backward, outside the with-block,
# so finish cannot ask `no_sync()` whether to sync: it reads what the forward recorded.

# %%
show_source(STAGES["ga"])
show_diff(STAGES["simple"], STAGES["ga"])

# %%
# %%distributed
meet("ga", before="simple")
v, prev = looks["ga"], looks["simple"]
lesson.claim(
    v["calls"] * k == prev["calls"] and v["bytes"] * k == prev["bytes"],
    f"ga sends 1/{k} of simple's calls and bytes: one sync per step instead of one per micro-batch.",
)
lesson.claim(
    abs(v["link_ms"] * k - prev["link_ms"]) <= 1e-9 * prev["link_ms"],
    f"So its messages need 1/{k} of simple's time on the link: {v['link_ms']:.0f} ms against {prev['link_ms']:.0f} ms.",
)

# %% [markdown]
# What to look for: after the last backward, one burst of messages
# with the thread's waits for them (red); the micro-batches before run straight on into each other.
#
# ### Your turn: `ga`
#
# Write `no_sync()`, `forward()` and `finish_gradient_synchronization()` on top of the solution
# of `simple` (`solutions.SimpleDDP`, plain `torch.distributed`). The checker trains it with
# several micro-batches per step, calling finish after every backward; in some steps it runs only
# the forwards inside `no_sync()` and their backwards after it, so the decision must be taken at
# forward; it also nests a `no_sync()` inside
# another, whose sync must stay off when the inner one ends, as torch's does, and raises inside one,
# after which the flag must be what it was before. It trains a small network of its own (6 parameter
# tensors), so the counts it prints are that network's.


# %%
class MyGradAccumDDP(solutions.SimpleDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.sync_this_backward = True  # what the last forward decided

    @contextlib.contextmanager
    def no_sync(self):
        # Your turn: require_backward_grad_sync is False while the with-block runs, and after it what it was before.
        raise NotImplementedError("no_sync()")
        yield

    def forward(self, *inputs, **kwargs):
        # Your turn: record whether the coming backward syncs, then run the module.
        raise NotImplementedError("forward()")

    def finish_gradient_synchronization(self):
        # Your turn: average the gradients (super() does) only if this backward syncs.
        raise NotImplementedError("finish_gradient_synchronization()")


check(MyGradAccumDDP, like="ga")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.GradAccumDDP)
check(solutions.GradAccumDDP, like="ga")

# %% [markdown]
# ## `hook`: sync each gradient as soon as autograd has finished it
#
# The last layer's gradient is final before the first layer's is computed. A
# *post-accumulate-grad hook* on each parameter fires right after autograd has added this
# backward's contribution into `param.grad`: the accumulated gradient, the one to sync (a plain
# tensor hook would hand over only the incoming gradient of this micro-batch). This grad hook sends the
# gradient and, in this stage, waits for the result before backward may go on: the messages move
# into the backward, but the backward's operators stand still while each travels. The idea:
#
# ```python
# for p in params:
#     p.register_post_accumulate_grad_hook(self._grad_ready)
#
# def _grad_ready(self, p):                    # autograd has finished p.grad for this backward
#     if self.sync_this_backward:
#         dist.all_reduce(p.grad)              # inside backward: backward waits here
#         p.grad /= dist.get_world_size()
# ```

# %%
show_source(STAGES["hook"])
show_diff(STAGES["ga"], STAGES["hook"])

# %%
# %%distributed
meet("hook", before="ga")
v = looks["hook"]
lesson.claim(
    v["calls"] == v["calls_in_backward"] == looks["ga"]["calls"],
    "hook sends ga's messages, every one of them from inside the last backward.",
)
lesson.claim(
    v["waits"] == v["waits_in_backward"] == v["calls"],
    "And the training thread waits for each of them inside the backward.",
)

# %% [markdown]
# What to look for: the messages and the waits have moved into the last backward, which stops at
# every gradient until its all_reduce is back (each stop a red wait).
#
# ### Your turn: `hook`
#
# Register a post-accumulate-grad hook on every parameter and average the gradient in it, only in
# backwards that sync. Build on `solutions.GradAccumDDP`, which keeps `sync_this_backward` for you.
# The checker names a stage that syncs the incoming gradient instead of the accumulated one, one
# that syncs inside `no_sync()`, and one that still sends everything after backward.


# %%
class MyHookDDP(solutions.GradAccumDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        # Your turn: register self._grad_ready as a post-accumulate-grad hook on every trainable parameter.
        raise NotImplementedError("register the hooks")

    def _grad_ready(self, param):
        # Your turn: if this backward syncs, replace param.grad by its average over the ranks, now.
        raise NotImplementedError("_grad_ready()")

    def finish_gradient_synchronization(self):
        pass  # nothing left: every gradient was averaged in backward


check(MyHookDDP, like="hook")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.HookDDP)
check(solutions.HookDDP, like="hook")

# %% [markdown]
# ## `hook-async`: start each all_reduce and keep going
#
# One change: the grad hook keeps the all_reduce's *work* (through the comm hook, a Future;
# both have `wait()`) instead of waiting on it, so backward no longer stops at each message. Each is waited for once, in
# `finish_gradient_synchronization()`, just before the optimizer step. The idea:
#
# ```python
# def _grad_ready(self, p):
#     if self.sync_this_backward:
#         p.grad /= dist.get_world_size()
#         self.in_flight.append(dist.all_reduce(p.grad, async_op=True))   # no wait: backward goes on
#
# def finish_gradient_synchronization(self):
#     for work in self.in_flight:
#         work.wait()
#     self.in_flight.clear()
# ```

# %%
show_source(STAGES["hook-async"])
show_diff(STAGES["hook"], STAGES["hook-async"])

# %%
# %%distributed
meet("hook-async", before="hook")
v, prev = looks["hook-async"], looks["hook"]
lesson.claim(
    v["calls"] == prev["calls"] == v["calls_in_backward"],
    "hook-async sends as many messages as hook, every one from inside the backward.",
)

# %% [markdown]
# What to look for: messages on the wire while the backward goes on, and no wait for a message inside
# it; hatched: the check (line above).
#
# ### Your turn: `hook-async`
#
# Start the all_reduce with `async_op=True`, keep its work, and wait for all of them in finish.


# %%
class MyAsyncHookDDP(solutions.HookDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []  # the works of the all_reduces started

    def _grad_ready(self, param):
        # Your turn: if this backward syncs, start the all_reduce of param.grad without waiting; keep it.
        raise NotImplementedError("_grad_ready()")

    def finish_gradient_synchronization(self):
        # Your turn: wait for each one, then forget them (divide by the world size once: before the send,
        # as the idea above does, or here after the wait, not both).
        raise NotImplementedError("finish_gradient_synchronization()")


check(MyAsyncHookDDP, like="hook-async")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.AsyncHookDDP)
check(solutions.AsyncHookDDP, like="hook-async")

# %% [markdown]
# ## `bucket`: fewer, bigger messages
#
# Every all_reduce pays the link's fixed cost, 2(n−1)·α: once per parameter tensor without buckets,
# once per bucket with them. At construction the parameters are grouped, in reverse order (roughly, not always, the order
# backward produces them in: a later bucket can fill first), into buckets of about `bucket_cap_mb` (torch's rule,
# `plan_buckets`); in the grad hook each parameter is counted in its bucket, and when the bucket's last
# gradient is in, the bucket is flattened into one buffer and sent in one call; when the average is
# back, each slice is copied into its parameter's `.grad`. Like `hook`, this stage waits for each
# bucket. A cap given (the workload gives one) is every bucket's, as in torch. A bucket closes at the gradient
# that reaches or passes its cap, so it can hold more. The idea:
#
# ```python
# def _grad_ready(self, p):
#     if not self.sync_this_backward:          # inside no_sync(): count nothing, send nothing
#         return
#     b = self.bucket_of[p]
#     self.waiting[b] -= 1
#     if self.waiting[b] == 0:                 # the bucket's last gradient is in: one message for all
#         members = self.buckets[b]
#         self.waiting[b] = len(members)       # counted afresh in the next synced backward
#         flat = torch.cat([q.grad.reshape(-1) for q in members])
#         dist.all_reduce(flat)
#         flat /= dist.get_world_size()
#         for q, piece in zip(members, flat.split([q.numel() for q in members])):
#             q.grad.copy_(piece.view_as(q.grad))
# ```

# %%
show_source(STAGES["bucket"])
show_diff(STAGES["hook-async"], STAGES["bucket"])

# %%
# %%distributed
meet("bucket", before="hook-async")
v, prev = looks["bucket"], looks["hook-async"]
lesson.claim(
    v["calls"] == v["buckets"] and v["bytes"] == prev["bytes"],
    f"bucket sends the same bytes in "
    f"{v['calls']} calls, one per bucket (cap {lesson.SETTINGS.bucket_cap_mb:g} MiB), instead of {prev['calls']}.",
)
lesson.claim(
    v["waits"] == v["waits_in_backward"] == v["calls"], "Like hook, it waits for each bucket inside the backward."
)
lesson_03.say_exposed_parts(looks, "bucket", "hook")

# %% [markdown]
# What to look for: a few wide messages instead of many thin ones, and the last backward's length. `bucket` takes `hook`'s
# waiting `_sent`, not `hook-async`'s. One more difference from the idea: the stage sets the counts
# back in finish, not at the send, after sending any bucket that did not fill,
# and its `forward` refuses a step while they are not back (`check_finished`).
#
# ### Your turn: `bucket`
#
# The plan is given (`plan_buckets`, with the checker's cap for every bucket, the first too). Count each gradient in its bucket; at the bucket's last gradient, flatten it with
# `torch.cat`, all_reduce it once, divide, and copy each slice back into its `.grad`. The checker
# uses a cap that gives its small network two buckets.

# %%
from minddp.stages.bucket_plan import plan_buckets


class MyBucketDDP(solutions.HookDDP):
    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [[params[i] for i in bucket] for bucket in plan_buckets(params, bucket_cap_mb)]
        self.bucket_of = {p: b for b, members in enumerate(self.buckets) for p in members}
        self.waiting = [len(members) for members in self.buckets]  # gradients each bucket still waits for

    def _grad_ready(self, param):
        # Your turn: count param in its bucket; at the bucket's last gradient, sync the whole bucket in one
        # all_reduce and write the averages back; reset the count for the next backward.
        raise NotImplementedError("_grad_ready()")


check(MyBucketDDP, like="bucket")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.BucketDDP)
check(solutions.BucketDDP, like="bucket")

# %% [markdown]
# ## `bucket-async`: buckets sent while backward goes on
#
# No new idea: `bucket`'s buckets with `hook-async`'s not-waiting: keep each bucket's work, wait
# for them all in finish. Each bucket leaves when full; `ddp` sends in its plan's order, a plan rebuilt
# from the order backward produced the gradients in.

# %%
show_source(STAGES["bucket-async"])
show_diff(STAGES["bucket"], STAGES["bucket-async"])

# %%
# %%distributed
meet("bucket-async", before="bucket")
v, prev = looks["bucket-async"], looks["bucket"]
lesson.claim(
    v["calls"] == prev["calls"] and v["waits_in_backward"] == 0,
    "bucket-async sends bucket's messages and waits for none of them inside a backward.",
)

# %% [markdown]
# What to look for: `bucket`'s few messages leaving while the backward goes on, no wait inside it,
# and messages still on the link after it, waited for in finish (red); hatched: the check (line above).
#
# ### Your turn: `bucket-async`
#
# Start each bucket's all_reduce without waiting, and finish them all in
# `finish_gradient_synchronization()`. Build on the solution `solutions.BucketDDP`, not on the
# ladder's stage shown in this section. The
# solution's helper is `_write_back(grads, average)`: it copies the averaged flat buffer into the
# bucket's gradient tensors `grads`.


# %%
class MyAsyncBucketDDP(solutions.BucketDDP):
    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight = []  # what finish needs for each bucket sent

    def _send_bucket(self, b):
        # Your turn: flatten bucket b's gradients, start its all_reduce with async_op=True, and keep what finish
        # needs: the gradient tensors, the flat buffer and the work.
        raise NotImplementedError("_send_bucket()")

    def finish_gradient_synchronization(self):
        # Your turn: wait for every bucket, then self._write_back(grads, flat / world size); then empty the list.
        raise NotImplementedError("finish_gradient_synchronization()")


check(MyAsyncBucketDDP, like="bucket-async")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.AsyncBucketDDP)
check(solutions.AsyncBucketDDP, like="bucket-async")

# %% [markdown]
# ## `ddp`: torch's DDP, rebuilt
#
# The teaching stages stop at `bucket-async`. `minddp.DistributedDataParallel` is the stage a
# training script uses: a drop-in for `torch.nn.parallel.DistributedDataParallel`, built as torch
# builds its DDP (a module that owns a reducer), in `minddp/ddp/`.

# %%
show_doc(sys.modules[STAGES["ddp"].__module__])

# %%
# %%distributed
meet("ddp", before="bucket-async")
v = looks["ddp"]
lesson.claim(
    v["calls"] == v["calls_in_backward"] and v["waits_in_backward"] == 0,
    "ddp sends every bucket from inside the backward and waits for none before its last operator.",
)

# %% [markdown]
# ## `torch`: torch's own DDP, the baseline
#
# The same workload through `torch.nn.parallel.DistributedDataParallel`, with the same bucket size.
# Its reducer is C++; on the emulated link it hands each bucket to minddp's allreduce comm hook
# (`minddp.ladder.wrap` registers it), which sends it over the link, so it is counted the same way.

# %%
# %%distributed
meet("torch", before="ddp")
v = looks["torch"]
lesson.claim(
    v["calls"] == v["calls_in_backward"] == looks["ddp"]["calls"],
    "torch's DDP sends as many buckets as ddp, every one from inside the backward.",
)


# %% [markdown]
# ## Side by side: the ladder on one time axis
#
# Every profiled step above on one axis, and
# their numbers (units in the column names). *Last
# backward less the check*: the backward of the step's last micro-batch, less rank 0's time at the check inside it (from `hook` to `bucket-async`); `hook`'s and
# `bucket`'s include their waits. *At the check*: the time the check held each rank, summed over the step's checks ("–": no
# check). torch's waits are not seen (–).

# %%
# %%distributed
lesson.picture(
    looks,
    None,
    rows=list(looks),
    title="One step of every stage on one time axis, each message over the emulated 1 Gbit/s link (rank 0)",
)
ladder = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
checks = lesson_03.checks_on_ranks(looks, ladder)  # each rank's own time at the check

# %%
# %%rank 0
lesson_03.look_table(looks, checks)

# %% [markdown]
# The calls and the link time are counted and modeled: the same on every run. Every other column is
# one step. Where a step ends includes its checks (*at the check*): do not rank stages by it.

# %% [markdown]
# ## The bucket lesson: what buckets trade
#
# `hook-async` and `bucket-async` send the same bytes, one message per gradient against one per
# bucket, both during the last backward, and wait for them in finish. On the link, a bucketed stage
# trades three things against a per-gradient one:
#
# 1. **per message**: the fixed cost, 2(n−1)·α on the link, once per bucket instead of once per gradient
#    tensor;
# 2. **the late start**: nothing goes to the link before some bucket's last gradient is ready, while a
#    per-gradient stage's first message needs only one gradient;
# 3. **the last transfer**: the last message's, a bucket against one tensor, can run
#    past backward's end.
#
# The link carries one message at a time, so its last transfer ends at the latest of, over the messages i,
# "message i handed over, then i and every message after it back to back"
# (`minddp.costmodel.buckets.queue_end`). The transfers' time still to run when backward ends is *link after backward* (in a
# step run: the modeled transfers, from each message's measured hand-over, against the measured backward's end);
# for a stage that waits only in finish, as these two, it is the most its step can expose. When each gradient is ready comes from the *bare network*
# (no wrapper, hooks, messages or profiler), timed here.

# %%
# %%distributed
from minddp.costmodel.buckets import on_the_link
from minddp.costmodel.compute import probe
from minddp.stages.bucket_plan import plan_buckets

per_message_ms = LINK.seconds("all_reduce", 0, world_size) * 1e3  # 2(n−1)·α: one message's fixed cost on the link
per_grad, bucketed = (on_the_link(looks[s]["row"]) for s in ("hook-async", "bucket-async"))
saved = (per_grad["messages"] - bucketed["messages"]) * per_message_ms
lesson.claim(
    abs(per_grad["link_ms"] - bucketed["link_ms"] - saved) < 1e-6 * per_grad["link_ms"],
    f"Per message: bucket-async sent {bucketed['messages']} messages instead of {per_grad['messages']}, which saved "
    f"{per_grad['messages'] - bucketed['messages']} × {per_message_ms:.2f} ms = {saved:.1f} ms of link time.",
)
lesson.claim(  # modeled: the last message's bytes over the link, the same on every machine
    bucketed["tail_ms"] > per_grad["tail_ms"],
    f"Last transfer: bucket-async's last bucket takes {bucketed['tail_ms']:.1f} ms on the link, hook-async's "
    f"last gradient {per_grad['tail_ms']:.1f} ms.",
)
# when each gradient is ready, on the bare network (no wrapper, no hooks): the last micro-batch's backward, timed
# twice after a warm-up pass (the step-time model's probe)
bare_model = lesson.make_model()
bare = probe(bare_model, next(lesson.step_batches())[-1:], lesson.loss_fn, repeats=2, measure_network=False)
plan = plan_buckets([p for p in bare_model.parameters() if p.requires_grad], lesson.SETTINGS.bucket_cap_mb)
why, table = lesson_03.bucket_costs(looks, per_message_ms, bare, plan)


# %%
# %%rank 0
table

# %% [markdown]
# ### The cap, swept
#
# The cap decides all three costs: a small cap makes many small buckets (many fixed costs, a short
# last transfer). Below, `bucket-async` runs one
# profiled step, no warm-up, at other caps on the same link (the workload's cap is the step above;
# `None`: torch's default, 25 MiB after a first bucket of 1 MiB, drawn right of the grid). The
# step-time model (`docs/scaling.md`) replays each cap's plan on the link, with the bare network's
# timings scaled to the median of the five steps' backwards (less the check), *the sweep's median backward*. The lower
# panel: the model's three costs of each cap but None; the table's, of all.

# %%
# %%distributed
import statistics

from minddp.costmodel.buckets import plan_costs
from minddp.costmodel.compute import plan_for
from minddp.costmodel.project import cp_scaled

swept = {lesson.SETTINGS.bucket_cap_mb: looks["bucket-async"]}
for cap in (0.5, 2, 8, None):  # one profiled step each, no warm-up step: the counts hold from the first
    swept[cap] = lesson.Trainee("bucket-async", link=LINK, bucket_cap_mb=cap, warmup=0).look()
this_run = statistics.median(lesson.backward_less_check(v) for v in swept.values()) / 1e3
cp = cp_scaled(bare, this_run / bare.backward)  # the bare network's timings at this run's speed
grid = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32]
model = [plan_costs(cp, "bucket-async", c, LINK, world_size) for c in grid]
default = plan_costs(cp, "bucket-async", None, LINK, world_size)
# counts: each run's all_reduce calls against its plan (the plan is computed, the calls are counted)
lesson.claim(
    all(v["calls"] == len(plan_for(cp, "bucket-async", c)) for c, v in swept.items()),
    "Each cap sent the buckets its plan has: "
    + ", ".join(f"{'None' if c is None else f'{c:g} MiB'}: {v['calls']}" for c, v in swept.items())
    + ".",
)
here = lesson.SETTINGS.bucket_cap_mb
lesson_03.say_sweep(swept, this_run, model, default)
if rank == 0:
    lesson_03.sweep_figure(swept, model, default, LINK.name, world_size, here)

# %%
# %%rank 0
lesson_03.sweep_table(swept, model, default)

# %% [markdown]
# ### Links sized with two settings' ratios, at this machine's speed
#
# Two ratios matter: one sync's bytes' time and one message's fixed cost, each over one backward.
# The cell sets α and β so that a backward timed here, on 2 ranks, has both ratios of a setting (4 T4s: the
# sweep's median backward, messages inside; 1024 ranks, on `deep-llama`, which the sweep did not run: single's
# median backward of 3 steps). Each run below is one profiled step, no warm-up. Both settings' ratios are those of SmolLM2-360M
# (the blog's workload, not run here) as the step-time model rebuilds it (`docs/scaling.md` §5):
#
# * **sized for 4 × T4**: the blog's 4 T4s over PCIe (`pcie-t4`); the rungs from `simple` to
#   `bucket-async`, on this notebook's workload;
# * **sized for 1024 ranks**: the blog's network on 1024 ranks over 100 Gbit/s InfiniBand
#   (`100gbit-ib`), a setting the blog did not run: every all_reduce makes 2 × 1023 hops, so one
#   message's fixed cost is a far larger share of the backward. On `deep-llama`, an offline preset
#   with SmolLM2's 32 layers at CPU size. Only `hook-async`
#   and the bucketed rungs run there, one micro-batch a step.
#
# Every bucket, the first too, is capped at 25 MiB scaled by the network's bytes over SmolLM2's.

# %%
# %%distributed
from minddp.comm.link import LinkSpec
from minddp.costmodel.buckets import on_the_link, ratios
from minddp.costmodel.project import blog_profile

blog = blog_profile()
SETTINGS_OF = {  # 2 ranks each, on a link sized with the named setting's ratios
    "4 × T4": ("pcie-t4", 4, lesson.SETTINGS.model),
    "1024 ranks": ("100gbit-ib", 1024, "deep-llama"),
}
ladder6 = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
# At 1024 ranks simple, ga and hook would wait for one message per gradient tensor, one after another, each
# paying its fixed cost; hook-async does not wait for each, the bucketed rungs send few: only these run there.
RUN = {"4 × T4": ladder6, "1024 ranks": ["hook-async", "bucket", "bucket-async"]}
blog_runs, setting_ratios, sized_from, single_far = {}, {}, {}, []
for name, (link_name, ranks, model_name) in SETTINGS_OF.items():
    setting_ratios[name] = ratios(blog, link_name, ranks)
    params = [p for p in lesson.make_model(name=model_name).parameters() if p.requires_grad]
    sync_bytes = sum(p.numel() * p.element_size() for p in params)
    if name == "4 × T4":  # the sweep's median above; deep-llama: the median of three steps of single (no check)
        timed = this_run
    else:
        single_far = lesson_03.backwards_s("single", model_name)  # this rank's three steps
        timed = statistics.median(single_far)
    backward = sized_from[name] = lesson_03.rank0s(timed)  # rank 0's, so that every rank builds the same link
    bytes_ratio, message_ratio = setting_ratios[name]  # one sync's bytes, one message's 2(n−1)·α, in backwards
    assert world_size == 2  # so one all_reduce of m bytes takes 2α + m·β
    link = LinkSpec(
        f"sized for {name}",
        bandwidth=sync_bytes / (bytes_ratio * backward),  # 1/β: one sync's m·β = bytes_ratio backwards
        latency=message_ratio * backward / 2,  # α: one message's 2α = message_ratio backwards
    )
    cap = 25 * sync_bytes / blog.total_bytes  # the blog's 25 MiB, scaled to this model
    lesson_03.say_sized(
        name,
        ranks,
        link_name,
        model_name,
        setting_ratios[name],
        len(params),
        blog,
        sync_bytes,
        sized_from[name],
        lesson_03.SIZED_FROM[name],
        cap,
    )
    for stage in RUN[name]:  # one profiled step each, no warm-up step
        v = lesson.Trainee(
            stage,
            link=link,
            bucket_cap_mb=cap,
            model=model_name,
            warmup=0,
            grad_accum=lesson.SETTINGS.grad_accum if name == "4 × T4" else 1,
        ).look()
        blog_runs[name, stage] = on_the_link(v["row"]) | {
            "calls": v["calls"],
            "backward_ms": lesson.backward_less_check(v),
            "waits": v["waits"],
            "waits_in_backward": v["waits_in_backward"],  # hook and bucket: their backward holds their waits
        }

# %%
# %%distributed
t4 = {s: blog_runs["4 × T4", s] for s in ladder6}
far = {s: blog_runs["1024 ranks", s] for s in RUN["1024 ranks"]}
lesson_03.say_sized_measures(t4, far, single_far)

# %% [markdown]
# ## Takeaway

# %%
# %%distributed
lesson_03.say_takeaway(looks, t4, far)

# %%
# %dist_shutdown
