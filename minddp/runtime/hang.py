"""Hang detection: name the rank that stopped, within seconds rather than after the collective timeout.

When one rank stops, the others wait in their next collective until its timeout, and the error then
names *them*. This module names the right rank, fast and cheaply:

1. **every rank beats**: a daemon thread (:class:`Heartbeat`) writes a small :class:`Beat` to the
   launcher's store every second (counter, step, collectives launched, CPU time, phase);
2. **a monitor reads them** (:class:`Detector`): the local launcher, or ranks 0 and 1 under
   torchrun;
3. **rules name a rank** after ``hang_s``: *frozen* (its counter stopped while another's moves),
   *behind* (everyone waits in a collective it has not joined, and it is idle), *stalled* (no rank
   moved for ``stall_s``);
4. **the run ends** naming the rank, its step and the rule, with its Python stack if it is alive.

The rules in detail, the bound and the cost: ``docs/reliability.md`` (No hangs).

Example (the *frozen* rule, fed one beat a second)::

    >>> detector = Detector(hang_s=30)
    >>> beat = lambda n: Beat(n=n, step=5, seq=10, cpu=1.0, pid=1, host="h")
    >>> verdicts = [detector.observe({0: beat(t), 1: beat(0)}, now=float(t)) for t in range(32)]
    >>> verdicts[-1].rule, verdicts[-1].ranks
    ('frozen', [1])
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from minddp.runtime import compat
from minddp.runtime.device import env_seconds

#: Seconds between two beats of a rank (and between two looks of the monitor).
BEAT_S = 1.0

#: Seconds a rank may stop (frozen or behind, see the module doc) before the run ends naming it.
DEFAULT_HANG_S = env_seconds("MINDDP_HANG_TIMEOUT", 30.0)

#: A training thread using less CPU than this share of the time it was watched is idle, not computing.
IDLE_CPU_SHARE = 0.1

_BEAT_KEY, _VERDICT_KEY, _STACK_KEY = "beat/{}", "verdict", "stack/{}"


@dataclass
class Beat:
    """One rank's record, as written to the store (one line of text)."""

    n: int  # beats so far: moves while the process runs at all
    step: int | None  # last step announced with report_step, if any
    seq: int | None  # collectives launched on the default group, if it exists
    cpu: float | None  # CPU seconds used by the training thread
    pid: int
    host: str
    phase: str = ""  # "" while training; what it does alone (see alone()); "done" when finished

    def encode(self) -> str:
        def num(x):
            return "-" if x is None else str(x)

        return " ".join(
            [
                str(self.n),
                num(self.step),
                num(self.seq),
                "-" if self.cpu is None else f"{self.cpu:.3f}",
                str(self.pid),
                self.host,
                self.phase,
            ]
        )

    @staticmethod
    def decode(text: str | bytes) -> "Beat":
        if isinstance(text, bytes):
            text = text.decode()
        n, step, seq, cpu, pid, host, *phase = text.split(" ", 6)

        def num(x, kind=int):
            return None if x == "-" else kind(x)

        return Beat(int(n), num(step), num(seq), num(cpu, float), int(pid), host, phase[0] if phase else "")


# -- in a rank ----------------------------------------------------------------------------------------


def _thread_cpu_clock(ident: int | None):
    """A function returning the CPU seconds of thread ``ident`` so far, or None where the OS cannot say."""
    try:
        clock = time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError, TypeError):  # not Unix, or the thread is gone
        return lambda: None

    def read():
        try:
            return time.clock_gettime(clock)
        except OSError:
            return None

    return read


