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
# # 07 · Fault tolerance: training through a lost process
#
# In every stage so far a process that dies ends the run. At scale failures come during the run (*The Llama
# 3 Herd of Models*, arXiv:2407.21783, section 3.3.4, counts 419 unexpected interruptions in a 54-day
# snapshot of its pre-training). The `ft` **rung** (a rung above notebook 03's ladder, in `minddp/ft/`, after
# torchft, PyTorch's fault-tolerance library) keeps training instead: it runs the ladder's `ddp` stage inside
# the phases below. Each try at a step (an **attempt**) is **committed** (it counts) or **discarded** (its
# step is tried again); it goes through these phases (2 and 3 only when needed):
#
# 1. a **quorum**: before each attempt, a coordinator (the *lighthouse*, a process of its own) waits until
#    every **live** **slot** (both defined below) has asked, then answers who trains it, the
#    attempt's **members**, and which step: the largest any member asked to train (`quorum.max_step`);
# 2. a new **group** (the processes a collective runs among, as in notebooks 01-04) at the run's first
#    quorum, and whenever the members changed or the last attempt was discarded (a group that saw a
#    failure may be broken);
# 3. a process that comes back is **healed**: it receives the trained state from a peer, over the group,
#    no file (the parameters, the optimizer's state, the count of steps committed);
# 4. **the work** (`work` below): the members split the step's global batch among themselves (the exercise
#    below);
# 5. **should_commit**: the members vote yes or no; the attempt is committed if every member voted yes, else
#    (a no, or a member lost before voting) discarded. Only a commit steps the optimizer (`on_commit` below
#    is `optimizer.step`); every attempt ends by dropping its gradients (`after_attempt` below is
#    `drop_gradients`).
#
# The words this notebook uses:
#
# * a **slot** is one of the places the launcher (`launch_ft`, below) runs a training process in (0, 1, 2
#   here); a process started again after a fault takes the same slot; faults name slots (`kill@4:1`: slot
#   1, in step 4);
# * a process's **rank** is its index among the attempt's members (its rank in the group built for them),
#   and the **world** is their number: after slot 1 is lost, slots 0 and 2 are ranks 0 and 1 of world 2.

# %%
from minddp.notebook import lesson_07

lesson_07.print_phase_lines()

# %% [markdown]
# ## A run with two faults
#
# The cell below starts a lighthouse and a training process in each of three slots and trains 14 steps of
# a toy task (`ToyTask`: an MLP regression, AdamW, and a 10 ms pause per attempt standing in for compute) on
# gloo, torch's CPU backend. The settings:
#
# * `world_size=slots`: the number of slots (3), not the world (torch's `world_size`);
# * `faults`: `kill@4:1`, slot 1 kills itself with SIGKILL (a signal no process can catch or outlive) in step 4
#   after its forward, before its all_reduce;
#   `raise@11:2`, slot 2's comm hook (the function that averages the gradients with an all_reduce, as in
#   notebook 04) raises in step 11, before its all_reduce (slot 2's process stays);
# * `hang_s=30.0`, the **hang bound**: the group's collective timeout, and the lighthouse's bound below.
#   A process's **heartbeat** is a count that a thread of it keeps rewriting on the lighthouse's
#   **store** (torch's `TCPStore`, a key-value store over TCP). A slot is **silent** while its heartbeat, requests and votes stay unchanged, and **live** from
#   its first heartbeat until it has been silent for the hang bound (the lighthouse then **evicts** it: the
#   launcher ends its process; never the last process holding the trained state), its process has finished
#   its last step, or the launcher has recorded its exit;
# * `full_world_at=(9,)`: step 9's first quorum waits for all three slots, so steps are left when slot 1's new
#   process asks;
# * `restart_after_steps=1`: the launcher starts a killed slot again only after a step was committed
#   without it, or when every slot is down;
# * `digests=True`: each member records a sha256 of its parameters and optimizer state just before each
#   attempt's work (its *before* digest) and after each discarded attempt, unless its process dies in it.
#
# `run.report()` gives one line per fault: its **recovery**, from the fault (the moment the faulting process
# stamped just before it killed itself, froze itself or raised) to the first commit of its step or a later one, the
# attempts discarded until then, and, for a kill or a stop (a frozen process, ended by the launcher once evicted),
# its **rejoin**, from the fault to the quorum that takes the slot's new process back.

