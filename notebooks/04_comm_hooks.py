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
# # 04 · Communication hooks: a smaller payload
#
# Every minddp stage sends its gradients through a *comm hook*, `hook(state, bucket) -> Future[Tensor]`, torch's
# `register_comm_hook` interface. The default, `allreduce` (*plain averaging*), averages with one all_reduce per
# bucket; others compress first:
#
# * `fp16` / `bf16`: cast the bucket to a 16-bit float, divide it by the world size, all_reduce (the sum of the
#   divided values: the average), cast back: half the bytes;
# * `powersgd`: approximate each gradient matrix it compresses by `P Qᵀ`, two
#   thin factors, and send `P` and `Q` instead, with *error feedback*: each
#   rank keeps a tensor per bucket that it adds to that bucket's gradient on the next step.
#
# A **rank** is one of the training processes; PowerSGD's **matrix rank** r (`matrix_approximation_rank`; not
# 01's r, a rank's index) is the number of columns of `P` and `Q`.
#
# Each hook trains its own copy of the workload of notebooks 02 to 06 in `03_build_up`'s `bucket-async` stage,
# all from the same initial weights. For each hook we read:
#
# * the all_reduces a step and their *payload*, counted by the hook's traffic meter: the bytes the step's
#   all_reduces reduce (numel × element size);
# * the *relative gradient error* `‖ĝ − g‖ / ‖g‖`: how far the hook's average `ĝ` is from the *reference
#   average* `g`, the float32 average of the same copy's gradients that step by plain averaging's own division
#   and sum, in an extra all_reduce before the hook's, not counted as traffic.
#
# Sizes are binary (a KiB is 2¹⁰ bytes, a MiB 2²⁰), link rates decimal (a Gbit/s is 10⁹ bits/s).

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
# each Trainee makes its hook's state (PowerSGD's from these options), wraps the hook to measure its error and
# registers it with its model's register_comm_hook(state, hook), as in torch
STEPS = 4  # 2 of plain averaging (start_powerSGD_iter) and 2 that compress
# warmup=0: no step is taken while building, so step 1 below is each trainee's first and the steps count from it
trainees = {
    name: lesson.Trainee("bucket-async", hook=name, powersgd_options=options, measure_error=True, warmup=0)
    for name, options in HOOKS.items()
}
initial = trainees["allreduce"].flat_parameters()  # every trainee has the same seeded initial weights
assert all(torch.equal(t.flat_parameters(), initial) for t in trainees.values())
for _ in range(STEPS):  # the hooks take turns, one step each
    for t in trainees.values():
        t.step()
lesson.say(lesson.describe())

# %% [markdown]
# ## Payload and gradient error
#
# The table is each hook's last step, each error against its own copy's g: PowerSGD's from compression and from
# error feedback's tensor arriving a step late, which the measure counts as error;
# fp16's and bf16's from rounding, which a claim below checks against a worst-case bound
# (`minddp.comm.measure.rounding_bound`): value i of the average over n ranks is off by at most
#
# `b_i = γ(u) · a_i + (n + 1) · tiny · eps / 2 + γ(2⁻²⁴) · a_i`, γ(u) = (n + 1) u / (1 − (n + 1) u)
#
# * n + 1 in γ(u): the roundings of each rank's term (its cast, its division, at most n − 1 additions; the cast
#   back to float32 is exact);
# * u = eps / 2: the most a rounding is off, relative to its result; eps = `torch.finfo(dtype).eps`, float16's
#   2⁻¹⁰, bfloat16's 2⁻⁷;
# * a_i: the ranks' mean magnitude of value i;
# * (n + 1) · tiny · eps / 2: below tiny (`torch.finfo(dtype).tiny`), the smallest normal value, a
#   rounding is off by up to tiny · eps / 2 absolutely:
#   the n casts' errors divided by n, plus the n divisions', make n + 1 (additions there are exact);
# * γ(2⁻²⁴) · a_i: float32's n roundings of the reference average (2⁻²⁴ is float32's u), counted as n + 1.

# %%
# %%rank 0
import pandas as pd

from minddp.notebook import lesson_04

plain_avg = trainees["allreduce"]
rows = {}
for name, t in trainees.items():
    last = t.metered[-1]
    rows[lesson_04.NAMES[name]] = {
        "all_reduces": last["calls"],
        "payload KiB": last["bytes"] / 1024,
        "payload vs plain averaging": last["bytes"] / plain_avg.metered[-1]["bytes"],
        "relative error": f"{last['relative_error']:.1e}",  # as text: 0 and above 1 in one format
    }
