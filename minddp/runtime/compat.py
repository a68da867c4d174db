"""Torch's release differences and its private names, for the releases minddp supports (torch 2.6 to 2.15).

Every release-dependent call in minddp goes through here, one function each, and so does every private torch
name minddp reads (``tests/test_compat.py`` fails on one used anywhere else in the package):

* :func:`all_gather_single`, :func:`reduce_scatter_single`: torch 2.13 renamed
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (and warns on the old names); the new
  name where torch has it, else the old one, looked up on each call;
* :func:`allreduce_options` (``asyncOp`` where it exists), :func:`clone_store` (``Store.clone()``
  or a second client), :func:`store_on_socket` (a store server on a bound socket: 2.6's libuv
  server cannot take one), :func:`meta_device` (``torch._dynamo`` imported first, for 2.6),
  :func:`profiler_events` (a profiler's events, with their inputs' dtypes on any release),
  :data:`TORCH_FULLY_SHARD_ON_CPU`;
* torch's private names, each behind a guarded function:

  - compiled code (Dynamo): :func:`is_compiled` and :func:`uncompiled` (what ``torch.compile(model)``
    returned, and the model inside), :func:`ddp_optimizer_caps` (the bucket sizes Dynamo cuts a compiled
    graph at, set only inside a compiled call), :func:`default_first_bucket_bytes`, :func:`dynamo_reset` and
    :func:`graph_breaks` and :func:`frames_compiled` (Dynamo's cache emptied and its counts since);
  - autograd: :func:`at_backward_end` (a callback when the running backward ends), :func:`hook_slots` and
    :func:`put_hooks` (a gradient hook taken out and put back), :func:`future_type`, :func:`use_count` (the C++
    references to a tensor: a backend's among them);
  - the profiler: :func:`profiler_on`, :func:`fast_range`; the fused list ops :func:`foreach_copy_`,
    :func:`foreach_div_`, :func:`foreach_mul_`;
  - modules, groups, the dispatcher: :func:`parameter_dict`, :func:`process_group_store`,
    :func:`default_group_sequence`, :func:`join_enabled`, :func:`inside_join`, :func:`dispatch_mode_base`,
    :data:`DISPATCHED_COLLECTIVES`; :func:`weights_only_refusal` (what torch's data-only reader refused).

  Where torch lacks the name, a function falls back to a public way with the same result where there is one
  (its docstring says which); otherwise it says in one line what is missing and what to do: an error where
  nothing can go on, a warning where minddp goes on without it (a compiled graph left uncut).

Each difference, release by release, and what was run: ``docs/torch-versions.md``. One difference is
handled where the teaching stages read it instead: a complex tensor is broadcast as its real view (2.6's
gloo refuses complex) by :func:`minddp.comm.plain.broadcast` itself, in its own two lines.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> padded, piece = torch.arange(4.0), torch.empty(4)
    >>> reduce_scatter_single(piece, padded)          # piece = this rank's chunk of the sum
    >>> all_gather_single(padded, piece)              # padded = every rank's piece, in rank order
    >>> padded
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import warnings
from types import SimpleNamespace

import torch
import torch.distributed as dist

#: Does torch's own ``fully_shard`` run on CPU tensors (its CPU stream records events)? Not in torch 2.6.
TORCH_FULLY_SHARD_ON_CPU = hasattr(torch.cpu.Stream, "record_event")


def all_gather_single(output, input, group=None, async_op=False):
    """``output`` = every rank's ``input``, back to back in rank order (torch's ``all_gather_single``)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """``output`` = this rank's chunk of ``input`` reduced over ranks (torch's ``reduce_scatter_single``)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input, op=op, group=group, async_op=async_op)


def meta_device() -> torch.device:
    """``torch.device("meta")``, to build a model under ``with``, with torch._dynamo imported first (torch 2.6)."""
    import torch._dynamo  # noqa: F401  (its import-time tensor ops fail under a meta default device in 2.6)

    return torch.device("meta")


def allreduce_options(op=dist.ReduceOp.SUM) -> dist.AllreduceOptions:
    """Options for ``ProcessGroup.allreduce``: ``op``, asynchronous (the caller waits on the Future) on every torch."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    if hasattr(opts, "asyncOp"):  # not in 2.6, whose allreduce is always asynchronous
        opts.asyncOp = True
    return opts


