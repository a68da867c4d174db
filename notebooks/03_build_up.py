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
# micro-batch. Each stage below changes one thing about *when* or *how much* is sent; none changes
# *what* is computed (the test suite checks every stage against a single process and torch's DDP,
# and you can check your own versions here).
#
# Each section has the same five parts:
#
# 1. **the idea**, in words;
# 2. **the code**: the stage's own class, as it is in `minddp/stages/`, and **what changed** from
#    the stage before, method by method (a diff computed from the package, not written by hand);
# 3. **a run on real ranks**: the stage is built on both ranks with the workload every notebook
#    shares, takes one warm-up step, then one step under the profiler, read in memory
#    (`Trainee.look`): how many all_reduce calls, how many started while a backward was running,
#    and, message by message, when it was handed to the network, how long the network took, and
#    when the training thread stood waiting for it; then **a picture** of that step on one time
#    axis, with the stage before it faded above it;
# 4. **what to look for**: sentences about that run, each printed with a ✓ by a cell that checks
#    it on the run shown (`lesson.claim`): if a run ever contradicts one, the cell fails instead
#    of showing prose that the numbers beside it deny;
# 5. **your turn**: write the stage yourself; `check` runs it on real ranks and says what is wrong.
#
# **The network.** Two ranks on one machine talk over loopback, where moving this model's
# gradients costs a few milliseconds, less than the machine's own noise: timed on loopback, the
# later stages cannot be told apart (`docs/benchmarks.md` tries, with many rounds and intervals).
# So every message here goes over an **emulated 1 Gbit/s link** (`minddp.comm.link`): the real
# all_reduce still runs, so every result is exact, but it completes no earlier than the same
# all_reduce would on Gigabit Ethernet, one message at a time, as a network card sends them. That
# time is *modeled* (a fixed cost α per hop plus bytes over bandwidth, printed below): the same on
# every run and every machine, so the sentences about it hold anywhere. The training thread is
# not held up by the emulation, so a stage that computes while a message travels hides the
# message, as on a real network.
#
# Every stage trains the same model on the same batches with the same settings, printed below.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.comm.link import parse_link
from minddp.notebook import lesson

LINK, looks, k = parse_link("1gbit"), {}, lesson.SETTINGS.grad_accum


def meet(stage, before=None):
    """Build `stage` on this rank (one warm-up step), take one profiled step over LINK, say and draw it."""
    looks[stage] = lesson.Trainee(stage, link=LINK).look()
    lesson.say_look(looks, stage, before)
    lesson.picture(looks, stage, before, title=f"{stage}" + (f" (below) and {before} (faded)" if before else ""))


lesson.say(lesson.describe())
fixed, per_mib = (LINK.seconds("all_reduce", n, world_size) * 1e3 for n in (0, 2**20))
lesson.say(
    f"The emulated link: {LINK.describe()}. One all_reduce of n bytes between {world_size} ranks takes "
    f"2(N−1)·α + 2(N−1)/N · n/β: {fixed:.1f} ms plus {per_mib - fixed:.1f} ms per MiB."
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
# ## The floor: no communication at all (`single`)
#
# Here each rank trains its own shard and never talks to the other: not data parallelism (the
# replicas drift apart), but the time a step would take if syncing were free. Everything a stage
# costs beyond it is communication and waiting. The picture is its step: the forward (pale) and
# backward (blue) of each micro-batch, then the optimizer (green); the black line is the end of
# the step. The stages below add messages (orange, on the wire) and waits (red: the training
# thread standing still until a message is back).

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
    "No message is sent, and none waited for, "
    "while a backward runs: each sync starts when its backward is over, and the step waits for all of it.",
)

# %% [markdown]
# What to look for: three bursts of messages, one after each backward, each waited for (red)
# before the next micro-batch may start. `simple` has no `no_sync()`, so the loop syncs
# after every micro-batch, although only the sum over the step is needed. Your version of this
# stage was the exercise of `02_simple_ddp`.
#
# ## `ga`: gradient accumulation, `no_sync()`
#
# Autograd *adds* each micro-batch's gradient into `.grad`. Averaging is linear (the mean of the
# sums is the sum of the means), so syncing once, after the last micro-batch, gives the same
# gradient as syncing after every one. Inside `with model.no_sync():` a forward records that its
# backward must not sync; the last micro-batch runs outside the block. The decision is taken in
# `forward`, as in torch, so the *forward* of a micro-batch must be inside `no_sync()`.