table = pd.DataFrame.from_dict(rows, orient="index")  # by rows: the counts stay integers
lesson.say(table.round({"payload KiB": 1, "payload vs plain averaging": 4}).to_string())

# %%
# %%rank 0
import torch

from minddp.comm.measure import rounding_bound

dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
err = {name: trainees[name].metered[-1]["relative_error"] for name in dtypes}  # the last step's
# the bound on rounding alone (the markdown above), relative to ‖g‖, the reference average's norm
bound = {
    name: rounding_bound(dtypes[name], world_size, **trainees[name].metered[-1]["magnitudes"])
    / trainees[name].metered[-1]["norm"]
    for name in dtypes
}
# ĝ and g: the same division and sum (allreduce_hook's) of the same values, in two all_reduces; their sums agree
# bit for bit only where each is one addition: on 2 ranks
lesson.claim(
    world_size == 2 and all(w["relative_error"] == 0 for w in plain_avg.metered),
    f"Plain averaging's relative error is 0 at every step: ĝ and g are one addition of the same {world_size} "
    "divided values.",
)
lesson.claim(
    all(err[name] <= bound[name] for name in dtypes),
    "fp16's and bf16's last-step relative errors are within ‖b‖ / ‖g‖ (‖b‖ the b_i's norm), computed from each "
    "copy's own a_i and ‖g‖: " + " and ".join(f"{bound[k]:.1e} for {k}" for k in dtypes) + ".",
)
f16, b16, f32 = torch.finfo(torch.float16), torch.finfo(torch.bfloat16), torch.finfo(torch.float32)
lesson.claim(
    b16.eps > f16.eps and err["fp16"] < err["bf16"] and f"{b16.max:.1e}" == f"{f32.max:.1e}",
    "bfloat16, with the larger eps, has the larger error but float32's range: "
    f"its largest value is {b16.max:.1e}, float16's {f16.max:.0f}.",
)

# %% [markdown]
# ## PowerSGD, step by step
#
# As torch's, the hook is plain averaging on its first `start_powerSGD_iter` steps; then it compresses each
# gradient, as an h × w matrix `G` (h its first dimension), whose factors' (h + w) r values are under half its h w
# (torch's `min_compression_rate`, 2), sends the other tensors whole, and makes up to three all_reduces a bucket:
# these tensors', its P's, its Q's. It first adds this rank's kept tensor (error feedback; zero on the first
# compressing step) to the whole bucket and saves the bucket so corrected. Then, for each `G`, at matrix rank r:
#
# * computes `P = G Q` (h × r), with `Q` (w × r) the one of the step before (a random one the first time),
#   made orthonormal on every step;
# * all_reduces the P's without dividing them (orthonormalizing removes the scale), and makes each `P`'s columns
#   orthonormal: every rank now holds the same `P`;
# * computes `Q = Gᵀ P`, all_reduces the Q's and divides their sum by the world size: as every rank used the
#   same `P`, that is `Ḡᵀ P`, Ḡ the ranks' average `G`;
# * writes `P Qᵀ` = `P Pᵀ Ḡ`, Ḡ projected onto `P`'s r columns, over `G` and, when the bucket's all_reduces are done,
#   keeps for the next step the saved bucket minus the average it hands back. The ranks' average of what they keep, e,
#   is Ḡ − `P Qᵀ` on a matrix (what compression left out), 0 elsewhere.
#
# On the first compressing step, t, Ḡ is g's part on the matrix, g_M, so e = g − ĝ. On step t + 1,
# with g, ĝ and g_M step t + 1's and e still step t's, Ḡ = g_M + e and, on
# each compressed matrix, ĝ − g = `P Pᵀ e` − (g_M − `P Pᵀ g_M`): the part of e sent a step late, and the part of
# g_M outside `P`'s columns, at right angles to the first, of norm at most ‖g_M‖. Adding squared norms over the
# matrices (elsewhere ĝ − g is rounding), ‖`P Pᵀ e`‖ ≥ √(‖ĝ − g‖² − ‖g‖²), ‖g‖ the whole average's.

# %%
# %%rank 0
import math

