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
# two real processes (*ranks*): gloo on a CPU, NCCL when every rank has a GPU. Every cell marked
# `%%distributed` runs on every rank, and each rank's output appears under its label
# (`00_runner_demo` shows how the runner works).
#
# Point-to-point messages come first, then the collectives, where every rank of the group takes
# part in the same call. Two of them carry the whole of data parallelism: `broadcast` (every rank
# starts from the same weights) and `all_reduce` (every rank applies the same averaged gradient);
# the next notebook builds exactly that.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %% [markdown]
# ## Point-to-point: `send` / `recv`
#
# One rank sends a tensor, another receives it into a buffer of the same shape. Both calls block until
# the transfer is done, so the two ranks must agree on who sends and who receives (otherwise both wait
# forever).

# %%
# %%distributed
t = torch.zeros(3, device=device)
if rank == 0:
    t += torch.tensor([1.0, 2.0, 3.0], device=device)
    dist.send(t, dst=1)
else:
    dist.recv(t, src=0)
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
peer = 1 - rank
send_work = dist.isend(t.clone(), dst=peer)     # both ranks send and receive at the same time
received = torch.empty(3, device=device)
recv_work = dist.irecv(received, src=peer)
busy = (torch.randn(64, 64) @ torch.randn(64, 64)).sum()   # work done while the message travels
send_work.wait(); recv_work.wait()
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
grad = torch.tensor([1.0, 2.0], device=device) * (rank + 1)   # a different "gradient" per rank
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
full = torch.arange(2.0 * world_size, device=device) + 10 * rank     # each rank's full vector
mine = torch.zeros(2, device=device)
reduce_scatter_single(mine, full)                                    # this rank's chunk, summed
print("reduce_scatter ->", mine.tolist())

# %%
# %%distributed
from minddp.collectives import ring_all_reduce
x = torch.arange(5.0, device=device) * (rank + 1)
expected = x.clone(); dist.all_reduce(expected)
ring_all_reduce(x, dist.group.WORLD)        # reduce-scatter, then all-gather, neighbour to neighbour
print("ring:", x.tolist(), "| equal to dist.all_reduce:", torch.equal(x, expected))

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
