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
# Point-to-point `send` and `recv` come first, then the collectives, where every rank of the group takes part
# in the same call. Two of them carry the whole of data parallelism: `broadcast` (every rank starts
# from the same weights) and `all_reduce` (every rank applies the same averaged gradient); the next
# notebook builds exactly that. Then minddp's own ring all_reduce, written from point-to-point `isend`/`irecv`,
# is drawn from the *hops* (point-to-point sends) four ranks sent, and priced with a model of a
# link's cost per hop and per byte, in
# the notation every later notebook uses. Last come `barrier`, and the words every later notebook
# uses for communication meeting computation (*waited*, *exposed*, *overlap* and the rest), each with
# its definition and the function that computes it.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 4

# %% [markdown]
# ## Point-to-point: `send` / `recv`
#
# One rank sends a tensor, another receives it into a buffer of the same shape: each `send` has its
# `recv` on the other rank. Here the ranks work in pairs: 0 sends to 1, 2 sends to 3.

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
# `wait()` blocks until it is finished. In between, the rank is free to compute: the cell multiplies
# two small matrices there. Nothing here is timed, so whether the 12 bytes were still on their way
# while the ranks multiplied is not shown. Later notebooks build DDP versions that compute while
# gradients travel; the end of this notebook defines the measures of it.

# %%
# %%distributed
t = torch.full((3,), float(rank), device=device)
peer = rank ^ 1  # the other rank of the pair: 0 <-> 1, 2 <-> 3
send_work = dist.isend(t.clone(), dst=peer)  # both ranks send and receive at the same time
received = torch.empty(3, device=device)
recv_work = dist.irecv(received, src=peer)
busy = (torch.randn(64, 64) @ torch.randn(64, 64)).sum()  # free to compute before wait() (not timed)
send_work.wait()
recv_work.wait()
print(f"rank {rank} got {received.tolist()} from rank {peer}")

# %% [markdown]
# ## `broadcast`: one rank's tensor to everyone
#
# This is how the DDP wrappers of `02_simple_ddp` make the model replicas identical at the start: rank 0's
# parameters and buffers are broadcast to all ranks.

# %%
# %%distributed
t = torch.tensor([10.0, 20.0], device=device) if rank == 0 else torch.zeros(2, device=device)
dist.broadcast(t, src=0)
t

# %% [markdown]
# ## `scatter`: rank 0 deals out one chunk per rank
#
# Rank 0 holds a list with one tensor per rank; every rank receives its own.

# %%
# %%distributed
chunk = torch.zeros(2, device=device)
chunks = list(torch.arange(2.0 * world_size, device=device).chunk(world_size)) if rank == 0 else None
dist.scatter(chunk, scatter_list=chunks, src=0)
chunk

# %% [markdown]
# ## `reduce` and `gather`: everything to one rank
#
# `reduce` sums (or takes the max, ...) every rank's tensor into the tensor of one rank, its `dst`;
# `gather` collects the tensors side by side on `dst`. The cell passes `dst=0`, rank 0, and rank r's
# tensor to reduce is r + 1, its tensor to gather 100 r. Only `dst`'s buffer is defined afterwards:
# rank 0 prints the sum, 1 + 2 + 3 + 4 = 10. What the other ranks print after `reduce ->` is whatever
# the backend's algorithm left in their buffers, not a result to use; only `dst` passes a list to
# gather into (the others print None).

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
# The collective at the heart of DDP: after backward, each rank has the gradient of *its own*
# examples; `all_reduce` leaves the sum on every rank, and dividing by the world size gives the
# average gradient. When the loss is a mean over examples and every rank holds as many examples, that
# average is the gradient one process would compute on all of them: `02_simple_ddp` checks it against
# one process.

# %%
# %%distributed
grad = torch.tensor([1.0, 2.0], device=device) * (rank + 1)  # a different "gradient" per rank
dist.all_reduce(grad, op=dist.ReduceOp.SUM)
grad / world_size