psgd_trainee, plain_trainee = trainees["powersgd"], trainees["allreduce"]
plain_steps = HOOKS["powersgd"]["start_powerSGD_iter"]
ERR, NORM, PLAIN = "PowerSGD relative error", "PowerSGD copy's ‖g‖", "plain averaging copy's ‖g‖"  # columns
steps = pd.DataFrame(
    {
        "PowerSGD all_reduces": [w["calls"] for w in psgd_trainee.metered],
        "PowerSGD payload KiB": [w["bytes"] / 1024 for w in psgd_trainee.metered],
        ERR: [w["relative_error"] for w in psgd_trainee.metered],
        NORM: [w["norm"] for w in psgd_trainee.metered],  # the reference average's norm
        PLAIN: [w["norm"] for w in plain_trainee.metered],
    },
    index=pd.RangeIndex(1, len(psgd_trainee.metered) + 1, name="step"),
)
plain_last = plain_trainee.metered[-1]  # the same at every step
plain_calls, plain_kib = plain_last["calls"], plain_last["bytes"] / 1024
assert all(w["calls"] == plain_calls and w["bytes"] / 1024 == plain_kib for w in plain_trainee.metered)
buckets = lesson.buckets_of(plain_trainee.model)
last = steps.iloc[-1]
early, late = steps.iloc[:plain_steps], steps.iloc[plain_steps:]
lesson.say(steps.round({"PowerSGD payload KiB": 1, ERR: 3, NORM: 2, PLAIN: 2}).to_string())
# PowerSGD's first steps are allreduce_hook itself
lesson.claim(
    (early["PowerSGD all_reduces"] == plain_calls).all()
    and (early["PowerSGD payload KiB"] == plain_kib).all()
    and all(w["relative_error"] == 0 for w in psgd_trainee.metered[:plain_steps]),
    f"For the first {plain_steps} steps PowerSGD is plain averaging: the same all_reduces and payload, and relative "
    "error 0.",
)
# its payload from the gradients' shapes alone: each viewed as h × w (h its first dimension), as the hook does, is
# compressed where 2 (its min_compression_rate, torch's) × (h + w) · r < h · w; the rest is sent whole
r, size = HOOKS["powersgd"]["matrix_approximation_rank"], initial.element_size()
shapes = [tuple(p.reshape(p.shape[0], -1).shape) for p in psgd_trainee.model.parameters() if p.requires_grad]
packed = [(h, w) for h, w in shapes if 2 * (h + w) * r < h * w]
parts = {  # bytes
    "whole": sum(h * w for h, w in shapes if 2 * (h + w) * r >= h * w) * size,
    "P": sum(h * r for h, w in packed) * size,
    "Q": sum(w * r for h, w in packed) * size,
}
# a bucket makes at most 3 all_reduces (P and Q only if it compresses a matrix; the uncompressed tensors' only if it
# holds any): 3 × buckets in all means 3 in every bucket
lesson.claim(
    (late["PowerSGD all_reduces"] == 3 * buckets).all()
    and all(w["bytes"] == sum(parts.values()) for w in psgd_trainee.metered[plain_steps:]),
    f"Then it makes {int(last['PowerSGD all_reduces'])} all_reduces a step, 3 in each of its {buckets} buckets, of "
    f"{last['PowerSGD payload KiB']:.1f} KiB: {parts['whole'] / 1024:.1f} for the {len(shapes) - len(packed)} "
    f"tensors it sends whole, {parts['P'] / 1024:.1f} of P's and {parts['Q'] / 1024:.1f} of Q's for the "
    f"{len(packed)} it compresses (at r = {r} an h × w matrix sends (h + w) × {size} bytes, not h × w × {size}).",
)
first, second = late.index[:2]  # its first two compressing steps
# the markdown's e and its bound, computed from the table's rounded numbers, as printed, so that a reader can redo it
shown = steps.round({ERR: 3, NORM: 2, PLAIN: 2})
err1, norm1 = shown.loc[first, ERR], shown.loc[first, NORM]
err2, norm2 = shown.loc[second, ERR], shown.loc[second, NORM]
fed_back, through = round(err1 * norm1, 2), round(err2 * norm2, 2)  # ‖e‖ (‖ĝ − g‖ on the first), ‖ĝ − g‖ on the second
low = round(math.sqrt(max(through**2 - norm2**2, 0)), 2)  # the least ‖P Pᵀ e‖
share = (low / through) ** 2  # the parts are at right angles: their squared norms add up to ‖ĝ − g‖²
lesson.claim(
    share > 0.5,
    f"Step {first}'s e = g − ĝ has norm "
    f"{err1:.3f} × {norm1:.2f} = {fed_back:.2f}. On step {second}, ‖ĝ − g‖ = {err2:.3f} × {norm2:.2f} = {through:.2f} and ‖P Pᵀ e‖ ≥ √({through:.2f}² − "
    f"{norm2:.2f}²) = {low:.2f}, so ‖P Pᵀ e‖² is at least {share:.0%} of ‖ĝ − g‖²: most of step {second}'s error "
    f"is step {first}'s e, sent a step late.",
)
plain2 = shown.loc[second, PLAIN]
lesson.claim(
    err2 > err1 > 0  # the first compressed update: the first that is not plain averaging's
    and through < fed_back
    and norm2 / norm1 < through / fed_back  # ‖g‖ fell more, as a share and (below) in norm
    and norm1 - norm2 > fed_back - through
    and plain2 < shown.loc[first, PLAIN]  # the copy that never compresses: its ‖g‖ fell too
    and (early[ERR] == 0).all()  # the steps before the first compressed update are plain averaging's
    and (shown.loc[:first, NORM] == shown.loc[:first, PLAIN]).all(),
    f"PowerSGD's relative error rose from {err1:.3f} to {err2:.3f}"
    + (" (above 1: ĝ further from g than 0 is)" if err2 > 1 else "")
    + " while ‖ĝ − g‖ fell: ‖g‖ fell more, and also fell in plain averaging's copy, which never compresses.",
)

