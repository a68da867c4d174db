"""minddp's own analysis of CPU/gloo traces, where HolisticTraceAnalysis (GPU kernels only) cannot go.

The same quantities are in the CPU events (``docs/analysis.md``, "How a CPU trace is read", says how
each is matched):

1. **threads**: a thread that runs ``gloo:*`` (or the link's ``minddp.link:*``) ranges is a comm
   thread; every other is a training thread;
2. **steps**: the ``ProfilerStep#N`` ranges;
3. **compute**: ``aten::*`` ops on training threads; **comm**: the collective ranges on comm
   threads (and the link's transfers);
4. **calls and bytes**: one per ``gloo:*`` collective, bytes from its recorded shapes; an all_reduce queued by a
   ``reduce_scatter_hook`` launch is a reduce-scatter (gloo runs the sharded stages' reduce-scatters so);
5. **buckets**: each ``minddp.bucket_launch#<i>`` range matched to the collectives it queued;
6. **phases** of :func:`minddp.ladder.loop.train_step`: forward, backward, finish, optimizer.

Example (on one rank; the trace of a tiny run)::

    >>> import os, tempfile
    >>> from minddp.runtime.profiling import tiny_run
    >>> run = tempfile.TemporaryDirectory()                     # a run folder: one stage, one rank
    >>> _ = tiny_run(run.name)                                  # 3 steps, 2 recorded: a matmul, two all_reduces
    >>> from minddp.analysis.events import load_run
    >>> iv = rank_intervals(load_run(run.name).stages["simple"].ranks[0])
    >>> len(iv.steps), len(iv.allreduces)                      # 2 profiled steps, 2 all_reduces each
    (2, 4)
    >>> 0.0 <= metrics.overlap_pct(iv.comm, iv.compute) <= 100.0   # % of comm hidden by compute: a timing
    True
"""

from __future__ import annotations

import re

from minddp.analysis import metrics
from minddp.analysis.events import RankTrace
from minddp.analysis.steps import RankIntervals, end_of, link_sets, numel_of, per_step_means, step_windows

_LAUNCH = re.compile(r"^minddp\.bucket_launch#(\d+) numel=(\d+) dtype=(\S+) hook=(\S+)$")
_GATHER = re.compile(r"^minddp\.all_gather_launch#(\d+)$")


#: Names of the ranges that are communication: gloo's collectives, and the emulated link's transfers.
COMM_PREFIXES = ("gloo:", "minddp.link:")


#: The events the CPU path reads, by family: the name prefixes of each. An event is filed under the
#: first family its name starts with (so ``minddp.link:*`` is comm, not ``minddp.``); the others (python
#: frames, the profiler's own ranges, ...) are in no family.
FAMILIES = {
    "aten": ("aten::",),  # compute (step 3)
    "comm": COMM_PREFIXES,  # gloo's collectives, the link's transfers (steps 1, 3, 4)
    "minddp": ("minddp.",),  # the ranges minddp's own code records (steps 5, 6)
    "c10d": ("c10d::",),  # the collectives as the training thread queues them (step 5)
    "autograd": ("autograd::engine::evaluate_function",),  # backward nodes (step 6)
    "steps": ("ProfilerStep#",),  # step 2
}


def families(trace: RankTrace) -> dict[str, list[dict]]:
    """The trace's events sorted into :data:`FAMILIES` in one pass, each list in trace order.

    Computed once per trace (kept in ``trace.derived``): every later step filters one short list
    instead of scanning the whole trace again.
    """
    if "families" not in trace.derived:
        found = {family: [] for family in FAMILIES}
        for e in trace.events:
            name = e["name"]
            for family, prefixes in FAMILIES.items():
                if name.startswith(prefixes):
                    found[family].append(e)
                    break
        trace.derived["families"] = found
    return trace.derived["families"]


def rank_intervals(trace: RankTrace) -> RankIntervals:
    """Steps 1-3 (and the all_reduce list of step 4) for one rank (computed once per trace)."""
    if "intervals" not in trace.derived:
        trace.derived["intervals"] = _rank_intervals(trace)
    return trace.derived["intervals"]


def _rank_intervals(trace: RankTrace) -> RankIntervals:
    family = families(trace)
    comm_threads = {e["tid"] for e in family["comm"]}  # step 1
    steps = step_windows(trace.events, comm_threads, candidates=family["steps"])  # step 2
    compute = [(e["ts"], end_of(e)) for e in family["aten"] if e.get("tid") not in comm_threads]  # step 3
    comm = [(e["ts"], end_of(e)) for e in family["comm"]]

    def named(prefix: str) -> list[dict]:
        return sorted((e for e in family["comm"] if e["name"].startswith(prefix)), key=lambda e: e["ts"])

    allreduces, scattered = _reduce_scatters_run_as_all_reduce(family, named("gloo:all_reduce"), comm_threads)
    link, waits = link_sets(family["comm"])
    return RankIntervals(
        steps,
        compute,
        comm,
        allreduces,
        comm_threads,
        named("gloo:all_gather"),
        sorted(named("gloo:reduce_scatter") + scattered, key=lambda e: e["ts"]),
        link,
        waits,
    )


