"""What a local run opens and leaves: it listens on loopback only, and nothing of it outlives its launcher.

Oracles: the kernel's own tables (``/proc/PID/net/tcp*`` for every listening socket of every process of
the run, ``/proc`` for every process of its session) read from outside the run, and the text torch's C++
side really prints when a connection breaks.

Each run is a launcher started as a terminal starts a command (its own session, stop signals at their
defaults), inside a network namespace of its own where the machine's hostname resolves to a
non-loopback address (10.213.7.1 on a veth interface): there a backend that binds "the hostname's
address", as gloo does by default, is seen listening on the network, and a store that binds every
interface, as torch's TCPStore does, on ``::``. (Where no namespace can be made, not root, the runs go
on this machine as it is, and the gloo check is as strong as its hostname.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from processes import as_a_terminal_starts_it, listening_sockets, session_processes

RUN = """
import os, sys, time
import torch, torch.distributed as dist
from minddp import launch
from minddp.ft import ToyTask, launch_ft

def hold(folder, fail):
    dist.all_reduce(torch.ones(1))                      # every gloo pair is connected
    if fail and dist.get_rank() == 1:
        raise ValueError("the rank's own error")
    open(os.path.join(folder, f"ready{dist.get_rank()}"), "w").close()
    time.sleep(300)                                     # until the test stops the run

class HeldTask(ToyTask):
    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def global_batch(self, step):
        if step == 1:                                   # step 0 committed: the coordinator and the group are up
            open(os.path.join(self.folder, f"ready{os.environ['MINDDP_FT_SLOT']}"), "w").close()
            time.sleep(300)
        return super().global_batch(step)

if __name__ == "__main__":
    folder, how = sys.argv[1], sys.argv[2]
    if how == "ft":
        launch_ft(HeldTask(folder), 3, world_size=2, hang_s=600)
    else:
        launch(hold, folder, how == "fail", world_size=2)