def clone_store(store: dist.Store) -> dist.Store:
    """A second connection to ``store``'s server, safe to use from another thread (torch's ``Store.clone``)."""
    if hasattr(store, "clone"):
        return store.clone()
    if isinstance(store, dist.TCPStore):  # torch 2.6: no clone; a new client of the same server
        return tcp_client(store)
    raise TypeError(
        f"torch {torch.__version__} cannot open a second connection to a {type(store).__name__} "
        f"(no Store.clone): pass a TCPStore, or use torch 2.13 or later"
    )


def store_on_socket(host: str, port: int, fd: int, **options) -> dist.TCPStore:
    """A ``TCPStore`` server on the listening socket ``fd`` (it takes ``fd`` over), with ``options`` as torch's.

    torch's default (libuv) server takes a socket from 2.8 on (pytorch#150215); before, it refuses one
    ("does not support initialization with an listen fd", logged as an error) before it touches it, and the
    other server, which takes one, is used.
    """
    if TORCH_LIBUV_TAKES_A_SOCKET:
        try:
            return dist.TCPStore(host, port, is_master=True, master_listen_fd=fd, **options)
        except NotImplementedError:  # a build without it after all: the socket is still ours to hand on
            pass
    return dist.TCPStore(host, port, is_master=True, master_listen_fd=fd, use_libuv=False, **options)


#: Does torch's libuv store server take an already-bound socket? (From torch 2.8; 2.6 and 2.7 refuse it.)
TORCH_LIBUV_TAKES_A_SOCKET = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 8)


#: The module of torch's data-only unpickler (``torch.load(..., weights_only=True)``), in every release 2.6 .. 2.15.
WEIGHTS_ONLY_UNPICKLER = "torch._weights_only_unpickler"


#: How a pickle names a tensor's layout (a DCP ``.metadata`` does, for each tensor it describes): torch's private
#: ``torch.serialization._get_layout``, called with the layout's name when the file is read, in 2.6 .. 2.15.
PICKLED_LAYOUT = ("torch.serialization", "_get_layout")


def weights_only_refusal(exc: BaseException) -> pickle.UnpicklingError | None:
    """The error torch's data-only reader raised when it refused a file, if ``exc`` (from ``torch.load``) is one.

    Told by where it was raised, not by its wording: the reader raises a ``pickle.UnpicklingError`` from
    inside its own module, and ``torch.load`` raises another one, reworded, ``from None``, which keeps the
    first as its ``__context__``. A damaged archive fails elsewhere (the zip reader), and is not one.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, pickle.UnpicklingError) and _raised_in(exc, WEIGHTS_ONLY_UNPICKLER):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _raised_in(exc: BaseException, module: str) -> bool:
    """Whether the innermost frame of ``exc``'s traceback (where it was raised) is code of ``module``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == module


def tcp_client(store: dist.TCPStore) -> dist.TCPStore:
    """A new client connection to ``store``'s server (same host, port and timeout): 2.6's ``clone``."""
    return dist.TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)


class ProfiledEvent:
    """One op or range a stopped profiler recorded, as :class:`torch.autograd.profiler_util.FunctionEvent` names
    it: ``name``, ``time_range.start``/``.end`` (µs from the trace's start), ``thread``, ``id``; ``input_shapes``
    and ``input_dtypes`` read when asked."""

    __slots__ = ("name", "time_range", "thread", "id", "_kineto")

    def __init__(self, kineto, trace_start_ns: int):
        self._kineto, self.name, self.id = kineto, kineto.name(), kineto.correlation_id()
        self.thread = kineto.start_thread_id()
        self.time_range = _Span((kineto.start_ns() - trace_start_ns) / 1e3, (kineto.end_ns() - trace_start_ns) / 1e3)

    @property
    def input_shapes(self) -> list:
        return self._kineto.shapes()

    @property
    def input_dtypes(self) -> list:  # 2.6's FunctionEvent has none: the Kineto event has them on every release
        return self._kineto.dtypes()


class _Span:
    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end


def profiler_events(prof) -> list[ProfiledEvent]:
    """``prof``'s events (a stopped :class:`torch.profiler.profile`), read straight from its Kineto results.

    ``prof.events()`` gives the same names, times and inputs, but first builds torch's whole event tree (its
    parents, children, memory and stacks): about 7 s for one step of a 32-layer model on a CPU, against a
    fraction of a second here. Read once per profiler, then kept on it.
    """
    cached = getattr(prof, "_minddp_events", None)
    if cached is None:
        results = prof.profiler.kineto_results
        start = results.trace_start_ns()
        cached = [ProfiledEvent(k, start) for k in results.events()]
        prof._minddp_events = cached
    return cached


