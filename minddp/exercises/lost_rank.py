"""Notebook 07's exercise: split the global batch among the ranks of *now*, checked through a lost process.

The fault-tolerant rung (:mod:`minddp.ft`) asks the task for this rank's share of a step's global
batch with ``shard(batch, rank, world)``, where ``world`` is the size of the quorum of the moment:
after a process is lost, the survivors must split the whole batch among themselves, or its rows are
never trained. :func:`check_shard` checks a learner's ``shard``:

1. **first, here**: a function that reads the process group's rank (``dist.get_rank()``) or the
   environment (``os.environ``, where ``RANK`` is the process's slot), itself, in a function of its own
   module that it calls, or through a global of its module set from one (``SLOT = int(os.environ["RANK"])``),
   is refused; then it is called
   twice for every rank of the worlds the run will meet: an exception, a value that is not
   ``(x rows, y rows)`` of the batch (y's rows the same as x's, in the batch's dtype and device), two calls
   that disagree, or a split
   whose busiest rank takes more rows than it need (:func:`busiest_problem`), is named at once, before any
   process starts;
2. **on real processes, through a fault**: one run of the ft rung (:func:`minddp.ft.launch_ft`, 3
   slots, ``kill@2:1``: the world goes 3 → 2, then 3 again once the killed slot's process is back, healed) of
   a task with one small model per shard function (:class:`Lanes`), so one run checks them all;
3. **oracle**: a single process trained on every step's whole global batch, in this process. A
   split that trains every row exactly once, at every world, matches it up to float32 rounding;
4. **verdict**: the parameters against the oracle; where they differ, which rows of the global
   batch no rank trained (or two did), at which world, from the worlds the run's committed steps
   had, and whether the processes' own checks (identical states, one start per attempt, discards that
   change nothing) saw anything; where they match, whether every row goes to exactly one rank where the
   run does not go (world 1; every other batch of 1 to 12 rows, at every world: ``x.chunk(world)[rank]``
   fails at 4 rows and world 3, where chunk makes 2 pieces), then whether the split is the ft rung's own.

Example (a lighthouse and 3 slots: not run by the doctests)::

    >>> from minddp.exercises import check_shard, solutions
    >>> check_shard(solutions.ft_shard)                       # doctest: +SKIP
    ✓ shard: through a lost process (worlds 3 → 2 → 3 over 6 committed steps...
"""

from __future__ import annotations

import ast
import inspect
import io
import os
import sys
import types

import torch
import torch.distributed as dist
from torch import nn

from minddp.ft import ToyTask, consistency, launch_ft, parse_faults

#: Rows in a global batch: 10 splits unevenly at world 3 (3, 3, 4), so the remainder matters.
ROWS = 10
#: SGD's learning rate: an error in the gradient shows in the parameters at once (no Adam normalising it).
LR = 0.05
FAULT = "kill@2:1"  # slot 1 dies in step 2, after its forward: the survivors' all_reduce fails
WORLD = 3


class Lanes:
    """ToyTask's regression with one model per shard function, all trained in one run of the ft rung.

    Each lane's model sees only its own shard function's rows; the loss is the sum of the lanes'
    (their parameters are disjoint, so each lane's gradient is its own). ``functions`` are
    cloudpickled (a notebook's function lives in ``__main__``, which the processes cannot import).
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
    """The ft rung's own split (:meth:`minddp.ft.ToyTask.shard`), without its row count."""
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
    task = Lanes([cloudpickle.dumps(shards[i]) for i in run_these], steps)
    print(f"(training {len(run_these)} shard function(s) in one run of the ft rung on {WORLD} slots through {FAULT})")
    try:  # step 2
        run = launch_ft(
            task,
            steps,
            world_size=WORLD,
            faults=parse_faults(FAULT),
            # the fault is a kill, which the launcher reports at once (gone/<slot>): the hang bound serves only a
            # frozen process, so it is set far above the longest a live rank's heartbeat thread may go unscheduled
            # on a loaded 2-core machine (5 s, test_ft's HANG_S, leaves a live rank evictable when eight jobs share it)
            hang_s=30.0,
            digests=True,  # the processes' own checks (minddp.ft.report.consistency), for the verdict
            full_world_at=(0, 2),  # the first step and the fault's meet the whole world
            rejoin_before_end=True,  # ... and the killed rank is back, healed, for the last step
            restart_after_steps=1,  # after at least one step committed without it
            run_timeout_s=timeout_s,
        )
    except FaultTolerantRunError as exc:
        line = str(exc).strip().splitlines()[0]
        for i in run_these:
            verdicts[i] = Verdict(
                False,
                f"✗ shard: your split passed the checks made in this process, but the run could not go on ({line}); "
                "this is not a verdict on your split: run the check again",
            )
        return verdicts
    committed = committed_worlds(run)
    lanes = lane_parameters(next(iter(run.results.values())), len(run_these))
    oracle = single_process(task, steps)  # step 3
    checks = consistency(run)
    blind = checks.identical and checks.one_start and checks.discards_kept  # the ranks' checks see nothing wrong
    for lane, i in enumerate(run_these):  # step 4
        verdicts[i] = verdict(shards[i], lanes[lane], oracle, committed, task, run, blind)
    return verdicts


