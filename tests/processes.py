"""Process helpers for tests: what a pid started, and torchrun jobs that never outlive their test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from minddp.processes import alive as _alive


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if _alive(child):
                found.add(child)
                todo.append(child)
    return found


def run_torchrun(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run *args``, output captured, like ``subprocess.run``.

    On a timeout (or any interruption) the job is ended, not orphaned: torchrun
    gets SIGTERM (it then ends its workers), and any worker still there after
    10 s is killed by its pid. torchrun puts each worker in its own session, so
    killing torchrun alone, as ``subprocess.run`` does, would leave them running.
    """
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
