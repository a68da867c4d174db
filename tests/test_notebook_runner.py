"""The notebook runner: persistent ranks, labelled complete output, failures that never hang.

Oracles: results of collectives are checked against sums computed here; the
process table (``/proc``) is the oracle for "nothing left running"; the
IPython path is checked through a real kernel (jupyter_client). The demo
notebook (``00_runner_demo``) runs with the others in ``tests/test_notebooks.py``.
"""

from __future__ import annotations

import os
import time

import pytest
from processes import descendants

from minddp.notebook import CellError, Cluster
from minddp.notebook.display import render_text
from minddp.runtime.processes import alive as _alive

WORLD = 2


def rank_square(x):
    """A module-level function the ranks can import by name."""
    import torch.distributed as dist

    return (dist.get_rank() + x) ** 2


def wait_gone(pids, within_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(180)
def test_cluster_state_output_failures_and_restart():
    cluster = Cluster(WORLD, grace_s=0.5, release_s=2.0)
    with cluster:
        pids = cluster.pids
        assert all(_alive(p) for p in pids) and set(pids) <= descendants(os.getpid())

        # State persists between cells; stdout, stderr and the last value all come back, labelled.
        cluster.run("x = rank * 10")
        outs = cluster.run("import sys\nprint('out', rank)\nprint('err', rank, file=sys.stderr)\nx + 1")
        assert [(o.rank, o.stdout, o.stderr, o.value) for o in outs] == [
            (r, f"out {r}\n", f"err {r}\n", r * 10 + 1) for r in range(WORLD)
        ]
        text = render_text(outs)
        for r in range(WORLD):
            block = text.split(f"[rank {r}]")[1].split("[rank")[0]
            assert f"out {r}" in block and f"err {r}" in block and str(r * 10 + 1) in block

        # A real collective across the ranks; a subset of ranks; a figure; a callable.
        outs = cluster.run("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nt")
        expected = float(sum(range(1, WORLD + 1)))
        assert all(o.value.tolist() == [expected, expected] for o in outs)
        outs = cluster.run("import matplotlib.pyplot as plt\nplt.plot([0, rank])\nplt.show()", ranks=[WORLD - 1])
        assert [o.rank for o in outs] == [WORLD - 1] and outs[0].figures[0][:4] == b"\x89PNG"
        assert outs[0].stderr == ""  # plt.show() on a rank does not warn
        assert [o.value for o in cluster.run(rank_square, 3)] == [(r + 3) ** 2 for r in range(WORLD)]
        with pytest.raises(ValueError, match="ranks must be integers"):
            cluster.run("1", ranks=[WORLD])

        # Rank 1 fails while rank 0 waits in a collective for it: both reported, nothing hangs.
        with pytest.raises(CellError) as info:
            cluster.run("if rank == 1:\n    raise ValueError('boom on one rank')\ndist.all_reduce(t)")
        err = info.value
        assert err.rank == 1 and err.exc_type == "ValueError"
        assert "boom on one rank" in err.traceback and 'File "<cell 6, rank 1>", line 2' in err.traceback
        assert err.outputs[0].note and "rank 1 failed" in err.outputs[0].note
        # Same processes, same state, and a fresh group that works.
        assert cluster.pids == pids
        outs = cluster.run("u = torch.ones(1) * (rank + 1)\ndist.all_reduce(u)\n(u.item(), x)")
        assert [o.value for o in outs] == [(expected, r * 10) for r in range(WORLD)]

        # A cell on rank 0 alone that waits for absent peers is released by timeout_s.
        with pytest.raises(CellError) as info:
            cluster.run("dist.all_reduce(t)", ranks=[0], timeout_s=2)
        assert "timeout_s=2" in info.value.outputs[0].note

        # A rank that ignores everything is ended by pid and the cluster restarts, empty.
        with pytest.raises(CellError) as info:
            cluster.run(
                "import signal, time\nif rank == 0:\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "    time.sleep(600)\nraise RuntimeError('rank fails')"
            )
        assert info.value.exc_types[0] == "Restarted" and cluster.restarts == 1
        assert wait_gone(pids) == [] and not set(pids) & set(cluster.pids)
        outs = cluster.run("u = torch.ones(1)\ndist.all_reduce(u)\n(u.item(), 'x' in globals())")
        assert [o.value for o in outs] == [(float(WORLD), False)] * WORLD
        second = cluster.pids
    assert wait_gone(second) == []

    # A second start after shutdown works, and shutdown again leaves nothing.
    with cluster:
        assert [o.value for o in cluster.run("dist.get_rank()")] == list(range(WORLD))
        third = cluster.pids
    assert wait_gone(third) == []
    with pytest.raises(RuntimeError, match="not running"):
        cluster.run("1")


@pytest.mark.timeout(180)
def test_stall_s_cuts_a_cell_that_stands_still_not_one_that_is_slow():
    # The checker's backstop (minddp.exercises.checker._run): a cell that keeps printing runs past stall_s (it
    # prints every 0.25 s for at least 7.5 s, against stall_s = 5: a gap 20 times its own); a silent one is
    # released once stall_s has passed with no line, and says so.
    ticking = "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(0.25)\nrank"
    with Cluster(world_size=WORLD, grace_s=0.5, release_s=2.0) as cluster:
        start = time.monotonic()
        outs = cluster.run(ticking, stall_s=5)
        assert time.monotonic() - start > 5 and [o.value for o in outs] == list(range(WORLD))
        with pytest.raises(CellError) as info:
            cluster.run("import time\nprint('one line', flush=True)\ntime.sleep(120)", stall_s=1)
        assert all("no rank printed for stall_s=1" in (o.note or "") for o in info.value.outputs)


@pytest.mark.timeout(120)
def test_output_arrives_while_the_cell_still_runs(tmp_path):
    # Each rank prints 'tick 0', then waits (up to 60 s) until the caller has seen that line: the caller
    # marks it with a file from on_stream. Streamed, the cell goes on at once; held until the cell ends, the
    # line would come after the 60 s and the cell print 'not streamed'. An order, not a race with a sleep.
    seen = []

    def on_stream(r, kind, text):
        seen.append((r, kind, text))
        if "tick 0" in text:
            (tmp_path / f"seen{r}").touch()

    cell = (
        "import os, time\n"
        "print('tick', 0, rank, flush=True)\n"
        f"deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(tmp_path)!r} + f'/seen{{rank}}') and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('streamed' if time.monotonic() < deadline else 'not streamed', flush=True)\n"
        "for i in (1, 2):\n"
        "    print('tick', i, rank, flush=True)"
    )
    with Cluster(world_size=WORLD) as cluster:
        outs = cluster.run(cell, on_stream=on_stream)
    for out in outs:  # and the report is still complete, stream or not
        assert out.stdout == f"tick 0 {out.rank}\nstreamed\n" + "".join(f"tick {i} {out.rank}\n" for i in (1, 2))
        assert "".join(text for r, kind, text in seen if r == out.rank and kind == "stdout") == out.stdout


def test_live_view_prints_whole_lines_per_rank_after_its_delay(capsys):
    from minddp.notebook.display import LiveView

    live = LiveView(delay_s=0)
    live.write(0, "stdout", "hel")
    live.write(1, "stderr", "oops\n")
    live.write(0, "stdout", "lo\nwor")  # 'wor' waits for its newline
    captured = capsys.readouterr()
    assert captured.out == "[rank 0] hello\n" and captured.err == "[rank 1] oops\n" and live.shown
    quiet = LiveView(delay_s=60)  # a quick cell: nothing shown live, nothing to clear
    quiet.write(0, "stdout", "done\n")
    quiet.close()
    assert capsys.readouterr().out == "" and not quiet.shown


@pytest.mark.timeout(240)
def test_kernel_magics_and_kernel_restart_leave_nothing_behind():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:

        def execute(code: str) -> list[dict]:
            outputs = []
            kc.execute_interactive(code, timeout=120, output_hook=lambda m: outputs.append(m))
            return [m["content"] for m in outputs if m["msg_type"] in ("stream", "error", "display_data")]

        execute("%load_ext minddp.notebook\n%dist_init --world-size 2")
        out = execute("%%distributed\nprint('hello', rank)\ndist.get_world_size()")
        texts = "".join(c.get("text", "") + c.get("data", {}).get("text/plain", "") for c in out)
        assert texts.index("[rank 0]") < texts.index("hello 0") < texts.index("[rank 1]") < texts.index("hello 1")
        # A long cell shows its lines live, then clears them for the final per-rank blocks.
        msgs = []
        kc.execute_interactive(
            "%%distributed\nimport time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.6)",
            timeout=120,
            output_hook=msgs.append,
        )
        kinds = [m["msg_type"] for m in msgs]
        live = [i for i, m in enumerate(msgs) if kinds[i] == "stream" and "[rank 0] tick 2" in m["content"]["text"]]
        final = [i for i, m in enumerate(msgs) if kinds[i] == "stream" and m["content"]["text"] == "[rank 0]\n"]
        assert live and final and live[0] < kinds.index("clear_output") < final[0], kinds
        # A traceback names the cell as the notebook shows it, In [N], and counts its lines from the magic's.
        failed = []
        reply = kc.execute_interactive(
            "%%distributed\nx = 1\nraise ValueError('here')", timeout=120, output_hook=failed.append
        )
        said = "".join(m["content"].get("evalue", "") for m in failed if m["msg_type"] == "error")
        count = reply["content"]["execution_count"]
        assert f'File "<In [{count}], rank 0>", line 3' in said, said
        out = execute("%%rank [1]\nrank")
        assert "[rank 0]" not in "".join(c.get("text", "") for c in out)
        out = execute("%%rank 7\nrank")
        # IPython prints a UsageError as one line on stderr, without a traceback.
        assert "UsageError: %%rank 7: this cluster has ranks 0..1" in "".join(
            c.get("text", "") for c in out if c.get("name") == "stderr"
        )
        # %dist_mode on: plain cells go to the ranks; magics stay in the kernel.
        out = execute("%dist_mode on")
        out = execute("rank + 100")
        texts = "".join(c.get("text", "") + c.get("data", {}).get("text/plain", "") for c in out)
        assert all(f"[rank {r}]" in texts and str(100 + r) in texts for r in range(2))
        failed = []
        reply = kc.execute_interactive("x = 1\nraise ValueError('here')", timeout=120, output_hook=failed.append)
        said = "".join(m["content"].get("evalue", "") for m in failed if m["msg_type"] == "error")
        assert f'File "<In [{reply["content"]["execution_count"]}], rank 0>", line 2' in said, said  # no magic line
        execute("%dist_mode off")
        out = execute(
            "import os\nfrom minddp.notebook import current_cluster\nprint(current_cluster().pids, os.getpid())"
        )
        # print() writes its parts one by one and the kernel may send them as several stream messages (its flush
        # timer can fire between them on a loaded machine: CI split this line once), so read them joined
        pids_line = "".join(c["text"] for c in out if c.get("name") == "stdout")
        worker_pids = [int(p) for p in pids_line.split("]")[0].strip("[").split(",")]
        kernel_pid = int(pids_line.split("]")[1])
        assert set(worker_pids) <= descendants(kernel_pid)
        # Everything the kernel started (ranks, forkserver) must go with it.
        before = descendants(kernel_pid)
        km.restart_kernel(now=False)
        assert wait_gone(before) == [], "processes left after kernel restart"
        assert wait_gone([kernel_pid]) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_cell_error_reads_the_same_in_jupyter_and_as_its_value():
    # Jupyter renders _render_traceback_; a viewer that prints an error's value (nbconvert to text, a reader's
    # extractor) prints str(error). Both must hold the heading and every failed rank's traceback, the cause first,
    # so a notebook's sentence about the error is true in either. Oracle: the tracebacks the error was given.
    cause = 'Traceback (most recent call last):\n  File "<cell 1, rank 1>", line 2\nValueError: boom\n'
    released = 'Traceback (most recent call last):\n  File "<cell 1, rank 0>", line 3\nRuntimeError: peer gone\n'
    err = CellError({1: cause, 0: released}, {1: "ValueError", 0: "RuntimeError"})
    expected = [
        "CellError: rank 1 failed (ranks [0] failed too):",
        "Error on rank 1: ValueError",
        *cause.splitlines(),
        "Error on rank 0: RuntimeError",
        *released.splitlines(),
    ]
    assert err._render_traceback_() == expected
    assert f"CellError: {err}".splitlines() == expected


@pytest.mark.timeout(180)
def test_a_rank_killed_half_way_through_a_report_is_named_and_the_others_outputs_arrive():
    # Each rank reports through its own pipe: rank 1 dies half-way through a message, rank 0's output still
    # arrives whole and the cell names rank 1 as died; the cluster goes on after a restart.
    cell = (
        "import os, signal\nprint('before', rank)\n"
        "if rank == 1:\n"
        "    from ft_tasks import _outbox_on_stack\n"
        "    os.write(_outbox_on_stack().pipe.fileno(), (1000).to_bytes(8, 'little') + b'x' * 500)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "rank"
    )
    with Cluster(2, grace_s=0.5, release_s=2.0) as cluster:
        with pytest.raises(CellError) as info:
            cluster.run(cell)
        outs = info.value.outputs
        assert (outs[0].stdout, outs[0].value) == ("before 0\n", 0)
        assert outs[1].exc_type == "ProcessDied", outs[1]
        cluster.restart()
        assert [o.value for o in cluster.run("rank")] == [0, 1]
