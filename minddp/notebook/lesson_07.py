"""Notebook 07's printed lines: what a run of the ft rung recorded after each fault, in whole milliseconds.

Each function reads a run of :func:`minddp.ft.launch_ft` and one of its faults (a
:class:`minddp.ft.report.FaultOutcome`) through :mod:`minddp.ft.report`'s measures and prints them;
it defines no measure of its own. The notebook keeps its claims in its cells; these print or read:

* :func:`print_phase_lines`: the lines of the rung and of the lighthouse that run each phase of an attempt;
* :func:`print_recoveries`: each fault's recovery as its moments, member by member, then the discard and the retry;
* :func:`print_rejoin`: the parts of a kill's rejoin, and what the survivors did meanwhile;

and, for the cells' claims, readers of the members' entries (one per member and attempt): :func:`attempts`,
:func:`in_a_new_group`, :func:`heals`; and of the lighthouse's evictions: :func:`evicted_s`.
"""

from __future__ import annotations

from minddp.ft.coordinator import Lighthouse
from minddp.ft.report import asked_s, first_request_s, retry_work_s
from minddp.ft.rung import FaultTolerantTrainer
from minddp.notebook.lesson import listed
from minddp.notebook.source import key_lines

#: (phase, method, a text that the line doing it holds), in the rung (:class:`FaultTolerantTrainer`)
RUNG_LINES = [
    ("each step", "train", "self.until_committed("),
    ("phase 1", "until_committed", "quorum = self.coordinator.quorum("),
    ("phases 2 and 3", "until_committed", 'entry["healed"] = self.rebuild_group('),
    ("phase 4", "until_committed", "value = work(quorum, entry)"),
    ("phase 4", "forward_backward", "shard = self.task.shard("),
    ("after a failure", "until_committed", "self.drop_group()"),
    ("phase 5", "until_committed", "committed = self.coordinator.should_commit("),
    ("on a commit", "until_committed", " on_commit()"),
    ("after every attempt", "until_committed", " after_attempt()"),
]
#: the same, in the lighthouse (:class:`Lighthouse`)
LIGHTHOUSE_LINES = [
    ("phase 1", "form_quorum", "if not live <= set(asking)"),
    ("phase 1", "form_quorum", 'step = max(r["step"]'),
    ("phase 2", "form_quorum", "if members != self.members or self.dirty"),
    ("phase 5", "decide_votes", 'verdict = "discard"  # a member saw'),
    ("phase 5", "decide_votes", 'verdict = "commit"'),
    ("phase 5", "decide_votes", 'verdict = "discard"  # a member died'),
]


def print_phase_lines() -> None:
    """The source lines of the rung and of the lighthouse that run each phase of an attempt (notebook 07's
    list), found by :func:`minddp.notebook.source.key_lines`."""
    print(key_lines(FaultTolerantTrainer, RUNG_LINES))
    print(key_lines(Lighthouse, LIGHTHOUSE_LINES))


def ms(seconds: float) -> int:
    """``seconds`` in whole milliseconds.

    >>> ms(0.0996)
    100
    """
    return round(seconds * 1000)


def _first_discard(run, o) -> tuple | None:
    """The lighthouse's first discard after fault ``o`` (the one :attr:`FaultOutcome.discard_s` times), as its event
    ``("decision", tag, step, "discard", voters, t)``: ``voters``, the slots whose votes it had read; ``None``: none.

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(events=[("decision", "e0q1", 3, "commit", [0, 1, 2], 9.0),
    ...                               ("decision", "e0q1", 4, "discard", [2], 10.5)])
    >>> _first_discard(run, SimpleNamespace(fired=10.0))[4]
    [2]
    """
    return next((e for e in run.events if e[0] == "decision" and e[3] == "discard" and e[5] >= o.fired), None)


def _slots(slots) -> str:
    """``"slot 2"``, ``"slots 0 and 2"``, ``"slots 0, 1 and 2"``.

    >>> _slots([0, 1, 2]), _slots([2])
    ('slots 0, 1 and 2', 'slot 2')
    """
    return ("slot " if len(slots) == 1 else "slots ") + listed([str(s) for s in slots])


