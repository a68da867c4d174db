"""Notebook 07's printed lines: what a run of the ft rung recorded after each fault, in whole milliseconds.

Each function reads a run of :func:`minddp.ft.launch_ft` and one of its faults (a
:class:`minddp.ft.report.FaultOutcome`) through :mod:`minddp.ft.report`'s measures and prints them;
it defines no measure of its own. The notebook keeps its claims in its cells; these print or read:

* :func:`print_recoveries`: each fault's recovery and its share of the hang bound, the kill's in parts;
* :func:`print_rejoin`: what each side did from a kill to the quorum that took the slot's new process back;

and three readers of the members' entries (one per member and attempt) for the cells' claims: :func:`attempts`,
:func:`in_a_new_group`, :func:`heals`.
"""

from __future__ import annotations

from minddp.ft.report import peer_error_s


def ms(seconds: float) -> int:
    """``seconds`` in whole milliseconds.

    >>> ms(0.0996)
    100
    """
    return round(seconds * 1000)


def print_recoveries(run, kill, raised, hang_s: float) -> None:
    """Each fault's recovery, in whole ms, and its share of the hang bound. The kill's in three consecutive parts
    that add up to it (until a survivor caught an error, from then to the next quorum, from that quorum to the
    commit of the step), then the launcher's record of the killed process's exit, which that quorum waits for:
    how long before the quorum it came, and how much of the recovery passed between the launcher finding the
    process ended and that record (its fixed wait, ``EXIT_WAIT_S``)."""
    for o in (kill, raised):
        recovery = ms(o.recovery_s)
        line = f"{o.fault}: recovery {recovery} ms, {o.recovery_s / hang_s:.1%} of the hang bound ({hang_s:g} s)"
        if o is kill:
            error, quorum, exit_, seen = ms(peer_error_s(run, o)), ms(o.quorum_s), ms(o.exit_s), ms(o.seen_s)
            line += (
                f": {error} ms until a survivor's all_reduce failed, {quorum - error} ms more to the next quorum, "
                f"and {recovery - quorum} ms more to train step {o.committed_step} again in a new group and commit "
                f"it. That quorum came {quorum - exit_} ms after the launcher recorded slot {o.fault.slot}'s exit; "
                f"{exit_ - seen} of the {recovery} ms passed between the launcher finding the process ended and "
                "recording its exit (its fixed wait, EXIT_WAIT_S)"
            )
        else:
            line += "; the raise ended no process, so its next quorum waited for no exit record"
        print(line)


def print_rejoin(o) -> None:
    """For a kill ``o``: the rejoin, the new process's start and wait, and the survivors' last commit before it."""
    slot, step = o.fault.slot, o.fault.step
    others = [str(s) for s in sorted(o.rejoin_steps) if s != slot]  # the survivors, members of the rejoin's quorum
    last_step, last = o.last_commit
    rejoin, start = ms(o.rejoin_s), ms(o.restart_s)
    print(f"rejoin: step {o.healed_at}'s quorum took slot {slot}'s new process back {rejoin} ms after the kill")
    print(
        f"  slot {slot}'s new process: started {start} ms after the kill, "
        f"taken back {rejoin - start} ms after its start"
    )
    print(
        f"  slots {' and '.join(others)}: committed steps {step}-{last_step} at world {len(others)}, "
        f"the last {ms(last)} ms after the kill; "
        f"then {rejoin - ms(last)} ms to the quorum of step {o.healed_at}"
    )


def attempts(run, step: int, *, committed: bool) -> list[tuple[int, dict]]:
    """``(slot, entry)`` of each member's attempt at ``step`` that was committed (or discarded), by slot.

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(entries=[(2, 0, {"step": 4, "committed": False}), (0, 0, {"step": 4, "committed": False}),
    ...                                (0, 0, {"step": 4, "committed": True})])
    >>> [slot for slot, _ in attempts(run, 4, committed=False)]
    [0, 2]
    """
    return sorted(
        ((s, e) for s, _, e in run.entries if e["step"] == step and e["committed"] == committed), key=lambda se: se[0]
    )


def in_a_new_group(run, step: int) -> bool:
    """Whether ``step``'s committed attempt ran under a tag none of its discarded attempts had: a new tag, so a new
    group (phase 2), built for the retry.

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(entries=[(0, 0, {"step": 4, "committed": False, "tag": "e0q1"}),
    ...                                (0, 0, {"step": 4, "committed": True, "tag": "e0q2"})])
    >>> in_a_new_group(run, 4)
    True
    """
    tags = [{e["tag"] for _, e in attempts(run, step, committed=c)} for c in (False, True)]
    return bool(tags[0] and tags[1]) and tags[0].isdisjoint(tags[1])


def heals(run) -> list[tuple[int, int, bool]]:
    """``(slot, step, committed)`` of each attempt in which a member was healed, in the order recorded."""
    return [(s, e["step"], e["committed"]) for s, _, e in run.entries if e["healed"]]
