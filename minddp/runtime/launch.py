"""Start N local ranks (or join a torchrun job), run a function on each, always tear down.

A data-parallel program is the same code in N processes ("ranks") that meet through a rendezvous and
talk through collectives. This module does that set-up and its clean-up:

1. the parent opens a rendezvous store on a port the OS picks (two launches never collide), on the
   loopback address only, as every connection of the ranks (:mod:`minddp.runtime.loopback`);
2. it starts one child per rank; each joins the store, builds the process group (gloo on CPU, NCCL
   with one GPU per rank: :mod:`minddp.runtime.device`) and calls ``fn(*args, **kwargs)``;
3. each child sends back its result, or its exception with the traceback, through a pipe of its own (a
   rank killed half-way through sending holds up no other: :meth:`~minddp.runtime.processes.ChildPipes.mailbox`),
   and leaves its group;
4. the parent gathers the results in rank order; when a rank fails, dies or hangs
   (:mod:`minddp.runtime.hang`), it ends the ranks it started, by pid, and raises :class:`RankError` naming
   it;
5. the ranks do not outlive the parent (Ctrl-C, SIGTERM, SIGHUP, even SIGKILL).

Under ``torchrun`` the processes exist already: :func:`launch` joins the job and runs ``fn`` on this
rank only. How each step is made safe: ``docs/reliability.md`` (How ``launch`` runs the ranks).

Example::

    >>> import torch.distributed as dist
    >>> launch(dist.get_rank, world_size=2)          # fn runs on every rank; results in rank order
    [0, 1]
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
import uuid
from typing import Any, Callable

import torch
import torch.distributed as dist

from minddp.runtime import compat, hang, loopback, profiling
from minddp.runtime.cli import fresh_line
from minddp.runtime.device import DEFAULT_TIMEOUT_S, Placement, choose, timeout_delta, use
from minddp.runtime.processes import (
    EXIT_WAIT_S,
    HELPER_BLOCKED,
    ChildPipes,
    Outbox,
    Stopped,
    end_processes,
    rank_context,
    say_safely,
    stop_reason,
    stop_signals,
    stops_deferred,
    watch_parent,
)

try:  # before any group exists, so that its default arguments stay None (see leave_group)
    import torch.distributed.nn  # noqa: F401
except ImportError:  # pragma: no cover - a torch build without it has nothing to pin a group with
    pass

_CHILD_FLAG = "MINDDP_LAUNCHED_RANK"

# -- module state: what this process remembers between calls ---------------------------------------------

#: This local rank's connection to its launcher's store (set by join_group).
_rank_store: dist.TCPStore | None = None
#: Under torchrun: the store of the agent, how many times this process joined a group, whether the agent
#: is watched (run_in_torchrun, watch_torchrun_agent).
_torchrun_store: dist.Store | None = None
_torchrun_joins = 0
_agent_watched = False
#: The GPU placements already said (say_placement): once per process.
_said: set[Placement] = set()
#: How long leave_group waits, at most, for the backend's threads to let go of the default group ...
RELEASE_WAIT_S = 1.0
#: ... and how long a count of holders that no longer falls means the rest are the caller's (a thread
#: that had the GIL back lets go within microseconds).
SETTLE_S = 0.1


class RankError(RuntimeError):
    """One or more ranks failed. ``errors`` maps rank -> formatted traceback.

    ``rank`` is the rank that caused the failure; ``exc_type`` its exception's
    class name (e.g. ``"ValueError"``; ``"ProcessDied"`` for a rank that vanished;
    suffixed `` (peer)`` for a rank whose collective broke because a peer failed).
    ``steps`` maps rank -> the last step it announced with :func:`report_step`
    (if it did); ``step`` is the causing rank's.
    """

    def __init__(self, errors: dict[int, str], exc_types: dict[int, str], steps: dict[int, int] | None = None):
        self.errors = dict(errors)
        self.exc_types = dict(exc_types)
        self.steps = dict(steps or {})
        # The cause first: a rank that died, then one the hang detector named (minddp.runtime.hang), then one
        # that raised, before ranks whose collective broke because of it (their reports may arrive first).
        order = list(errors)

        def blame(r):
            kind = exc_types[r]
            return ({"ProcessDied": 0, "Hung": 1}.get(kind, 3 if kind.endswith("(peer)") else 2), order.index(r))

        self.rank = min(errors, key=blame)
        self.exc_type = exc_types[self.rank]
        self.traceback = errors[self.rank]
        self.step = self.steps.get(self.rank)
        others = sorted(r for r in errors if r != self.rank)
        also = f" (ranks {others} failed too)" if others else ""
        if self.exc_type == "Hung":  # the detector's line already says who, where and why
            head, _, rest = self.traceback.partition("\n")
            super().__init__(f"{head}{also}" + (f":\n{rest}" if rest.strip() else ""))
            return
        verb = "died (killed or exited without a word)" if self.exc_type == "ProcessDied" else "failed"
        where = "" if self.step is None else f" at step {self.step}"
        super().__init__(f"rank {self.rank} {verb}{where}{also}:\n{self.traceback}")

    def __reduce__(self):  # keep it picklable for nested runners
        return (RankError, (self.errors, self.exc_types, self.steps))


#: How the backends say a partner's process went: gloo's connection closed or reset by the peer (which of the
#: two comes is the operating system's timing), a write to it broken, NCCL's communicator aborted.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")


def peer_gone(message: str) -> bool:
    """Does an error's ``message`` say the backend lost a partner's process (it ended or left the group)?

    >>> peer_gone("[pair.cc:553] Connection closed by peer [127.0.0.1]:908"), peer_gone("Timed out waiting 3000ms")
    (True, False)
    """
    return any(s in message for s in _PEER_GONE)


def _is_echo(exc: BaseException) -> bool:
    """Did this rank fail only because a peer vanished (an echo, not the cause)?"""
    return isinstance(exc, dist.DistError) or peer_gone(str(exc))


#: The last step this rank announced (for the note a failing rank's exception gets).
_step: int | None = None


def report_step(step: int) -> None:
    """Announce that this rank is now at ``step`` (cheap: one small message to the launcher's store).

    When a rank dies or raises, :class:`RankError` then says at which step;
    the hang detector (:mod:`minddp.runtime.hang`) names a rank that stopped, with its
    step, and arms its *behind* rule once every rank has announced one;
    under torchrun the failing rank's exception gets a note naming it.

    Example::

        >>> for step in range(3):
        ...     report_step(step)       # outside a launch: no heartbeat to tell, nothing is sent
    """
    global _step
    _step = step
    beat = hang.current()
    if beat is not None:
        beat.report(step)


def in_torchrun() -> bool:
    """True when this process is a rank that torchrun (or another launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and _CHILD_FLAG not in os.environ


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str | Placement = "auto",
    timeout_s: float | None = None,
    stall_s: float | None = None,
    hang_s: float | None = hang.DEFAULT_HANG_S,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results by rank.

    ``fn`` must be importable by name (a module-level function), because each
    rank is a fresh process. ``timeout_s`` bounds every collective (see
    :data:`minddp.runtime.device.DEFAULT_TIMEOUT_S`). ``stall_s`` is a last line of
    defence for waits the collective timeout does not cover (torch's own
    comm-hook callbacks can deadlock inside ``backward()``): when no rank has
    announced a new step (:func:`report_step`) or launched a collective for
    that long, the ranks are ended and :class:`RankError` says they hung. Off
    by default, since a function that never reports a step may legitimately
    run long. ``hang_s`` bounds how long one rank may stop while the others
    wait for it (:mod:`minddp.runtime.hang`: frozen, or behind in a collective it has
    not joined): the run then ends within about ``hang_s`` + 3 s naming that
    rank and its step (``exc_type == "Hung"``). On by default (30 s,
    ``MINDDP_HANG_TIMEOUT``); ``None`` or 0 turns it off.
    Under torchrun, ``world_size`` is taken from the environment and the list
    holds this rank's result only.
    """
    if in_torchrun():
        return [
            run_in_torchrun(fn, *args, backend=backend, timeout_s=timeout_s, hang_s=hang_s, stall_s=stall_s, **kwargs)
        ]
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    placement = backend if isinstance(backend, Placement) else choose(backend, local_world_size=world_size)
    say_placement(placement)
    hang_s = hang_bound(hang_s, timeout_s)

    payload = sendable(fn, args, kwargs)  # before any rank starts: a function the ranks cannot get is one line
    procs: list = []
    ok = False
    with stop_signals():  # step 5 (from here on a stop ends what is started, the process server included)
        # Step 1: a rendezvous store on a port the OS chose, owned by this process.
        store = open_store(world_size, timeout_s)
        pipes = ChildPipes(lambda line: False)  # the ranks' messages (their stderr stays theirs)
        try:
            ctx = rank_context(rank_imports(fn))
            results: queue.SimpleQueue = queue.SimpleQueue()  # what the ranks send, each through its own pipe
            interfaces = loopback.rank_env()  # the ranks' own connections: loopback, or the user's interface
            _start_ranks(ctx, procs, payload, world_size, store.port, placement, timeout_s, results, interfaces, pipes)
            # Step 4: gather, watching for a hung rank (minddp.runtime.hang).
            # (A function over `held`, not the store: the traceback of a RankError keeps _collect_results's
            # locals alive, and the store must go below, so that its port is free once launch returns.)
            held = [store]
            out = _collect_results(
                procs,
                results,
                beats=lambda: dist.PrefixStore("minddp", held[0]),
                detector=hang.Detector(hang_s, stall_s),
            )
            ok = True
            return out
        except (KeyboardInterrupt, Stopped) as exc:
            # Step 5: the ranks first, at once (a checkpoint being written is left as a temporary file; the
            # last complete one stays), then the line: a print may block on a stderr pipe nobody reads yet.
            end_processes(procs, grace_s=0.0)
            say_safely(f"{fresh_line()}minddp.launch: {stop_reason(exc)}; the ranks were ended")
            raise
        finally:
            # On failure the surviving ranks may sit in a collective that will
            # never complete: do not wait for them long.
            end_processes(procs, grace_s=3.0 if ok else 0.5)
            pipes.close()
            held = []  # noqa: F841 - the lambda reads this variable: it no longer reaches the store
            del store


def sendable(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """``(fn, args, kwargs)`` as the bytes each rank unpickles, or a one-line refusal naming the fix.

    A rank is a fresh process: it imports ``fn`` by module and name, and on the way it runs the launching
    script again as a module. So, before any rank starts:

    1. a lambda or a function defined inside another (a closure) has no importable name: refused;
    2. a function of ``__main__`` when ``__main__`` is no file (a notebook, ``python -c``, the REPL), or one
       defined inside the script's ``if __name__ == "__main__":`` block (which a rank skips): refused;
    3. a script that calls ``launch`` at its top level without ``if __name__ == "__main__":`` would launch
       again in every rank: refused, naming the script's line;
    4. ``fn``, ``args`` or ``kwargs`` that pickle cannot carry: refused, naming pickle's reason.

    Example::

        >>> sendable(lambda: 0, (), {})
        Traceback (most recent call last):
        TypeError: minddp.launch cannot send <lambda> to the ranks: it is a lambda, ... define it with def ...
    """
    name = getattr(fn, "__qualname__", repr(fn))
    refuse = f"minddp.launch cannot send {name} to the ranks: "
    fix = 'define it with def at the top level of a module (or of a script, above its if __name__ == "__main__": block)'
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)

    def under_guard(line: int) -> bool:  # inside the script's top-level if __name__ == "__main__": (unreadable: yes)
        import ast

        try:
            with open(script, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            return True
        return any(
            isinstance(node, ast.If)
            and {"__name__", "__main__"} <= {getattr(n, "id", getattr(n, "value", None)) for n in ast.walk(node.test)}
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            for node in tree.body
        )

    if "<lambda>" in name:  # step 1
        raise TypeError(f"{refuse}it is a lambda, and a rank imports the function by its name; {fix}")
    if "<locals>" in name:
        raise TypeError(f"{refuse}it is defined inside another function, and a rank imports it by its name; {fix}")
    if getattr(fn, "__module__", None) == "__main__" and script is None:  # step 2
        raise TypeError(
            f"{refuse}it is defined in an interactive session (a notebook, python -c, the REPL), which a rank "
            "cannot import; move it into a .py file and import it from there"
        )
    code = getattr(fn, "__code__", None)
    if getattr(fn, "__module__", None) == "__main__" and code and under_guard(code.co_firstlineno):
        raise TypeError(
            f'{refuse}it is defined inside if __name__ == "__main__":, which a rank does not run when it imports '
            f"{script}; {fix}"
        )
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main or sys)):
        frame = frame.f_back
    if script is not None and frame is not None and not under_guard(frame.f_lineno):  # step 3
        raise RuntimeError(
            f"minddp.launch is called at the top level of {script} (line {frame.f_lineno}) without "
            'if __name__ == "__main__":, so every rank would run the script and launch again; '
            'put the launch under if __name__ == "__main__":'
        )
    try:  # step 4
        return pickle.dumps((fn, args, kwargs))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(
            f"{refuse}pickle cannot carry it or its arguments ({str(exc).splitlines()[0]}); pass module-level "
            "functions and plain data (tensors, numbers, strings, lists, dicts)"
        ) from None


def rank_imports(fn: Callable[..., Any]) -> list[str]:
    """The modules a rank running ``fn`` imports, for the process server to import once (:func:`rank_context`).

    That is ``fn``'s module and the modules it lists in ``RANK_IMPORTS``, for minddp's own functions only: a
    user's module might start threads or touch the GPU when imported, which a process that forks ranks must not.
    """
    module = getattr(fn, "__module__", None) or ""
    if not module.startswith("minddp."):
        return []
    return [module, *getattr(sys.modules.get(module), "RANK_IMPORTS", ())]


def _start_ranks(
    ctx,
    procs: list,
    payload: bytes,
    world_size: int,
    port: int,
    placement: Placement,
    timeout_s: float | None,
    results: queue.SimpleQueue,
    interfaces: dict[str, str],
    pipes: ChildPipes,
) -> None:
    """Step 2 of :func:`launch`: one child process per rank, each added to ``procs`` as soon as it exists."""
    for rank in range(world_size):
        with stops_deferred():  # a rank once forked is in `procs`, which the teardown ends
            mailbox, posted = pipes.mailbox(results)
            p = ctx.Process(
                target=_child_main,
                name=f"minddp-rank{rank}",
                daemon=True,
                args=(
                    payload,
                    list(sys.path),
                    rank,
                    world_size,
                    port,
                    placement,
                    timeout_s,
                    mailbox,
                    os.getpid(),
                    interfaces,
                ),
            )
            p.start()
            p.posted = posted  # set once it is gone and all it sent is in `results`
            mailbox.close()  # the rank holds its own copy
            procs.append(p)


def watch_torchrun_agent() -> None:
    """Under torchrun: end this worker (exit 1, one line) once its agent, the process that started it, is gone.

    torchrun starts each worker in a session of its own, so a torchrun killed
    with SIGKILL (or by the OOM killer) leaves its workers running to the end
    of the job with no one to report to, holding their GPUs. Each worker
    therefore watches its parent's pid, as the local launcher's ranks watch
    theirs. Called once per process (the train command calls it first thing;
    :func:`launch` calls it too). A process whose parent is already init
    (pid 1: started detached) has nothing to watch.
    """
    global _agent_watched
    if _agent_watched or not in_torchrun():
        return
    _agent_watched = True
    agent = os.getppid()
    if agent > 1:
        watch_parent(
            agent,
            f"minddp rank {os.environ.get('RANK', '?')}: the torchrun agent (pid {agent}) is gone; ending this worker",
        )


def run_in_torchrun(
    fn: Callable[..., Any],
    *args: Any,
    backend: str | Placement = "auto",
    timeout_s: float | None = None,
    hang_s: float | None = hang.DEFAULT_HANG_S,
    stall_s: float | None = None,
    **kwargs: Any,
) -> Any:
    """Join the job torchrun described in the environment, run ``fn``, tear down.

    While ``fn`` runs, this rank beats (:mod:`minddp.runtime.hang`); ranks 0 and 1 also
    watch everyone's beats and end the job naming a rank that stopped.
    """
    global _torchrun_store, _torchrun_joins
    watch_torchrun_agent()
    hang_s = hang_bound(hang_s, timeout_s)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    placement = backend if isinstance(backend, Placement) else choose(backend, local_world_size=local_world)
    if rank == 0:
        say_placement(placement)
    _prepare_rank(local_rank, local_world, placement)
    if _torchrun_store is None:  # torchrun's store (or rank 0's, without an agent store), reached once
        _torchrun_store, _, _ = next(dist.rendezvous("env://", timeout=timeout_delta(timeout_s)))
    _torchrun_joins += 1  # every rank calls launch in the same order, so the prefixes agree
    store = dist.PrefixStore(f"minddp/launch{_torchrun_joins}", _torchrun_store)
    beat_store = dist.PrefixStore(f"minddp/launch{_torchrun_joins}/minddp", compat.clone_store(_torchrun_store))
    monitor = hang.Monitor(beat_store, rank, world, hang_s, stall_s) if rank < 2 and world > 1 else None
    beat = _start_heartbeat(beat_store, rank, monitor, on_verdict=_end_hung_worker)
    dist.init_process_group(
        placement.group_backend(), store=store, rank=rank, world_size=world, timeout=timeout_delta(timeout_s)
    )
    beat.group_live(True)
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        _note_step(exc)
        raise
    finally:
        beat.group_live(False)
        leave_group()
        _stop_heartbeat(beat)


def hang_bound(hang_s: float | None, timeout_s: float | None) -> float | None:
    """The hang bound in force: ``hang_s`` (None or 0: off), at most half the collective timeout.

    The detector must speak before the waiting ranks' collectives time out:
    the timeout names the ranks that waited, not the one they waited for.
    """
    if not hang_s or hang_s <= 0:
        return None
    return min(hang_s, 0.5 * (DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s))


def _start_heartbeat(store, rank: int, monitor=None, on_verdict=None) -> hang.Heartbeat:
    beat = hang.Heartbeat(store, rank, monitor=monitor, on_verdict=on_verdict).start()
    hang.install(beat)
    return beat


def _stop_heartbeat(beat: hang.Heartbeat) -> None:
    beat.set_phase("done")  # a finished rank is no longer watched (its beats stop soon)
    beat.stop()
    hang.install(None)


def _end_hung_worker(why: str, stack: str) -> None:
    """Under torchrun, in a rank the watchers named: say where it was stuck, and end (torchrun ends the rest)."""
    print(
        f"minddp: rank {os.environ.get('RANK', '?')} was named hung; where its training thread was:\n{stack}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def leave_group() -> None:
    """Destroy the default group, and end its threads now, on this thread.

    ``destroy_process_group`` only forgets the group; the group, with its
    worker threads, ends when the last reference to it goes, and a gloo group
    ends by joining those threads. The Python callbacks chained to a
    collective's Future (a comm hook's, a wire's) run on such a worker
    thread and hold the group through what they capture, and the thread lets
    go of them a moment *after* the Future completes, once it gets the GIL.
    Were that the last reference, the thread would try to join itself and the
    process would abort ("Resource deadlock avoided"). So:

    1. keep a reference here, then destroy the group;
    2. collect the reference cycles that may still hold it (a wrapped model
       and its hooks, for instance);
    3. wait while anything else still holds it: sleeping lets a worker
       thread take the GIL and drop its callbacks. Stop once nothing else
       holds it, after ``RELEASE_WAIT_S``, or once the count of holders has
       not fallen for ``SETTLE_S`` (the rest are the caller's objects: an
       exception's frames, a notebook's namespace);
    4. drop ours, the last one: the threads are joined here.

    What the caller keeps holds the group on, and it ends where they let go,
    on this thread.

    Left alive to interpreter exit, a group aborts the process there instead
    ("terminate called without an active exception"). ``torch.distributed.nn``
    would keep it that long: it takes ``group=group.WORLD`` as default
    arguments, evaluated when it is first imported, and libraries such as
    transformers import it once a group exists. This module imports it first,
    before any group does, so those defaults stay ``None``.
    """
    if not dist.is_initialized():
        return
    held = dist.group.WORLD
    dist.destroy_process_group()
    gc.collect()
    count, settled = sys.getrefcount(held), time.monotonic()
    deadline = settled + RELEASE_WAIT_S
    while count > 2 and time.monotonic() < deadline:  # 2: ``held`` and getrefcount's argument
        time.sleep(0.001)
        now = sys.getrefcount(held)
        if now != count:
            count, settled = now, time.monotonic()
        elif time.monotonic() - settled > SETTLE_S:  # held by the caller's objects, not by a thread
            break
    del held


def say_placement(placement: Placement) -> None:
    """Where ranks compute on GPUs, say in one line how and why (on the CPU it goes without saying)."""
    if placement.device_type == "cuda" and placement not in _said:
        _said.add(placement)  # once per process: --stage all launches once per stage
        print(f"{fresh_line()}minddp: {placement.why}", file=sys.stderr, flush=True)


def _prepare_rank(local_rank: int, local_world: int, placement: Placement) -> None:
    if use(placement, local_rank).type == "cpu":
        # N ranks share the machine's cores: without this every rank starts one
        # thread per core and they all fight for the same cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))


def open_store(world_size: int, timeout_s: float | None = None) -> dist.TCPStore:
    """Step 1: the rendezvous store, on a port the OS picks, on the loopback address, owned by the calling process;
    it holds a fresh id for the job, which each rank takes as it joins (profiling.JOB_ENV: its traces name it)."""
    store = loopback.loopback_store(0, world_size, timeout_delta(timeout_s))
    store.set(profiling.JOB_ENV, uuid.uuid4().hex)
    return store


def join_group(
    rank: int,
    world_size: int,
    port: int,
    placement: Placement | str,
    timeout_s: float | None = None,
    prefix: str = "",
    interfaces: dict[str, str] | None = None,
) -> None:
    """Inside a local rank: set the launcher's environment and build the default group.

    ``prefix`` namespaces the keys in the store, so ranks that destroyed their
    group can build a fresh one through the same store (the notebook runner
    does this after a failed cell); :func:`launch` uses the empty prefix.
    ``interfaces``: what the launcher's :func:`~minddp.runtime.loopback.rank_env` chose (None: set already).
    """
    _set_rank_env(rank, world_size, port, interfaces)
    if not isinstance(placement, Placement):  # a backend name: the launcher's rule (minddp.runtime.device)
        placement = choose(placement, local_world_size=world_size)
    _prepare_rank(rank, world_size, placement)
    store = dist.TCPStore(loopback.loopback_host(), port, world_size, is_master=False, timeout=timeout_delta(timeout_s))
    os.environ[profiling.JOB_ENV] = store.get(profiling.JOB_ENV).decode()
    global _rank_store
    _rank_store = store
    if prefix:
        store = dist.PrefixStore(prefix, store)
    dist.init_process_group(
        placement.group_backend(), store=store, rank=rank, world_size=world_size, timeout=timeout_delta(timeout_s)
    )


def _set_rank_env(rank: int, world_size: int, port: int, interfaces: dict[str, str] | None) -> None:
    os.environ.update(
        {
            _CHILD_FLAG: str(rank),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": loopback.loopback_host(),
            "MASTER_PORT": str(port),
            **(interfaces or {}),  # gloo's and NCCL's own connections, as the launcher chose (loopback.rank_env)
        }
    )


def _child_main(payload, parent_path, rank, world_size, port, placement, timeout_s, mailbox, launcher_pid, interfaces):
    """Step 3, inside the rank: join, run (beating: minddp.runtime.hang), report, always destroy the group."""
    results = Outbox(mailbox)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # step 5: Ctrl-C is the launcher's to handle; it ends the ranks
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELPER_BLOCKED)  # the process server's mask (rank_context)
    # What the process server imported (torch, and rank_imports: millions of objects) lives as long as the rank:
    # moved out of the cycle collector's sight, it is not walked again at each full collection (a third of a small
    # stage's time), nor are its pages copied for the collector's bookkeeping.
    gc.freeze()
    watch_parent(
        launcher_pid, f"minddp rank {rank}: the launcher (pid {launcher_pid}) is gone; ending this rank"
    )  # step 5
    sys.path[:] = parent_path  # unpickle fn the way the parent would import it
    _set_rank_env(rank, world_size, port, interfaces)  # before unpickling: imports may read RANK
    beat = None
    try:
        fn, args, kwargs = pickle.loads(payload)
        join_group(rank, world_size, port, placement, timeout_s)
        beat = _start_heartbeat(dist.PrefixStore("minddp", compat.clone_store(_rank_store)), rank)
        beat.group_live(True)
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            _note_step(exc)
            raise
        finally:
            beat.group_live(False)
            leave_group()
        buf = io.BytesIO()
        torch.save(out, buf)  # bytes, not shared memory: safe after this process exits
        results.put(("ok", rank, buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        kind = type(exc).__name__ + (" (peer)" if _is_echo(exc) else "")
        results.put(("error", rank, traceback.format_exc(), kind))
    finally:
        if beat is not None:
            _stop_heartbeat(beat)


def _note_step(exc: BaseException) -> None:
    if _step is not None:
        exc.add_note(f"minddp: rank {os.environ.get('RANK', '?')} failed at step {_step}")


def _steps(beats_store, ranks) -> dict[int, int]:
    """The last step each of ``ranks`` announced (never blocks; a report is a nicety, never a second failure)."""
    try:
        beats = hang.read_beats(beats_store, list(ranks))
    except (RuntimeError, ValueError, dist.DistError):
        return {}
    return {r: b.step for r, b in beats.items() if b is not None and b.step is not None}


def _collect_results(
    procs, results, beats=None, detector: hang.Detector | None = None, grace_s: float = 2.0
) -> list[Any]:
    """Step 4: results by rank; on a failure, the others' reports for ``grace_s``; a hung rank named (runtime.hang).

    ``beats()`` gives the store the ranks beat into; ``detector`` judges their beats once a second.
    """
    world_size = len(procs)
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    exc_types: dict[int, str] = {}
    failed_at = None
    last_look = time.monotonic()
    while len(done) + len(errors) < world_size:
        now = time.monotonic()
        if failed_at is not None and now - failed_at > grace_s:
            break
        if detector is not None and beats is not None and failed_at is None and now - last_look >= hang.BEAT_S:
            last_look = now
            verdict = _judge(detector, beats, [r for r in range(world_size) if r not in done], now)
            if verdict is not None:
                for rank, text in verdict.items():
                    errors[rank], exc_types[rank] = text, "Hung"
                break
        try:
            kind, rank, *rest = results.get(timeout=0.1)
        except queue.Empty:
            for rank, p in enumerate(procs):
                if p.exitcode is not None and rank not in done and rank not in errors:
                    # Exited without a word: killed (SIGKILL, OOM) or os._exit. Its message may be in flight:
                    # wait until all it sent is in (its pipe ended; at once for a process that has exited).
                    p.posted.wait(EXIT_WAIT_S)
                    if results.empty():
                        # Exit code 1 before any report: Python failed while starting the rank (its
                        # traceback is on stderr), most often a script that launches at import time.
                        hint = (
                            (
                                " (Python failed while starting the rank: its traceback is printed above; a "
                                'script that calls launch() must do so under `if __name__ == "__main__":`, '
                                "or every rank runs the script again)"
                            )
                            if p.exitcode == 1
                            else ""
                        )
                        errors[rank] = f"process {p.pid} exited with code {p.exitcode} without reporting{hint}\n"
                        exc_types[rank] = "ProcessDied"
                        failed_at = failed_at or time.monotonic()
            continue
        if kind == "ok":
            done[rank] = torch.load(io.BytesIO(rest[0]), weights_only=False)
        else:
            errors[rank], exc_types[rank] = rest
            failed_at = failed_at or time.monotonic()
    if errors and all(t.endswith("(peer)") for t in exc_types.values()):
        # Every failure is an echo (a collective that timed out or broke): the ranks that neither
        # failed nor finished are the ones the others waited for.
        silent = [r for r in range(world_size) if r not in done and r not in errors]
        steps = _steps(beats(), silent) if beats is not None else {}
        for rank in silent:
            at = f" at step {steps[rank]}" if rank in steps else ""
            errors[rank] = (
                f"rank {rank} hung{at}: it never joined the collective that ranks {sorted(errors)} "
                "failed in (it was still running when they gave up)\n"
            )
            exc_types[rank] = "Hung"
    if errors:
        raise RankError(errors, exc_types, _steps(beats(), errors) if beats is not None else {})
    return [done[r] for r in range(world_size)]


def _judge(detector: hang.Detector, beats, running: list[int], now: float) -> dict[int, str] | None:
    """One look at the running ranks' beats; for a verdict, each named rank's line and (if it can) its stack."""
    beats = beats()
    try:
        verdict = detector.observe(hang.read_beats(beats, running), now)
    except (RuntimeError, ValueError, dist.DistError):  # a look that failed is no verdict
        return None
    if verdict is None:
        return None
    hang.announce(beats, verdict)
    alive = [r for r in verdict.ranks if verdict.rule != "frozen"]
    where = hang.stacks(beats, alive, wait_s=2 * hang.BEAT_S) if alive else {}
    return {
        r: verdict.why[r] + ("\n" + f"where its training thread was:\n{where[r]}" if r in where else "\n")
        for r in verdict.ranks
    }