# %%
from minddp.ft import ToyTask, launch_ft, parse_faults
from minddp.notebook import lesson

slots = 3  # launch_ft's world_size: the slots, not the world
hang_s = 30.0  # the hang bound, in seconds
full_world_at = (9,)
run = launch_ft(
    ToyTask(compute_s=0.01),
    14,
    world_size=slots,
    faults=parse_faults("kill@4:1,raise@11:2"),
    hang_s=hang_s,
    full_world_at=full_world_at,
    restart_after_steps=1,
    digests=True,
)
for line in run.report():
    print(line)

# %% [markdown]
# How the other members learn of each fault: their all_reduce fails (printed after the timeline); after a
# kill, when the kernel, ending the killed process, closes its connections. Each member that caught an error
# (the raising slot, its own exception) drops its group (a garbage collection, then its teardown, timed together),
# then votes no as soon as the drop ends. The lighthouse discards on the first no it reads
# (where it had read every vote cast by then, this run cannot show that); a member lost before voting makes
# a discard only once another's yes is in. The next quorum waits for the later of the
# survivors' requests, made after they vote, and the launcher's record of a killed slot's exit. Then the step
# is tried again: a new group, the work (the pause included), the votes.

# %%
from minddp.ft import fault_outcomes

kill, raised = fault_outcomes(run)
lesson_07.print_recoveries(run, kill, raised, hang_s)


# %% [markdown]
# The kill's rejoin in parts. A `✓` line from `lesson.claim` is a **claim**: it holds on the run shown, or
# the cell fails (the exercise checker's `✓` or `✗` is a verdict: it raises on neither).

# %%
lesson.claim(
    kill.recovery_s <= kill.restart_s,
    f"slot {kill.fault.slot}'s new process started after step {kill.fault.step} was committed without it",
)
lesson_07.print_rejoin(run, kill, full_world_at)

# %% [markdown]
# The run's timeline: one column per attempt, in order (not a time axis), one row per slot.

# %%
print(run.timeline())

# %% [markdown]
# The cell below checks what the timeline shows, fault by fault, and prints each member's error. In step 11
# no process died, yet slots 0 and 1's all_reduce failed: gloo's error names no peer, so the run cannot tell
# whether each learned from slot 2's drop or from another member's.

# %%
from minddp.notebook.lesson_07 import attempts, heals, in_a_new_group

for slot, error in run.errors(4):  # in the order caught; of a gloo error, minddp's label, then gloo's sentence
    print(f"slot {slot}, step 4: {error}")
failed, retried = attempts(run, 4, committed=False), attempts(run, 4, committed=True)
lesson.claim(
    {slot for slot, _ in failed} == {0, 2} and not any(e["ok"] for _, e in failed),
    "step 4: both survivors voted no, and the attempt was discarded on both",
)
lesson.claim(
    [e["members"] for _, e in retried] == [[0, 2], [0, 2]] and in_a_new_group(run, 4),
    "step 4 was then committed by slots 0 and 2 alone, in a new group",
)
peers = {n for s, n in kill.rejoin_steps.items() if s != 1}
lesson.claim(
    kill.rejoin_steps[1] == 0 and peers == {kill.healed_at} and heals(run) == [(1, kill.healed_at, True)],
    f"slot 1's new process asked for step 0, its peers for step {kill.healed_at}: it alone was healed, once, there"
    " (`H`)",
)
lesson.claim(
    all(len(e["members"]) == 3 for _, _, e in run.entries if e["step"] >= kill.healed_at),
    f"from step {kill.healed_at} on, every attempt had all three slots",
)
for slot, error in run.errors(11):
    print(f"slot {slot}, step 11: {error}")
lesson.claim(
    {s for s, _ in attempts(run, 11, committed=False)} == {0, 1, 2}
    and len(attempts(run, 11, committed=True)) == 3
    and in_a_new_group(run, 11),
    "step 11: discarded on all three slots, then committed by all three in a new group",
)

# %% [markdown]
# Three more checks, by `consistency`, on the parameters and the optimizer's state. They compare the processes
# with each other or with themselves, not with a single process: none can show that every row was trained
# (the last cell's checker run does).

