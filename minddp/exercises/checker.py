"""The checker's side in the notebook (or any Python process): start ranks, send the check, read the reports.

1. **ranks**: the checks run on a cluster of their own
   (:class:`~minddp.notebook.Cluster`, started at the first check and kept for
   the next ones), not on the notebook's ``%dist_init`` ranks: a stage that
   hangs in C++ may have to be ended by pid, and that must not cost the
   learner the variables on the notebook's ranks. Its process group has the
   check's ``timeout_s``, so a collective that no other rank joins fails
   after that long instead of waiting for ever;
2. **send**: the learner's class or hook goes to every rank (cloudpickle
   sends a class defined in a notebook by value), with
   :func:`~minddp.exercises.harness.check_stage_on_rank` or
   :func:`~minddp.exercises.harness.check_hook_on_rank`;
3. **read**: every rank prints one report (also when it failed); the reports
   are turned into one :class:`Verdict`, the first problem found in this
   order: a rank that raised, a rank that hung, the start (broadcast), a
   collective the step never waited for (from the order of calls: whether its
   sum arrived in time is a race, so the race's outcome is not judged), a wait
   again for an earlier step's collective (a list in flight never emptied), the
   gradients, the parameters, a no_sync() inside a no_sync() (its sync must stay
   off), the kinds, number and place of the collectives,
   and whether messages travelled while backward computed (an async rung's
   idea, from the order of events the ranks recorded, not from timings).

Example (the model answer passes; a learner's class that sums instead of averaging gets
``✗ simple: gradients were summed, not averaged ...``)::

    >>> from minddp.exercises import solutions
    >>> shutdown()                                                # no checker ranks yet
    >>> verdict = check(solutions.SimpleDDP, like="simple")       # 2 real ranks, then 3: a few seconds
    (starting 2 ranks for the checks on 2 ranks; they stay for the next ones)
    (starting 3 ranks for the checks on 3 ranks; they stay for the next ones)
    >>> verdict.ok, verdict.line[:9]
    (True, '✓ simple:')
"""

from __future__ import annotations

import json
import linecache
import re
import sys
from dataclasses import dataclass, field

from minddp.exercises import harness, solutions

_clusters: dict = {}  #: world size -> the checker's cluster of that many ranks


@dataclass
class Verdict:
    """What a check found: ``ok``, and one line that says it (``✓ ...`` or ``✗ ...``)."""

    ok: bool
    line: str
    reports: dict = field(default_factory=dict, repr=False)  #: rank -> that rank's raw report

    def __str__(self) -> str:
        return self.line

    __repr__ = __str__

    def __bool__(self) -> bool:
        return self.ok


def ranks(world_size: int = 2, timeout_s: float = 20.0):
    """Step 1: the checker's cluster of ``world_size`` ranks, started (or restarted with a new timeout) when needed.

    One cluster per world size is kept, so that the second check (:func:`check`, on another number of ranks)
    does not restart the first one's ranks every time."""
    from minddp.notebook.cluster import Cluster

    cluster = _clusters.get(world_size)
    if cluster is not None and cluster.running and cluster.timeout_s == timeout_s:
        return cluster
    if cluster is not None:
        cluster.shutdown()
    print(
        f"(starting {world_size} ranks for the checks on {world_size} ranks; they stay for the next ones)", flush=True
    )
    cluster = Cluster(world_size, backend="gloo", timeout_s=timeout_s, grace_s=1.0, release_s=3.0).start()
    # Fresh ranks pay for imports and torch's first calls (its DDP, the optimizer's lazy imports) in their first
    # check: a model answer's step, here under a generous limit, pays it, so that a check's own limit (timeout_s)
    # measures the learner's code and not the machine's load (its report is not read).
    cluster.run(harness.check_stage_on_rank, solutions.SimpleDDP, None, {}, 1, 1, timeout_s=600, raise_errors=False)
    _clusters[world_size] = cluster
    return cluster


def shutdown() -> None:
    """Stop the checker's ranks, of every world size (they also stop with the process)."""
    while _clusters:
        _clusters.popitem()[1].shutdown()


def check(
    stage,
    like: str | None = None,
    *,
    bucket_cap_mb: float = 0.001,
    steps: int = 3,
    accum: int = 3,
    world_size: int = 2,
    second_world_size: int | None = 3,
    timeout_s: float = 20.0,
) -> Verdict:
    """Train the stage class ``stage`` on ``world_size`` ranks beside a single process and torch's DDP.

    ``like`` names the model answer it is measured against for the kinds,
    number and place of its collectives and for what is in flight while
    backward computes (``simple``, ``ga``, ``hook``, ``hook-async``,
    ``bucket``, ``bucket-async``, ``halves``; ``None``: correctness only). The stage is
    built as ``stage(module)``, plus ``bucket_cap_mb`` when its ``__init__``
    takes it (the default makes two buckets of the checker's small network,
    of 323 and 112 values, so a stage's per-bucket calls are counted twice a
    step and one bucket has an odd length). A collective that one rank waits
    in for ``timeout_s`` seconds is a hang. A stage whose Wire has a transport
    (``halves``) has it also sum a tensor of 5 × 8 values (``harness.SHAPED``):
    the buckets are flat, and a transport is handed any tensor. Its stage is
    built over a group of its own (``dist.new_group`` over the ranks), and a
    transport that sums over another (``dist.group.WORLD``) is refused by name.

    A stage that passes is checked once more, on ``second_world_size`` ranks
    (``None``: not): a world size written as a number (``param.grad /= 2``) is
    right on 2 ranks only, and so is ``halves``' padding with the wrong sign (at
    2 ranks ``x % 2 == -x % 2`` for every ``x``). A wrong answer fails the first
    check and never waits for the second. The second check judges correctness
    only (one step), except for ``halves``, whose transport's own mistakes
    (padding, piece sizes) only its full check names.
    """
    if like is not None and like not in solutions.STAGES:
        raise ValueError(f"like={like!r}: choose one of {', '.join(solutions.STAGES)}, or None")
    if not isinstance(stage, type):
        raise TypeError(f"check() takes a stage class (e.g. check(MySimpleDDP, like='simple')), got {stage!r}")
    name = like or stage.__name__
    options = {"bucket_cap_mb": bucket_cap_mb}
    reports = _run(harness.check_stage_on_rank, (stage, like, options, steps, accum), world_size, timeout_s)
    first = _stage_verdict(name, like, reports, timeout_s, bucket_cap_mb)
    if not first.ok:
        counted = _counted_in_no_sync(stage, like, options, reports, accum, world_size, timeout_s)
        return Verdict(False, f"✗ {name}: {counted}", reports) if counted else first
    # A finish that raised on a .grad set to None (harness.no_gradient_finding) is named after the second check:
    # a wrong average there (a world size written as a number) comes first.
    first_report = reports[min(reports)]
    no_gradient = first_report.get("no_gradient")
    guard = (
        Verdict(False, f"✗ {name}: " + _stage_finding(no_gradient, first_report, like), reports)
        if no_gradient
        else None
    )
    if second_world_size in (None, world_size):
        return first if guard is None else guard  # a Verdict is falsy when it fails: no `guard or first`
    # Correctness only (like=None): the kinds, number and place of the collectives were judged on the first ranks.
    again_like, again_steps = ("halves", steps) if like == "halves" else (None, 1)
    failed, again = _again(
        name,
        harness.check_stage_on_rank,
        (stage, again_like, options, again_steps, accum),
        (world_size, second_world_size),
        timeout_s,
        lambda f, report: _stage_finding(f, report, again_like),
        again_like,
    )
    if failed is not None:
        return failed
    if guard is not None:
        return guard
    return _stage_verdict(name, like, reports, timeout_s, bucket_cap_mb, also=again[min(again)])


def _again(name: str, fn, args: tuple, sizes: tuple[int, int], timeout_s: float, describe, like=None):
    """The second check: ``fn(*args)`` on ``sizes[1]`` ranks, after a pass on ``sizes[0]``. Returns the failing
    verdict, which says where it failed (``None`` when it passed there too), and the second check's reports."""
    again = _run(fn, args, sizes[1], timeout_s)
    problem = _problem(name, again, timeout_s, describe, like)
    if problem:
        where = f"on {sizes[1]} ranks, after it passed on {sizes[0]}: "
        return Verdict(False, problem.replace(f"✗ {name}: ", f"✗ {name}: {where}", 1), again), again
    return None, again


def _again_text(also: dict | None) -> str:
    """What a passing verdict adds for its second check (``also``: a rank's report of it)."""
    if not also:
        return ""
    steps = also["checked_steps"]
    return (
        f", and after {steps} step{'s' if steps != 1 else ''} on {also['world']} ranks too (a world size written as "
        "a number would show there)"
    )


