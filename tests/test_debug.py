"""``MINDDP_DEBUG=1``: each classic data-parallel bug named in one line on every rank, nothing hangs.

The scripts are ``tests/debug_bugs.py``: one ordinary DDP training script, the bug chosen by name.
One 2-rank world runs them all (each bug's error caught inside the ranks: every check raises on every
rank before the collective it guards, so the world stays usable for the next script):

1. **without the flag**, the scripts that run to the end, under torch's DDP and minddp's: nothing of
   debug mode is installed, and the final parameters are bit for bit torch's (the oracle);
2. **with the flag**, every bug: the line says the cause, the tensor or call, the rank(s) and the step,
   on every rank; the scripts without a bug (``none``, ``join``) say nothing;
3. last, ``uneven``: a rank leaves the world while the other is in a step.

What torch's DDP does on each (silent, a hang, or an error without the cause) is recorded once in
``docs/debugging.md`` (``python tests/debug_bugs.py --record``), not asserted. One torchrun job checks
the flag as a user sets it, on an unchanged script.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import io
import os
import re
import subprocess
import sys
import threading
import warnings

import debug_bugs
import pytest
import torch
import torch.distributed as dist
from processes import run_torchrun, torchrun_args
from torch import nn
from torch.distributed import distributed_c10d as c10d

import minddp.debug
from minddp import DistributedDataParallel, build_stage, launch
from minddp.debug import collective_check
from minddp.debug.watch import ROOT, RUN, RUN_PRIME, RUN_ROOT, P, fingerprints
from minddp.ladder import TEACHING
from minddp.runtime.compat import process_group_store

#: Scripts that run to the end under torch's DDP: compared bit for bit without the flag.
COMPLETE = ["none", "drift", "buffers", "direct", "no_sync", "same-data", "join"]
#: (wrapper, script) run with the flag; "minddp" is minddp.DistributedDataParallel, the rest teaching stages.
FLAGGED = [("minddp", kind) for kind in debug_bugs.KINDS if kind != "uneven"] + [
    ("ga", "no_sync"),
    ("bucket-async", "drift"),
    ("bucket-async", "frozen-late"),
    ("hook", "uneven-barrier"),
    ("simple", "coll-shape"),
]


def outcome(kind: str, impl: str, script=None) -> dict:
    """Run one script on this rank (``debug_bugs.train`` unless ``script`` is given): its error (one line per
    rank), its debug-mode warnings, its parameters."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            params, error = (script or debug_bugs.train)(kind, impl), None
        except Exception as exc:  # every check raises on every rank, before the collective it guards
            params, error = None, f"{type(exc).__name__}: {exc}"
    said = [str(w.message) for w in caught if str(w.message).startswith("minddp debug")]
    return {"params": params, "error": error, "warnings": said}


def every_script() -> dict:
    out = {("torch", kind): outcome(kind, "torch") for kind in COMPLETE}
    out |= {("off", kind): outcome(kind, "minddp") for kind in COMPLETE}
    out["debug code run in a step while off"] = debug_code_in_a_step()
    out["installed while off"] = bool(collective_check._originals) or any(  # torch's own functions, untouched
        getattr(dist, name) is not getattr(c10d, name) for name in collective_check.CHECKED if hasattr(c10d, name)
    )
    minddp.debug.enable()  # as MINDDP_DEBUG=1 when the ranks import minddp
    out |= {(impl, kind): outcome(kind, impl) for impl, kind in FLAGGED}
    out["minddp", "drift after join"] = outcome("drift after join", "minddp", drift_after_join)
    out["late partner"] = late_partner()
    out["minddp", "uneven"] = outcome("uneven", "minddp")  # last: rank 1 leaves the world
    return out