def preflight(fn, batch) -> str | None:
    """Step 1: what is wrong with ``fn`` (it reads a process group's rank, or the environment's) or with its values
    for every rank of worlds 3, 2 and 1, each asked twice (``None``: nothing)."""
    read, through = reads(fn, dist, GROUP_READS)
    if read:
        return (
            f"your shard reads torch.distributed.{' and '.join(f'{name}()' for name in read)}{through} (the process "
            "group's): split by the rank and world it is given, this rank's index among the members of this "
            "step's quorum and their number: the checker calls shard outside any group, and a group's rank is "
            "that index only where the group is rebuilt whenever the members change (as minddp's rung does)"
        )
    keys: set[str] = set()
    read, through = reads(fn, os, ENVIRONMENT_READS, keys)
    if read:
        why = [WORLD_SIZE_IS_NOT_THE_WORLD] if keys & {"WORLD_SIZE", "LOCAL_WORLD_SIZE"} else []
        if keys & {"RANK", "LOCAL_RANK"} or not why:
            why.insert(0, RANK_IS_THE_SLOT)
        return (
            f"your shard reads the environment (os.{' and os.'.join(read)}){through}, where {'; and '.join(why)}; "
            "split by the rank and world it is given"
        )
    for world in range(WORLD, 0, -1):
        problem = values_problem(fn, batch, world)
        if problem:
            return problem + (SWAPPED if arguments_swapped(fn, batch) else "")
    return busiest_problem(fn, (ROWS,))


