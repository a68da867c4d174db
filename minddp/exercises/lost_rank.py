"""Notebook 07's exercise: split the global batch among the ranks of *now*, checked through a lost rank.

The fault-tolerant rung (:mod:`minddp.ft`) asks the task for this rank's share of a step's global
batch with ``shard(batch, rank, world)``, where ``world`` is the size of the quorum of the moment:
after a rank is lost, the survivors must split the whole batch among themselves, or its rows are
never trained. :func:`check_shard` checks a learner's ``shard``:

1. **first, here**: call it for every rank of the worlds the run will meet; an exception or a value
   that is not ``(x rows, y rows)`` of the batch is named at once, before any rank starts;
2. **on real ranks, through a fault**: one run of the ft rung (:func:`minddp.ft.launch_ft`, 3
   ranks, ``kill@2:1``: the world goes 3 → 2, then 3 again once the killed rank is back, healed) of
   a task with one small model per shard function (:class:`Lanes`): the ft rung's own split (lane 0)
   and the learner's, side by side, so one run checks them all;
3. **oracle**: a single process trained on every step's whole global batch, in this process. A
   split that trains every row exactly once, at every world, matches it up to float32 rounding;
4. **verdict**: the parameters against the oracle and against lane 0; where they differ, which rows
   of the global batch no rank trained (or two did), at which world, from the worlds the run's
   committed steps had.

Example (a lighthouse and 3 ranks: not run by the doctests)::

    >>> from minddp.exercises import check_shard, solutions
    >>> check_shard(solutions.ft_shard)                       # doctest: +SKIP
    ✓ shard: through a lost rank (worlds 3 → 2 → 3 over 6 committed steps...
"""

from __future__ import annotations

import io
import types

import torch
from torch import nn

from minddp.ft import ToyTask, launch_ft, parse_faults

#: Rows in a global batch: 10 splits unevenly at world 3 (3, 3, 4), so the remainder matters.
ROWS = 10
#: SGD's learning rate: an error in the gradient shows in the parameters at once (no Adam normalising it).
LR = 0.05
FAULT = "kill@2:1"  # rank 1 dies in step 2, after its forward: the survivors' all_reduce fails
WORLD = 3


class Lanes:
    """ToyTask's regression with one model per shard function, all trained in one run of the ft rung.

    Each lane's model sees only its own shard function's rows; the loss is the sum of the lanes'
    (their parameters are disjoint, so each lane's gradient is its own). ``functions`` are
    cloudpickled (a notebook's function lives in ``__main__``, which the ranks cannot import).
    """

    def __init__(self, functions: list[bytes], steps: int):
        self.functions_pickled, self.steps = functions, steps
        self.base = ToyTask(global_batch=ROWS)
        self._functions = None

    def __getstate__(self):
        return {**self.__dict__, "_functions": None}

    def functions(self) -> list:
        if self._functions is None:
            import cloudpickle

            self._functions = [cloudpickle.loads(f) for f in self.functions_pickled]
        return self._functions

    def build_model(self) -> nn.Module:
        return LaneModels([self.base.build_model() for _ in self.functions_pickled])  # the same init in each

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=LR)

    def global_batch(self, step: int):
        return self.base.global_batch(step)

    def shard(self, batch, rank: int, world: int) -> list:
        return [fn(batch, rank, world) for fn in self.functions()]

    def loss(self, model: nn.Module, shards: list, world: int) -> torch.Tensor:
        """Each lane: its rows' squared error × world / ROWS, whose mean over the ranks is the global mean."""
        outputs = model([x for x, _ in shards])
        return sum(((out - y) ** 2).sum() * (world / ROWS) for out, (_, y) in zip(outputs, shards))


class LaneModels(nn.Module):
    """One model per lane; the forward takes one input per lane (the rung wraps this in its ``ddp`` stage)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self.lanes = nn.ModuleList(models)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [lane(x) for lane, x in zip(self.lanes, inputs)]


def rung_shard(batch, rank: int, world: int):
    """Lane 0: the ft rung's own split (:meth:`minddp.ft.ToyTask.shard`), without its row count."""
    x, y, _ = ToyTask.shard(None, batch, rank, world)
    return x, y


def check_shard(shard, *, steps: int = 6, timeout_s: float = 180.0):
    """Check ``shard(batch, rank, world) -> (x, y)`` through a lost rank (module doc); one :class:`Verdict`."""
    return check_shards([shard], steps=steps, timeout_s=timeout_s)[0]