# %% [markdown]
# ## `all_gather` and `reduce_scatter`: the two halves of a ring all_reduce
#
# `all_gather` gives every rank every rank's tensor. `reduce_scatter` leaves each rank
# the *sum* of one chunk. The cell uses its one-tensor form, `reduce_scatter_single`:
# the whole vector in, this rank's chunk (summed over the ranks) out. Each rank's vector is 0, 1, ..., 7
# plus 10 times its rank, and rank r keeps chunk r, elements 2 r and 2 r + 1: element i sums to
# 4 i + 10 · (0 + 1 + 2 + 3) = 4 i + 60 over the four ranks, so rank 0 ends with [60, 64] and rank 3
# with [84, 88].
#
# Running a `reduce_scatter` then an `all_gather` is an `all_reduce`. The *ring* algorithm does exactly
# that, neighbour to neighbour; `minddp.collectives.ring_all_reduce` writes it from point-to-point sends so
# you can read it. Each time a rank passes a chunk on, it posts its send and its receive together, in one
# `dist.batch_isend_irecv` call, and waits for both (`minddp.collectives.p2p.exchange`): had every rank first made a blocking `send` that the
# transport could not buffer, every rank would wait for a receive nobody had posted. (Which algorithm gloo's own `all_reduce` ran in this notebook no output shows: the
# ring's cell, the one after the next, checks only that the ring's result equals `dist.all_reduce`'s.)

# %%
# %%distributed
everyone = [torch.zeros(2, device=device) for _ in range(world_size)]
dist.all_gather(everyone, torch.full((2,), float(rank), device=device))
print("all_gather ->", [e.tolist() for e in everyone])

from minddp.runtime.compat import reduce_scatter_single  # torch's own name for it depends on the release

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
# `ring_all_reduce` cuts the tensor into as many chunks as there are ranks (`tensor_split`: equal when the number of
# ranks divides the tensor's length, as in `watch`'s tensors below; the ring cell's 5 values went into chunks of 2, 1, 1 and 1) and passes them around
# the ring 0 → 1 → 2 → 3 → 0: every rank sends only to its right-hand neighbour, and so receives only
# from its left-hand one. `watch`
# (`minddp.collectives.watch`) runs it on a 1 MiB tensor in which every rank has written its
# *mark*, 2<sup>rank</sup> (1, 2, 4, 8), and writes down every hop `ring_all_reduce` sends (minddp's Python, not gloo's own all_reduce): to
# whom, how many bytes, which chunk, and what every chunk held just before. A chunk's value then
# says whose marks it already holds: 9 = 1 + 8 holds ranks 0's and 3's, drawn "0+3" in the figure;
# 15 holds all four, drawn "all". The *star*
# (`naive_all_reduce`: every other rank sends its whole tensor to rank 0, which sends the sum back) is
# watched the same way, and both once more on a 4 KiB tensor, to price both sizes below.

# %%
# %%distributed
from minddp.collectives.watch import watch

ring = watch("ring", numel=4 * 65536)  # 65536 float32 per chunk: 1 MiB per rank, recorded on every rank
star = watch("naive", numel=4 * 65536)
tiny = watch("ring", numel=4 * 256)  # 4 KiB per rank, priced below
tiny_star = watch("naive", numel=4 * 256)
assert all(r["ok"] for r in ring + star + tiny + tiny_star)  # each leaves the sum of every rank's mark everywhere

# %% [markdown]
# The drawing is made from those records, one row per *exchange*: a rank sends a hop, receives
# one, or both at the same time (in the ring always both: one to its right-hand
# neighbour, one from its left-hand one). A row shows every rank's chunks as they were *just before* that
# exchange, so a sum sent in one exchange first shows in the next row (the last row, *end*, shows them after the
# last exchange); the chunk a rank sends is
# outlined in red, and the red text beneath says where it goes. The darker a chunk's green, the more
# ranks' marks it holds (the darkest: all of them). In the **reduce-scatter** (first three rows) every
# rank sends one chunk to its neighbour, which adds it into its own copy: the chunk sent holds one more
# rank's mark at every exchange, and after n − 1 = 3 exchanges (n, the number of ranks, is 4) each rank holds one
# chunk that is complete ("all"), a different one on each rank. In the **all-gather** (next three) the
# complete chunks go around once more, each one overwriting the neighbour's partial copy.

# %%
# %%rank 0
import matplotlib.pyplot as plt
from minddp.collectives.watch import draw_ring, ring_facts
from minddp.notebook import lesson

draw_ring(ring)
plt.show()
for holds, sentence in ring_facts(ring):  # what the text above says of the drawing, checked on the records
    lesson.claim(holds, sentence)

