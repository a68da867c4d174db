"""The launcher: results by rank, failures with rank and traceback, nothing left behind, torchrun."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from processes import run_torchrun, session_processes, torchrun_args

from minddp import RankError, launch


def rank_info(tag):
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return {
        "tag": tag,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": t.item(),
        "pid": os.getpid(),
        "env_rank": int(os.environ["RANK"]),
    }


def fail_on_rank(bad_rank):
    if dist.get_rank() == bad_rank:
        raise ValueError(f"boom on {bad_rank}")
    dist.barrier()  # the healthy ranks wait for a peer that will never come
    return "unreachable"


def die_on_rank(bad_rank):
    if dist.get_rank() == bad_rank:
        os.kill(os.getpid(), 9)
    dist.barrier()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("world", [1, 3])
def test_results_come_back_in_rank_order(world):
    out = launch(rank_info, "x", world_size=world)
    assert [o["rank"] for o in out] == list(range(world))
    assert all(o["world"] == world and o["env_rank"] == o["rank"] for o in out)
    assert all(o["sum"] == world * (world + 1) / 2 for o in out)  # the collective really ran
    assert len({o["pid"] for o in out}) == world
    assert not any(pid_alive(o["pid"]) for o in out)


def test_exception_reaches_caller_with_rank_and_traceback_without_hanging(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(fail_on_rank, 1, world_size=2, timeout_s=60)
    # the collective timeout (60 s) counts from rank 0's collective, after start-up: an end before 60 s from
    # the launch was not that timeout (a quiet machine takes a few seconds, most of it start-up)
    assert time.monotonic() - start < 60
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "boom on 1" in str(err) and "fail_on_rank" in err.traceback


def test_killed_rank_is_reported_and_nothing_is_left(tmp_path):
    before = set(p.pid for p in __import__("multiprocessing").active_children())
    with pytest.raises(RankError) as info:
        launch(die_on_rank, 0, world_size=2, timeout_s=60)
    assert info.value.rank == 0 and info.value.exc_type == "ProcessDied"
    after = set(p.pid for p in __import__("multiprocessing").active_children())
    assert after <= before  # only the forkserver (if any) remains, no rank


WAIT_FOREVER = """
import os, sys, time
import torch.distributed as dist
from minddp import launch

