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
# # 01 · Collectives on real ranks
#
# Data parallelism needs only a handful of communication patterns. This notebook runs each one on
# four real processes (*ranks*): gloo on a CPU, NCCL when every rank has a GPU. Every cell marked
# `%%distributed` runs on every rank, and each rank's output appears under its label
# (`00_runner_demo` shows how the runner works).
#
# Point-to-point messages come first, then the collectives, where every rank of the group takes
# part in the same call. Two of them carry the whole of data parallelism: `broadcast` (every rank
# starts from the same weights) and `all_reduce` (every rank applies the same averaged gradient);
# the next notebook builds exactly that. At the end, the ring all_reduce that gloo and NCCL run is
# drawn step by step from the messages four ranks really sent.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 4

# %% [markdown]
# ## Point-to-point: `send` / `recv`
#
# One rank sends a tensor, another receives it into a buffer of the same shape. Both calls block until
# the transfer is done, so the two ranks must agree on who sends and who receives (otherwise both wait
# forever). Here the ranks work in pairs: 0 sends to 1, 2 sends to 3.

# %%
# %%distributed
t = torch.zeros(3, device=device)
if rank % 2 == 0:
    t += torch.tensor([1.0, 2.0, 3.0], device=device) * (rank + 1)
    dist.send(t, dst=rank + 1)
else:
    dist.recv(t, src=rank - 1)
print(f"rank {rank} holds {t.tolist()}")

# %% [markdown]
# ## Non-blocking: `isend` / `irecv`
#
# The `i` versions return at once with a *work* handle; the transfer runs in the background, and
# `wait()` blocks until it is finished. In between, a rank can compute: this is the seed of
# overlapping communication with computation, which the later DDP stages are built on.

# %%
# %%distributed
t = torch.full((3,), float(rank), device=device)
peer = rank ^ 1  # the other rank of the pair: 0 <-> 1, 2 <-> 3
send_work = dist.isend(t.clone(), dst=peer)  # both ranks send and receive at the same time
received = torch.empty(3, device=device)
recv_work = dist.irecv(received, src=peer)
busy = (torch.randn(64, 64) @ torch.randn(64, 64)).sum()  # work done while the message travels
send_work.wait()
recv_work.wait()
print(f"rank {rank} got {received.tolist()} from rank {peer}")

# %% [markdown]
# ## `broadcast`: one rank's tensor to everyone
#
# This is how every DDP wrapper makes the model replicas identical at the start: rank 0's parameters
# are broadcast to all ranks.

# %%
# %%distributed
t = torch.tensor([10.0, 20.0], device=device) if rank == 0 else torch.zeros(2, device=device)
dist.broadcast(t, src=0)
t

# %% [markdown]
# ## `scatter`: rank 0 deals out one chunk per rank
#
# Rank 0 holds a list with one tensor per rank; every rank receives its own. (A data loader that
# shards a global batch does the same job without communication: every rank draws the same global
# batch and keeps its share.)

# %%
# %%distributed
chunk = torch.zeros(2, device=device)
chunks = list(torch.arange(2.0 * world_size, device=device).chunk(world_size)) if rank == 0 else None
dist.scatter(chunk, scatter_list=chunks, src=0)
chunk

# %% [markdown]
# ## `reduce` and `gather`: everything to one rank
#
# `reduce` sums (or takes the max, ...) every rank's tensor *into rank 0's*; `gather` collects the
# tensors side by side on rank 0. The other ranks' buffers are not meaningful afterwards.

# %%
# %%distributed
t = torch.tensor([rank + 1.0], device=device)
dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
gathered = [torch.zeros(1, device=device) for _ in range(world_size)] if rank == 0 else None
dist.gather(torch.tensor([rank * 100.0], device=device), gather_list=gathered, dst=0)
print("reduce ->", t.item(), "| gather ->", gathered)

