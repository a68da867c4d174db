"""The processes a run starts: how they are made, watched and ended. One place, for the launcher and the notebooks.

* :func:`rank_context`: how rank processes are made (forked from a server that
  imported torch once);
* :func:`alive`: whether a pid still runs (a zombie, dead but not yet reaped,
  counts as gone);
* :func:`watch_parent`: inside a rank, a daemon thread that ends the rank once
  the process that started it is gone, even if that one was SIGKILLed and
  could run no clean-up;
* :func:`end_processes`: end only the processes we started, by their handles
  (never by name);
* :func:`stop_signals`: in the process that owns a run, Ctrl-C, SIGTERM and
  SIGHUP raise an exception once (:class:`Stopped` for the last two), so that
  its ``finally`` blocks end what it started, and the process exits with the
  signal's status (130, 143, 129);
* :func:`end_helpers`: the process server and multiprocessing's resource
  tracker, ended and waited for when the process that started them exits
  (however it exits, short of SIGKILL), so that nothing of a run outlives it;
* :class:`ChildPipes`: the pipes from the processes a run starts: their
  stderr, passed on without torch's warnings about connections a run broke on
  purpose; and their messages to it (:meth:`ChildPipes.mailbox`,
  :class:`Outbox`), each child through its own pipe, so that one killed or
  frozen mid-message holds up nobody else.

Example (inside a rank: it ends the process when the launcher goes, so the doctests do not run it)::

    >>> watch_parent(launcher_pid, "the launcher (pid 123) is gone; ending this rank")   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import selectors
import signal
import sys
import threading
import time
from typing import Callable, Sequence

import torch.multiprocessing as mp

#: What every rank imports: the server imports it once, before it forks any rank.
RANK_IMPORTS = ("torch", "torch.distributed", "minddp.runtime.launch")


def rank_context(imports: Sequence[str] = ()):
    """Processes for ranks: forked from a server that has imported torch once.

    A fresh interpreter per rank ("spawn") pays torch's import (seconds) at
    every launch; the forkserver pays it once per parent and forks ranks from
    a clean process that has only imported modules and never touched CUDA,
    which is as safe as spawn. Platforms without fork use spawn.

    ``imports`` names more modules the ranks will import (what the launched
    function needs: :func:`minddp.runtime.launch.rank_imports`); the server
    imports them too, so that a rank of each launch does not pay them again.
    The first call in a process starts the server with its list; later calls
    reuse that server, whose ranks import what it lacks themselves.

    The server (and multiprocessing's resource tracker, started with it) is
    started here with Ctrl-C, SIGTERM and SIGHUP blocked: a signal sent to
    the whole process group (a terminal's Ctrl-C or hang-up, ``kill -TERM
    -PGID``) must not end it under the launcher, which would then no longer
    learn whether its ranks are alive, and so could not end them; nor may a
    Ctrl-C during its import of torch end it with a traceback (it ignores
    Ctrl-C only after that import). Both exit once this process has gone.
    The ranks inherit the mask, so every process made from this context
    must unblock the three (:data:`HELPER_BLOCKED`) once it has set what it
    does on Ctrl-C: a launched rank ignores it, the launcher's to handle
    (:mod:`minddp.launch`'s ``_child_main``); a notebook rank stops its cell
    (:mod:`minddp.notebook.worker`).
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*RANK_IMPORTS, *imports])  # read when the server starts: the first call
    from multiprocessing import forkserver, resource_tracker

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_BLOCKED)  # inherited through fork and exec
    try:
        resource_tracker.ensure_running()  # (no-op once running) it unblocks SIGINT, SIGTERM here when it starts:
        signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_BLOCKED)  # block again for the server
        forkserver.ensure_running()
        _end_helpers_at_exit()  # before a signal held back meanwhile can end this process
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal that came meanwhile is delivered now
    return ctx


_at_exit: list = []  # the exit hook, once registered (per process)


def _end_helpers_at_exit() -> None:
    """Have :func:`end_helpers` run when this process exits: after multiprocessing's own exit work.

    That work (its ``atexit`` function) lets go of queues and locks, and each
    tells the resource tracker, which would be started again were it already
    ended; a finalizer of lowest priority runs after all of it.
    """
    from multiprocessing import util

    if not _at_exit or _at_exit[0] != os.getpid():
        _at_exit[:] = [os.getpid()]
        util.Finalize(None, _end_helpers_on_exit, exitpriority=-100)


def _end_helpers_on_exit() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:  # exiting already: a second Ctrl-C must not cut the wait short with a traceback
            signal.signal(sig, signal.SIG_IGN)
    end_helpers()