# %% [markdown]
# **Notation**, the one every notebook and doc of minddp uses from here on:
#
# | symbol | meaning | unit |
# | --- | --- | --- |
# | n | the number of ranks | |
# | m | the bytes of the tensor one collective reduces, on one rank (a ring cuts it into n chunks, of m / n bytes when n divides it) | bytes |
# | α | the fixed cost of one *hop*, one point-to-point send, whatever its size: latency, software | seconds |
# | β | the time per byte on a link, 1 / B | seconds per byte |
# | B | a link's bandwidth, when one is named (`1gbit`: 1 Gbit/s = 125 MB/s); the tables print it in Gbit/s | bytes per second |
#
# Each letter of this table keeps this one meaning in every notebook; a hop's size, when it is not m, is written
# out (m / n). The measures of time, *waited*, *exposed*, *overlap* and the rest, are defined at the end
# of this notebook, before any notebook uses them.
#
# **Bytes.** m here is the bytes of one rank's tensor. In the ring every rank sends 2 (n − 1) hops, each
# one chunk of m / n bytes, 2 (n − 1) / n · m in all, and receives as much: less than 2 m, whatever the number of
# ranks. In the star, ranks 1 to n − 1 send their tensor once and receive the sum once (m each way),
# but rank 0 receives n − 1 whole tensors and sends n − 1 sums back: (n − 1) · m each way, n / 2
# times a ring rank's bytes. The cell counts both from the records, checks them against these
# formulas, and draws them: a bar for the bytes each rank sent (green: the ring; grey: the star), a
# black tick for those it received.
#
# **Time.** The α-β model prices one hop of x bytes at α + β · x. It gives every rank one link
# with one wire each way, and a wire carries one hop at a time: in an exchange that sends a
# hop and receives another at the same time the larger of the two counts, but a rank's
# exchanges go one after the other, even when its hops come from different ranks. The all_reduce
# is done when the busiest rank is. A ring rank makes 2 (n − 1) exchanges of m / n bytes each way:
# 2 (n − 1) α + 2 (n − 1) / n · m β. The star's rank 0 makes as many exchanges, each one-way: it
# receives n − 1 whole tensors, one after another on its one incoming wire, then sends n − 1 sums (it
# must receive every tensor before it can send the sum back): 2 (n − 1) α + 2 (n − 1) · m β. The same α term; the star's β term is n times the ring's. The cell
# prices what each rank really sent on three of `minddp.comm.link`'s modeled links, with the α and B the
# table prints: `1gbit` and `10gbit` (Ethernet between machines) and `pcie-t4` (GPUs in one machine over
# PCIe), and checks both formulas. Nothing in the table is measured: it compares the model's prices.

# %%
# %%rank 0
from minddp.collectives.watch import draw_bytes, seconds
from minddp.comm.link import PRESETS

n, exchanges = world_size, 2 * (world_size - 1)  # a ring rank's exchanges: n - 1, then n - 1 more
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
draw_bytes(ring, star)
plt.show()

one_way = [("in" if s["received"] else "") + ("out" if s["sent"] else "") for s in star[0]["exchanges"]]
lesson.claim(
    all(len(r["exchanges"]) == exchanges and all(s["sent"] and s["received"] for s in r["exchanges"]) for r in ring)
    and one_way == ["in"] * (n - 1) + ["out"] * (n - 1),
    f"every ring rank made 2 (n − 1) = {exchanges} exchanges, each sending one hop and receiving one; the star's "
    f"rank 0 received {n - 1} hops, then sent {n - 1}: {exchanges} one-way exchanges",
)
kib = tiny[0]["numel"] * 4 // 1024
print(f"\nThe α-β model's prices of the hops above (n = {n} ranks): the star's time over the ring's for")
print(
    f"m = {m / MiB:g} MiB, and for a {kib} KiB tensor the α term's share of the ring's time and the star over the ring:"
)
print(
    f"{'link':10}{'α (µs)':>8}{'B (Gbit/s)':>12}{'m β / α':>9}{'star / ring':>13}"
    f"{f'{kib} KiB: α share':>18}{f'{kib} KiB: star / ring':>23}"
)
rows = {}
for name in ("1gbit", "10gbit", "pcie-t4"):
    link = PRESETS[name]
    alpha, beta = link.latency, 1 / link.bandwidth
    t_ring, t_star, t_tiny = seconds(ring, link), seconds(star, link), seconds(tiny, link)
    t_tiny_star = seconds(tiny_star, link)
    rows[name] = dict(
        ring=(t_ring, exchanges * alpha + exchanges / n * m * beta),  # (priced from the records, formula)
        star=(t_star, exchanges * alpha + exchanges * m * beta),
        link=(t_ring, link.seconds("all_reduce", m, n)),  # the link model's own ring formula
        ratio=t_star / t_ring,
        alpha_share=exchanges * alpha / t_tiny,
        tiny_ratio=t_tiny_star / t_tiny,
    )
    print(
        f"{name:10}{alpha * 1e6:>8.0f}{link.bandwidth * 8 / 1e9:>12g}{m * beta / alpha:>9.0f}"
        f"{t_star / t_ring:>13.1f}{rows[name]['alpha_share']:>18.0%}{rows[name]['tiny_ratio']:>23.2f}"
    )
