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
# The ZeRO rungs keep DDP's computation (every rank runs the whole forward and backward on its own
# shard of the batch) and stop repeating the *state*:
#
# * `zero1`: each rank keeps the optimizer state of `1/N` of every parameter, steps that part,
#   and the updated parameters are all-gathered;
# * `zero2`: the gradients are *reduce-scattered* instead of all-reduced, so each rank only
#   ever receives the part of the average it steps;
# * `fsdp`: the parameters are sharded too, and each block of the model is gathered just before
#   it runs and dropped after.
#
# Two collectives do the work: the reduce-scatter and the all-gather. We start with them, on the
# two ranks, then train the notebooks' workload with the four stages side by side and measure
# what each rank holds.

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
# A **reduce-scatter** sums a tensor over the ranks and leaves each rank one `1/N` piece of the
# sum. An **all-gather** is the opposite move: each rank brings a piece and everyone ends with all
# of them. One after the other, they are an all_reduce. Here minddp's ring versions (written from
# `send`/`recv`) on every rank, checked against gloo's all_reduce:

# %%
# %%distributed
import torch
import torch.distributed as dist
from minddp.collectives import TRANSPORTS

ring, world = TRANSPORTS["ring"], dist.get_world_size()
x = torch.arange(4.0 * world) + 100 * rank  # each rank's own tensor
piece = torch.empty(4)
ring.reduce_scatter(piece, x, dist.group.WORLD)  # my piece of the sum
whole = torch.empty(4 * world)
ring.all_gather(whole, piece, dist.group.WORLD)  # everyone's pieces
summed = x.clone()
dist.all_reduce(summed)
print("my piece of the sum:", piece.tolist())
print("all pieces gathered:", whole.tolist(), "= all_reduce:", torch.equal(whole, summed))

# %% [markdown]
# The ring all_reduce of the earlier notebooks is literally the two passes:

# %%
# %%rank 0
from minddp.collectives.ring import ring_all_reduce
from minddp.notebook.source import show_source

show_source(ring_all_reduce)

# %% [markdown]
# What each costs, in the α-β model (α the latency of one message, β seconds per byte, `B` the
# bytes of the tensor, `N` ranks): each pass is `N − 1` messages carrying `(N − 1)/N · B` bytes per
# rank, and the all_reduce is both. So ZeRO-2, which reduce-scatters the gradients and later
# all-gathers the parameters, moves the bytes DDP moves; FSDP gathers the parameters twice, for
# the forward and again for the backward. For this workload's gradients, per synced backward
# (one micro-batch; what a step with several micro-batches adds is counted further down):

# %%
# %%distributed
from minddp.train.models import count_parameters

B = count_parameters(lesson.make_model()) * 4  # float32 bytes of the whole model
one_pass = (world - 1) / world * B
lesson.say(
    f"B = {lesson.mib(B)}; at {world} ranks each pass sends {lesson.mib(one_pass)} per rank, in "
    f"{world - 1} message(s): all_reduce {lesson.mib(2 * one_pass)} (DDP), reduce-scatter + all-gather "
    f"{lesson.mib(2 * one_pass)} (ZeRO-2), reduce-scatter + two all-gathers {lesson.mib(3 * one_pass)} (FSDP)."
)

# %% [markdown]
# ## The four stages side by side
#
# `ddp` is the production DDP; `zero1` is the same wrapper with its optimizer sharded by
# `minddp.ZeroRedundancyOptimizer`; `zero2` and `fsdp` replace the module's parameters by this
# rank's shards, so the optimizer built over `model.parameters()` holds state for the shards only
# (`minddp.ladder.make_optimizer` builds each stage's). One step of each is measured by
# `minddp.bench.memory.Probe`, from the tensors the rank holds: parameters, gradients just
# before the optimizer steps, optimizer state just after, the activations autograd saved, and
# FSDP's gathered blocks at their peak.

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

