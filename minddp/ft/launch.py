"""Start the lighthouse and N ranks, start again what dies, inject faults, report each one in a line.

Unlike :func:`minddp.runtime.launch.launch`, where a rank that dies ends the run (the
classic DDP contract, which every other stage keeps), :func:`launch_ft`
trains through: this process

1. starts the coordinator (:mod:`minddp.ft.coordinator`) in a process of its
   own, and learns its port;
2. starts one rank per slot (:mod:`minddp.ft.rung`);
3. watches, in passes with a 20 ms sleep between them: a rank process that exited without a result is
   posted ``gone`` to the coordinator once everything it sent has arrived (a result sent just before it exited
   is no loss; so the survivors need not wait out the hang bound; the events record the pass that found it
   ended, ``exit seen``, and the post, ``exited``)
   and, with ``restart``, started again as the next incarnation of its slot, which the survivors then heal; a rank the
   coordinator evicted (silent: frozen) is ended by its pid, then treated the
   same (a rank hands in its result before its beats stop, then says it is
   done: however long it takes to exit, it is never evicted); ``coord@STEP``:
   the coordinator stops answering once it has committed step STEP-1, and is
   killed and started again on the same port (as one that exited by itself);
4. returns every slot's result and a one-line report per fault
   (:func:`minddp.ft.report.fault_report`).

Ctrl-C, SIGTERM or SIGHUP end every process it started, by pid, and say so.
A rank that raises a real error (not a fault it can retry) ends the run with
that rank's line. Everything is bounded by ``run_timeout_s``.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from minddp.ft.coordinator import lighthouse_main
from minddp.ft.faults import Fault, FaultPlan
from minddp.ft.report import errors, exits, fault_report, timeline
from minddp.runtime.loopback import rank_env
from minddp.runtime.processes import (
    EXIT_WAIT_S,
    HELPER_BLOCKED,
    ChildPipes,
    Outbox,
    Stopped,
    end_processes,
    expected_connection_noise,
    rank_context,
    say_safely,
    stop_reason,
    stop_signals,
    use_stderr,
    watch_parent,
)

#: The launcher's sleep between two passes over its processes (each pass also takes results and drains events, so
#: a pass comes less often than this: it is not a bound on how soon an exit is seen).
PASS_SLEEP_S = 0.02


class FaultTolerantRunError(RuntimeError):
    """The run could not go on: a rank's real error, or no progress within the bound; ``events``: the run's events
    up to then, where the launcher has them (the trained state lost)."""

    def __init__(self, message: str, events: list | None = None):
        super().__init__(message)
        self.events = events or []


@dataclass
class FTRun:
    """What :func:`launch_ft` hands back."""

    results: dict[int, dict]  # slot -> the last incarnation's result
    events: list[tuple] = field(default_factory=list)  # coordinator and launcher events, in order, with times
    faults: list[Fault] = field(default_factory=list)
    fired_at: list[float | None] = field(default_factory=list)
    wall_s: float = 0.0
    entries: list[tuple[int, int, dict]] = field(default_factory=list)  # (slot, incarnation, entry), as reported:
    # one entry per member and attempt (an attempt: one quorum's try at one step; minddp.ft.report)

    def report(self) -> list[str]:
        """One line per fault (:func:`minddp.ft.report.fault_report`)."""
        return fault_report(self)

    def timeline(self) -> str:
        """The attempts, slot by slot (:func:`minddp.ft.report.timeline`)."""
        return timeline(self)

    def exits(self, after: float) -> list[tuple[int, float]]:
        """``(slot, s)`` of each exit recorded ``s`` seconds after ``after`` (:func:`minddp.ft.report.exits`)."""
        return exits(self, after)

    def errors(self, step: int) -> list[tuple[int, str]]:
        """``(slot, error)`` of each error caught at ``step``, in the order caught (:func:`minddp.ft.report.errors`)."""
        return errors(self, step)


def launch_ft(
    task,
    steps: int,
    world_size: int = 2,
    faults: list[Fault] = (),
    hang_s: float = 10.0,
    restart: bool = True,
    coordinator_timeout_s: float = 30.0,
    run_timeout_s: float = 300.0,
    digests: bool = False,
    full_world_at: tuple[int, ...] = (),
    rejoin_before_end: bool = False,
    restart_after_steps: int = 0,
    diloco: dict | None = None,
) -> FTRun:
    """Train ``task`` for ``steps`` committed steps on ``world_size`` slots through ``faults``.

    ``diloco``: DiLoCo instead of DDP (:mod:`minddp.ft.diloco`), with these options
    (``sync_every`` and those of :class:`~minddp.ft.diloco.FaultTolerantDiLoCo`); a step is then
    an outer sync, and the faults' steps name syncs.

    ``full_world_at``: steps whose first attempt waits for every slot (a test's
    script, so that each fault meets a full world whatever the machine's
    speed); ``rejoin_before_end`` adds the last step (a restarted rank is then
    back, healed, before the run ends). ``restart_after_steps``: a rank that
    died is started again only once that many more steps are committed (a
    machine that takes a while to come back; the survivors train meanwhile),
    or at once when every rank is down (no step can be committed then).
    Once the last step is committed, a process that is not one of its members
    (a rank still starting) is ended: the job is done.
    """
    full_from = tuple(sorted({*full_world_at, *([steps - 1] if rejoin_before_end else [])}))
    rung = None if diloco is None else {**diloco, "world_size": world_size}
    payload = pickle.dumps((task, steps, hang_s, coordinator_timeout_s, digests, rung))
    procs: dict[int, object] = {}  # slot -> its current process
    incarnation = {slot: 0 for slot in range(world_size)}
    lighthouse, epoch, port = None, 0, 0
    timeline: list[tuple] = []
    members_of: dict[str, list[int]] = {}  # quorum tag -> its members
    entries: list[tuple[int, int, dict]] = []  # (slot, incarnation, entry) of every attempt a rank reported
    committed = 0  # steps committed so far
    waiting: dict[int, int] = {}  # slot -> committed steps after which it is started again
    ended: dict[tuple[int, int], str] = {}  # (slot, incarnation) -> how that process ended (for the run's error)
    done: dict[int, dict] = {}
    t_start = time.time()
    with stop_signals():
        ctx = rank_context()  # inside: a stop while the process server starts still ends it (processes.end_helpers)
        plan = FaultPlan(list(faults), ctx)
        # What the coordinator and the ranks send, each process through a pipe of its own (ChildPipes.mailbox):
        # one frozen or killed while sending holds up nobody else.
        events, results = queue.SimpleQueue(), queue.SimpleQueue()
        # The ranks' and the coordinator's stderr, without torch's C++ warnings about the connections the faults
        # break on purpose: one line per fault is what the user reads (step 4); anything else passes.
        quiet = ChildPipes(expected_connection_noise)
        try:
            lighthouse, port, gone = _start_lighthouse(
                ctx, 0, world_size, hang_s, epoch, events, timeline, full_from, quiet, plan
            )  # step 1
            interfaces = rank_env()  # gloo's connections: loopback, as the coordinator's store, or the user's choice
            for slot in range(world_size):  # step 2
                procs[slot] = _start_rank(ctx, payload, slot, 0, port, plan, results, quiet, interfaces)
            coord_faults = [i for i, f in enumerate(plan.faults) if f.kind == "coord"]
            deadline = time.monotonic() + run_timeout_s
            while len(done) < world_size:  # step 3
                if waiting and not procs:  # every rank is down: no step can be committed to end the wait
                    waiting = dict.fromkeys(waiting, committed)  # so they start now (below); if the state went
                    # with them, the coordinator says so and the run stops (no process holds the trained state)
                if time.monotonic() > deadline:
                    raise FaultTolerantRunError(_timed_out(run_timeout_s, committed, steps, procs, done, waiting))
                # a coordinator that crashed, or that coord@STEP stopped (below): a new one on the same port, once the
                # old one's events are handled
                lighthouse_gone = lighthouse.exitcode is not None
                if lighthouse_gone:
                    lighthouse.posted.wait(EXIT_WAIT_S)  # all it sent is in `events`, handled now
                _take_results(results, done, entries)  # first: a rank that handed in its result is done
                for event in _drain(events):
                    timeline.append(event)
                    if (
                        event[0] == "evict"
                        and event[1] in procs
                        and event[1] not in done
                        and event[2] == incarnation[event[1]]
                    ):
                        procs[event[1]].kill()  # frozen: ended by its pid, then restarted below
                        ended[event[1], event[2]] = f"evicted at step {committed} (silent for {hang_s:g} s)"
                        timeline.append(("ended", event[1], event[2], time.time()))
                    if event[0] == "lost":  # the run's events so far go with it: what happened, for a reader
                        raise FaultTolerantRunError(_state_lost(event, hang_s, ended), events=list(timeline))
                    if event[0] == "quorum":
                        members_of[event[1]] = event[2]
                    if event[0] == "decision" and event[3] == "commit" and event[2] == steps - 1:
                        for slot in [s for s in procs if s not in members_of.get(event[1], ())]:
                            procs[slot].kill()  # still starting when the job ended: not needed
                            del procs[slot]
                            done[slot] = None
                        for slot in list(waiting):  # down when the job ended: not started again
                            del waiting[slot]
                            done[slot] = None
                    if event[0] == "decision" and event[3] == "commit":
                        committed = max(committed, event[2] + 1)
                        for i in [i for i in coord_faults if plan.faults[i].step == event[2] + 1]:
                            coord_faults.remove(i)  # it stopped answering once it committed that step (it fired)
                            lighthouse.kill()
                            lighthouse.join(5.0)
                            lighthouse_gone = True
                if lighthouse_gone:
                    timeline.append(("coordinator exited", epoch, lighthouse.exitcode, time.time()))
                    epoch += 1
                    lighthouse, _, gone = _start_lighthouse(
                        ctx, port, world_size, hang_s, epoch, events, timeline, full_from, quiet, plan
                    )
                for slot, p in list(procs.items()):
                    if p.exitcode is not None and slot not in done:
                        seen = time.time()  # this pass found the process ended
                        p.posted.wait(EXIT_WAIT_S)  # what it sent last, its result maybe, is all in `results`
                        _take_results(results, done, entries)
                        if slot in done:
                            continue
                        timeline.append(("exit seen", slot, incarnation[slot], seen))
                        timeline.append(("exited", slot, incarnation[slot], time.time()))
                        ended.setdefault(
                            (slot, incarnation[slot]), f"exited with code {p.exitcode} at step {committed}"
                        )
                        gone.put((slot, incarnation[slot]))  # the coordinator marks it gone
                        if not restart:
                            del procs[slot]
                            done[slot] = None
                            continue
                        del procs[slot]
                        waiting[slot] = restart_at(committed, plan, slot, restart_after_steps)
                for slot, after in list(waiting.items()):
                    if committed >= after:
                        del waiting[slot]
                        incarnation[slot] += 1
                        procs[slot] = _start_rank(
                            ctx, payload, slot, incarnation[slot], port, plan, results, quiet, interfaces
                        )
                        timeline.append(("restarted", slot, incarnation[slot], time.time()))
                time.sleep(PASS_SLEEP_S)
        except (KeyboardInterrupt, Stopped) as exc:
            end_processes([*procs.values(), *([lighthouse] if lighthouse else [])], grace_s=0.0)
            say_safely(f"minddp.ft: {stop_reason(exc)}; the ranks and the coordinator were ended")
            raise
        finally:
            end_processes([*procs.values(), *([lighthouse] if lighthouse else [])], grace_s=1.0)
            quiet.close()  # what they wrote last, passed on before this returns
    timeline.extend(_drain(events))
    _take_results(results, done, entries)  # the last entries (every slot's result is in)
    return FTRun(
        {s: r for s, r in done.items() if r is not None},
        timeline,
        list(plan.faults),
        [plan.when(i) for i in range(len(plan.faults))],
        time.time() - t_start,
        entries,
    )


def restart_at(committed: int, plan: FaultPlan, slot: int, restart_after_steps: int) -> int:
    """The launcher's count of committed steps at which ``slot``, found ended, is started again: ``restart_after_steps``
    more than were committed when it died.

    ``committed`` is the launcher's own count, read from the coordinator's events, which can lag behind the
    coordinator (an event still in its queue); a process that a ``kill``/``stop`` fault ended died in the fault's
    step, so every step before it was committed: the count is taken as at least that step.

    >>> import multiprocessing
    >>> from minddp.ft.faults import parse_faults
    >>> plan = FaultPlan(parse_faults("kill@4:1"), multiprocessing.get_context("spawn"))
    >>> plan.fired_at[0] = 1.0  # as plan.fire marks it
    >>> restart_at(3, plan, 1, 1), restart_at(6, plan, 1, 1), restart_at(3, plan, 2, 1)
    (5, 7, 4)
    """
    ended = [i for i, f in enumerate(plan.faults) if f.kind in ("kill", "stop") and f.slot == slot]
    died_in = [plan.faults[i].step for i in ended if plan.when(i)]
    return max([committed, *died_in]) + restart_after_steps


def _start_lighthouse(ctx, port, world_size, hang_s, epoch, events, timeline, full_from, quiet, plan):
    """The coordinator's process, its port, and the queue of exits to tell it (one per coordinator: one killed
    while reading would hold the queue's lock forever)."""
    gone, stderr = ctx.Queue(), quiet.writer()
    mailbox, posted = quiet.mailbox(events)
    p = ctx.Process(
        target=lighthouse_main,
        args=(port, world_size, hang_s, epoch, 1, mailbox, os.getpid(), full_from, gone, stderr, plan),
        name=f"minddp-ft-lighthouse{epoch}",
        daemon=True,
    )
    p.start()
    p.posted = posted
    stderr.close()  # the lighthouse holds its own copies: its ends of the pipes end with it
    mailbox.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            if p.exitcode is not None:
                raise FaultTolerantRunError(
                    f"minddp.ft: the coordinator exited with code {p.exitcode} at start (its message is above)"
                ) from None
            continue
        timeline.append(event)
        if event[0] == "listening" and event[1] == epoch:
            return p, event[2], gone
    raise FaultTolerantRunError("minddp.ft: the coordinator did not start within 30 s; is the machine overloaded?")