# The records' prices and the formulas add the same terms in another order: equal to float rounding.
lesson.claim(
    all(abs(a - b) <= 1e-9 * b for row in rows.values() for a, b in (row["ring"], row["star"], row["link"])),
    "on every link the prices of the recorded hops equal the formulas above (and the link model's ring formula)",
)
lesson.claim(
    all(1 < row["ratio"] < n for row in rows.values()),
    f"on every link the star is slower than the ring, and less than n = {n} times slower",
)
lesson.claim(
    all(row["alpha_share"] > 0.5 for row in rows.values()),
    f"for the {kib} KiB tensor the α term is more than half of the ring's time on every link",
)
# (α + x β) / (α + x β / n) grows with the bytes x: a smaller tensor brings the star nearer the ring, never below it.
lesson.claim(
    all(1 < row["tiny_ratio"] < row["ratio"] for row in rows.values()),
    f"for the {kib} KiB tensor the star is nearer the ring than for the {m / MiB:g} MiB one on every link, "
    "and still slower",
)

# %% [markdown]
# The star's ratio to the ring is (α + m β) / (α + m β / n): never n, nearing n as m β outgrows α (the
# column m β / α). For a small tensor the β terms shrink and the α term, 2 (n − 1) α for both, makes
# most of the ring's time (the α share column): the star comes nearer the ring (the last column), and in
# the model a small all_reduce costs mostly its 2 (n − 1) α, which every all_reduce pays again, not its bytes. That is
# why DDP packs many gradients into one tensor, a *bucket*, and all_reduces it once (notebook 03 measures when that
# wins).

# %% [markdown]
# ## `barrier`: wait for everyone
#
# No data moves; every rank waits until all have arrived. Here rank 1 sleeps 0.5 s before it
# arrives, and every other rank waits for it at the barrier. Every rank notes when it arrived and left
# on the wall clock, one clock for every rank of this machine; rank 0 says how long before rank 1 the first rank
# arrived, and when the last one left, counted from rank 1's arrival. That lead need not equal rank 1's 0.5 s of
# sleep: the cell records neither when each rank began the cell nor how long rank 1's sleep lasted.

# %%
# %%distributed
import time

from minddp.notebook import lesson

if rank == 1:
    time.sleep(0.5)
arrived = time.time()  # the wall clock: one clock for all the ranks of this machine
dist.barrier()
left = time.time()
everyone = [None] * world_size
dist.all_gather_object(everyone, (arrived, left))
if rank == 0:
    rank1_arrived = everyone[1][0]
    first = min(arrived for arrived, _ in everyone)  # when the first rank arrived
    lesson.say(
        f"The first rank arrived at the barrier {rank1_arrived - first:.2f} s before rank 1; every rank left within "
        f"{max(left for _, left in everyone) - rank1_arrived:.3f} s after rank 1 arrived."
    )
    lesson.claim(
        all(left >= rank1_arrived for _, left in everyone), "no rank left the barrier before rank 1 had arrived at it"
    )