def busiest_problem(fn, row_counts) -> str | None:
    """The one rule on how even a split must be: a step lasts as long as its busiest rank, and no split of B rows
    among ``world`` ranks can give its busiest rank fewer than ceil(B / world) rows, so a split whose busiest rank
    takes more is named, for each batch of ``row_counts`` rows at worlds 3 and 2 (``None``: nowhere). (4 rows at
    world 3 split 2, 2, 0 pass: their busiest takes ceil(4 / 3) = 2.) A split that misses a row or doubles one is
    not judged here: the run, or :func:`unchecked_coverage`, names those rows."""
    for rows in row_counts:
        batch = ToyTask(global_batch=rows).global_batch(0)
        for world in range(WORLD, 1, -1):
            missing, twice, sizes = coverage(fn, batch, world)
            even = -(-rows // world)  # ceil(rows / world): the fewest rows any split can give its busiest rank
            if missing or twice or max(sizes) <= even:
                continue
            busiest = sizes.index(max(sizes))
            floor, remainder = divmod(rows, world)
            where = f"at world {world}" + ("" if rows == ROWS else f", with a global batch of {rows} rows")
            fixed = fixed_rows(fn)
            if fixed is not None and fixed != rows:
                return (
                    f"{where}, the ranks took {', '.join(map(str, sizes))} rows: your shard splits a fixed {fixed} "
                    f"rows, whatever the batch holds, and this batch has {rows}, so rank {busiest} takes {max(sizes)} "
                    f"rows where an even split of {rows} gives no rank more than ceil({rows} / {world}) = {even}: "
                    "split len(x) rows, whatever it is, among the `world` ranks it is given"
                )
            if sorted(sizes) == [floor] * (world - 1) + [floor + remainder]:
                fix = (
                    f"each rank took {rows} // {world} = {floor} rows and rank {busiest} the remainder of the floor "
                    f"division too, {remainder} rows: give the remainder's rows to {remainder} different ranks, one "
                    "each (e.g. rank r takes rows r·B // world up to (r+1)·B // world)"
                )
            else:
                fix = f"give each of the {world} ranks {floor}{f' or {floor + 1}' if remainder else ''} rows"
            return (
                f"{where}, the ranks took {', '.join(map(str, sizes))} rows: each row is trained once, but the "
                f"busiest rank, rank {busiest}, takes {max(sizes)} rows where an even split gives no rank more than "
                f"ceil({rows} / {world}) = {even}, and a step lasts as long as its busiest rank"
                + (" (here, as long as one process on the whole batch)" if max(sizes) == rows else "")
                + f"; {fix}"
            )
    return None


def values_problem(fn, batch, world: int) -> str | None:
    """What is wrong with ``fn``'s values for the ranks of ``world`` on ``batch``, each rank asked twice: an
    exception, something other than (x rows, y rows) of the batch, or two calls that disagree (``None``: nothing)."""
    x = batch[0]
    for rank in range(world):
        outs = []
        for _ in range(2):  # twice: every rank calls it on its own, and again when a step is tried again
            try:
                out = fn(batch, rank, world)
            except Exception as exc:  # noqa: BLE001 - the learner's code: any error is the verdict
                return f"your shard raised {type(exc).__name__} for rank {rank} of world {world}: {exc}" + (
                    RANK_READ_AT_RUN_TIME
                    if rank_read(exc)
                    else FLOAT_ENDS
                    if "slice indices must be" in str(exc)
                    else ""
                )
            if isinstance(out, (tuple, list)) and len(out) != 2:
                return (
                    f"shard(batch, {rank}, {world}) returned {len(out)} value{'s' if len(out) != 1 else ''}, not 2 "
                    "(x, y)"
                    + (
                        ": ToyTask.shard's third, the batch's row count, is not the checker's (its task weights by "
                        f"its fixed {ROWS} rows); return only this rank's rows (x[rows], y[rows])"
                        if len(out) == 3
                        else ": return this rank's rows of the batch's inputs and of its targets, (x[rows], y[rows])"
                    )
                )
            if not isinstance(out, (tuple, list)):
                return (
                    f"shard(batch, {rank}, {world}) returned {type(out).__name__}, not (x, y): return this "
                    "rank's rows of the batch's inputs and of its targets"
                )
            if not all(torch.is_tensor(t) for t in out):
                return (
                    f"shard(batch, {rank}, {world}) returned a {type(out).__name__} of "
                    f"{', '.join(type(t).__name__ for t in out)}, not of tensors: return x[rows], y[rows] of the "
                    "batch's tensors (the rung's loss and all_reduce take torch tensors)"
                )
            for name, part, whole in (("x", out[0], x), ("y", out[1], batch[1])):
                one = whole.dim() > 1 and part.shape == whole.shape[1:]  # one row's shape: an integer index's
                if one and len(whole) >= 2 * world and rows_of(part.unsqueeze(0), whole) is not None:
                    return (  # a squeeze cannot give it: every rank's share of these rows is 2 rows or more
                        f"shard(batch, {rank}, {world}) returned {name} of shape {shape(part)}, one row of the batch's "
                        f"{name} ({rows_named(rows_of(part.unsqueeze(0), whole))}), as an integer index gives "
                        f"({name}[i]), where the batch's {name} is {shape(whole)} and each of the {world} ranks' "
                        f"shares of its {len(whole)} rows is {len(whole) // world} rows or more: return a range of "
                        f"rows, {name}[lo:hi], which keeps the rows' dimension"
                    )
                if part.dim() != whole.dim() and rows_of(part.reshape(-1, *whole.shape[1:]), whole) is not None:
                    return (
                        f"shard(batch, {rank}, {world}) returned {name} of shape {shape(part)}, where the batch's "
                        f"{name} is {shape(whole)}: rows of the batch's {name}, in another shape; return {name}[rows] "
                        "as it is, "
                        f"each row of shape {shape(whole[0])} (squeeze drops that dimension)"
                    )
            if rows_of(out[0], x) is None:
                return (
                    f"shard(batch, {rank}, {world}) returned x that is not rows of the batch's x: return x[rows], "
                    "y[rows] of the same rows"
                )
            if len(out[0]) != len(out[1]):
                whole = {len(out[0]): "x", len(out[1]): "y"}.get(len(x))  # the one left whole, if one is
                return (
                    f"shard(batch, {rank}, {world}) returned x of {len(out[0])} rows and y of {len(out[1])}"
                    + (f": {whole} is the whole batch's ({len(x)} rows), not this rank's" if whole else "")
                    + "; take the same rows of both, (x[rows], y[rows])"
                )
            for name, part, whole in (("x", out[0], x), ("y", out[1], batch[1])):
                if (part.dtype, part.device) != (whole.dtype, whole.device):  # rows_of compares values alone
                    return (
                        f"shard(batch, {rank}, {world}) returned {name} as {part.dtype} on {part.device}, where the "
                        f"batch's {name} is {whole.dtype} on {whole.device}: the model's layers take the batch's "
                        f"dtype, so every forward would fail; return {name}[rows] as it is, without .to() or .double()"
                    )
            x_rows, y_rows = rows_of(out[0], x), rows_of(out[1], batch[1])
            if y_rows != x_rows:
                return (
                    f"shard(batch, {rank}, {world}) returned x {rows_named(x_rows) if x_rows else 'no rows'} with y "
                    f"{rows_named(y_rows) if y_rows else 'that is not rows of the batch'}: y[i] must be the target of "
                    "x[i], so take the same rows of both (x[rows], y[rows]); each rank would train its inputs "
                    "against other rows' targets"
                )
            outs.append(sorted(x_rows))
        if outs[0] != outs[1]:
            return (
                f"shard(batch, {rank}, {world}) gave {rows_named(outs[0]) if outs[0] else 'no rows'} on one call "
                f"and {rows_named(outs[1]) if outs[1] else 'no rows'} on the next, with the same arguments: each "
                "rank calls shard on its own (and again when a step is tried again), so the ranks agree on a "
                "split only if it depends on nothing but (batch, rank, world); seed a shuffle from those (e.g. a "
                "torch.Generator seeded with the same number in every rank), not from the global generator"
            )
    return None


#: Said after an exception that a read of the launcher's environment or of a process group raises outside the ranks.
SWAPPED = (  # a split right with its last two parameters the other way round: (batch, world, rank)
    "; called with its last two arguments the other way round, it gives each row to exactly one rank at worlds 3, 2 "
    "and 1: shard is called as shard(batch, rank, world), rank before world"
)
FLOAT_ENDS = (
    " (a slice end computed with `/` gives a float, which a slice refuses: use the floor division `//`, "
    "as in rank * len(x) // world)"
)
RANK_READ_AT_RUN_TIME = (
    " (a read of the launcher's RANK or WORLD_SIZE, or of a process group's rank: the checker calls shard outside "
    "the ranks, and on the ranks RANK is the slot, not the index in the quorum of now; split by the rank and world "
    "shard is given)"
)


def rank_read(exc: Exception) -> bool:
    """``exc`` is what reading the environment's RANK/WORLD_SIZE, or a process group that is not there, raises."""
    return (isinstance(exc, KeyError) and exc.args and exc.args[0] in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) or (
        "process group has not been initialized" in str(exc)
    )


#: Why a shard must not read the environment's RANK ...
RANK_IS_THE_SLOT = (
    "the launcher's RANK is the process's slot, the place it was started in, which stays the same when the world "
    "shrinks: after slot 1 is lost, slots 0 and 2 train world 2 as its ranks 0 and 1, and a split by RANK gives "
    "slot 2 the rows of a rank 2 that world 2 does not have"
)
#: ... nor its WORLD_SIZE.
WORLD_SIZE_IS_NOT_THE_WORLD = (
    "the ft launcher sets no WORLD_SIZE, and where one is set, as torchrun does, it is the number of processes "
    "started (3 here), not the number of this step's members (2 once slot 1 is lost)"
)


#: What a shard must not read: the process group's rank and size (it is given the quorum's) ...
GROUP_READS = ("get_rank", "get_world_size")
#: ... nor the environment, where the launcher's ``RANK`` is the process's slot, not its rank in the quorum of now.
ENVIRONMENT_READS = ("environ", "getenv")


def reads(fn, module, names: tuple[str, ...], keys: set | None = None) -> tuple[list[str], str]:
    """Which of ``names`` (attributes of ``module``) ``fn``'s code reads, as ``module.name`` or as an imported
    name, in itself, in a function defined inside it, or in a function of its own module that it calls (and so
    on: a helper ``def r(): return int(os.environ["RANK"])`` is a read of the environment all the same); and, in
    words, the module-level globals it reads them through: a global whose assignment read them when the module
    ran (``SLOT = int(os.environ.get("RANK", 0))``, then ``SLOT`` in ``fn``), found in its module's source.
    ``keys``, where given, receives the strings that code holds (of an environment read: the keys it reads)."""
    keys = set() if keys is None else keys
    read, seen, todo, via = set(), set(), [fn], []
    sources = ModuleSources()
    while todo:
        f = todo.pop()
        code = getattr(f, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        codes, used = [code], set()
        while codes:
            c = codes.pop()
            used.update(c.co_names + c.co_freevars)
            keys.update(k for k in c.co_consts if isinstance(k, str))
            codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        bound = {**getattr(f, "__globals__", {})}
        for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or ()):
            try:
                bound[name] = cell.cell_contents
            except ValueError:  # a cell not assigned yet
                pass
        read |= read_among(used, bound, module, names)
        todo += own_functions(used, bound, fn)
        module_level = getattr(f, "__globals__", {})
        values = [name for name in used if name in module_level and is_value(bound[name])]
        done_values: set[str] = set()
        while values:  # module-level values: what the assignments that made them read
            name = values.pop()
            if name in done_values:
                continue
            done_values.add(name)
            for statement, expression in sources.assignments(f, name):
                expr_used = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
                expr_used |= {n.attr for n in ast.walk(expression) if isinstance(n, ast.Attribute)}
                found = read_among(expr_used, bound, module, names)
                if found:
                    read |= found
                    keys.update(
                        n.value
                        for n in ast.walk(expression)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    )
                    via.append(f"{name}, a global its module set when it ran (`{statement}`)")
                todo += own_functions(expr_used, bound, fn)
                values += [n for n in expr_used if n in bound and is_value(bound[n])]
    through = f" through {' and '.join(dict.fromkeys(via))}" if via else ""
    return [n for n in names if n in read], through


def read_among(used: set, bound: dict, module, names: tuple[str, ...]) -> set:
    """Which of ``names`` the names ``used`` are: by name, or bound to ``module``'s attribute of that name."""
    return {n for name in used for n in names if name == n or bound.get(name) is getattr(module, n)}


def own_functions(used: set, bound: dict, fn) -> list:
    """The learner's own functions among the names ``used`` (library code is not the learner's to change)."""
    return [
        bound[name]
        for name in used
        if isinstance(bound.get(name), types.FunctionType) and bound[name].__module__ == fn.__module__
    ]


def is_value(value) -> bool:
    """A module-level value whose assignment may have read something (not a module, function or class)."""
    return not isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))