def wait_forever(folder):
    path = os.path.join(folder, f"rank{dist.get_rank()}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)       # whole, or not there yet
    time.sleep(300)

if __name__ == "__main__":
    launch(wait_forever, sys.argv[1], world_size=2)
"""


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)])
def test_ending_the_launcher_ends_its_ranks(tmp_path, sig, status):
    # The ranks are children of multiprocessing's process server, not of the launcher: before, a
    # SIGTERM to the launcher (timeout, a scheduler) left both ranks running their function to the end.
    script = tmp_path / "job.py"
    script.write_text(WAIT_FOREVER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    pid_files = [tmp_path / f"rank{r}.pid" for r in range(2)]
    ranks = []
    try:
        deadline = time.monotonic() + 120
        while not all(f.exists() for f in pid_files):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        ranks = [int(f.read_text()) for f in pid_files]
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=30) == status
        if sig == signal.SIGTERM:  # the launcher ended everything it started before it exited: ranks, process
            assert session_processes(proc.pid) == []  # server, resource tracker (SIGKILL leaves them a moment)
        deadline = time.monotonic() + 15  # SIGKILL: each rank notices within its 1 s check
        while any(pid_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in ranks if pid_alive(pid)]
        err = proc.stderr.read()
        if sig == signal.SIGTERM:
            assert "minddp.launch: terminated (SIGTERM); the ranks were ended" in err, err
    finally:  # a failing test must not leave its processes either
        for pid in [proc.pid] + ranks:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)


STOP_AT_ANY_MOMENT = """
import json, os, signal, sys, threading, time
import torch, torch.distributed as dist
from minddp import launch
from minddp.train.checkpoint import CheckpointError, read_checkpoint, save_checkpoint
from minddp.runtime.launch import report_step
from minddp.runtime.processes import Stopped, alive, stop_signals

def train_and_save(folder):
    path = os.path.join(folder, f"rank{dist.get_rank()}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**9):
        report_step(step)
        opt.zero_grad()
        model(torch.randn(8, 64)).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        save_checkpoint(os.path.join(folder, "ckpt.pt"), model=model, optimizer=opt, step=step + 1,
                        config={"world_size": 2})

def ready():
    return dist.get_rank()

if __name__ == "__main__":
    root, rounds = sys.argv[1], json.loads(sys.argv[2])
    launch(ready, world_size=2)        # the process server started (torch imported): each round's moments are its own
    for i, (name, delay) in enumerate(rounds):
        folder = os.path.join(root, str(i))
        os.makedirs(folder)
        sent = []
        def stop(sig=getattr(signal, name)):
            sent.append(time.monotonic())
            os.killpg(0, sig)          # the whole process group, as a terminal does: this script and the ranks
        with stop_signals():           # as the train command does around its whole run
            try:
                timer = threading.Timer(delay, stop)
                timer.start()
                launch(train_and_save, folder, world_size=2)
                status = 0
            except KeyboardInterrupt:
                status = 130
            except Stopped as exc:
                status = exc.code
            ended = time.monotonic()
        timer.join()
        ranks = [int(open(os.path.join(folder, f)).read()) for f in os.listdir(folder) if f.endswith(".pid")]
        ckpt = None
        if os.path.exists(os.path.join(folder, "ckpt.pt")):
            try:
                ckpt = read_checkpoint(os.path.join(folder, "ckpt.pt"))["step"]
            except CheckpointError as exc:
                ckpt = str(exc)
        print(json.dumps({"signal": name, "delay": delay, "status": status, "ranks": len(ranks),
                          "alive": [p for p in ranks if alive(p)], "checkpoint": ckpt,
                          "ended_s": ended - sent[0]}), flush=True)
"""

#: (signal, seconds after the round starts): before the ranks exist, while they are forked, start and join,
#: while they train and save, for each signal. (Which moment each delay hits varies with the machine; the
#: outcome must not.)
STOP_ROUNDS = [
    ("SIGINT", 0.0),
    ("SIGHUP", 0.05),
    ("SIGTERM", 0.15),
    ("SIGINT", 0.4),
    ("SIGHUP", 0.8),
    ("SIGTERM", 1.2),
    ("SIGINT", 2.0),
    ("SIGHUP", 3.0),
    ("SIGTERM", 4.0),
]


def test_ctrl_c_sigterm_and_sighup_at_any_moment_end_the_ranks_every_time(tmp_path):
    # One process launches again and again; each round, a timer sends a stop signal to the whole process
    # group (the launcher and its ranks, as a terminal does) at another moment. Before: SIGHUP killed the
    # launcher on the spot and left its ranks to its watch; Ctrl-C while the process server imported torch
    # ended that server with a traceback; each rank unwound on its own from Ctrl-C, racing with the launcher.
    import json

    from processes import as_a_terminal_starts_it

    script = tmp_path / "stops.py"
    script.write_text(STOP_AT_ANY_MOMENT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), json.dumps(STOP_ROUNDS)],
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
        preexec_fn=as_a_terminal_starts_it,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rounds = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["signal"], r["delay"]) for r in rounds] == [tuple(r) for r in STOP_ROUNDS], proc.stderr[-3000:]
    said = {
        "SIGINT": "interrupted (Ctrl-C)",
        "SIGTERM": "terminated (SIGTERM)",
        "SIGHUP": "hung up (SIGHUP: the terminal closed)",
    }
    for r in rounds:
        assert r["status"] == 128 + getattr(signal, r["signal"]), r
        assert r["alive"] == [], r  # every rank ended, by the time launch() raised
        assert r["checkpoint"] is None or isinstance(r["checkpoint"], int), r  # the last complete one loads
        # launch() ends the ranks at once: SIGTERM, 1 s, SIGKILL, at most 5 s for its exit to be reported;
        # the rest is margin for a loaded machine (the failure this guards against never ended at all).
        assert r["ended_s"] < 15, r
    # One line per round whose launch had begun, nothing else: no traceback from a rank or the process server.
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert all(line in {f"minddp.launch: {s}; the ranks were ended" for s in said.values()} for line in lines), (
        proc.stderr[-3000:]
    )
    assert sum(r["ranks"] > 0 for r in rounds) <= len(lines) <= len(rounds), (rounds, lines)


STOP_SIGNAL_RULES = """
import json, os, signal, time
from minddp.runtime.processes import Stopped, stop_signals, stops_deferred

def send(sig):
    os.kill(os.getpid(), sig)
    time.sleep(0.05)                  # the handler runs on the main thread, at its next instruction

seen = {}
with stop_signals():
    send(signal.SIGHUP)               # ignored when this process started (as nohup does): stays ignored
    seen["ignored hup"] = "no exception"
    try:
        send(signal.SIGTERM)
    except Stopped as exc:
        seen["term"] = exc.code
        send(signal.SIGTERM)          # a second stop during the clean-up: ignored
        send(signal.SIGINT)
        seen["second stop"] = "no exception"
seen["restored"] = [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
with stop_signals():
    try:
        with stops_deferred():
            send(signal.SIGINT)
            seen["deferred"] = "the block went on"
    except KeyboardInterrupt:
        seen["raised at the end"] = True
print(json.dumps(seen))
"""


def test_stop_signals_raise_once_leave_ignored_ones_and_wait_for_deferred_steps():
    from processes import as_a_terminal_starts_it

    def ignore_hup():  # as `nohup` starts a command from a terminal
        as_a_terminal_starts_it()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    out = subprocess.run(
        [sys.executable, "-c", STOP_SIGNAL_RULES], capture_output=True, text=True, timeout=120, preexec_fn=ignore_hup
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    assert json.loads(out.stdout) == {
        "ignored hup": "no exception",
        "term": 143,
        "second stop": "no exception",
        "restored": [str(signal.default_int_handler), str(signal.SIG_DFL), str(signal.SIG_IGN)],
        "deferred": "the block went on",
        "raised at the end": True,
    }, out.stdout


def test_a_script_without_a_main_guard_is_told_how_to_fix_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("from minddp import launch\n\ndef f():\n    return 1\n\nprint(launch(f, world_size=2))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert 'put the launch under if __name__ == "__main__":' in proc.stderr, proc.stderr[-2000:]


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        launch(rank_info, "x", world_size=0)


def test_joins_a_torchrun_job_again_and_again(tmp_path):
    # Three launches in one torchrun job, as `python -m minddp.train --stage all` makes: each must
    # build a working group (an earlier version hung on the second one, rejoining torchrun's store).
    # Each rank writes its results to its own file: two ranks sharing one stdout pipe can lose or
    # merge lines, which made an earlier stdout-parsing version flaky.
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_launch import rank_info
        from minddp import launch
        out = [launch(rank_info, f"torchrun{{i}}", world_size=99)[0] for i in range(3)]   # world from torchrun
        with open(os.path.join({str(tmp_path)!r}, "result-" + os.environ["RANK"] + ".json"), "w") as f:
            json.dump(out, f)
    """)
    )
    proc = run_torchrun(torchrun_args(str(script)), timeout=180)
    assert proc.returncode == 0, proc.stderr[-8000:]  # a worker's traceback comes before torchrun's summary
    import json

    per_rank = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1)]
    for rank, results in enumerate(per_rank):
        assert [r["tag"] for r in results] == ["torchrun0", "torchrun1", "torchrun2"]
        assert all(r["rank"] == rank and r["world"] == 2 and r["sum"] == 3 for r in results), results


