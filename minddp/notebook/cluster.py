"""A set of persistent local ranks that run notebook cells: start, run, release, restart, stop.

The notebook process owns the cluster; the ranks are the processes it started
(:mod:`minddp.notebook.worker`), and it ends only those, by pid. Running a cell:

1. the cell goes to every selected rank, which runs it in its own namespace, kept from cell to cell;
2. one report per rank comes back (output, value, figures, or the exception); what the ranks print
   goes to ``on_stream(rank, "stdout" | "stderr", text)`` as it is printed;
3. after a failure (or a rank dead, ``timeout_s`` passed, an interrupt) the other ranks get ``grace_s``,
   then are released in escalating steps: (a) every idle rank destroys its process group, so a peer
   blocked in a gloo collective with it fails at once; (b) after ``release_s``, SIGINT; (c) two seconds
   later, the ranks are ended by pid and the cluster restarts: fresh ranks, state lost;
4. every rank builds a fresh process group and keeps its namespace (or the cluster restarts as in 3c).

``notebooks/README.md`` (*How the notebooks run*) tells each step in full.

Example (not run by the doctests: it starts two rank processes; ``tests/test_notebook_runner.py``
does)::

    >>> with Cluster(world_size=2) as cluster:      # doctest: +SKIP
    ...     cluster.run("x = rank * 10")
    ...     [out.value for out in cluster.run("x + 1")]
    [1, 11]
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import queue
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from minddp.notebook.worker import worker_main
from minddp.runtime.device import choose
from minddp.runtime.launch import RankError, open_store
from minddp.runtime.loopback import rank_env
from minddp.runtime.processes import ChildPipes, end_processes, rank_context


@dataclass
class RankOutput:
    """What one rank showed for one cell: the pieces a notebook output area has."""

    rank: int
    stdout: str = ""
    stderr: str = ""
    value_repr: str | None = None  #: repr of the trailing expression (None: no value)
    figures: list[bytes] = field(default_factory=list)  #: PNG images
    error: str | None = None  #: formatted traceback when the rank failed
    exc_type: str | None = None  #: e.g. "ValueError"; "ProcessDied", "Restarted"
    note: str | None = None  #: how the cluster intervened, e.g. "released after rank 1 failed"
    value_bytes: bytes | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def value(self) -> Any:
        """The trailing expression's value itself (None if none, or if it could not be sent)."""
        if self.value_bytes is None:
            return None
        return torch.load(io.BytesIO(self.value_bytes), weights_only=False)


