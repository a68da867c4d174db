"""A rank's side of the coordinator: heartbeat, ``quorum(step)``, ``should_commit(...)``, a store for groups.

Every call survives a restart of the lighthouse: a store operation that
fails makes the rank connect again (for up to ``timeout_s``) and post its
request or vote again, and its last vote too (a peer may not have read that
step's decision before the old lighthouse went: the new one decides it again
from the same votes, so the same way). Past ``timeout_s`` without an answer the rank raises
:class:`CoordinatorLost`, one line naming the cause and the fix.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from minddp.ft.coordinator import BEAT_S, DONE
from minddp.runtime.loopback import loopback_host


class CoordinatorLost(RuntimeError):
    """The lighthouse did not answer for ``timeout_s``."""


@dataclass(frozen=True)
class Quorum:
    """Who trains the next step: ``members`` (slots, sorted), the step each is at, the group's tag."""

    tag: str
    members: list[int]
    steps: dict[int, int]
    slot: int

    @property
    def rank(self) -> int:  # this rank's place in the group
        return self.members.index(self.slot)

    @property
    def world(self) -> int:
        return len(self.members)

    @property
    def max_step(self) -> int:
        return max(self.steps.values())

    def behind(self) -> list[int]:
        """Members that must be healed (they are at an older step than the most advanced ones)."""
        return [m for m in self.members if self.steps[m] < self.max_step]

    def source(self) -> int:
        """The member that sends the live state to those behind: the first one at the newest step."""
        return min(m for m in self.members if self.steps[m] == self.max_step)


class Coordinator:
    """This rank's connection to the lighthouse at ``port``, as ``slot`` (incarnation ``incarnation``)."""

    def __init__(self, port: int, slot: int, incarnation: int, timeout_s: float = 60.0):
        self.port, self.slot, self.incarnation, self.timeout_s = port, slot, incarnation, timeout_s
        self.seq = 0
        self.last_vote = None  # posted again to a new lighthouse: a peer may still wait for its decision
        self.store = self._connect()
        self._beating = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="minddp-ft-beat", daemon=True)

    def start_beating(self) -> None:
        """From now on the lighthouse counts this rank live (call once ready to ask for a quorum)."""
        self._beating.set()
        self._beater.start()

    def finish(self) -> None:
        """This rank is done: its beats stop, and it says so (the lighthouse will not take it for a frozen one)."""
        self._beating.clear()
        if self._beater.is_alive():
            self._beater.join(timeout=1.0)
        try:
            self.store.set(f"beat/{self.slot}", f"{self.incarnation}:{DONE}")
        except (RuntimeError, dist.DistError):
            pass  # the lighthouse is gone: nobody is left to take this rank's silence for a freeze

    def quorum(self, step: int) -> Quorum:
        """Ask to train ``step``; block until the lighthouse names the members (everyone live has asked)."""
        self.seq += 1
        request_id = f"{self.incarnation}.{self.seq}"  # unique across restarts of this slot
        request = json.dumps({"id": request_id, "step": step})
        answer = self._ask(f"req/{self.slot}", request, f"quorum/{self.slot}/{request_id}")
        q = json.loads(answer)
        return Quorum(q["tag"], q["members"], {int(s): v for s, v in q["steps"].items()}, self.slot)

    def should_commit(self, quorum: Quorum, step: int, ok: bool) -> bool:
        """Vote on ``step`` (``ok``: nothing failed here); True only if every member's step went through."""
        vote = json.dumps(
            {"quorum": quorum.tag, "members": quorum.members, "step": step, "ok": ok, "incarnation": self.incarnation}
        )
        self.last_vote = vote
        return self._ask(f"vote/{self.slot}", vote, f"decision/{quorum.tag}/{step}") == "commit"

    # -- a store that may go away and come back -------------------------------------------------------

    def _ask(self, key: str, value: str, answer_key: str) -> str:
        deadline = time.monotonic() + self.timeout_s
        posted = False
        while time.monotonic() < deadline:
            try:
                if not posted:
                    self.store.set(key, value)
                    posted = True
                self.store.wait([answer_key], timedelta(seconds=max(0.1, deadline - time.monotonic())))
                return self.store.get(answer_key).decode()
            except (
                RuntimeError,
                dist.DistError,
            ):  # not yet, or the lighthouse went away: reach it, post again
                if not self._reachable():
                    self.store = self._connect(deadline)
                    if self.last_vote is not None and key != f"vote/{self.slot}":
                        self._post_again(f"vote/{self.slot}", self.last_vote)
                posted = False
        raise CoordinatorLost(
            f"minddp.ft rank {self.slot}: the coordinator (port {self.port}) gave no answer "
            f"to {key} for {self.timeout_s:.0f} s; restart the lighthouse, or give launch_ft a longer "
            "coordinator_timeout_s"
        )

    def _post_again(self, key: str, value: str) -> None:
        try:
            self.store.set(key, value)
        except (RuntimeError, dist.DistError):
            pass  # the next pass of _ask reconnects

    def _reachable(self) -> bool:
        try:
            self.store.check(["beat/0"])
            return True
        except (RuntimeError, dist.DistError):
            return False

    def _connect(self, deadline: float | None = None) -> dist.TCPStore:
        deadline = deadline or time.monotonic() + self.timeout_s
        while True:
            try:
                return dist.TCPStore(
                    loopback_host(),
                    self.port,
                    is_master=False,
                    timeout=timedelta(seconds=1),
                    wait_for_workers=False,
                )
            except (RuntimeError, dist.DistError):
                if time.monotonic() > deadline:
                    raise CoordinatorLost(
                        f"minddp.ft rank {self.slot}: cannot reach the coordinator at {loopback_host()} port "
                        f"{self.port} for {self.timeout_s:.0f} s; is the lighthouse running?"
                    )
                time.sleep(0.05)

    def _beat(self) -> None:
        store, count = None, 0
        while self._beating.is_set():
            count += 1
            try:
                store = store or self._connect(time.monotonic() + 3600)
                store.set(f"beat/{self.slot}", f"{self.incarnation}:{count}")
            except (RuntimeError, dist.DistError, CoordinatorLost):
                store = None  # reconnect at the next beat
            time.sleep(BEAT_S)
