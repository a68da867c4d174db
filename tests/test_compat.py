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

Every other private torch name minddp reads has its shim tested here too, one test each, against torch's own
behaviour (what a backward calls, what a profiler records, the op names a dispatch mode sees, the globals a
pickle names, the per-tensor op), and once with the name taken away: the shim's fallback gives the same result,
or its one line names what is missing and what to do. A scan fails on a private name anywhere in the package
outside ``runtime/compat.py`` (checked on the lines the package held before).
"""

from __future__ import annotations

import datetime
import importlib
import os
import re
import subprocess
import sys
import threading
import types
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
    with pytest.raises(
        RuntimeError, match=r"has no distributed_c10d._get_process_group_store .* turn MINDDP_DEBUG off"
    ):
        compat.process_group_store(None)


# -- every private torch name behind compat ------------------------------------------------------------------------

#: A private torch name: a ``_name`` reached through torch (``torch._C``, ``torch.utils._python_dispatch``,
#: ``Variable._execution_engine``), torch.distributed's (``dist._``, ``c10d._``), a module's private dicts read from
#: outside it, a private global named by its module and name, and the private names minddp has used by themselves.
PRIVATE = re.compile(
    r"\btorch(?:\.\w+)*\._(?!_)\w"
    r"|\b(?:dist|c10d|distributed_c10d|distributed)\._(?!_)\w"
    r"|\b(?:_orig_mod|_active_ddp_module|_get_active_ddp_module|_join_config|OptimizedModule|_RecordFunctionFast"
    r"|_DEFAULT_FIRST_BUCKET_BYTES|hooks_dict_ref|_execution_engine|_disable_dynamo|_is_profiler_enabled"
    r"|_foreach_\w+|_python_dispatch|_dynamo|_get_process_group_store|_get_sequence_number_for_group|_use_count)\b"
    r"|(?<!self)\._(?:parameters|buffers|modules|forward_hooks|forward_pre_hooks|backward_hooks"
    r"|backward_pre_hooks|post_accumulate_grad_hooks)\b"
    r"|\(\s*[\"']torch[\w.]*[\"']\s*,\s*[\"']_\w+[\"']"
)


def private_names(root: Path) -> list[str]:
    """``file:line: name`` for each private torch name in the package under ``root``, compat.py left out."""
    package = root / "minddp"
    return [
        f"{path.relative_to(root)}:{i}: {found.group(0)}"
        for path in sorted(package.rglob("*.py"))
        if path != package / "runtime" / "compat.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        for found in PRIVATE.finditer(line)
    ]


def test_no_private_torch_name_outside_compat():
    """Code, comments and docstrings alike: a private name anywhere else is one compat has no guard for."""
    assert private_names(ROOT) == []


@pytest.mark.parametrize(
    "line",
    [
        "torch._foreach_copy_(a, b)",
        "isinstance(f, torch._C.Future)",
        "from torch.utils._python_dispatch import TorchDispatchMode",
        "torch.autograd.Variable._execution_engine.queue_callback(fn)",
        "dist._DEFAULT_FIRST_BUCKET_BYTES",
        "c10d._get_process_group_store(group)",
        "hasattr(module, '_orig_mod')",
        "owner._parameters[name] = p",
        '("torch.serialization", "_get_layout")',
        "if self._join_config.enable:",
        "tensor._use_count()",
    ],
)
def test_the_scan_finds_each_kind_of_private_name(line, tmp_path):
    """The scan's oracle: the lines minddp held before compat took them (and torch.__version__ is public)."""
    (tmp_path / "minddp").mkdir()
    (tmp_path / "minddp" / "m.py").write_text(f"{line}\nprint(torch.__version__, self._parameters)\n")
    assert len(private_names(tmp_path)) == 1


# one test per shim: what it gives against torch's own behaviour, and what it says where torch lacks the name


