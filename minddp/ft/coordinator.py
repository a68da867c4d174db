"""The coordinator ("lighthouse"): who is in, and whether a step counts. It outlives any training rank.

A process of its own (started by :mod:`minddp.ft.launch`) that hosts a TCPStore and, in one loop,
answers two questions for the ranks (docs/fault-tolerance.md, "What one step does", gives the keys,
liveness and restarts in full):

1. **quorum**: a rank about to train step ``s`` posts ``req/<slot>`` and waits for its answer, given
   once every *live* slot has asked: the members are the slots that asked, sorted (a member's group
   rank is its index), under a new tag when the members changed or a step was discarded;
2. **should_commit**: after its backward a rank posts ``vote/<slot>`` and waits for the decision:
   ``commit`` once every member voted ok, ``discard`` as soon as one voted not ok or, the votes in all ok, one
   that has not voted is no longer live (a lost member decides nothing before another's vote is in).
   One process decides, so a step counts on all ranks or on none.

A slot is *live* while its heartbeat (``beat/<slot>``, every :data:`BEAT_S`) keeps changing within
``hang_s`` and the launcher has not reported it gone (through a queue: the lighthouse writes ``gone/<slot>``
itself); a silent one is *evicted*, unless its last beat says it is done (:data:`DONE`). The store listens
on the loopback address only. Nothing here survives a restart of the lighthouse, and nothing needs to: the
ranks post their request or vote again.

The trained state lives in the ranks only, so the lighthouse keeps who *holds* it: the members of the newest
committed step, each as the incarnation that voted. It never lets the state go: a silent holder is evicted only
while another holder is live (the last one is waited for, however long: evicting it would lose every committed
step), and no quorum trains a step older than the newest committed one. Should every holder be gone all the
same (their processes exited), it says so (``lost``) and the launcher stops the run rather than train from
step 0 again. (A new lighthouse learns the holders at its first commit.)
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

#: Seconds between two heartbeats of a rank.
BEAT_S = 0.05
#: What a rank's last beat says once it has handed in its result (``beat/<slot>`` = ``<incarnation>:done``): a
#: finished rank, neither live nor ever evicted, however long its process then takes to exit.
DONE = "done"
#: Seconds between two looks of the lighthouse at the store (one multi_get of every slot's keys).
POLL_S = 0.002


def lighthouse_main(
    port: int,
    max_world: int,
    hang_s: float,
    epoch: int,
    min_replicas: int,
    events,
    parent_pid: int,
    full_world_at: tuple[int, ...] = (),
    gone=None,
    stderr=None,
    plan=None,
) -> None:
    """The coordinator's process: host the store on ``port`` (0: the OS picks), answer until killed.

    ``events``: its pipe to the launcher (:meth:`~minddp.runtime.processes.ChildPipes.mailbox`); ``gone``: a
    queue of ``(slot, incarnation)`` whose process the launcher saw exit; ``stderr``: a pipe to
    the launcher's filter (:class:`~minddp.runtime.processes.ChildPipes`); ``plan``: the run's faults
    (:class:`~minddp.ft.faults.FaultPlan`), for ``coord@STEP``.
    """
    from minddp.runtime.processes import HELPER_BLOCKED, Outbox, use_stderr, watch_parent

    if stderr is not None:
        use_stderr(stderr)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELPER_BLOCKED)
    watch_parent(parent_pid, None)
    events = Outbox(events)  # whole messages, each in the pipe before put returns
    store = _serve(port)
    events.put(("listening", epoch, store.port, time.time()))
    lighthouse = Lighthouse(store, max_world, hang_s, epoch, min_replicas, events.put, full_world_at, gone)
    lighthouse.plan = plan
    lighthouse.run()


def _serve(port: int) -> dist.TCPStore:
    """The store on ``port``, on the loopback address only; after a restart the old server may hold the port a
    moment: retry for 5 s."""
    from minddp.runtime.loopback import loopback_store

    deadline = time.monotonic() + 5.0
    while True:
        try:
            return loopback_store(port, timeout=timedelta(seconds=30))
        except (OSError, RuntimeError, dist.DistError) as exc:
            if time.monotonic() > deadline:
                print(
                    f"minddp.ft lighthouse: cannot listen on port {port} ({exc}); end the process holding it",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
            time.sleep(0.1)


def finished(beat: str) -> bool:
    """A beat that says its rank is done (:data:`DONE`)."""
    return beat.endswith(f":{DONE}")


class Lighthouse:
    """The loop: read beats, requests and votes; write quorums and decisions; tell the launcher."""

    def __init__(
        self,
        store,
        max_world: int,
        hang_s: float,
        epoch: int,
        min_replicas: int,
        say,
        full_world_at: tuple[int, ...] = (),
        gone=None,
    ):
        self.store, self.slots, self.hang_s, self.epoch = store, range(max_world), hang_s, epoch
        self.notices = gone  # (slot, incarnation) the launcher saw exit, written here as gone/<slot>
        self.min_replicas, self.say = min_replicas, say
        # Steps whose first attempt waits for the whole world (a test's script: each fault then meets a full
        # world, and a restarted rank is back before the end, whatever the machine's speed).
        self.full_world_at = set(full_world_at)
        self.started = time.monotonic()
        self.beats: dict[int, tuple] = {}  # slot -> (last beat seen, when it or a request/vote changed, those)
        self.evicted: set[str] = set()  # "slot:incarnation" already reported
        self.answered: dict[int, int] = {}  # slot -> last request seq answered
        self.decided: set[tuple[str, int]] = set()
        self.quorum_id, self.members, self.dirty = 0, None, True
        self.newest, self.holders = 0, {}  # steps committed; slot -> the incarnation that holds that state
        self.said_lost = False
        self.plan = None  # the run's faults (coord@STEP)

    def run(self) -> None:
        keys = [f"{kind}/{slot}" for kind in ("beat", "req", "vote", "gone") for slot in self.slots]
        for key in keys:  # every key exists from the start, so one multi_get reads them all
            self.store.compare_set(key, "", "")
        while True:
            now = time.monotonic()
            self.post_gone()
            self.seen = dict(zip(keys, (v.decode() or None for v in self.store.multi_get(keys))))
            self.read_beats(now)
            self.form_quorum(now)
            self.decide_votes(now)
            time.sleep(POLL_S)

    # -- liveness ------------------------------------------------------------------------------------

    def post_gone(self) -> None:
        """``gone/<slot>`` for each rank process the launcher saw exit (the survivors need not wait out hang_s)."""
        while self.notices is not None:
            try:
                slot, incarnation = self.notices.get_nowait()
            except queue.Empty:
                return
            self.store.set(f"gone/{slot}", str(incarnation))

    def read_beats(self, now: float) -> None:
        for slot in self.slots:
            beat = self._get(f"beat/{slot}")
            if beat is not None and slot in self.beats and self._activity(slot) != self.beats[slot][2]:
                self.beats[slot] = (
                    self.beats[slot][0],
                    now,
                    self._activity(slot),
                )  # a request or vote: alive
            if beat is not None and (slot not in self.beats or self.beats[slot][0] != beat):
                self.beats[slot] = (beat, now, self._activity(slot))
            if beat is not None and not self.live(slot, now) and not self.gone(slot, beat) and not finished(beat):
                key = f"{slot}:{beat.split(':')[0]}"
                if key not in self.evicted and not self.last_holder(slot, now):  # silent: frozen; the launcher ends it
                    self.evicted.add(key)
                    self.say(("evict", slot, int(beat.split(":")[0]), time.time()))

    def gone(self, slot: int, beat: str | None = None) -> bool:
        beat = beat or self._get(f"beat/{slot}") or "-1"
        return self._get(f"gone/{slot}") == beat.split(":")[0]  # the launcher saw this incarnation exit

    def live(self, slot: int, now: float) -> bool:
        if slot not in self.beats:  # never heard: a process still starting, or (new lighthouse) reconnecting
            return False
        beat, changed, _ = self.beats[slot]
        return now - changed < self.hang_s and not self.gone(slot, beat) and not finished(beat)

    def holds(self, slot: int) -> bool:
        """The incarnation of ``slot`` that holds the trained state is still there (not exited, evicted, replaced)."""
        beat = self._get(f"beat/{slot}")
        inc = self.holders.get(slot)
        return (
            inc is not None
            and beat is not None
            and int(beat.split(":")[0]) == inc
            and not self.gone(slot, beat)
            and f"{slot}:{inc}" not in self.evicted
        )

    def last_holder(self, slot: int, now: float) -> bool:
        """``slot`` holds the state and no other holder is live or done: evicting it would lose the state."""
        others = [o for o in self.holders if o != slot and self.holds(o)]
        return self.holds(slot) and not any(self.live(o, now) or finished(self._get(f"beat/{o}")) for o in others)

    def dead(self, slot: int, now: float) -> bool:
        """Known gone, silent past the hang bound, or (to a new lighthouse) never heard within it."""
        if slot not in self.beats:
            return now - self.started > self.hang_s
        return not self.live(slot, now)

    # -- 1. quorum -----------------------------------------------------------------------------------

    def form_quorum(self, now: float) -> None:
        if now - self.started < 3 * BEAT_S:  # a new lighthouse first learns who beats
            return
        if (
            self.members is None
            and any(s not in self.beats for s in self.slots)
            and (self.epoch == 0 or now - self.started < self.hang_s)
        ):
            return  # the first quorum: every slot has started (or has had time)
        asking = {}
        for slot in self.slots:
            req = self._get(f"req/{slot}")
            if req is not None and json.loads(req)["id"] != self.answered.get(slot):
                asking[slot] = json.loads(req)
        live = {slot for slot in self.slots if self.live(slot, now)}
        asking = {slot: r for slot, r in asking.items() if slot in live}
        if not live <= set(asking):  # wait until every live slot asks
            return
        if not asking or len(asking) < self.min_replicas:
            return
        step = max(r["step"] for r in asking.values())  # the attempt's step, quorum.max_step: the largest asked for
        if step < self.newest:  # nobody asking holds the newest state: wait for a holder, never train steps again
            self.state_lost(step)
            return
        if step in self.full_world_at:
            if len(asking) < len(self.slots):
                return
            self.full_world_at.discard(step)  # only its first attempt waits
        members = sorted(asking)
        if members != self.members or self.dirty:  # a new group: new members, or the last one saw a failure
            self.quorum_id, self.members, self.dirty = self.quorum_id + 1, members, False
            self.say(
                (
                    "quorum",
                    f"e{self.epoch}q{self.quorum_id}",
                    members,
                    {s: asking[s]["step"] for s in members},
                    time.time(),
                )
            )
        tag = f"e{self.epoch}q{self.quorum_id}"
        steps = {str(s): asking[s]["step"] for s in members}
        for slot, req in asking.items():
            self.store.set(f"quorum/{slot}/{req['id']}", json.dumps({"tag": tag, "members": members, "steps": steps}))
            self.answered[slot] = req["id"]

    def state_lost(self, asked: int) -> None:
        """If every holder of the state is gone, tell the launcher (once), with ``asked``, the step the processes
        asking asked for: nothing can bring the state back."""
        if self.said_lost or any(self.holds(slot) for slot in self.holders):
            return
        self.said_lost = True
        how = {s: (inc, "evicted" if f"{s}:{inc}" in self.evicted else "exited") for s, inc in self.holders.items()}
        self.say(("lost", self.newest, how, time.time(), asked))

    # -- 2. should_commit ----------------------------------------------------------------------------

    def decide_votes(self, now: float) -> None:
        ballots: dict[tuple[str, int], dict] = {}
        for slot in self.slots:
            vote = self._get(f"vote/{slot}")
            if vote is None:
                continue
            vote = json.loads(vote)
            key = (vote["quorum"], vote["step"])
            if key not in self.decided:
                ballot = ballots.setdefault(key, {"members": vote["members"], "ok": {}, "incarnation": {}})
                ballot["ok"][slot], ballot["incarnation"][slot] = vote["ok"], vote["incarnation"]
        for (tag, step), ballot in ballots.items():
            members, ok = ballot["members"], ballot["ok"]
            if not all(ok.values()):
                verdict = "discard"  # a member saw a failure
            elif all(m in ok for m in members):
                verdict = "commit"  # every member's step went through
            elif any(self.dead(m, now) for m in members if m not in ok):
                verdict = "discard"  # a member died before it could vote
            else:
                continue
            self.store.set(f"decision/{tag}/{step}", verdict)
            self.decided.add((tag, step))
            self.dirty |= verdict == "discard"
            self.say(("decision", tag, step, verdict, sorted(ok), time.time()))
            if verdict == "commit":
                self.hold(step, ballot["incarnation"])
                self.fault_after(step)

    def hold(self, step: int, incarnations: dict[int, int]) -> None:
        """``step`` committed: its members (as the incarnations that voted) hold the newest state."""
        if step + 1 > self.newest:
            self.newest, self.holders = step + 1, {}
        if step + 1 == self.newest:
            self.holders.update(incarnations)

    def fault_after(self, step: int) -> None:
        """``coord@STEP+1``: once ``step`` is committed, stop answering; the launcher, told, kills and replaces it.

        It stops here, not where the launcher's kill happens to find it: killed from outside a moment later, it
        might have decided the next step already, unheard (the ranks acting on a decision the launcher never saw).
        """
        index = None if self.plan is None else self.plan.due("coord", step + 1, None)
        if index is not None:
            self.plan.fire(index)  # marked fired, with the time (the step's decision is already in the launcher's
            # pipe: it then kills this process)
            while True:
                time.sleep(3600)

    def _activity(self, slot: int) -> tuple:
        return self._get(f"req/{slot}"), self._get(f"vote/{slot}")

    def _get(self, key: str) -> str | None:
        """``key``'s value as read at the top of this pass (None: nothing posted yet)."""
        return self.seen.get(key)