# %% [markdown]
# ## Over a link: from bytes to link time
#
# The notation is 01's: a *message* is one all_reduce, α a *hop*'s cost whatever the bytes it carries (a hop: a
# point-to-point send; an all_reduce around a ring makes 2(n − 1) hops a rank, all ranks at once, so a message's
# *fixed cost* is 2(n − 1) α), β the time per byte (1 / B, B the link's bandwidth: bytes/s in formulas, Gbit/s in outputs). A link carries
# one message at a time, each for its α-β time, `2(n − 1) α + 2(n − 1)/n · m β` for an all_reduce of m bytes on n
# ranks. So a hook's c all_reduces of S bytes of payload in all take
#
# `c · 2(n − 1) α + 2(n − 1)/n · S β`
#
# The cell prices each hook's last step (the first table's
# all_reduces and payload; bf16's are fp16's) on the *preset* `1gbit` (one of `minddp.comm.link`'s named links):
# its *link ms*, 01's *link time*, modelled, not timed.

# %%
# %%rank 0
from minddp.comm.link import GBIT, parse_link

LINK = parse_link("1gbit")
n = world_size
reduced = {
    h: (trainees[h].metered[-1]["calls"], trainees[h].metered[-1]["bytes"]) for h in ("allreduce", "fp16", "powersgd")
}
link_ms_of = {h: lesson_04.link_ms(reduced[h], LINK, n) for h in reduced}
per_message = LINK.seconds("all_reduce", 0, n) * 1e3  # 2(n − 1) α: a message's fixed cost, ms
fixed = {h: reduced[h][0] * per_message for h in reduced}
lesson.claim(
    fixed["fp16"] == fixed["allreduce"]
    and abs(link_ms_of["fp16"] - fixed["fp16"] - (link_ms_of["allreduce"] - fixed["allreduce"]) / 2)
    < 1e-9 * link_ms_of["allreduce"],
    f"On {LINK.name} ({LINK.bandwidth / GBIT:g} Gbit/s, {LINK.latency * 1e6:g} µs per hop) fp16 takes "
    f"({link_ms_of['allreduce']:.1f} − {fixed['fp16']:.1f}) / 2 + {fixed['fp16']:.1f} = "
    f"{link_ms_of['fp16']:.1f} ms, plain averaging {link_ms_of['allreduce']:.1f} ms: half the payload halves all "
    f"but the fixed costs of each hook's {reduced['fp16'][0]} messages, {fixed['fp16']:.1f} ms.",
)
link_share, pay_share = (
    link_ms_of["powersgd"] / link_ms_of["allreduce"],
    reduced["powersgd"][1] / reduced["allreduce"][1],
)
lesson.claim(
    link_share > pay_share and fixed["powersgd"] > link_ms_of["powersgd"] / 2,
    f"PowerSGD's link time falls less than its payload ({link_share:.3f} and {pay_share:.4f} of plain "
    f"averaging's): fixed costs are most of its {link_ms_of['powersgd']:.1f} ms, {fixed['powersgd']:.1f} ms for "
    f"{reduced['powersgd'][0]} messages.",
)