def _counted_in_no_sync(stage, like, options: dict, reports: dict, accum: int, world_size: int, timeout_s: float):
    """Step 1 synced nothing in ``accum`` micro-batches: if a step of one micro-batch syncs, the stage keeps
    something the no_sync() backwards changed (a count decremented in every backward, reset only when it sends,
    reaches zero unsent inside no_sync() and never again). If that step does not sync either, a bucket stage's count
    never meets its test at the bucket's last gradient (tested before it is decremented, it is still 1 there). The
    one-step run is made only on this failure."""
    report = reports[min(reports)] or {}
    f, kinds = report.get("finding") or {}, report.get("kinds") or []
    if accum < 2 or f.get("kind") != "local" or f.get("step") != 1 or not kinds or kinds[0]:
        return None
    alone = _run(harness.check_stage_on_rank, (stage, None, options, 1, 1), world_size, timeout_s)
    one = alone[min(alone)] or {}
    if (like or "").startswith("bucket") and (one.get("finding") or {}).get("kind") == "local":
        if not (one.get("kinds") or [{}])[0]:  # no collective even without no_sync(): the count's test never passed
            return (
                f"no bucket was sent even in a step of 1 micro-batch (no no_sync()), nor in step 1 of {accum}: a "
                "bucket is sent when its count of the gradients it still waits for reaches 0, at its last gradient; "
                "test the count after decrementing it (tested before, `if self.waiting[b] == 0:` then "
                "`self.waiting[b] -= 1`, it is still 1 at the last gradient and reaches 0 only after the test)"
            )
    if "finding" not in one or one["finding"] or not (one.get("kinds") or [{}])[0]:
        return None
    cause = (
        "in the backwards inside no_sync() that it needs in the backward that syncs; a bucket's count of the gradients "
        "it still waits for, counted in every backward, reaches zero unsent inside no_sync() and never again: count "
        "only when this backward syncs (inside `if self.sync_this_backward:`)"
        if (like or "").startswith("bucket")
        else "inside no_sync() that it needs in the step that syncs: a decision only ever turned off stays off after "
        "the first no_sync(); let every forward record it afresh, True or False "
        "(self.sync_this_backward = self.require_backward_grad_sync)"
    )
    return (
        f"gradients were not synchronized: step 1 started no collective at all in {accum} micro-batches, but a step "
        f"of 1 micro-batch (no no_sync()) syncs ({calls_text(one['kinds'][0])}): your stage changes something {cause}"
    )


def check_hook(
    hook,
    like: str = "fp16",
    *,
    steps: int = 3,
    accum: int = 3,
    world_size: int = 2,
    second_world_size: int | None = 3,
    timeout_s: float = 20.0,
) -> Verdict:
    """Check a comm hook ``hook(state, bucket) -> Future[Tensor]`` against the model answer ``like``.

    The hook is called on a bucket of known gradients (its state: the
    checker's own process group), noting whether it waited for its collective before it
    returned (a blocking hook), then on a bucket of large gradients whose
    float16 sum over the ranks overflows (a hook that divides after the sum
    returns ``inf``), then trains minddp's ``bucket-async`` stage beside
    torch's DDP running torch's own hook of that name and a single process.
    A hook that passes is checked once more on ``second_world_size`` ranks, as
    :func:`check` does (one training step): a divisor written as 2 is right on 2
    ranks only.
    """
    if like not in solutions.HOOKS:
        raise ValueError(f"like={like!r}: choose one of {', '.join(solutions.HOOKS)}")
    if not callable(hook):
        raise TypeError(f"check_hook() takes a hook function hook(state, bucket), got {hook!r}")
    reports = _run(harness.check_hook_on_rank, (hook, like, steps, accum), world_size, timeout_s)
    first = _hook_verdict(like, reports, timeout_s)
    if not first.ok or second_world_size in (None, world_size):
        return first
    args = (hook, like, 1, accum)
    failed, again = _again(f"{like} hook", harness.check_hook_on_rank, args, (world_size, second_world_size),
                           timeout_s, _hook_finding)  # fmt: skip
    if failed is not None:
        return failed
    return _hook_verdict(like, reports, timeout_s, also=again[min(again)])


def _run(fn, args: tuple, world_size: int, timeout_s: float) -> dict:
    """Step 2: one call on every rank; each rank's report (None for a rank that gave none)."""
    cluster = ranks(world_size, timeout_s)
    # The group's own timeout ends a stuck collective first; the runner's release is the backstop, for a rank
    # stuck outside any collective (a Future never completed, a loop that never ends). It goes by the ranks'
    # phase lines (harness.Progress), not by the check's length: a check slowed by a loaded machine keeps
    # printing them and is never cut; MAX_CHECK_S only ends a check that prints forever.
    phases: dict[int, str] = {}

    def heard(rank: int, stream: str, text: str) -> None:
        for line in text.splitlines():
            if line.startswith(harness.PHASE):
                phases[rank] = line[len(harness.PHASE) :]

    outputs = cluster.run(
        fn, *args, timeout_s=MAX_CHECK_S, stall_s=stall_s(timeout_s), on_stream=heard, raise_errors=False
    )
    reports = {}
    for out in outputs:
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(harness.MARK)]
        reports[out.rank] = json.loads(lines[-1][len(harness.MARK) :]) if lines else None
        if reports[out.rank] is None:
            reports[out.rank] = {
                "rank": out.rank,
                "lost": out.exc_type or "no report",
                "note": out.note,
                "phase": phases.get(out.rank, "starting"),
            }
    return reports


#: The longest a check may run while its ranks keep printing their phases (a loop in the learner's code that
#: prints forever); a check on a 2-core machine takes seconds.
MAX_CHECK_S = 600.0


def stall_s(timeout_s: float) -> float:
    """How long the ranks may print no phase before the check is stopped: twice a collective's timeout (a phase
    that waits out a timed-out collective, then the peer's) plus 30 s for a rank's own slowness."""
    return 2 * timeout_s + 30


# ------------------------------------------------------------------------------------------ verdicts
def _problem(name: str, reports: dict, timeout_s: float, describe, like: str | None = None) -> str | None:
    """Step 3's first checks, shared by stages and hooks: raised, hung, then the ranks' own finding."""
    trouble = _trouble(name, reports, timeout_s, like)
    if trouble:
        return trouble
    first = reports[min(reports)]
    return f"✗ {name}: " + describe(first["finding"], first) if first.get("finding") else None


def _stage_verdict(
    name: str, like: str | None, reports: dict, timeout_s: float, cap: float, also: dict | None = None
) -> Verdict:
    """The verdict on one check's reports; ``also``: a report of the second check (on more ranks), which passed."""
    first = reports[min(reports)]
    problem = _problem(name, reports, timeout_s, lambda f, report: _stage_finding(f, report, like), like)
    counts = None if problem else _counts_problem(first, like, cap)
    if problem or counts:
        return Verdict(False, problem or f"✗ {name}: " + counts, reports)
    tensors = f" (the checker's network: {first['tensors']} parameter tensors)" if first.get("tensors") else ""
    again = _again_text(also)
    d_single = first.get("max_diff", [float("nan")])[0]  # torch's DDP's distance is not judged: not named
    calls = calls_text(first["kinds"][-1]) if first.get("kinds") else "no collective calls"
    same = f", as '{like}' makes" if like else ""
    flight = first["in_flight"][-1] if first.get("in_flight") else 0
    travelled = (
        (
            f"; {flight} of them started and not yet waited for when backward computed its last gradient"
            + (f", as in '{like}'" if like else "")
        )
        if flight
        else ""
    )
    return Verdict(
        True,
        (
            f"✓ {name}: after {first['checked_steps']} steps of {first['accum']} micro-batches "
            f"on {first['world']} ranks "
            f"the parameters{tensors} match a single process on the global batch (largest difference {d_single:.1e})"
            f"{again}; {calls} per step{same}{travelled}"
        ),
        reports,
    )


def _hook_verdict(like: str, reports: dict, timeout_s: float, also: dict | None = None) -> Verdict:
    problem = _problem(f"{like} hook", reports, timeout_s, _hook_finding, like)
    if problem:
        return Verdict(False, problem, reports)
    first = reports[min(reports)]
    mine = first["probe"]
    _, d_torch = first["max_diff"]  # [single process, torch's DDP]: the verdict names the second alone
    steps = first["checked_steps"]
    return Verdict(
        True,
        (
            f"✓ {like} hook: on {first['world']} ranks, it averages a bucket of {mine['numel']} random values with "
            f"relative error {mine['relative_error']:.1e}, within the {first['error_bound']:.1e} that rounding_bound "
            "gives for these values, with a payload of "
            f"{mine['bytes'] / mine['numel']:.0f} bytes per value, returning before its all_reduce was waited for; "
            + (
                f"gradients of about {first['large_gradient']:.0f}, whose undivided float16 sum overflows, came back "
                "finite; "
                if first.get("large_gradient")
                else ""
            )
            + f"over {steps} step{'s' if steps != 1 else ''} of the checker's "
            + (f"{first['net_params']}-parameter " if first.get("net_params") else "")
            + "network in the bucket-async stage the ranks' parameters were equal bit for bit after every step; "
            f"their largest difference from torch's DDP with torch's {like} hook (shown, not judged) was {d_torch:.1e}"
            + (
                f". On {also['world']} ranks, over {also['checked_steps']} step"
                f"{'s' if also['checked_steps'] != 1 else ''}, it passed these checks again; the "
                f"difference above is the {first['world']}-rank run's"
                if also
                else ""
            )
            + "."
        ),
        reports,
    )