def _timed_out(run_timeout_s: float, committed: int, steps: int, procs: dict, done: dict, waiting: dict) -> str:
    """The line for a run past ``run_timeout_s``: how far it got and where each slot was.

    >>> for part in _timed_out(300, 4, 6, {0: None, 2: None}, {1: None}, {}).split("; "):
    ...     print(part)
    minddp.ft: the run did not finish within 300 s: 4 of 6 steps committed
    slots 0, 2 still running, slot 1 ended
    if it was only slow, give launch_ft a longer run_timeout_s
    """
    where = [
        f"slot{'s' * (len(slots) > 1)} {', '.join(map(str, slots))} {what}"
        for slots, what in (
            (sorted(s for s in procs if s not in done), "still running"),
            (sorted(s for s in done if done[s] is not None), "finished"),
            (sorted(s for s in done if done[s] is None), "ended"),
            (sorted(waiting), "waiting to start again"),
        )
        if slots
    ]
    return (
        f"minddp.ft: the run did not finish within {run_timeout_s:.0f} s: {committed} of {steps} steps committed; "
        + ", ".join(where)
        + "; if it was only slow, give launch_ft a longer run_timeout_s"
    )


def _state_lost(event: tuple, hang_s: float, ended: dict) -> str:
    """The line for the coordinator's ``lost``: every rank that held the trained state is gone."""
    newest, how = event[1], event[2]
    holders = ", ".join(f"slot {s}" for s in sorted(how))
    fates = "; ".join(f"slot {s} {ended.get((s, inc), gone)}" for s, (inc, gone) in sorted(how.items()))
    line = (
        f"minddp.ft: no process holds the trained state any more: after step {newest - 1} its holders were {holders} "
        f"({fates}), and processes started again would train from step 0; the run stops here; keep one holder alive "
        "through each fault (more slots, or faults in different steps)"
    )
    if any(gone == "evicted" for _, gone in how.values()):
        line += f"; a rank silent for the hang bound ({hang_s:g} s) was evicted: if it was only slow, raise the bound"
    return line