# %%
show_source(STAGES["ga"])
show_diff(STAGES["simple"], STAGES["ga"])

# %%
# %%distributed
meet("ga", before="simple")
v, b = looks["ga"], looks["simple"]
lesson.claim(
    v["calls"] * k == b["calls"] and v["bytes"] * k == b["bytes"],
    f"ga sends 1/{k} of simple's calls and bytes: one sync per step instead of one per micro-batch.",
)
lesson.claim(
    abs(v["link_ms"] * k - b["link_ms"]) <= 1e-9 * b["link_ms"],
    f"So its messages need 1/{k} of simple's time on the link: {v['link_ms']:.0f} ms against {b['link_ms']:.0f} ms.",
)
lesson.claim(
    v["calls_in_backward"] == 0 == v["waits_in_backward"],
    "Like simple, it sends and waits only after a backward is over: the whole sync is exposed.",
)

# %% [markdown]
# What to look for: one burst of messages, after the last backward, waited for whole. The
# micro-batches before it run straight on into each other. (The link's time is modeled, so the
# ratio above is exact; compute times on this machine are not, and are not compared here.)
#
# ### Your turn: `ga`
#
# Write `no_sync()`, `forward()` and `finish_gradient_synchronization()` on top of the model answer
# of `simple` (`solutions.SimpleDDP`, plain `torch.distributed`). The checker trains it with
# several micro-batches per step, so it sees whether the micro-batches inside `no_sync()` stayed
# quiet.


# %%
class MyGradAccumDDP(solutions.SimpleDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.sync_this_backward = True  # what the last forward decided

    @contextlib.contextmanager
    def no_sync(self):
        # Your turn: require_backward_grad_sync is False while the with-block runs, True again after.
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
# The last layer's gradient is final long before the first layer's is computed. A
# *post-accumulate-grad hook* on each parameter fires right after autograd has added this
# backward's contribution into `param.grad`: the accumulated gradient, the one to sync (a plain
# tensor hook would hand over only the incoming gradient of this micro-batch). The hook sends the
# gradient and, in this stage, waits for the result before backward may go on: communication
# *interleaves* with backward, but backward stands still while it waits. (The hooks reach the
# wrapper through `weakref`: autograd keeps them on its C++ side, where Python's garbage collector
# cannot see a cycle, so a strong reference would keep every wrapper alive; `weakref.finalize`
# removes the hooks when the wrapper goes. Plumbing, not the idea.)

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
    "And the training thread waits for each of them "
    "right there, inside the backward: communication interleaves with backward, it does not overlap it.",
)

# %% [markdown]
# What to look for: the messages have moved into the last backward, and so have the waits: the
# backward stops at every gradient until its all_reduce is back. The waiting has moved, not gone.
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
# One change: the hook keeps the all_reduce's Future instead of waiting on it, and backward goes
# on computing the earlier layers while gloo (or NCCL) moves the later layers' gradients. Every
# Future is waited for once, in `finish_gradient_synchronization()`, just before the optimizer
# step. That is real *overlap*: communication hidden behind computation.

# %%
show_source(STAGES["hook-async"])
show_diff(STAGES["hook"], STAGES["hook-async"])

# %%
# %%distributed
meet("hook-async", before="hook")
v, b = looks["hook-async"], looks["hook"]
lesson.claim(
    v["calls"] == b["calls"] == v["calls_in_backward"],
    "hook-async sends hook's messages, from the same places in the backward.",
)
lesson.claim(
    v["waits_in_backward"] == 0,
    "None of its waits begins inside a backward: it waits for each message once, in finish, after the last backward.",
)
lesson.claim(
    v["exposed_ms"] < b["exposed_ms"],
    f"So less of the link's time is left exposed: {v['exposed_ms']:.0f} "
    f"ms against hook's {b['exposed_ms']:.0f} ms; the rest travelled while backward computed.",
)

# %% [markdown]
# What to look for: messages on the wire while the backward goes on, no red inside it, and
# only what was still travelling when backward ended waited for at the end. That is *overlap*.
# On two ranks sharing two CPU cores the real gloo all_reduce also needs a core, so the measured
# waits include some waiting for the other rank and for a core; the exposed link time counts the
# network's part only.
#
# ### Your turn: `hook-async`
#
# Start the all_reduce with `async_op=True`, keep the handle, and wait for all of them in finish.