# %% [markdown]
# ## `all_reduce`: everybody gets the sum
#
# The collective at the heart of DDP: after backward, each rank has the gradient of *its* shard;
# `all_reduce` leaves the sum on every rank, and dividing by the world size gives the average
# gradient: the gradient of the whole global batch.

# %%
# %%distributed
grad = torch.tensor([1.0, 2.0], device=device) * (rank + 1)  # a different "gradient" per rank
dist.all_reduce(grad, op=dist.ReduceOp.SUM)
grad / world_size

# %% [markdown]
# ## `all_gather` and `reduce_scatter`: the two halves of a ring all_reduce
#
# `all_gather` gives every rank every rank's tensor. `reduce_scatter` is the opposite: each rank
# ends up with the *sum* of one chunk. The cell uses its one-tensor form, `reduce_scatter_single`
# (the whole vector in, this rank's chunk out) from `minddp.runtime.compat`, which calls torch's name for it
# (`dist.reduce_scatter_single` from torch 2.13, `dist.reduce_scatter_tensor` before): gloo has
# that form from torch 2.6 on, and the list form `dist.reduce_scatter` only in later releases.
#
# Running a `reduce_scatter` then an `all_gather` is an `all_reduce`: that is how the ring algorithm
# used by NCCL and gloo works, and `minddp.collectives.ring_all_reduce` writes it from plain
# `send`/`recv` so you can read it.

# %%
# %%distributed
everyone = [torch.zeros(2, device=device) for _ in range(world_size)]
dist.all_gather(everyone, torch.full((2,), float(rank), device=device))
print("all_gather ->", [e.tolist() for e in everyone])

from minddp.runtime.compat import reduce_scatter_single

full = torch.arange(2.0 * world_size, device=device) + 10 * rank  # each rank's full vector
mine = torch.zeros(2, device=device)
reduce_scatter_single(mine, full)  # this rank's chunk, summed
print("reduce_scatter ->", mine.tolist())

# %%
# %%distributed
from minddp.collectives import ring_all_reduce

x = torch.arange(5.0, device=device) * (rank + 1)
expected = x.clone()
dist.all_reduce(expected)
ring_all_reduce(x, dist.group.WORLD)  # reduce-scatter, then all-gather, neighbour to neighbour
print("ring:", x.tolist(), "| equal to dist.all_reduce:", torch.equal(x, expected))

# %% [markdown]
# ## Watching the ring
#
# `ring_all_reduce` cuts the tensor into as many chunks as there are ranks and passes them around
# the ring 0 → 1 → 2 → 3 → 0: every rank talks only to its right-hand neighbour. `watch`
# (`minddp.collectives.watch`) runs it on a 1 MiB tensor in which every rank has written its
# *mark*, 2<sup>rank</sup> (1, 2, 4, 8), and writes down every message the ring's own code sends: to
# whom, how many bytes, which chunk, and what every chunk held just before. A chunk's value then
# says whose shares it already holds (5 = 1 + 4: ranks 0 and 2; 15: all four). The *star*
# (`naive_all_reduce`: every rank sends its whole tensor to rank 0, which sends the sum back) is
# watched the same way.

# %%
# %%distributed
from minddp.collectives.watch import watch

ring = watch("ring", numel=4 * 65536)  # 65536 float32 per chunk: 1 MiB per rank, recorded on every rank
star = watch("naive", numel=4 * 65536)
assert all(r["ok"] for r in ring + star)  # both leave the sum of all four marks everywhere

# %% [markdown]
# The drawing is made from those records, one row per step. In the **reduce-scatter** (first three
# rows) every rank sends one chunk (outlined) to its neighbour, which adds it into its own copy: a
# chunk picks up one more rank's share at every hop, and after n − 1 = 3 steps each rank holds one
# chunk that is complete ("all"), a different one on each rank. In the **all-gather** (next three)
# the complete chunks go around once more, each one overwriting the neighbour's partial copy.

