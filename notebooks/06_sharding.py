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
# gradients, and the optimizer's state (Adam keeps two more tensors the size of the model). The
# ranks compute the same update from the same averaged gradients, so all of that is repeated.
# The notebooks climb a ladder of stages, each a *rung* that adds one idea to the one below. The
# three rungs of this notebook follow ZeRO, the *Zero Redundancy Optimizer* (Rajbhandari et al., 2019,
# arXiv 1910.02054, "the ZeRO paper" below), and FSDP, *Fully Sharded Data Parallel*, PyTorch's version
# of ZeRO's third stage. They keep DDP's computation (every rank runs the whole forward and backward on
# its own examples) and stop repeating the *state*. On n ranks they cut the *parameter tensors* (the
# model's tensors) into n *chunks*, about
# `1/n` of a tensor each; the chunk assigned to a rank, the one it updates, is its *shard*. Two
# collectives, defined in the next section, do the work: the *reduce-scatter* (each rank receives one piece of the sum) and the *all-gather* (each rank receives
# every rank's piece):
#
# * `zero1`: each rank keeps the optimizer state of its shard of every parameter tensor, updates
#   that shard, and the updated shards are all-gathered;
# * `zero2`: the gradients are reduce-scattered instead of all-reduced: each rank needs only the piece
#   of the average it updates;
# * `fsdp`: the parameters are sharded too (all but a few tensors minddp's fsdp keeps whole on every
#   rank, its *replicated* ones, named with the memory table; torch's FSDP shards those too), and
#   each decoder layer of the model (a *unit*: what fsdp gathers
#   and drops as one) is gathered only around its own forward and backward: as a unit starts its
#   forward or its backward, the gather of the next unit in that order is started too (a *prefetch*,
#   one unit ahead), and the gathered parameters are dropped once the unit has run (the last
#   unit's are kept from its forward to its backward, the first the backward runs).
#
# We start with the two collectives, on the two ranks, then train the notebooks' workload with the
# four stages side by side and measure what rank 0 holds (in fp32, and fsdp computing in bf16 too).
# The notation is notebook 01's: n ranks, m bytes of a message or tensor (where the tensor is the whole
# model, as in the passes below, m is its float32 bytes), α the fixed cost of one message, β the
# time per byte. The workload line below names the gradient *buckets*: ddp, zero1 and zero2 send their
# gradients in groups, a bucket each, one collective per bucket (fsdp sends them
# otherwise: its own section says how).

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
# A **reduce-scatter** sums a tensor over the ranks and leaves each rank one `1/n` piece of the
# sum. An **all-gather** is the opposite move: each rank brings a piece and everyone ends with all
# of them. One after the other, they are an all_reduce. Here minddp's ring versions (written from
# `send`/`recv`) on every rank, checked against gloo's all_reduce. A *transport* is an all_reduce a stage
# calls instead of torch's (with, optionally, a reduce-scatter and an all-gather); `TRANSPORTS` names
# minddp's, each all three written from point-to-point messages:

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
# The ring all_reduce of the earlier notebooks is the same two, a reduce-scatter then an all-gather:
# `ring.reduce_scatter` and `ring.all_gather` above cut the whole tensor into n equal pieces (they refuse
# a whole tensor that is not n times the piece) and pass them to `reduce_scatter_pieces` and
# `all_gather_pieces` (`minddp/collectives/ring.py`);
# `ring_all_reduce` cuts any length, with `tensor_split` (pieces whose lengths differ by at most one
# element), and calls both:

# %%
# %%rank 0
from minddp.collectives.ring import ring_all_reduce
from minddp.notebook.source import show_source

show_source(ring_all_reduce)

# %% [markdown]
# What each costs, in the α-β model (α the fixed cost of one message, β the time per byte, m the bytes
# of the tensor, n ranks): a reduce-scatter or an all-gather of a tensor is `n − 1` messages per rank,
# which together carry `(n − 1)/n · m` bytes: `(n − 1) α + (n − 1)/n · m β`, and the all_reduce is
# the two. A stage sends its gradients in several collectives, so below we count in *passes*: a
# *pass* is a reduce-scatter or an all-gather of the whole model's bytes (m now the model's float32
# bytes), however many collectives carry it; its size, as the cell prints it, is what a rank sends in
# it, `(n − 1)/n · m`, not m. Per step (all its micro-batches, the gradients
# synced once): DDP all-reduces the gradients, two passes; ZeRO-2 reduce-scatters them, one pass, and
# all-gathers the updated parameters, one pass: DDP's bytes. minddp's ZeRO-1 is DDP's all-reducing
# wrapper with its optimizer sharded (its section), so it all-reduces them and then all-gathers, one
# pass more: that is this design's cost, not ZeRO-1's idea's (its ranks too update only their shards,
# so a reduce-scatter would do, as in ZeRO-2). FSDP reduce-scatters its units' gradients, a little
# under one pass (its replicated tensors left out), but it gathers each unit's parameters for every
# micro-batch's forward and again for its backward (all but the unit the backward starts with, kept
# gathered since its forward). The bound below counts, each of the whole model, one reduce-scatter
# pass a step and two gathering passes per micro-batch. It counts the replicated tensors in every pass,
# though FSDP neither reduce-scatters nor gathers them: it all-reduces them, a reduce-scatter and an
# all-gather of their bytes a step, which the bound's passes cover. These counts are for true
# reduce-scatters, as minddp's ring sends them (not gloo: the ZeRO-2 section). Passes count bytes, the
# β term, only. No cell here turns bytes into
# time: a ratio of bytes below is not a ratio of cost. The cell works these counts out for this
# workload's step on the ring, from its parameter count: arithmetic, not a measurement (the ring
# section measures what a rank sends):

# %%
# %%distributed
from minddp.train.models import count_parameters