# -- torch's private names: one guarded function each ------------------------------------------------------------

#: What every message of a missing private name ends with: the releases that have them all.
IN_RANGE = "use a torch from 2.6 to 2.15 (docs/torch-versions.md)"


def missing(name: str, use: str, fix: str | None = None) -> str:
    """The one line said when torch lacks the private ``name``: what is missing, what minddp reads it for, what to do
    (``fix``, if there is a way round it; else a torch that has it)."""
    return f"torch {torch.__version__} has no {name}, which minddp {use}: {fix + ', or ' if fix else ''}{IN_RANGE}"


#: The one line said where torch lacks a private name minddp reads (what, what for, what to do), by the name.
LACKS = {
    "OptimizedModule": missing(
        "torch._dynamo.eval_frame.OptimizedModule",
        "tells a compiled model by",
        "compile the wrapper instead of the model (torch.compile(wrapper))",
    ),
    "_orig_mod": missing(
        "OptimizedModule._orig_mod", "reaches a compiled model's own module through", "compile the wrapper"
    ),
    "_active_ddp_module": missing(
        "DistributedDataParallel._active_ddp_module or torch.distributed._DEFAULT_FIRST_BUCKET_BYTES",
        "sets to have a compiled graph cut where buckets fill",
        "the graph stays whole (the same values; every bucket leaves after backward)",
    ),
    "_DEFAULT_FIRST_BUCKET_BYTES": missing(
        "torch.distributed._DEFAULT_FIRST_BUCKET_BYTES",
        "sizes DDP's first bucket by, as torch's DDP",
        "1 MiB is used (pass bucket_cap_mb to set every bucket's size)",
    ),
    "queue_callback": missing("Variable._execution_engine.queue_callback", "ends each synchronised backward with"),
    "Future": missing("torch._C.Future", "checks a comm hook's Future against"),
    "_use_count": missing(
        "Tensor._use_count",
        "reads to keep a collective's tensors until its backend lets go of them",
        "a rank may rarely abort at exit (terminate called without an active exception)",
    ),
    "_parameters": missing(
        "Module._parameters", "swaps shards and full parameters in", "use ddp or torch's FSDP instead"
    ),
    "_get_process_group_store": missing(
        "distributed_c10d._get_process_group_store (a process group's store)",
        "posts debug mode's collective check on",
        "turn MINDDP_DEBUG off",
    ),
    "get_eval_frame_callback": missing(
        "torch._C._dynamo.eval_frame.get_eval_frame_callback",
        "reads to tell a compiled call from an eager one",
        "every forward is taken for a compiled one (the same values)",
    ),
    "TorchDispatchMode": missing(
        "torch.utils._python_dispatch.TorchDispatchMode",
        "watches a stage's collectives with, in the exercise checker",
        "check exercises on another torch",
    ),
}


def _attribute(owner, path: str):
    """``owner.a.b...`` for ``path`` ``"a.b..."``; None where a link is missing."""
    for name in path.split("."):
        owner = getattr(owner, name, None)
    return owner


# compiled code (Dynamo)