class CellError(RankError):
    """A cell failed on one or more ranks; ``outputs`` holds every rank's :class:`RankOutput`."""

    def __init__(self, errors: dict[int, str], exc_types: dict[int, str], outputs=None):
        super().__init__(errors, exc_types)
        self.outputs = list(outputs or [])

    def __reduce__(self):
        return (CellError, (self.errors, self.exc_types, self.outputs))

    def __str__(self) -> str:
        """The heading (the rank that caused it, the others that "failed too"), then every failed rank's traceback,
        labelled, root causes first: the same lines Jupyter shows (:meth:`_render_traceback_`) and a viewer that
        prints an error's value does."""
        lines = [super().__str__().partition("\n")[0].rstrip(":") + ":"]
        for rank, tb in self.errors.items():
            lines.append(f"Error on rank {rank}: {self.exc_types[rank]}")
            lines.extend(tb.rstrip("\n").splitlines())
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the runner's own frames: ``CellError: `` and :meth:`__str__`'s lines."""
        return f"{type(self).__name__}: {self}".splitlines()


class Cluster:
    """``world_size`` persistent local ranks with ``torch.distributed`` initialised.

    ``backend`` and ``timeout_s`` mean what they mean for :func:`minddp.runtime.launch.launch`
    (``auto``: gloo on CPU, NCCL with a GPU per rank, ranks sharing GPUs over gloo). ``grace_s`` and
    ``release_s`` pace step 3 of the module docstring (in full: ``notebooks/README.md``).
    """

    def __init__(
        self,
        world_size: int = 2,
        backend: str = "auto",
        timeout_s: float | None = None,
        grace_s: float = 1.0,
        release_s: float = 5.0,
        start_timeout_s: float = 120.0,
    ):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.placement = choose(backend, local_world_size=world_size)  # the launcher's rule (minddp.runtime.device)
        self.backend = self.placement.backend
        self.timeout_s = timeout_s
        self.grace_s, self.release_s, self.start_timeout_s = grace_s, release_s, start_timeout_s
        self.restarts = 0  #: how many times step 3c replaced the ranks
        self._procs: list = []
        self._cell = 0
        self._generation = 0

    # ----------------------------------------------------------------- life cycle
    def start(self) -> "Cluster":
        """Start the ranks and wait until every one has joined the process group."""
        if self.running:
            raise RuntimeError("the cluster is already running: call shutdown() first")
        ctx = rank_context()
        self._store = open_store(self.world_size, self.timeout_s)
        # What the ranks report, each through a pipe of its own: one killed half-way through a report (OOM while
        # it prints) holds up no other rank's (a queue they shared would stay locked, or half read).
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self._pipes = ChildPipes(lambda line: False)  # their stderr stays theirs
        self._commands = [ctx.Queue() for _ in range(self.world_size)]
        self._generation, self._aborted = 0, False
        self._procs = []
        interfaces = rank_env()  # the ranks' own connections: loopback, or the interface the user set
        for rank in range(self.world_size):
            mailbox, _ = self._pipes.mailbox(self._reports)
            p = ctx.Process(
                target=worker_main,
                name=f"minddp-notebook-rank{rank}",
                args=(
                    rank,
                    self.world_size,
                    self._store.port,
                    self.placement,
                    self.timeout_s,
                    os.getpid(),
                    list(sys.path),
                    self._commands[rank],
                    mailbox,
                    interfaces,
                ),
                daemon=False,  # a daemon could not start processes (e.g. DataLoader workers)
            )
            p.start()
            mailbox.close()  # the rank holds its own copy
            self._procs.append(p)
        # The kernel may exit without calling shutdown(): atexit still ends the ranks.
        atexit.register(self.shutdown)
        self._wait_ready()
        return self

    def shutdown(self) -> None:
        """Stop every rank this cluster started (politely, then by pid); safe to call twice."""
        atexit.unregister(self.shutdown)
        if not self._procs:
            return
        for rank, p in enumerate(self._procs):
            if p.is_alive():
                try:
                    self._commands[rank].put(("stop", 0, None))
                except (OSError, ValueError):
                    pass
        end_processes(self._procs, grace_s=3.0)
        self._procs = []
        self._pipes.close(wait_s=0.5)
        for q in self._commands:
            q.close()
            q.cancel_join_thread()  # never block the kernel's exit on a queue of dead ranks
        self._store = None

    def restart(self) -> "Cluster":
        """Fresh ranks, empty namespaces (what step 3c does on its own)."""
        self.shutdown()
        return self.start()

    @property
    def running(self) -> bool:
        return bool(self._procs)

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, by rank (the only processes this cluster ever ends)."""
        return [p.pid for p in self._procs]

    def __enter__(self) -> "Cluster":
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = f"running, pids {self.pids}" if self.running else "stopped"
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}, {state})"

    # ----------------------------------------------------------------- running cells
    def run(
        self,
        cell: str | Callable[..., Any],
        *args: Any,
        ranks: Iterable[int] | None = None,
        timeout_s: float | None = None,
        raise_errors: bool = True,
        on_stream: Callable[[int, str, str], None] | None = None,
        name: str | None = None,
        stall_s: float | None = None,
        **kwargs: Any,
    ) -> list[RankOutput]:
        """Run code (a string, in each rank's persistent namespace) or ``cell(*args, **kwargs)``.

        Returns one :class:`RankOutput` per selected rank, by rank. When a rank
        fails, raises :class:`CellError` (its ``outputs`` hold every rank's
        report) unless ``raise_errors`` is false. ``timeout_s`` bounds this
        cell; an overdue cell is released like a failure (step 3), and so is one in which no selected
        rank has printed for ``stall_s`` seconds (a cell that prints as it goes is never cut for being
        slow, only for standing still). ``on_stream`` sees the ranks' output live (step 2). ``name`` is
        how tracebacks and debug mode's lines name the cell, ``<name, rank R>`` (the magics pass the
        notebook's ``In [N]``); by default ``cell N``, N counting this cluster's cells.
        """
        if not self.running:
            raise RuntimeError("the cluster is not running: call start() (in a notebook: %dist_init)")
        selected = self._select(ranks)
        if isinstance(cell, str) and (args or kwargs):
            raise TypeError("arguments are only for callables: a code string reads names from the rank's namespace")
        body = cell if isinstance(cell, str) else _pickle_call(cell, args, kwargs)
        # Step 1.
        self._cell += 1
        for rank in selected:
            self._commands[rank].put(("run", self._cell, (body, name or f"cell {self._cell}")))
        outputs = self._collect_replies(self._cell, selected, timeout_s, on_stream, stall_s)
        # Root causes first (RankError.rank is the first entry), released ranks after.
        failed = {o.rank: o for o in sorted(outputs, key=lambda o: (o.note is not None, o.rank)) if not o.ok}
        if (failed or self._aborted) and not any(o.exc_type == "Restarted" for o in outputs):
            self._regroup()  # step 4
        if failed and raise_errors:
            raise CellError(
                {r: o.error for r, o in failed.items()}, {r: o.exc_type for r, o in failed.items()}, outputs
            )
        return outputs

    def _select(self, ranks: Iterable[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        selected = sorted(set(ranks))
        bad = [r for r in selected if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad or not selected:
            raise ValueError(f"ranks must be integers in 0..{self.world_size - 1}, got {list(ranks)!r}")
        return selected

    def _collect_replies(
        self,
        cell_id: int,
        selected: list[int],
        timeout_s: float | None,
        on_stream: Callable[[int, str, str], None] | None = None,
        stall_s: float | None = None,
    ) -> list[RankOutput]:
        """Steps 2 and 3: one report per selected rank, releasing stuck ranks after a failure."""
        outputs: dict[int, RankOutput] = {}
        pending = set(selected)
        trouble_at = None  # when the first rank failed / the cell overran / the user interrupted
        cause = ""
        released_at = interrupted_at = None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        heard = time.monotonic()  # when a selected rank last printed (stall_s)
        while pending:
            try:
                msg = self._next_report(0.1)
            except KeyboardInterrupt:  # the notebook's stop button: release now, skip the grace
                msg, trouble_at, cause = None, time.monotonic() - self.grace_s, "the cell was interrupted"
            now = time.monotonic()
            if msg is not None and msg[0] == "stream":
                if msg[2] == cell_id:
                    heard = now
                if on_stream is not None and msg[2] == cell_id:  # an earlier cell's late output is dropped
                    on_stream(msg[1], msg[3], msg[4])
            elif msg is not None and msg[0] == "done" and msg[2] == cell_id:
                rank, report = msg[1], msg[3]
                out = RankOutput(
                    rank,
                    report["stdout"],
                    report["stderr"],
                    report["value_repr"],
                    report["figures"],
                    report["error"],
                    report["exc_type"],
                    value_bytes=report["value"],
                )
                if released_at is not None and not out.ok:
                    out.note = f"released because {cause}"
                outputs[rank] = out
                pending.discard(rank)
                if not out.ok and trouble_at is None:
                    trouble_at, cause = now, f"rank {rank} failed"
            for rank in sorted(pending):
                p = self._procs[rank]
                if p.exitcode is not None:  # killed (OOM, os._exit): no report will come
                    outputs[rank] = RankOutput(
                        rank, error=f"process {p.pid} exited with code {p.exitcode}\n", exc_type="ProcessDied"
                    )
                    pending.discard(rank)
                    trouble_at, cause = trouble_at or now, cause or f"rank {rank} died"
            if deadline is not None and now > deadline and trouble_at is None:
                trouble_at, cause = now - self.grace_s, f"the cell ran past timeout_s={timeout_s}"
            if stall_s is not None and pending and now - heard > stall_s and trouble_at is None:
                trouble_at, cause = now - self.grace_s, f"no rank printed for stall_s={stall_s}"
            if not pending or trouble_at is None or now - trouble_at < self.grace_s:
                continue
            # Step 3: escalate, one step at a time.
            if released_at is None:  # 3a
                released_at, self._aborted = now, True
                for rank in range(self.world_size):
                    if rank not in pending and self._procs[rank].exitcode is None:
                        self._commands[rank].put(("abort", cell_id, None))
            elif interrupted_at is None and now - released_at > self.release_s:  # 3b
                interrupted_at = now
                for rank in pending:
                    _signal(self._procs[rank], signal.SIGINT)
            elif interrupted_at is not None and now - interrupted_at > 2.0:  # 3c
                stuck = sorted(pending)
                pids = [self._procs[r].pid for r in stuck]
                self.restarts += 1
                self.restart()
                for rank, pid in zip(stuck, pids):
                    outputs[rank] = RankOutput(
                        rank,
                        error=f"rank {rank} (pid {pid}) was still running after {cause}\n",
                        exc_type="Restarted",
                        note="ended by pid; the cluster restarted with fresh ranks: state is lost, "
                        "re-run the set-up cells",
                    )
                pending.clear()
        return [outputs[r] for r in selected]

    def _regroup(self) -> None:
        """Step 4: every rank destroys its group and joins a fresh one (namespaces kept)."""
        self._generation, self._aborted = self._generation + 1, False
        for rank in range(self.world_size):
            self._commands[rank].put(("regroup", self._generation, None))
        waiting = set(range(self.world_size))
        deadline = time.monotonic() + max(30.0, self.start_timeout_s)
        problem = None
        while waiting and problem is None and time.monotonic() < deadline:
            msg = self._next_report(0.1)
            if msg is not None and msg[0] == "regrouped" and msg[2] == self._generation:
                waiting.discard(msg[1])
                problem = msg[3]
            if any(self._procs[r].exitcode is not None for r in waiting):
                problem = "a rank died"
        if waiting or problem:
            self.restarts += 1
            self.restart()

    def _wait_ready(self) -> None:
        waiting = set(range(self.world_size))
        deadline = time.monotonic() + self.start_timeout_s
        errors: dict[int, str] = {}
        while waiting and time.monotonic() < deadline:
            msg = self._next_report(0.1)
            if msg is not None and msg[0] in ("ready", "failed"):
                waiting.discard(msg[1])
                if msg[0] == "failed":
                    errors[msg[1]] = msg[3]
            for rank in sorted(waiting):
                if self._procs[rank].exitcode is not None:
                    errors[rank] = f"process exited with code {self._procs[rank].exitcode} while starting\n"
                    waiting.discard(rank)
        for rank in waiting:
            errors[rank] = f"did not join within start_timeout_s={self.start_timeout_s}\n"
        if errors:
            self.shutdown()
            raise RankError(errors, {r: "StartError" for r in errors})

    def _next_report(self, timeout: float):
        try:
            return self._reports.get(timeout=timeout)
        except queue.Empty:
            return None


def _signal(proc, signum: int) -> None:
    """Signal one process this cluster started, by its pid; ignore one that just exited."""
    try:
        os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass


def _pickle_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """A call the ranks can unpickle: cloudpickle sends functions defined in a notebook by value."""
    if not callable(fn):
        raise TypeError(f"run() takes code (a string) or a callable, got {type(fn).__name__}")
    try:
        import cloudpickle as pickler  # a notebook's functions live in __main__, unknown to the ranks
    except ImportError:
        pickler = pickle
    try:
        return pickler.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"cannot send {fn!r} to the ranks ({exc}); define it in an importable module or pass the code as a string"
        ) from exc