# %% [markdown]
# ## The measures: one word, one definition
#
# The later notebooks build DDP in *stages* (`03_build_up`), each one way of sending the gradients:
# a stage hands what it sends (one gradient, or a *bucket* of several) to a *comm hook*, the function that
# sends it (`02_simple_ddp` shows one; `noop_hook` sends nothing). They ask one question of every stage: while its gradients travel,
# what does the training step do? Six words answer it (in flight, non-compute, overlap, interleaved, waited,
# exposed), and two more say what the sending costs (link time, comm cost). Each of the eight has one
# definition, computed by the function its row names in `minddp.analysis.metrics`, which every notebook, the trace
# report and the benchmark call; the table is `docs/analysis.md`'s, word for word (a test checks it).
#
# A *message* is one collective call, one all_reduce say, not one of the hops it is made of
# (2 (n − 1) from each rank around a ring, so a message's fixed cost is 2 (n − 1) α, a hop's α).
# A run may send over an *emulated link* (`minddp.comm.link`): its *transfer* of a message starts when this
# rank hands the message over (or, if the link still carries an earlier one, when that one is done), whatever
# the other rank is doing, and lasts the α-β
# time of the collective; the message is *delivered* at the later of the transfer's end and the real
# collective's end. The definitions (the table below) read these sets of time intervals of one
# training step:
#
# * W, the *window*: from the step's start to its end;
# * C, *compute*: the training thread working, in the forward, the backward or the optimizer;
# * M, *communication in flight*: a collective started and not yet done. In a *profiler trace* (the record
#   of a run's events that torch's profiler writes; `05_reading_traces` reads them) that is the
#   backend's *range* of it, the record one of gloo's threads keeps from the moment it picks the
#   collective up until the collective is done: waiting for the other rank to join is inside it, and so,
#   on a machine with no more cores than ranks, is waiting for a core to run on (`docs/analysis.md`, "What a
#   `gloo:*` range includes"). On an emulated link M also holds the link's transfers;
# * the step's *backward*: the phase from its start to its end, the waits inside it included;
# * T, the training thread's *waits*: from its first `wait()` on a message to the message's delivery;
# * L, on an emulated link, the link's *transfers*.
#
# |X| is the time X covers. These capital letters name sets of times, not sizes: M is not the m of bytes
# above. The other two words need other inputs: *link time* only the messages' sizes, *comm cost* two runs
# (the same stage with and without sending), so the made-up steps below cannot show comm cost.
#
# | name | definition | function | unit |
# | --- | --- | --- | --- |
# | in flight | the time communication was in flight, `\|M ∩ W\|`; on a CPU it includes the time gloo's range stays open until the other rank joins and gloo's thread gets a core to run on | `metrics.in_flight(comm, window)` | ms per step |
# | non-compute | communication in flight while the training thread computes nothing, `\|(M ∖ C) ∩ W\|`: HolisticTraceAnalysis's (HTA's) non-compute time; over `\|W\|`, its non-compute share | `metrics.non_compute(window, compute, comm)` | ms per step (its share: % of the step) |
# | overlap | the share of the time in flight during which compute runs too, `100 · \|M ∩ C ∩ W\| / \|M ∩ W\|` (0 without communication): HTA's `comp_comm_overlap_pctg`; over several steps, ranks or rounds, one ratio of the sums (`metrics.pooled_overlap_pct`) | `metrics.overlap_pct(comm, compute, window)` | % of the time in flight |
# | interleaved | the non-compute time inside backward, `\|(M ∖ C) ∩ backward\|`: backward stopping for a message, then going on (a hook that sends and waits). Waiting after backward is non-compute but not interleaved; computing while a message travels is neither | `metrics.interleaved(comm, compute, backward)` | ms per step |
# | waited | the time the training thread stood still for communication, `\|T ∩ W\|`: for the link, for the other rank, for a core to run on. Known only where the waits are recorded (over an emulated link); elsewhere NaN, not 0 | `metrics.waited(waits, window)` | ms per step |
# | exposed | the link's transfers the training thread stood waiting through, `\|L ∩ T ∩ W\|`: the time the thread waited while the link carried a message, any message (a wait for the other rank or a core after the link was done is waited, not exposed). It is not the time a *free link*, one whose transfers take no time, would save: a wait during a transfer may last as long for the other rank's late join, and a faster link also shortens the other rank's transfers. Known over an emulated link; a trace without a link cannot give it | `metrics.exposed(link, waits, window)` | ms per step |
# | link time | the modeled transfer time of the step's messages on the link, from their sizes alone, added up: the same on every machine | `metrics.link_time(link, messages)` | ms per step (the function: seconds) |
# | comm cost | the step time sending adds, from two runs: a stage's median step minus the same stage's with `noop_hook`, which sends nothing (`python -m minddp.bench`, column `comm_cost_ms`). It holds the exposed time and what exposed leaves out (waits for the other rank and for a core, the collectives' own work, the hooks' Python), and two medians' noise | `metrics.comm_cost(step, free_step)` | ms per step |
#
# The cell below builds two made-up steps on n = 2 ranks (not the four above), each sending two
# all_reduces of 1 MiB over the 1 Gbit/s link (with n = 2 one costs 2 α + m β of link time). In the
# first, the backward stops at each message it sends and waits for it (`03_build_up`'s `hook` stage),
# and the other rank is there at once, so each wait lasts the link's transfer. In the second, the
# backward sends and goes on, and the step waits once, after backward (`03_build_up`'s `hook-async`
# stage); the other rank is made up to join the second message late, at 80 ms, so gloo's range of it
# stays open past this rank's transfer on the link until 80 ms, and the wait after backward, from 70 ms, lasts
# until then.

