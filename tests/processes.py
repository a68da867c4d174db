"""Process helpers for tests: what a pid started, torchrun jobs that never outlive their test, commands started
as a terminal starts them, pipes that nobody reads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from minddp.runtime.processes import alive as _alive


def _children_by_parent() -> dict[int, list[int]]:
    """ppid -> the pids of its children, from /proc (processes that vanish while read are left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), from /proc."""
    children = _children_by_parent()
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if _alive(child):
                found.add(child)
                todo.append(child)
    return found


def free_port() -> int:
    """A TCP port on this machine that the OS has just handed out (so two jobs never pick the same one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(*rest: str, nproc: int = 2) -> list[str]:
    """torchrun's arguments for a job of ``nproc`` workers on this machine, on a free port, then ``rest``."""
    return ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *rest]


def run_torchrun(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run *args``, output captured, like ``subprocess.run``.

    On a timeout (or any interruption) the job is ended, not orphaned: torchrun
    gets SIGTERM (it then ends its workers), and any worker still there after
    10 s is killed by its pid. torchrun puts each worker in its own session, so
    killing torchrun alone, as ``subprocess.run`` does, would leave them running.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        workers = descendants(proc.pid)
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        for pid in workers:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def as_a_terminal_starts_it() -> None:
    """``preexec_fn`` for a command started the way a terminal starts a foreground job: Ctrl-C, SIGTERM and
    SIGHUP at their default dispositions.

    A process inherits ignored signals: pytest started in the background by a shell without job control
    (``pytest &`` in a script, some CI runners) ignores SIGINT, and so would every command it starts, which
    then, as every program should, keeps ignoring Ctrl-C. A test of what Ctrl-C does must not depend on how
    pytest was started.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    return {child for child in _children_by_parent().get(pid, []) if _alive(child)}


def fill_pipe(write_fd: int) -> int:
    """Fill the pipe whose write end is ``write_fd`` (64 KiB on Linux) as a reader that has not read yet leaves it.

    Written through an open file description of its own, set non-blocking: the command that shares
    ``write_fd`` keeps its blocking writes, which now block. Returns the bytes written.
    """
    fd = os.open(f"/proc/self/fd/{write_fd}", os.O_WRONLY | os.O_NONBLOCK)
    n = 0
    try:
        for size in (4096, 1):  # pages while a page fits, then bytes
            try:
                while True:
                    n += os.write(fd, b"\0" * size)
            except BlockingIOError:
                pass
    finally:
        os.close(fd)
    return n