def _trouble(name: str, reports: dict, timeout_s: float, like: str | None = None) -> str | None:
    """Step 3's first two checks: a rank that raised, a rank that hung (or gave no report)."""
    lost = [r for r, rep in reports.items() if "lost" in rep]
    errors = {r: rep["error"] for r, rep in reports.items() if rep.get("error")}
    raised = {r: e for r, e in errors.items() if not e["waiting"]}
    if raised:
        r = min(raised)
        e = raised[r]
        ranks = _ranks_text(sorted(raised))
        where = _where_text(e)
        message = _BACKEND_PREFIX.sub("", e["message"] or "").strip() or "(no message)"
        hint = _raise_hint(
            like, where, message, e.get("sizes"), reports[r].get("world"), e.get("launched"), phase=e.get("phase", "")
        )
        return f"✗ {name}: your code raised {e['type']}{where} on {ranks}, while {e['phase']}: {message}" + hint
    if errors or lost:
        stuck = {r: e for r, e in errors.items() if e.get("where")}
        others = {r: e for r, e in errors.items() if r not in stuck}
        if stuck:
            parts = [f"rank {r} waited {timeout_s:.0f} s{_where_text(e)} while {e['phase']}" for r, e in stuck.items()]
            gone = "; ".join(f"rank {r} had gone on to {e['phase']}" for r, e in others.items())
            if not others and not lost and len({_where_text(e) for e in stuck.values()}) == 1:
                return (
                    f"✗ {name}: a rank hung: {'; '.join(parts)}: every rank made this collective and none finished "
                    "it, so its arguments do not match across the ranks (a src or dst that differs between the "
                    "ranks, such as src=rank, or tensors of different sizes); every rank must pass the same ones"
                )
            return (
                f"✗ {name}: a rank hung: {'; '.join(parts)}, in a collective that not every rank made"
                f"{' (' + gone + ')' if gone else ''}; every rank must make the same collectives in the same order"
            )
        if lost:
            where = "; ".join(f"rank {r} while {reports[r].get('phase', 'starting')}" for r in lost)
            return (
                f"✗ {name}: a rank hung and had to be stopped (no progress for {stall_s(timeout_s):.0f} s: {where}); "
                "a wait that nothing ends, such as a Future that is never completed or a loop that never stops"
            )
        phases = "; ".join(f"rank {r} while {e['phase']}" for r, e in errors.items())
        return f"✗ {name}: a rank hung: {phases} (a collective timed out after {timeout_s:.0f} s)"
    return None


#: Why a gradient set to ``dist.all_reduce(...)``'s result is None, and the fix.
ALL_REDUCE_RETURNS_NONE = (
    "dist.all_reduce returns None, not the sum: it sums in place into the tensor it is handed; call it without "
    "keeping its result"
)

#: The prefix a backend's own check puts before its message (``[rank0]:[F1129 12:13:27.65 ProcessGroupGloo.cpp:1537]``).
_BACKEND_PREFIX = re.compile(r"^(\[rank\d+\]:)?\[[A-Z]\d{4} [\d:.]+ [^\]]+\]\s*")


#: Asked of the notebook's rank 0: each name in its namespace, and the module it names (None: not a module).
_ASK_NAMES = (
    "{k: v.__name__ if type(v).__name__ == 'module' else None"
    " for k, v in list(globals().items()) if not k.startswith('_')}"
)


def rank_names() -> dict[str, str | None]:
    """The names the notebook's own ranks have, each with the module it names (or None): every name in rank 0's
    namespace while ``%dist_init``'s cluster runs (the runner's and those its cells set), else the runner's alone."""
    from minddp.notebook.worker import RUNNER_MODULES, RUNNER_NAMES  # here: the kernel's side needs no IPython before

    names = {name: RUNNER_MODULES.get(name) for name in RUNNER_NAMES}
    try:
        from minddp.notebook.magics import current_cluster

        cluster = current_cluster()
        if cluster is not None and cluster.running:
            reply = cluster.run(_ASK_NAMES, ranks=[0], timeout_s=10.0, raise_errors=False)[0]
            names.update(reply.value if reply.ok and isinstance(reply.value, dict) else {})
    except Exception:  # noqa: BLE001 - a hint must never turn a verdict into a crash; the runner's names remain
        pass
    return names


#: The names a notebook conventionally gives a module it imports (``import torch.nn as nn``), beside the
#: standard library's own modules, which are imported under their names.
MODULE_ALIASES = {"nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy", "plt": "matplotlib.pyplot"}


def importable(name: str) -> str | None:
    """The module a missing ``name`` most likely was (``nn``: ``torch.nn``; ``functools``), or None."""
    return MODULE_ALIASES.get(name) or (name if name in sys.stdlib_module_names else None)


