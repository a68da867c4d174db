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
# # 04 · Communication hooks: fewer bytes on the wire
#
# Every minddp stage sends its gradients through a *comm hook*, `hook(state, bucket) ->
# Future[Tensor]`: the interface of torch's `register_comm_hook`, with torch's names. The default
# averages with a plain all_reduce; others compress first:
#
# * `fp16` / `bf16`: cast the bucket to a 16-bit float, all_reduce, cast back: half the bytes;
# * `powersgd`: view each gradient matrix `M` as close to a low matrix rank and send two thin factors
#   `P` and `Q` with `M ≈ P Qᵀ` instead of `M`; with *error feedback*, what compression lost
#   this step is added to the next step's gradient, so it is delayed rather than lost.
#
# A word used two ways here: a **rank** is one of the training processes (rank 0, rank 1), as in
# every notebook; the **matrix rank** of PowerSGD (`matrix_approximation_rank`, "rank 1") is the
# number of columns of `P` and `Q`, the directions kept per gradient matrix. This notebook always
# says *matrix rank* for the second.
#
# Here each hook trains the workload every notebook shares, in the `bucket-async` stage, from the
# same start on the same batches. For each we read:
#
# * the all_reduce calls and bytes a step, from the `Traffic` meter on the hook's `Wire`;
# * the *relative gradient error* `‖ĝ − g‖ / ‖g‖`: how far the hook's average `ĝ` is from the exact
#   average `g` of this step's gradients (`minddp.comm.measure.error_measured` computes `g` with an
#   extra exact all_reduce beside the hook, not counted as traffic);
# * how far each hook's parameters end up from plain averaging's, relative to how far plain
#   averaging moved them.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.notebook import lesson

HOOKS = {
    "allreduce": None,
    "fp16": None,
    "bf16": None,
    # as in torch: plain averaging for the first iterations, then PowerSGD of matrix rank 1 with error feedback
    "powersgd": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
}
STEPS = 5
trainees = {
    name: lesson.Trainee("bucket-async", hook=name, powersgd_options=options, measure_error=True, warmup=0)
    for name, options in HOOKS.items()
}
start = trainees["allreduce"].flat_parameters()  # every trainee starts from the same seeded weights
assert all(torch.equal(t.flat_parameters(), start) for t in trainees.values())
lesson.race(trainees, rounds=STEPS)  # the hooks take turns, one step each
lesson.say(lesson.describe())
lesson.say(f"Each hook trained {STEPS} steps in the bucket-async stage.")

# %% [markdown]
# ## Bytes on the wire and gradient error
#
# The numbers of the last step. Each rank measured its own traffic; the ranks send the same, so
# rank 0 shows its own. *param distance* is `‖θ_hook − θ_allreduce‖ / ‖θ_allreduce − θ_start‖`:
# how far each hook's parameters ended from plain averaging's, against how far plain averaging
# moved them (0 for plain averaging itself).

# %%
# %%rank 0
import pandas as pd

reference = trainees["allreduce"]
moved = (reference.flat_parameters() - start).norm()
rows = {}
for name, t in trainees.items():
    last = t.wire[-1]
    rows[name] = {
        "all_reduce calls": last["calls"],
        "KiB sent": last["bytes"] / 1024,
        "bytes vs allreduce": last["bytes"] / reference.wire[-1]["bytes"],
        "grad error (relative)": last["relative_error"],
        "param distance (relative)": ((t.flat_parameters() - reference.flat_parameters()).norm() / moved).item(),
        "loss (last step)": t.losses[-1],
    }
table = pd.DataFrame(rows).T
table.round(4)

# %%
# %%rank 0
import torch

err = table["grad error (relative)"]
lesson.say(
    f"fp16 and bf16 send {table.loc['fp16', 'bytes vs allreduce']:.2f} and "
    f"{table.loc['bf16', 'bytes vs allreduce']:.2f} of plain averaging's bytes.",
    f"Their errors, {err['fp16']:.1e} and {err['bf16']:.1e}, follow from their formats: a float16 keeps "
    f"steps of {torch.finfo(torch.float16).eps:.1e} relative to a number, a bfloat16 "
    f"{torch.finfo(torch.bfloat16).eps:.1e} (fewer mantissa bits, for float32's range).",
)

# %% [markdown]
# ## PowerSGD, step by step
#
# PowerSGD is the one hook whose numbers need explaining: the calls go *up*, the bytes come down a
# long way, and its gradient error is large. The cell below shows its traffic and error at every
# step, beside plain averaging's.