def check_shards(shards: list, *, steps: int = 6, timeout_s: float = 180.0) -> list:
    """:func:`check_shard` for several functions in one run of the ft rung (one lane each): their verdicts."""
    import cloudpickle

    from minddp.exercises.checker import Verdict
    from minddp.ft.launch import FaultTolerantRunError

    for fn in shards:
        if not callable(fn):
            raise TypeError(f"check_shard() takes a function shard(batch, rank, world), got {fn!r}")
    verdicts: list = [None] * len(shards)
    for i, fn in enumerate(shards):  # step 1
        problem = preflight(fn, ToyTask(global_batch=ROWS).global_batch(0))
        if problem:
            verdicts[i] = Verdict(False, f"✗ shard: {problem}")
    run_these = [i for i, v in enumerate(verdicts) if v is None]
    if not run_these:
        return verdicts
    task = Lanes([cloudpickle.dumps(f) for f in [rung_shard, *(shards[i] for i in run_these)]], steps)
    print(f"(training {len(run_these)} shard function(s) in one run of the ft rung on {WORLD} ranks through {FAULT})")
    try:  # step 2
        run = launch_ft(
            task,
            steps,
            world_size=WORLD,
            faults=parse_faults(FAULT),
            hang_s=5.0,
            full_world_at=(0, 2),  # the first step and the fault's meet the whole world
            rejoin_before_end=True,  # ... and the killed rank is back, healed, for the last step
            restart_after_steps=1,  # after at least one step committed without it
            run_timeout_s=timeout_s,
        )
    except FaultTolerantRunError as exc:
        line = str(exc).strip().splitlines()[0]
        for i in run_these:
            verdicts[i] = Verdict(False, f"✗ shard: the run could not go on ({line})")
        return verdicts
    committed = committed_worlds(run)
    by_slot = [lane_parameters(run.results[slot], len(run_these) + 1) for slot in sorted(run.results)]
    lanes = by_slot[0]
    oracle = single_process(task, steps)  # step 3
    for lane, i in enumerate(run_these, start=1):  # step 4
        agree = all(all(torch.equal(other[lane][k], v) for k, v in lanes[lane].items()) for other in by_slot[1:])
        verdicts[i] = verdict(shards[i], lanes[lane], lanes[0], oracle, committed, task, run, agree)
    return verdicts


def preflight(fn, batch) -> str | None:
    """Step 1: what is wrong with ``fn`` (it reads a process group's rank) or with its values for every rank of
    worlds 3, 2 and 1 (``None``: nothing)."""
    read = reads_group(fn)
    if read:
        return (
            f"your shard reads torch.distributed.{' and '.join(f'{name}()' for name in read)} (the process "
            "group's): split by the rank and world it is given, this rank's index among the members of this "
            "step's quorum and their number: the checker calls shard outside any group, and a group's rank is "
            "that index only where the group is rebuilt at each quorum (as minddp's rung does)"
        )
    x = batch[0]
    for world in range(WORLD, 0, -1):
        for rank in range(world):
            try:
                out = fn(batch, rank, world)
            except Exception as exc:  # noqa: BLE001 - the learner's code: any error is the verdict
                return f"your shard raised {type(exc).__name__} for rank {rank} of world {world}: {exc}"
            if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(torch.is_tensor(t) for t in out)):
                return (
                    f"shard(batch, {rank}, {world}) returned {type(out).__name__}, not (x, y): return this "
                    "rank's rows of the batch's inputs and of its targets"
                )
            if rows_of(out[0], x) is None or len(out[0]) != len(out[1]):
                return (
                    f"shard(batch, {rank}, {world}) returned x that is not rows of the batch's x (or x and y of "
                    "different lengths): return x[rows], y[rows] of the same rows"
                )
    return None


#: What a shard must not read: the process group's rank and size (it is given the quorum's).
GROUP_READS = ("get_rank", "get_world_size")


def reads_group(fn) -> list[str]:
    """Which of :data:`GROUP_READS` ``fn``'s code names, as ``dist.get_rank()`` or as an imported name, in itself or
    in a function defined inside it."""
    import torch.distributed as dist

    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    codes, names = [code], set()
    while codes:
        c = codes.pop()
        names.update(c.co_names)
        codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    bound = {**getattr(fn, "__globals__", {})}
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            bound[name] = cell.cell_contents
        except ValueError:  # a cell not assigned yet
            pass
    read = set()
    for name in names:
        value = bound.get(name)
        read.update(g for g in GROUP_READS if name == g or value is getattr(dist, g))
    return [g for g in GROUP_READS if g in read]


def rows_of(part: torch.Tensor, whole: torch.Tensor) -> list[int] | None:
    """Which rows of ``whole`` ``part`` holds, in its order (``None`` if one is not a row of ``whole``)."""
    if part.dim() != whole.dim() or part.shape[1:] != whole.shape[1:]:
        return None
    found = []
    for row in part:
        same = (whole == row).all(dim=1).nonzero().view(-1).tolist()
        if not same:
            return None
        found.append(same[0])
    return found


def committed_worlds(run) -> list[tuple[int, int]]:
    """``(step, world)`` of every committed step, in step order."""
    worlds = {e["step"]: len(e["members"]) for _, _, e in run.attempts if e["committed"]}
    return sorted(worlds.items())