def end_helpers(wait_s: float = 2.0) -> None:
    """End the process server and the resource tracker this process started, and wait for them (both bounded).

    Each is asked the way multiprocessing itself asks (its pipe from this
    process closed: the server stops, the tracker cleans up and stops) and
    waited for; one still there after ``wait_s`` (the server may be importing
    torch, which it finishes before it looks at its pipe) gets SIGKILL, since
    both ignore the stop signals (:func:`rank_context`), and is reaped. A
    later :func:`rank_context` starts new ones.
    """
    from multiprocessing import forkserver, resource_tracker, util

    server = forkserver._forkserver
    pid, alive_fd = getattr(server, "_forkserver_pid", None), getattr(server, "_forkserver_alive_fd", None)
    if pid is not None and alive_fd is not None:
        address = getattr(server, "_forkserver_address", None)
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
        os.close(alive_fd)
        _reap(pid, wait_s)
        if address and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
    tracker = resource_tracker._resource_tracker
    pid, fd = getattr(tracker, "_pid", None), getattr(tracker, "_fd", None)
    if pid is not None and fd is not None:
        tracker._pid = tracker._fd = None
        os.close(fd)
        _reap(pid, wait_s)


def _reap(pid: int, wait_s: float) -> None:
    """Wait up to ``wait_s`` for child ``pid`` to exit, then SIGKILL it and wait for that."""
    deadline = time.monotonic() + wait_s
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.005)
    except ChildProcessError:  # already reaped
        pass


#: Signals the process server and resource tracker never see (see rank_context); ranks unblock them.
HELPER_BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie waiting to be reaped."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:  # no /proc (macOS): a signal-0 probe
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def watch_parent(parent_pid: int, message: str | None = None, exit_code: int = 1, every_s: float = 0.5) -> None:
    """End this process (``os._exit``) once ``parent_pid`` is gone, saying ``message`` on stderr first."""

    def watch():
        while alive(parent_pid):
            time.sleep(every_s)
        if message:
            print(message, file=sys.stderr, flush=True)
        os._exit(exit_code)

    threading.Thread(target=watch, name="minddp-parent-watch", daemon=True).start()


def end_processes(procs, grace_s: float = 3.0) -> None:
    """End only the processes this process started, by their handles (pids): join, then terminate, then kill.

    Bounded: ``grace_s``, then 1 s after SIGTERM, then at most 5 s after SIGKILL
    (which nothing can refuse) for the process server to report the exit.
    """
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=1.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


class Stopped(SystemExit):
    """SIGTERM or SIGHUP, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt`` (see :func:`stop_signals`).

    A ``SystemExit`` whose code is the signal's exit status (128 + its number:
    143 for SIGTERM, 129 for SIGHUP), so that a program that does not catch it
    exits as the signal would have ended it, but after its ``finally`` blocks.
    """

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


#: The signals that stop a run: Ctrl-C, ``kill``/``timeout``/a scheduler, the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_reason(exc: BaseException) -> str:
    """What stopped the run, for its one line: ``interrupted (Ctrl-C)``, ``terminated (SIGTERM)``, ..."""
    if isinstance(exc, Stopped) and exc.signum == signal.SIGHUP:
        return "hung up (SIGHUP: the terminal closed)"
    if isinstance(exc, Stopped):
        return f"terminated ({signal.Signals(exc.signum).name})"
    return "interrupted (Ctrl-C)"


def say_safely(line: str) -> None:
    """Print ``line`` on stderr; a stderr that is gone (a closed terminal: EIO; a closed pipe) is no second error."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def stop_signals():
    """While inside: Ctrl-C raises ``KeyboardInterrupt``, SIGTERM and SIGHUP raise :class:`Stopped`, once.

    Python's default SIGTERM and SIGHUP end the process on the spot, skipping
    every ``finally``, so the processes it started would run on. Raised as
    exceptions, they unwind through the ``finally`` blocks that end them.

    * **Once**: the handler ignores all three signals before it raises, until
      the block is left, so a second Ctrl-C (an impatient user, a terminal
      that sends SIGHUP after SIGINT) cannot cut the clean-up short.
    * **Only defaults are replaced**: a signal the program handles itself is
      left alone, and so is one ignored when the process started (a
      background job of a shell without job control ignores Ctrl-C, nohup
      ignores SIGHUP: the user asked for that). Only the main thread may set
      handlers; elsewhere this does nothing.
    * The handler does no I/O: it cannot block (on a full pipe) or fail.

    Nested uses are free: an inner one finds the handler in place and leaves it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    ours = [sig for sig in STOP_SIGNALS if before[sig] is defaults[sig]]

    def stop(signum, frame):
        for sig in ours:
            signal.signal(sig, signal.SIG_IGN)
        if _deferring[0]:
            _deferred.append(signum)  # raised when the step that must not be cut in half is done
            return
        raise _stop_exception(signum)

    for sig in ours:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig in ours:
            signal.signal(sig, before[sig])