def is_compiled(module) -> bool:
    """Is ``module`` what ``torch.compile(model)`` returned (Dynamo's private ``OptimizedModule``)?

    Dynamo imported by nobody yet: nothing was compiled, and it is not imported here (seconds).
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    compiled = getattr(eval_frame, "OptimizedModule", None)
    if compiled is None:
        raise RuntimeError(LACKS["OptimizedModule"])
    return isinstance(module, compiled)


def uncompiled(module):
    """The model ``torch.compile`` wrapped in ``module`` (private: ``_orig_mod``); ``module`` itself if not compiled."""
    if not is_compiled(module):
        return module
    inner = getattr(module, "_orig_mod", None)
    if inner is None:
        raise RuntimeError(LACKS["_orig_mod"])
    return inner


def uncompiled_name(name: str) -> str:
    """A parameter's name as the model compiled by ``torch.compile`` names it: without the prefix the compiled
    wrapper puts before it (private: ``_orig_mod.``)."""
    return name.removeprefix("_orig_mod.")


#: Dynamo's reader of its frame callback (private, in torch's C module, loaded with torch): the callback is set only
#: while a compiled call runs. None where torch has none.
_FRAME_CALLBACK = _attribute(torch._C, "_dynamo.eval_frame.get_eval_frame_callback")
#: Is it safe to read inside a compiled call? Checked on 2.13; torch 2.6's frees the callback it returns
#: (a crash), and the releases before 2.13 are taken as 2.6: there every forward after Dynamo's import is taken for a
#: compiled one (the same values; torch's bucket globals set and restored around it, as minddp did before).
READS_FRAME_CALLBACK = _FRAME_CALLBACK is not None and tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (
    2,
    13,
)


@contextlib.contextmanager
def ddp_optimizer_caps(module, bucket_bytes: int, first_bucket_bytes: int):
    """Inside, while ``module`` runs compiled, Dynamo cuts each graph it compiles into pieces of ``bucket_bytes``
    (the first ``first_bucket_bytes``); an eager call leaves torch as it is.

    Compiled: ``module`` is what ``torch.compile(model)`` returned (:func:`is_compiled`), or this call is inside a
    compiled call (``torch.compile(wrapper)``: Dynamo's frame callback is set, read in this frame, which is a
    generator's, and Dynamo never compiles one, so the read runs as Python even there). What Dynamo's
    ``DDPOptimizer`` reads when it compiles a frame, both private, set only then and restored on leaving: torch's
    DDP's active module (``DistributedDataParallel._active_ddp_module``, set by torch's DDP around its forward;
    Dynamo reads its ``bucket_bytes_cap``) and ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (the first piece).
    """
    torch_ddp = torch.nn.parallel.DistributedDataParallel
    compiling = is_compiled(module)
    if not compiling and "torch._dynamo" in sys.modules:  # else nothing was compiled in this process yet
        if _FRAME_CALLBACK is None:
            warnings.warn(LACKS["get_eval_frame_callback"], RuntimeWarning, stacklevel=3)
        compiling = not READS_FRAME_CALLBACK or bool(_FRAME_CALLBACK())  # None: eager; False: runs compiled code
    if compiling and not (hasattr(torch_ddp, "_active_ddp_module") and hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES")):
        warnings.warn(LACKS["_active_ddp_module"], RuntimeWarning, stacklevel=3)
        compiling = False
    if not compiling:
        yield
        return
    before = torch_ddp._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES
    torch_ddp._active_ddp_module = SimpleNamespace(bucket_bytes_cap=bucket_bytes)  # all Dynamo reads of it
    dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket_bytes
    try:
        yield
    finally:
        torch_ddp._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES = before


def dynamo_reset() -> None:
    """Empty Dynamo's cache of compiled code and its counters (``torch._dynamo.reset()``, ``counters.clear()``):
    the next ``torch.compile`` call compiles anew, and :func:`graph_breaks` counts from here. Garbage is collected
    first: a compiled model still waiting in a reference cycle would otherwise die after the reset, and the callback
    that drops its entry from Dynamo's emptied tables raises a KeyError torch can only print."""
    import gc

    import torch._dynamo
    from torch._dynamo.utils import counters

    gc.collect()
    torch._dynamo.reset()
    counters.clear()


def graph_breaks() -> int:
    """Dynamo's count of graph breaks since the last :func:`dynamo_reset` (``counters["graph_break"]``, summed over
    their reasons)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def frames_compiled() -> int:
    """How many Python frames Dynamo has compiled since the last :func:`dynamo_reset` (``counters["frames"]["ok"]``)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def default_first_bucket_bytes() -> int:
    """torch's DDP's first bucket at its default cap, in bytes, read now as torch reads it when it builds a DDP.

    Private: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB in 2.6 .. 2.15); 1 MiB without it.
    """
    value = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", None)
    if value is None:
        warnings.warn(LACKS["_DEFAULT_FIRST_BUCKET_BYTES"], RuntimeWarning, stacklevel=2)
        return 1024 * 1024
    return value


# autograd


def at_backward_end(callback) -> None:
    """Have ``callback()`` run once the backward now running has finished; called from inside it (a hook).

    torch's own DDP does this through the private ``Variable._execution_engine.queue_callback``.
    """
    queue = _attribute(torch.autograd.Variable, "_execution_engine.queue_callback")
    if queue is None:
        raise RuntimeError(LACKS["queue_callback"])
    queue(callback)