def drift_after_join(kind: str, impl: str) -> torch.Tensor:
    """``join``'s script (rank 1 has one batch fewer, under ``model.join()``), then two more steps after the block,
    rank 1 editing a parameter in place after the first of them: debug mode pauses inside the block only."""
    assert impl == "minddp"
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = debug_bugs.Net()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)

    def step(x, y):
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    with ddp.join():
        for x, y in debug_bugs.batches("join", rank, debug_bugs.STEPS):
            step(x, y)
    for i, (x, y) in enumerate(debug_bugs.batches("none", rank, 2)):
        step(x, y)
        if i == 0 and rank == 1:
            with torch.no_grad():
                model.head.weight[0, 0] += 1e-3
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def debug_code_in_a_step() -> set[str]:
    """The files of debug mode that one training step runs while it is off (the answer must be: none)."""
    from minddp import build_stage
    from minddp.ddp import debug_reducer

    package = os.path.dirname(inspect.getsourcefile(collective_check))  # minddp/debug: every module of debug mode
    ours = {os.path.join(package, name) for name in os.listdir(package)} | {inspect.getsourcefile(debug_reducer)}
    ran: set[str] = set()
    for stage in ("ddp", "bucket-async"):
        torch.manual_seed(0)
        wrapped = build_stage(stage, debug_bugs.Net())
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        for i, (x, y) in enumerate(debug_bugs.batches("none", dist.get_rank(), 2)):
            if i == 1:  # the second step (the first rebuilds ddp's plan): every function it calls
                sys.setprofile(lambda frame, event, arg: ran.add(frame.f_code.co_filename) if event == "call" else None)
            try:
                torch.nn.functional.mse_loss(wrapped(x), y).backward()
                wrapped.finish_gradient_synchronization()
                optimizer.step()
            finally:
                sys.setprofile(None)
    return {os.path.basename(path) for path in ran & ours}


class Told(io.StringIO):
    """This rank's stderr, which also tells the store (under ``key``) once something was written to it."""

    def __init__(self, store, key: str):
        super().__init__()
        self.store, self.key = store, key

    def write(self, text: str) -> int:
        self.store.set(self.key, "1")
        return super().write(text)


def late_partner(key: str = "said", late_because=None) -> dict:
    """Rank 1 joins an all_reduce only once rank 0, waiting in its check, has said so: the line, then the sum.

    ``late_because``: what rank 1 does first (why it is late).
    """
    store = process_group_store(dist.group.WORLD)
    before, collective_check.SAY_AFTER_S = collective_check.SAY_AFTER_S, 0.5
    told = Told(store, key)
    try:
        total = torch.ones(1)
        if dist.get_rank() == 0:
            with contextlib.redirect_stderr(told):
                dist.all_reduce(total)
        else:
            if late_because is not None:
                late_because()
            store.wait([key])  # not a timing: rank 1 arrives after rank 0's line, whatever the machine's speed
            dist.all_reduce(total)
    finally:
        collective_check.SAY_AFTER_S = before
    return {"said": told.getvalue(), "total": total.item()}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return launch(every_script, world_size=2, timeout_s=60)


def lines(runs, impl: str, kind: str, warning: bool = False) -> str:
    """The line every rank said (checked: each rank said it, with its own rank, the same words); returned once."""
    said = [r[impl, kind]["warnings"][0] if warning else r[impl, kind]["error"] for r in runs]
    assert all(s is not None for s in said), (impl, kind, said)
    bodies = set()
    for rank, line in enumerate(said):
        assert f"minddp debug (rank {rank}): " in line and "\n" not in line, line
        bodies.add(line.split(f"(rank {rank}): ", 1)[1])
    assert len(bodies) == 1, said  # every rank says the same
    return bodies.pop()


def test_off_nothing_is_installed_and_every_script_trains_bit_for_bit_like_torch(runs):
    for rank, r in enumerate(runs):
        assert r["installed while off"] is False
        assert r["debug code run in a step while off"] == set()  # free when off: not one of its functions runs
        for kind in COMPLETE:
            ours, theirs = r["off", kind], r["torch", kind]
            assert ours["error"] is None and theirs["error"] is None, (kind, ours["error"], theirs["error"])
            assert torch.equal(ours["params"], theirs["params"]), (kind, rank)
            assert ours["warnings"] == [], ours["warnings"]


def test_scripts_without_a_bug_say_nothing_and_train_as_without_the_flag(runs):
    for r in runs:
        for kind in ("none", "join"):  # join: uneven batches handled (every check pauses while a rank has joined)
            assert r["minddp", kind]["error"] is None and r["minddp", kind]["warnings"] == [], r["minddp", kind]
            assert torch.equal(r["minddp", kind]["params"], r["torch", kind]["params"])