class Heartbeat:
    """Step 1, inside a rank: a daemon thread that writes this rank's :class:`Beat` every ``every_s``.

    It also looks for a verdict naming this rank (written by the monitor) and
    answers with the Python stack of the training thread, then calls
    ``on_verdict`` (under torchrun: print it and exit). With ``monitor`` (a
    :class:`Monitor`) the thread also watches the other ranks (under torchrun).
    """

    def __init__(self, store, rank: int, every_s: float = BEAT_S, monitor: "Monitor | None" = None, on_verdict=None):
        self.store, self.rank, self.every_s = store, rank, every_s
        self.monitor, self.on_verdict = monitor, on_verdict
        self._lock = threading.Lock()
        self._n, self._step, self._phase, self._group_live = 0, None, "", False
        self._seq = None
        self._trainer = threading.main_thread().ident
        self._cpu = _thread_cpu_clock(self._trainer)
        self._host = socket.gethostname()
        self._stop = threading.Event()
        self._answered = False
        self._thread: threading.Thread | None = None

    # what the training thread calls
    def report(self, step: int) -> None:
        """This rank starts ``step``; written at once (a failure report then says where it happened)."""
        with self._lock:
            ident = threading.get_ident()
            if ident != self._trainer:  # the thread that reports steps is the one whose CPU time tells
                self._trainer, self._cpu = ident, _thread_cpu_clock(ident)
            self._step = step
            self._publish()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            self._publish()

    def group_live(self, live: bool) -> None:
        """The default group exists (its collective count can be read) or is about to go."""
        with self._lock:
            if not live:
                self._seq = compat.default_group_sequence()  # keep the last count: the group is going away
            self._group_live = live

    # the thread
    def start(self) -> "Heartbeat":
        self._publish_locked()
        self._thread = threading.Thread(target=self._run, name="minddp-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread and let go of its store connection, now rather than at interpreter exit.

        A daemon thread still inside a store call while Python shuts down
        aborts the process ("terminate called without an active exception")
        after a run that went well; so the thread is joined and the
        connection dropped here.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.every_s)
        with self._lock:
            self.store = _Gone()
            if self.monitor is not None:
                self.monitor.store = _Gone()

    def _publish_locked(self) -> None:
        with self._lock:
            self._publish()

    def _publish(self) -> None:  # holds self._lock
        self._n += 1
        if self._group_live:
            self._seq = compat.default_group_sequence()
        beat = Beat(self._n, self._step, self._seq, self._cpu(), os.getpid(), self._host, self._phase)
        try:
            self.store.set(_BEAT_KEY.format(self.rank), beat.encode())
        except Exception:  # noqa: BLE001 - the store is gone (launcher ended): its watcher ends this rank
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._publish_locked()
            try:
                self._look_for_verdict()
                if self.monitor is not None:
                    self.monitor.look()
            except Exception:  # noqa: BLE001 - watching must never break the rank it watches
                pass

    def _look_for_verdict(self) -> None:
        if self._answered or not self.store.check([_VERDICT_KEY]):
            return
        verdict = self.store.get(_VERDICT_KEY).decode()
        culprits = [int(r) for r in verdict.split(" ", 1)[0].split(",")]
        if self.rank not in culprits:
            return
        self._answered = True
        stack = _stack_of(self._trainer)
        self.store.set(_STACK_KEY.format(self.rank), stack)
        if self.on_verdict is not None:
            self.on_verdict(verdict.split(" ", 1)[1], stack)


def _stack_of(ident: int) -> str:
    """The Python stack of thread ``ident``, from the function the launcher called on (its machinery left out)."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return "(no Python stack: the thread is gone)\n"
    frames = traceback.extract_stack(frame)
    launcher = os.path.join(os.path.dirname(__file__), "launch.py")
    starts = [i for i, f in enumerate(frames) if f.filename == launcher]
    return "".join(traceback.format_list(frames[starts[-1] + 1 :] if starts else frames))


class _Gone:
    """Where a stopped heartbeat's store was: every call is a no-op that finds nothing."""

    def set(self, *a):
        pass

    def check(self, *a):
        return False


_beat: Heartbeat | None = None


def install(beat: Heartbeat | None) -> None:
    """Make ``beat`` this process's heartbeat (what :func:`report_step` and :func:`alone` talk to)."""
    global _beat
    _beat = beat


def current() -> Heartbeat | None:
    return _beat


@contextlib.contextmanager
def alone(what: str):
    """This rank works alone here (``what``: e.g. "writing the checkpoint"); peers may wait for it.

    The *behind* rule then spares it (the collective timeout still bounds the wait).
    """
    beat = _beat
    if beat is None:
        yield
        return
    beat.set_phase(what)
    try:
        yield
    finally:
        beat.set_phase("")


# -- in the monitor -----------------------------------------------------------------------------------


@dataclass
class Verdict:
    """Ranks to blame (``ranks``), one line each (``why``), their last steps, and the rule: frozen/behind/stalled."""

    ranks: list[int]
    why: dict[int, str]
    steps: dict[int, int | None]
    rule: str

    def line(self) -> str:
        return "; ".join(self.why[r] for r in self.ranks)


