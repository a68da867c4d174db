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
#    (`Trainee.look`): how many all_reduce calls, how many of them started while a backward was
#    running, how long the last backward took, and how long the step went on after it before the
#    optimizer could step;
# 4. **what to look for** in those numbers;
# 5. **your turn**: write the stage yourself; `check` runs it on real ranks and says what is wrong.
#
# Every stage trains the same model on the same batches with the same settings, printed below.
# The stages stay alive on the ranks, and at the end they take turns, step by step, to compare
# their step times on equal terms.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.notebook import lesson
trainees, looks = {}, {}

def meet(stage, before=None):
    """Build `stage` on this rank (one warm-up step), take one profiled step, say what it shows."""
    trainees[stage] = lesson.Trainee(stage)
    looks[stage] = trainees[stage].look()
    lesson.say_look(looks, stage, before)

lesson.say(lesson.describe())

# %%
import contextlib
import inspect
import sys

import torch                        # torch, dist and nn: for your own stages in the exercises below
import torch.distributed as dist
from torch import nn

from minddp.exercises import check, solutions
from minddp.ladder import STAGES
from minddp.notebook.source import show_diff, show_source

# %% [markdown]
# ## The floor: no communication at all (`single`)
#
# Here each rank trains its own shard and never talks to the other: not data parallelism (the
# replicas drift apart), but the time a step would take if syncing were free. Everything a stage
# costs beyond it is communication and waiting.

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
meet("simple")
v, k = looks["simple"], lesson.SETTINGS.grad_accum
lesson.say(f"{v['calls']} calls {'=' if v['calls'] == v['buckets'] * k else '≠'} {v['buckets']} parameter tensors "
           f"× {k} micro-batches.")

# %% [markdown]
# What to look for: no call starts during a backward (they all wait for it to end), and the
# step goes on well after the last backward: that time is the sync, exposed. `simple` has no
# `no_sync()`, so the loop syncs after every micro-batch, although only the sum over the step is
# needed. Your version of this stage was the exercise of `02_simple_ddp`.
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

# %% [markdown]
# What to look for: the same bytes per sync, synced once per step instead of after every
# micro-batch, so the calls and bytes per step drop by the number of micro-batches, and so does
# the time after the last backward. The sync still waits for backward to end.
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
        self.require_backward_grad_sync = True     # False inside no_sync()
        self.sync_this_backward = True             # what the last forward decided

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
# *interleaves* with backward, but backward stands still while it waits.

# %%
show_source(STAGES["hook"])
show_diff(STAGES["ga"], STAGES["hook"])

# %%
# %%distributed
meet("hook", before="ga")

# %% [markdown]
# What to look for: now the calls start while the backward runs, and little is left to do after
# the last backward; but the backward itself stops at every gradient until its all_reduce is back,
# so the waiting has moved inside it rather than gone. Compare the last backward with `ga`'s.
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
        pass                                       # nothing left: every gradient was averaged in backward

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

# %% [markdown]
# What to look for: the same calls as `hook`, started at the same places, but the backward no longer
# waits for them; compare its length with `hook`'s and `ga`'s. What is left after it is the
# communication backward could not hide. On two ranks sharing two CPU cores, "hiding" is limited:
# gloo's threads need a core too, and the backward is using it (on GPUs, NCCL runs beside the
# compute kernels).
#
# ### Your turn: `hook-async`
#
# Start the all_reduce with `async_op=True`, keep the handle, and wait for all of them in finish.

# %%
class MyAsyncHookDDP(solutions.HookDDP):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []                        # (parameter, work) of the all_reduces started

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
lesson.say(f"The plan for buckets of {lesson.SETTINGS.bucket_cap_mb:g} MiB has {looks['bucket']['buckets']} buckets "
           f"for {looks['hook']['buckets']} parameter tensors.")