def train_and_drop_a_temporary(_):
    """A hook stage on a transformers model (its import pins groups: see leave_group), and, last, an
    all_reduce of a tensor Python drops at once: what made a gloo thread abort the process at exit."""
    from minddp.ladder import build_stage
    from minddp.train.models import build_model

    model = build_stage("bucket-async", build_model("tiny-llama", 50, 0, seed=0))
    ids = torch.randint(1, 50, (2, 6))
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    model.finish_gradient_synchronization()
    dist.all_reduce(torch.ones(4))
    return "ok"


def _group_threads() -> list[str]:
    """This process's gloo threads (torch names them), from /proc."""
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return [n for n in names if "gloo" in n]


def test_a_torchrun_launch_leaves_no_group_threads_behind(tmp_path):
    # A group's gloo threads that outlive launch() may drop a tensor while Python shuts down, and the
    # process aborts at exit ("terminate called without an active exception") after a good run.
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_launch import train_and_drop_a_temporary, _group_threads
        from minddp import launch
        seen = []
        for i in range(2):
            launch(train_and_drop_a_temporary, i)
            seen.append(_group_threads())
        with open(os.path.join({str(tmp_path)!r}, "threads-" + os.environ["RANK"] + ".json"), "w") as f:
            json.dump(seen, f)
    """)
    )
    proc = run_torchrun(torchrun_args(str(script)), timeout=180)
    assert proc.returncode == 0, proc.stderr[-8000:]  # a worker's traceback comes before torchrun's summary
    import json

    for rank in (0, 1):
        assert json.loads((tmp_path / f"threads-{rank}.json").read_text()) == [[], []]


def callbacks_hold_the_group(rounds):
    """Rounds of: collectives whose Future callbacks hold the group, wait for them, leave, rejoin.

    gloo runs a Future's callbacks on its worker thread and lets go of them a
    moment after the Future completes; had that been the group's last
    reference, the thread would join itself and abort the rank ("Resource
    deadlock avoided"): a comm hook's state in a closure did this to a test.
    """
    from minddp.runtime.launch import join_group, leave_group

    rank, world, port = dist.get_rank(), dist.get_world_size(), int(os.environ["MASTER_PORT"])
    for i in range(rounds):
        group = dist.group.WORLD
        futs = [
            dist.all_reduce(torch.ones(256), async_op=True).get_future().then(lambda f, g=group: f.value())
            for _ in range(8)
        ]
        del group
        torch.futures.wait_all(futs)
        del futs
        leave_group()
        join_group(rank, world, port, "gloo", prefix=f"round{i}/")
    return rounds


def test_leaving_a_group_while_its_threads_still_hold_callbacks_does_not_abort():
    # Before leave_group waited for the worker threads to let go, 30 rounds aborted a rank every time.
    assert launch(callbacks_hold_the_group, 30, world_size=2) == [30, 30]


def stuck_after(steps):
    from minddp.runtime.launch import report_step

    for step in range(steps):
        report_step(step)
        time.sleep(0.5)
    time.sleep(600)  # a wait no collective timeout covers


def keeps_reporting(steps):
    from minddp.runtime.launch import report_step

    for step in range(steps):
        report_step(step)
        time.sleep(0.5)
    return steps


def test_stall_watchdog_ends_hung_ranks_but_not_working_ones():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(stuck_after, 2, world_size=2, stall_s=3)
    assert time.monotonic() - start < 120  # start-up + 1 s + stall_s (a few s); not the ranks' 600 s sleep
    assert info.value.exc_type == "Hung" and set(info.value.errors) == {0, 1}
    assert "no rank made progress for 3 s" in str(info.value) and info.value.step == 1
    # 6 steps of 0.5 s = 3 s in all, longer than stall_s, but every step is progress.
    assert launch(keeps_reporting, 6, world_size=2, stall_s=2) == [6, 6]


PRELOAD_CHECK = """
import json, sys
import torch

touched = []  # torch.cuda's entry points that may initialize CUDA: a process that forks ranks must call none
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _real=real, **k: touched.append(_n) or _real(*a, **k))

