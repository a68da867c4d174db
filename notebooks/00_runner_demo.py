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
# Data parallelism is one program running in several processes (*ranks*) that talk through collectives. `minddp.notebook` starts those ranks once and keeps them alive, so every cell below can run on every rank and each rank keeps its variables from cell to cell.
#
# On a laptop the ranks use the CPU and gloo; on a machine with a GPU per rank the same cells use NCCL.

# %%
# %load_ext minddp.notebook
# %dist_init --world-size 2

# %% [markdown]
# Each rank starts with `torch`, `dist`, `rank`, `world_size` and `device` defined. `%%distributed` runs a cell on every rank; each rank's output appears under its label, and a final expression is shown like in any notebook.

# %%
# %%distributed
import os

pid = os.getpid()  # this rank's process, for later
print(f"hello from rank {rank} of {world_size} (pid {pid}), computing on {device}")
dist.get_rank(), dist.get_world_size()

# %% [markdown]
# Variables persist on each rank. Here every rank makes a different tensor (on its `device`: a collective carries tensors that live where its backend works), then `all_reduce` sums them: afterwards every rank holds the same total.
#
# A sentence about a run is only as good as its check. The notebooks state theirs in two ways (`minddp.notebook.lesson`):
#
# * `lesson.claim(holds, sentence)` asserts it: it prints the sentence once, with a ✓, when it holds, and fails the cell on any rank where it does not. A ✓ sentence is what the runner guarantees: a re-run (the test suite re-runs every notebook) whose numbers no longer bear it out stops there instead of saving it. The notebooks claim only what holds on any machine under any load: orders, counts, values the code guarantees.
# * `lesson.say(...)` prints a sentence the cell composes from the run's own values (a time measured here, which of two runs was faster): its numbers and comparisons are computed, so they are true of the run shown, and a re-run prints its own. Nothing asserts them: a direction that could come out either way on another machine or under load is said this way, never claimed.
#
# Nothing else is checked: the prose of the markdown cells and the printed tables are not verdicts.

# %%
# %%distributed
from minddp.notebook import lesson

t = torch.tensor([1.0, 2.0], device=device) * (rank + 1)
print("before:", t)
dist.all_reduce(t)
total = sum(torch.tensor([1.0, 2.0], device=device) * (r + 1) for r in range(world_size))
lesson.claim(torch.equal(t, total), f"every rank holds the sum of the {world_size} ranks' tensors")
t

# %% [markdown]
# `%%rank 0` runs a cell on rank 0 only, for example to draw a plot once. Figures are sent back as images.

# %%
# %%rank 0
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(4, 2.5))
ax.bar(["before", "after all_reduce"], [1.0, t[0].item()])
ax.set_title("t[0] on rank 0")
plt.show()

# %% [markdown]
# When one rank fails, the cell fails with that rank's traceback. Here rank 1 raises before the `all_reduce`, so rank 0 would wait forever for its partner; the runner gives it a one-second grace, then releases it (it closes the failed rank's end of the process group, which ends rank 0's wait), and rebuilds the process group, keeping every rank's variables. Each rank notes how long it spent in the cell. (The cell is tagged `raises-exception`: Jupyter's *Run All* goes on past it, and the test that runs this notebook checks that it fails with this error.)

# %% tags=["raises-exception"] minddp={"expected_error": "rank 1 gives up before the collective"}
# %%distributed
import time

start = time.perf_counter()
try:
    if rank == 1:
        raise ValueError("rank 1 gives up before the collective")
    dist.all_reduce(t)
finally:
    in_cell = time.perf_counter() - start  # rank 0: waiting in the all_reduce until the runner released it

# %% [markdown]
# The ranks are still the same processes, `t` is still there, and collectives work again:

# %%
# %%distributed
lesson.say(f"rank 0 spent {in_cell:.1f} s in the failed cell, waiting for rank 1, before the runner released it.")
# The runner's grace is 1 s and the release ends a gloo wait at once; 10 s leaves room for a loaded machine.
lesson.claim(in_cell < 10, "the runner released the waiting rank within seconds")
lesson.claim(os.getpid() == pid, "every rank is still the process it was at the start (the same pid)")
before = t.clone()
dist.all_reduce(t)
lesson.claim(
    torch.equal(t, world_size * before), f"the all_reduce works again: `t` ({before.tolist()}) is summed over the ranks"
)
t

# %%
# %dist_status

# %% [markdown]
# Stop the ranks when you are done (the runner also stops them when the kernel shuts down).

# %%
# %dist_shutdown
