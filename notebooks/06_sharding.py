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
# # 06 · Sharding: ZeRO-1, ZeRO-2 and FSDP
#
# Every stage so far keeps a whole copy of the model state on every rank: the parameters, their
# gradients and the optimizer's state. The three
# stages here follow ZeRO, the *Zero Redundancy Optimizer*
# (Rajbhandari et al., 2019, arXiv 1910.02054, "the ZeRO paper"), and FSDP, *Fully Sharded Data
# Parallel*, PyTorch's version of ZeRO's third stage. On n ranks they cut *parameter tensors* into n
# *chunks*, one per rank; the chunk a rank updates is its *shard*. Besides the all_reduce they use the
# reduce-scatter and the all-gather (next section):
#
# * `zero1`: each rank keeps the optimizer state of its shards only; the gradients are all-reduced, as
#   in DDP, and the updated shards all-gathered;
# * `zero2`: the gradients are sharded too, once the last backward's reduce-scatter leaves each rank
#   only the piece of the averaged gradients it updates;
# * `fsdp`: the parameters are sharded too (except those in no decoder layer, kept unsharded on every rank
#   and all-reduced: its *replicated* tensors), and each decoder layer (a *unit*) is gathered for its
#   forward and, all but the last, again for its backward.
#
# The notation is notebook 01's: n ranks, m bytes of a collective's tensor, α the fixed cost of one
# *hop* (a point-to-point send), β the time per byte; *global batch* is notebook 02's word. A *step* is all its micro-batches' forwards and backwards and the
# *update* at their end (the optimizer's `step()`). ddp, zero1 and zero2 send their gradients in
# *buckets*, one collective per bucket; fsdp per unit and per replicated tensor.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %%
# %%distributed
from minddp.notebook import lesson

lesson.say(lesson.describe())

# %% [markdown]
# ## All_reduce is a reduce-scatter and an all-gather
#
# A **reduce-scatter** sums a tensor over the ranks and leaves each rank one `1/n` piece of the sum. An
# **all-gather** is the opposite move: each rank brings a piece and everyone ends with all of them. One
# after the other, they are an all_reduce. A *transport* is what a stage sends through instead of torch's
# collectives: called, it all-reduces. minddp's ring, `TRANSPORTS["ring"]`, is written from `send`/`recv`
# and also has `reduce_scatter` and `all_gather` methods. Here the ring's two, on every rank, checked
# against gloo's all_reduce:

# %%
# %%distributed
import torch
import torch.distributed as dist
from minddp.collectives import TRANSPORTS

ring, world = TRANSPORTS["ring"], dist.get_world_size()
x = torch.arange(4.0 * world) + 100 * rank  # each rank's own tensor
piece = x.new_empty(4)  # made from x: on x's device
ring.reduce_scatter(piece, x, dist.group.WORLD)  # my piece of the sum
whole = x.new_empty(4 * world)
ring.all_gather(whole, piece, dist.group.WORLD)  # everyone's pieces
summed = x.clone()
dist.all_reduce(summed)
print("my piece of the sum:", piece.tolist())
print("all pieces gathered:", whole.tolist(), "= all_reduce:", torch.equal(whole, summed))

# %% [markdown]
# The ring all_reduce of the earlier notebooks is these two: `ring_all_reduce` cuts any length
# into n pieces with `tensor_split`, reduce-scatters and all-gathers them:

# %%
# %%rank 0
from minddp.collectives.ring import ring_all_reduce
from minddp.notebook.source import show_source

show_source(ring_all_reduce)

# %% [markdown]
# What each costs on minddp's ring, in the α-β model: a reduce-scatter of m bytes (its input) or an
# all-gather of m bytes (its output) is `n − 1` hops per rank, carrying `(n − 1)/n · m` bytes:
# `(n − 1) α + (n − 1)/n · m β`; the all_reduce is the two. A *pass* is a reduce-scatter or an all-gather of the
# whole model's float32 bytes: `(n − 1)/n` of those bytes sent per rank. Per step (the gradients are synced
# once, in the last micro-batch's backward): DDP all-reduces the gradients, two passes; the ZeRO paper's
# ZeRO-1 and ZeRO-2 reduce-scatter them and all-gather the updated parameters, two passes too. minddp's
# `zero1` is DDP's wrapper with its optimizer sharded, so it all-reduces and then all-gathers: three passes.
# FSDP reduce-scatters its units' gradients, under one pass, but gathers each unit's parameters for
# every micro-batch's forward and again, all but the last unit's, for its backward. The bound below is one
# reduce-scatter pass a step and two gathering passes per micro-batch; as each pass counts the replicated tensors'
# bytes and fsdp gathers none of them, it covers their all_reduce too.

# %%
# %%distributed
from minddp.train.models import count_parameters

model_bytes = count_parameters(lesson.make_model()) * 4  # float32 bytes of the whole model
one_pass = (world - 1) / world * model_bytes
accum = lesson.SETTINGS.grad_accum  # micro-batches per step
fsdp_most = (1 + 2 * accum) * one_pass  # one reduce-scatter, at most two all-gathers per micro-batch