def _drain(q) -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _take_results(results, done: dict, entries: list) -> None:
    """What the ranks sent so far: each attempt's entry, each finished slot's result (read as data: plain values
    and bytes), or the error that ended a rank before its result (raised with its traceback)."""
    for kind, slot, inc, body in _drain(results):
        if kind == "log":
            entries.append((slot, inc, body))
        elif kind == "ok":
            done[slot] = torch.load(io.BytesIO(body), weights_only=True)
        elif done.get(slot) is None:  # (after its result, a slot's teardown loses nothing: not the run's error)
            raise FaultTolerantRunError(
                body.strip().splitlines()[-1] + f"\n(rank {slot}, incarnation {inc}; its traceback:)\n{body}"
            )


def _start_rank(ctx, payload, slot, incarnation, port, plan, results, quiet, interfaces):
    stderr = quiet.writer()
    mailbox, posted = quiet.mailbox(results)
    p = ctx.Process(
        target=_rank_main,
        args=(payload, list(sys.path), slot, incarnation, port, plan, mailbox, os.getpid(), stderr, interfaces),
        name=f"minddp-ft-rank{slot}.{incarnation}",
        daemon=True,
    )
    p.start()
    p.posted = posted  # set once it is gone and all it sent is in `results`
    stderr.close()  # the rank holds its own copies
    mailbox.close()
    return p