# %%
# %%rank 0
import pandas as pd

rows = {}
for name, m in memory.items():
    state = m["parameters"] + m["gradients"] + m["optimizer"]
    formula = formula_bytes(name, m["psi"], world, m["replicated"] if name == "fsdp" else 0)
    rows[name] = {
        "parameters MiB": m["parameters"] / 2**20,
        "gradients MiB": m["gradients"] / 2**20,
        "optimizer MiB": m["optimizer"] / 2**20,
        "model state MiB": state / 2**20,
        "formula MiB": formula / 2**20,
        "measured / formula": state / formula,
        "activations MiB": m["activations"] / 2**20,
        "gathered (peak) MiB": m["gathered"] / 2**20,
    }
table = pd.DataFrame(rows).T
lesson.say(
    f"Ψ = {memory['ddp']['psi']:,} trainable parameters. Model state per rank: ddp "
    f"{table.loc['ddp', 'model state MiB']:.1f} MiB, zero1 {table.loc['zero1', 'model state MiB']:.1f}, zero2 "
    f"{table.loc['zero2', 'model state MiB']:.1f}, fsdp {table.loc['fsdp', 'model state MiB']:.1f} plus "
    f"{table.loc['fsdp', 'gathered (peak) MiB']:.1f} MiB of blocks gathered at once; each within "
    f"{100 * (table['measured / formula'] - 1).abs().max():.2f} % of its formula."
)
table.round(3)

# %% [markdown]
# The formulas (for `Ψ` float32 parameters with Adam, `N` ranks): DDP `16Ψ` (4 bytes of parameter, 4
# of gradient, 8 of Adam state per parameter); ZeRO-1 `8Ψ + 8Ψ/N`; ZeRO-2 `4Ψ + 12Ψ/N`; FSDP
# `16Ψ/N` for what it shards, plus 16 bytes per parameter it leaves whole: here the embeddings, the
# final norm and the classifier, which are outside every block (`docs/sharding.md` explains every
# difference). The activations are the same in every column: each stage runs the same forward on
# the same batch. Sharding saves model state, not activations.

# %% [markdown]
# ## ZeRO-1: an optimizer that steps its own part
#
# Every parameter is cut, flattened, into `N` chunks; rank `r` keeps the optimizer state of chunk
# `r` of every parameter. Cutting *every* tensor (not handing whole tensors to ranks) keeps the
# ranks' shares equal to a few elements:

# %%
# %%distributed
from minddp.sharding.memory import optimizer_state_bytes

zero = trainees["zero1"].optimizer
name, p = next((n, p) for n, p in trainees["zero1"].model.module.named_parameters() if p.dim() == 2)
print(
    f"rank {rank}: chunk {zero.ranges[zero.index[id(p)]][rank]} of {name}'s {p.numel():,} elements; "
    f"Adam state on this rank: {optimizer_state_bytes(zero):,} bytes"
)

# %% [markdown]
# Its step: hand each chunk its slice of the averaged gradient, step the local optimizer (an
# ordinary `torch.optim.AdamW` over the chunks, which are views into the parameters), then
# all-gather the chunks.

# %%
# %%rank 0
from minddp import ZeroRedundancyOptimizer

show_source(ZeroRedundancyOptimizer.step)
show_source(ZeroRedundancyOptimizer._all_gather)

# %% [markdown]
# ## ZeRO-2: reduce-scatter the gradients
#
# `zero2` is `bucket-async` with four changes. The package says which methods changed (the changed
# lines of each, with two lines around them; `minddp/sharding/zero2.py` has the whole file):

# %%
# %%rank 0
from minddp.notebook.source import show_diff
from minddp.sharding.zero2 import Zero2DDP
from minddp.stages import AsyncBucketDDP

show_diff(AsyncBucketDDP, Zero2DDP, context=2)