# %% [markdown]
# What to look for: the same bytes in far fewer calls. The diff shows what `bucket` takes from
# `hook` (the waiting `_sent`) rather than from `hook-async`: this stage waits for each bucket
# inside backward, so its backward is longer than `hook-async`'s; the next stage removes the
# wait again.
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
        self.waiting = [len(members) for members in self.buckets]   # gradients each bucket still waits for

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

# %% [markdown]
# What to look for: `bucket`'s calls and bytes, with its backward back to normal length; and
# against `hook-async`, the same overlap with far fewer calls.
#
# ### Your turn: `bucket-async`
#
# Start each bucket's all_reduce without waiting, and finish them all in
# `finish_gradient_synchronization()`.

# %%
class MyAsyncBucketDDP(solutions.BucketDDP):
    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight = []                        # what finish needs for each bucket sent

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
print(inspect.getdoc(sys.modules[STAGES["ddp"].__module__]))

# %%
# %%distributed
meet("ddp", before="bucket-async")

# %% [markdown]
# ## `torch`: torch's own DDP, the baseline
#
# The same workload through `torch.nn.parallel.DistributedDataParallel`, with the same bucket size.
# Its reducer is C++; the profiler still sees its all_reduces, so it is counted the same way.

# %%
# %%distributed
meet("torch", before="ddp")

# %% [markdown]
# ## Side by side: taking turns
#
# One profiled step per stage says *what* each stage does; timing needs more steps, and fairness:
# this machine's speed drifts (other processes, two ranks and gloo's threads sharing the cores), so
# stages timed one after the other are timed under different conditions. Here the stages built
# above take turns, one step each, round after round, the ranks starting every step together; a
# step's time is its slower rank's. The table gives each stage's median step and range, and two
# comparisons made round by round (a stage against the floor, a stage against torch's DDP, each
# from steps taken seconds apart, then the median over rounds); the calls and bytes come from the
# profiled steps above.

# %%
# %%distributed
race_ms = lesson.race(trainees, rounds=4)

# %%
# %%rank 0
lesson.race_table(race_ms, looks)

# %%
# %%rank 0
floor = lesson.median(race_ms["single"])
over = {s: lesson.median(lesson.paired(race_ms, s, "single")) for s in race_ms if s != "single"}
ratio = {s: lesson.median(lesson.paired(race_ms, s, "torch", how="ratio")) for s in race_ms}
wobble = max(max(d) - min(d) for d in (lesson.paired(race_ms, s, "single") for s in over))
blog = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
lesson.say(f"A step without any communication took {floor:.0f} ms (median). Over it, round by round, the stages "
           "cost " + ", ".join(f"{s} {over[s]:+.0f} ms" for s in over) + ".")
slowest, fastest = max(blog, key=ratio.get), min(blog, key=ratio.get)
lesson.say(f"Of the teaching stages, {slowest} was the slowest here ({ratio[slowest]:.2f} × torch's DDP) and "
           f"{fastest} the fastest ({ratio[fastest]:.2f} ×); ddp ran at {ratio['ddp']:.2f} × torch's DDP.")
lesson.say(f"From one round to the next, a stage's difference to the floor moved by up to {wobble:.0f} ms: "
           f"differences smaller than that are the machine's, not the stages'.")

# %% [markdown]
# How to read it: computation is most of every step here, as in real training, so the stages
# differ by their communication and their waiting, not by their arithmetic. Where the ladder's
# ideas show most clearly on a CPU are the counts and the places in the profiled steps above:
# `ga` divides the traffic by the number of micro-batches, the hook stages move the sync into
# backward, the buckets divide the calls. Whether a stage's overlap *saves time* depends on the
# machine: with a core per rank and gloo's threads competing for it, there is little spare
# capacity to hide communication in; on GPUs, where NCCL runs beside the compute kernels, there is
# room to hide it (the blog this course follows measured its overlap rise from none in its first
# DDP to most of the communication in its last). `docs/benchmarks.md` has many rounds of the same
# comparison, with intervals; `05_reading_traces` looks inside the steps.

# %%
# %dist_shutdown