def _stop_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


_deferring = [0]  # depth of stops_deferred blocks
_deferred: list[int] = []  # the stop signal that came meanwhile


@contextlib.contextmanager
def stops_deferred():
    """Inside: a stop signal (see :func:`stop_signals`) waits, and is raised once the block is done.

    For a step that must not be cut in half: starting a rank. A rank forked
    but not yet in the launcher's list of processes to end would be left
    behind (it then fails to unpickle what the launcher has already let go,
    with a traceback). The wait is as long as the step: a fork, or, the first
    time in a process, the process server's import of torch.
    """
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
    if not _deferring[0] and _deferred:
        signum = _deferred[0]
        _deferred.clear()
        raise _stop_exception(signum)


# -- the stderr of processes a run starts ---------------------------------------------------------------------

#: How torch's C++ side (c10 logging) starts a warning or error line, with the rank prefix torch may put first:
#: ``[rank1]:[W1127 11:25:02.036715427 TCPStore.cpp:106] [c10d] ...``.
_CPP_LOG = re.compile(r"^(?:\[rank\d+\]:)?\[[WE][^\]]*?\b[\w.]+\.(?:cpp|cc|hpp|h):\d+\] ")
#: ... and what one says about a connection that broke, was refused, or timed out.
_CONNECTION = re.compile(
    r"Broken pipe|Connection (?:reset|closed|refused)|(?:recv|send)\w* failed|failed to (?:connect|recv|send)|timed out"
)
#: The lines the C++ side puts after such a message: the exception's origin and its native stack.
_CPP_TRAIL = re.compile(r"^(?:\[rank\d+\]:)?(?:Exception raised from |frame #\d+: |<omitting python frames>)")


def expected_connection_noise(line: str) -> bool:
    """Whether ``line`` starts torch's C++ message about a connection that broke (``TCPStore.cpp ... failed``)."""
    return bool(_CPP_LOG.match(line) and _CONNECTION.search(line))


#: The longest a launcher waits, once it sees a process exited, for the rest of what it sent (its pipe's end:
#: :meth:`ChildPipes.mailbox`) before it takes the exit for one without a word; an exited process's pipe ends at once.
EXIT_WAIT_S = 1.0