# %%
from minddp.ft import consistency

checks = consistency(run)
lesson.claim(checks.identical, f"the {checks.slots} slots ended equal")
lesson.claim(
    checks.one_start,
    f"in each of the {checks.attempts} attempts, the *before* digests its members recorded were equal",
)
lesson.claim(
    checks.discards_kept,
    f"the {checks.discarded} discarded attempts changed nothing: each surviving member's digest after it"
    f" equals its *before* digest ({checks.discarded_entries} pairs, one per surviving member and attempt)",
)

# %% [markdown]
# ## Your turn: split the batch among the ranks of now
#
# Before each forward, the rung asks the task for this process's share of the step's global batch with
# `shard(batch, rank, world)`. After a process is lost the survivors must train its rows too. Write that
# split: given the step's batch `(x, y)` (one row of `x` per example, its target in `y`), return this
# rank's rows, `(x[rows], y[rows])`, so that each of the batch's B rows goes to exactly one of the `world`
# ranks and no rank takes more than ceil(B / world), whatever `world` and B are. Split by the `rank` and
# `world` you are given: the checker refuses a split whose code reads `dist.get_rank()`,
# `dist.get_world_size()` or the environment (the launcher's `RANK` is the slot).
#
# `check_shard` first calls your function twice, in this process, for each rank of worlds 3, 2 and 1 on a
# 10-row batch, and names the first mistake: an exception, a return other than `(x[rows], y[rows])`, two calls
# that disagree, or, where each row went to one rank, a rank with more than ceil(B / world) rows. Then it trains
# a model of its own with it, by SGD, on the `ft` rung (3 slots through `kill@2:1`: the world goes 3 → 2 → 3)
# and compares the parameters with a single process trained the same way on each step's whole batch; where
# they differ by more than the **tolerance**, 1e-4 times (1 + the single process's largest absolute parameter
# value), it names the rows no rank trained, or two did, and at which world. Where they match, it checks both
# rules on batches of 1 to 12 rows at worlds 3, 2 and 1.

# %%
from minddp.exercises import check_shard


def my_shard(batch, rank, world):
    x, y = batch
    # Your turn: this rank's rows (x[rows], y[rows]) when `world` ranks train the step.
    raise NotImplementedError("this rank's rows")


check_shard(my_shard)

# %% [markdown]
# Stuck? The cell below shows a model answer; the notebook's last code
# cell checks it.

# %% jupyter={"outputs_hidden": true}
from minddp.exercises import solutions
from minddp.notebook.source import show_source

show_source(solutions.ft_shard)

# %% [markdown]
# ## More to try
#
# 1. Freeze a process instead of killing it: `stop@4:1`, with `hang_s=2.0` (a run of its own: 6 steps, no pause,
#    no restart). Predict the recovery (hint: nothing tells the others that a stopped process is gone; what
#    bounds their wait?), and what halving `hang_s` does to it.
# 2. What happens with `kill@4:0,kill@4:1,kill@4:2`, and why can this design not heal that?
# 3. Suppose a split used 3, the run's first world, in place of `world`, whatever the world now: of a
#    global batch of `B` rows, rank `r` takes rows `r·B // 3` up to, not including, `(r+1)·B // 3`. Which
#    rows of the checker's 10-row batch would a step at world 2 skip, and which of `consistency`'s
#    three checks would still pass?
#
# Model answers (click to open); the three cells after them run questions 1, 2 and 3.
#
# <details><summary>1. A frozen process</summary>
#
# Unlike a killed process, a frozen one (`SIGSTOP`) keeps its sockets open and says nothing: its peers'
# all_reduce fails at the group's timeout, and the next quorum waits until the lighthouse evicts it as silent.
# The run sets both timers to `hang_s`, so it cannot tell which one bounds the recovery: predict `hang_s` plus
# the rest of a recovery (the discard, the quorum, the step tried again); halving `hang_s` shortens it by about
# the half removed.
#
# </details>
#
# <details><summary>2. Three kills</summary>
#
# Killing all three in the same step leaves no **holder** (a process holding the trained state: a member
# of the newest committed step). With every slot down, the launcher starts all three again; fresh,
# they ask for step 0, the lighthouse reports the state lost, and the launcher stops the run rather than
# train the committed steps again.
#
# </details>
#
# <details><summary>3. A split fixed at world 3</summary>
#
# At world 2 the ranks are 0 and 1, whichever slot died, so they take the rows ranks 0 and 1 take at world
# 3, and rank 2's rows at world 3, `2B // 3` up to `B`, are trained by no one: rows 6-9 of the
# checker's 10. `consistency`'s three checks would all still pass (they never look at the data): every member
# steps from the same state with the same averaged gradient.
#
# </details>