# %%
class MyAsyncHookDDP(solutions.HookDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []  # (parameter, work) of the all_reduces started

    def _grad_ready(self, param):
        # Your turn: if this backward syncs, start the all_reduce of param.grad without waiting; keep it.
        raise NotImplementedError("_grad_ready()")

    def finish_gradient_synchronization(self):
        # Your turn: wait for each one, divide its gradient by the world size, then forget them.
        raise NotImplementedError("finish_gradient_synchronization()")


check(MyAsyncHookDDP, like="hook-async")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.AsyncHookDDP)
check(solutions.AsyncHookDDP, like="hook-async")

# %% [markdown]
# ## `bucket`: fewer, bigger messages
#
# Every collective pays a fixed cost before its bytes move (a round trip, waking a thread, a kernel
# launch). One all_reduce per parameter pays it once per parameter tensor. Buckets pay it a few
# times: at construction the parameters are grouped, in reverse order (backward produces the last
# layers' gradients first), into buckets of about `bucket_cap_mb` (torch's rule, `plan_buckets`);
# in the hook each parameter is counted in its bucket, and when the bucket's last gradient is in,
# the bucket is flattened into one buffer and sent in one call; when the average is back, each
# slice is copied into its parameter's `.grad`. Like `hook`, this stage waits for each bucket.

# %%
show_source(STAGES["bucket"])
show_diff(STAGES["hook-async"], STAGES["bucket"])

# %%
# %%distributed
meet("bucket", before="hook-async")
v, b = looks["bucket"], looks["hook-async"]
alpha = LINK.seconds("all_reduce", 0, world_size) * 1e3  # the fixed cost of one all_reduce, ms
lesson.claim(
    v["calls"] == v["buckets"] and v["bytes"] == b["bytes"],
    f"bucket sends the same bytes in "
    f"{v['calls']} calls, one per bucket of {lesson.SETTINGS.bucket_cap_mb:g} MiB, instead of {b['calls']}.",
)
lesson.claim(
    abs(b["link_ms"] - v["link_ms"] - (b["calls"] - v["calls"]) * alpha) < 1e-6 * b["link_ms"],
    f"On the link that saves {b['calls'] - v['calls']} messages' fixed cost, {alpha:.1f} ms each: "
    f"{b['link_ms'] - v['link_ms']:.1f} ms of {b['link_ms']:.0f} ms.",
)
lesson.claim(
    v["waits"] == v["waits_in_backward"] == v["calls"], "Like hook, it waits for each bucket inside the backward."
)

# %% [markdown]
# What to look for: a few wide messages instead of many thin ones. Between two ranks on Gigabit
# Ethernet a message's fixed cost is small next to its bytes, so buckets save little link time
# here; the fixed cost grows with the ranks (2(N−1)·α per all_reduce), and on GPUs each call also
# pays a kernel launch and NCCL's setup, which is where the blog's buckets pay off. The diff shows
# what `bucket` takes from `hook` (the waiting `_sent`) rather than from `hook-async`: it waits
# for each bucket inside backward; the next stage removes the wait again.
#
# ### Your turn: `bucket`
#
# The plan is given (`plan_buckets`, the rule above). Count each gradient in its bucket; when a
# bucket is full, flatten it with `torch.cat`, all_reduce it once, divide, and copy each slice
# back into its `.grad`. The checker uses a cap that gives its small network two buckets.

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
# ## `bucket-async`: buckets in flight while backward goes on
#
# Nothing new to write: `bucket`'s buckets with `hook-async`'s not-waiting. The stage is one class
# on `ga` that holds the whole mechanism, so it reads top to bottom: plan, autograd hooks, count,
# send and keep the Future, wait once, copy back. This is the shape of torch's DDP: few messages,
# each overlapping the rest of backward.

# %%
show_source(STAGES["bucket-async"])
show_diff(STAGES["bucket"], STAGES["bucket-async"])

# %%
# %%distributed
meet("bucket-async", before="bucket")
v, b = looks["bucket-async"], looks["bucket"]
lesson.claim(
    v["calls"] == b["calls"] and v["waits_in_backward"] == 0,
    "bucket-async sends bucket's messages and waits for none of them inside a backward.",
)
lesson.claim(
    v["exposed_ms"] < b["exposed_ms"],
    f"So less of the link's time is exposed: {v['exposed_ms']:.0f} ms against bucket's {b['exposed_ms']:.0f} ms.",
)