def print_recoveries(run, kill, raised, hang_s: float) -> None:
    """Each fault's recovery, in whole ms after the fault: for each member of the attempt that failed, the error it
    caught, the drop of its group (from the error to the vote: the rung stamps the vote right after the drop) and its
    vote; the discard, with the votes the lighthouse had read, and any vote cast it had not; the kill's exit recorded
    by the launcher, and which came last of it and the next quorum's requests (the quorum waits for both); the next
    quorum; the retry's work and the commit. Then whether either recovery lasted the hang bound."""
    errors = []  # ms from its fault to each member's error, over both faults
    for o in (kill, raised):
        fired = o.fired
        print(f"{o.fault}, ms after it:")
        decision = _first_discard(run, o)
        if decision is not None:
            _, tag, step, _, voters, _ = decision
            tried = sorted(
                ((s, e) for s, _, e in run.entries if e["tag"] == tag and e["step"] == step and "t_vote" in e),
                key=lambda se: se[1].get("t_error", se[1]["t_vote"]),
            )
            for s, e in tried:  # the failed attempt's members that voted, by when they caught their error
                vote = f"voted {'yes' if e['ok'] else 'no'} {ms(e['t_vote'] - fired)}"
                if "t_error" in e:  # the rung stamps the vote right after drop_group: the gap is the drop
                    what = "raised" if s == o.fault.slot else "caught an error"
                    drop = ms(e["t_vote"] - fired) - ms(e["t_error"] - fired)
                    print(f"  slot {s} {what} {ms(e['t_error'] - fired)}, dropped its group ({drop} ms), {vote}")
                    errors.append(ms(e["t_error"] - fired))
                else:
                    print(f"  slot {s} {vote}")
            ok = {s: e["ok"] for s, e in tried}
            by = [[s for s in voters if ok.get(s) is v] for v in (False, True)]  # the no votes, the yes votes
            votes = " and ".join(
                f"the {v} vote{'s' if len(slots) > 1 else ''} of {_slots(slots)}"
                for v, slots in zip(("no", "yes"), by)
                if slots
            )
            unread = [s for s in ok if s not in voters]  # votes cast that the lighthouse had not read yet
            when = f", before reading {_slots(unread)}'s" if unread else ", every vote cast read"
            print(f"  attempt discarded {ms(o.discard_s)}, on {votes or 'no vote'}{when}")
        asked, quorum = ms(asked_s(run, o)), ms(o.quorum_s)
        asked = min(asked, quorum)
        if o.exit_s is None:
            print(f"  last request {asked}, next quorum {quorum}")
        else:  # the quorum waits for both: the survivors' requests, and the launcher's record of the exit
            exited, slot = ms(o.exit_s), o.fault.slot
            order = (
                f"slot {slot}'s exit recorded by the launcher {exited}, then the survivors' last request {asked}"
                if exited <= asked
                else f"the survivors' last request {asked}, then slot {slot}'s exit recorded by the launcher {exited}"
            )
            print(f"  {order}; next quorum {quorum}")
        work = retry_work_s(run, o)
        retry = "" if work is None else f"work {ms(work[0])}-{ms(work[1])}, "
        print(f"  step {o.committed_step} tried again: {retry}committed {ms(o.recovery_s)}")
    late = [o for o in (kill, raised) if o.recovery_s >= hang_s]
    if late:
        print(
            " and ".join(f"the {o.fault.kind}'s" for o in late).capitalize() + " recovery lasted the hang bound or more"
        )
    elif errors:  # no member waited for its collective's timeout (the hang bound)
        print(f"Neither recovery lasted the {hang_s:g} s hang bound: every error came by {max(errors)} ms.")
    else:
        print(f"Neither recovery lasted the {hang_s:g} s hang bound.")


def print_rejoin(run, o, full_world_at: tuple[int, ...] = ()) -> None:
    """For a kill ``o``, in words: when the survivors had committed the step and their later steps, and
    whether the run's ``full_world_at`` then held them for the slot; when the slot was back (the rejoin), and whether
    its new process's start-up was most of it. Then the rejoin in the parts that add up to it, each with its share:
    until the launcher started the new process; its start-up, to its first quorum request; from that request to the
    quorum."""
    slot = o.fault.slot
    others = [str(s) for s in sorted(o.rejoin_steps) if s != slot]  # the survivors, members of the rejoin's quorum
    last_step, last = o.last_commit
    rejoin, start, asked = ms(o.rejoin_s), ms(o.restart_s), ms(first_request_s(run, o))
    startup = asked - start

    def share(t_ms: int) -> str:
        return "under 1%" if 0 < t_ms < rejoin / 200 else f"{t_ms / rejoin:.0%}"

    steps = f"steps {o.committed_step}-{last_step}" if last_step > o.committed_step else f"step {last_step}"
    # they had committed their steps before the new process asked: the scripted quorum waited for it
    held = o.healed_at in full_world_at and ms(last) < asked
    why = f", then trained nothing until step {o.healed_at}'s quorum (full_world_at held it for slot {slot})"
    how = ", most of it its new process starting up" if 2 * startup > rejoin else ""
    print(
        f"slots {' and '.join(others)} committed {steps} by {ms(last)} ms after the kill{why if held else ''}; slot "
        f"{slot} was back at {rejoin} ms (the rejoin){how}:"
    )
    parts = [
        (start, f"until the launcher started slot {slot}'s new process"),
        (
            startup,
            "its start-up (forked with torch imported, it connected to the lighthouse and built its model and"
            " optimizer), to its first quorum request",
        ),
        (rejoin - asked, f"from that request to step {o.healed_at}'s quorum"),
    ]
    for t, span in parts:
        print(f"  {t} ms ({share(t)}) {span}")


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


def evicted_s(run, o) -> list[float]:
    """Seconds from the fault ``o`` to each eviction of its slot by the lighthouse (as silent).

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(events=[("evict", 1, 0, 12.5), ("evict", 2, 0, 13.0), ("quorum", "t", [0], {}, 14.0)])
    >>> evicted_s(run, SimpleNamespace(fired=10.0, fault=SimpleNamespace(slot=1)))
    [2.5]
    """
    return [e[3] - o.fired for e in run.events if e[0] == "evict" and e[1] == o.fault.slot]


def heals(run) -> list[tuple[int, int, bool]]:
    """``(slot, step, committed)`` of each attempt in which a member was healed, in the order recorded."""
    return [(s, e["step"], e["committed"]) for s, _, e in run.entries if e["healed"]]