# %%
# %%rank 0
import matplotlib.pyplot as plt
from minddp.collectives.watch import draw_ring

draw_ring(ring)
plt.show()

# %% [markdown]
# **Bytes.** In the ring every rank sends 2 (n − 1) chunks of B / n bytes: 2 (n − 1) / n · B in all,
# whatever the number of ranks (less than 2 B). In the star, every rank sends and receives B once,
# but rank 0 receives n − 1 whole tensors and sends n − 1 back: its link carries n times a ring
# rank's bytes, and everybody waits for it. The cell counts both from the records and checks them
# against those formulas.
#
# **Time.** The α-β model prices one message at α (the fixed cost of a hop: latency, software)
# plus β per byte (the link's speed). Each rank's messages go one after the other, and the
# all_reduce is done when the busiest rank is. The cell prices what each rank really sent on
# three of `minddp.comm.link`'s links, and checks the ring against the link model's formula,
# 2 (n − 1) α + 2 (n − 1) / n · B / bandwidth.

# %%
# %%rank 0
from minddp.collectives.watch import draw_bytes, seconds
from minddp.comm.link import PRESETS

MiB, n, B = 2**20, world_size, ring[0]["numel"] * 4  # B: the bytes of one rank's tensor
assert all(r["sent"] == r["received"] == 2 * (n - 1) * B // n for r in ring)
assert star[0]["sent"] == star[0]["received"] == (n - 1) * B
assert all(r["sent"] == r["received"] == B for r in star[1:])
print(f"{'':8}{'ring: sent (MiB)':>18}{'star: sent (MiB)':>18}{'star: received (MiB)':>22}")
for r, s in zip(ring, star):
    print(f"rank {r['rank']:<3}{r['sent'] / MiB:>18.2f}{s['sent'] / MiB:>18.2f}{s['received'] / MiB:>22.2f}")
draw_bytes(ring, star)
plt.show()

print(f"\nα-β time of one all_reduce of {B / MiB:g} MiB on {n} ranks, priced from the messages above:")
print(f"{'link':12}{'α (µs)':>8}{'bandwidth (Gbit/s)':>20}{'ring (ms)':>11}{'star (ms)':>11}{'star / ring':>13}")
for name in ("1gbit", "10gbit", "pcie-t4"):
    link = PRESETS[name]
    t_ring, t_star = seconds(ring, link), seconds(star, link)
    assert abs(t_ring - link.seconds("all_reduce", B, n)) <= 1e-9 * t_ring  # the ring formula, to rounding
    assert t_star > t_ring  # the same number of messages, n times the bytes at rank 0
    print(
        f"{name:12}{link.latency * 1e6:>8.0f}{link.bandwidth * 8 / 1e9:>20g}{t_ring * 1e3:>11.2f}"
        f"{t_star * 1e3:>11.2f}{t_star / t_ring:>13.1f}"
    )

# %% [markdown]
# Both make 2 (n − 1) messages on the busiest rank, so both pay 2 (n − 1) α; the star's messages
# carry whole tensors, the ring's one chunk each. For large tensors the star nears n times slower, and
# gets worse with every rank added; the ring's bandwidth term stays under 2 B / bandwidth. For tiny
# tensors α dominates both: that is why DDP packs gradients into buckets (notebook 03).

# %% [markdown]
# ## `barrier`: wait for everyone
#
# No data moves; every rank waits until all have arrived. Here rank 1 is slow, and rank 0 waits for
# it at the barrier.

# %%
# %%distributed
import time

start = time.perf_counter()
if rank == 1:
    time.sleep(0.5)
dist.barrier()
print(f"rank {rank} left the barrier after {time.perf_counter() - start:.1f} s")

# %% [markdown]
# Next: `02_simple_ddp` uses `broadcast` and `all_reduce` to turn one training process into data
# parallelism.

# %%
# %dist_shutdown