def _raise_hint(
    like: str | None,
    where: str,
    message: str,
    sizes: dict | None,
    world: int | None,
    launched: list | None = None,
    phase: str = "",
) -> str:
    """What to do about an error that a model answer's step prevents (notebook 06: the padding, the piece's size,
    the padding cut off), from the sizes the refused collective was handed, or the padding the transport gave the
    tensor it copies back (``sizes``, the rank's :class:`~harness.Events`), or the kinds of collective the step had
    launched when it raised (``launched``, the same Events': an all_reduce before a None is likely its result), and
    what the rank was doing then (``phase``, the harness's words: finish's write into a parameter is not a
    broadcast's)."""
    # a tensor the transport made without a device met one it was handed (torch.cat, copy_): DevicelessTensor's
    # own message says it where a collective was handed one
    if like in TRANSPORT_MESSAGES and re.search(r"\bmeta\b", message) and harness.DEVICELESS not in message:
        return f" ({harness.DEVICELESS})"
    if re.search(r"\bAVG\b", message) and like in TRANSPORT_MESSAGES:
        return f" (this backend has no ReduceOp.AVG, and your transport needs none: {HOOK_DIVIDED})"
    # a broadcast (or copy_) into a parameter outside torch.no_grad(): autograd refuses an in-place write into a leaf
    # that requires grad (torch 2.13's gloo broadcast writes without asking autograd; other builds refuse)
    if "a leaf Variable that requires grad is being used in an in-place operation" in message:
        # in finish, nothing is broadcast: the averages went into a parameter where its .grad was meant (a bucket's
        # parameters kept instead of their gradient tensors), which torch.no_grad() would only hide
        if phase.startswith("running finish_gradient_synchronization()"):
            return (
                " (finish wrote in place into a parameter, which autograd refuses for a leaf that requires grad: "
                "the averages belong in the gradients, each parameter's .grad; keep the gradient tensors, "
                "[p.grad for p in bucket], not the parameters, and write back into those)"
            )
        return (
            " (a parameter requires grad, so autograd refuses to let anything write into it in place, as a "
            "broadcast or a copy_ does: write rank 0's values under torch.no_grad(), with torch.no_grad(): "
            "dist.broadcast(tensor, src=0))"
        )
    if found := re.search(r"'NoneType' object has no attribute '(get_future|then|wait|value)'", message):
        # a Work's .wait() is all a stage that waits in finish needs; only .then/.value belong to its Future
        keep = (
            "keep the Work it returns and call its .wait()"
            if found[1] == "wait"
            else ("take its Future with .get_future()")
        )
        return (
            " (dist.all_reduce returned None: without async_op=True it blocks until the sum is done and returns "
            f"nothing; pass async_op=True and {keep})"
        )
    # the stage's forward ran the module but returned nothing: the checker's loss (cross_entropy) got None
    if re.search(r"argument 'input' \(position 1\) must be Tensor, not NoneType", message):
        return (
            " (your forward returned None: return the module's output, return self.module(*inputs, **kwargs), "
            "so that the loss can be computed from it)"
        )
    # p.grad = dist.all_reduce(p.grad): every gradient of the checker's network is set after backward, so another
    # None in a plain stage (the forward's is above) is the all_reduce's result
    if like in ("simple", "ga") and "NoneType" in message:
        return f" ({ALL_REDUCE_RETURNS_NONE})"
    # x = dist.all_reduce(x) in a grad hook, then x /= n: the step had launched an all_reduce before it met None. A
    # grad hook registered with register_hook meets None (its .grad, below) before it launches any
    if (
        like in ("hook", "hook-async", "bucket", "bucket-async")
        and "NoneType" in message
        and "all_reduce" in (launched or ())
    ):
        return f" ({ALL_REDUCE_RETURNS_NONE})"
    if re.search(r"Work' object has no attribute '(then|value|add_done_callback)'", message):
        return (
            " (dist.all_reduce(..., async_op=True) returned a Work, not a Future: take its Future with "
            ".get_future(), then call .then(...) on that)"
        )
    # .then(lambda f: f.value().float()): the callback treats the Future's value as the tensor it holds
    if like in solutions.HOOKS and re.search(r"'list' object has no attribute", message):
        return (
            " (all_reduce's Future holds a list, so take its one tensor with fut.value()[0] before casting or "
            "dividing it: .then(lambda fut: fut.value()[0] ...))"
        )
    # notebook 04's n = world_size is set on its ranks (a %%rank cell): a hook defined in the kernel has no n either
    if like in solutions.HOOKS and re.search(r"name 'n' is not defined", message):
        return (
            " (your hook runs on the checker's ranks with your notebook kernel's names, and the kernel has no n: the "
            "notebook's n = world_size was set on its own ranks, in a %%rank cell; ask "
            "dist.get_world_size(process_group))"
        )
    # any name the notebook's own ranks have and the kernel lacks: the runner's (world_size, rank, ...) or one their
    # %%distributed cells set (06's `ring, world = ...`, 10's `chains`)
    missing = re.search(r"name '(\w+)' is not defined", message)
    if missing and missing[1] not in (names := rank_names()) and (module := importable(missing[1])):
        return (
            " (your code runs on the checker's ranks with your notebook kernel's names, and the kernel never imported "
            f"{missing[1]}: import {module}{'' if module == missing[1] else ' as ' + missing[1]} in the cell that "
            "defines your function)"
        )
    if missing and missing[1] in names:
        from minddp.notebook.worker import RUNNER_NAMES

        name, group = missing[1], "process_group" if like in solutions.HOOKS else "group" if like == "halves" else ""
        ask = (
            f"import {names[name]}{'' if names[name] == name else ' as ' + name} in the cell that defines your function"
            if names[name]
            else f"ask dist.get_world_size({group}) and dist.get_rank({group})"
            if name in ("world_size", "world", "rank")
            else "set it in a cell without %%distributed, or inside your function"
        )
        return (
            " (your code runs on the checker's ranks with your notebook kernel's names, and the kernel has no "
            f"{name}: that name exists only on the notebook's own ranks, "
            + ("given to each by %dist_init" if name in RUNNER_NAMES else "in its %%distributed cells")
            + f"; {ask})"
        )
    if like in solutions.HOOKS and re.search(r"'NoneType' object has no attribute '(size|rank)'", message):
        return (
            " (the hook's state, process_group, is None here: None means the default group, and has no .size() or "
            ".rank(); ask dist.get_world_size(process_group), which takes None)"
        )
    if re.search(r"\bAVG\b", message):  # gloo on torch 2.6 refuses ReduceOp.AVG (docs/torch-versions.md)
        # an fp16 hook must divide before the sum (its float16 sum can overflow); a float32 stage may divide either side
        when = "before the sum" if like in solutions.HOOKS else "before the all_reduce or after it"
        return (
            " (this backend has no ReduceOp.AVG: keep the default ReduceOp.SUM and divide by "
            f"dist.get_world_size(group) yourself, {when})"
        )
    # a grad hook registered with register_hook: param.grad is the incoming gradient's .grad, None (the message's
    # first line, torch's type check of the all_reduce's tensor, or None in arithmetic)
    no_tensor = re.search(r"NoneType|Expected parameter `tensor` of type torch\.Tensor", message)
    if like in ("hook", "hook-async", "bucket", "bucket-async") and no_tensor:
        return (
            " (a gradient that is None: register_hook hands a grad hook the incoming gradient, a tensor whose .grad "
            "is None; register_post_accumulate_grad_hook hands it the parameter, whose .grad is the accumulated "
            "gradient)"
        )
    bucketed = like in ("bucket", "bucket-async")
    # gradients of different shapes joined by torch.cat as they are: a weight's 2-D gradient beside a bias's 1-D one
    if bucketed and re.search(r"must have same number of dimensions|Sizes of tensors must match except", message):
        return (
            " (torch.cat joins tensors along their first dimension, so their other dimensions must agree: flatten "
            "each gradient as you join them, torch.cat([g.reshape(-1) for g in grads]))"
        )
    # a 1-D slice copied into a gradient of more dimensions: copy_ broadcasts it along the gradient's last dimension,
    # so torch names a dimension after the first
    if bucketed and re.search(r"must match the size of tensor b \(\d+\) at non-singleton dimension [1-9]", message):
        return (
            " (a slice of the flat buffer is 1-D and this gradient is not: shape the slice as its gradient when you "
            "copy it back, grad.copy_(piece.view_as(grad)))"
        )
    # a bucket's flat buffer split back into its gradients in another order than torch.cat joined them
    if bucketed and re.search(r"is invalid for input of size|must match the size", message):
        return (
            " (a slice of the flat buffer was written into a gradient of another size: split the flat buffer with "
            "the gradients' sizes in the order torch.cat joined them, and pair each slice with the gradient it came "
            "from, zip(grads, flat.split([g.numel() for g in grads])))"
        )
    # the checker's tensor of more dimensions (harness.SHAPED) padded as handed, not flattened: F.pad pads its last
    # dimension, and gloo's collectives cut the first (they refuse it), or, where a backend accepts it, the copy back
    # meets a sum of another shape. Named before the hints below, whose fixes (pad to a multiple of the world size,
    # cut the padding off, view_as) the learner may well have written already
    unflat = sizes.get("shape") if like == "halves" and sizes else None
    if unflat and len(unflat) > 1:
        return (
            f" (the tensor was padded as it was handed, {' × '.join(map(str, unflat))}, without being flattened: "
            "F.pad pads the last dimension, but the collectives and padded[: tensor.numel()] cut the first; flatten "
            "it first, flat = tensor.reshape(-1), and pad flat)"
        )
    # a transport's flat sum copied into the checker's tensor of more dimensions (harness.SHAPED) without its shape,
    # by copy_ ("size of tensor b") or by slice assignment, tensor[:] = ... ("the existing size"); the sum with its
    # padding still on (the padded length) is left to the copy-back hint below
    unshaped = re.search(
        r"must match the (?:size of tensor b|existing size) \((\d+)\) at non-singleton dimension [1-9]", message
    )
    if like == "halves" and unshaped and not (sizes and int(unshaped.group(1)) == sizes.get("padded")):
        return (
            " (the sum is flat and the tensor you were handed is not: copy_ and slice assignment broadcast a 1-D "
            "tensor along the last dimension only; shape the sum as the tensor, "
            "tensor.copy_(padded[: flat.numel()].view_as(tensor)))"
        )
    copy_back = like == "halves" and sizes and sizes["kind"] == "copy_back" and re.search(r"shape|size", message, re.I)
    if copy_back and world and f"({sizes['padded'] // world})" in message and f"({sizes['padded']})" not in message:
        return (
            f" (this rank's piece of the sum, {sizes['padded'] // world} elements, was copied back where the whole "
            f"sum belongs, {sizes['handed']} elements: the piece is 1/{world} of it; all-gather the pieces into the "
            "padded tensor, all_gather_single(padded, piece, group=group), and copy that back without its padding)"
        )
    if copy_back:
        return (
            f" (the sum was copied back with its padding: the padded tensor holds {sizes['padded']} elements, the "
            f"tensor you were handed {sizes['handed']}; cut the padding off first, padded[: tensor.numel()], then "
            "view it as the tensor)"
        )
    collective = "reduce_scatter_single" in where or "all_gather_single" in where
    if like != "halves" or not collective or not re.search(r"shape|size|divisib|check failed", message, re.I):
        return ""
    pad = (
        "both collectives want the flattened tensor's length to be a multiple of the world size: pad it first, then "
        "cut the padding off when you copy the sum back)"
    )
    if not (sizes and world):
        return " (" + pad
    # the whole (padded) tensor is a reduce-scatter's input and an all-gather's output; the piece, the other one
    scatter = sizes["kind"] == "reduce_scatter"
    whole, piece = (sizes["input"], sizes["output"]) if scatter else (sizes["output"], sizes["input"])
    m = sizes.get("handed")  # the bucket's own length, where the transport was handed one
    if piece > whole:  # a reduce-scatter's output (an all-gather's input) is the smaller one: the order is wrong
        call = "reduce_scatter_single(piece, padded)" if scatter else "all_gather_single(padded, piece)"
        return (
            f" (the arguments are swapped: the piece, {whole} elements, went where the padded tensor goes and the "
            f"padded tensor, {piece} elements, where the piece goes: each call takes (output, input), so {call})"
        )
    if whole % world:
        # a tensor of more dimensions padded by one of its dimensions, -tensor.size(0) % n, not by its length: the
        # same on the flat buckets; a wrong sign too where the buckets before were padded with the right one
        dims = sizes.get("handed_shape") or ()
        ends = (("first", dims[0]), ("last", dims[-1])) if len(dims) > 1 else ()
        by = [f"{w} dimension ({d})" for w, d in ends if whole == m + -d % world]
        if by:
            signed = any(b != a + a % world for a, b in sizes.get("padded_before") or [])
            return (
                f" (the tensor of {' × '.join(map(str, dims))}, {m} elements, was padded by {whole - m} to {whole}, "
                f"-size % world_size of its {' or '.join(dict.fromkeys(by))}"
                + ("" if signed or whole != m + m % world else ", or by numel % world_size, the sign wrong")
                + f": pad the flattened tensor by -numel % world_size, {-m % world} here, to {m + -m % world})"
            )
        if m is not None and whole == m + m % world != m + -m % world:
            return (
                f" (the bucket, {m} elements, was padded by {m % world} to {whole}, numel % world_size: the sign is "
                f"wrong; pad by -numel % world_size, {-m % world} here, to {m + -m % world}; on 2 ranks the two are "
                "always equal, so only a world size other than 2 tells them apart)"
            )
        # padded to a multiple of 2: this bucket (made even), or an earlier one, where this one was even already
        before = sizes.get("padded_before") or []
        even = before if all(b == a + -a % 2 for a, b in before) else []
        if m is not None and world != 2 and whole == m + -m % 2 and (whole != m or any(b != a for a, b in even)):
            a, b = (m, whole) if whole != m else next((a, b) for a, b in even if b != a)
            this = f"the bucket of {a} elements was padded to {b}" + (
                "" if whole != m else f" and this one, {m} elements, already even, was left as it is"
            )
            return (
                f" ({this}: padded to a multiple of 2, not of the world size, {world}: a hard-coded 2 in the padding; "
                "take n = dist.get_world_size(group) and pad by -numel % n)"
            )
        if not scatter and m is not None and whole == m and piece * world == m + -m % world:
            return (
                f" (the all-gather's output is the unpadded tensor, {whole} elements, while the {world} pieces fill "
                f"{piece * world}, the padded length: gather into the padded tensor, the one you reduce-scattered, "
                f"then copy its first {m} elements back)"
            )
        return f" (the tensor handed over, {whole} elements, is not a multiple of the world size, {world}: " + pad
    if world != 2 and piece == whole // 2:
        return (
            f" (the piece is {piece} elements, {whole} // 2, where each rank's piece of {whole} on {world} ranks is "
            f"{whole // world}: a hard-coded 2; divide by n = dist.get_world_size(group))"
        )
    return (
        f" (the padded tensor, {whole} elements, is a multiple of the world size, {world}: the piece is the wrong "
        f"size, {piece} elements where each rank's piece of {whole} is {whole // world}: make it "
        "padded.numel() // world_size long, from the padded length, not the tensor's own)"
    )