class ChildPipes:
    """The pipes from the processes a run starts, read by one thread here: their messages (:meth:`mailbox`), and
    their stderr, passed on to this process's stderr without expected noise.

    ``expected(line)`` says which C++ messages to drop (with the lines that follow one: "Exception raised from",
    "frame #N", up to the blank line that ends it); everything else passes unchanged, in order per process, so an
    unexpected error shows its cause. Each child gets its own pipe (:meth:`writer`, handed to it in its arguments)
    and puts it in place of its stderr (:func:`use_stderr`); one thread here reads them all.
    ``MINDDP_TORCH_WARNINGS=1`` passes everything.

    Example::

        >>> quiet = ChildPipes(expected_connection_noise)
        >>> pipe = quiet.writer()                      # ctx.Process(target=..., args=(pipe, ...)).start()
        >>> quiet.close()
    """

    def __init__(self, expected: Callable[[str], bool], out_fd: int = 2):
        from minddp.runtime.envflags import env_flag

        self.expected = (lambda line: False) if env_flag("MINDDP_TORCH_WARNINGS") else expected
        self.out_fd = os.dup(out_fd)  # where this process's stderr is now (a notebook's, pytest's capture)
        self.dropped = 0
        self._closing: float | None = None  # set by close(): read until then, at most
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="minddp-stderr-filter", daemon=True)
        self._thread.start()

    def writer(self):
        """A pipe for one child's stderr: pass it in the child's arguments; this process keeps only the read end."""
        return self._pipe(_Stream)

    def mailbox(self, inbox) -> tuple[object, threading.Event]:
        """A pipe for one child's messages (it writes them through an :class:`Outbox`), and an event set once the
        child is gone and all it wrote is in ``inbox`` (a ``queue.SimpleQueue``: several children may share it).

        Each message arrives whole, in the order the child sent it. Its own pipe, no lock shared with any other
        process: a child killed or frozen part-way through a message loses that message only (a queue shared by
        the children would stay locked for them all: the frozen one's writer holds its lock).
        """
        ended = threading.Event()
        return self._pipe(lambda read: _Frames(read, inbox, ended)), ended

    def _pipe(self, stream):
        import multiprocessing

        read, write = multiprocessing.Pipe(duplex=False)
        os.set_blocking(read.fileno(), False)
        with self._lock:
            self._selector.register(read.fileno(), selectors.EVENT_READ, stream(read))
        os.write(self._wake_w, b"\0")  # the thread looks at its list again
        return write

    def close(self, wait_s: float = 2.0) -> None:
        """Pass on what the children wrote (each pipe to its end, at most ``wait_s``), then stop reading."""
        self._closing = time.monotonic() + wait_s
        os.write(self._wake_w, b"\0")
        self._thread.join(wait_s + 1.0)

    def _run(self) -> None:
        while True:
            with self._lock:
                streams = [k for k in self._selector.get_map().values() if k.data is not None]
            if self._closing is not None and (not streams or time.monotonic() > self._closing):
                break
            for key, _ in self._selector.select(timeout=0.1):
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:  # every copy of the write end is closed: that process is gone
                    with self._lock:
                        self._selector.unregister(key.fd)
                    self._emit(key.data.feed(b"", end=True))
                    key.data.pipe.close()
                else:
                    self._emit(key.data.feed(chunk))
        with self._lock:
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    self._emit(key.data.feed(b"", end=True))
                    key.data.pipe.close()
            self._selector.close()
        for fd in (self._wake_r, self._wake_w, self.out_fd):  # here, once nothing writes to them any more
            os.close(fd)

    def _emit(self, lines: list[str]) -> None:
        out = []
        for line, stream in lines:
            if stream.dropping and (_CPP_TRAIL.match(line) or line.strip() == ""):
                stream.dropping = line.strip() != ""  # the blank line ends the message
                continue
            stream.dropping = False
            if self.expected(line):
                stream.dropping, self.dropped = True, self.dropped + 1
                continue
            out.append(line)
        if out:
            with contextlib.suppress(OSError):  # a stderr that is gone is no second error
                os.write(self.out_fd, "".join(out).encode(errors="replace"))


class _Stream:
    """One child's pipe: its unfinished last line, and whether a dropped message is still going on."""

    def __init__(self, pipe):
        self.pipe, self.partial, self.dropping = pipe, b"", False

    def feed(self, chunk: bytes, end: bool = False) -> list[tuple[str, "_Stream"]]:
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        if end and self.partial:
            lines, self.partial = [*lines, self.partial], b""
        return [(line.decode(errors="replace") + "\n", self) for line in lines]


class _Frames:
    """One child's message pipe: each frame (8-byte length, then the pickled message) put in ``inbox`` once whole;
    at the end, an unfinished one is dropped (its sender died writing it) and ``ended`` is set."""

    def __init__(self, pipe, inbox, ended: threading.Event):
        self.pipe, self.inbox, self.ended, self.partial, self.dropping = pipe, inbox, ended, b"", False

    def feed(self, chunk: bytes, end: bool = False) -> list:
        data = self.partial + chunk
        while len(data) >= 8 and len(data) >= 8 + (size := int.from_bytes(data[:8], "little")):
            self.inbox.put(pickle.loads(data[8 : 8 + size]))  # from a child this run started (as a Queue would)
            data = data[8 + size :]
        self.partial = data
        if end:
            self.ended.set()
        return []  # no stderr lines


class Outbox:
    """In a child: its messages to the launcher (:meth:`ChildPipes.mailbox`), each written whole into the pipe
    before ``put`` returns (a message never waits in a thread of this process that could die with it).

    A frame is written whole or not at all by this process: Ctrl-C, SIGTERM and SIGHUP wait for its end (a
    notebook rank's cell is interrupted by SIGINT while it prints), so a message cut short can only be one
    whose sender died.
    """

    def __init__(self, pipe):
        self.pipe, self._lock = pipe, threading.Lock()

    def put(self, message) -> None:
        data = pickle.dumps(message)
        frame = memoryview(len(data).to_bytes(8, "little") + data)
        with self._lock:  # this process's threads, one message at a time
            held = signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_BLOCKED)
            try:
                while frame:
                    frame = frame[os.write(self.pipe.fileno(), frame) :]
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)  # one that came meanwhile is delivered now


def use_stderr(pipe) -> None:
    """In a child: send its stderr (file descriptor 2: Python's and torch's C++ side's) into ``pipe``."""
    sys.stderr.flush()
    os.dup2(pipe.fileno(), 2)
    pipe.close()
