"""minddp.runtime.compat under both spellings of torch's flat collectives, against the old names called directly.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single``. On 2 gloo ranks the shim
runs once on the installed torch and once on a torch whose ``torch.distributed``
has had the new names taken away (torch 2.6 to 2.12 as minddp sees it). Each
time: the shim's results equal the old names' called directly on the same
inputs (bit for bit: integer-valued inputs make every sum exact), the name it
called is the one that torch has (the new one where there is one), ``op``,
``group`` and ``async_op`` reach torch, and on the installed torch it raises
no deprecation warning (2.13 warns on every call of an old name). Also
``compat.allreduce_options``: ``AllreduceOptions.asyncOp`` set where torch has
the field (2.6 has not); ``compat.clone_store``: a second connection to the
rendezvous store (``Store.clone`` is not in 2.6); the private names debug mode
reads, each through its guarded function: ``compat.process_group_store`` (the
store a group met on: what one rank sets there, the other reads) and
``compat.join_enabled`` (what ``Join`` set on a joinable).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from minddp import DistributedDataParallel, launch
from minddp.runtime import compat

ROOT = Path(__file__).resolve().parents[1]
NEW = ("all_gather_single", "reduce_scatter_single")
OLD = ("all_gather_into_tensor", "reduce_scatter_tensor")


def _spy(called: list[str]) -> dict:
    """Wrap torch's four names (those it has) so each call records its name; torch's own functions, by name."""
    real = {name: getattr(dist, name) for name in NEW + OLD if hasattr(dist, name)}
    for name, fn in real.items():

        def spy(*args, _fn=fn, _name=name, **kwargs):
            called.append(_name)
            return _fn(*args, **kwargs)

        setattr(dist, name, spy)
    return real


def shim_against_old_names(hide_new: bool) -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    if hide_new:  # torch 2.6 to 2.12, as far as minddp can tell
        for name in NEW:
            if hasattr(dist, name):
                delattr(dist, name)
    has_new = all(hasattr(dist, name) for name in NEW)
    # Each rank alone in a group of its own: were `group` not passed on, WORLD's ranks would not fit the sizes.
    alone = [dist.new_group([r]) for r in range(n)][rank]
    called: list[str] = []  # the names the shim called, in order
    real = _spy(called)

    def old(name, *args, **kwargs):
        """The oracle: torch's old name called directly (its 2.13 FutureWarning silenced here only)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return real[name](*args, **kwargs)

    bad: list[str] = []
    g = torch.Generator().manual_seed(rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dtype in (torch.float32, torch.int64):
            mine = torch.randint(-8, 9, (5,), generator=g).to(dtype)
            whole = torch.randint(-8, 9, (5 * n,), generator=g).to(dtype)
            # all_gather, synchronous on the default group, then asynchronous on WORLD named
            ref = torch.empty(5 * n, dtype=dtype)
            old("all_gather_into_tensor", ref, mine)
            ours = torch.empty(5 * n, dtype=dtype)
            compat.all_gather_single(ours, mine)
            bad += [] if torch.equal(ours, ref) else [f"all_gather {dtype}: {ours.tolist()} vs {ref.tolist()}"]
            ours = torch.empty(5 * n, dtype=dtype)
            compat.all_gather_single(ours, mine, group=dist.group.WORLD, async_op=True).wait()
            bad += [] if torch.equal(ours, ref) else [f"all_gather async {dtype}: {ours.tolist()}"]
            # reduce_scatter: SUM (the default), MAX passed as op, SUM asynchronous
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                ref = torch.empty(5, dtype=dtype)
                old("reduce_scatter_tensor", ref, whole, op=op)
                ours = torch.empty(5, dtype=dtype)
                if op == dist.ReduceOp.SUM:
                    compat.reduce_scatter_single(ours, whole)
                else:
                    compat.reduce_scatter_single(ours, whole, op=op)
                if not torch.equal(ours, ref):
                    bad.append(f"reduce_scatter {op} {dtype}: {ours.tolist()} vs {ref.tolist()}")
            summed = torch.empty(5, dtype=dtype)
            old("reduce_scatter_tensor", summed, whole)
            ours = torch.empty(5, dtype=dtype)
            compat.reduce_scatter_single(ours, whole, group=dist.group.WORLD, async_op=True).wait()
            bad += [] if torch.equal(ours, summed) else [f"reduce_scatter async {dtype}: {ours.tolist()}"]
            # group passed on: alone in its group, a rank gathers and scatters its own data
            for shim in (compat.all_gather_single, compat.reduce_scatter_single):
                ours = torch.empty(5, dtype=dtype)
                shim(ours, mine, group=alone)
                if not torch.equal(ours, mine):
                    bad.append(f"{shim.__name__} in a group of one {dtype}: {ours.tolist()} vs {mine.tolist()}")
        # allreduce_options: the production DDP's bucket sum, through the group, equals dist.all_reduce
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            ours, ref = torch.randint(-8, 9, (7,), generator=g).float().repeat(2, 1)
            dist.group.WORLD.allreduce([ours], compat.allreduce_options(op)).get_future().wait()
            dist.all_reduce(ref, op=op)
            if not torch.equal(ours, ref):
                bad.append(f"allreduce_options {op}: {ours.tolist()} vs {ref.tolist()}")
    deprecations = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if issubclass(w.category, (DeprecationWarning, FutureWarning))
    ]
    return {"bad": bad, "called": called, "deprecations": deprecations, "has_new": has_new}