def _where_text(error: dict) -> str:
    where = error.get("where")
    if not where:
        return ""
    text = (where.get("text") or linecache.getline(where["file"], where["line"])).strip()
    code = f": `{text}`" if text else ""
    return f" in {where['function']} (line {where['line']}{code})"


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _names_text(names: list[str], total: int | None = None) -> str:
    if total is not None and len(names) == total and total > 2:
        return f"all {total} parameter tensors"
    shown = ", ".join(f"'{n}'" for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


#: Gradient findings: the kind -> what it means and what to do.
GRADIENT_MESSAGES = {
    "local": "gradients were not synchronized: after finish_gradient_synchronization() each rank still holds the "
    "gradient of its own shard ({names}); all_reduce them across ranks",
    "summed": "gradients were summed, not averaged ({names}): all_reduce sums over ranks; divide by the world size "
    "({world}), before the all_reduce or after it (forgot the division; or divided into a new tensor: "
    "p.grad / world_size makes one and leaves p.grad as it was: divide in place, p.grad /= world_size)",
    "divided_twice": "gradients were divided by the world size twice ({names}): divide once, before the all_reduce or "
    "after it, not both",
    "divided_by_accum": "gradients were divided by the number of micro-batches as well as by the world size "
    "({names}): each micro-batch's loss was already divided by it before backward (train_step), so .grad holds the "
    "step's mean already; divide by the world size only",
    "unsummed": "gradients were divided by the world size but never summed over ranks ({names}): the sum went "
    "into a copy that was never written back; copy the summed result into .grad",
    "incoming": "the incoming gradient of the last micro-batch was synced rather than the accumulated .grad "
    "({names}): the earlier micro-batches' part stayed local; sync param.grad once it holds every "
    "micro-batch (register_post_accumulate_grad_hook), not the gradient a tensor hook receives",
    "incoming_only": "the incoming gradient of the last micro-batch was synced rather than the accumulated .grad, "
    "and written over it ({names}): the earlier micro-batches were lost; sync param.grad once it "
    "holds every micro-batch (register_post_accumulate_grad_hook)",
    "incoming_summed": "the incoming gradient of the last micro-batch was synced (and summed, not averaged) "
    "rather than the accumulated .grad ({names}); sync param.grad after accumulation and divide "
    "by the world size",
    "last_only": "only the last micro-batch's gradient is left ({names}): the earlier micro-batches' gradients "
    "were dropped; let autograd accumulate into .grad and sync that once",
    "sent_early": "a bucket was sent before its last gradient was in ({names}): these gradients were averaged as "
    "they stood before the last backward added to them, and that backward then added this rank's own part on top; "
    "send a bucket at its last gradient, when the count of gradients it still waits for reaches 0",
    "sent_early_overwritten": "a bucket was sent before its last gradient was in ({names}): its flat copy held these "
    "gradients as they stood before the last backward added to them, and writing the average back replaced what that "
    "backward added; send a bucket at its last gradient, when the count of gradients it still waits for reaches 0",
    "none": "{names} had no gradient after finish_gradient_synchronization() (.grad is None; if it was set to an "
    f"all_reduce's result: {ALL_REDUCE_RETURNS_NONE})",
    "divided_unsynced": "finish_gradient_synchronization() divided the gradients after backwards that did not sync "
    "({names}): it runs after every micro-batch, the no_sync() ones too, where nothing was sent; divide only what "
    "you sent (the gradients in your list of works), or divide before the send",
}


#: Gradient findings as a per-gradient hook stage means them, by ``like``: its grad hook runs in every backward, the
#: no_sync() ones too, so a division there outside the flag's test gives the same gradients as one in every finish.
HOOK_MESSAGES = {
    "hook": {
        "divided_unsynced": "your stage divided the gradients after backwards that did not sync ({names}): a grad "
        "hook runs in every backward, the no_sync() ones too, where nothing was sent; divide only what you sent, "
        "inside `if self.sync_this_backward:`, after the all_reduce",
    },
    "hook-async": {
        "divided_unsynced": "your stage divided the gradients after backwards that did not sync ({names}): a grad "
        "hook runs in every backward and finish after every one, the no_sync() ones too, where nothing was sent; "
        "divide only what you sent: in the grad hook, inside `if self.sync_this_backward:`, before the send, or in "
        "finish only the gradients in your list of works",
    },
}

#: Why a transport only sums, and what to pass its reduce-scatter (the verdicts on an average in a transport).
HOOK_DIVIDED = "allreduce_hook divided each bucket before it handed it over; keep the default ReduceOp.SUM"

#: Gradient findings as a transport exercise means them, by ``like``: there the hook (``allreduce_hook``) divides
#: each bucket before it hands it to the learner's function, which only sums ``tensor`` in place.
TRANSPORT_MESSAGES = {
    "halves": {
        "unsummed": "the buckets came back divided by the world size but not summed over ranks ({names}): your "
        "transport (my_all_reduce) left the sum out of the tensor it was handed; write it into that tensor in "
        "place, tensor.copy_(...) (rebinding the name or returning the sum does not reach the caller)",
        "divided_twice": "gradients were divided by the world size twice ({names}): allreduce_hook divides each "
        "bucket before it hands it to your transport (my_all_reduce), which must only sum: take the division "
        "out of it",
    }
}


def _stage_finding(f: dict, report: dict, like: str | None = None) -> str:
    world = report["world"]
    if f["kind"] == "broadcast":
        whose = _ranks_text(f["ranks"])
        if 0 in f["ranks"]:
            return (
                f"after __init__, {whose} do not hold rank 0's initial parameters ({_names_text(f['names'])}): "
                "broadcast from rank 0 (src=0), whose weights every rank must start from"
            )
        return (
            f"the broadcast is missing: after __init__, {whose} still holds its own initial parameters "
            f"({_names_text(f['names'])}), not rank 0's: broadcast every parameter and buffer from rank 0"
        )
    if f["kind"] == "broadcast_copy":
        whose, none = _ranks_text(f["ranks"]), "none" if f["stray"] == f["made"] else f"{f['stray']} not"
        return (
            f"the broadcasts in __init__ went into copies: {whose} made {f['made']} broadcasts, {none} into the "
            f"module's own tensors, and still holds its own initial parameters ({_names_text(f['names'])}): "
            "p.data.clone() or p.clone() is a new tensor, and rank 0's values land there; broadcast each parameter "
            "and buffer itself, in place (under torch.no_grad())"
        )
    if f["kind"] == "buffers":
        return (
            f"the buffers were not broadcast: after __init__, {_ranks_text(f['ranks'])} holds its own "
            f"{_names_text(f['names'])}: broadcast module.buffers() from rank 0 too"
        )
    if f["kind"] == "no_gradient":
        return (
            f"your finish_gradient_synchronization() raised {f['error']} on a parameter with no gradient "
            f"('{f['names'][0]}', whose .grad the checker set to None after backward): a parameter the loss does not "
            "reach in a step (unused by the forward, or frozen) has .grad None; skip it (if p.grad is not None)"
        )
    if f["kind"] == "parameters":
        value, name = f["largest"]
        return (
            f"parameters differ from a single process on the global batch after step {f['step']} "
            f"(largest difference {value:.2g} in '{name}'), although every gradient was the average"
        )
    if f["kind"] == "never_waited" and like in TRANSPORT_MESSAGES:
        unwaited, launched = sum(f["unwaited"].values()), sum(f["launched"].values())
        which = f"all {launched}" if unwaited == launched else f"{unwaited} of the {launched}"
        return (
            f"{which} collectives your transport (my_all_reduce) started in step {f['step']} "
            f"({calls_text(f['launched'])}) were never waited for before it returned: with async_op=True a "
            "collective runs on while your code goes on, so the all-gather may send a piece not yet summed and the "
            "copy may read a tensor not yet gathered, and a run passes or fails by a race; the transport must "
            "return with the sum in tensor (the Wire hands the hook a finished Future at once, so no later wait is "
            "for them): call .wait() on the reduce-scatter's work before the all-gather and on the all-gather's "
            "before the copy, or leave async_op out"
        )
    if f["kind"] == "never_waited":
        unwaited = sum(f["unwaited"].values())
        fix = "wait() for every one in finish_gradient_synchronization(), then divide and write back"
        if like in ("hook", "bucket"):  # the rungs that wait inside the grad hook: waiting in finish is the next rung
            fix = (
                f"'{like}' waits for each one inside the grad hook, right after starting it, then divides: wait there "
                "(or leave async_op out); keeping them in flight until finish is the next rung, the async one"
            )
        return (
            f"{unwaited} of the {calls_text(f['launched'])} started in step {f['step']} were never waited for (by the "
            "end of its last finish_gradient_synchronization(), no wait() on them or on their Futures): each sum "
            "lands in its tensor whenever the network delivers it, before or after optimizer.step() reads .grad, so "
            f"a run passes or fails by a race; {fix}"
        )
    if f["kind"] == "waited_again":
        return (
            f"finish_gradient_synchronization() in step {f['step']} waited again for {calls_text(f['waited_again'])} "
            f"started in step {f['step'] - 1} or before: the list of messages in flight was never emptied, so it "
            "grows every step and each finish goes over every earlier step's messages again (dividing or writing "
            "back gradients once more); empty it after the waits (self.in_flight.clear())"
        )
    if f["kind"] == "written_in_flight":
        kind, op = f["written"][0]
        return (
            f"in step {f['step']} your stage wrote into a tensor ({op}) while its {kind} was still in flight: "
            "launched with async_op=True and not yet waited for, so the network may read it before or after your "
            "write, or write the sum over it, and a run passes or fails by a race; divide before the launch or after "
            "the wait(), never between"
        )
    if f["kind"] == "read_in_flight":
        return _read_in_flight_text(f)
    if f["kind"] == "reopened":
        return (
            "a no_sync() inside a no_sync() turned the sync back on when the inner block ended "
            "(require_backward_grad_sync is True inside the outer block), so the outer block's micro-batches would "
            "sync: when the block ends, restore the value the flag had before it (before = "
            "self.require_backward_grad_sync ... finally: self.require_backward_grad_sync = before), as torch does"
        )
    if f["kind"] == "not_restored_on_error":
        return (
            "an exception raised inside a no_sync() block left the sync off after it "
            "(require_backward_grad_sync is still False), so every later backward would skip the sync: restore the "
            "flag in a finally (try: yield finally: self.require_backward_grad_sync = before), as torch does"
        )
    if f["kind"] == "shaped_sum":
        return (
            f"your transport summed the flat buckets right, but not a tensor of {f['shape']} values (each rank's "
            "arange * (rank + 1)): a transport is handed any tensor; flatten it, and write the sum back in its shape"
        )
    if f["kind"] == "left_off":
        return (
            f"no_sync() left the sync off after its with-block, so the last micro-batch of step {f['step']} did "
            "not sync either (require_backward_grad_sync is still False): set it back to what it was when the "
            "block ends (in a finally)"
        )
    names = _names_text(f["names"], f.get("n_params"))
    at = f" at step {f['step']}" + (f" on {_ranks_text(f['ranks'])}" if len(f["ranks"]) < world else "")
    kinds = report.get("kinds") or []
    if f.get("gathered_first") and like in TRANSPORT_MESSAGES:  # the order of its calls, whatever the sums came to
        return (
            f"the buckets came back wrong{at} ({names}): your transport (my_all_reduce) all-gathered before it "
            "reduce-scattered, so the all-gather wrote pieces nobody had summed yet over the padded tensor, and the "
            "reduce-scatter then summed those; reduce-scatter first, reduce_scatter_single(piece, padded, "
            "group=group), to leave this rank's piece of the sum in piece, then all_gather_single(padded, piece, "
            "group=group)"
        )
    if f.get("pad_misplaced") and like in TRANSPORT_MESSAGES:  # where it padded and where it cut, from its tensors
        end, handed, padded = f["pad_misplaced"]
        pad = padded - handed
        cut = "end" if end == "front" else "front"
        elements = "element" if pad == 1 else "elements"
        return (
            f"the buckets came back shifted{at} ({names}): your transport (my_all_reduce) padded the bucket of "
            f"{handed} elements at its {end}, to {padded}, and cut {pad} {elements} off its {cut}, so what it copied "
            f"back holds {pad} padding {elements} at its {end} and lacks {pad} {elements} of the sum at its {cut}; "
            "pad and cut at the same end: pad at the end, F.pad(flat, (0, -flat.numel() % n)), and copy back "
            "padded[: flat.numel()]"
        )
    if f["kind"] == "reduced_parameters":
        sender = (
            "your grad hook (inside backward)"
            if f.get("in") == ["backward"]
            else "finish_gradient_synchronization()"
            if f.get("in", ["finish"]) == ["finish"]
            else "your stage (from its grad hook and from finish)"
        )
        return (
            f"{sender} sent the parameters themselves ({names}){at}, not their "
            "gradients: a collective was handed the parameter (dist.all_reduce(param)), so .grad kept each rank's own "
            "gradient; all_reduce param.grad and divide it, and leave the parameters to optimizer.step()"
        )
    if f["kind"] == "resent":  # sent from grad hooks (harness.resent_finding)
        again = ", ".join(f"'{name}' {n} times" for name, n in f["again"].items())
        return (
            f"every sum of step {f['step']} went to one gradient ({again}); {names} were never sent: each grad hook "
            "synced one parameter, not the one it was handed: a lambda made in a loop (lambda _: self._grad_ready(p)) "
            "reads p when it runs, after the loop has ended, so every hook gets the loop's last parameter; use the "
            "parameter the hook is handed (register_post_accumulate_grad_hook(self._grad_ready)), or bind it when "
            "the lambda is made (lambda _, p=p: self._grad_ready(p))"
        )
    if f["kind"] == "local" and 1 < f["step"] <= len(kinds) and kinds[0] and not kinds[f["step"] - 1]:
        return (
            f"gradients were not synchronized{at} ({names}): step {f['step']} started no collective at all, where "
            "step 1 did: your stage keeps something from one step to the next that was not reset (a bucket's count "
            "of the gradients it still waits for, a list, a flag): set it back when the bucket is sent"
        )
    if f["kind"] == "local" and f["step"] <= len(kinds) and kinds[f["step"] - 1]:
        return (
            f"the sums never reached .grad{at} ({names}): your stage made {calls_text(kinds[f['step'] - 1])} in "
            f"step {f['step']}, but after finish_gradient_synchronization() each rank still holds the gradient of its "
            "own shard: the sums went into tensors that never reached .grad (param.grad / n, or a clone, is a new "
            "tensor; so is a bucket's flat copy: the all_reduce summed a copy (torch.cat makes one) that was never "
            "written back); all_reduce .grad itself, in place, or copy each sum back into its .grad "
            "(grad.copy_(piece.view_as(grad)))"
        )
    if f["kind"] == "reduced":
        return (
            f"your stage summed the gradients with dist.reduce{at} ({names}): reduce leaves the sum on its dst rank "
            "alone, the other ranks keep what the backend left in their buffers, so the ranks' gradients differ; "
            "all_reduce leaves the sum on every rank"
        )
    if f["kind"] == "rank0":
        return (
            f"every rank holds rank 0's gradient{at} ({names}): the ranks agree, but on rank 0's shard alone, and the "
            "other ranks' examples count for nothing: a broadcast copies one rank's tensor to the others; all_reduce "
            "sums every rank's, then divide by the world size"
        )
    if f["kind"].startswith(harness.HARD_CODED_KIND):
        divisor = int(f["kind"][len(harness.HARD_CODED_KIND) :])
        return (
            f"gradients were divided by {divisor}, not by the world size ({world}) ({names}): a world size written "
            f"as a number is right on {divisor} ranks only; divide by dist.get_world_size(){at}"
        )
    if f["kind"] == "values":  # .grad holds the parameters' own values: the flat buffer was made of the parameters
        if (like or "").startswith("bucket"):
            return (
                f"your stage flattened the parameters themselves, not their gradients ({names}){at}: each .grad "
                "now holds its parameter's values (their average over ranks): self.buckets[b] holds parameters, so "
                "flatten their gradients, torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])"
            )
        return (
            f"your stage averaged the parameters' values, not their gradients ({names}){at}: each .grad now holds "
            "its parameter's values; all_reduce p.grad, not p"
        )
    if f["kind"] == "other":
        value, name = f["largest"]
        return (
            f"gradients differ from the average over ranks{at} ({names}; largest difference {value:.2g} in "
            f"'{name}') and match none of the usual mistakes"
        )
    missing = _missing_kinds(report, like, f["step"], names, at)
    if missing:
        return missing
    if f["kind"] == "divided_twice" and f.get("op_avg") and like in TRANSPORT_MESSAGES:
        return (
            f"gradients were divided by the world size twice ({names}): your transport passed op=ReduceOp.AVG to "
            f"its reduce-scatter, which divides the sum, and {HOOK_DIVIDED}{at}"
        )
    unsummed = f"the buckets came back divided by the world size but not summed over ranks ({names}): your transport"
    if f["kind"] == "unsummed" and f.get("gathered_apart") and like in TRANSPORT_MESSAGES:
        return (
            f"{unsummed} (my_all_reduce) all-gathered the pieces of the sum into a new tensor, and what it copied into "
            "the tensor it was handed was not that tensor (the padded input still holds this rank's own values): copy "
            f"the all-gather's output, without its padding, into tensor{at}"
        )
    if f["kind"] == "unsummed" and f.get("copied_own") and like in TRANSPORT_MESSAGES:
        return (
            f"{unsummed} (my_all_reduce) copied into tensor values from tensor's own storage (flat, a view of it): "
            "F.pad returns a new tensor, padded, and the sum is there: copy padded, without its padding, into "
            f"tensor{at}"
        )
    if f["kind"] == "sent_early" and like in ("hook", "hook-async"):  # no bucket here: a tensor hook synced .grad
        return (
            f"gradients were synced before the last micro-batch was added into them ({names}): they were averaged as "
            "they stood after the earlier micro-batches, and the last backward then added this rank's own part on "
            "top; a tensor hook (register_hook) runs before autograd adds the incoming gradient into .grad, so sync "
            f"param.grad from register_post_accumulate_grad_hook, which runs after{at}"
        )
    messages = {**GRADIENT_MESSAGES, **HOOK_MESSAGES.get(like, {}), **TRANSPORT_MESSAGES.get(like, {})}
    return messages[f["kind"]].format(names=names, world=world) + at


def _read_in_flight_text(f: dict) -> str:
    """A read of a tensor whose collective was launched and not yet waited for (harness ``read_in_flight``)."""
    kind, op = f["read"][0]
    return (
        f"in step {f['step']} your stage read a tensor ({op}) while its {kind} was still in flight: launched with "
        "async_op=True and not yet waited for, so the read may see this rank's own values or the sum, and a run "
        "passes or fails by a race; wait() for the collective first, then read the tensor (divide, copy back)"
    )


#: A transport exercise's collective left out, by ``like`` and kind: what the gradients lack without it.
MISSING_KINDS = {
    (
        "halves",
        "all_gather",
    ): "the buckets came back wrong{at} ({names}) and your transport (my_all_reduce) made no all-gather "
    "({made}): after reduce_scatter_single each rank holds only its own 1/{world} piece of the sum, the rest of the "
    "padded tensor is still its own values; all_gather_single(padded, piece, group=group) brings every rank's piece "
    "into place before you copy the sum into tensor",
    (
        "halves",
        "reduce_scatter",
    ): "the buckets came back wrong{at} ({names}) and your transport (my_all_reduce) made no "
    "reduce-scatter ({made}): an all-gather only collects pieces, nothing sums them; reduce_scatter_single(piece, "
    "padded, group=group) first, to leave this rank's piece of the sum in piece",
}


def _missing_kinds(report: dict, like: str | None, step: int, names: str, at: str) -> str | None:
    """Wrong gradients from a transport that left out one of the model answer's collectives: named as that."""
    mine, theirs = report.get("kinds") or [], report.get("reference_kinds") or []
    if step > min(len(mine), len(theirs)):
        return None
    made = f"{calls_text(mine[step - 1])}, where '{like}' makes {calls_text(theirs[step - 1])}"
    for kind in sorted(set(theirs[step - 1]) - set(mine[step - 1])):
        if (like, kind) in MISSING_KINDS:
            return MISSING_KINDS[(like, kind)].format(names=names, made=made, world=report["world"], at=at)
    return None


def calls_text(kinds: dict) -> str:
    """``{"all_reduce": 6}`` -> ``6 all_reduce calls``; several kinds joined with "and"."""
    if not kinds:
        return "no collective calls"
    parts = [f"{n} {kind}" for kind, n in sorted(kinds.items())]
    return (" and ".join(parts) if len(parts) > 1 else parts[0]) + (" calls" if sum(kinds.values()) != 1 else " call")


#: What to do when the collectives are of other kinds than the model answer's, by ``like``.
KIND_HINTS = {"halves": "sum each bucket with one reduce_scatter_single, then one all_gather_single"}


def _counts_problem(report: dict, like: str | None, cap: float) -> str | None:
    """The collectives per step (their kinds, number, where they started, what was in flight) against the answer's."""
    ref = report.get("reference_counts")
    mine = report.get("counts")
    if not like or not ref or not mine:
        return None
    k = report["accum"]
    kinds_m, kinds_r = report.get("kinds", []), report.get("reference_kinds", [])
    for step, (m, r) in enumerate(zip(kinds_m, kinds_r), start=1):
        if m.get("broadcast", 0) > r.get("broadcast", 0):  # right gradients (checked before), and traffic on top
            return (
                f"your gradients are right, but your stage also broadcast during the steps: {calls_text(m)} in step "
                f"{step}, where '{like}' makes {calls_text(r)}; broadcast once, in __init__: from the same start, "
                "every rank applies the same average, so the replicas stay equal without another broadcast"
            )
        if set(m) != set(r):
            hint = KIND_HINTS.get(like, "use the collective the model answer uses")
            if (p2p := report.get("p2p", [0] * step)[step - 1]) and not m:  # a transport made of send/recv
                return (
                    f"your stage summed with {p2p} point-to-point messages (send/recv, as minddp's ring makes them), "
                    f"not the backend's collectives: no collective calls in step {step}, where '{like}' makes "
                    f"{calls_text(r)}: {hint}"
                )
            hint += " (not dist.all_reduce)" if "all_reduce" in m else ""
            return f"other collectives: {calls_text(m)} in step {step}, where '{like}' makes {calls_text(r)}: {hint}"
    for step, (m, r) in enumerate(zip(mine, ref), start=1):
        total_m, total_r = sum(m.values()), sum(r.values())
        early_m = sum(m[f"{kind}{i}"] for kind in ("backward", "finish") for i in range(1, k))
        early_r = sum(r[f"{kind}{i}"] for kind in ("backward", "finish") for i in range(1, k))
        if total_m != total_r:
            calls = calls_text(kinds_m[step - 1]) if step <= len(kinds_m) else f"{total_m} all_reduce calls"
            theirs = kinds_r[step - 1] if step <= len(kinds_r) else {}
            made = f"{calls} in step {step} of {k} micro-batches, where '{like}' makes " + (
                calls_text(theirs) if len(theirs) > 1 else str(total_r)  # several kinds: each one's count
            )
            if early_m > early_r and not report.get("has_no_sync"):
                return (
                    f"your stage has no no_sync(), so it syncs after every micro-batch: {made}; write no_sync() "
                    "(stage ga's idea): the micro-batches run inside it only accumulate"
                )
            if early_m > early_r and harness.forward_decides(step):
                return (
                    f"no_sync() did not stop the sync in step {step}, whose micro-batches ran only their forward "
                    f"inside no_sync() and their backward after it: {made}: {early_m} of them came from those "
                    "micro-batches; the forward decides (note require_backward_grad_sync in sync_this_backward "
                    "there), not the flag read during backward"
                )
            in_hooks = sum(m[f"backward{i}"] for i in range(1, k)) > sum(r[f"backward{i}"] for i in range(1, k))
            if early_m > early_r and in_hooks:  # sent from the grad hook, during those micro-batches' backwards
                return (
                    f"no_sync() did not stop the sync: {made}: {early_m} of them came from the micro-batches run "
                    "inside no_sync(), sent by your grad hook during their backward; their forward noted that the "
                    "coming backward does not sync: in _grad_ready, send only if self.sync_this_backward"
                )
            if early_m > early_r:
                return (
                    f"no_sync() did not stop the sync: {made}: {early_m} of them came from the micro-batches run "
                    "inside no_sync(), which must only accumulate (their forward notes that the coming backward "
                    "does not sync; finish_gradient_synchronization() runs after every backward, theirs too)"
                )
            twice = m[f"finish{k}"] - r[f"finish{k}"]
            if twice > 0 and m[f"backward{k}"] >= r[f"backward{k}"] > 0:
                return (
                    f"your stage syncs twice: {made}: {m[f'backward{k}']} from the grad hooks during the last "
                    f"backward and {twice} more from finish_gradient_synchronization() after it; '{like}' syncs "
                    "only from the hooks, so its finish must send nothing (a finish inherited from ga sends every "
                    "gradient again: override it with one that does not)"
                )
            synced_m = sum(m[f"backward{i}"] + m[f"finish{i}"] > 0 for i in range(1, k + 1))
            synced_r = sum(r[f"backward{i}"] + r[f"finish{i}"] > 0 for i in range(1, k + 1))
            if synced_m < synced_r and total_m * synced_r == total_r * synced_m:  # as many per sync, fewer syncs
                return (
                    f"your gradients are right (the average over the ranks, and the parameters match a single "
                    f"process on the global batch), but synced after {synced_m} of the {k} micro-batches: {made}; "
                    f"this exercise asks for a sync after every micro-batch, as '{like}' makes (syncing only once "
                    "the step's last micro-batch is in is stage ga's idea, no_sync(), 03_build_up)"
                )
            if total_m < total_r and not like.startswith("bucket") and like != "halves":
                return (
                    f"your gradients are right (the average over the ranks, and the parameters match a single "
                    f"process on the global batch), but packed into fewer messages: {made}; this exercise asks for "
                    f"one all_reduce per gradient tensor at every sync, as '{like}' makes (packing several gradients "
                    "into one message is the bucket stages' idea, 03_build_up)"
                )
            head = f"wrong number of collectives: {made}"
            if like.startswith("bucket"):
                return head + f" (one per bucket: the plan for bucket_cap_mb={cap} has {total_r} buckets)"
            if like == "halves":  # each bucket: one reduce-scatter and one all-gather
                per = len(kinds_r[step - 1]) if step <= len(kinds_r) else 2
                return (
                    head + f" (one reduce_scatter_single and one all_gather_single per bucket: the plan for "
                    f"bucket_cap_mb={cap} has {total_r // per} buckets)"
                )
            return head + (
                f" ('{like}' makes one all_reduce per gradient tensor at every sync; packing several gradients into "
                "one message is the bucket stages' idea)"
            )
        if r[f"backward{k}"] > 0 and m[f"backward{k}"] == 0:
            return (
                f"every all_reduce started in finish_gradient_synchronization(), after backward; '{like}' "
                "starts each one from the autograd hook while backward is still running"
            )
    flight_m, flight_r = report.get("in_flight", []), report.get("reference_in_flight", [])
    for step, (m, r) in enumerate(zip(flight_m, flight_r), start=1):
        if r > 0 and m == 0:
            return (
                f"nothing travelled while backward computed: in step {step}, every collective was waited for "
                f"before backward computed its last gradient, where '{like}' still had {r} in flight then; "
                "start each with async_op=True, keep the handle, and wait only in "
                "finish_gradient_synchronization()"
            )
        if 0 < m < r:  # a wait inside backward, before the last gradient, for messages sent earlier in it
            return (
                f"only {m} collective{' was' if m == 1 else 's were'} still in flight when backward computed its last "
                f"gradient in step {step}, where '{like}' had {r}: your stage waited for the others inside backward; "
                "keep every handle and wait only in finish_gradient_synchronization()"
            )
        if r == 0 and m > 0:
            return (
                f"{m} collectives were still in flight when backward computed its last gradient in step "
                f"{step}, where '{like}' waits for each one inside the hook, before backward goes on: wait "
                "there (not waiting is the next rung, the async one)"
            )
    return None


def _hook_finding(f: dict, report: dict) -> str:
    kind = f["kind"]
    if kind == "not_future":
        return (
            f"your hook returned a {f['returned']}, not a torch.futures.Future: return the all_reduce's Future, "
            "e.g. dist.all_reduce(t, async_op=True).get_future().then(...)"
        )
    if kind == "hook_written_in_flight":  # learner read 04 (round 20) 3: a verdict that hung on a race
        kind_sent, op = f["written"][0]
        return (
            f"your hook wrote into the tensor it sent ({op}) after starting its {kind_sent} and before it completed, "
            "so the network may read it before or after your write, and the result depends on a race: divide "
            "before the all_reduce, or divide its result in the .then(...) callback"
        )
    if kind == "future_value" and f["value"] == "NoneType":  # a callback that returns nothing
        return (
            "your hook's Future holds None: the function you passed to .then(...) returned nothing (a def without "
            "return?); return the average from it, e.g. .then(lambda fut: fut.value()[0].to(torch.float32))"
        )
    if kind == "future_value":
        return (
            f"your hook's Future holds {f['value']}, not one tensor: all_reduce's Future holds a list, so "
            "finish with .then(...) whose callback returns the tensor itself, fut.value()[0] cast back, not a list"
        )
    if kind == "shape":
        numel = report["probe"]["numel"]  # the bucket the hook was handed
        if f["shape"] == [numel]:  # only the dtype differs
            return (
                f"your hook's Future holds a {f['dtype']} tensor, but the bucket is float32: cast the average back "
                "to the bucket's dtype, .to(bucket.buffer().dtype)"
            )
        return (
            f"your hook's Future holds a {f['dtype']} tensor of shape {f['shape']}, but the bucket is float32 of "
            f"shape [{numel}]: hand back the averaged bucket, as one flat tensor of its size and dtype"
        )
    if kind == "local":
        return (
            "your hook returned this rank's own gradients"
            + (" divided by the world size" if f["divisor"] > 1 else "")
            + ", not the all_reduce's result: it reduced a copy (a .to() or .clone() makes one) or returned another "
            "tensor; return the reduced tensor, fut.value()[0], cast back to float32"
        )
    if kind == "ranks_differ":
        return "the ranks got different results from your hook: every rank must end with the same average"
    if kind == "summed" and f.get("buffer_divided"):  # learner read 04 (round 18) 9
        return (
            "your hook returns the sum over ranks, not the average: it divided the bucket's float32 buffer, but "
            "the all_reduce sent the float16 copy made before that division; divide the copy you send, "
            "buffer.to(torch.float16).div_(world_size)"
        )
    if kind == "summed" and "float32" in f.get("sent_dtypes", []):  # learner read 04 (round 20) 5
        return (
            "your hook returns the sum over ranks, not the average: the all_reduce sent the bucket's float32 "
            "buffer, 4 bytes a value, not the divided float16 copy; all_reduce the copy"
        )
    if kind == "summed":
        return (
            "your hook returns the sum over ranks, not the average: divide by the world size (forgot the division; "
            "or divided into a new tensor: t / world_size makes one and leaves t as it was: keep the quotient, "
            "t = t / world_size, or divide in place, t /= world_size)"
        )
    if kind == "divided_twice":
        return (
            f"your hook divided by the world size twice: its average is 1/{report['world']} of the true one "
            f"(off by {f['error']:.2%}); divide once, before the sum"
        )
    if kind.startswith(harness.HARD_CODED_KIND):
        divisor = int(kind[len(harness.HARD_CODED_KIND) :])
        return (
            f"your hook divided by {divisor}, not by the world size ({report['world']}): a world size written as a "
            f"number is right on {divisor} ranks only; divide by dist.get_world_size(group)"
        )
    if kind == "dtype":
        return (
            f"your hook sent {', '.join(f['sent_dtypes'])}, not float16: as few bytes, but bfloat16 keeps 8 bits of "
            f"precision to float16's 11, so its rounding error is about 8 times float16's (here off by "
            f"{f['error']:.2%}, where float16 rounding allows at most {f['bound']:.2%}); cast to torch.float16"
        )
    if kind == "error":
        return (
            f"your hook's average is off by {f['error']:.2%} of the gradient, where float16 rounding allows at "
            f"most {f['bound']:.2%}"
        )
    if kind == "overflow":
        return (
            f"your hook's average came back inf or nan for {f['values']} of {f['numel']} gradients of about "
            f"{report['large_gradient']:.0f} each (below float16's largest, 65504, but not their sum over "
            f"{report['world']} ranks): divide before the sum, or the float16 sum overflows "
            "(ReduceOp.AVG, too, divides after the sum: keep the default ReduceOp.SUM)"
        )
    if kind == "blocked":
        return (
            "your hook waited for its all_reduce before returning"
            + (" (the Future it returned was already complete)" if f.get("done") else "")
            + ": backward stands still inside a blocking hook; return the all_reduce's Future at once "
            "(async_op=True, .then(...)) and let the stage wait for it"
        )
    if kind == "bytes":
        n = f["numel"]
        sent = f" ({', '.join(f['sent_dtypes'])})" if f.get("sent_dtypes") else ""
        return (
            f"your hook's payload was {f['bytes'] / n:.0f} bytes per gradient value{sent}, the model answer's "
            f"{f['reference_bytes'] / n:.0f}: cast to float16 before the all_reduce"
        )
    if kind == "other_group":  # learner read 04 (round 23) 1
        # learner read 04 (round 24) 4: no "use dist.group.WORLD" for None: torch's collectives take None as it
        what = " and ".join("dist.get_world_size()" if on == "get_world_size" else f"its {on}" for on in f["on"])
        return (
            f"your hook ran {what} on the default group, not on the process group it was handed (here a group of "
            "all the ranks, so the numbers came out right); DDP may hand a smaller one: pass group=process_group"
        )
    if kind == "diverged":
        return f"with your hook in the bucket-async stage, the ranks' parameters differ after step {f['step']}"
    return str(f)