def _rank_main(payload, parent_path, slot, incarnation, port, plan, mailbox, launcher_pid, stderr, interfaces):
    """Inside a rank: train through faults, send back the result (or the error that ended it)."""
    use_stderr(stderr)  # through the launcher's filter (ChildPipes)
    results = Outbox(mailbox)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher ends the ranks on Ctrl-C
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELPER_BLOCKED)
    watch_parent(launcher_pid, f"minddp.ft rank {slot}: the launcher (pid {launcher_pid}) is gone; ending this rank")
    sys.path[:] = parent_path
    # gloo's connections as the launcher chose (minddp.runtime.loopback.rank_env)
    os.environ.update({"RANK": str(slot), "MINDDP_FT_SLOT": str(slot), **interfaces})
    torch.set_num_threads(1)  # one thread: results that do not depend on the core count, and ranks that share
    try:
        from minddp.ft.client import Coordinator
        from minddp.ft.diloco import FaultTolerantDiLoCo
        from minddp.ft.rung import FaultTolerantTrainer

        task, steps, hang_s, coordinator_timeout_s, digests, diloco = pickle.loads(payload)
        coordinator = Coordinator(port, slot, incarnation, coordinator_timeout_s)
        trainer = (FaultTolerantTrainer if diloco is None else FaultTolerantDiLoCo)(
            task,
            steps,
            coordinator,
            plan,
            hang_s=hang_s,
            digests=digests,
            on_entry=lambda entry: results.put(("log", slot, incarnation, entry)),
            on_result=lambda out: results.put(("ok", slot, incarnation, _saved(out))),  # before its beats stop
            **(diloco or {}),
        )
        # What this process imported and built lives as long as it: out of the cycle collector's sight, a full
        # collection (the rung makes some at each failed step) no longer walks it while holding the GIL, which on a
        # loaded machine kept the heartbeat thread silent for seconds (a live rank evicted).
        gc.freeze()
        trainer.run()
    except BaseException:  # noqa: BLE001 - everything must reach the launcher
        results.put(("error", slot, incarnation, traceback.format_exc()))


def _saved(out: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(out, buf)
    return buf.getvalue()
