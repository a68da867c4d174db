"""minddp's own analysis of CPU/gloo traces, where HolisticTraceAnalysis cannot go.

HTA reads GPU kernels; a CPU trace has none, so its temporal breakdown raises
and its overlap is NaN. The same quantities are there in the CPU events:

1. **threads**: a thread that runs a ``gloo:*`` range is one of gloo's
   worker threads (a *comm thread*), and so is the emulated link's thread
   (``minddp.link:*`` ranges, written into the trace by
   :meth:`minddp.comm.link.Link.annotate_trace` when a run has ``--link``);
   every other thread is a training thread (the Python thread, and the
   autograd engine's where it has its own);
2. **steps**: each ``ProfilerStep#N`` range is one training step; the window
   under study is their union (a trace without them is one step: its span);
3. **compute**: the ``aten::*`` ops on training threads;
   **comm**: the ``gloo:*`` collective ranges on comm threads (the time the
   collective really ran, not the ``c10d::allreduce_`` call that queued it),
   and with a link its ``minddp.link:*`` transfers (from the start of the
   modeled transfer to the delivery of the result);
4. **calls and bytes**: each ``gloo:all_reduce`` is one call (and each
   ``gloo:all_gather`` / ``gloo:reduce_scatter`` one of its kind); its bytes are
   ``numel × element size`` from the input dims and type that
   ``record_shapes=True`` stores; a call belongs to the step it starts in.
   On gloo, minddp's sharded stages reduce-scatter through all_reduce (see
   :meth:`minddp.comm.wire.Wire.reduce_scatter`), so those calls count as
   all_reduces; their launches say ``hook=reduce_scatter_hook``;
5. **buckets**: each ``minddp.bucket_launch#<i> ...`` range is a bucket handed
   to the wire (start = ready, end = the hook returned). The all_reduces it
   queued are the ``c10d::allreduce_`` calls inside that range; gloo runs
   queued collectives in order, so the n-th queued call of a size is matched
   to the next ``gloo:all_reduce`` of that size that starts after it. With a
   link, a bucket's communication is the link's transfers instead, found by
   the ``minddp.link_send#<n>`` markers inside the launch range.
   torch's DDP names no launch range: there each ``c10d::allreduce_`` its
   reducer queues on a training thread is a bucket (ready = launched = the
   call). Each ``minddp.all_gather_launch#<i>`` range (a sharded stage
   gathering unit or bucket ``i``) is a row too, its ``c10d::_allgather_base_``
   matched the same way to its ``gloo:all_gather``;
6. **phases** of a step of :func:`minddp.ladder.loop.train_step`: each
   ``minddp.forward_backward`` range is a micro-batch; its *backward* runs
   from the first to the last ``autograd::engine::evaluate_function`` event
   inside it (a comm hook that blocks runs inside those nodes, so it makes
   the backward longer), its *forward* from the range's start to there; the
   ``minddp.finish_gradient_synchronization`` and ``minddp.optimizer_step``
   ranges are the finish and the optimizer.

Then :mod:`minddp.analysis.metrics` turns the intervals into numbers.

Example::

    >>> iv = rank_intervals(trace)                   # a RankTrace from events.read_trace
    >>> metrics.overlap_pct(iv.comm, iv.compute)
    37.5
"""

from __future__ import annotations

import re

from minddp.analysis import metrics
from minddp.analysis.events import RankTrace
from minddp.analysis.steps import RankIntervals, end_of, numel_of, per_step_means, step_windows

_LAUNCH = re.compile(r"^minddp\.bucket_launch#(\d+) numel=(\d+) dtype=(\S+) hook=(\S+)$")
_GATHER = re.compile(r"^minddp\.all_gather_launch#(\d+)$")


#: Names of the ranges that are communication: gloo's collectives, and the emulated link's transfers.
COMM_PREFIXES = ("gloo:", "minddp.link:")


def is_comm(e: dict) -> bool:
    return e["name"].startswith(COMM_PREFIXES)


def rank_intervals(trace: RankTrace) -> RankIntervals:
    """Steps 1-3 (and the all_reduce list of step 4) for one rank (computed once per trace)."""
    if "intervals" not in trace.derived:
        trace.derived["intervals"] = _rank_intervals(trace)
    return trace.derived["intervals"]


def _rank_intervals(trace: RankTrace) -> RankIntervals:
    comm_threads = {e["tid"] for e in trace.events if is_comm(e)}                          # step 1
    steps = step_windows(trace.events, comm_threads)                                        # step 2
    compute = [(e["ts"], end_of(e)) for e in trace.events                                    # step 3
               if e["name"].startswith("aten::") and e.get("tid") not in comm_threads]
    comm = [(e["ts"], end_of(e)) for e in trace.events if is_comm(e)]
    def named(prefix: str) -> list[dict]:
        return sorted((e for e in trace.events if e["name"].startswith(prefix)), key=lambda e: e["ts"])
    return RankIntervals(steps, compute, comm, named("gloo:all_reduce"), comm_threads,
                         named("gloo:all_gather"), named("gloo:reduce_scatter"))


