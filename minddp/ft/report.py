"""What a run of the ft rung did, read from its events and its processes' entries: one definition per measure.

The words, as the notebook (07), the benchmark (:mod:`minddp.ft.bench`) and ``docs/fault-tolerance.md`` use them:

* **slot**: one of the ``world_size`` places the launcher runs a training process in (0, 1, ...). A process
  started again after a fault takes the same slot (a new *incarnation*); faults name slots (``kill@4:1``).
* **rank**: a process's index among the members of the quorum of now, its rank in the group built for that
  quorum: after slot 1 is lost, slots 0 and 2 are ranks 0 and 1.
* **attempt**: one quorum's try at one step (a column of :func:`timeline`), committed on every member or
  discarded on every member. Each member records an *entry* for it (``FTRun.entries``).
* **holder**: a process holding the trained state, a member of the newest committed step.
* **recovery** (:attr:`FaultOutcome.recovery_s`): seconds from a fault to the first commit of its step or a
  later one (the failed attempt, the new quorum and group, the step trained again).
* **rejoin** (:attr:`FaultOutcome.rejoin_s`): seconds from a fault that ended a process (``kill``, ``stop``)
  until the quorum that heals its slot's new process.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import torch

from minddp.ft.faults import Fault


@dataclass(frozen=True)
class FaultOutcome:
    """One fault of a run, its moments measured from when it fired (seconds; ``None``: it did not happen)."""

    fault: Fault
    fired: float | None  # time.time() when it fired; None: the run ended first
    recovery_s: float | None  # to the first commit of the fault's step or a later one
    committed_step: int | None  # the step of that commit
    world: int | None  # that commit's world size
    discarded: int  # attempts discarded from the fault to that commit
    discard_s: float | None  # to the lighthouse's first discard (its decision, read by each member that voted)
    quorum_s: float | None  # to the first new quorum (the members agreed again, a new group to build)
    exit_s: float | None  # kill, stop: to the launcher recording the process's exit (after it saw it and waited)
    seen_s: float | None  # kill, stop: to the launcher's pass that found that process ended (before its wait)
    restart_s: float | None  # kill, stop: to the launcher starting the slot's next process
    rejoin_s: float | None  # kill, stop: to the quorum that heals that process
    healed_at: int | None  # the step it was healed at
    rejoin_steps: dict | None  # slot -> the step each member of that quorum asked to train (the new process: 0)
    last_commit: tuple[int, float] | None  # kill, stop: the last commit before the rejoin (its step, seconds)


def fault_outcomes(run) -> list[FaultOutcome]:
    """Each fault of ``run`` (:class:`~minddp.ft.launch.FTRun`), measured from its events."""
    decisions = [e for e in run.events if e[0] == "decision"]  # (_, tag, step, verdict, voters, t)
    quorums = [e for e in run.events if e[0] == "quorum"]  # (_, tag, members, {slot: step}, t)
    out = []
    for fault, t in zip(run.faults, run.fired_at):
        if t is None:
            out.append(FaultOutcome(fault, None, None, None, None, 0, *[None] * 10))
            continue
        after = [d for d in decisions if d[5] >= t]
        # the first commit of the fault's step or a later one (a new lighthouse first re-decides the step before)
        commit = next((d for d in after if d[3] == "commit" and d[2] >= fault.step), None)
        until = [d for d in after if commit is None or d[5] <= commit[5]]
        discards = [d for d in until if d[3] == "discard"]
        world = None if commit is None else next(len(q[2]) for q in reversed(quorums) if q[1] == commit[1])
        new_quorum = next((q for q in quorums if q[4] >= t), None)
        exit_s = seen_s = restart_t = rejoin = None
        if fault.kind in ("kill", "stop"):
            exit_s = next((s for slot, s in exits(run, t) if slot == fault.slot), None)
            seen_s = next(
                (e[3] - t for e in run.events if e[0] == "exit seen" and e[1] == fault.slot and e[3] >= t), None
            )
            restart_t = next(
                (e[3] for e in run.events if e[0] == "restarted" and e[1] == fault.slot and e[3] >= t), None
            )
            rejoin = next(
                (q for q in quorums if q[4] > t and fault.slot in q[2] and q[3][fault.slot] < max(q[3].values())),
                None,
            )
        out.append(
            FaultOutcome(
                fault,
                t,
                None if commit is None else commit[5] - t,
                None if commit is None else commit[2],
                world,
                len(discards),
                discards[0][5] - t if discards else None,
                None if new_quorum is None else new_quorum[4] - t,
                exit_s,
                seen_s,
                None if restart_t is None else restart_t - t,
                None if rejoin is None else rejoin[4] - t,
                None if rejoin is None else max(rejoin[3].values()),
                None if rejoin is None else dict(sorted(rejoin[3].items())),
                None
                if rejoin is None
                else max(((d[2], d[5] - t) for d in after if d[3] == "commit" and d[5] <= rejoin[4]), default=None),
            )
        )
    return out


def asked_s(run, o: FaultOutcome) -> float | None:
    """Seconds from fault ``o`` to the last of the requests that its first new quorum answered (each member's first
    request under that quorum's tag); ``None``: no new quorum, or entries without these times.

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(fired=10.0)
    >>> run = SimpleNamespace(events=[("quorum", "e0q1", [0, 1, 2], {0: 3, 1: 3, 2: 3}, 9.0),
    ...                               ("quorum", "e0q2", [0, 2], {0: 4, 2: 4}, 10.75)],
    ...     entries=[(0, 0, {"tag": "e0q2", "t_asked": 10.25}), (2, 0, {"tag": "e0q2", "t_asked": 10.5}),
    ...              (0, 0, {"tag": "e0q2", "t_asked": 11.0})])
    >>> asked_s(run, o)
    0.5
    """
    tag = next((e[1] for e in run.events if e[0] == "quorum" and e[4] >= o.fired), None)  # as fault_outcomes finds it
    if tag is None:
        return None
    first: dict[int, float] = {}
    for slot, _, e in run.entries:
        if e["tag"] == tag and "t_asked" in e:
            first[slot] = min(first.get(slot, e["t_asked"]), e["t_asked"])
    return max(first.values()) - o.fired if first else None


def first_request_s(run, o: FaultOutcome) -> float | None:
    """Seconds from fault ``o`` to the first quorum request of its slot's next process (``None``: none recorded).

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(fault=SimpleNamespace(slot=1), fired=10.0, restart_s=0.25)
    >>> run = SimpleNamespace(entries=[(1, 0, {"t_asked": 9.0}), (1, 1, {"t_asked": 12.5}), (1, 1, {"t_asked": 13.0})])
    >>> first_request_s(run, o)
    2.5
    """
    if o.restart_s is None:
        return None
    after = o.fired + o.restart_s
    asked = [e["t_asked"] for s, _, e in run.entries if s == o.fault.slot and e.get("t_asked", 0) >= after]
    return min(asked) - o.fired if asked else None


def retry_work_s(run, o: FaultOutcome) -> tuple[float, float] | None:
    """Seconds from fault ``o`` to the start and to the end of the work (forward, backward, all_reduce) of the attempt
    that committed its step, each at the last of that attempt's members (the group built, any heal and the digest
    before the start; the vote after the end); ``None``: no commit, or entries without these times.

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(committed_step=4, fired=10.0)
    >>> run = SimpleNamespace(entries=[(0, 0, {"step": 4, "committed": False, "t_work": 10.0}),
    ...     (0, 0, {"step": 4, "committed": True, "t_work": 10.25, "t_worked": 10.5}),
    ...     (2, 0, {"step": 4, "committed": True, "t_work": 10.5, "t_worked": 10.75})])
    >>> retry_work_s(run, o)
    (0.5, 0.75)
    """
    done = [e for _, _, e in run.entries if e["step"] == o.committed_step and e["committed"] and "t_worked" in e]
    if o.committed_step is None or not done:
        return None
    return max(e["t_work"] for e in done) - o.fired, max(e["t_worked"] for e in done) - o.fired


def exits(run, after: float) -> list[tuple[int, float]]:
    """``(slot, s)`` of each process exit the launcher recorded at ``after`` or later, ``s`` seconds after it, in order.

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(events=[("exited", 1, 0, 10.5), ("restarted", 1, 1, 10.75), ("exited", 2, 0, 12.0)])
    >>> exits(run, 10.25)
    [(1, 0.25), (2, 1.75)]
    >>> exits(run, 11.0)
    [(2, 1.0)]
    """
    return [(e[1], e[3] - after) for e in run.events if e[0] == "exited" and e[3] >= after]  # (_, slot, incarnation, t)


def fault_report(run) -> list[str]:
    """One line per fault: what failed, its recovery, the attempts discarded, the lost slot's rejoin."""
    lines = []
    for o in fault_outcomes(run):
        fault = o.fault
        if o.fired is None:
            lines.append(f"{fault}: never fired (the run ended before step {fault.step})")
            continue
        what = {
            "kill": f"slot {fault.slot} killed (SIGKILL)",
            "stop": f"slot {fault.slot} frozen (SIGSTOP)",
            "raise": f"slot {fault.slot}'s comm hook raised",
            "coord": "lighthouse killed and restarted",
        }[fault.kind]
        recovery = (
            f"no commit of step {fault.step} or later followed"
            if o.recovery_s is None
            else f"recovery {o.recovery_s:.3f} s (step {o.committed_step} committed at world {o.world})"
        )
        rejoin = (
            ""
            if o.rejoin_s is None
            else f"; rejoin {o.rejoin_s:.3f} s (slot {fault.slot} back in step {o.healed_at}'s quorum, healed after it)"
        )
        lines.append(f"{fault}: {what} in step {fault.step}; {recovery}; {o.discarded} attempt(s) discarded{rejoin}")
    return lines