@dataclass
class _Seen:
    beat: Beat
    alive_at: float  # when its counter last moved
    cpu: deque = field(default_factory=deque)  # (when, training-thread CPU seconds), the last hang_s or so

    def cpu_used(self, since: float) -> float | None:
        """CPU seconds the training thread used from ``since`` to its latest beat (None: unknown)."""
        old = next(((t, c) for t, c in self.cpu if t >= since), None)
        if old is None or old[1] is None or self.beat.cpu is None:
            return None
        return self.beat.cpu - old[1]


@dataclass
class Detector:
    """Steps 2-3: fed every rank's latest :class:`Beat` about once a second, says when a rank is hung.

    Pure logic on the beats and a clock (``now``), so that each rule can be
    tested on its own. ``hang_s`` 0 or None turns the frozen and behind rules
    off; ``stall_s`` None turns the stalled rule off.
    """

    hang_s: float | None
    stall_s: float | None = None
    seen: dict[int, _Seen] = field(default_factory=dict)
    last_look: float | None = None
    quiet_since: float | None = None

    def observe(self, beats: dict[int, Beat | None], now: float) -> Verdict | None:
        """``beats``: rank -> its record (None: none yet) for every rank still running."""
        if self.last_look is not None and now - self.last_look > 3 * BEAT_S + 2:
            # The monitor itself was held up (a loaded machine, a suspended laptop): what it did not
            # see, it cannot judge. Start the clocks again rather than blame a rank for the gap.
            for s in self.seen.values():
                s.alive_at = now
                s.cpu.clear()
            self.quiet_since = now
        self.last_look = now
        for rank, beat in beats.items():
            if beat is None:
                continue
            old = self.seen.get(rank)
            if old is None:
                old = self.seen[rank] = _Seen(beat, now)
                self.quiet_since = now
            if beat.n != old.beat.n:
                old.alive_at = now
            if (beat.step, beat.seq, beat.phase) != (old.beat.step, old.beat.seq, old.beat.phase):
                self.quiet_since = now
            old.beat = beat
            old.cpu.append((now, beat.cpu))
            while old.cpu and now - old.cpu[0][0] > (self.hang_s or 0) + 3 * BEAT_S:
                old.cpu.popleft()
        running = {r: self.seen[r] for r, b in beats.items() if b is not None and self.seen[r].beat.phase != "done"}
        for rank in [r for r in self.seen if r not in beats]:  # finished: no longer watched; that is progress
            del self.seen[rank]
            self.quiet_since = now
        if len(running) < 1:
            return None
        return self._frozen(running, now) or self._behind(running, now) or self._stalled(running, now)

    def _frozen(self, running: dict[int, _Seen], now: float) -> Verdict | None:
        if not self.hang_s:
            return None
        frozen = [r for r, s in running.items() if now - s.alive_at > self.hang_s]
        alive = [r for r, s in running.items() if now - s.alive_at <= max(3 * BEAT_S, self.hang_s / 2)]
        if not frozen or not alive:  # nobody fresh to compare with: the store or the whole machine paused
            return None
        why = {
            r: (
                f"rank {r} stopped responding{_at(running[r].beat.step)}: no heartbeat for "
                f"{now - running[r].alive_at:.0f} s while ranks {alive} are alive (the process is stopped "
                "(SIGSTOP, a debugger), swapped out, or stuck in native code holding Python's GIL)"
            )
            for r in frozen
        }
        return Verdict(frozen, why, {r: running[r].beat.step for r in frozen}, "frozen")

    def _behind(self, running: dict[int, _Seen], now: float) -> Verdict | None:
        if not self.hang_s or len(running) < 2 or self.quiet_since is None:
            return None
        beats = {r: s.beat for r, s in running.items()}
        if any(b.step is None or b.seq is None for b in beats.values()):
            return None  # armed by training: before the first step, ranks may differ
        quiet = now - self.quiet_since
        if quiet <= self.hang_s:
            return None
        low, high = min(b.seq for b in beats.values()), max(b.seq for b in beats.values())
        if low == high:
            return None  # nobody waits for anybody: all compute, or all stuck alike
        waiting = sorted(r for r, b in beats.items() if b.seq > low)
        behind = []
        for r, s in sorted(running.items()):
            b = s.beat
            if b.seq != low or b.phase:
                continue  # working alone on purpose: the collective timeout bounds it
            used = s.cpu_used(now - self.hang_s)
            if used is not None and used > IDLE_CPU_SHARE * self.hang_s:
                continue  # its training thread computes: a straggler, not a hang
            behind.append(r)
        if not behind:
            return None
        why = {
            r: (
                f"rank {r} hung{_at(beats[r].step)}: ranks {waiting} have waited {quiet:.0f} s in a collective "
                f"it has not joined (it launched {beats[r].seq} collectives, they {high}); its training thread "
                "is idle (blocked in a wait that is not a collective: a lock, I/O, a sleep, input)"
            )
            for r in behind
        }
        return Verdict(behind, why, {r: beats[r].step for r in behind}, "behind")

    def _stalled(self, running: dict[int, _Seen], now: float) -> Verdict | None:
        if self.stall_s is None or self.quiet_since is None or now - self.quiet_since <= self.stall_s:
            return None
        # Stuck, not starved: every rank's counter moved more than stall_s into the quiet. A process that did not
        # run at all (a machine too busy to schedule it) beat no more than it progressed: no verdict on it.
        if any(s.alive_at - self.quiet_since <= self.stall_s for s in running.values()):
            return None
        ranks = sorted(running)
        why = {
            r: (
                f"no rank made progress for {self.stall_s:.0f} s: rank {r} hung{_at(running[r].beat.step)} (e.g. "
                "in a collective every rank entered but none can finish, or a comm-hook callback that "
                "deadlocked); minddp ended it"
            )
            for r in ranks
        }
        return Verdict(ranks, why, {r: running[r].beat.step for r in ranks}, "stalled")


