"""The processes a run starts: how they are made, watched and ended. One place, for the launcher and the notebooks.

* :func:`rank_context`: how rank processes are made (forked from a server that
  imported torch once);
* :func:`alive`: whether a pid still runs (a zombie, dead but not yet reaped,
  counts as gone);
* :func:`watch_parent`: inside a rank, a daemon thread that ends the rank once
  the process that started it is gone, even if that one was SIGKILLed and
  could run no clean-up;
* :func:`end_processes`: end only the processes we started, by their handles
  (never by name).

Example::

    >>> watch_parent(launcher_pid, "the launcher (pid 123) is gone; ending this rank")
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch.multiprocessing as mp


def rank_context():
    """Processes for ranks: forked from a server that has imported torch once.

    A fresh interpreter per rank ("spawn") pays torch's import (seconds) at
    every launch; the forkserver pays it once per parent and forks ranks from
    a clean, single-threaded process that never touched CUDA, which is as
    safe as spawn. Platforms without fork use spawn.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "minddp.launch"])
    return ctx


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
    except PermissionError:      # exists, owned by someone else
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
    """End only the processes this process started, by their handles (pids): join, then terminate, then kill."""
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
            p.join()