from minddp.runtime.launch import launch, rank_imports
from minddp.runtime.processes import RANK_IMPORTS, rank_context
from minddp.train.run import train_rank  # the train command's ranks run this

imports = [*RANK_IMPORTS, *rank_imports(train_rank)]
for module in imports:
    __import__(module)  # what the server does when it starts
touched_by_imports = list(touched)
rank_context(rank_imports(train_rank))  # this process's server, as the train command starts it
import user_module

print(json.dumps({
    "imports": imports,
    "touched": touched_by_imports,
    "user": rank_imports(user_module.loaded),
    "in_rank": launch(user_module.loaded, imports, world_size=1)[0],
}))
"""


def test_ranks_fork_with_the_train_commands_imports_and_none_of_them_touches_cuda(tmp_path):
    """The process server imports what the train command's ranks need (minddp.runtime.launch.rank_imports), so
    that each rank of each stage does not import it again; a module imported there must not initialize CUDA
    (a process that forks ranks must not), nor is a user's module imported there."""
    (tmp_path / "user_module.py").write_text(
        "import sys\n\ndef loaded(names):\n    return [n for n in names if n in sys.modules]\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD_CHECK], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert "minddp.train.run" in got["imports"] and "transformers.models.llama.modeling_llama" in got["imports"]
    assert got["touched"] == []
    assert got["user"] == []  # a user's function: its module is imported in the rank, never in the server
    assert got["in_rank"] == got["imports"]  # forked with every one already imported
