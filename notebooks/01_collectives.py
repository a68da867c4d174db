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
# the next notebook builds exactly that. At the end, a ring all_reduce (one of the algorithms gloo and
# NCCL run) is drawn step by step from the messages four ranks really sent, priced with the cost
# model and the notation every later notebook uses.

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
# watched the same way, and the ring once more on a 4 KiB tensor, for the cost model below.

# %%
# %%distributed
from minddp.collectives.watch import watch

ring = watch("ring", numel=4 * 65536)  # 65536 float32 per chunk: 1 MiB per rank, recorded on every rank
star = watch("naive", numel=4 * 65536)
tiny = watch("ring", numel=4 * 256)  # 4 KiB per rank: the size of a small gradient, for the cost model below
assert all(r["ok"] for r in ring + star + tiny)  # each leaves the sum of every rank's mark everywhere

# %% [markdown]
# The drawing is made from those records, one row per step. In the **reduce-scatter** (first three
# rows) every rank sends one chunk (outlined) to its neighbour, which adds it into its own copy: a
# chunk picks up one more rank's share at every hop, and after n − 1 = 3 steps each rank holds one
# chunk that is complete ("all"), a different one on each rank. In the **all-gather** (next three)
# the complete chunks go around once more, each one overwriting the neighbour's partial copy. The
# cell checks each of these sentences against the records.

# %%
# %%rank 0
import matplotlib.pyplot as plt
from minddp.collectives.watch import draw_ring, ranks_in
from minddp.notebook import lesson

n, full = world_size, 2**world_size - 1  # n ranks; a chunk marked 2**n - 1 holds every rank's share
draw_ring(ring)
plt.show()
lesson.claim(
    all(
        len(ranks_in(r["steps"][s]["before"][r["steps"][s]["chunks"][0]])) == s + 1 for r in ring for s in range(n - 1)
    ),
    "in the reduce-scatter, the chunk a rank sends at step s holds s shares: one more at every hop",
)
complete = [[c for c, mark in enumerate(r["steps"][n - 1]["before"]) if mark == full] for r in ring]
lesson.claim(
    all(len(c) == 1 for c in complete) and len({c[0] for c in complete}) == n,
    f"after the n − 1 = {n - 1} reduce-scatter steps each rank holds exactly one complete chunk, a different "
    f"one on each rank ({', '.join(f'rank {r}: chunk {c[0]}' for r, c in enumerate(complete))})",
)
lesson.claim(
    all(r["after"] == [full] * n for r in ring),
    f"after the {n - 1} all-gather steps every rank holds all {n} chunks complete",
)

# %% [markdown]
# **Notation**, the one every notebook and doc of minddp uses from here on:
#
# | symbol | meaning | unit |
# | --- | --- | --- |
# | n | the number of ranks | |
# | m | the size of a message or of the tensor being reduced | bytes |
# | α | the fixed cost of one message, whatever its size: latency, software | seconds |
# | β | the time per byte on a link, 1 / B | seconds per byte |
# | B | a link's bandwidth, when one is named (`1gbit`: 1 Gbit/s = 125 MB/s) | bytes per second |
# | overlap | the share of communication time during which compute runs (notebook 05 measures it) | % |
#
# **Bytes.** m here is the bytes of one rank's tensor. In the ring every rank sends 2 (n − 1) chunks of
# m / n bytes, 2 (n − 1) / n · m in all, and receives as much: less than 2 m, whatever the number of
# ranks. In the star, ranks 1 to n − 1 send their tensor once and receive the sum once (m each way),
# but rank 0 receives n − 1 whole tensors and sends n − 1 sums back: (n − 1) · m each way, n / 2
# times a ring rank's bytes, and everybody waits for it. The cell counts both from the records and
# checks them against these formulas.
#
# **Time.** The α-β model prices one message of m bytes at α + β · m. In one exchange a rank sends a
# message and receives another at the same time (each direction of a link has its own wire), so the
# larger of the two counts. A rank's exchanges go one after the other, and the all_reduce is done when
# the busiest rank is. A ring rank makes 2 (n − 1) exchanges of m / n bytes each way:
# 2 (n − 1) α + 2 (n − 1) / n · m β. The star's rank 0 makes as many exchanges, each of a whole tensor
# and in one direction only (it must receive every tensor before it can send the sum back):
# 2 (n − 1) α + 2 (n − 1) · m β. The same α term; the star's β term is n times the ring's. The cell
# prices what each rank really sent on three of `minddp.comm.link`'s links and checks both formulas.

# %%
# %%rank 0
from minddp.collectives.watch import draw_bytes, seconds
from minddp.comm.link import PRESETS