def hook_slots(handles: list) -> list[tuple[dict, int]]:
    """Where each gradient hook of ``handles`` (``register_post_accumulate_grad_hook``'s) sits: its dict and key.

    torch keeps a tensor's hooks in a dict it reads at every call, in order (private: the tensor's
    ``_post_accumulate_grad_hooks``, reached by the handle's ``hooks_dict_ref``): :func:`put_hooks` takes a hook
    out and puts it back. Without it, none (the hooks then stay in, and run).
    """
    slots = []
    for handle in handles:
        ref = getattr(handle, "hooks_dict_ref", None)
        hooks = ref() if callable(ref) else None
        if not isinstance(hooks, dict):
            return []
        slots.append((hooks, handle.id))
    return slots


def put_hooks(slots: list[tuple[dict, int]], hook) -> None:
    """Take the hook out of every slot (``hook=None``), or put ``hook`` back in each: it then runs after the
    tensor's other hooks (a dict keeps the order keys were written in)."""
    for hooks, key in slots:
        if hook is None:
            hooks.pop(key, None)
        else:
            hooks[key] = hook


def future_type() -> type:
    """The class of every Future torch hands out: ``Work.get_future()``'s, and ``torch.futures.Future``'s base.

    Private: ``torch._C.Future`` (a hook's ``Future`` may be either class; both are instances of this one).
    """
    base = getattr(torch._C, "Future", None)
    if base is None:
        raise RuntimeError(LACKS["Future"])
    return base


def use_count(tensor: torch.Tensor) -> int | None:
    """How many C++ references hold ``tensor`` (its ``TensorImpl``): one for its Python object, one more for each
    view, Future or backend's Work holding it (private: ``Tensor._use_count``, in 2.6 .. 2.15; None without it, and a
    warning saying what is missing)."""
    count = getattr(tensor, "_use_count", None)
    if count is None:
        warnings.warn(LACKS["_use_count"], RuntimeWarning, stacklevel=2)  # once per place (the default filter)
        return None
    return count()


# the profiler and the fused list ops


def profiler_on() -> bool:
    """Is a torch profiler recording in this process? (torch's private ``autograd.profiler._is_profiler_enabled``;
    without it, True: the ranges minddp names are then always opened, as cheap as a profiler-free step allows.)"""
    enabled = getattr(torch.autograd.profiler, "_is_profiler_enabled", None)
    return True if enabled is None else enabled


def fast_range(name: str):
    """A profiler range ``name`` (``torch.profiler.record_function``'s) entered and left in C++: torch's private
    ``_RecordFunctionFast`` where there is one, else ``record_function`` itself (the same range)."""
    fast = _attribute(torch._C, "_profiler._RecordFunctionFast")
    return (fast or torch.profiler.record_function)(name)