def mib(n_bytes):  # two decimals, as the tables below print
    return lesson.mib(n_bytes, digits=2)


lesson.say(
    f"Worked out, not measured, bytes sent per rank at n = {world}: a pass {mib(one_pass)} (of the model's "
    f"{mib(model_bytes)}); per step of {accum} micro-batches DDP's all_reduce {mib(2 * one_pass)}, "
    f"minddp's zero1's all_reduce + all-gather {mib(3 * one_pass)}, FSDP's at most {mib(fsdp_most)} "
    f"(1 + 2 × {accum} passes)."
)

# %% [markdown]
# ## The four stages side by side
#
# `ddp` is minddp's own `DistributedDataParallel`; `zero1` is the same wrapper with its
# optimizer sharded by `minddp.ZeroRedundancyOptimizer`; `zero2` and `fsdp` make this rank's shards
# the model's parameters, so the optimizer built over `model.parameters()` holds state for the shards
# (and for fsdp's replicated tensors). `zero2` keeps the whole parameters too (its shards are views into
# them); `fsdp` keeps only the shards and its replicated tensors.
# `minddp.sharding.memory.Probe` measures one step of each stage from the tensors the rank holds:
# parameters and their `.grad`s just before the update, optimizer state just after, the activations (the most
# bytes autograd saved for the backward during one micro-batch's forward, leaving out saved tensors that
# lie in a parameter's storage or, for fsdp, a gathered unit's), and fsdp's *gathered units* at their
# peak: the full parameters it has gathered and its all-gathers' output buffers, inputs aside. Each stage's
# measured step is its first, the *memory step*.

# %%
# %%distributed
from minddp.sharding.memory import Probe, formula_bytes

STAGES = ["ddp", "zero1", "zero2", "fsdp"]
trainees = {s: lesson.Trainee(s, warmup=0) for s in STAGES}
memory, between = {}, {}
for name, t in trainees.items():
    probe = Probe(t.model, t.model.module, t.optimizer)
    t.step()
    memory[name] = probe.result()
    between[name] = probe.gradients_between  # the most gradient bytes held as a forward starts

# %% [markdown]
# The *memory table* sets each stage's measured model state (parameters + gradients + optimizer state)
# beside its formula, for `Ψ` float32 parameter values with
# Adam on n ranks: each value costs 4 bytes of parameter, 4 of gradient and
# 8 of Adam's two moments, and each stage after DDP divides one more of the three among the ranks: DDP `16Ψ`;
# ZeRO-1 (optimizer state) `8Ψ + 8Ψ/n`; ZeRO-2 (and gradients) `4Ψ + 12Ψ/n`; FSDP (and parameters)
# `16Ψₛ/n + 16Ψᵣ`, where `Ψᵣ` counts the values of the replicated tensors and `Ψₛ = Ψ − Ψᵣ` the rest.

# %%
# %%rank 0
import pandas as pd
from minddp.notebook import lesson_06

rows = {}
for name, got in memory.items():
    rows[name] = {
        "parameters MiB": got["parameters"] / 2**20,
        "gradients MiB": got["gradients"] / 2**20,
        "optimizer MiB": got["optimizer"] / 2**20,
        "model state MiB": (got["parameters"] + got["gradients"] + got["optimizer"]) / 2**20,
        "formula MiB": formula_bytes(name, got["psi"], world, got["replicated"]) / 2**20,
    }
table = pd.DataFrame(rows).T
tensors = sum(p.requires_grad for p in trainees["ddp"].model.module.parameters())
lesson.say(f"Ψ = {memory['ddp']['psi']:,} trainable parameter values in {tensors} tensors.")
# before the last backward's sync every gradient is accumulated whole (fsdp's in its units): 4 bytes a value
lesson.claim(
    all(between[s] == 4 * memory[s]["psi"] for s in STAGES)
    and all(memory[s]["gradients"] < between[s] for s in ("zero2", "fsdp")),
    f"The gradients column is at the update: by a later micro-batch's forward every stage held whole gradients, "
    f"{mib(between['ddp'])}.",
)
buffers, sends = lesson_06.gather_buffers(trainees)  # planned: every bucket's (zero1, zero2), one unit's (fsdp)
state = {s: sum(memory[s][k] for k in ("parameters", "gradients", "optimizer")) for s in STAGES}
lesson.claim(
    state["zero1"] + buffers["zero1"] > state["ddp"],
    f"The table leaves out all-gather buffers (planned, not measured): zero1's update adds "
    f"{mib(buffers['zero1'])}, "
    f"{mib(state['zero1'] + buffers['zero1'])} in all, above ddp's {mib(state['ddp'])}.",
)
shown = table.round(3)
# the update counters' bytes, which round(3) of MiB shows in some rows only
shown["model state − formula, bytes"] = ((table["model state MiB"] - table["formula MiB"]) * 2**20).round().astype(int)
shown