# %% [markdown]
# ## Where each takes less link time: messages against payload
#
# PowerSGD pays a message's fixed cost three times a bucket here, plain averaging once. With plain averaging's c₁
# and S₁ and PowerSGD's c₂ and S₂ (this run's: the model's buckets and gradient shapes fix them at any n), PowerSGD takes less link time exactly when `2(n − 1)/n · (S₁ − S₂) β > 2(n − 1)(c₂ − c₁) α`:
#
# * **bandwidth**: PowerSGD's link time is the shorter below `B* = (S₁ − S₂) / (n (c₂ − c₁) α)` bytes/s, plain
#   averaging's above it, where the payload PowerSGD saves takes less link time than its extra messages' fixed costs;
# * **ranks**: it is the shorter below `n* = (S₁ − S₂) / ((c₂ − c₁) α B)`: around a ring every message's α
#   is paid 2(n − 1) times, while the bytes each rank sends, 2(n − 1)/n · S, stay under 2S whatever n.
#
# The cell prices both hooks' last steps on each preset but `loopback`. The figure
# draws both link times against B at `1gbit`'s α: each line falls towards its hook's fixed costs (c₁ or c₂ times 2(n − 1) α), and the
# two cross at 1gbit's B*.
# Compare a preset's circle with its triangle, not with a line.

# %%
# %%rank 0
import math

c1, S1 = reduced["allreduce"]
c2, S2 = reduced["powersgd"]


def crossover(alpha):
    return (S1 - S2) / (n * (c2 - c1) * alpha)  # B*, bytes/s


n_star = (S1 - S2) / ((c2 - c1) * LINK.latency * LINK.bandwidth)  # ranks, at the notebook's link
wins = lesson_04.preset_table(reduced, n, crossover)  # each preset's α, B, both hooks' link ms, B*
faster = wins["PowerSGD, link ms"] < wins["plain averaging, link ms"]
lesson.claim(
    all(faster[nm] == (spec.bandwidth < crossover(spec.latency)) for nm, spec in lesson_04.presets().items()),
    f"On every preset B* names the shorter link ms. {lesson_04.where_shorter(wins)}.",
)
below, above = math.floor(n_star), math.floor(n_star) + 1  # link ms on either side of n*
shorter = [
    lesson_04.link_ms(reduced["powersgd"], LINK, k) < lesson_04.link_ms(reduced["allreduce"], LINK, k)
    for k in (below, above)
]
lesson.claim(
    shorter == [True, False],
    f"On {LINK.name}, PowerSGD's link time would be the shorter on {below} ranks, not on {above}: n* = {n_star:.1f}.",
)
lesson_04.link_figure(reduced, n, LINK, crossover)
wins.round(3)

# %% [markdown]
# Nothing here measures PowerSGD's training loss, compute, memory or step time.
#
# ## Your turn: an fp16 hook
#
# Write `my_fp16_hook` in the cell below (torch's is `fp16_compress_hook`): cast the bucket's flat gradient to
# `float16`, divide it by the world size before the sum, start the all_reduce with `async_op=True`, and hand back a
# Future whose value is the average as one `float32` tensor of the bucket's size. `check_hook` runs it on 2 ranks,
# then, if it passes, on 3: on random values (it must return before its all_reduce is waited for), on gradients
# whose undivided float16 sum overflows, and in training steps of its own network, where the ranks' parameters
# must stay equal.
#
# On the checker's ranks `world_size`, `rank` and `n` are not defined: pass `group=process_group` and ask
# `dist.get_world_size(process_group)`.

# %%
import torch
import torch.distributed as dist
from minddp.exercises import check_hook


def my_fp16_hook(process_group, bucket):
    # process_group: the group to average over (None: the default group). bucket.buffer(): the flat float32 gradients.
    # Your turn: cast to float16 and divide by the world size (before the sum), start the all_reduce
    # (async_op=True), and .then(...) cast its Future's value (a list holding the sum, already the average)
    # back to float32.
    raise NotImplementedError("the fp16 hook")


check_hook(my_fp16_hook, like="fp16")

# %% [markdown]
# Stuck? The next cell holds a model answer.

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.exercises import solutions
from minddp.notebook.source import show_source

show_source(solutions.fp16_compress_hook)
check_hook(solutions.fp16_compress_hook, like="fp16")

# %% [markdown]
# Next: `05_reading_traces` reads where the time of a step goes.

# %%
# %dist_shutdown