# %% [markdown]
# What to look for: `bucket`'s few messages, travelling while the backward goes on, as
# `hook-async`'s did, and no red inside the backward.
#
# ### Your turn: `bucket-async`
#
# Start each bucket's all_reduce without waiting, and finish them all in
# `finish_gradient_synchronization()`.


# %%
class MyAsyncBucketDDP(solutions.BucketDDP):
    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight = []  # what finish needs for each bucket sent

    def _send_bucket(self, b):
        # Your turn: flatten bucket b, start its all_reduce with async_op=True, keep what finish needs.
        raise NotImplementedError("_send_bucket()")

    def finish_gradient_synchronization(self):
        # Your turn: wait for every bucket, divide, copy each slice back into its .grad; then forget them.
        raise NotImplementedError("finish_gradient_synchronization()")


check(MyAsyncBucketDDP, like="bucket-async")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
show_source(solutions.AsyncBucketDDP)
check(solutions.AsyncBucketDDP, like="bucket-async")

# %% [markdown]
# ## `ddp`: torch's DDP, rebuilt
#
# The teaching stages stop at `bucket-async`. `minddp.DistributedDataParallel` is the stage a
# training script uses: a drop-in for `torch.nn.parallel.DistributedDataParallel` that trains to
# the same bits. It lives apart, in `minddp/ddp/`, built as torch builds its DDP (a module that
# owns a reducer), because what it adds (the end of backward handled inside `loss.backward()`, a
# bucket plan rebuilt from the order gradients really arrive in, buckets launched strictly in
# order, unused parameters, gradients as views into the buckets) would bury the ladder's ideas.
# Its module docstring maps each part to the stage that introduced it; `docs/ddp.md` has the full
# table.

# %%
show_doc(sys.modules[STAGES["ddp"].__module__])

# %%
# %%distributed
meet("ddp", before="bucket-async")
v = looks["ddp"]
lesson.claim(
    v["calls"] == v["calls_in_backward"] and v["waits_in_backward"] == 0,
    "ddp sends every bucket from inside the backward and waits for none of them there, as bucket-async does.",
)

# %% [markdown]
# ## `torch`: torch's own DDP, the baseline
#
# The same workload through `torch.nn.parallel.DistributedDataParallel`, with the same bucket size.
# Its reducer is C++; the profiler still sees its all_reduces, so it is counted the same way.

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
# Every profiled step above, one row per stage, on one axis, and the table of their numbers
# (units in the column names). *Link ms* is the modeled time of the step's messages; *exposed
# link ms* the part of it the training thread waited for; *waited ms* all its waiting, measured
# (the link, the other rank, a free core); *step ms* one step, measured, on a machine shared with
# other work: it is shown, not compared. torch's C++ reducer waits on the link's messages through
# a Future of its own, so its waits are not seen (–).

# %%
# %%distributed
lesson.picture(
    looks,
    None,
    rows=list(looks),
    title="One step of every stage on one time axis, each message over the emulated 1 Gbit/s link (rank 0)",
)
ladder = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
e = {s: looks[s]["exposed_ms"] for s in ladder}
lesson.say("Exposed link time, down the ladder: " + ", ".join(f"{s} {e[s]:.0f} ms" for s in ladder) + ".")
lesson.claim(
    e["ga"] < e["simple"] and e["hook-async"] < e["hook"] and e["bucket-async"] < e["bucket"],
    "Each of the three ideas cut the exposed time on this link: accumulation (simple → ga), not waiting "
    "inside backward (hook → hook-async, bucket → bucket-async).",
)

# %%
# %%rank 0
lesson.look_table(looks)

# %% [markdown]
# How to read it: every stage computes the same thing on the same batches, so the stages differ
# by their communication and their waiting, not by their arithmetic. `ga` divides the
# traffic by the number of micro-batches; the hook stages move the messages into the backward;
# the async stages stop waiting for them there; the buckets divide the number of messages. On this
# link, between two ranks, the buckets' saving in link time is small (their fixed cost per message
# is small); on GPUs, where every call also pays a kernel launch, it is not. `05_reading_traces`
# reads the same stages from trace files, with the blog's metrics, and ends with what each idea
# bought here beside what it bought on the blog's GPUs.

# %%
# %dist_shutdown
