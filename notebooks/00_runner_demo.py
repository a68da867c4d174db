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
# # 00 · Running cells on real ranks
#
# Data parallelism is one program running in several processes (*ranks*) that exchange tensors through *collectives*: calls every rank makes together, such as `all_reduce` below, which sums a tensor across the ranks. `minddp.notebook` (*the runner*, in this notebook's process) starts those ranks and keeps them alive, so every cell below can run on every rank and each rank keeps its variables from cell to cell.
#
# The ranks that make collectives together form a *process group*; its *backend* is the library that
# carries the collectives' data between them. The runner picks the backend: gloo on the CPU,
# NCCL where every rank has a GPU of its own.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %% [markdown]
# `%%distributed` runs a cell on every rank; each rank's output appears under its label, and a final expression is shown like in any notebook.

# %%
# %%distributed
import os
import weakref

# this rank's process and process group, for later (a weak reference: it does not keep the group alive)
pid, world = os.getpid(), weakref.ref(dist.group.WORLD)
print(f"hello from rank {rank} of {world_size} (pid {pid}), computing on {device}")
dist.get_rank(), dist.get_world_size()

# %% [markdown]
# Variables persist on each rank. Here every rank makes a different tensor (on its `device`: a collective carries tensors that live where its backend works), then `all_reduce` sums them: afterwards every rank holds the same total.
#
# The ✓ line below is a checked sentence, printed by `lesson.claim(holds, sentence)` (`minddp.notebook.lesson`):
# every rank evaluates `holds`; the sentence is printed once, under rank 0's label, with a ✓, and the cell fails on
# any rank where `holds` is false. The sentence says what `holds` tests, no more, except that a value the cell puts
# in it (a number, a name) is the run's own, computed but not tested. Lines without a ✓ and the markdown are not
# checked.

# %%
# %%distributed
from minddp.notebook import lesson

t = torch.tensor([1.0, 2.0], device=device) * (rank + 1)
mine = t.clone()  # this rank's tensor before the collective
print("before:", t)
dist.all_reduce(t)
total = sum(torch.tensor([1.0, 2.0], device=device) * (r + 1) for r in range(world_size))
lesson.claim(torch.equal(t, total), f"every rank holds the sum of the {world_size} ranks' tensors")
t

# %% [markdown]
# `%%rank 0` runs a cell on rank 0 only, for example to draw a plot once: here rank 0's `t[0]` before and
# after the `all_reduce`.

# %%
# %%rank 0
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(4, 2.5))
ax.bar(["before", "after all_reduce"], [mine[0].item(), t[0].item()])
ax.set_ylabel("value of t[0]")
ax.set_title("t[0] on rank 0")
plt.show()

# %% [markdown]
# When one rank fails, the cell fails. Here rank 1 raises before the `all_reduce`; rank 0, in it,
# is released (the runner has rank 1 close its connections) and raises too. gloo's message guesses
# a remote worker crashed: none did, as a cell below checks.
#
# A traceback names the cell `<In [N], rank R>`: Jupyter's `In [N]`, as rank R ran it, its lines
# counted from the `%%distributed` line (line 1), so rank 1's `raise` is line 3.

# %% tags=["raises-exception"] minddp={"expected_error": "rank 1 gives up before the collective"}
# %%distributed
if rank == 1:
    raise ValueError("rank 1 gives up before the collective")
dist.all_reduce(t)

# %% [markdown]
# Here the ranks live on (in a real job they do not: a rank that raises ends its process), and the
# runner gives them a new process group: `t` is still there, and collectives work again.

# %%
# %%distributed
lesson.claim(
    os.getpid() == pid and world() is not dist.group.WORLD,
    "every rank keeps its pid from the start, in a new process group",
)
before = t.clone()
dist.all_reduce(t)
lesson.claim(
    torch.equal(before, total) and torch.equal(t, world_size * total),
    f"the all_reduce works again: `t` went from the sum above, {before.tolist()}, to {t.tolist()}, the "
    f"sum of the {world_size} ranks' copies",
)
t

# %% [markdown]
# `%dist_status` names the ranks' backend and counts *restarts*: the times the runner ended the
# ranks and started fresh ones (their variables lost). The failed cell caused none.

# %%
# %dist_status

# %% [markdown]
# Stop the ranks when you are done.

# %%
# %dist_shutdown
