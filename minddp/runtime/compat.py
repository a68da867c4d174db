"""Torch's collective names and behaviour across the releases minddp supports (torch 2.6 to 2.15).

Every release-dependent call in minddp goes through here, one function each:

* :func:`all_gather_single`, :func:`reduce_scatter_single`: torch 2.13 renamed
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (and warns on the old names); the new
  name where torch has it, else the old one, looked up on each call;
* :func:`allreduce_options` (``asyncOp`` where it exists), :func:`clone_store` (``Store.clone()``
  or a second client), :func:`store_on_socket` (a store server on a bound socket: 2.6's libuv
  server cannot take one), :func:`meta_device` (``torch._dynamo`` imported first, for 2.6),
  :func:`profiler_events` (a profiler's events, with their inputs' dtypes on any release),
  :data:`TORCH_FULLY_SHARD_ON_CPU`;
* torch's private names minddp reads, each behind a guard that names what is missing:
  :func:`weights_only_refusal` (what torch's data-only reader refused, told by where it was raised),
  :func:`process_group_store` (the store a group met on), :func:`join_enabled` (inside ``Join``?).

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

import pickle

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


def process_group_store(group) -> dist.Store:
    """The store ``group``'s ranks met on (torch keeps it private: ``distributed_c10d._get_process_group_store``)."""
    from torch.distributed import distributed_c10d

    get = getattr(distributed_c10d, "_get_process_group_store", None)
    if get is None:
        raise RuntimeError(
            f"torch {torch.__version__} no longer exposes a process group's store (_get_process_group_store), which "
            "debug mode's collective check posts on: turn MINDDP_DEBUG off, or use a torch from 2.6 to 2.15"
        )
    return get(group)


def join_enabled(joinable) -> bool:
    """Has ``joinable`` (a ``torch.distributed.algorithms.Joinable``) been given to an enabled ``Join``?

    torch keeps it private, on the joinable (``_join_config.enable``, left set when the ``with`` block ends);
    an object that is no joinable has none: False.
    """
    return bool(getattr(getattr(joinable, "_join_config", None), "enable", False))