class ModuleSources:
    """The top-level assignments of a function's module, from its source: a file's, or a notebook's cells
    (IPython keeps each cell's input, as run, in the kernel's namespace as ``In``)."""

    def __init__(self):
        self.trees: dict[int, list[tuple[str, ast.Module]]] = {}

    def parsed(self, f) -> list[tuple[str, ast.Module]]:
        namespace = getattr(f, "__globals__", {})
        if id(namespace) not in self.trees:
            cells = namespace.get("In")
            texts = [c for c in cells if isinstance(c, str)] if isinstance(cells, list) else []
            if not texts:
                try:
                    texts = [inspect.getsource(sys.modules[f.__module__])]
                except (KeyError, TypeError, OSError):  # no module, or no source (a built-in, an exec'd string)
                    texts = []
            trees = []
            for text in texts:
                try:
                    trees.append((text, ast.parse(text)))
                except SyntaxError:
                    pass
            self.trees[id(namespace)] = trees
        return self.trees[id(namespace)]

    def assignments(self, f, name: str):
        """``(statement's first line, assigned expression)`` of each top-level assignment to ``name``."""
        for text, tree in self.parsed(f):
            statements = list(tree.body)
            while statements:
                node = statements.pop()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue  # their bodies run when called, not when the module runs
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    targets = [node.target]
                else:
                    targets = []
                if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                    yield (ast.get_source_segment(text, node) or name).splitlines()[0], node.value
                statements += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]


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
    worlds = {e["step"]: len(e["members"]) for _, _, e in run.entries if e["committed"]}
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


