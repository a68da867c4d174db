"""Process helpers for tests: what a pid started, torchrun jobs that never outlive their test, commands started
as a terminal starts them, pipes that nobody reads."""

from __future__ import annotations

import os
import re
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


#: A line of torch's C++ side: a c10 log line (``[W1127 11:25:02.03 TCPStore.cpp:106] ...``) or its native stack.
CXX_LINE = re.compile(r"\.(?:cpp|cc|h|hpp):\d+\]|^frame #\d+: |^Exception raised from |<omitting python frames>")


class fd_captured:
    """``with fd_captured(2) as cap:``: what this process and the processes it starts write to file descriptor
    ``fd`` inside the block, in ``cap.text`` afterwards (a module fixture's run, where pytest's capfd is not).

    Ranks forked from the process server (``rank_context``) write where the *server's* stderr goes, which was
    this process's when the server started (the session's first launch, pytest's own capture file): the bytes
    added to that file meanwhile are taken too, so the text is everything a run's processes wrote.
    """

    def __init__(self, fd: int = 2):
        self.fd, self.text = fd, ""

    def __enter__(self):
        import tempfile
        from multiprocessing import forkserver

        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(self.fd)
        os.dup2(self._file.fileno(), self.fd)
        self._server = None
        server = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if self.fd == 2 and server is not None and Path(f"/proc/{server}/fd/2").is_file():  # not a pipe or terminal
            self._server = open(f"/proc/{server}/fd/2", "rb")
            self._server.seek(0, os.SEEK_END)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, self.fd)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
        if self._server is not None:
            self.text += self._server.read().decode(errors="replace")
            self._server.close()
        if exc[0] is not None:  # the run failed: show what it said
            sys.stderr.write(self.text[-4000:])


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` holds open in the listening state, from the kernel's own
    tables as that process sees them (``/proc/PID/net/tcp*``: its network namespace, which psutil does not read)."""
    import ipaddress

    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: TCP_LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host order (little-endian here)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def session_processes(sid: int) -> list[int]:
    """Every live process of session ``sid`` (a command started with ``start_new_session=True``: its own pid)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:  # gone meanwhile
                continue
    return found