# %%
# %%rank 0
# AdamW keeps an update counter beside its two moments: a float32 scalar per parameter tensor (a shard is one)
off = {s: table.loc[s, "model state MiB"] - table.loc[s, "formula MiB"] for s in STAGES}
lesson.claim(
    all(abs(b * 2**20 - 4 * tensors) < 1 for b in off.values()),
    f"On rank 0 each stage's model state is its formula's bytes plus AdamW's update counters, a 4-byte scalar per "
    f"parameter tensor ({tensors} × 4 = {4 * tensors} bytes).",
)
names = {id(p): n for n, p in trainees["fsdp"].model.module.named_parameters()}
replicated = {id(p): p for _, _, p in trainees["fsdp"].model.replicated}
lesson.say(
    f"fsdp's {len(replicated)} replicated tensors: "
    + ", ".join(names[i] for i in replicated)
    + f"; Ψᵣ = {memory['fsdp']['replicated']:,}."
)

# %% [markdown]
# ## bf16 compute with fp32 master weights
#
# Mixed-precision training casts the weights to 16 bits for the forward and backward (bf16
# here) and keeps an fp32 copy of the weights, the *master weights*, for the optimizer. minddp's FSDP
# computes in bf16 with `compute_dtype=torch.bfloat16`: the fp32 shards
# *are* the master weights, cast to bf16 for each unit's gather. The cells below compare one step of it, on
# the memory step's micro-batches, with fp32 fsdp's. The model's normalization layers are its *RMSNorms*.

# %%
# %%distributed
from minddp.ladder import build_stage
from minddp.ladder.loop import train_step
from minddp.sharding.fsdp import blocks_of

net = lesson.make_model()
fsdp16 = build_stage("fsdp", net, compute_dtype=torch.bfloat16, shard=blocks_of(net))  # the units: decoder layers
optimizer16 = torch.optim.AdamW(fsdp16.parameters(), lr=lesson.SETTINGS.lr)  # over the fp32 shards
probe = Probe(fsdp16, net, optimizer16)
train_step(fsdp16, optimizer16, next(lesson.step_batches()), lesson.loss_fn)
memory["fsdp bf16"] = probe.result()

# %%
# %%rank 0
from minddp.bench.memory import plot, row

measured = [dict(row(world, s, memory[s]), label=s) for s in STAGES]
measured.append(dict(row(world, "fsdp:bf16", memory["fsdp bf16"]), label="fsdp\ncomputing in bf16"))
# the model state and its fp32 formula only: all-gather buffers (zero1's held in its update) are in the last section
plot(
    [{k: v for k, v in r.items() if k not in ("formula_mixed", "gathered")} for r in measured],
    title=f"Rank 0's model state ({world} ranks) at the update, all-gather buffers aside:\n"
    "measured (bars) beside the fp32 formulas (lines)",
    ylabel="MiB on rank 0",
)
held = {r["label"]: r["parameters"] + r["gradients"] + r["optimizer"] for r in measured}
f32, f16 = memory["fsdp"], memory["fsdp bf16"]
lesson.claim(
    all(f16[k] == f32[k] for k in ("parameters", "gradients", "optimizer")) and 2 * f16["gathered"] == f32["gathered"],
    f"fsdp computing in bf16 keeps fp32 fsdp's parameters, gradients and optimizer state, {mib(held['fsdp'])} "
    f"(4 + 4 + 8 bytes a value, not the paper's 2 + 2 + 12); its gathered units peak at "
    f"{mib(f16['gathered'])}, half fp32 fsdp's {mib(f32['gathered'])}: it gathers in bf16.",
)
by = probe.activations_by  # the bf16 run's saved bytes by (dtype, class of the module that saved them)
low = sum(b for (dtype, _), b in by.items() if dtype == "bfloat16")
other = f16["activations"] - low  # every byte not saved in bf16, in any dtype, by any module
in_norms = sum(b for (dtype, cls), b in by.items() if dtype == "float32" and cls.endswith("RMSNorm"))
# in fp32 the bytes saved in bf16 here are twice as many and the others the same: the others keep it above half
lesson.claim(
    abs(2 * low + other - f32["activations"]) < 1e-3 * f32["activations"] and in_norms > 0,
    f"Its activations, {mib(f16['activations'])}, are {f16['activations'] / f32['activations']:.2f} times fp32 "
    f"fsdp's {mib(f32['activations'])}, not half: {low / 2**20:.2f} MiB are saved in bf16, half their fp32 bytes, "
    f"but {other / 2**20:.2f} MiB in other dtypes, {mib(in_norms)} of them float32 in the RMSNorms, which "
    "normalize in float32.",
)

# %% [markdown]
# ### Why the master weights stay fp32
#
# A bf16 number has 8 significant bits, and a sum is rounded to the nearest bf16 value: a weight keeps a
# change only if it is at least half the gap to the next bf16 value that way, a gap of 2⁻⁸ to 2⁻⁷ of the
# weight, so a change under 2⁻⁹ of a weight is always lost. AdamW's first update moves a value by about lr:
# lr · g/|g| for its gradient g, unless g is zero or as small as AdamW's ε. The cell prints ddp's first update's median change, then adds lr to,
# and subtracts it from, every initial value in bf16 and in fp32:

# %%
# %%rank 0
lr, DTYPES = lesson.SETTINGS.lr, {"bf16": torch.bfloat16, "fp32": torch.float32}
initial = lesson.make_model()
values = torch.cat([p.detach().reshape(-1) for p in initial.parameters()])  # the initial weights
stepped = torch.cat([p.detach().reshape(-1) for p in trainees["ddp"].model.module.parameters()])  # after 1 step
lesson.say(
    f"ddp's first update moved the values by a median of {(stepped - values).abs().median().item() / lr:.2f} × lr."
)
# each value's change, in units of lr, when lr is added (row 0) and subtracted (row 1); 0 where it is lost
moved = {k: torch.stack([lesson.added(values, s * lr, d).abs() / lr for s in (1, -1)]) for k, d in DTYPES.items()}
norms = {id(m.weight) for m in initial.modules() if type(m).__name__.endswith("RMSNorm")}
in_a_norm = torch.cat([torch.full((p.numel(),), id(p) in norms) for p in initial.parameters()])
lost = moved["bf16"] == 0
kept = {k: v[v != 0] for k, v in moved.items()}  # each change that was not lost
lesson.claim(
    all(torch.equal(row, in_a_norm) for row in lost)
    and bool((values[in_a_norm] == 1).all())
    and lr < 2**-9  # half the gap from 1.0 down to the next bf16 value (2⁻⁸); the gap up is 2⁻⁷
    and moved["fp32"].all(),
    f"Adding or subtracting lr = {lr} in bf16 leaves unchanged exactly the {int(in_a_norm.sum()):,} weights "
    f"(each 1.0) of the {len(norms)} RMSNorms, lr being under 2⁻⁹ of 1.0; in fp32 every value moves by lr to "
    f"within {(kept['fp32'] - 1).abs().max():.3%}. So bf16 master weights would drop every change of lr "
    f"on the RMSNorms and miss lr elsewhere by up to {(kept['bf16'] - 1).abs().max():.0%}.",
)

# %% [markdown]
# AdamW's weight decay is a change at every update too: it shrinks each weight by lr · λ of itself (λ
# the weight decay). The cell sets lr · λ against 2⁻⁹, then multiplies each initial value by 1 − lr · λ,
# held in bf16 (the product rounded to bf16) and in fp32:

# %%
# %%rank 0
decay = lr * trainees["ddp"].optimizer.param_groups[0]["weight_decay"]  # lr · λ
in_bf16 = values.to(torch.bfloat16)
kept_as_was = (in_bf16.float() * (1 - decay)).to(torch.bfloat16) == in_bf16
nonzero = values != 0
decayed32 = (values * (1 - decay) != values)[nonzero]  # in fp32
lesson.claim(
    decay < 2**-9 and bool(kept_as_was[nonzero].all()) and bool(decayed32.all()),
    f"lr · λ = {decay:.1e}, {2**-9 / decay:.0f} times under 2⁻⁹: each of the {int(nonzero.sum()):,} nonzero "
    "values loses the decay held in bf16 and keeps it in fp32: bf16 master weights would never decay.",
)

# %% [markdown]
# ### The ZeRO paper's mixed-precision count
#
# The ZeRO paper counts mixed precision as 2 bytes of 16-bit parameter, 2 of 16-bit gradient and K = 12
# bytes of optimizer state (the fp32 master copy, 4, and Adam's moments, 8): still `16Ψ` for DDP, but 12
# of the 16 bytes are now optimizer state, which ZeRO-1 already shards: ZeRO-1 `4Ψ + 12Ψ/n`, ZeRO-2
# `2Ψ + 14Ψ/n`, FSDP `16Ψₛ/n + 16Ψᵣ` as before. The table holds formulas, not measurements: minddp's
# `ddp`, `zero1` and `zero2` have no `compute_dtype`.

# %%
# %%rank 0
formulas = pd.DataFrame(
    {
        r["stage"]: {
            "fp32 formula MiB": r["formula"] / 2**20,
            "ZeRO paper's mixed-precision formula MiB": r["formula_mixed"] / 2**20,
        }
        for r in measured[: len(STAGES)]
    }
).T
paper = {r["stage"]: r for r in measured[: len(STAGES)]}
lesson.claim(
    abs(paper["zero1"]["formula_mixed"] - paper["zero2"]["formula"]) < 1
    and all(abs(paper[s]["formula_mixed"] - paper[s]["formula"]) < 1 for s in ("ddp", "fsdp")),
    "Under the paper's count ZeRO-1, sharding only the optimizer state, comes to fp32 ZeRO-2's "
    f"{paper['zero2']['formula'] / 2**20:.2f} MiB and ZeRO-2 to {paper['zero2']['formula_mixed'] / 2**20:.2f} MiB; "
    "DDP and FSDP stay as in fp32.",
)
formulas.round(2)

# %% [markdown]
# ## minddp's `zero1`: an optimizer that updates its own shard
#
# Each parameter tensor of `numel` elements is cut, flattened, into n chunks of `ceil(numel/n)` elements,
# the last ranks' shorter or empty (padded with zeros where sent); rank `r` keeps the
# optimizer state of chunk `r` of each. (An optimizer that is not element-wise needs tensors uncut: one
# rank then keeps each one's state, `owned_whole` below; AdamW is element-wise.) The updated chunks are all-gathered
# in buckets of their own (`BUCKET_CAP_MB`, printed), not the stage's 4 MiB gradient buckets:

# %%
# %%distributed
from minddp.sharding.zero1 import BUCKET_CAP_MB
from minddp.stages.bucket_plan import MB

assert MB == 2**20  # a cap in "MB" is read as MiB, as torch's DDP reads bucket_cap_mb

zero = trainees["zero1"].optimizer
name, p = next((n, p) for n, p in trainees["zero1"].model.module.named_parameters() if p.dim() == 2)
start, end = zero.ranges[zero.index[id(p)]][rank]
print(f"rank {rank}: chunk {rank} of {name} is its elements {start:,} to {end - 1:,}, of {p.numel():,}")
uncut = sum(zero.owned_whole(p) for p in zero.params)
lesson.say(
    f"Parameter tensors left uncut (`owned_whole`): {uncut} of {len(zero.params)}. All-gather buckets of at most "
    f"BUCKET_CAP_MB = {BUCKET_CAP_MB:g} (MiB, as torch's bucket_cap_mb): {len(zero.buckets)}, for the model's "
    f"{mib(model_bytes)}."
)

# %% [markdown]
# Its `step()`, the update: set each chunk's `.grad` to its chunk of the averaged gradient, run the local
# optimizer over the chunks (views into the parameters), then
# all-gather the chunks (parts 3 and 4; parts 1 and 2, planning and making the chunks, run in
# `__init__`):

# %%
# %%rank 0
from minddp import ZeroRedundancyOptimizer

show_source(ZeroRedundancyOptimizer.step)

# %% [markdown]
# ## ZeRO-2: reduce-scatter the gradients
#
# `zero2` is `bucket-async` (`AsyncBucketDDP`, which starts each gradient bucket's all_reduce during the
# backward) with four changes, parts 1 to 4 in its code's comments:
#
# 1. each parameter is cut into n chunks, as in ZeRO-1, and this rank's chunk, its shard, is made a
#    parameter of its own (`self.shard[p]`), a view into the whole one;
# 2. a full bucket's gradients are packed rank by rank (rank 0's chunk of every gradient in the bucket,
#    each padded to `ceil(numel/n)`, then rank 1's, ...), so that the equal piece of the reduce-scatter
#    rank r receives is its chunk of each, and reduce-scattered, not all-reduced; the whole gradients
#    are dropped;
# 3. that piece holds, back to back, this rank's chunk of each averaged gradient; each becomes
#    its shard's `.grad` (or is added to it): the optimizer updates the shards only;
# 4. in the first forward after a sync (`self.stale`), `gather_parameters` starts each gradient bucket's
#    all-gather of the updated shards at once, before the first module runs; each module waits for its own
#    bucket's just before it runs (forward pre-hooks).
#
# The cell prints the line that does each part, then part 2's reduce-scatter hook; `Wire.of(state)`
# makes the hook's state a `Wire`, minddp's wrapper of a process group.

# %%
# %%rank 0
from minddp.notebook import lesson_06
from minddp.notebook.source import key_lines
from minddp.sharding.hooks import reduce_scatter_hook
from minddp.sharding.zero2 import Zero2DDP

print(key_lines(Zero2DDP, lesson_06.ZERO2_PARTS) + "\n")
show_source(reduce_scatter_hook)

# %% [markdown]
# A stage's *look* is one step under the profiler, its events read in Python: its collectives, each with the moment the
# stage *handed it over* (its call into `torch.distributed`) and the bytes *given* to it (the tensors this rank
# passed in). Its *gradient collectives* are those that sum gradients (fsdp's all_reduces of its replicated
# tensors included); it counts the all-gathers of parameters apart. In these *gloo looks* a `Wire` with no
# transport of its own runs zero2's and fsdp's reduce-scatters as all_reduces of the whole tensor, keeping this
# rank's piece. Each is its trainee's second step, so zero2's starts by gathering the parameters the
# memory step updated.

# %%
# %%distributed
looks = {s: trainees[s].look() for s in STAGES}
accum = lesson.SETTINGS.grad_accum
z = looks["zero2"]
lesson.claim(
    z["bytes"] == looks["ddp"]["bytes"],
    f"zero2's gradient collectives are given ddp's bytes, {mib(z['bytes'])}.",
)
units = len(trainees["fsdp"].model.units)
outside = len({id(p) for _, _, p in trainees["fsdp"].model.replicated})

# %% [markdown]
# ## What rank 0 sends, on the ring
#
# The bytes given do not show what a reduce-scatter spares against an all_reduce. The four stages now
# send through minddp's ring, as each stage's `Wire` transport. The *ring table* is what rank 0 sent in one step of
# new trainees (zero2's second, so that it starts by gathering; the others' first), by kind of collective; each
# hop costs α besides. Bytes *sent* are not bytes *given*: a ring all_reduce sends `2(n − 1)/n` of the bytes it is given, the same number at these
# n = 2 ranks only:

# %%
# %%distributed
# zero2 takes one step before its look, so that the looked-at step starts by gathering the updated shards
rings = {s: lesson.Trainee(s, transport="ring", warmup=int(s == "zero2")).look() for s in STAGES}

# %%
# %%rank 0
KINDS = ("all_reduce", "reduce_scatter", "all_gather")
on_wire = pd.DataFrame({s: {f"{c} MiB": v["sent"].get(c, 0) / 2**20 for c in KINDS} for s, v in rings.items()}).T
on_wire["total MiB"] = on_wire.sum(axis=1)
whole = rings["ddp"]["sent"]["all_reduce"]  # a ring all_reduce: 2 (n − 1)/n · m
total = {s: sum(v["sent"].values()) for s, v in rings.items()}
z2 = rings["zero2"]["sent"]
# padding each parameter's chunks to equal length, where n does not divide it, adds under n elements: under 0.1 %
lesson.claim(
    abs(z2["reduce_scatter"] - whole / 2) < 1e-3 * whole,
    f"zero2's reduce-scatter sent {z2['reduce_scatter'] / 2**20:.2f} MiB, "
    + ("exactly" if 2 * z2["reduce_scatter"] == whole else "to within 0.1 % (chunks padded to equal length)")
    + " half of ddp's all_reduce.",
)
lesson.claim(
    abs(total["zero2"] - whole) < 1e-3 * whole
    and abs(whole - 2 * one_pass) < 1e-3 * whole
    and abs(total["zero1"] - 3 * one_pass) < 1e-3 * whole,
    f"With its all-gathers of the updated parameters ({z2['all_gather'] / 2**20:.2f} MiB) zero2 sends "
    f"{total['zero2'] / 2**20:.2f} MiB a step, "
    + ("exactly" if total["zero2"] == whole else "to within 0.1 %")
    + f" ddp's; zero1 sends {total['zero1'] / 2**20:.2f} MiB, "
    + ("" if total["zero1"] == 3 * one_pass else "to within 0.1 % ")
    + "1.5 times.",
)
# one reduce-scatter pass, at most two gathering passes per micro-batch (the α-β count's bound); the replicated
# tensors are all-reduced (2 (n - 1)/n of their bytes sent), which the bound's gathers of them more than cover.
# On the ring a reduce-scatter or an all-gather is n − 1 hops per rank, an all_reduce 2 (n − 1); the counts of
# collectives are the gloo looks' (the ring's sends are no torch collectives), the same whatever the transport
rd, rf = looks["ddp"], looks["fsdp"]
hops = {"ddp": 2 * rd["calls"], "fsdp": rf["gathers"] + units + 2 * outside}
lesson.claim(
    total["fsdp"] <= fsdp_most and rd["calls"] == rd["buckets"] and rf["calls"] == units + outside,
    f"fsdp sends {total['fsdp'] / 2**20:.2f} MiB a step, within the bound's {mib(fsdp_most)}: "
    f"{total['fsdp'] / whole:.1f} times ddp's bytes in {hops['fsdp'] / hops['ddp']:.1f} times its hops, α each, "
    f"by its gloo look's collectives ({hops['fsdp']} (n − 1) per rank from {rf['gathers']} all-gathers, {units} reduce-scatters and {outside} "
    f"all_reduces; ddp's {hops['ddp']} (n − 1) from {rd['calls']} all_reduces, one per bucket).",
)
on_wire.round(2)

# %% [markdown]
# ## FSDP: gather each unit around its run
#
# fsdp's code's parts: (1) each unit's parameters are replaced by their shards; (2) before a unit's forward
# its shards are all-gathered into an output buffer, the full parameters are copied out of it, and the next
# unit's gather is started (a prefetch); (3) after the forward the full parameters are dropped, all but the
# last unit's, with which the backward starts, and where autograd saves a full parameter for the backward, a
# saved-tensor hook keeps a note of where it lay instead; (4) each unit's first note unpacked in the backward gathers it again (or waits for its
# prefetched gather) and starts the gather of the unit before it; (5) a unit's gradients arrive together, in
# the backward of one autograd function (`Unshard`): in the last micro-batch's backward they go to one
# gradient collective (a reduce-scatter), and each replicated tensor's
# gradient to an all_reduce; in the others they are only accumulated, whole; (6)
# at the end of the backward fsdp waits for them and gives each shard its chunk as `.grad`.

# %%
# %%rank 0
from minddp.notebook import lesson_06
from minddp.sharding.fsdp import FullyShardedDataParallel

print(key_lines(FullyShardedDataParallel, lesson_06.FSDP_PARTS))

# %%
# %%distributed
from minddp.notebook import lesson_06