"""

#: A network namespace where the hostname is not loopback: `sh -c SETUP` then the run (same pid: exec).
NETNS_SETUP = (
    "hostname minddp-netns && ip link set lo up && ip link add v0 type veth peer name v1 && "
    "ip addr add 10.213.7.1/24 dev v0 && ip link set v0 up && ip link set v1 up && "
    "printf '127.0.0.1 localhost\\n::1 localhost\\n10.213.7.1 minddp-netns\\n' > \"$0/hosts\" && "
    'mount --bind "$0/hosts" /etc/hosts && exec "$2" "$0/run.py" "$0" "$1"'
)
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _namespace_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = ["unshare", "--net", "--uts", "--mount", "sh", "-c", "ip link add v0 type veth peer name v1"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _start(folder, how: str, namespace: bool) -> subprocess.Popen:
    folder.mkdir()
    (folder / "run.py").write_text(RUN)
    if namespace:
        cmd = ["unshare", "--net", "--uts", "--mount", "sh", "-c", NETNS_SETUP, str(folder), how, sys.executable]
    else:
        cmd = [sys.executable, str(folder / "run.py"), str(folder), how]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the run's own session: every process of it, found by its session id
        preexec_fn=as_a_terminal_starts_it,
    )


def _wait_ready(proc: subprocess.Popen, folder, deadline: float) -> None:
    while not all((folder / f"ready{r}").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_local_run_listens_on_loopback_only_and_nothing_of_it_outlives_its_launcher(tmp_path):
    # Three runs at once (their start is the slow part): the launcher stopped by Ctrl-C, the ft launcher (its
    # coordinator, its ranks' own gloo groups) by the terminal hanging up, and a launcher whose rank fails.
    # Before: the stores listened on every interface (::), gloo on the hostname's address, and the process
    # server and resource tracker were still there when the launcher had exited.
    namespace = _namespace_works()
    cases = {"launch": signal.SIGINT, "ft": signal.SIGHUP, "fail": None}
    procs = {how: _start(tmp_path / how, how, namespace) for how in cases}
    try:
        deadline = time.monotonic() + 240
        for how, sig in cases.items():
            proc = procs[how]
            if sig is not None:
                _wait_ready(proc, tmp_path / how, deadline)
                pids = session_processes(proc.pid)
                sockets = {pid: listening_sockets(pid) for pid in pids}
                found = [address for listening in sockets.values() for address, _ in listening]
                # the store (launcher's or coordinator's) and each rank's gloo listener: at least three
                assert len(found) >= 3 and set(found) <= LOOPBACK, (how, namespace, sockets)
                os.killpg(proc.pid, sig)  # the whole group, as a terminal does
            status = proc.wait(timeout=120)
            left = session_processes(proc.pid)  # right after the launcher exited: nothing of the run
            assert left == [], (how, left, [open(f"/proc/{p}/cmdline").read()[:120] for p in left])
            expected = {"launch": -signal.SIGINT, "ft": 128 + signal.SIGHUP, "fail": 1}[how]
            assert status == expected, (how, status, proc.stderr.read()[-3000:])
    finally:  # a failing test must not leave its processes either
        for proc in procs.values():
            for pid in session_processes(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)


def break_a_connection_then_fail():
    """A child's stderr: torch's own messages about a store it cannot reach (what a rank prints while its coordinator
    restarts), a C++ message about something else, then a Python error with its cause."""
    import datetime
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:  # a port with no one behind it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=0.3))
    except dist.DistError:
        pass
    os.write(2, b"[W1127 12:00:00.000000000 ProcessGroupGloo.cpp:123] [c10d] an unexpected message\nframe #0: its\n\n")
    raise ValueError("the cause a user must see")


def _child_stderr(expected) -> str:
    """What ``break_a_connection_then_fail``, run as a rank is (forked by the process server), leaves on a stderr
    filtered by ``ChildPipes(expected)``."""
    import tempfile

    from minddp.runtime.processes import ChildPipes, rank_context, use_stderr

    ctx = rank_context()
    with tempfile.TemporaryFile() as out:
        quiet = ChildPipes(expected, out_fd=out.fileno())
        pipe = quiet.writer()
        child = ctx.Process(target=_in_child, args=(pipe, use_stderr))
        child.start()
        pipe.close()
        child.join(60)
        quiet.close()
        out.seek(0)
        return out.read().decode()


def _in_child(pipe, use_stderr):
    use_stderr(pipe)
    break_a_connection_then_fail()


def test_the_ft_filter_drops_torchs_warnings_about_broken_connections_and_keeps_everything_else():
    from minddp.runtime.processes import expected_connection_noise

    everything = _child_stderr(lambda line: False)
    # The oracle: torch's C++ side did print its messages, with their native stacks, on the unfiltered stderr.
    assert "socket.cpp" in everything and "Exception raised from" in everything, everything
    filtered = _child_stderr(expected_connection_noise)
    assert "socket.cpp" not in filtered and "TCPStore.cpp" not in filtered, filtered
    assert "Exception raised from" not in filtered and "frame #1" not in filtered, filtered
    # What else the child said is all there, in order: the other C++ message with its stack, and the error's cause.
    unexpected = "[W1127 12:00:00.000000000 ProcessGroupGloo.cpp:123] [c10d] an unexpected message\nframe #0: its\n"
    assert unexpected in filtered, filtered
    assert filtered.index(unexpected) < filtered.index("Traceback") < filtered.index("ValueError: the cause a user")


def test_a_childs_messages_arrive_whole_and_in_order_however_the_pipe_cuts_them_and_a_cut_one_is_dropped():
    # The launcher's thread reads each child's message pipe in whatever pieces the kernel hands it; the oracle is
    # what the child put: each message once, whole, in order; a frame its sender died writing is not one.
    import pickle
    import queue
    import threading

    from minddp.runtime.processes import _Frames

    sent = [("log", 0, 0, {"step": s, "loss": s / 3}) for s in range(3)] + [("ok", 0, 0, bytes(range(256)) * 40)]
    wire = b"".join(len(b).to_bytes(8, "little") + b for b in map(pickle.dumps, sent))
    wire += (50).to_bytes(8, "little") + b"cut"  # a frame of 50 bytes, its sender gone after 3
    for piece in (1, 7, 8, 4096, len(wire)):
        inbox, ended = queue.SimpleQueue(), threading.Event()
        frames = _Frames(None, inbox, ended)
        for i in range(0, len(wire), piece):
            frames.feed(wire[i : i + piece])
        assert not ended.is_set()
        frames.feed(b"", end=True)
        assert ended.is_set()
        got = [inbox.get_nowait() for _ in range(inbox.qsize())]
        assert got == sent, piece