def verdict(fn, mine: dict, oracle: dict, committed, task: Lanes, run, blind: bool):
    """Step 4 for one lane (``blind``: the processes' own checks all passed, :func:`minddp.ft.report.consistency`)."""
    from minddp.exercises.checker import Verdict

    d_single = largest_difference(mine, oracle)
    if d_single <= tolerance(oracle):
        worlds = [w for _, w in committed]
        elsewhere = unchecked_coverage(fn, set(worlds))
        elsewhere = elsewhere or busiest_problem(fn, OTHER_ROWS)
        if elsewhere:
            return Verdict(False, f"✗ shard: the run's committed steps were right, but {elsewhere}")
        path = " → ".join(str(w) for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1])
        discarded = len({(e["tag"], e["step"]) for _, _, e in run.entries if not e["committed"]})
        return Verdict(
            True,
            f"✓ shard: through a lost process (worlds {path} over {len(committed)} committed steps, {discarded} "
            f"attempt(s) discarded) every committed step trained each of the {ROWS} rows of its global batch once: "
            f"the parameters match a single process on the whole batch (largest difference {d_single:.1e}, float32 "
            f"rounding: the ranks of each world add their parts where one process adds all rows; tolerance "
            f"{tolerance(oracle):.1e}); each row goes to exactly one rank, and no rank takes more than ceil(B / world) "
            f"of a batch's B rows, at worlds {', '.join(map(str, range(WORLD, 1, -1)))} and 1 for batches of "
            f"{min(OTHER_ROWS)} to {max(OTHER_ROWS)} rows too (checked in this process); "
            f"{compared_with_the_rung(fn, task.global_batch(0))}",
        )
    return Verdict(False, "✗ shard: " + coverage_problem(fn, committed, task, d_single, blind, tolerance(oracle)))


#: Batch sizes checked besides the run's (in this process, starting none), every one from 1 to 12 rows: a split must
#: follow len(x), not a fixed count, and give each row a rank whatever the count (torch's chunk makes pieces of
#: ceil(B / world) rows, so 4 rows at world 3 are only 2 pieces: rank 2 has none). The larger first, then down to 1.
OTHER_ROWS = (11, 12, *range(ROWS - 1, 0, -1))
#: A batch larger than any count of rows a split may fix (see :func:`fixed_rows`).
BIG_ROWS = 64


def coverage(fn, batch, world: int) -> tuple[list[int], list[int], list[int]]:
    """How ``fn`` splits ``batch`` among ``world`` ranks: rows no rank takes, rows several take, each rank's count."""
    x = batch[0]
    count, sizes = [0] * len(x), []
    for rank in range(world):
        rows = rows_of(fn(batch, rank, world)[0], x) or []
        sizes.append(len(rows))
        for row in rows:
            count[row] += 1
    return [r for r, c in enumerate(count) if c == 0], [r for r, c in enumerate(count) if c > 1], sizes


def split_by_size(fn, batch) -> bool:
    """``fn`` gives every rank of worlds 3, 2, 1 the piece ``x.split(world)[rank]``: split's argument taken for a
    number of pieces, where it is a piece's size (a rank past the last piece would raise: no rows counted)."""
    rows = list(range(len(batch[0])))
    for world in range(WORLD, 0, -1):
        pieces = [rows[i : i + world] for i in range(0, len(rows), world)]
        for rank in range(world):
            yours = rows_of(fn(batch, rank, world)[0], batch[0])
            if yours != (pieces[rank] if rank < len(pieces) else []):
                return False
    return True


def world_ignored(fn, batch) -> bool:
    """``fn`` gives each rank of worlds 2 and 1 the rows it gives that rank at world WORLD: a fixed count of ranks
    where ``world`` belongs (question 3's split of notebook 07)."""
    x = batch[0]
    return all(
        rows_of(fn(batch, rank, world)[0], x) == rows_of(fn(batch, rank, WORLD)[0], x)
        for world in range(1, WORLD)
        for rank in range(world)
    )


def slice_end_moved(fn, batch, world: int) -> int:
    """-1 where ``fn`` gives each rank of ``world`` the rung's rows but its last (an exclusive end taken one row
    short, ``x[lo:hi-1]``), +1 where it gives each the rung's rows and the next rank's first (an end taken as
    inclusive, ``x[lo:hi+1]``), 0 otherwise."""
    x = batch[0]
    mine = [rows_of(fn(batch, rank, world)[0], x) or [] for rank in range(world)]
    rung = [sorted(rows_of(rung_shard(batch, rank, world)[0], x)) for rank in range(world)]
    if not all(rung):
        return 0
    for moved in (-1, 1):
        if all(m == list(range(r[0], min(r[-1] + 1 + moved, len(x)))) for m, r in zip(mine, rung)):
            return moved
    return 0


def ranks_from_one(fn, batch, world: int) -> bool:
    """``fn`` gives rank 0 of ``world`` no rows and each rank r > 0 the rung's rows of rank r - 1: ranks counted from
    1, ``x[(rank-1)·B // world : rank·B // world]``, so rank 0's slice is empty and the rung's last share is lost."""
    x = batch[0]
    mine = [sorted(rows_of(fn(batch, rank, world)[0], x) or []) for rank in range(world)]
    rung = [sorted(rows_of(rung_shard(batch, rank, world)[0], x)) for rank in range(world)]
    return world > 1 and not mine[0] and mine[1:] == rung[:-1]