def errors(run, step: int) -> list[tuple[int, str]]:
    """``(slot, error)`` of each member that caught an error at ``step`` (and so voted no), in the order caught.

    Of a gloo error, only gloo's own sentence that names the failure: no source file, no peer's address (a port
    that changes every run), no guess at the cause.

    >>> from types import SimpleNamespace
    >>> gloo = ("DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:5531: "
    ...         "Connection reset by peer. This may indicate a possible application crash on rank 0")
    >>> run = SimpleNamespace(entries=[
    ...     (2, 0, {"step": 4, "committed": False, "error": gloo, "t_error": 2.0}),
    ...     (0, 0, {"step": 4, "committed": False, "error": "ValueError: bad", "t_error": 1.0}),
    ...     (0, 0, {"step": 4, "committed": True})])
    >>> errors(run, 4)
    [(0, 'ValueError: bad'), (2, 'its all_reduce failed; gloo: Read error: Connection reset by peer')]
    """
    caught = [(e["t_error"], slot, e["error"]) for slot, _, e in run.entries if e["step"] == step and "error" in e]
    return [(slot, gloo_sentence(error)) for _, slot, error in sorted(caught)]


def gloo_sentence(error: str) -> str:
    """A gloo error as gloo's sentence after its source file, up to the first ". " or the end, its addresses dropped."""
    gloo = re.search(r"gloo/.*?\] (.+?)(?:\. |\.?$)", error)
    return "its all_reduce failed; gloo: " + re.sub(r" ?\[[^]]*\]:\d+", "", gloo.group(1)) if gloo else error