def foreach_copy_(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``d.copy_(s)`` for each pair, in one call (torch's private ``_foreach_copy_``; a loop without it)."""
    _fused_or_each("_foreach_copy_", torch.Tensor.copy_, dst, src)


def foreach_div_(tensors: list[torch.Tensor], divisor) -> None:
    """``t.div_(divisor)`` for each, in one call (torch's private ``_foreach_div_``; a loop without it)."""
    _fused_or_each("_foreach_div_", torch.Tensor.div_, tensors, divisor)


def foreach_mul_(tensors: list[torch.Tensor], factor) -> None:
    """``t.mul_(factor)`` for each, in one call (torch's private ``_foreach_mul_``; a loop without it)."""
    _fused_or_each("_foreach_mul_", torch.Tensor.mul_, tensors, factor)


def _fused_or_each(name: str, each, tensors: list[torch.Tensor], other) -> None:
    """torch's fused ``name(tensors, other)`` where it has it, else ``each(t, o)`` for each tensor ``t`` (``o``: the
    matching item of ``other`` where it is a list, else ``other`` itself): the same op, one tensor at a time."""
    fused = getattr(torch, name, None)
    if fused is not None:
        fused(tensors, other)
        return
    for i, tensor in enumerate(tensors):
        each(tensor, other[i] if isinstance(other, list) else other)


# modules, process groups, the dispatcher


def parameter_dict(module) -> dict:
    """The dict ``module`` keeps its own parameters in, by name (torch's private ``Module._parameters``).

    Writing there swaps what the module computes with, a plain tensor too, without ``Module.__setattr__``'s checks.
    """
    held = getattr(module, "_parameters", None)
    if not isinstance(held, dict):
        raise RuntimeError(LACKS["_parameters"])
    return held


def process_group_store(group) -> dist.Store:
    """The store ``group``'s ranks met on (torch keeps it private: ``distributed_c10d._get_process_group_store``)."""
    from torch.distributed import distributed_c10d

    get = getattr(distributed_c10d, "_get_process_group_store", None)
    if get is None:
        raise RuntimeError(LACKS["_get_process_group_store"])
    return get(group)


def default_group_sequence() -> int | None:
    """Collectives this rank has launched on the default group: torch counts them for gloo and NCCL (private:
    ``_get_default_group()._get_sequence_number_for_group()``). None where there is no count (no group yet, a
    backend that keeps none, a torch without it)."""
    from torch.distributed import distributed_c10d

    default = getattr(distributed_c10d, "_get_default_group", None)
    try:
        if default is None or not dist.is_initialized():
            return None
        return int(default()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - no count kept: the caller's rule that needs it does not apply
        return None


def join_enabled(joinable) -> bool:
    """Has ``joinable`` (a ``torch.distributed.algorithms.Joinable``) been given to an enabled ``Join``?

    torch keeps it private, on the joinable (``_join_config.enable``, left set when the ``with`` block ends);
    an object that is no joinable has none: False.
    """
    return bool(getattr(getattr(joinable, "_join_config", None), "enable", False))


def join_over(joinable) -> None:
    """Say that the ``Join`` ``joinable`` was last given to has ended (its post-hooks ran): torch leaves its config
    set, so :func:`inside_join` tells the block's end by that config's identity (a new ``Join`` sets a new one)."""
    joinable._minddp_join_over = getattr(joinable, "_join_config", None)


def inside_join(joinable) -> bool:
    """Is ``joinable`` inside an enabled ``Join`` block now: given to one that :func:`join_over` has not ended?"""
    config = getattr(joinable, "_join_config", None)
    return join_enabled(joinable) and getattr(joinable, "_minddp_join_over", None) is not config


def dispatch_mode_base() -> type:
    """torch's base class for a mode that sees every op the dispatcher runs on this thread, collectives included
    (private: ``torch.utils._python_dispatch.TorchDispatchMode``)."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        raise RuntimeError(LACKS["TorchDispatchMode"]) from None
    return TorchDispatchMode


def written_tensors(func, args: tuple, kwargs: dict) -> list:
    """The tensors an operator seen in a dispatch mode writes into: its schema's arguments marked ``(a!)`` (private:
    ``OpOverload._schema``; an operator without a schema writes none that can be told)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.name in kwargs else args[i] if i < len(args) else None
        items = value if isinstance(value, (list, tuple)) else [value]
        out += [t for t in items if isinstance(t, torch.Tensor)]
    return out


def read_tensors(func, args: tuple, kwargs: dict) -> list:
    """The tensors an operator seen in a dispatch mode reads the values of: its schema's tensor arguments with no
    alias annotation (``(a!)`` marks a write, ``(a)`` a view, which reads nothing; private: ``OpOverload._schema``;
    an operator without a schema reads none that can be told)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None:
            continue
        value = kwargs.get(arg.name) if arg.name in kwargs else args[i] if i < len(args) else None
        items = value if isinstance(value, (list, tuple)) else [value]
        out += [t for t in items if isinstance(t, torch.Tensor)]
    return out


#: The collectives by the name the dispatcher gives their op (``str(func)`` in a dispatch mode), each with its kind
#: and the position of the argument that holds the tensors this rank sends. ``_allgather_base_`` and
#: ``_reduce_scatter_base_`` are torch's private ops behind ``all_gather_single`` / ``reduce_scatter_single``
#: (and their older names) in 2.6 .. 2.15.
DISPATCHED_COLLECTIVES = {
    "c10d.allreduce_.default": ("all_reduce", 0),
    "c10d.allreduce_coalesced_.default": ("all_reduce", 0),
    "c10d.broadcast_.default": ("broadcast", 0),
    "c10d.reduce_.default": ("reduce", 0),
    "c10d.allgather_.default": ("all_gather", 1),
    "c10d._allgather_base_.default": ("all_gather", 1),
    "c10d.reduce_scatter_.default": ("reduce_scatter", 1),
    "c10d._reduce_scatter_base_.default": ("reduce_scatter", 1),
}