#: What the shim calls per dtype, in order (see shim_against_old_names): 2 all_gathers, 3 reduce_scatters,
#: then one of each in a group of one.
def expected_calls(new: bool) -> list[str]:
    gather, scatter = NEW if new else OLD
    return 2 * ([gather] * 2 + [scatter] * 3 + [gather, scatter])


@pytest.mark.parametrize("spelling", ["installed torch", "torch without the 2.13 names"])
def test_shim_matches_the_old_names_on_2_ranks(spelling):
    hide = spelling != "installed torch"
    results = launch(shim_against_old_names, hide, world_size=2, backend="gloo", timeout_s=60)
    installed_has_new = all(hasattr(dist, name) for name in NEW)
    for rank, got in enumerate(results):
        assert got["bad"] == [], f"rank {rank}: {got['bad']}"
        assert got["has_new"] == (installed_has_new and not hide)
        assert got["called"] == expected_calls(got["has_new"]), f"rank {rank}"
        if not hide:  # a real release: the shim never calls a name it deprecates
            assert got["deprecations"] == [], f"rank {rank}: {got['deprecations']}"


def test_allreduce_options_asynchronous_where_torch_has_the_field(monkeypatch):
    """torch 2.13 and 2.15 have AllreduceOptions.asyncOp (set True), 2.6 does not (left out, no error)."""
    opts = compat.allreduce_options(dist.ReduceOp.MAX)
    assert opts.reduceOp == dist.ReduceOp.MAX
    assert getattr(opts, "asyncOp", True) is True

    class WithoutAsyncOp:  # 2.6's AllreduceOptions, as far as minddp uses it
        __slots__ = ("reduceOp", "timeout")

    monkeypatch.setattr(dist, "AllreduceOptions", WithoutAsyncOp)
    opts = compat.allreduce_options()
    assert opts.reduceOp == dist.ReduceOp.SUM and not hasattr(opts, "asyncOp")


@pytest.mark.parametrize("how", ["clone_store", "tcp_client"])
def test_a_second_store_connection_reaches_the_same_server(how):
    """clone_store (torch's Store.clone where there is one) and tcp_client (its stand-in on 2.6): a new
    connection whose keys the first one sees, usable from another thread while the first is in use."""
    server = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20)
    )
    second = getattr(compat, how)(server)
    assert second is not server
    done = []
    thread = threading.Thread(target=lambda: (second.set("beat", "7"), done.append(second.get("main"))))
    thread.start()
    server.set("main", "1")
    thread.join(timeout=20)
    assert done == [b"1"] and server.get("beat") == b"7"


META_BUILD = """
import torch
from minddp.runtime.compat import meta_device
with meta_device():
    from transformers import LlamaConfig, LlamaForSequenceClassification
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=2, pad_token_id=0)
    model = LlamaForSequenceClassification(config)
print(sorted({str(p.device) for p in model.parameters()}))
"""