def test_use_count_counts_the_cpp_references_to_a_tensor_and_is_none_without_torchs_name():
    """The oracle: a view holds its base (one C++ reference), a Python list of it holds none."""
    t = torch.ones(2)
    alone = compat.use_count(t)
    listed, view = [t, t], t.view(2)
    assert compat.use_count(t) == alone + 1
    del view
    assert compat.use_count(t) == alone == 1 and len(listed) == 2
    with pytest.warns(RuntimeWarning, match=r"has no Tensor._use_count, which minddp reads to keep"):
        assert compat.use_count(types.SimpleNamespace()) is None  # no _use_count: keep then keeps nothing


def test_is_compiled_and_uncompiled_tell_torch_compile_s_module():
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model, backend="eager")  # Dynamo's module, without Inductor's minutes of compiling
    assert compat.is_compiled(compiled) and compat.uncompiled(compiled) is model
    assert not compat.is_compiled(model) and compat.uncompiled(model) is model
    assert compiled(torch.ones(1, 2)).shape == (1, 2)  # torch's own object: it runs


def test_is_compiled_does_not_import_dynamo():
    """Nothing compiled yet, nothing imported for the answer (Dynamo takes seconds to import)."""
    code = (
        "import sys, torch; from minddp.runtime import compat; "
        "print(compat.is_compiled(torch.nn.Linear(2, 2)), 'torch._dynamo' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False"], proc.stderr[-2000:]


def test_is_compiled_without_torchs_class_names_the_way_out(monkeypatch):
    from torch._dynamo import eval_frame

    monkeypatch.delattr(eval_frame, "OptimizedModule")
    with pytest.raises(
        RuntimeError, match=r"^torch \S+ has no torch._dynamo.eval_frame.OptimizedModule, .*torch.compile"
    ):
        compat.is_compiled(torch.nn.Linear(2, 2))


def read_caps():
    active = torch.nn.parallel.DistributedDataParallel._active_ddp_module
    return getattr(active, "bucket_bytes_cap", active), dist._DEFAULT_FIRST_BUCKET_BYTES


def test_ddp_optimizer_caps_only_around_a_compiled_module_and_restored():
    """The oracle: the two names Dynamo's DDPOptimizer reads, read directly (test_compile.py checks the cut)."""
    before = read_caps()
    model = torch.nn.Linear(2, 2)
    importlib.import_module("torch._dynamo")  # imported: a compiled call could be running

    with compat.ddp_optimizer_caps(model, 5, 3):  # an eager module: torch untouched where the callback is read
        assert read_caps() == (before if compat.READS_FRAME_CALLBACK else (5, 3))
    with compat.ddp_optimizer_caps(torch.compile(model), 5, 3):
        assert read_caps() == (5, 3)
        with pytest.raises(KeyError):
            with compat.ddp_optimizer_caps(torch.compile(model), 7, 7):
                raise KeyError  # restored on the way out of an error too
        assert read_caps() == (5, 3)
    assert read_caps() == before


def test_ddp_optimizer_caps_without_torchs_names_warns_and_cuts_nothing(monkeypatch):
    monkeypatch.delattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES")
    with pytest.warns(RuntimeWarning, match=r"has no .*_DEFAULT_FIRST_BUCKET_BYTES, .*the graph stays whole"):
        with compat.ddp_optimizer_caps(torch.compile(torch.nn.Linear(2, 2)), 5, 3):
            assert torch.nn.parallel.DistributedDataParallel._active_ddp_module is None


def test_ddp_optimizer_caps_without_the_frame_callback_takes_every_call_for_a_compiled_one(monkeypatch):
    import torch._dynamo  # noqa: F401  (a compiled call could be running)

    monkeypatch.setattr(compat, "_FRAME_CALLBACK", None)
    monkeypatch.setattr(compat, "READS_FRAME_CALLBACK", False)
    with pytest.warns(RuntimeWarning, match=r"has no torch._C._dynamo.eval_frame.get_eval_frame_callback, "):
        with compat.ddp_optimizer_caps(torch.nn.Linear(2, 2), 5, 3):
            assert read_caps() == (5, 3)


def test_default_first_bucket_bytes_is_torchs_own_and_1_mib_without_it(monkeypatch):
    assert compat.default_first_bucket_bytes() == dist._DEFAULT_FIRST_BUCKET_BYTES == 1024 * 1024
    monkeypatch.delattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES")
    with pytest.warns(RuntimeWarning, match=r"has no torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, .*1 MiB is used"):
        assert compat.default_first_bucket_bytes() == 1024 * 1024