def rank_metrics(trace: RankTrace) -> dict:
    """One row of the summary table: breakdown, overlap and per-step numbers for one rank."""
    iv = rank_intervals(trace)
    window = [(s, e) for _, s, e in iv.steps]
    row = metrics.breakdown(window, iv.compute, iv.comm)
    row["comm_comp_overlap_pctg"] = metrics.overlap_pct(metrics.intersect(iv.comm, window), iv.compute)
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
    def queued_calls(name: str) -> list[dict]:
        return sorted((e for e in trace.events if e["name"] == name and e["tid"] not in iv.comm_threads),
                      key=lambda e: e["ts"])
    queued, gathers = queued_calls("c10d::allreduce_"), queued_calls("c10d::_allgather_base_")
    # an all-gather is queued with (output, input) and runs with its input: match on the input's size
    runs = {**_match_queued_to_runs(queued, iv.allreduces), **_match_queued_to_runs(gathers, iv.allgathers, 1)}
    ranges = sorted((e for e in trace.events if _LAUNCH.match(e["name"]) or _GATHER.match(e["name"])),
                    key=lambda e: e["ts"])
    launches = [(e, _LAUNCH.match(e["name"]).groups() if _LAUNCH.match(e["name"]) else
                 (_GATHER.match(e["name"]).group(1), None, "", "all_gather")) for e in ranges if s0 <= e["ts"] < s1]
    if not ranges:          # torch's reducer: each queued all_reduce of this step is a bucket
        mine = [q for q in queued if s0 <= q["ts"] < s1]
        launches = [(q, (str(i), str(numel_of((q.get("args", {}).get("Input Dims") or [[]])[0])), "", "reducer"))
                    for i, q in enumerate(mine)]
    transfers = {e["args"]["seq"]: e for e in trace.events if e["name"].startswith("minddp.link:")}
    sent = [(e, int(e["name"].rpartition("#")[2])) for e in trace.events
            if e["name"].startswith("minddp.link_send#") and e.get("tid") not in iv.comm_threads]
    rows = []
    for order, (e, (index, numel, dtype, hook)) in enumerate(launches):
        calls = gathers if hook == "all_gather" else queued
        if transfers:    # with a link, the bucket's communication is the link's transfers
            mine = [transfers[n] for m, n in sent if e["ts"] <= m["ts"] <= end_of(e) and n in transfers]
        else:
            mine = [runs[id(q)] for q in calls if e["ts"] <= q["ts"] <= end_of(e) and id(q) in runs]
        if numel is None:       # an all-gather: what this rank sent, from the collective (or the link's) bytes
            numel = sum(r["args"]["bytes"] // 4 // r["args"]["ranks"] if "bytes" in r.get("args", {}) else
                        numel_of((r.get("args", {}).get("Input Dims") or [[]])[0]) for r in mine)
        rows.append({
            "step": number, "order": order, "bucket": int(index), "numel": int(numel), "dtype": dtype or
            str((mine[0].get("args", {}).get("Input type") or [""])[0] if mine else ""),
            "hook": hook, "launch": "reducer" if hook == "reducer" else "hook",
            "ready_us": e["ts"] - s0, "launched_us": end_of(e) - s0,
            "comm_start_us": min(r["ts"] for r in mine) - s0 if mine else float("nan"),
            "comm_end_us": max(end_of(r) for r in mine) - s0 if mine else float("nan"),
            "step_end_us": s1 - s0,
        })
    return rows


def step_phases(trace: RankTrace, step: int | None = None) -> list[dict]:
    """Step 6: forward, backward, finish and optimizer spans of one step (µs from the step's start)."""
    iv = rank_intervals(trace)
    number, s0, s1 = _pick_step(iv, trace, step)
    inside = [e for e in trace.events if s0 <= e["ts"] < s1 and e.get("tid") not in iv.comm_threads]
    nodes = sorted((e["ts"], end_of(e)) for e in inside if e["name"].startswith("autograd::engine::evaluate_function"))
    rows = []

    def add(phase: str, micro: int | None, start: float, end: float) -> None:
        rows.append({"step": number, "phase": phase, "micro": micro, "start_us": start - s0, "end_us": end - s0})

    micro_batches = sorted((e["ts"], end_of(e)) for e in inside if e["name"] == "minddp.forward_backward")
    for i, (start, end) in enumerate(micro_batches):
        backward = [(a, b) for a, b in nodes if start <= a <= end]
        if backward:
            first = min(a for a, _ in backward)
            add("forward", i, start, first)
            add("backward", i, first, max(b for _, b in backward))
    for name, phase in (("minddp.finish_gradient_synchronization", "finish"), ("minddp.optimizer_step", "optimizer")):
        for e in inside:
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
    """The CPU twin of HTA's kernel-type breakdown: time in compute only, comm only, and both."""
    iv = rank_intervals(trace)
    window = [(s, e) for _, s, e in iv.steps]
    compute, comm = metrics.intersect(iv.compute, window), metrics.intersect(iv.comm, window)
    both = metrics.length(metrics.intersect(compute, comm))
    parts = {
        "COMPUTATION": metrics.length(compute) - both,
        "COMMUNICATION": metrics.length(comm) - both,
        "COMPUTATION overlapping COMMUNICATION": both,
    }
    total = sum(parts.values()) or 1.0
    return [{"kernel_type": k, "sum": v, "percentage": round(100.0 * v / total, 1)} for k, v in parts.items()]