m = count_parameters(lesson.make_model()) * 4  # float32 bytes of the whole model
one_pass = (world - 1) / world * m
accum = lesson.SETTINGS.grad_accum  # micro-batches per step
fsdp_most = (1 + 2 * accum) * one_pass  # one reduce-scatter, at most two all-gathers per micro-batch
lesson.say(
    f"Worked out, not measured: m = {lesson.mib(m)}; at n = {world} ranks each pass of the model is "
    f"{one_pass / 2**20:.2f} MiB per rank. "
    f"Per step of {accum} micro-batches: DDP's all_reduce {lesson.mib(2 * one_pass)}, "
    f"ZeRO-2's reduce-scatter + all-gather {lesson.mib(2 * one_pass)}, ZeRO-1's all_reduce + all-gather "
    f"{lesson.mib(3 * one_pass)}; FSDP's reduce-scatter + all-gathers + all_reduce of its replicated tensors at most "
    f"{lesson.mib(fsdp_most)} "
    f"(1 + 2 × {accum} passes, a bound: at most {fsdp_most / (2 * one_pass):.1f} times DDP's)."
)

# %% [markdown]
# ## The four stages side by side
#
# `ddp` is minddp's own `DistributedDataParallel` (`minddp/ddp/`, not torch's); `zero1` is the same
# wrapper with its optimizer sharded by `minddp.ZeroRedundancyOptimizer`; `zero2` and `fsdp` hand out
# this rank's shards as the model's parameters, so the optimizer built over `model.parameters()` holds
# state for the shards (and for fsdp's replicated tensors, which it hands out whole). `zero2` keeps
# the whole parameters too (its shards are views into them); `fsdp` keeps the shards and its
# replicated tensors, and gathers a unit's whole parameters around its run. A *step*, in this
# notebook, is all its micro-batches' forwards and backwards and the *update* at their end (the
# optimizer's `step()`); the workload line above calls it an optimizer step.
# `minddp.sharding.memory.Probe` measures one step of each stage from the tensors the rank holds:
# parameters, gradients just before the update, optimizer state just after, the activations (the
# most bytes autograd saved for the backward during one micro-batch's forward, leaving out every
# saved tensor that lies in a parameter's storage, a weight or its transpose, or for fsdp in a
# gathered unit's; each backward frees its forward's), and FSDP's *gathered units* at their peak:
# the full parameters it has gathered and the buffers its all-gathers receive into, counted together
# (for a moment after a gather a unit is counted twice, in its buffer and in what was unpacked from it).
# That column is measured for fsdp only (a dash for the other stages), and no column counts the buffers
# that zero1's and zero2's all-gathers of the updated parameters receive into.
# `lesson.Trainee(stage, warmup=0)` builds the stage and its optimizer on the workload, on every rank,
# without a step, so the measured step is its first: the *memory step*, as later cells call it. The code's comments
# number the parts of each algorithm (`# part 3`). AdamW keeps a *step count* per parameter tensor
# (how many updates it has made); the ✓ line printed with the memory table counts the bytes those
# counts take, not their value.

# %%
# %%distributed
from minddp.sharding.memory import Probe, formula_bytes

STAGES = ["ddp", "zero1", "zero2", "fsdp"]
trainees = {s: lesson.Trainee(s, warmup=0) for s in STAGES}
memory = {}
for name, t in trainees.items():
    probe = Probe(t.model, t.model.module, t.optimizer)
    t.step()
    memory[name] = probe.result()

# %% [markdown]
# The table below sets each stage's measured model state (parameters + gradients + optimizer state,
# the table's first three columns: no activations, no gathered units) beside its formula. The
# formulas, for `Ψ` float32 parameter values (elements, as the ZeRO paper counts them) with Adam on n ranks: each value
# costs 4 bytes of parameter, 4 of gradient and 8 of Adam's two moments, and each rung divides one
# more of the three among the ranks: DDP `16Ψ`; ZeRO-1 (optimizer state) `8Ψ + 8Ψ/n`; ZeRO-2 (and
# gradients) `4Ψ + 12Ψ/n`; FSDP (and parameters) `16Ψₛ/n + 16Ψᵣ`, where `Ψᵣ` counts the values of the
# parameter tensors it leaves whole on every rank (those outside every unit) and `Ψₛ = Ψ − Ψᵣ` those
# it shards (fsdp's optimizer keeps whole moments for its replicated tensors: the `8Ψᵣ` of its `16Ψᵣ`).
# The model state and formula columns differ by the bytes of AdamW's step counts (the ✓ line below),
# which the table's rounding to 0.001 MiB shows as 0.000 or 0.001.

# %%
# %%rank 0
import pandas as pd

rows, state_of = {}, {}
for name, got in memory.items():
    state = state_of[name] = got["parameters"] + got["gradients"] + got["optimizer"]
    formula = formula_bytes(name, got["psi"], world, got["replicated"])
    rows[name] = {
        "parameters MiB": got["parameters"] / 2**20,
        "gradients MiB": got["gradients"] / 2**20,
        "optimizer MiB": got["optimizer"] / 2**20,
        "model state MiB": state / 2**20,
        "formula MiB": formula / 2**20,
        "activations MiB": got["activations"] / 2**20,
        "gathered units (peak) MiB": got["gathered"] / 2**20 if name == "fsdp" else None,  # fsdp's only
    }