def test_1_replicas_that_drift_apart_name_the_tensor_step_ranks_and_difference(runs):
    for impl in ("minddp", "bucket-async"):
        line = lines(runs, impl, "drift")
        # rank 1 added 1e-3 to head.weight[0, 0] after step 1's update: found before step 2's forward
        assert line.startswith("replicas drifted apart: parameter 'head.weight' differs across ranks at step 2"), line
        assert "rank 1 differs from rank 0 by up to 0.001" in line, line
        assert "Fix: " in line
    line = lines(runs, "minddp", "buffers", warning=True)  # a warning: the run goes on
    assert line.startswith("buffers differ across ranks: buffers 'norm.running_mean', 'norm.running_var'"), line
    assert "broadcast_buffers=False" in line and "SyncBatchNorm" in line
    assert all(r["minddp", "buffers"]["error"] is None for r in runs)


def test_the_checks_pause_inside_join_and_resume_after_it(runs):
    # torch leaves the Join's config set after the block: read as "inside", every later step went unchecked
    line = lines(runs, "minddp", "drift after join")
    assert line.startswith("replicas drifted apart: parameter 'head.weight' differs across ranks"), line
    assert "rank 1 differs from rank 0 by up to 0.001" in line, line


def test_2_gradients_never_averaged_say_why_the_module_called_directly_or_no_sync(runs):
    line = lines(runs, "minddp", "direct")
    assert line.startswith("gradients never averaged: the gradient of 'encoder.weight' differs across ranks"), line
    assert "in step 0" in line and "rank 1 differs from rank 0" in line
    assert re.search(r"the wrapped module was called directly at tests/debug_bugs\.py:\d+", line), line
    assert "Fix: call the wrapper (model(x), not model.module(x)" in line
    for impl in ("minddp", "ga"):
        line = lines(runs, impl, "no_sync")
        assert line.startswith("gradients never averaged: the gradient of 'encoder.weight'") and "in step 3" in line
        assert "inside no_sync()" in line and "outside `with model.no_sync():`" in line, line


def test_3_every_rank_reading_the_same_data_is_a_warning_with_the_likely_cause(runs):
    line = lines(runs, "minddp", "same-data", warning=True)
    assert line.startswith("every rank is reading the same data: the local gradients (before averaging) had"), line
    assert "the same fingerprints on every rank in steps 0 to 2" in line and "DistributedSampler" in line
    for r in runs:  # it trains on: the same parameters as without the flag
        assert torch.equal(r["minddp", "same-data"]["params"], r["off", "same-data"]["params"])
        assert r["minddp", "none"]["warnings"] == []  # different data per rank: no warning


@pytest.mark.parametrize(
    "kind, how, rank0, rank1",
    [
        ("coll-shape", "another shape", "all_reduce(float32[2], op=SUM)", "all_reduce(float32[1], op=SUM)"),
        ("coll-dtype", "another dtype", "all_reduce(float32[1], op=SUM)", "all_reduce(int64[1], op=SUM)"),
        ("coll-op", "another op", "all_reduce(float32[1], op=SUM)", "broadcast(float32[1], root=0)"),
        ("coll-missing", "another op", "all_reduce(float32[1], op=SUM)", "all_gather("),
    ],
)
def test_4_mismatched_collectives_name_each_ranks_call_and_source_line(runs, kind, how, rank0, rank1):
    line = lines(runs, "minddp", kind)
    assert line.startswith("mismatched collectives: collective #") and f"differs across ranks ({how})" in line, line
    first = re.search(r"rank 0 (.*?) at tests/debug_bugs\.py:(\d+)", line)
    assert first and first.group(1) == rank0, line  # the script's own call, and its line
    assert f"rank 1 {rank1}" in line, line
    if kind == "coll-missing":  # rank 1 made no such call: its next collective is minddp's step check
        assert "in minddp debug's step check of DistributedDataParallel (step 0)" in line, line
    assert "(a collective made on some ranks only, e.g. under `if rank == 0:`" in line
    assert lines(runs, "simple", "coll-shape").startswith("mismatched collectives:")  # under a teaching stage too