def last_end_short(fn, batch) -> bool:
    """``fn`` gives every rank of worlds 3, 2, 1 the rung's rows, but the last rank its rows less the batch's last
    row: that rank's slice ended at -1 or ``len(x) - 1`` (read as "to the end", or as an inclusive end), where the
    end of ``x[lo:hi]`` is already left out. (At world 3 on 10 rows this is also what a floor split gives, 3, 3, 3
    rows; worlds 2 and 1 tell them apart.)"""
    x = batch[0]
    for world in range(WORLD, 0, -1):
        for rank in range(world):
            rung = sorted(rows_of(rung_shard(batch, rank, world)[0], x))
            if rank == world - 1:
                rung = rung[:-1]
            if sorted(rows_of(fn(batch, rank, world)[0], x) or []) != rung:
                return False
    return True


def shape(t: torch.Tensor) -> str:
    """``(10, 1)``, ``(3,)``: a tensor's shape as Python writes a tuple."""
    return str(tuple(t.shape))


def pair_length(fn, batch) -> bool:
    """``fn``'s ranks take, at every world, rows 0 to len(batch) - 1 together: len(batch), the pair (x, y), taken
    for the count of rows."""
    x = batch[0]
    return all(
        sorted({r for rank in range(world) for r in rows_of(fn(batch, rank, world)[0], x) or []})
        == list(range(len(batch)))
        for world in range(WORLD, 0, -1)
    )


def unchecked_coverage(fn, run_worlds: set) -> str | None:
    """Where the run cannot show it: a world its committed steps did not have, or a batch of another size, at
    which ``fn`` gives a row to no rank or to several (``None``: every row to exactly one rank)."""
    for rows in (ROWS, *OTHER_ROWS):
        batch = ToyTask(global_batch=rows).global_batch(0)
        for world in range(WORLD, 0, -1):
            if rows == ROWS and world in run_worlds:
                continue  # the run's parameters showed it
            where = (
                f"at world {world} (which the run's committed steps did not have)"
                if rows == ROWS
                else f"with a global batch of {rows} rows (the run's have {ROWS}), at world {world}"
            )
            problem = None if rows == ROWS else values_problem(fn, batch, world)  # (the run's batch: step 1 did)
            if problem:
                return f"{where}, {problem}{chunk_note(fn, rows, world)}"
            missing, twice, sizes = coverage(fn, batch, world)
            floor, remainder = divmod(rows, world)
            if missing and not twice and min(sizes) >= floor and fixed_rows(fn) is None:
                return (  # each rank has its floor share: some of the remainder's rows are what no rank took
                    f"{where}, {rows_text(missing)} trained by no rank: the ranks took {', '.join(map(str, sizes))} "
                    f"rows of {rows} = {world} × {floor} + {remainder}, so {len(missing)} of the remainder's "
                    f"{remainder} rows ({rows} % {world}) went to no rank: give every row of the remainder to a rank "
                    "(e.g. rank r takes rows r·B // world up to (r+1)·B // world)"
                )
            if missing:
                return (
                    f"{where}, {rows_text(missing)} trained by no rank"
                    + (f" and {rows_named(twice)} by more than one" if twice else "")
                    + ": split len(x) rows, whatever it is, among the `world` ranks it is given"
                    + chunk_note(fn, rows, world)
                )
            if twice:
                return (
                    f"{where}, {rows_text(twice)} trained by more than one rank: give each row to exactly one rank"
                    + chunk_note(fn, rows, world)
                )
    return None


def fixed_rows(fn) -> int | None:
    """The number of rows ``fn`` splits whatever the batch holds: N, below BIG_ROWS, where for the run's batch and
    every other size each rank of worlds 3, 2, 1 gets its rows of a batch of BIG_ROWS rows less those from row N on
    (a batch of fewer than N rows may raise instead: indexing rows it does not have). ``None``: its split follows
    len(x), or it raises on a batch of N rows or more (that is named by its values)."""
    big = ToyTask(global_batch=BIG_ROWS).global_batch(0)
    try:
        shares = {
            (world, rank): rows_of(fn(big, rank, world)[0], big[0]) or []
            for world in range(WORLD, 0, -1)
            for rank in range(world)
        }
    except Exception:  # noqa: BLE001 - the learner's code: named by its values
        return None
    n = 1 + max(max(rows, default=-1) for rows in shares.values())
    if n >= BIG_ROWS:
        return None
    for rows in (ROWS, *OTHER_ROWS):
        batch = ToyTask(global_batch=rows).global_batch(0)
        try:
            mine = {key: rows_of(fn(batch, key[1], key[0])[0], batch[0]) or [] for key in shares}
        except Exception:  # noqa: BLE001 - the learner's code
            if rows < n:
                continue  # it indexes rows this batch does not have
            return None
        if any(mine[key] != [r for r in share if r < rows] for key, share in shares.items()):
            return None
    return n