table = pd.DataFrame(rows).T
off = {s: v - formula_bytes(s, memory[s]["psi"], world, memory[s]["replicated"]) for s, v in state_of.items()}
tensors = sum(p.requires_grad for p in trainees["ddp"].model.module.parameters())
lesson.say(
    f"Ψ = {memory['ddp']['psi']:,} trainable parameter values (elements) in {tensors} parameter tensors. Rank 0's "
    f"model state at the update: ddp {table.loc['ddp', 'model state MiB']:.1f} MiB, "
    + ", ".join(f"{s} {table.loc[s, 'model state MiB']:.1f} MiB" for s in STAGES[1:])
    + f"; fsdp's gathered units peak at {table.loc['fsdp', 'gathered units (peak) MiB']:.1f} MiB."
)
# AdamW keeps a step count beside its two moments: a float32 scalar per parameter tensor it steps (a shard is one)
lesson.claim(
    all(b == 4 * tensors for b in off.values()),
    f"On rank 0 each stage holds its formula's bytes plus the storage of AdamW's step counts, a 4-byte scalar per "
    f"parameter tensor "
    f"({tensors} × 4 = {4 * tensors} bytes), which the formulas leave out.",
)
names = {id(p): n for n, p in trainees["fsdp"].model.module.named_parameters()}
left_whole = {id(p): p for _, _, p in trainees["fsdp"].model.replicated}
lesson.say(
    f"fsdp's {len(left_whole)} replicated tensors: "
    + ", ".join(f"{names[i]} ({p.numel():,} values)" for i, p in left_whole.items())
    + f"; Ψᵣ = {memory['fsdp']['replicated']:,}."
)
table.round(3).astype(object).where(table.notna(), "–")