def test_5_uneven_inputs_name_the_rank_that_left_and_the_step(runs):
    for impl in ("minddp", "hook"):
        line = lines(runs, impl, "uneven-barrier")
        assert line.startswith("uneven inputs: rank 1 left the training loop after step 2"), line
        # the barrier comes after the loop: made once step 2 had ended, so said after it
        assert re.search(r"barrier\(\) at tests/debug_bugs\.py:\d+ \(after step 2\)", line), line
        assert "while rank 0 is in a step:" in line and "(step 3)" in line
        assert "a DistributedSampler gives each rank as many samples" in line and "model.join()" in line
    # a rank that left the world altogether: rank 0 names it at once, rank 1 trained its 3 steps
    r0, r1 = (r["minddp", "uneven"] for r in runs)
    assert r1["error"] is None
    assert r0["error"].startswith("DebugError: minddp debug (rank 0): uneven inputs: rank 1 left its training loop"), r0
    # rank 1 said so on its way out: rank 0 names it from that, not from the 60 s timeout running out
    assert "after step 2" in r0["error"] and "(step 3)" in r0["error"], r0["error"]


def test_6_requires_grad_that_differs_is_told_apart_from_a_parameter_unused_on_some_ranks(runs):
    for impl in ("minddp", "bucket-async"):
        line = lines(runs, impl, "frozen-late")  # frozen on rank 0 after wrapping
        # the whole layer, both its tensors, as torch's error lists them (its indices 2 3)
        assert line.startswith(
            "requires_grad differs across ranks: parameters 'head.weight' and 'head.bias' require grad on ranks [1]"
        ), line
        assert "unfreeze 'head.weight' and 'head.bias' on every rank" in line, line
        assert "not on ranks [0] at step 1" in line and "find_unused_parameters=True does not fix this" in line
    for r in runs:  # frozen on rank 0 before wrapping: the model check, with or without the flag
        error = r["minddp", "frozen"]["error"]
        assert "'head.weight'" in error and "(requires_grad mismatch)" in error, error
        assert "the same parameters frozen" in error
    line = lines(runs, "minddp", "unused")
    assert line.startswith(  # both of the branch's tensors, as torch lists them (its indices 4 5)
        "a parameter unused on some ranks: parameters 'extra.weight' and 'extra.bias' got a gradient on ranks [0]"
    ), line
    assert "Fix: pass find_unused_parameters=True" in line