def _reduce_scatters_run_as_all_reduce(family, allreduces: list[dict], comm_threads) -> tuple[list[dict], list[dict]]:
    """Step 4's kinds: ``(all_reduces, reduce-scatters)`` among the ``gloo:all_reduce`` ranges.

    On gloo a sharded stage's reduce-scatter runs as an all_reduce of the whole bucket
    (:meth:`minddp.comm.wire.Wire.reduce_scatter`); its launch range says ``hook=reduce_scatter_hook``. The
    all_reduces queued inside such a range are reduce-scatters, counted (and their bytes, the whole input, as the
    wire's meter counts them) as such.
    """
    launches = [
        (e["ts"], end_of(e))
        for e in family["minddp"]
        if (m := _LAUNCH.match(e["name"])) and "reduce_scatter" in m.group(4) and e.get("tid") not in comm_threads
    ]
    if not launches:
        return allreduces, []
    queued = sorted(
        (e for e in family["c10d"] if e["name"] == "c10d::allreduce_" and e.get("tid") not in comm_threads),
        key=lambda e: e["ts"],
    )
    runs = _match_queued_to_runs(queued, allreduces)
    scattered = {id(runs[id(q)]) for q in queued if id(q) in runs and any(s <= q["ts"] <= e for s, e in launches)}
    return [e for e in allreduces if id(e) not in scattered], [e for e in allreduces if id(e) in scattered]


def rank_metrics(trace: RankTrace) -> dict:
    """One row of the summary table: breakdown, overlap and per-step numbers for one rank."""
    iv = rank_intervals(trace)
    window = [(s, e) for _, s, e in iv.steps]
    compute, comm = metrics.merge(iv.compute), metrics.merge(iv.comm)  # merged once, for both
    row = metrics.breakdown(window, compute, comm)
    row["comm_comp_overlap_pctg"] = metrics.overlap_pct(comm, compute, window)
    row.update(per_step_means(iv))
    return row


def _pick_step(iv: RankIntervals, trace: RankTrace, step: int | None) -> tuple[int, float, float]:
    number, s0, s1 = iv.steps[-1] if step is None else next((t for t in iv.steps if t[0] == step), (None, 0, 0))
    if number is None:
        raise ValueError(f"step {step} is not in {trace.path}: choose one of {[t[0] for t in iv.steps]}")
    return number, s0, s1


def bucket_timeline(trace: RankTrace, step: int | None = None) -> list[dict]:
    """Step 5: when each bucket of one step was ready, launched, and reduced.

    Times are microseconds from the start of the step; ``step=None`` takes the
    last profiled step (the most settled one). Buckets whose all_reduce is not
    in the trace get NaN comm times. ``launch`` says where the bucket came
    from: ``hook`` (a minddp launch range) or ``reducer`` (torch's DDP).
    """
    iv = rank_intervals(trace)
    number, s0, s1 = _pick_step(iv, trace, step)
    family = families(trace)

    def queued_calls(name: str) -> list[dict]:
        return sorted(
            (e for e in family["c10d"] if e["name"] == name and e["tid"] not in iv.comm_threads), key=lambda e: e["ts"]
        )

    queued, gathers = queued_calls("c10d::allreduce_"), queued_calls("c10d::_allgather_base_")
    # an all-gather is queued with (output, input) and runs with its input: match on the input's size
    runs = {**_match_queued_to_runs(queued, iv.allreduces), **_match_queued_to_runs(gathers, iv.allgathers, 1)}
    ranges = sorted(
        (e for e in family["minddp"] if _LAUNCH.match(e["name"]) or _GATHER.match(e["name"])), key=lambda e: e["ts"]
    )
    launches = [
        (
            e,
            _LAUNCH.match(e["name"]).groups()
            if _LAUNCH.match(e["name"])
            else (_GATHER.match(e["name"]).group(1), None, "", "all_gather"),
        )
        for e in ranges
        if s0 <= e["ts"] < s1
    ]
    if not ranges:  # torch's reducer: each queued all_reduce of this step is a bucket
        mine = [q for q in queued if s0 <= q["ts"] < s1]
        launches = [
            (q, (str(i), str(numel_of((q.get("args", {}).get("Input Dims") or [[]])[0])), "", "reducer"))
            for i, q in enumerate(mine)
        ]
    transfers = {e["args"]["seq"]: e for e in family["comm"] if e["name"].startswith("minddp.link:")}
    sent = [
        (e, int(e["name"].rpartition("#")[2]))
        for e in family["minddp"]
        if e["name"].startswith("minddp.link_send#") and e.get("tid") not in iv.comm_threads
    ]
    rows = []
    for order, (e, (index, numel, dtype, hook)) in enumerate(launches):
        calls = gathers if hook == "all_gather" else queued
        if transfers:  # with a link, the bucket's communication is the link's transfers
            mine = [transfers[n] for m, n in sent if e["ts"] <= m["ts"] <= end_of(e) and n in transfers]
        else:
            mine = [runs[id(q)] for q in calls if e["ts"] <= q["ts"] <= end_of(e) and id(q) in runs]
        if numel is None:  # an all-gather: what this rank sent, from the collective (or the link's) bytes
            numel = sum(
                r["args"]["bytes"] // 4 // r["args"]["ranks"]
                if "bytes" in r.get("args", {})
                else numel_of((r.get("args", {}).get("Input Dims") or [[]])[0])
                for r in mine
            )
        rows.append(
            {
                "step": number,
                "order": order,
                "bucket": int(index),
                "numel": int(numel),
                "dtype": dtype or str((mine[0].get("args", {}).get("Input type") or [""])[0] if mine else ""),
                "hook": hook,
                "launch": "reducer" if hook == "reducer" else "hook",
                "ready_us": e["ts"] - s0,
                "launched_us": end_of(e) - s0,
                "comm_start_us": min(r["ts"] for r in mine) - s0 if mine else float("nan"),
                "comm_end_us": max(end_of(r) for r in mine) - s0 if mine else float("nan"),
                "step_end_us": s1 - s0,
            }
        )
    return rows