fsdp = trainees["fsdp"].model
one = lesson_06.one_unit(fsdp)  # the first unit, gathered alone as a forward gathers it, then freed
peak = memory["fsdp"]["gathered"]
lesson.claim(
    one["idle"] == 0
    and len({sum(u.numels) for u in fsdp.units}) == 1
    and one["received"] == one["full"] == one["planned"]  # no padding: n divides each tensor here
    and one["received"] + one["full"] == peak,
    f"fsdp's gathered units peak at {mib(peak)} in the memory step: a unit's all-gather output buffer plus the "
    f"full parameters copied out of it, each one unit's fp32 values, {mib(one['full'])}, what one unit gathered alone holds, so the "
    "prefetch adds nothing to the peak.",
)
f = looks["fsdp"]
lesson.claim(
    f["gathers"] == accum * (2 * units - 1),
    f"fsdp gathers its {units} units for each of the {accum} forwards and all but the last again for the "
    f"backward: {accum} × {2 * units - 1} = {f['gathers']} all-gathers a step.",
)

# %% [markdown]
# ## Where each stage hands its collectives over
#
# The figure draws, for each stage, the step its gloo look recorded: its phases in order, each the same
# width, and a mark for each gradient collective (black) and each all-gather of parameters (brown), in the
# phase it was handed over in. It shows order, not time, and not the order between the two kinds
# (zero2's all-gathers, handed over together before the first module runs, are spread across its forward 1).
#
# A collective can overlap compute (notebook 01's word) only while compute still runs after it is
# handed over. zero1 hands its all-gather over in the update, with no module left to run in the step.
# No cell here measures whether any overlapped.


# %%
# %%rank 0
lesson.handed_picture(looks, STAGES, title="The four stages on gloo, one step each (rank 0)")
assert all(  # each row marks every gradient collective and all-gather of parameters its look counted
    len(looks[s]["handed"][k]) == looks[s][k] for s in STAGES for k in ("calls", "gathers")
)
# where each is handed over is the code's, whatever the load: zero1 all-gathers in step() (the update), zero2 in
# its first forward (which needs the updated parameters); every stage syncs once a step, in the last backward
where = {s: {kind: lesson.handed_in(looks[s], kind) for kind in ("calls", "gathers")} for s in STAGES}
lesson.claim(
    where["zero1"]["gathers"] == ["update"],
    f"zero1 hands its {looks['zero1']['gathers']} all-gather of parameters over inside its update.",
)
lesson.claim(
    where["zero2"]["gathers"] == ["forward 1"],
    f"zero2 hands its {looks['zero2']['gathers']} all-gathers over in the first forward.",
)
lesson.claim(
    all(where[s]["calls"] == [f"backward {accum}"] for s in STAGES),
    "Every stage hands all its gradient collectives over during the last micro-batch's backward.",
)

# %% [markdown]
# ## The same training, whatever the stage
#
# Sharding changes what each rank keeps, not the results. The cell compares each sharded stage's
# parameters with `ddp`'s after the same steps (`full_parameters()` gathers zero2's and fsdp's from the
# updated shards). Here each sum over the ranks has two terms, and a floating-point sum of two does not
# depend on their order.


# %%
# %%distributed
def flat_model(t):
    if hasattr(t.model, "full_parameters"):  # zero2, fsdp
        return torch.cat([v.reshape(-1) for v in t.model.full_parameters().values()])
    return torch.cat([p.detach().reshape(-1) for p in t.model.module.parameters()])


(steps,) = {len(t.losses) for t in trainees.values()}  # each took the memory step and its look's step
reference = flat_model(trainees["ddp"])
apart = {s: (flat_model(trainees[s]) - reference).abs().max().item() for s in STAGES[1:]}
lesson.say(
    f"After {steps} steps each sharded stage's parameters are ddp's bit for bit."
    if not any(apart.values())
    else f"Largest parameter difference from ddp after {steps} steps: "
    + ", ".join(f"{s} {d:.1e}" for s, d in apart.items())
    + "."
)

# %% [markdown]
# ## Each stage's bytes at three moments
#
# Each *held* sum adds rank 0's model state at one moment, activations aside, plus, for a stage gathering
# then, its all-gathers' input and output tensors (planned by `all_gather_buffer_bytes`) and fsdp's full unit.

# %%
# %%rank 0
from minddp.notebook.lesson_06 import GATHERING, gradients_now, held_sums

adds = {"ddp": 0, "zero1": buffers["zero1"], "zero2": buffers["zero2"], "fsdp": buffers["fsdp"] + one["full"]}
held_at = held_sums(trainees, memory, between, adds)
trade = pd.DataFrame({f"held {m}": h for m, h in held_at.items()})
trade["added while gathering"] = pd.Series(adds)
lesson.claim(
    not any(gradients_now(t) for t in trainees.values()),
    "No stage holds gradients at a step's first forward: each update's `zero_grad(set_to_none=True)` freed them.",
)
recv = {s: buffers[s] - sends[s] for s in sends}  # output: zero1's and zero2's the whole model, padded
lesson.claim(
    all(buffers[s] == (world + 1) * sends[s] for s in sends)
    and all(abs(recv[s] - model_bytes) < 1e-3 * model_bytes for s in ("zero1", "zero2"))
    and adds["fsdp"] == peak + sends["fsdp"],
    "Added while gathering (the last column, MiB), output + input: "
    + ", ".join(
        f"{s} {adds[s] / 2**20:.2f} = {recv[s] / 2**20:.2f} + {sends[s] / 2**20:.2f}" for s in ("zero1", "zero2")
    )
    + f"; fsdp {mib(adds['fsdp'])} = its gathered units' measured peak {mib(peak)} + the unit's all-gather input "
    f"{mib(sends['fsdp'])}, which that peak leaves out.",
)
later = list(GATHERING)[2]
most = {s: max(h[s] for h in held_at.values()) for s in STAGES}  # each stage's largest held sum
when = {s: " and ".join(m for m in GATHERING if held_at[m][s] == most[s]) for s in STAGES}