def lane_parameters(result: dict, lanes: int) -> list[dict]:
    """Each lane's final parameters in one slot's result."""
    state = torch.load(io.BytesIO(result["state"]), weights_only=True)["model"]
    return [{k[len(f"lanes.{i}.") :]: v for k, v in state.items() if k.startswith(f"lanes.{i}.")} for i in range(lanes)]


def single_process(task: Lanes, steps: int) -> dict:
    """Step 3: the lane model trained in this process on every step's whole global batch (mean squared error)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks
    try:
        model = task.base.build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(steps):
            x, y = task.global_batch(step)
            (((model(x) - y) ** 2).sum() / ROWS).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach() for k, v in model.state_dict().items()}


def largest_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def tolerance(oracle: dict) -> float:
    """How far a right split may land from the single process: float32 rounding, not a wrong gradient.

    A rank sums its rows' gradients (times world / ROWS) and the all_reduce adds the ranks' parts
    divided by the world, where the single process sums all ROWS rows at once: each gradient element
    is off by at most (ROWS + WORLD) · u = 13 · 2**-24 ≈ 8e-7 of the magnitude of its terms, and SGD
    moves each parameter by LR = 0.05 times that per step; over the 6 steps some 3e-7 of the gradients'
    size (a few units here). 1e-4 of (1 + the largest parameter) is over a hundred times that. A row
    left out (or trained twice) changes a step's gradient by a tenth of it or more, so the parameters
    by LR × 0.1 × the gradient, some 1e-2: a hundred times the tolerance.
    """
    return 1e-4 * (1 + max(float(v.abs().max()) for v in oracle.values()))


def verdict(fn, mine: dict, rung: dict, oracle: dict, committed, task: Lanes, run, agree: bool):
    """Step 4 for one lane (``agree``: every rank ended with the same parameters in it, bit for bit)."""
    from minddp.exercises.checker import Verdict

    d_single, d_rung = largest_difference(mine, oracle), largest_difference(mine, rung)
    if d_single <= tolerance(oracle):
        worlds = [w for _, w in committed]
        path = " → ".join(str(w) for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1])
        discarded = len({(e["tag"], e["step"]) for _, _, e in run.attempts if not e["committed"]})
        return Verdict(
            True,
            f"✓ shard: through a lost rank (worlds {path} over {len(committed)} committed steps, {discarded} "
            f"attempt(s) discarded) every committed step trained each of the {ROWS} rows of its global batch once: "
            f"the parameters match a single process on the whole batch (largest difference {d_single:.1e}) and "
            f"the ft rung's own split ({d_rung:.1e})",
        )
    return Verdict(False, "✗ shard: " + coverage_problem(fn, committed, task, d_single, agree))


def coverage_problem(fn, committed, task: Lanes, difference: float, agree: bool) -> str:
    """Which rows no rank trained (or several did), at the first world where the split was wrong."""
    left = f"the parameters left a single process on the whole batch (by {difference:.2g})"
    if agree:  # what the ranks' own checks (identical states) cannot see
        left += f", though the {WORLD} ranks agree bit for bit"
    for step, world in committed:
        x = task.global_batch(step)[0]
        count, sizes = [0] * ROWS, []
        for rank in range(world):
            rows = rows_of(fn(task.global_batch(step), rank, world)[0], x) or []
            sizes.append(len(rows))
            for row in rows:
                count[row] += 1
        missing = [r for r, c in enumerate(count) if c == 0]
        twice = [r for r, c in enumerate(count) if c > 1]
        floor = ROWS // world
        if missing and not twice and sizes == [floor] * world and len(missing) == ROWS - floor * world:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): each "
                f"rank took {ROWS} // {world} = {floor} rows, so the remainder of the floor division, "
                f"{rows_named(missing)}, went to no rank, and {left}: spread the remainder over the ranks (e.g. "
                "rank r takes rows r·B // world up to (r+1)·B // world)"
            )
        if missing:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}), so "
                f"{left}: split the whole global batch among the {world} ranks of now, by rank and world"
            )
        if twice:
            return (
                f"at world {world}, {rows_text(twice)} trained by more than one rank (counted more than once), "
                f"so {left}: give each row to exactly one rank"
            )
    return (
        f"every row was trained once at every world, yet {left}: return the batch's rows as they are (x[rows], y[rows])"
    )


def rows_text(rows: list[int]) -> str:
    """``[6, 7, 8, 9]`` -> ``rows 6-9 were``; ``[2, 5]`` -> ``rows 2, 5 were``; ``[9]`` -> ``row 9 was``."""
    return rows_named(rows) + (" was" if len(rows) == 1 else " were")


def rows_named(rows: list[int]) -> str:
    """``[6, 7, 8, 9]`` -> ``rows 6-9``; ``[2, 5]`` -> ``rows 2, 5``; ``[9]`` -> ``row 9``."""
    runs, start = [], rows[0]
    for a, b in zip(rows, rows[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return f"row {rows[0]}" if len(rows) == 1 else f"rows {', '.join(runs)}"