def chunk_note(fn, rows: int, world: int) -> str:
    """Why ``fn`` went wrong at ``rows`` rows and ``world`` ranks, if it cuts pieces of ceil(rows / world) rows
    (torch's chunk, or the same pieces by hand) and they are fewer than the ranks there (``""`` otherwise)."""
    size = -(-rows // world)  # chunk's piece: ceil(rows / world) rows, the last one shorter
    pieces = -(-rows // size)
    if pieces >= world:
        return ""
    if reads(fn, torch, ("chunk",))[0]:
        cut = "chunk(world) cuts pieces of ceil(B / world) rows"
    elif ceiling_pieces(fn, rows, world, size):
        cut = "your pieces are ceil(B / world) rows"
    else:
        return ""
    return (
        f" ({cut}, so {rows} rows at world {world} make {pieces} piece{'s' if pieces > 1 else ''} of at most {size}, "
        f"fewer than the {world} ranks: rank {pieces} and above get no piece; torch.tensor_split(x, world) always "
        "gives `world` pieces, some of them empty)"
    )


def ceiling_pieces(fn, rows: int, world: int, size: int) -> bool:
    """``fn`` gives rank r of ``world`` rows r·size up to (r+1)·size of a batch of ``rows`` rows, for every rank
    that has such a piece: chunk's pieces, cut by hand."""
    batch = ToyTask(global_batch=rows).global_batch(0)
    try:
        return all(
            rows_of(fn(batch, rank, world)[0], batch[0]) == list(range(rank * size, min(rows, (rank + 1) * size)))
            for rank in range(-(-rows // size))
        )
    except Exception:  # noqa: BLE001 - the learner's code: a piece that raises is not chunk's
        return False


def arguments_swapped(fn, batch) -> bool:
    """``fn`` gives each row of ``batch`` to exactly one rank at worlds 3, 2 and 1 when called as
    ``fn(batch, world, rank)``: its last two parameters in the other order."""

    def swapped(b, rank, world):
        return fn(b, world, rank)

    for world in range(WORLD, 0, -1):
        if values_problem(swapped, batch, world) is not None or any(coverage(swapped, batch, world)[:2]):
            return False
    return True


def compared_with_the_rung(fn, batch) -> str:
    """Whether ``fn`` gives every rank of worlds 3, 2, 1 the rows the rung's own split gives it (or where not)."""
    x = batch[0]
    for world in range(WORLD, 0, -1):
        for rank in range(world):
            yours, rung = (sorted(rows_of(split(batch, rank, world)[0], x)) for split in (fn, rung_shard))
            if yours != rung:
                return (
                    f"your split differs from the ft rung's own (rank {rank} of world {world}: your "
                    f"{rows_named(yours) if yours else 'no rows'}, the rung's {rows_named(rung)}), and is as right"
                )
    return "your split gives every rank the rows the ft rung's own split gives it"


def times(ratio: float) -> str:
    """How many times over, in words a learner reads at a glance.

    >>> times(1333.4), times(12.6), times(1.26)
    ('1,333 times', '13 times', '1.3 times')
    """
    return f"{ratio:,.0f} times" if ratio >= 10 else f"{ratio:.2g} times"


def coverage_problem(fn, committed, task: Lanes, difference: float, blind: bool, bound: float | None = None) -> str:
    """Which rows no rank trained (or several did), at the first world where the split was wrong (``bound``: the
    :func:`tolerance` the difference was over, said as how many times over)."""
    # the ratio of the two numbers as printed, so that a learner who divides them gets it
    over = (
        ""
        if bound is None
        else f", {times(float(f'{difference:.2g}') / float(f'{bound:.1e}'))} the tolerance {bound:.1e}"
    )
    left = (
        f"the parameters differ from a single process's on the whole batch (largest difference {difference:.2g}{over})"
    )

    if blind:  # what the processes' own checks cannot see
        left += (
            f", though the processes' own checks all pass (the {WORLD} slots end equal, each attempt's "
            "members, new group or not, started it from the same bytes, every discarded attempt changed nothing)"
        )
    for step, world in committed:
        batch = task.global_batch(step)
        missing, twice, sizes = coverage(fn, batch, world)
        if missing and split_by_size(fn, batch):
            others = [(w, coverage(fn, task.global_batch(step), w)[0]) for w in range(WORLD, 0, -1) if w != world]
            others_text = "; ".join(f"at world {w}: {rows_named(m)}" for w, m in others if m)
            took = (  # x.split(world)[rank], or the same pieces by hand (x[rank*world:(rank+1)*world])
                "takes piece `rank` of x.split(world), but split's argument is the size of a piece, not their number"
                if reads(fn, torch, ("split",))[0]
                else "takes pieces of `world` rows (as x.split(world) does), where `world` is the number of pieces, "
                "not their size"
            )
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): your "
                f"shard {took}: at world {world} it cuts {world}-row pieces, {-(-ROWS // world)} of them, and rank r "
                f"takes the r-th, so {rows_named(missing)} go{'es' if len(missing) == 1 else ''} to no rank"
                + (f" ({others_text})" if others_text else "")
                + f", and {left}: x.tensor_split(world) cuts `world` pieces (or rank r takes rows r·B // world up to "
                "(r+1)·B // world)"
            )
        if missing and pair_length(fn, batch):
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): your "
                f"shard splits only rows 0-{len(batch) - 1}, as many as len(batch) = {len(batch)}, the pair (x, y), "
                f"and {left}: the batch's rows are len(x) = {ROWS}"
            )
        if missing and world < WORLD and world_ignored(fn, batch):
            gone = list(range(world, WORLD))
            fixed = fixed_rows(fn)  # x[4*rank:4*(rank+1)] also ignores len(x): say both halves at once
            if fixed is None:
                same = f"at every world, those it gives at world {WORLD}, as if `world` were always {WORLD}"
            else:
                sizes = coverage(fn, ToyTask(global_batch=BIG_ROWS).global_batch(0), WORLD)[2]
                same = (
                    f"at every world and whatever the batch holds, those it gives at world {WORLD} of a fixed {fixed} "
                    f"rows ({', '.join(map(str, sizes))}), as if `world` were always {WORLD} and len(x) always {fixed}"
                )
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): your "
                f"shard gives each rank the same rows {same}, so at world {world} the rows of world {WORLD}'s "
                f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} go to no rank, and {left}: split "
                + ("len(x) rows, whatever it is, " if fixed is not None else "")
                + "among the `world` ranks it is given"
            )
        fixed = fixed_rows(fn) if missing else None
        if fixed is not None and fixed < ROWS and set(range(fixed, ROWS)) <= set(missing):
            beyond = list(range(fixed, ROWS))  # a fixed count below the batch's: the rows past it, at every world
            x = batch[0]
            features = (
                f" ({fixed} is x.shape[1], the features of each row; the rows are len(x) = x.shape[0] = {len(x)})"
                if x.dim() > 1 and fixed == x.shape[1]
                else ""
            )
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): your "
                f"shard splits a fixed {fixed} rows, {rows_named(list(range(fixed)))}, whatever the batch holds, so "
                f"{rows_named(beyond)} go{'es' if len(beyond) == 1 else ''} to no rank at any world{features}, and "
                f"{left}: split len(x) rows, whatever it is, among the `world` ranks it is given"
            )
        if missing == [ROWS - 1] and not twice and last_end_short(fn, batch):
            return (
                f"at world {world}, row {ROWS - 1} was trained by no rank (of the global batch's {ROWS}): it is the "
                "batch's last row, and your last rank's slice ends one row before the batch's end (an end of -1 or "
                f"len(x) - 1), at every world, and {left}: a slice x[lo:hi] already leaves out row hi, and x[lo:-1] "
                "the last row, so end the last rank's slice at len(x), or leave its end out (x[lo:])"
            )
        floor = ROWS // world
        # the remainder's rows are the batch's last: a split of floor-sized pieces that loses other rows is not this
        if not twice and sizes == [floor] * world and missing == list(range(floor * world, ROWS)) != []:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): each "
                f"rank took {ROWS} // {world} = {floor} rows, so the remainder of the floor division, "
                f"{rows_named(missing)}, went to no rank{fixed_world_note(fn, batch, world)}, and {left}: spread the "
                "remainder over the ranks (e.g. rank r takes rows r·B // world up to (r+1)·B // world)"
            )
        if missing and slice_end_moved(fn, batch, world) == -1:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): each is "
                "the last row of a rank's share (rank r's share ends where rank r + 1's begins, at (r+1)·B // world); "
                f"your slice ends one row before it, and {left}: a slice x[lo:hi] already leaves out row hi, so end it "
                "at (r+1)·B // world, not one less"
            )
        if missing and ranks_from_one(fn, batch, world):
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}): your "
                "shard counts ranks from 1: rank r takes the rows of the ft rung's rank r - 1, so rank 0's slice is "
                f"empty and {rows_named(missing)}, the last rank's share, go{'es' if len(missing) == 1 else ''} to "
                f"no rank, and {left}: ranks count from 0 (rank r takes rows r·B // world up to (r+1)·B // world)"
            )
        if missing and twice:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank and {rows_named(twice)} by more than one "
                f"(of the global batch's {ROWS}), so {left}: give each row to exactly one rank, by rank and world"
            )
        if missing:
            return (
                f"at world {world}, {rows_text(missing)} trained by no rank (of the global batch's {ROWS}), so "
                f"{left}: split the whole global batch among the {world} ranks of now, by rank and world"
            )
        if twice and not missing and slice_end_moved(fn, batch, world) == 1:
            return (
                f"at world {world}, {rows_text(twice)} trained by more than one rank (of the global batch's {ROWS}): "
                "each is the first row of a rank's share (rank r + 1's share begins where rank r's ends, at "
                "(r+1)·B // world); your slice takes it into rank r's share too, and "
                f"{left}: a slice x[lo:hi] already leaves out row hi, so end it at (r+1)·B // world, not one more"
            )
        if twice:
            return (
                f"at world {world}, {rows_text(twice)} trained by more than one rank (counted more than once), "
                f"so {left}: give each row to exactly one rank"
            )
    return (
        f"every row was trained once at every world, yet {left}: return the batch's rows as they are (x[rows], y[rows])"
    )


def fixed_world_note(fn, batch, world: int) -> str:
    """At the starting world, what ``fn`` also gets wrong later if it gives each rank the same rows at every world
    (a fixed 3 where ``world`` belongs, e.g. ``len(x) // 3``): the rows it loses at the next world down (``""``
    otherwise)."""
    if world != WORLD or not world_ignored(fn, batch):
        return ""
    lost = coverage(fn, batch, WORLD - 1)[0]
    if not lost:
        return ""
    return (
        f"; your shard also gives each rank the same rows at every world, as if `world` were always {WORLD}: at "
        f"world {WORLD - 1}, {rows_named(lost)} go to no rank"
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