# %%
stops, evicted = {}, {}  # question 1: the hang bound -> the recovery from a frozen process, and its eviction
for bound in (2.0, 1.0):
    stopped = launch_ft(
        ToyTask(), 6, world_size=slots, faults=parse_faults("stop@4:1"), hang_s=bound, restart=False, run_timeout_s=300
    )
    o = stops[bound] = fault_outcomes(stopped)[0]
    evicted[bound] = lesson_07.evicted_s(stopped, o)  # s from the freeze to each eviction of its slot
    print(f"hang_s = {bound:g} s: recovery {lesson_07.ms(o.recovery_s)} ms")
    for slot, error in stopped.errors(4)[:1]:  # the first error caught
        print(f"  slot {slot}, step 4: {error}")
# the lighthouse forms no quorum until it evicts the frozen slot
lesson.claim(
    all(o.quorum_s is not None and any(t <= o.quorum_s for t in evicted[b]) for b, o in stops.items()),
    "in each run the lighthouse evicted the frozen slot before the next quorum",
)
rest = {b: lesson_07.ms(o.recovery_s) - lesson_07.ms(b) for b, o in stops.items()}  # ms past each bound
cut = lesson_07.ms(stops[2.0].recovery_s) - lesson_07.ms(stops[1.0].recovery_s)  # ms
lesson.say(
    "Each recovery was its hang bound "
    + " and ".join(f"{'plus' if r >= 0 else 'minus'} {abs(r)} ms (at {b:g} s)" for b, r in rest.items())
    + ": halving the bound "
    + (f"cut it by {cut} ms" if cut > 0 else f"lengthened it by {-cut} ms" if cut else "left it the same to the ms")
)

# %%
from minddp.ft.launch import FaultTolerantRunError

try:  # question 2: every slot killed in the same step
    launch_ft(
        ToyTask(),
        6,
        world_size=slots,
        faults=parse_faults("kill@4:0,kill@4:1,kill@4:2"),
        hang_s=hang_s,
        restart_after_steps=1,
        run_timeout_s=300,
    )
    events = []
except FaultTolerantRunError as exc:
    events = exc.events  # the run's events up to the loss
lost = [e for e in events if e[0] == "lost"]
assert lost, "the run went on"
_, newest, _, _, asked = lost[0]
again = sorted(e[1] for e in events if e[0] == "restarted")
lesson.claim(
    again == [0, 1, 2] and asked == 0,
    f"the launcher started slots 0, 1 and 2 again; asked for step {asked}, the lighthouse reported the {newest} committed"
    " steps' state lost: the run stopped",
)


# %%
from minddp.exercises import check_shards


def fixed_at_world_3(batch, rank, world):
    """Question 3's split: rows r·B // 3 up to (r+1)·B // 3 of the rank r it is given, 3 where `world` belongs."""
    x, y = batch
    lo, hi = rank * len(x) // 3, (rank + 1) * len(x) // 3
    return x[lo:hi], y[lo:hi]


answer, fixed = check_shards([solutions.ft_shard, fixed_at_world_3])  # one run, a model of its own each
print("the exercise's model answer:", answer)
assert answer.ok, "the checker refused the model answer"
print("question 3's split:", fixed)
lesson.claim(
    not fixed.ok and "at world 2, rows 6-9 were trained by no rank" in fixed.line,
    "question 3's split: at world 2, rows 6-9 of the 10-row batch were trained by no rank",
)
lesson.claim(
    "though the processes' own checks all pass" in fixed.line,
    "and `consistency`'s three checks passed on the checker's run",
)

# %% [markdown]
# `docs/fault-tolerance.md` has a benchmark over many faults, torchft's recovery beside minddp's, and a
# projection against checkpoint-restart.