# %% [markdown]
# A profiled step (all its micro-batches), read in memory: the all_reduce calls and the bytes
# handed to them, how many started while a backward ran, and the all-gathers that bring the
# parameters back, with what this rank sent for them. Two things make gloo's counts differ from
# the α-β count above: minddp's reduce-scatter travels as an all_reduce on gloo (gloo's own hands
# back no Future: `docs/sharding.md`), so it sends the whole all_reduce's bytes, not half; and once
# a step `zero2`, built on the teaching stages, all-gathers a few bytes to check that every rank's
# forwards used the same parameters (`minddp/stages/checks.py`), counted apart below.

# %%
# %%distributed
looks = {s: trainees[s].look() for s in ("ddp", "zero2", "fsdp")}
k = lesson.SETTINGS.grad_accum
for s, v in looks.items():
    lesson.say(
        f"{s}: {v['calls']} all_reduce calls ({v['calls_in_backward']} started during a backward) handed "
        f"{lesson.mib(v['bytes'])}; {v['gathers']} all-gathers of parameters, this rank sending "
        f"{lesson.mib((world - 1) * v['gather_bytes'])}; {v['small_gathers']} small all_gather (the check)."
    )
z, f = looks["zero2"], looks["fsdp"]
lesson.claim(
    z["bytes"] == looks["ddp"]["bytes"],
    "zero2 hands its gradients to the wire whole, as ddp does: on gloo "
    "its reduce-scatter is an all_reduce, which sends both passes.",
)
# padding every parameter's chunks to equal length adds under `world` elements per parameter: far under 0.1 %
lesson.claim(
    abs((world - 1) * z["gather_bytes"] - one_pass) < 1e-3 * one_pass,
    f"zero2's all-gathers send one pass of the model, {lesson.mib(one_pass)} per rank, as the α-β count above says.",
)
units = len(trainees["fsdp"].model.units)
lesson.claim(
    f["gathers"] == k * (2 * units - 1),
    f"fsdp gathers each of its {units} units for the forward of each of "
    f"the {k} micro-batches, and all but the last again for its backward (the backward starts with the last "
    f"unit, still gathered): {k} × {2 * units - 1} = {f['gathers']} all-gathers, "
    f"{(world - 1) * f['gather_bytes'] / one_pass:.1f} passes of the model a step.",
)

# %% [markdown]
# ## FSDP: gather each block just before it runs
#
# Each block of the model (each element of its `nn.ModuleList`) is a *unit*. Before a unit's
# forward its shards are all-gathered into full parameters, and the next unit's gather is started
# (a prefetch); after the forward the full parameters are dropped, and a saved-tensor hook keeps
# a note of where autograd's saved tensors lay in them; the first note unpacked in the backward
# gathers the unit again. The gradients of a unit arrive together, from one autograd function,
# and are reduce-scattered while the backward goes on.

# %%
# %%distributed
fsdp = trainees["fsdp"].model
lesson.say(
    f"{len(fsdp.units)} units ({type(fsdp.units[0].module).__name__}), "
    f"{len({id(p) for _, _, p in fsdp.replicated})} replicated parameters; at most "
    f"{lesson.mib(memory['fsdp']['gathered'])} of full parameters held at once (a unit and the one "
    f"prefetched), against {lesson.mib(memory['ddp']['parameters'])} for the whole model."
)

# %% [markdown]
# ## The sharded rungs on one time axis
#
# `ddp` and the three sharded stages, one profiled step each, read from their traces with
# `minddp.analysis` and drawn as `03_build_up` drew the DDP ladder: forward and backward of each
# micro-batch, each collective while it ran (all_reduces and all-gathers), the optimizer step.
# ZeRO-1's all-gathers come after its optimizer step; zero2's at the start of the step, when the
# first forward needs the parameters its last step updated; FSDP's all through the forwards and
# the backwards.

# %%
# %%distributed
import shutil