def test_at_backward_end_runs_once_after_every_gradient_is_in():
    """Queued from a gradient hook: run once, when the backward returns, every leaf's .grad already written."""
    a, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    seen = []
    a.register_hook(lambda g: compat.at_backward_end(lambda: seen.append((a.grad, b.grad))) or g)
    (a * 2 + b * 3).sum().backward()
    assert (
        len(seen) == 1
        and torch.equal(seen[0][0], torch.full((3,), 2.0))
        and torch.equal(seen[0][1], torch.full((3,), 3.0))
    )


def test_at_backward_end_without_torchs_engine_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.autograd, "Variable", type("Variable", (), {}))
    with pytest.raises(RuntimeError, match=r"has no Variable._execution_engine.queue_callback, .*use a torch from 2.6"):
        compat.at_backward_end(lambda: None)


def test_hook_slots_take_a_hook_out_and_put_it_back_after_the_others():
    """The oracle: which of torch's post-accumulate hooks a backward calls, in the order it calls them."""
    p = torch.nn.Parameter(torch.ones(2))
    calls = []
    ours = [p.register_post_accumulate_grad_hook(lambda t: calls.append("ours"))]
    p.register_post_accumulate_grad_hook(lambda t: calls.append("theirs"))
    slots = compat.hook_slots(ours)
    assert len(slots) == 1
    p.sum().backward()
    compat.put_hooks(slots, None)
    p.sum().backward()
    compat.put_hooks(slots, lambda t: calls.append("ours again"))
    p.sum().backward()
    assert calls == ["ours", "theirs", "theirs", "theirs", "ours again"]


def test_hook_slots_without_torchs_dict_leave_the_hooks_in():
    class Handle:  # a handle with no hooks_dict_ref
        id = 0

    assert compat.hook_slots([Handle()]) == []


def test_future_type_is_every_future_torch_hands_out(monkeypatch):
    assert isinstance(torch.futures.Future(), compat.future_type())
    assert issubclass(torch.futures.Future, compat.future_type())
    monkeypatch.delattr(torch._C, "Future")
    with pytest.raises(RuntimeError, match=r"has no torch._C.Future, which minddp checks a comm hook's Future"):
        compat.future_type()


def test_profiler_on_and_fast_range_as_torchs_profiler_sees_them(monkeypatch):
    assert compat.profiler_on() is False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert compat.profiler_on() is True
        with compat.fast_range("minddp.fast#1"):
            torch.ones(2).add(1)
    assert [e.name for e in compat.profiler_events(prof)].count("minddp.fast#1") == 1
    monkeypatch.delattr(torch.autograd.profiler, "_is_profiler_enabled")
    assert compat.profiler_on() is True  # without the flag: ranges always opened
    monkeypatch.delattr(torch._C._profiler, "_RecordFunctionFast")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with compat.fast_range("minddp.fast#2"):  # torch.profiler.record_function's range, the same name
            torch.ones(2).add(1)
    assert [e.name for e in compat.profiler_events(prof)].count("minddp.fast#2") == 1


@pytest.mark.parametrize("fused", ["torch's", "without it"])
def test_foreach_ops_equal_one_op_per_tensor(fused, monkeypatch):
    """Bit for bit against the plain per-tensor op (the same rounding: one division or multiply per element)."""
    if fused == "without it":
        for name in ("_foreach_copy_", "_foreach_div_", "_foreach_mul_"):
            monkeypatch.delattr(torch, name)
    g = torch.Generator().manual_seed(0)
    src = [torch.randn(n, generator=g) for n in (3, 1, 7)]
    dst = [torch.empty(n) for n in (3, 1, 7)]
    compat.foreach_copy_(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src))
    divided, multiplied = [t.clone() for t in src], [t.clone() for t in src]
    compat.foreach_div_(divided, 3)
    compat.foreach_mul_(multiplied, 1 / 3)
    assert all(torch.equal(d, s / 3) for d, s in zip(divided, src))
    assert all(torch.equal(m, s * (1 / 3)) for m, s in zip(multiplied, src))