#: What each mark of :func:`timeline` means, in the order the legend lists them.
MARKS = {
    "C": "committed",
    "x": "discarded (the member voted; the step did not count)",
    "H": "healed (received the state from a peer), then committed",
    "h": "healed, then that attempt was discarded",
    "†": "the slot's process died in this attempt (it recorded nothing)",
    ".": "not a member",
}


def timeline(run) -> str:
    """One column per attempt, in order; a row per slot, then the step, the world size and each new group; then
    the legend of the marks that appear."""
    first_seen: dict[tuple[str, int], float] = {}
    for _, _, e in run.entries:
        key = (e["tag"], e["step"])
        first_seen[key] = min(first_seen.get(key, e["t0"]), e["t0"])
    columns = sorted(first_seen, key=first_seen.get)
    marks = {}
    for slot, _, e in run.entries:
        mark = ("H" if e["committed"] else "h") if e["healed"] else ("C" if e["committed"] else "x")
        marks[(slot, e["tag"], e["step"])] = mark
    members = {e["tag"]: e["members"] for _, _, e in run.entries}
    grid = {
        f"slot {slot}": [marks.get((slot, *c), "†" if slot in members[c[0]] else ".") for c in columns]
        for slot in sorted({slot for slot, _, _ in run.entries})
    }
    grid["step"] = [str(step) for _, step in columns]
    grid["world"] = [str(len(members[tag])) for tag, _ in columns]
    grid["new group"] = ["*" if i == 0 or tag != columns[i - 1][0] else "" for i, (tag, _) in enumerate(columns)]
    width = max(len(name) for name in grid) + 1
    rows = [(name.ljust(width) + " ".join(f"{m:>2}" for m in row)).rstrip() for name, row in grid.items()]
    seen = {m for name, row in grid.items() if name.startswith("slot") for m in row}
    rows += [f"  {m}  {meaning}" for m, meaning in MARKS.items() if m in seen]
    rows.append("  *  a new group built for this attempt's quorum")
    return "\n".join(rows)