trace_dir = lesson.TRACE_ROOT / "06_sharding"
if rank == 0:
    shutil.rmtree(trace_dir, ignore_errors=True)  # a fresh run folder: the analysis refuses mixed runs
dist.barrier()
for s in STAGES:
    trainees[s].profile(trace_dir)

# %%
# %%rank 0
from minddp.analysis import analyze_run
from minddp.analysis.timeline import draw_steps, rows_from_analysis

sharded = analyze_run(trace_dir)
draw_steps(rows_from_analysis(sharded), title="ddp and the sharded rungs, one step each on one time axis (rank 0)")
table = sharded.stages.assign(comm_ms_per_step=sharded.stages["comm_time_per_step_us"] / 1e3)
z = looks["zero2"]
lesson.claim(
    table.loc["zero2", "allgather_calls_per_step"] == z["gathers"] + z["small_gathers"],
    f"The trace's {table.loc['zero2', 'allgather_calls_per_step']:.0f} all-gathers of zero2 are the look's "
    f"{looks['zero2']['gathers']} of parameters and its {looks['zero2']['small_gathers']} check.",
)
table[["allreduce_calls_per_step", "allgather_calls_per_step", "comm_ms_per_step", "comm_comp_overlap_pctg"]].round(1)

# %% [markdown]
# ## The same training, whatever the rung
#
# Sharding changes what each rank keeps, never what is computed: after the same steps every stage
# holds the same model. The sharded stages' parameters are shards, so `full_parameters()`
# gathers them whole for the comparison. First every trainee takes the steps it is behind (the
# looks and traces above took a few more steps of some), then the four take turns, one step each,
# for two rounds.


# %%
# %%distributed
def whole(t):
    if hasattr(t.model, "full_parameters"):
        return torch.cat([v.reshape(-1) for v in t.model.full_parameters().values()])
    return torch.cat([p.detach().reshape(-1) for p in t.model.module.parameters()])


behind = max(len(t.losses) for t in trainees.values())
for t in trainees.values():
    while len(t.losses) < behind:
        t.step()
times = lesson.race(trainees, rounds=2)
reference = whole(trainees["ddp"])
for s in STAGES[1:]:
    lesson.say(
        f"{s}: largest parameter difference from ddp after {len(trainees[s].losses)} steps "
        f"{(whole(trainees[s]) - reference).abs().max().item():.1e}; median step "
        f"{lesson.median(times[s]):.0f} ms (ddp {lesson.median(times['ddp']):.0f} ms)."
    )

# %% [markdown]
# Two rounds on a shared machine decide nothing about speed; `python -m minddp.bench --preset small
# --stage sharded` runs the comparison properly, beside torch's own `ZeroRedundancyOptimizer` and
# `fully_shard`, and `docs/sharding.md` has its figures.

# %% [markdown]
# ## Your turn: all_reduce from its two halves
#
# Write `my_all_reduce(tensor, group)`: sum `tensor` in place over `group` with one
# `reduce_scatter_single` and one `all_gather_single`, torch's own collectives as `minddp.runtime.compat`
# names them (torch 2.13 renamed `dist.reduce_scatter_tensor` and `dist.all_gather_into_tensor`;
# `minddp.runtime.compat` calls whichever your torch has). Both want a tensor whose length
# the world size divides: pad the flattened tensor first, and cut the padding off at the end. The
# cell plugs your function into a `Wire` as its *transport*, so the `bucket-async` stage sums its
# buckets with it, and `check` trains that stage beside a single process and torch's DDP, and
# against the model answer (`like="halves"`): one reduce-scatter and one all-gather per bucket.

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
# That was the end of the ladder: from one process, to DDP, to sharding every part of the model
# state. `docs/sharding.md` has the rest: the balance of the shards, checkpoints that load at
# another world size, the benchmark against torch's own sharding, and what torch's
# `ZeroRedundancyOptimizer` and `fully_shard` do on CPU/gloo.

# %%
# %dist_shutdown