def test_a_transformers_model_builds_on_the_meta_device():
    """In a fresh interpreter (torch._dynamo not yet imported), as minddp.train's model_shapes does: on torch 2.6
    a bare torch.device("meta") makes transformers' first import of torch._dynamo fail."""
    proc = subprocess.run(
        [sys.executable, "-c", META_BUILD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['meta']"


def test_profiler_events_are_torchs_events_with_their_input_dtypes():
    """compat.profiler_events: the events torch's ``prof.events()`` gives (its FunctionEvents, the oracle: same
    names, times, threads, ids, input shapes), read without building torch's event tree, and with the dtypes of
    each op's inputs on every release (2.6 has no FunctionEvent.input_dtypes), which minddp's byte counts need to
    see fp16 compression. A range of the user's, ops, and the autograd engine's nodes."""
    x = torch.ones(8, 8, dtype=torch.float16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.profiler.record_function("minddp.link_send#3"):
            y = x.add(torch.ones(8, 8, dtype=torch.float16))
        y.float().sum().backward()
    ours = compat.profiler_events(prof)
    assert ours is compat.profiler_events(prof)  # read once per profiler

    def fields(e):
        return (e.name, e.time_range.start, e.time_range.end, e.thread, e.id, [list(s) for s in e.input_shapes])

    theirs = [fields(e) for e in prof.events()]
    assert theirs and sorted(theirs) == sorted(fields(e) for e in ours if fields(e) in theirs)  # each of torch's
    for extra in [e for e in ours if fields(e) not in theirs]:  # ... and only what torch folds into its parent
        assert any(
            o is not extra
            and (o.name, o.thread) == (extra.name, extra.thread)
            and o.time_range.start <= extra.time_range.start <= extra.time_range.end <= o.time_range.end
            for o in ours
        ), fields(extra)  # an op dispatched again inside itself (aten::sum here): one event to torch, two here
    assert any(e.name.startswith("autograd::engine::evaluate_function") for e in ours)
    add = [e for e in ours if e.name == "aten::add"]
    assert len(add) == 1 and add[0].input_dtypes[:2] == ["c10::Half", "c10::Half"]


def test_nothing_but_the_shim_calls_torch_2_13_names():
    """Every call of the 2.13 names in minddp, its tests and notebooks goes through minddp.runtime.compat."""
    direct = re.compile(r"\b(dist|distributed)\.(all_gather_single|reduce_scatter_single)\s*\(")
    allowed = {ROOT / "minddp" / "compat.py"}
    files = [
        *(ROOT / "minddp").rglob("*.py"),
        *(ROOT / "tests").glob("*.py"),
        *(ROOT / "notebooks").glob("*.py"),
        *(ROOT / "notebooks").glob("*.ipynb"),
    ]
    found = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in files
        if path not in allowed
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if direct.search(line)
    ]
    assert len(files) > 50 and found == [], found


def private_names_through_compat() -> dict:
    store = compat.process_group_store(dist.group.WORLD)
    if dist.get_rank() == 0:
        store.set("compat/said", "by rank 0")
    said = store.get("compat/said").decode()  # waits for rank 0's key: the one store both ranks met on
    ddp = DistributedDataParallel(torch.nn.Linear(2, 2))
    states = {"built": compat.join_enabled(ddp)}
    ddp.join()  # a Join made (not entered: no collective) sets the joinable's config
    states["in an enabled Join"] = compat.join_enabled(ddp)
    ddp.join(enable=False)
    states["in a disabled Join"] = compat.join_enabled(ddp)
    states["not a joinable"] = compat.join_enabled(torch.nn.Linear(2, 2))
    return {"said": said, "states": states}


def test_the_private_names_debug_mode_reads_come_through_compat():
    for got in launch(private_names_through_compat, world_size=2, timeout_s=60):
        assert got["said"] == "by rank 0"
        assert got["states"] == {
            "built": False,
            "in an enabled Join": True,
            "in a disabled Join": False,
            "not a joinable": False,
        }


def test_a_torch_without_the_process_group_store_is_one_line_naming_the_way_out(monkeypatch):
    from torch.distributed import distributed_c10d

    monkeypatch.delattr(distributed_c10d, "_get_process_group_store")
    with pytest.raises(RuntimeError, match=r"no longer exposes a process group's store .* turn MINDDP_DEBUG off"):
        compat.process_group_store(None)