@dataclass(frozen=True)
class Consistency:
    """The processes' checks of each other, every byte of the parameters and the optimizer's state compared.

    ``one_start`` and ``discards_kept`` need a run with ``digests=True`` (``None`` otherwise).
    """

    slots: int
    identical: bool  # every slot ended with the same bytes (and the same step)
    attempts: int  # attempts whose members recorded the state they started from
    one_start: bool | None  # every member of each of those attempts started it from the same bytes
    discarded: int  # discarded attempts among them
    discarded_entries: int  # the members' entries for those (one per member)
    discards_kept: bool | None  # every discarded attempt left every member's bytes as they were


def final_tensors(result: dict):
    """Every tensor of a slot's final state: parameters, then each optimizer value (AdamW's moments, step)."""
    state = torch.load(io.BytesIO(result["state"]), weights_only=True)
    yield torch.tensor(state["step"])
    yield from state["model"].values()
    for per_parameter in state["optimizer"]["state"].values():
        yield from (torch.as_tensor(v) for v in per_parameter.values())


def consistency(run) -> Consistency:
    """What the processes can check among themselves (never against the data): see :class:`Consistency`."""
    finals = [list(final_tensors(run.results[s])) for s in sorted(run.results)]
    identical = all(
        len(other) == len(finals[0]) and all(torch.equal(a, b) for a, b in zip(finals[0], other)) for other in finals
    )
    starts: dict[tuple[str, int], set] = {}
    discarded = []
    for _, _, e in run.entries:
        if e.get("before"):
            starts.setdefault((e["tag"], e["step"]), set()).add(e["before"])
            if not e["committed"]:
                discarded.append(e)
    digests = bool(starts)
    return Consistency(
        len(finals),
        identical,
        len(starts),
        all(len(d) == 1 for d in starts.values()) if digests else None,
        len({(e["tag"], e["step"]) for e in discarded}),
        len(discarded),
        all(e["after_discard"] == e["before"] for e in discarded) if digests else None,
    )


def cold_start_s(run) -> float:
    """Seconds from the first lighthouse listening to the first committed step: what a fresh start costs here."""
    start = next(e[3] for e in run.events if e[0] == "listening")
    first = next(e[5] for e in run.events if e[0] == "decision" and e[3] == "commit")
    return first - start