MiB, m = 2**20, ring[0]["numel"] * 4  # m: the bytes of one rank's float32 tensor
lesson.claim(
    all(r["sent"] == r["received"] == 2 * (n - 1) * m // n for r in ring),
    f"ring: every rank sent and received 2 (n − 1) / n · m = {2 * (n - 1) * m / n / MiB:g} MiB (m = {m / MiB:g} MiB)",
)
lesson.claim(
    star[0]["sent"] == star[0]["received"] == (n - 1) * m and all(r["sent"] == r["received"] == m for r in star[1:]),
    f"star: rank 0 sent and received (n − 1) · m = {(n - 1) * m / MiB:g} MiB each way, every other rank "
    f"m = {m / MiB:g} MiB",
)
lesson.claim(
    star[0]["sent"] / ring[0]["sent"] == n / 2,
    f"so the star's rank 0 moved n / 2 = {n / 2:g} times a ring rank's bytes each way",
)
print(f"\n{'':8}{'ring: sent (MiB)':>18}{'star: sent (MiB)':>18}{'star: received (MiB)':>22}")
for r, s in zip(ring, star):
    print(f"rank {r['rank']:<3}{r['sent'] / MiB:>18.2f}{s['sent'] / MiB:>18.2f}{s['received'] / MiB:>22.2f}")
draw_bytes(ring, star)
plt.show()

exchanges = 2 * (n - 1)
lesson.claim(
    all(len(r["steps"]) == exchanges for r in ring) and len(star[0]["steps"]) == exchanges,
    f"every ring rank and the star's rank 0 made 2 (n − 1) = {exchanges} exchanges",
)
print(f"\nα-β time of one all_reduce of m = {m / MiB:g} MiB on n = {n} ranks, priced from the messages above,")
print(f"and of a ring all_reduce of {tiny[0]['numel'] * 4 // 1024} KiB (the α term's share of it):")
print(
    f"{'link':10}{'α (µs)':>8}{'B (Gbit/s)':>12}{'m β / α':>9}{'ring (ms)':>11}{'star (ms)':>11}"
    f"{'star / ring':>13}{'4 KiB: α share':>16}"
)
rows = {}
for name in ("1gbit", "10gbit", "pcie-t4"):
    link = PRESETS[name]
    alpha, beta = link.latency, 1 / link.bandwidth
    t_ring, t_star, t_tiny = seconds(ring, link), seconds(star, link), seconds(tiny, link)
    rows[name] = dict(
        ring=(t_ring, exchanges * alpha + exchanges / n * m * beta),  # (priced from the records, formula)
        star=(t_star, exchanges * alpha + exchanges * m * beta),
        link=(t_ring, link.seconds("all_reduce", m, n)),  # the link model's own ring formula
        ratio=t_star / t_ring,
        alpha_share=exchanges * alpha / t_tiny,
    )
    print(
        f"{name:10}{alpha * 1e6:>8.0f}{link.bandwidth * 8 / 1e9:>12g}{m * beta / alpha:>9.0f}{t_ring * 1e3:>11.2f}"
        f"{t_star * 1e3:>11.2f}{t_star / t_ring:>13.1f}{rows[name]['alpha_share']:>15.0%}"
    )
# The records' prices and the formulas add the same terms in another order: equal to float rounding.
lesson.claim(
    all(abs(a - b) <= 1e-9 * b for row in rows.values() for a, b in (row["ring"], row["star"], row["link"])),
    "on every link the prices of the recorded messages equal the formulas above (and the link model's ring formula)",
)
lesson.claim(
    all(1 < row["ratio"] < n for row in rows.values()),
    f"on every link the star is slower than the ring, and less than n = {n} times slower",
)
lesson.claim(
    all(row["alpha_share"] > 0.5 for row in rows.values()),
    "for the 4 KiB tensor the α term is more than half of the ring's time on every link",
)

# %% [markdown]
# The star's ratio to the ring is (α + m β) / (α + m β / n): never n, nearing n as m β outgrows α
# (the column m β / α), and every added rank makes it larger, where the ring's β term stays under
# 2 m β. For small tensors it is the other way round: α, paid 2 (n − 1) times in a row, makes most
# of the time, whatever the link. That is why DDP packs many gradients into one message, a *bucket*
# (notebook 03 measures when that wins).

# %% [markdown]
# ## `barrier`: wait for everyone
#
# No data moves; every rank waits until all have arrived. Here rank 1 is slow, and rank 0 waits for
# it at the barrier.

# %%
# %%distributed
import time

from minddp.notebook import lesson

start = time.perf_counter()
if rank == 1:
    time.sleep(0.5)
arrived = time.time()  # the wall clock: one clock for all the ranks of this machine
dist.barrier()
left = time.time()
print(f"rank {rank} left the barrier after {time.perf_counter() - start:.1f} s")
everyone = [None] * world_size
dist.all_gather_object(everyone, (arrived, left))
lesson.claim(
    all(left >= everyone[1][0] for _, left in everyone), "no rank left the barrier before rank 1 had arrived at it"
)

# %% [markdown]
# Next: `02_simple_ddp` uses `broadcast` and `all_reduce` to turn one training process into data
# parallelism.

# %%
# %dist_shutdown