# %%
import matplotlib.pyplot as plt

from minddp.analysis import metrics
from minddp.comm.link import PRESETS
from minddp.notebook import lesson

LINK, n, MIB = PRESETS["1gbit"], 2, 2**20
t_ar = 1e3 * LINK.seconds("all_reduce", MIB, n)  # ms: one 1 MiB all_reduce between 2 ranks on the link
# Both steps: forward 0-20 ms; the backward computes 50 ms (its phase also holds the first step's waits) and sends
# a message after 20 and after 40 ms of its compute; optimizer 10 ms.
sent = [(40, 40 + t_ar), (60 + t_ar, 60 + 2 * t_ar)]  # the first step's messages: each waited for where it is sent
steps = {  # every interval in ms from the step's start
    "waits inside backward": dict(
        window=[(0, 80 + 2 * t_ar)],
        # forward and backward to the first wait; backward between the waits; backward's end and optimizer
        compute=[(0, 40), (40 + t_ar, 60 + t_ar), (60 + 2 * t_ar, 80 + 2 * t_ar)],
        backward=[(20, 70 + 2 * t_ar)],
        comm=sent,
        link=sent,  # the other rank joins at once: each wait lasts the link's transfer
        waits=sent,
    ),
    "waits once, after backward": dict(
        window=[(0, 90)],
        compute=[(0, 70), (80, 90)],
        backward=[(20, 70)],
        comm=[(40, 40 + t_ar), (60, 80)],  # made up: the other rank joins the second message late, at 80 ms
        link=[(40, 40 + t_ar), (60, 60 + t_ar)],
        waits=[(70, 80)],
    ),
}

fig, axes = plt.subplots(2, 1, figsize=(8, 4), sharex=True)
rows = [("compute", "tab:blue"), ("comm", "tab:orange"), ("link", "tab:brown"), ("waits", "crimson")]
late = {"waits once, after backward": "; the other rank joins its second message at 80 ms"}
for i, (ax, (name, x)) in enumerate(zip(axes, steps.items()), 1):
    for y, (key, colour) in enumerate(rows):
        ax.broken_barh([(s, e - s) for s, e in x[key]], (y - 0.35, 0.7), color=colour)
    ax.axvspan(*x["backward"][0], color="0.9", zorder=0)
    ax.set_yticks(range(len(rows)), ["compute C", "in flight M", "link L", "waits T"], fontsize=8)
    ax.set_title(f"made-up step {i}: {name}{late.get(name, '')}", fontsize=9)
axes[-1].set_xlabel("ms from the step's start")
fig.suptitle(
    f"Two made-up steps, not measured: {n} ranks, two 1 MiB all_reduces each on the {LINK.name} link (grey: the "
    "backward)",
    fontsize=10,
)
fig.tight_layout()
plt.show()

# %% [markdown]
# Both steps' length and their compute's, read from the intervals drawn above; link time, computed by its
# function from the messages' sizes; and every other measure but comm cost, computed by its function from the
# intervals:

# %%
import pandas as pd