def test_the_flag_under_torchrun_on_an_unchanged_script_names_a_rank_that_ended_early():
    """The user's way: ``MINDDP_DEBUG=1 torchrun ... script.py``; rank 1 runs out of data and ends its script."""
    script = os.path.join(os.path.dirname(__file__), "debug_bugs.py")
    env = dict(os.environ, MINDDP_DEBUG="1", PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = run_torchrun(torchrun_args(script, "uneven", "minddp"), timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the job hung")
    assert done.returncode != 0, done.stdout
    assert "rank 1: done" in done.stdout, done.stdout
    said = [line for line in done.stderr.splitlines() if "minddp debug (rank 0): uneven inputs" in line]
    assert said, done.stderr[-3000:]
    left = r"rank 1 left its training loop and the process group \(destroy_process_group at .*debug_bugs\.py:\d+"
    assert re.search(left + r", after step 2\) while rank 0 is in a step", said[0]), said[0]


def test_a_partner_late_for_a_collective_is_said_once_then_the_collective_runs(runs):
    said, total = runs[0]["late partner"]["said"], runs[0]["late partner"]["total"]
    line = said.strip()
    assert "\n" not in line and line.startswith("minddp debug (rank 0): waiting for a collective: rank 0 has waited"), (
        said
    )
    assert re.search(r"in all_reduce\(float32\[1\], op=SUM\) at tests/test_debug\.py:\d+", line), line
    assert "rank 1 has not reached collective #" in line and "rank 1's last was #" in line, line
    assert total == 2.0 and runs[1]["late partner"]["total"] == 2.0  # then it ran, on both ranks


def test_the_debug_benchmark_times_each_stage_with_and_without_debug_mode(capsys):
    """``python -m minddp.bench.debug``, smallest run: a row per stage with both medians and their ratio."""
    from minddp.bench import debug as bench_debug

    assert bench_debug.main(["--preset", "tiny", "--stage", "ddp", "--rounds", "2", "--steps-per-round", "1"]) == 0
    table = capsys.readouterr().out
    row = re.search(r"^\| ddp \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \(([\d.]+)–([\d.]+)\) \|$", table, re.M)
    assert row, table
    plain, on, ratio = (float(row.group(k)) for k in (1, 2, 3))
    # The ratio is of the two medians shown: they are rounded to 0.05 ms each way, the ratio to 0.0005.
    assert abs(ratio - on / plain) <= ratio * (0.05 / on + 0.05 / plain) + 0.0005, table
    assert "steps timed per configuration: 2" in table


# -- the risks issue 48 found in debug mode by reading, each fixed: one more world -----------------------------

#: The bound on a wait the fixed code never makes (a thread joined, a posted call awaited); not a timing.
BOUND_S = 60
#: (stage, script) built by the stage's class, not by name: the same checks either way.
BY_CLASS = [(stage, "drift") for stage in TEACHING] + [(stage, "none") for stage in (*TEACHING, "zero2", "fsdp")]


def risks() -> dict:
    """One 2-rank world, debug mode on from its start (``minddp.debug.enable()``), each risk as a script meets it."""
    minddp.debug.enable()
    store = process_group_store(dist.group.WORLD)
    if dist.get_rank() == 1:
        store.set("rank 1 is in debug mode", "1")
    else:
        store.wait(["rank 1 is in debug mode"])  # so rank 0's line below is about a rank that is in it
    out = {"slow partner": late_partner("slow")}  # first: rank 1 has made no collective since it turned it on
    out["debug code run by a step after the wrappers went"] = debug_code_after_the_wrappers_went()
    out["two groups, two threads"] = two_groups_two_threads()
    out["a group made after one was destroyed"] = group_after_one_destroyed()
    out["a forward that raised"] = after_a_forward_that_raised()
    out["two wrappers"] = two_wrappers()
    out["recorded"] = recorded_calls()
    out |= {("class:" + stage, kind): outcome(kind, "class:" + stage) for stage, kind in BY_CLASS}
    out |= {("slow link", fragments): slow_link_rungs(fragments) for fragments in ("same", "rank 1: one")}
    minddp.debug.disable()
    out["off", "drift"] = outcome("drift", "class:simple")
    minddp.debug.enable()
    out["failed thread"] = late_partner("failed", late_because=a_thread_fails)  # last: its marker stays
    return out


def debug_code_after_the_wrappers_went() -> set[str]:
    """A watched stage trains a step and is dropped: the files of debug mode an optimizer step runs afterwards."""
    torch.manual_seed(0)
    model = build_stage("simple", debug_bugs.Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = debug_bugs.batches("none", dist.get_rank(), 1)[0]
    nn.functional.mse_loss(model(x), y).backward()
    model.finish_gradient_synchronization()
    optimizer.step()
    del model
    gc.collect()  # the wrapper is gone, and with it every hook its watch registered
    plain = nn.Linear(2, 2)
    plain(torch.ones(1, 2)).sum().backward()
    other = torch.optim.SGD(plain.parameters(), lr=0.1)
    package = os.path.dirname(inspect.getsourcefile(collective_check))
    ran: set[str] = set()
    sys.setprofile(lambda frame, event, arg: ran.add(frame.f_code.co_filename) if event == "call" else None)
    try:
        other.step()
    finally:
        sys.setprofile(None)
    return {os.path.basename(path) for path in ran if path.startswith(package)}


def two_groups_two_threads() -> dict:
    """Two threads, each all_reducing on a group of its own; rank 0 starts on group 0, rank 1 on group 1.

    Each rank starts its second thread once its first has posted its call (and so waits for the other rank's
    post): with one lock for every group held through that wait, each rank's first thread would keep its second
    from posting the call the other rank's first thread waits for.
    """
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    posted = {g.group_name: threading.Event() for g in groups}
    post = collective_check._Channel.post
    results: dict = {}

    def post_and_tell(channel, call) -> None:
        post(channel, call)
        if channel.name in posted:
            posted[channel.name].set()

    def reduce(i: int) -> None:
        total = torch.full((1,), float(i + 1))
        try:
            dist.all_reduce(total, group=groups[i])
            results[i] = total.item()
        except Exception as exc:
            results[i] = f"{type(exc).__name__}: {exc}"

    collective_check._Channel.post = post_and_tell
    try:
        first, second = (0, 1) if dist.get_rank() == 0 else (1, 0)
        threads = [threading.Thread(target=reduce, args=(first,), daemon=True)]
        threads[0].start()
        posted[groups[first].group_name].wait(BOUND_S)
        threads.append(threading.Thread(target=reduce, args=(second,), daemon=True))
        threads[1].start()
        for thread in threads:
            thread.join(BOUND_S)
    finally:
        collective_check._Channel.post = post
    return dict(results)


def group_after_one_destroyed() -> dict:
    """A group made after another was destroyed starts its own count of collectives, on every rank.

    CPython gives a new object the id of a freed one, on one rank and not on another; forced here on rank 0
    by handing the check an ``id`` that gives every object the destroyed group's, as a reused id would.
    """
    old = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=old)  # the old group's collective #0
    reused = id(old)
    dist.destroy_process_group(old)
    if dist.get_rank() == 0:
        collective_check.id = lambda obj: reused  # a module's global shadows the builtin
    total, error = torch.ones(1), []
    try:
        new = dist.new_group([0, 1])

        def reduce() -> None:
            try:
                dist.all_reduce(total, group=new)
            except Exception as exc:
                error.append(f"{type(exc).__name__}: {exc}")

        thread = threading.Thread(target=reduce, daemon=True)
        thread.start()
        thread.join(BOUND_S)
    finally:
        vars(collective_check).pop("id", None)
    return {"total": total.item(), "error": error[0] if error else None, "finished": not thread.is_alive()}


def after_a_forward_that_raised() -> str:
    """A forward that raised and was caught (an out-of-memory retry), then a step in which rank 0 makes a
    collective of its own where rank 1 finishes the step: the line, which says where each call was made."""
    torch.manual_seed(0)
    model = build_stage("ga", debug_bugs.Net())
    x, y = debug_bugs.batches("none", dist.get_rank(), 1)[0]
    try:
        model(torch.ones(6, 3))  # not the model's width: its first layer raises
    except RuntimeError:
        pass
    nn.functional.mse_loss(model(x), y).backward()
    try:
        dist.all_reduce(torch.ones(2)) if dist.get_rank() == 0 else model.finish_gradient_synchronization()
    except minddp.debug.DebugError as exc:
        return str(exc)
    return "nothing said"


def two_wrappers() -> str:
    """Two models: one trained 3 steps, one built after; rank 0 sends the first's gradients, rank 1 the second's."""
    torch.manual_seed(0)
    first = DistributedDataParallel(debug_bugs.Net())
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
    batches = debug_bugs.batches("none", dist.get_rank(), 4)
    for x, y in batches[:3]:
        nn.functional.mse_loss(first(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    second = DistributedDataParallel(nn.Linear(8, 3))  # its step 0 is the first's step 3
    x, _ = batches[3]
    outputs = first(x), second(x)  # the second's forward last, on both ranks
    try:
        outputs[dist.get_rank()].sum().backward()
    except Exception as exc:  # raised in a gradient hook, through autograd
        return str(exc)
    return "nothing said"


def recorded_calls() -> dict:
    """Three collectives on the default group inside ``recorded()``, the third of another shape on each rank, and
    one on a group of its own: the calls recorded, and the number the mismatch finding gives the third."""
    other = dist.new_group([0, 1])
    with collective_check.recorded() as calls:
        dist.all_reduce(torch.ones(1))
        dist.all_reduce(torch.ones(1), group=other)  # another group's: not in the default group's record
        dist.broadcast(torch.ones(3), src=0)
        try:
            dist.all_reduce(torch.ones(2 if dist.get_rank() == 0 else 1))
            said = "nothing said"
        except minddp.debug.DebugError as exc:
            said = str(exc)
    dist.all_reduce(torch.ones(1))  # after the block: not recorded
    dist.destroy_process_group(other)
    return {"calls": [(call.seq, call.op) for call in calls], "said": said}


def slow_link_rungs(fragments: str) -> dict:
    """LocalSGD then streaming DiLoCo (H = 4, two fragments, τ = 1; rank 1 one fragment if ``fragments`` says so), each
    rank on its own batches: what debug mode says (their replicas differ between syncs by design)."""
    from minddp import DiLoCo, LocalSGD

    rank, said, error = dist.get_rank(), [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for rung in (LocalSGD, DiLoCo):
                torch.manual_seed(0)
                model = debug_bugs.Net()
                inner = torch.optim.SGD(model.parameters(), lr=0.1)
                count = 1 if fragments == "rank 1: one" and rank == 1 else 2
                options = dict(fragments=count, fragment_sync_delay=1) if rung is DiLoCo else {}
                with rung(model, inner, sync_every=4, **options):
                    for x, y in debug_bugs.batches("none", rank, 4):
                        nn.functional.mse_loss(model(x), y).backward()
                        inner.step()
                        inner.zero_grad()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    said = [str(w.message) for w in caught if str(w.message).startswith("minddp debug")]
    return {"error": error, "warnings": said}


def a_thread_fails() -> None:
    def load() -> None:
        raise ValueError("the loader broke")

    thread = threading.Thread(target=load, name="loader")
    thread.start()
    thread.join()


@pytest.fixture(scope="module")
def risky() -> list[dict]:
    return launch(risks, world_size=2, timeout_s=BOUND_S)


def test_a_rank_in_debug_mode_that_is_late_is_said_late_not_off(risky):
    line = risky[0]["slow partner"]["said"].strip()
    assert line.startswith("minddp debug (rank 0): waiting for a collective:") and "rank 1 has not reached" in line
    assert "not in debug mode" not in line, line  # it turned debug mode on before rank 0 started waiting
    assert risky[0]["slow partner"]["total"] == risky[1]["slow partner"]["total"] == 2.0


def test_an_error_on_a_rank_s_worker_thread_is_named_to_the_partners_waiting_for_it(risky):
    line = risky[0]["failed thread"]["said"].strip()
    assert "rank 1 had an uncaught ValueError in thread 'loader': the loader broke" in line, line
    assert risky[0]["failed thread"]["total"] == risky[1]["failed thread"]["total"] == 2.0


def test_two_threads_on_two_groups_in_another_order_on_each_rank_both_finish(risky):
    for r in risky:
        assert r["two groups, two threads"] == {0: 2.0, 1: 4.0}, r["two groups, two threads"]


def test_a_group_made_after_a_destroyed_one_counts_its_collectives_from_zero(risky):
    for r in risky:
        assert r["a group made after one was destroyed"] == {"total": 2.0, "error": None, "finished": True}, r


def test_recorded_holds_the_block_s_calls_of_its_group_numbered_as_a_finding_numbers_them(risky):
    for r in risky:
        seqs, ops = zip(*r["recorded"]["calls"])
        assert ops == ("all_reduce", "broadcast", "all_reduce"), r["recorded"]
        assert list(seqs) == list(range(seqs[0], seqs[0] + 3)), r["recorded"]  # consecutive: none of the group missed
        assert f"collective #{seqs[-1]} differs across ranks (another shape)" in r["recorded"]["said"], r["recorded"]


def test_a_forward_that_raised_leaves_the_next_calls_said_where_they_are_made(risky):
    line = risky[1]["a forward that raised"]
    assert line.startswith("minddp debug (rank 1): mismatched collectives:"), line
    assert re.search(r"rank 1 all_gather\(.*\) at .* in minddp's check \(minddp/stages/checks\.py:\d+\)", line), line
    assert "GradAccumDDP's forward" not in line, line  # the forward that raised is over


def test_each_wrapper_counts_its_own_steps(risky):
    line = risky[0]["two wrappers"]
    assert "mismatched collectives" in line, line
    # rank 0 sends the first model's bucket in its step 3; rank 1 starts the second's first backward, in its step 0
    bucket = r"in DDP's bucket 0 of 1 \(head.bias, .*?\)"
    assert re.search(r"rank 0 all_reduce\(float32\[\d+\], op=SUM\) at \S+ " + bucket + r" \(step 3\); rank 1 ", line), (
        line
    )
    assert re.search(r"; rank 1 \w+\(.*?\) at \S+ in DDP's bucket 0 of 1 \(weight, bias\) \(step 0\)\. Fix", line), line


def test_an_optimizer_step_after_the_watched_wrappers_are_gone_runs_nothing_of_debug_mode(risky):
    for r in risky:
        assert r["debug code run by a step after the wrappers went"] == set()


def test_a_stage_built_by_its_class_is_watched_as_one_built_by_name(risky):
    for stage in TEACHING:
        line = lines(risky, "class:" + stage, "drift")
        assert line.startswith("replicas drifted apart: parameter 'head.weight' differs across ranks at step 2"), line
    for r in risky:
        for stage in (*TEACHING, "zero2", "fsdp"):  # the sharded ones: their collectives checked, nothing to say
            assert r["class:" + stage, "none"]["error"] is None, (stage, r["class:" + stage, "none"])
            assert r["class:" + stage, "none"]["warnings"] == [], (stage, r["class:" + stage, "none"])
        assert r["off", "drift"]["error"] is None  # minddp.debug.disable(): nothing is checked


def test_the_slow_link_rungs_are_checked_by_their_collectives_not_by_their_replicas(risky):
    for r in risky:  # each replica trains alone between syncs: no drift said, no warning
        assert r["slow link", "same"] == {"error": None, "warnings": []}, r["slow link", "same"]
    # rank 1 streams one fragment where rank 0 streams two: their first pseudo-gradients differ in size
    for rank, r in enumerate(risky):
        line = r["slow link", "rank 1: one"]["error"]
        assert line.startswith(f"DebugError: minddp debug (rank {rank}): mismatched collectives:"), line


def test_the_fingerprint_is_the_words_weighted_by_place_and_sees_swapped_elements_and_rows():
    torch.manual_seed(0)
    matrix = torch.randn(6, 5)
    for tensor in (matrix, matrix.to(torch.bfloat16), torch.arange(-7, 9, dtype=torch.int8), torch.randn(3 * RUN + 7)):
        words = tensor.view(torch.int8 if tensor.element_size() == 1 else torch.int16).reshape(-1).tolist()
        # the definition, in Python's integers: word i weighted by RUN_ROOT**(i % RUN) and by ROOT**(i // RUN)
        expected = sum(w * pow(RUN_ROOT, i % RUN, RUN_PRIME) * pow(ROOT, i // RUN, P) for i, w in enumerate(words)) % P
        assert int(fingerprints([tensor], torch.device("cpu"))[0]) == expected, tensor.dtype
    swapped_rows, swapped_pair = matrix[[1, 0, 2, 3, 4, 5]], matrix.clone().view(-1)
    swapped_pair[[3, 17]] = swapped_pair[[17, 3]]
    prints = fingerprints([matrix, swapped_rows, swapped_pair.view(6, 5), matrix.clone()], torch.device("cpu"))
    assert len(set(prints[:3].tolist())) == 3 and prints[0] == prints[3], prints


def test_the_fingerprint_guarantee_is_per_16_bit_word_and_a_float32_is_two_words():
    # docs/debugging.md, *What it does not see*: one word changed always shows, two different words swapped within
    # a run always show; a float32 is two words, and a change to both can leave the sum as it was.
    weights = [pow(RUN_ROOT, k, RUN_PRIME) for k in range(RUN)]
    assert 0 not in weights and len(set(weights)) == RUN  # the two facts each "always" rests on
    torch.manual_seed(0)
    words = torch.randint(-(2**15), 2**15, (2 * RUN + 9,), dtype=torch.int16)
    base = int(fingerprints([words], torch.device("cpu"))[0])
    for i in (0, 1, RUN - 1, RUN, RUN + 1, 2 * RUN + 8):
        for value in (-(2**15), -1, 0, 1, 2**15 - 1):  # the extremes of a word, and its neighbours of 0
            changed = words.clone()
            changed[i] = value
            if value != int(words[i]):
                assert int(fingerprints([changed], torch.device("cpu"))[0]) != base, (i, value)
    for i, j in ((0, 1), (0, RUN - 1), (RUN, 2 * RUN - 1), (RUN + 3, RUN + 4)):
        swapped = words.clone()
        swapped[[i, j]] = swapped[[j, i]]
        assert int(words[i]) != int(words[j])
        assert int(fingerprints([swapped], torch.device("cpu"))[0]) != base, (i, j)
    # Not per value: 1.0 is the words (0, 16256), weights 1 and 17; +17 on the first and -1 on the second cancel.
    one = torch.tensor([1.0])
    other = torch.tensor([17, 16255], dtype=torch.int16).view(torch.float32)
    assert other.item() != one.item() and abs(other.item() - 0.99609476) < 1e-7, other.item()
    assert torch.equal(fingerprints([one], torch.device("cpu")), fingerprints([other], torch.device("cpu")))