def step_phases(trace: RankTrace, step: int | None = None) -> list[dict]:
    """Step 6: forward, backward, finish and optimizer spans of one step (µs from the step's start)."""
    iv = rank_intervals(trace)
    number, s0, s1 = _pick_step(iv, trace, step)
    family = families(trace)

    def inside(name: str) -> list[dict]:  # the step's events of ``name``'s family on training threads
        return [e for e in family[name] if s0 <= e["ts"] < s1 and e.get("tid") not in iv.comm_threads]

    nodes = sorted((e["ts"], end_of(e)) for e in inside("autograd"))
    own = inside("minddp")  # minddp's own ranges, in trace order
    rows = []

    def add(phase: str, micro: int | None, start: float, end: float) -> None:
        rows.append({"step": number, "phase": phase, "micro": micro, "start_us": start - s0, "end_us": end - s0})

    micro_batches = sorted((e["ts"], end_of(e)) for e in own if e["name"] == "minddp.forward_backward")
    for i, (start, end) in enumerate(micro_batches):
        backward = [(a, b) for a, b in nodes if start <= a <= end]
        if backward:
            first = min(a for a, _ in backward)
            add("forward", i, start, first)
            add("backward", i, first, max(b for _, b in backward))
    for name, phase in (("minddp.finish_gradient_synchronization", "finish"), ("minddp.optimizer_step", "optimizer")):
        for e in own:
            if e["name"] == name:
                add(phase, None, e["ts"], end_of(e))
    add("step", None, s0, s1)
    return rows


def _match_queued_to_runs(queued: list[dict], runs: list[dict], which: int = 0) -> dict[int, dict]:
    """Pair each queued ``c10d::`` call with the ``gloo:`` range that ran it (step 5), by the size of its
    input number ``which``."""
    free = list(runs)
    out = {}
    for q in queued:
        dims = q.get("args", {}).get("Input Dims") or [[]]
        numel = numel_of(dims[which] if len(dims) > which else [])
        for i, r in enumerate(free):
            if r["ts"] >= q["ts"] and numel_of((r.get("args", {}).get("Input Dims") or [[]])[0]) == numel:
                out[id(q)] = free.pop(i)
                break
    return out


def kernel_breakdown(trace: RankTrace) -> list[dict]:
    """The CPU twin of HTA's kernel-type breakdown: time in compute only, comm only (non-compute), and both."""
    iv = rank_intervals(trace)
    window = [(s, e) for _, s, e in iv.steps]
    times = metrics.breakdown(window, iv.compute, iv.comm)
    both, _ = metrics.overlap_parts(iv.comm, iv.compute, window)
    parts = {
        "COMPUTATION": times["compute_time_us"] - both,
        "COMMUNICATION": times["non_compute_time_us"],
        "COMPUTATION overlapping COMMUNICATION": both,
    }
    total = sum(parts.values()) or 1.0
    return [{"kernel_type": k, "sum": v, "percentage": round(100.0 * v / total, 1)} for k, v in parts.items()]