# %% [markdown]
# The gradients column, and so the model state, is what rank 0 holds at the update. No cell here
# measures the gradients earlier in the step, when zero2 and fsdp hold whole ones, as ddp does. fsdp's gathered units are held during a forward or backward, not
# at the update. The activations column holds one value for every row: each stage runs the same
# forward on the same batch, and the column leaves out what autograd saved of the parameters,
# whether held whole or, in fsdp, gathered. Sharding saves model state, not activations:
# here they weigh about what zero1's model state does, and more than zero2's or fsdp's. The
# columns are measured at different moments of the step, so their sum is not the most a rank holds
# (the section on what each rung trades).
#
# ## bf16 compute with fp32 master weights
#
# Mixed-precision training computes the forward and backward in 16 bits (fp16 in the ZeRO paper, bf16
# here) and keeps an fp32 copy of the weights, the *master weights*, for the optimizer. minddp's FSDP
# computes in bf16 with `compute_dtype=torch.bfloat16`, as torch's `fully_shard` does with
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`: the fp32 shards
# *are* the master weights, cast to bf16 for each unit's gather (started a unit ahead, the prefetch)
# and gathered in bf16. The first ✓ line below checks that at the update it keeps what fp32 FSDP
# keeps. Of what lives only during the step, the cells below train it one step and measure two, the
# gathered units and the activations. That step takes the memory step's micro-batches (a fresh
# `lesson.step_batches()` starts at the same first step), so both activations are of the same batch.
# The gradients it holds at the update are its fp32 shards' `.grad` (the gradients in its bar of the figure below); no cell here shows the dtype of
# the gradients its bf16 backward computes before they reach the shards, or the bytes its gathers
# send. Its units are those of the `fsdp` above: `blocks_of(net)` makes each *block* (an element of the
# model's `nn.ModuleList`, a decoder
# layer) a unit, as `lesson.Trainee` does.

# %%
# %%distributed
from minddp.ladder import build_stage
from minddp.ladder.loop import train_step
from minddp.sharding.fsdp import blocks_of

net = lesson.make_model()
fsdp16 = build_stage("fsdp", net, compute_dtype=torch.bfloat16, shard=blocks_of(net))  # a unit per block
optimizer16 = torch.optim.AdamW(fsdp16.parameters(), lr=lesson.SETTINGS.lr)  # over the fp32 shards
probe = Probe(fsdp16, net, optimizer16)
train_step(fsdp16, optimizer16, next(lesson.step_batches()), lesson.loss_fn)
memory["fsdp bf16"] = probe.result()

# %% [markdown]
# The figure draws rank 0's model state at the update (the memory table's parameters, gradients and
# optimizer columns), with each stage's fp32 formula as a line, and fsdp computing in bf16 as a fifth
# bar.

# %%
# %%rank 0
from minddp.bench.memory import plot, row

measured = [dict(row(world, s, memory[s]), label=s) for s in STAGES]
measured.append(dict(row(world, "fsdp:bf16", memory["fsdp bf16"]), label="fsdp\ncomputing in bf16"))
# the model state and its fp32 formula only: the gathered units are held at another moment
plot(
    [{k: v for k, v in r.items() if k not in ("formula_mixed", "gathered")} for r in measured],
    title=f"Rank 0's model state ({world} ranks) at the update:\nmeasured (bars) beside the fp32 formulas (lines)",
    ylabel="MiB on rank 0",
)
held = {r["label"]: r["parameters"] + r["gradients"] + r["optimizer"] for r in measured}
f32, f16 = memory["fsdp"], memory["fsdp bf16"]
lesson.claim(
    held["fsdp\ncomputing in bf16"] == held["fsdp"],
    f"fsdp computing in bf16 keeps the same model state as in fp32, {held['fsdp'] / 2**20:.1f} MiB: its fp32 "
    f"shards are the master weights.",
)
# the same units gathered, 2 bytes a value instead of 4: exactly half. The activations: fewer bytes
lesson.claim(
    2 * f16["gathered"] == f32["gathered"] and f16["activations"] < f32["activations"],
    f"Its gathered units hold half the bytes, {lesson.mib(f16['gathered'])} against {lesson.mib(f32['gathered'])} at "
    f"their peak; its activations fewer, {lesson.mib(f16['activations'])} against "
    f"{lesson.mib(f32['activations'])}, {f16['activations'] / f32['activations']:.2f} times, not half (no cell here "
    "measures which of the tensors autograd saves are bf16).",
)

# %% [markdown]
# ### Why the master weights stay fp32
#
# A bf16 number has 8 significant bits (2 to 3 decimal digits), so a small change to a weight lands
# rounded, and one far smaller than the weight is lost. AdamW changes each value by about the learning
# rate lr times a ratio: the running average of its gradients over the square root of the running
# average of their squares, each average first divided by its bias correction (1 − bᵗ at update t,
# b that average's decay rate, AdamW's `betas`; not the β of the cost model), which makes them g and g²
# at the first update. So at its first update
# that ratio is g/|g|, ±1, wherever the gradient g is
# neither zero nor as small as AdamW's ε (a small constant added to the square root), so the first
# update moves each such value by about lr, up or down. The cell prints the median size
# of ddp's first update's changes, then adds lr, a change of that size, to every value held in bf16 and in fp32
# (`lesson.added`), and finds the values whose change is lost and how far the others land from lr. It
# measures that one change only, not those of later updates:

# %%
# %%rank 0
lr = lesson.SETTINGS.lr
initial = lesson.make_model()
values = torch.cat([p.detach().reshape(-1) for p in initial.parameters()])  # the initial weights
stepped = torch.cat([p.detach().reshape(-1) for p in trainees["ddp"].model.module.parameters()])  # after 1 step
lesson.say(
    f"ddp's first update (lr = {lr}, weight decay "
    f"{trainees['ddp'].optimizer.param_groups[0]['weight_decay']}) moved the values by a median of "
    f"{(stepped - values).abs().median().item() / lr:.2f} × lr, up or down."
)
took = {"bf16": lesson.added(values, lr, torch.bfloat16), "fp32": lesson.added(values, lr, torch.float32)}
lost = took["bf16"] == 0  # the values adding lr leaves as they were
norms = {id(m.weight) for m in initial.modules() if type(m).__name__.endswith("RMSNorm")}
in_a_norm = torch.cat([torch.full((p.numel(),), id(p) in norms) for p in initial.parameters()])
kept = {k: v[v != 0] / lr for k, v in took.items()}  # each change that was not lost, in units of lr
lesson.claim(
    torch.equal(lost, in_a_norm) and bool((values[lost] == 1).all()) and kept["fp32"].numel() == values.numel(),
    f"Adding lr = {lr} to each of this model's {values.numel():,} initial parameter values: in bf16 the "
    f"{int(lost.sum()):,} values it leaves unchanged ({lost.double().mean():.2%} of them) are exactly the "
    f"weights of its {len(norms)} RMSNorms, each "
    f"1.0; each of the others changes by {kept['bf16'].min():.2f} to {kept['bf16'].max():.2f} × lr. In fp32 every "
    f"value changes, by lr to within {(kept['fp32'] - 1).abs().max():.3%}.",
)

# %% [markdown]
# In bf16 the RMSNorms' weights (its normalization layers' scales, which start at 1.0; the share of the values the ✓ line gives) would lose this change, and every
# other value would take it rounded to bf16's spacing at its value (the ✓ line prints the smallest and
# the largest change, not how the changes spread between them); in fp32 every value takes it, to within
# the fraction printed. A weight held in bf16 would take every change so, rounded to bf16's spacing at
# its value, or lose it where the change is under half of it. AdamW's weight decay is such a change at
# every update, a multiplication of its own: it shrinks each weight by lr · λ of itself (lr and λ,
# the weight decay, printed above). With 8 significant bits, bf16's spacing at a value is at least
# 2⁻⁸ of it, so a change under 2⁻⁹ of the weight is rounded away. The cell sets lr · λ against 2⁻⁹,
# then multiplies each initial value, held in bf16, by 1 − lr · λ (in fp32, the product rounded to bf16):

# %%
# %%rank 0
decay = lr * trainees["ddp"].optimizer.param_groups[0]["weight_decay"]  # lr · λ
in_bf16 = values.to(torch.bfloat16)
kept_as_was = (in_bf16.float() * (1 - decay)).to(torch.bfloat16) == in_bf16
lesson.claim(
    decay < 2**-9 and bool(kept_as_was.all()),
    f"lr · λ = {decay:.1e}, {2**-9 / decay:.0f} times under 2⁻⁹ = {2**-9:.2e}: the decay leaves every one of the "
    f"{values.numel():,} values held in bf16 as it was. Weights held in bf16 would lose their weight decay at every "
    "update at this lr and λ.",
)

# %% [markdown]
# Weights held in bf16 would drift from the ones AdamW computes (no cell here measures by how much
# over later updates): so the optimizer updates fp32 copies of the weights, the master weights.

# %% [markdown]
# ### The ZeRO paper's mixed-precision count
#
# The ZeRO paper counts mixed precision as 2 bytes of 16-bit parameter, 2 of 16-bit gradient and K = 12
# bytes of optimizer state (the fp32 master copy, 4, and Adam's moments, 8): still `16Ψ` for DDP, but
# now 12 of the 16 bytes are optimizer state, which ZeRO-1 already shards: ZeRO-1 `4Ψ + 12Ψ/n`, ZeRO-2
# `2Ψ + 14Ψ/n`, FSDP `16Ψₛ/n + 16Ψᵣ` as before (minddp's FSDP in bf16 splits its 16 bytes 4 + 4 + 8, not
# 2 + 2 + 12). Against the fp32 formulas, mixed precision saves ZeRO-1 `4Ψ(1 − 1/n)` bytes and
# ZeRO-2 `2Ψ(1 − 1/n)`, half as many. Every value in the table below is a formula, computed here, not
# measured: minddp's `ddp`, `zero1` and `zero2` have no `compute_dtype`, and fsdp's run in bf16 above
# measured its 4 + 4 + 8 split at the update (the 4 of gradient: its fp32 shards' `.grad`), not the paper's.

# %%
# %%rank 0
from minddp.sharding.memory import PRECISIONS

formulas = pd.DataFrame(
    {
        r["stage"]: {
            "fp32 formula MiB": r["formula"] / 2**20,
            "ZeRO paper's mixed-precision formula MiB": r["formula_mixed"] / 2**20,
        }
        for r in measured[: len(STAGES)]
    }
).T
mixed_saves = formulas["fp32 formula MiB"] - formulas["ZeRO paper's mixed-precision formula MiB"]
lesson.say(
    f"Bytes per parameter value (parameter, gradient, optimizer): fp32 {PRECISIONS['fp32']}, the ZeRO paper's mixed "
    f"precision {PRECISIONS['bf16-mixed']}. The mixed-precision formulas come out {mixed_saves['zero1']:.1f} MiB "
    f"under the fp32 ones for zero1 and {mixed_saves['zero2']:.1f} MiB for zero2, equal for ddp and fsdp."
)
formulas.round(2)

# %% [markdown]
# ## ZeRO-1: an optimizer that updates its own shard
#
# Each parameter tensor of `numel` elements is cut, flattened, into n chunks of `ceil(numel/n)` elements, in
# rank order, the last ranks' shorter or empty (`minddp/sharding/shards.py`), and rank `r` keeps the
# optimizer state of chunk `r` of each, its shard. (An optimizer that is not element-wise needs whole
# tensors: one rank then owns each, `owned_whole` in the code below; AdamW is element-wise.) The
# updated chunks are all-gathered in buckets of their own, of at most `BUCKET_CAP_MB` = 25 MiB (a
# setting in `minddp/sharding/zero1.py`), not the stage's 4 MiB gradient buckets:

# %%
# %%distributed
zero = trainees["zero1"].optimizer
name, p = next((n, p) for n, p in trainees["zero1"].model.module.named_parameters() if p.dim() == 2)
start, end = zero.ranges[zero.index[id(p)]][rank]
print(f"rank {rank}: chunk {rank} of {name} is its elements {start:,} to {end - 1:,}, of {p.numel():,}")
whole_owned = sum(zero.owned_whole(p) for p in zero.params)
lesson.say(
    f"Parameter tensors one rank owns whole: {whole_owned} of {len(zero.params)}. All-gather buckets: "
    f"{len(zero.buckets)}, for the whole model's {lesson.mib(m)}."
)

# %% [markdown]
# Its `step()` (the update): hand each chunk the same chunk of the averaged gradient, run the local
# optimizer (an ordinary `torch.optim.AdamW` over the chunks, which are views into the parameters),
# then all-gather the chunks (`_all_gather`, in the file). These are parts 3 and 4 in the code's
# comments; parts 1 and 2 (plan every rank's chunks, make this rank's chunks views into the parameters)
# run once, in `__init__`.

# %%
# %%rank 0
from minddp import ZeroRedundancyOptimizer

show_source(ZeroRedundancyOptimizer.step)

# %% [markdown]
# ## ZeRO-2: reduce-scatter the gradients
#
# `zero2` is `bucket-async` (`AsyncBucketDDP`, the stage whose gradient buckets are all-reduced
# while the backward runs) with four changes, parts 1 to 4 in its code's comments (its own
# numbering, not ZeRO-1's):
#
# 1. each parameter is cut into n chunks, as ZeRO-1 cuts it, and this rank's chunk, its shard, is made a
#    parameter of its own (`self.shard[p]`), a view into the whole one (`__init__`);
# 2. a full bucket's gradients are packed rank by rank (rank 0's chunk of every gradient in the bucket,
#    then rank 1's, ...), so that the piece of the reduce-scatter that rank r receives is its chunk of
#    each, and handed to a reduce-scatter instead of the all_reduce; the whole gradients are
#    dropped (`_send_bucket`);
# 3. the reduce-scatter leaves this rank its piece of the averaged bucket: for each of its shards, that
#    shard's chunk of the averaged gradient, back to back; each becomes its shard's `.grad` (or is
#    added to it, if the shard has a `.grad` already: `_write_back`): the optimizer updates the shards only;
# 4. in the next forward, the updated shards are all-gathered back into the whole parameters,
#    one all-gather per gradient bucket: after a sync, `forward`
#    calls `gather_parameters`, which starts every bucket's all-gather at
#    once, before the first module runs; each module waits for its own bucket's gather just before it
#    runs (the forward pre-hooks in `__init__` call `_wait_for`).
#
# The cell prints the lines that do each part (from `minddp/sharding/zero2.py`; `key_lines` finds each
# by a text it holds), then part 2's reduce-scatter hook whole. `Wire` is minddp's wrapper of a process
# group, through which a stage's comm hooks send; `Wire.of(state)` wraps the hook's state in one unless
# it is one already.

# %%
# %%rank 0
from minddp.notebook.source import key_lines
from minddp.sharding.hooks import reduce_scatter_hook
from minddp.sharding.zero2 import Zero2DDP

parts = [  # (part, method, a text that the line doing it holds)
    ("part 1", "__init__", "self.shard[p] = nn.Parameter("),
    ("part 2", "__init__", "self.comm_hook = reduce_scatter_hook"),
    ("part 2", "_send_bucket", "flat = pack_rank_major("),
    ("part 3", "_write_back", "shard.grad = chunk"),
    ("part 4", "forward", "self.gather_parameters("),
    ("part 4", "__init__", "register_forward_pre_hook(lambda m, args, b=buckets"),
]
print(key_lines(Zero2DDP, parts) + "\n")
show_source(reduce_scatter_hook)

# %% [markdown]
# A stage's *look* (`Trainee.look()`): one step (all its micro-batches) under the profiler, read in
# memory (`minddp.analysis.live`): its collectives, each with the moment the stage *handed it over* (the
# start of its call into `torch.distributed`) and the bytes *given* to it (the tensors this rank passed
# in; the next section measures what a rank sends). Its *gradient collectives* are the collectives that
# sum gradients (fsdp's all_reduces of its replicated tensors included), which it counts as the
# all_reduces handed over; it counts the all-gathers of parameters apart. On gloo every gradient
# collective is an all_reduce:
# a comm hook hands back a `torch.futures.Future` (which runs the write-back chained to it once the
# sum is done), and gloo's reduce-scatter
# hands back none to chain to, so a hook using it would wait for the sum before backward goes on. So on gloo
# minddp runs zero2's and fsdp's reduce-scatters as all_reduces of the whole tensor they are given (a
# zero2 bucket, an fsdp unit's gradients) and keeps the piece a reduce-scatter would have left this
# rank. Each look below is its trainee's second step: the first was the memory step above, so
# zero2's look starts by gathering the parameters that step updated.

# %%
# %%distributed
looks = {s: trainees[s].look() for s in STAGES}
accum = lesson.SETTINGS.grad_accum
z = looks["zero2"]
lesson.claim(
    z["bytes"] == looks["ddp"]["bytes"],
    f"zero2's gradient collectives are given ddp's bytes, {lesson.mib(z['bytes'])}, the whole gradients (a "
    "reduce-scatter is given the whole bucket too): what rank 0 sends is measured on the ring below.",
)
units = len(trainees["fsdp"].model.units)
outside = len({id(p) for _, _, p in trainees["fsdp"].model.replicated})

# %% [markdown]
# ## What rank 0 sends, on the ring
#
# The look counts the bytes given to each collective, in which the bytes a reduce-scatter spares
# against an all_reduce do not show. The four stages now send through minddp's own ring
# (`minddp.collectives`), plugged into each stage's `Wire` as its transport (the first section's word):
# the all_reduce, reduce-scatter and all-gather the `Wire` calls instead of torch's; the profiler
# records each message gloo sends with the tensor it carried. The table is what rank 0 sent in one step,
# by the collective the message served. zero2's trainee here takes one step
# before its look (`warmup=1`), as the memory step did for the gloo looks: zero2 all-gathers the updated
# shards in the forward after an update, so the looked-at step starts with those all-gathers (its first
# step has none to make). fsdp's reduce-scatter sends a little under a pass: its replicated
# tensors, which it all-reduces, are left out. The ✓ line's bytes fsdp sent
# "gathering units" are bytes sent in a step, not the memory table's gathered units, which are bytes
# held at one moment. Bytes *sent*
# are not the bytes *given* of the look above: a ring all_reduce sends `2(n − 1)/n` of the bytes it
# is given, which at these n = 2 ranks is the same number, and at other n is not:

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
# padding each parameter's chunks to equal length adds fewer than n elements per parameter tensor: far under 0.1 %
lesson.claim(
    abs(z2["reduce_scatter"] - whole / 2) < 1e-3 * whole,
    f"zero2's reduce-scatter sent {lesson.mib(z2['reduce_scatter'])}, half of ddp's all_reduce "
    f"({lesson.mib(whole)}): each rank receives only the piece of the average it updates.",
)
lesson.claim(
    abs(total["zero2"] - whole) < 1e-3 * whole and abs(total["zero1"] - 1.5 * whole) < 1e-3 * whole,
    f"Its all-gathers of the updated parameters send the other half ({lesson.mib(z2['all_gather'])}), so on the ring "
    f"zero2 sends ddp's bytes, {lesson.mib(total['zero2'])} a step, where zero1, which all-reduces whole gradients "
    f"and then all-gathers, sends 1.5 times as many ({lesson.mib(total['zero1'])}).",
)
f_sent = rings["fsdp"]["sent"]
passes = f_sent["all_gather"] / one_pass  # what a rank sent gathering units, in passes of the whole model
# one reduce-scatter pass, at most two gathering passes per micro-batch (the α-β count's bound); the tensors left
# whole are all-reduced (two passes of their bytes), which the bound's gathers of them more than cover
lesson.claim(
    total["fsdp"] <= fsdp_most and passes < 2 * accum and f_sent["all_gather"] > total["fsdp"] / 2,
    f"fsdp sent {f_sent['reduce_scatter'] / 2**20:.2f} MiB reduce-scattering its units' gradients, "
    f"{f_sent.get('all_reduce', 0) / 1024:.0f} KiB all-reducing the {outside} parameter tensors it leaves whole, "
    f"and {f_sent['all_gather'] / 2**20:.2f} MiB gathering units for each micro-batch's forward and backward "
    f"({f_sent['all_gather'] / total['fsdp']:.0%} of what it sent): {passes:.2f} passes of the model, "
    f"{passes / accum:.2f} a micro-batch, under the bound's 2 (the last unit is not gathered again for the "
    f"backward, and the {outside} tensors outside the units are never gathered). In all {total['fsdp'] / 2**20:.2f} "
    f"MiB a step (the table's total), {total['fsdp'] / whole:.1f} times ddp's, within the bound's "
    f"{lesson.mib(fsdp_most)}.",
)
on_wire.round(2)

# %% [markdown]
# ## FSDP: gather each unit around its run
#
# Each decoder layer of the model (an element of its `nn.ModuleList`) is a *unit*. Before a unit's
# forward its shards are all-gathered into full parameters, and the next unit's gather is started
# (a prefetch); after the forward the full parameters are dropped (all but the last unit's: the
# backward starts with that unit, so it stays gathered). The backward needs them again, and the
# tensors autograd saves for it would keep them alive, so a saved-tensor hook keeps a note of where
# those tensors lay in them instead; the first note unpacked in the backward gathers the unit again,
# or waits for its gather if it was prefetched, and starts the gather of the unit before it: the
# backward prefetches too, one unit ahead in its own order. The gradients of a unit arrive
# together, from one autograd function; in the last micro-batch's backward they are handed to one
# gradient collective then (a reduce-scatter, which on gloo minddp runs as an all_reduce of the
# unit's gradients: the ZeRO-2 section), in the others they are accumulated whole under
# `no_sync()`. The replicated tensors' gradients get an all_reduce each. The figure below marks both
# kinds alike, as gradient collectives. The first ✓ line below checks the size of the gathered units'
# peak, two units' worth, not when it fell (no cell measures that). In `minddp/sharding/fsdp.py`, two units are
# held at once while a unit's full parameters lie beside the receive buffer of the unit prefetched
# after it (in the forward's order or the backward's), or beside the unit's own buffer while that is
# unpacked into them.

# %%
# %%distributed
fsdp = trainees["fsdp"].model
unit_bytes = max(sum(u.numels) for u in fsdp.units) * 4  # one unit's full fp32 parameters
# two units, each padded by fewer than n elements per parameter tensor: within 0.1 %
lesson.claim(
    abs(memory["fsdp"]["gathered"] - 2 * unit_bytes) < 1e-3 * unit_bytes,
    f"{len(fsdp.units)} units ({type(fsdp.units[0].module).__name__}), "
    f"{len({id(p) for _, _, p in fsdp.replicated})} replicated parameter tensors; at most "
    f"{lesson.mib(memory['fsdp']['gathered'])} gathered at once (the memory table's column: full parameters and "
    "receive buffers), two units' worth, against "
    f"{lesson.mib(memory['ddp']['parameters'])} for the whole model.",
)
f = looks["fsdp"]
lesson.claim(
    f["gathers"] == accum * (2 * units - 1),
    f"fsdp gathers each of its {units} units for the forward of each of the {accum} micro-batches, and all but "
    f"the last again for its backward (the backward starts with the last unit, still gathered): {accum} × "
    f"{2 * units - 1} = {f['gathers']} all-gathers a step.",
)
lesson.claim(
    f["calls"] == units + outside,
    f"fsdp's {f['calls']} gradient collectives: one per unit ({units}, a reduce-scatter, which on gloo runs as an "
    f"all_reduce of the unit's gradients) and one all_reduce per parameter tensor it leaves whole ({outside}): "
    f"{f['calls']} all_reduces on gloo.",
)

# %% [markdown]
# ## Where each rung hands its collectives over
#
# The figure draws, for `ddp` and the three sharded stages, the step each stage's look (on gloo, in
# the ZeRO-2 section) recorded: its phases in their order (each micro-batch's forward and backward,
# then the update), each drawn the same width, and a mark for each gradient collective and each
# all-gather of parameters its look counted, in the phase it was handed over in. It shows the order of
# events only, no lengths: within a phase each kind's marks are spread evenly on a line of their own
# (black above brown), in the order they were handed over, so that each kind can be counted; the order
# between the two kinds is not drawn, and the spacing is not timing either:
# zero2's all-gathers, which `gather_parameters` hands over together before the first module runs
# (the ZeRO-2 section), are drawn across the whole of its forward 1. The black mark stands for every
# gradient collective alike: ddp's and zero1's bucket all_reduces, the all_reduces that run for zero2's
# and fsdp's reduce-scatters on gloo, and fsdp's all_reduces of its replicated tensors. The figure
# draws these two kinds only: it leaves out any other collective a stage hands over.
#
# Why the place matters: a collective can overlap compute (notebook 01's word) only while compute
# still runs after it is handed over. zero1 hands its all-gather over in the update, after the step's
# last forward and backward, with no module left to run in the step; zero2 and fsdp
# hand theirs over in a forward or backward, with modules still to run. The figure shows where they
# were handed over, not whether they overlapped: no cell here measures that.


# %%
# %%rank 0
lesson.handed_picture(looks, STAGES, title="ddp and the sharded rungs on gloo, one step each (rank 0)")
lesson.claim(
    all(
        len(looks[s]["handed"]["calls"]) == looks[s]["calls"]
        and len(looks[s]["handed"]["gathers"]) == looks[s]["gathers"]
        for s in STAGES
    ),
    "Each row marks every gradient collective and every all-gather of parameters its look counted: "
    + ", ".join(
        f"{s} {looks[s]['calls']} gradient collectives + {looks[s]['gathers']} "
        + ("all-gather" if looks[s]["gathers"] == 1 else "all-gathers")
        + " of parameters"
        for s in STAGES
    )
    + ".",
)
# where each is handed over is the code's, whatever the load: zero1 all-gathers in step() (the update), zero2 in
# its first forward (which needs the updated parameters); every stage syncs once a step, in the last backward
where = {s: {kind: lesson.handed_in(looks[s], kind) for kind in ("calls", "gathers")} for s in STAGES}
lesson.claim(
    where["zero1"]["gathers"] == ["update"],
    f"zero1 hands its {looks['zero1']['gathers']} all-gather of parameters over inside its update "
    "(ZeroRedundancyOptimizer.step above: update the chunks, then all-gather).",
)
lesson.claim(
    where["zero2"]["gathers"] == ["forward 1"],
    f"zero2 hands its {looks['zero2']['gathers']} all-gathers over in the first forward, which needs the parameters "
    "the last step updated.",
)
lesson.claim(
    all(where[s]["calls"] == [f"backward {accum}"] for s in STAGES),
    "Every stage hands all its gradient collectives over during the last micro-batch's backward: the "
    f"{accum - 1} before it accumulate their gradients whole under no_sync().",
)

# %% [markdown]
# ## The same training, whatever the rung
#
# Sharding changes what each rank keeps, not what is computed: after the same steps every stage
# holds the same model, up to float rounding. The cell below compares each sharded stage with `ddp`
# after the same steps; at these 2 ranks it finds them equal; at more ranks the stages add the ranks' gradients in different
# orders, and `docs/sharding.md`'s tests at 3 ranks allow for rounding. fsdp keeps most parameters only
# as shards, and zero2's whole parameters hold the other ranks' chunks from before the update until the next forward
# gathers them (part 4 of ZeRO-2), so `full_parameters()` gathers both whole for the comparison.


# %%
# %%distributed
def flat_model(t):
    if hasattr(t.model, "full_parameters"):  # zero2, fsdp
        return torch.cat([v.reshape(-1) for v in t.model.full_parameters().values()])
    return torch.cat([p.detach().reshape(-1) for p in t.model.module.parameters()])


(steps,) = {len(t.losses) for t in trainees.values()}  # each took the memory step and its look's step
reference = flat_model(trainees["ddp"])
lesson.say(
    f"Largest parameter difference from ddp after {steps} steps: "
    + ", ".join(f"{s} {(flat_model(trainees[s]) - reference).abs().max().item():.1e}" for s in STAGES[1:])
    + "."
)

# %% [markdown]
# ## What each rung trades
#
# Rank 0's model state at the update (the memory table) beside what it sent in a step on minddp's
# ring (the ring table), at these 2 ranks. Bytes are the β side only.
#
# Two limits. The model state is what rank 0 holds at the update, not the most it holds during the
# step: before the last micro-batch zero2 and fsdp hold whole gradients, as ddp does, and the model
# state leaves out the activations, the collectives' buffers and fsdp's gathered units (the memory
# table's: set them beside fsdp's saving over zero2 below).
# And the bytes are the ring's, with true
# reduce-scatters: through gloo, as this notebook's other runs send, zero2's reduce-scatters run as
# all_reduces of whole buckets (the ZeRO-2 section), so the ✓ line's fewer bytes hold on the ring only.
# fsdp's multiples grow with the micro-batches a step: it gathers every unit for each (the first
# section's bound).

# %%
# %%rank 0
trade = pd.DataFrame({"model state MiB": table["model state MiB"], "sent a step MiB": pd.Series(total) / 2**20})
spared = trade.loc["ddp", "model state MiB"] - trade["model state MiB"]  # against ddp's, at the update
lesson.say(
    "Against ddp: "
    + "; ".join(
        f"{s} holds {spared[s]:.1f} MiB less at the update and sends {total[s] / total['ddp']:.1f} times ddp's "
        "bytes on the ring"
        for s in STAGES[1:]
    )
    + f". fsdp beyond zero2: {spared['fsdp'] - spared['zero2']:.1f} MiB less at the update, for "
    f"{total['fsdp'] / total['zero2']:.1f} times zero2's bytes on the ring."
)
lesson.claim(
    (trade.loc["zero2"] < trade.loc["zero1"]).all(),
    "In both of the table's columns zero2 is under zero1: less model state at the update and, on the ring, fewer "
    "bytes sent a step.",
)
trade.round(1)

# %% [markdown]
# ## Your turn: all_reduce from its two halves
#
# Write `my_all_reduce(tensor, group)`: sum `tensor` in place over `group` with one reduce-scatter and
# one all-gather. Pad the flattened tensor to a length the world size divides; reduce-scatter it, so
# that each rank receives its piece of the sum; all-gather the pieces back into the padded tensor; cut
# the padding off and copy the sum into `tensor`. The two collectives are `reduce_scatter_single` and
# `all_gather_single` from `minddp.runtime.compat` (torch's `dist.reduce_scatter_tensor` and
# `dist.all_gather_into_tensor`, under torch 2.13's names); both take `(output, input)`. Pass `group`
# everywhere, not `dist.group.WORLD`: to `dist.get_world_size(group)` and to both collectives (to the reduce-scatter by name,
# `group=group`: its third parameter is `op`). Without it, or given `dist.group.WORLD`, a call runs
# over every rank of a larger job; the checker refuses only a call without it.
#
# The cell makes `my_all_reduce` the sum of the `bucket-async` stage's buckets (its hook divides each
# bucket by the world size first, so `my_all_reduce` only sums). `check` trains that stage beside a
# single process on the global batch (its verdict prints the largest parameter difference from it),
# and against the model answer (`like="halves"`). It trains its own small
# network in two buckets, one of an odd length, which tests your padding; some wrong answers come out
# right at two ranks (padding by `numel % n` instead of `-numel % n`, or a `2` written for the world
# size), so an answer accepted at two ranks is checked again at three. Its buckets are flat tensors,
# so after training it also hands `my_all_reduce` a tensor of 5 × 7 values, which fails an answer that
# pads it without flattening it, or copies the sum back without `.view_as(tensor)`.

# %%
import torch
import torch.distributed as dist
from minddp.comm import Wire
from minddp.comm.default_hooks import allreduce_hook
from minddp.runtime.compat import all_gather_single, reduce_scatter_single
from minddp.exercises import check
from minddp.stages import AsyncBucketDDP


def my_all_reduce(tensor, group):
    # 1. flatten and pad to a multiple of dist.get_world_size(group)
    # 2. reduce_scatter_single(piece, padded, group=group): this rank's piece of the sum
    #    (make the piece from padded, padded.new_empty(padded.numel() // dist.get_world_size(group)),
    #    so that it lies on the tensor's device)
    # 3. all_gather_single(padded, piece, group=group): every piece, back in place
    # 4. copy the sum (without the padding) into tensor
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
# That was the end of the ladder's sharded rungs: from one process, to DDP, to sharding each kind of model
# state. `docs/sharding.md` has the rest: the balance of the shards, checkpoints that load at
# another world size, the benchmark against torch's own sharding, and what torch's
# `ZeroRedundancyOptimizer` and `fully_shard` do on CPU/gloo.

# %%
# %dist_shutdown