def test_parameter_dict_swaps_what_a_module_computes_with(monkeypatch):
    layer = torch.nn.Linear(2, 1, bias=False)
    held = compat.parameter_dict(layer)
    assert [(n, id(p)) for n, p in held.items() if p is not None] == [
        (n, id(p)) for n, p in layer.named_parameters(recurse=False)
    ]
    held["weight"] = torch.full((1, 2), 2.0)  # a plain tensor, as the sharded stages put in
    assert torch.equal(layer(torch.ones(1, 2)), torch.full((1, 1), 4.0))
    with pytest.raises(RuntimeError, match=r"has no Module._parameters, .*use ddp or torch's FSDP instead"):
        compat.parameter_dict(object())


def default_group_counts() -> dict:
    before = compat.default_group_sequence()
    for _ in range(3):
        dist.all_reduce(torch.ones(1))
    dist.broadcast(torch.ones(1), src=0)
    return {"launched": compat.default_group_sequence() - before}


def test_default_group_sequence_counts_each_collective_launched(monkeypatch):
    assert compat.default_group_sequence() is None  # no group in this process
    for got in launch(default_group_counts, world_size=2, timeout_s=60):
        assert got == {"launched": 4}
    from torch.distributed import distributed_c10d

    monkeypatch.delattr(distributed_c10d, "_get_default_group")
    assert compat.default_group_sequence() is None


def dispatched_collectives() -> dict:
    """Each collective minddp's checker watches, run under torch's dispatch mode: the op names torch gives them."""
    seen = []

    class Ops(compat.dispatch_mode_base()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func) in compat.DISPATCHED_COLLECTIVES:
                kind, argument = compat.DISPATCHED_COLLECTIVES[str(func)]
                sent = args[argument]
                sent = sent[0] if isinstance(sent, list) else sent
                seen.append((kind, sum(t.numel() for t in (sent if isinstance(sent, list) else [sent]))))
            elif str(func).startswith("c10d."):
                seen.append((str(func), None))
            return func(*args, **(kwargs or {}))

    n = dist.get_world_size()
    with Ops():
        dist.all_reduce(torch.ones(5))
        dist.broadcast(torch.ones(5), src=0)
        dist.reduce(torch.ones(5), dst=0)
        dist.all_gather([torch.empty(5) for _ in range(n)], torch.ones(5))
        compat.all_gather_single(torch.empty(5 * n), torch.ones(5))
        compat.reduce_scatter_single(torch.empty(5), torch.ones(5 * n))
    return {"seen": seen}


def test_the_dispatched_collectives_are_torchs_op_names():
    """Each collective is seen once, by the kind and the size of what this rank sends (5 values; 5 x 2 for the
    flat reduce-scatter), and no collective op of torch's goes unnamed."""
    for got in launch(dispatched_collectives, world_size=2, timeout_s=60):
        assert got["seen"] == [
            ("all_reduce", 5),
            ("broadcast", 5),
            ("reduce", 5),
            ("all_gather", 5),
            ("all_gather", 5),
            ("reduce_scatter", 10),
        ]


def test_dispatch_mode_base_without_torchs_module_names_the_way_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils._python_dispatch", None)  # an import of it fails
    with pytest.raises(RuntimeError, match=r"has no torch.utils._python_dispatch.TorchDispatchMode, .*another torch"):
        compat.dispatch_mode_base()


def test_the_pickled_layout_is_the_global_torch_pickles_a_layout_as():
    """The oracle: the globals a pickle of torch's layouts names (DCP's ``.metadata`` holds one per tensor)."""
    import io
    import pickle

    named = []

    class Names(pickle.Unpickler):
        def find_class(self, module, name):
            named.append((module, name))
            return super().find_class(module, name)

    for layout in (torch.strided, torch.sparse_coo):
        assert Names(io.BytesIO(pickle.dumps(layout))).load() is layout
    assert named == [compat.PICKLED_LAYOUT] * 2