def _at(step: int | None) -> str:
    return "" if step is None else f" at step {step}"


def read_beats(store, ranks) -> dict[int, Beat | None]:
    """The latest record of each of ``ranks`` (None where there is none yet); never blocks on a missing key."""
    keys = [_BEAT_KEY.format(r) for r in ranks]
    out: dict[int, Beat | None] = {r: None for r in ranks}
    present = [(r, k) for r, k in zip(ranks, keys) if store.check([k])]
    if present:
        for (r, _), value in zip(present, store.multi_get([k for _, k in present])):
            out[r] = Beat.decode(value)
    return out


def announce(store, verdict: Verdict) -> None:
    """Tell the named ranks (their heartbeat reads it) so that each writes where it was stuck."""
    store.set(_VERDICT_KEY, ",".join(map(str, verdict.ranks)) + " " + verdict.line())


def stacks(store, ranks, wait_s: float) -> dict[int, str]:
    """The stacks the named ranks wrote in answer to :func:`announce`, waiting up to ``wait_s`` for them."""
    deadline, got = time.monotonic() + wait_s, {}
    while True:
        for r in ranks:
            key = _STACK_KEY.format(r)
            if r not in got and store.check([key]):
                got[r] = store.get(key).decode()
        if len(got) == len(ranks) or time.monotonic() >= deadline:
            return got
        time.sleep(0.1)


class Monitor:
    """Under torchrun: ranks 0 and 1 watch every rank's beats from their heartbeat thread.

    The one that acts is the lowest watcher not named in the verdict (so
    rank 1 acts only when rank 0 is the one that stopped). It prints the
    verdict, kills named ranks that are frozen on this host (their pid is in
    their beat; a stopped process ignores everything but SIGKILL), gives the
    named ranks a moment to print their stacks and exit, then exits itself
    with status 1, which makes torchrun end the job.
    """

    def __init__(self, store, rank: int, world: int, hang_s: float | None, stall_s: float | None = None, exit=os._exit):
        self.store, self.rank, self.world = store, rank, world
        self.detector = Detector(hang_s, stall_s)
        self.exit = exit
        self.acted: Verdict | None = None

    def look(self) -> Verdict | None:
        beats = read_beats(self.store, range(self.world))
        verdict = self.detector.observe(beats, time.monotonic())
        if verdict is None or self.acted is not None:
            return None
        watchers = [r for r in (0, 1) if r < self.world and r not in verdict.ranks]
        if not watchers or watchers[0] != self.rank:
            return None
        self.acted = verdict
        announce(self.store, verdict)
        print(f"minddp: {verdict.line()}; ending the job", file=sys.stderr, flush=True)
        host = socket.gethostname()
        if verdict.rule == "frozen":
            for r in verdict.ranks:
                beat = beats[r]
                if beat is not None and beat.host == host:
                    _kill(beat.pid)
        stacks(self.store, [r for r in verdict.ranks if verdict.rule != "frozen"], wait_s=2 * BEAT_S)
        time.sleep(BEAT_S)
        self.exit(1)
        return verdict


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