def against_ddp(s):  # a largest held sum against ddp's
    d = most[s] - most["ddp"]
    more = f"{abs(d) / 2**20:.2f} {'more' if d > 0 else 'less'}" if d else "as much"
    return f"{s} {most[s] / 2**20:.2f} {when[s]} ({more})"


lesson.say(
    f"Largest held sum against ddp's {mib(most['ddp'])} ({when['ddp']}): "
    + "; ".join(against_ddp(s) for s in STAGES[1:])
    + "."
)
act = {s: memory[s]["activations"] for s in STAGES}  # no stage shards what autograd saves
kept = {s: memory[s]["parameters"] + memory[s]["optimizer"] for s in STAGES}  # held at every moment
z1, z2 = ({m: held_at[m][s] for m in GATHERING} for s in ("zero1", "zero2"))
first, update = list(GATHERING)[1], list(GATHERING)[0]
shards = memory["zero1"]["gradients"] - memory["zero2"]["gradients"]  # what sharding zero2's gradients spares
lesson.claim(
    kept["zero1"] == kept["zero2"]
    and shards > 0
    and z1[update] - z2[update] == buffers["zero1"] + shards
    and z2[first] - z1[first] == buffers["zero2"]
    and z1[later] == z2[later],
    f"{update.capitalize()} zero1 holds {mib(z1[update] - z2[update])} more than zero2, its all-gather buffers plus "
    f"the {mib(shards)} of gradients zero2 shards; {first} zero2 holds {mib(buffers['zero2'])} more, its "
    f"all-gather buffers; {later} both hold {mib(z1[later])}.",
)
lesson.claim(
    len(set(act.values())) == 1 and all(kept[s] + act[s] > most[s] for s in STAGES),
    f"Each stage also saves {mib(act['ddp'])} of activations a forward (none shards them), freed by its "
    "backward; these plus its parameters and optimizer state ("
    + ", ".join(f"{s} {(kept[s] + act[s]) / 2**20:.2f}" for s in STAGES)
    + " MiB) exceed its largest held sum.",
)
(trade / 2**20).round(2)

# %% [markdown]
# ## Your turn: all_reduce from its two halves
#
# Write `my_all_reduce(tensor, group)`: sum `tensor`, of any shape, in place over `group` with one
# reduce-scatter and one all-gather, `reduce_scatter_single` and `all_gather_single` from
# `minddp.runtime.compat`; both take `(output, input)` and split the longer into n equal pieces, so the reduce-scatter's input and the all-gather's output need a
# length the world size divides. Pass `group` to `dist.get_world_size(group)`
# and to both collectives (to the reduce-scatter by name: its third parameter is `op`). Without it, or
# given `dist.group.WORLD`, a call runs over every rank of a larger job: the checker calls your transport
# with a group of its own and refuses both.
#
# The cell makes `my_all_reduce` the sum of the `bucket-async` stage's buckets (its hook divides each
# bucket by the world size first). `check` trains that stage beside a single process on the global batch
# and against the model answer (`like="halves"`), on its own network in two buckets; an answer accepted at
# two ranks is checked again at three, where a padding that is right at two ranks only, or a `2` written for
# the world size, shows.

# %%
import torch
import torch.distributed as dist
from minddp.comm import Wire
from minddp.comm.default_hooks import allreduce_hook
from minddp.runtime.compat import all_gather_single, reduce_scatter_single
from minddp.exercises import check
from minddp.stages import AsyncBucketDDP


def my_all_reduce(tensor, group):
    # 1. flatten, and pad to a length the world size divides: padded
    # 2. this rank's piece of the sum, into a piece made from padded (so that it lies on the tensor's device)
    # 3. every rank's piece, back into padded
    # 4. the sum, without the padding, copied into tensor
    raise NotImplementedError("all_reduce from a reduce-scatter and an all-gather")


class HalvesDDP(AsyncBucketDDP):
    """bucket-async whose buckets are summed by my_all_reduce."""

    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.register_comm_hook(Wire(process_group, transport=my_all_reduce), allreduce_hook)


check(HalvesDDP, like="halves")

# %% jupyter={"outputs_hidden": true, "source_hidden": true}
from minddp.collectives.halves import halves_all_reduce
from minddp.notebook.source import show_source

show_source(halves_all_reduce)
my_all_reduce = halves_all_reduce  # HalvesDDP looks the name up when it is built
check(HalvesDDP, like="halves")

# %% [markdown]
# `docs/sharding.md` has the rest of sharding: balance, checkpoints, a benchmark against torch's own.

# %%
# %dist_shutdown