table = {}
for name, x in steps.items():
    table[name] = {
        "step (ms)": x["window"][0][1],
        "compute (ms)": sum(end - start for start, end in x["compute"]),
        "link time (ms)": 1e3 * metrics.link_time(LINK, [("all_reduce", MIB, n)] * 2),
        "in flight (ms)": metrics.in_flight(x["comm"], x["window"]),
        "overlap (%)": metrics.overlap_pct(x["comm"], x["compute"], x["window"]),
        "non-compute (ms)": metrics.non_compute(x["window"], x["compute"], x["comm"]),
        "interleaved (ms)": metrics.interleaved(x["comm"], x["compute"], x["backward"]),
        "waited (ms)": metrics.waited(x["waits"], x["window"]),
        "exposed (ms)": metrics.exposed(x["link"], x["waits"], x["window"]),
    }
display(pd.DataFrame(table).round(1).rename_axis("measure"))
a, b = table.values()
second = steps["waits once, after backward"]
lesson.say(
    f"Both steps compute for {a['compute (ms)']:.1f} ms and send two all_reduces of 1 MiB, {t_ar:.1f} ms each on the "
    f"link: {a['link time (ms)']:.1f} ms of link time. The first waits where it sends, {a['waited (ms)']:.1f} ms, all "
    f"inside its backward (interleaved {a['interleaved (ms)']:.1f} ms) and all for the link (exposed "
    f"{a['exposed (ms)']:.1f} ms): its step is {a['compute (ms)']:.1f} + {a['waited (ms)']:.1f} = "
    f"{a['step (ms)']:.1f} ms. Each wait lasts until its message is delivered, at the later of the link transfer's end "
    "and gloo's own all_reduce's (how long gloo's takes inside the transfer this made-up step does not say), so only "
    "on a free link and with gloo's all_reduce taking no time would the first step wait for nothing and last only its "
    f"{a['compute (ms)']:.1f} ms of compute. The second waits once, after backward, {b['waited (ms)']:.1f} ms, from "
    f"{second['waits'][0][0]:g} ms, for the other rank: the link had carried both messages by "
    f"{second['link'][-1][1]:.1f} ms (exposed {b['exposed (ms)']:.1f} ms); its step is {b['compute (ms)']:.1f} + "
    f"{b['waited (ms)']:.1f} = {b['step (ms)']:.1f} ms. In flight, the second counts {b['in flight (ms)']:.1f} ms "
    f"against the first's {a['in flight (ms)']:.1f}: its second message's range stays open until the other rank "
    f"joins, at 80 ms; compute runs during {b['overlap (%)']:.1f} % of those {b['in flight (ms)']:.1f} ms (overlap), "
    f"during none of the first's {a['in flight (ms)']:.1f}."
)
# Interval lengths and a sum of the same floats: equal up to rounding.
lesson.claim(
    abs(a["exposed (ms)"] - a["link time (ms)"]) < 1e-9
    and abs(a["interleaved (ms)"] - a["waited (ms)"]) < 1e-9
    and all(abs(t["step (ms)"] - t["compute (ms)"] - t["waited (ms)"]) < 1e-9 for t in (a, b)),
    "in the first made-up step exposed equals the link time (the thread waits through all of it) and interleaved "
    "equals waited; in both steps the step lasts its compute plus its waited time",
)
lesson.claim(
    b["exposed (ms)"] == 0 < b["waited (ms)"] and b["interleaved (ms)"] == 0 < b["overlap (%)"] < 100,
    "in the second made-up step exposed is 0 and waited is not (the thread's waits fall outside the link's "
    "transfers), interleaved is 0, and overlap is more than 0 and less than 100 %",
)

# %% [markdown]
# Where two measures disagree for one stage they answer different questions. *Exposed* counts the time the
# thread waited while the emulated link carried a message, any message, not only the one waited for (a transfer
# starts when this rank hands the message over, whatever the other rank is doing). *Waited*
# counts every wait of the training thread: for the link and, as in the second made-up step, for the other
# rank. *In flight*, *overlap* and *non-compute* read M, the backend's ranges and the link's transfers, and a range stays open until the backend's work is
# done, the other rank's late join included. Non-compute equals waited in both made-up steps only because
# they were built so (whenever the thread does not compute, it waits for a message in flight); they are
# different sets, and in a trace they need not agree.

# %% [markdown]
# Next: `02_simple_ddp` uses `broadcast` and `all_reduce` to turn one training process into data
# parallelism.

# %%
# %dist_shutdown