# %%
# %%rank 0
p, a = trainees["powersgd"], trainees["allreduce"]
start_iter = HOOKS["powersgd"]["start_powerSGD_iter"]
steps = pd.DataFrame(
    {
        "allreduce calls": [w["calls"] for w in a.wire],
        "powersgd calls": [w["calls"] for w in p.wire],
        "allreduce KiB": [w["bytes"] / 1024 for w in a.wire],
        "powersgd KiB": [w["bytes"] / 1024 for w in p.wire],
        "powersgd relative error": [w["relative_error"] for w in p.wire],
    },
    index=pd.RangeIndex(1, len(p.wire) + 1, name="step"),
)
buckets = lesson.buckets_of(a.model)
last = steps.iloc[-1]
lesson.say(
    f"For the first {start_iter} steps PowerSGD is plain averaging (start_powerSGD_iter={start_iter}): the same "
    f"calls and bytes, no error.",
    f"Then it makes {int(last['powersgd calls'])} calls a step for {buckets} buckets, "
    f"{last['powersgd calls'] / buckets:g} per bucket, where plain averaging makes {int(last['allreduce calls'])}: "
    f"one for the tensors it leaves uncompressed (biases, norm weights: vectors have no low-rank form), one "
    f"for all the bucket's P factors, one for all its Q factors, which need the averaged P first.",
    f"Those carry {last['powersgd KiB'] / last['allreduce KiB']:.3f} of the bytes "
    f"({last['allreduce KiB'] / last['powersgd KiB']:.0f} times fewer).",
    f"Its relative gradient error, once compressing, ranged from {steps['powersgd relative error'].iloc[start_iter:].min():.2f} "
    f"to {steps['powersgd relative error'].iloc[start_iter:].max():.2f}.",
)
steps.round(3)

# %% [markdown]
# Why can PowerSGD's error be so large, even above 1 (an "average" farther from the true average
# than the average is from zero)? Two reasons, both by design:
#
# * matrix rank 1 keeps one direction per gradient matrix: most of a single step's gradient is
#   dropped;
# * with error feedback, what was dropped is added to the *next* step's gradient before
#   compressing. So the hook's output approximates this step's gradient *plus* what earlier steps
#   left behind, while the error column compares it with this step's gradient alone. The dropped
#   parts are sent later instead of never: over many steps the updates add up to nearly what plain
#   averaging would have applied, which is why PowerSGD trains well despite per-step errors like
#   these (Vogels et al., 2019).
#
# What the short run here can show is the effect on the parameters: the *param distance* column of
# the first table compares each hook's parameters with plain averaging's after the same steps. A few
# steps cannot show the long-run convergence; `python -m minddp.train --stage bucket-async --hook
# powersgd --powersgd-rank 1` trains for as long as you like with one hook, and `python -m
# minddp.analyze --compare RUN_A RUN_B` puts two such runs side by side.
#
# The hooks are torch-compatible: `register_comm_hook(state, hook)` on any minddp stage takes
# `minddp.comm.default_hooks` and `minddp.comm.powerSGD_hook` functions *or* torch's own
# `torch.distributed.algorithms.ddp_comm_hooks` ones, and torch's DDP takes minddp's.
#
# ## Your turn: an fp16 hook
#
# Write `fp16_compress_hook` yourself: cast the bucket's flat gradient to `float16`, divide it by
# the world size (before the sum, so large gradients cannot overflow), start the all_reduce with
# `async_op=True`, and hand back a Future whose value is the average as one `float32` tensor of the
# bucket's size. `check_hook` first calls your hook on a bucket of known gradients (is it a
# Future? of one tensor? of the right size and dtype? the average, not the sum? how far off? how
# many bytes?), then trains with it in the `bucket-async` stage beside torch's DDP running torch's
# own `fp16_compress_hook`.

# %%
import torch
import torch.distributed as dist
from minddp.exercises import check_hook


def my_fp16_hook(process_group, bucket):
    # process_group: None means the default group. bucket.buffer(): the flat float32 gradients.
    # Your turn: compress, start the all_reduce (async_op=True), and .then(...) turn its Future's value
    # (a list holding the summed tensor) into the float32 average.
    raise NotImplementedError("the fp16 hook")


check_hook(my_fp16_hook, like="fp16")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions
from minddp.notebook.source import show_source

show_source(solutions.fp16_compress_hook)
check_hook(solutions.fp16_compress_hook, like="fp16")

# %% [markdown]
# Next: `05_reading_traces` profiles every stage and reads where the time of a step goes.

# %%
# %dist_shutdown
