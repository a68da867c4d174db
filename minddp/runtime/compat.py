"""Torch's collective names and behaviour across the releases minddp supports (torch 2.6 to 2.15).

Every release-dependent call in minddp goes through here, one function each:

* :func:`all_gather_single`, :func:`reduce_scatter_single`: torch 2.13 renamed
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (and warns on the old names); the new
  name where torch has it, else the old one, looked up on each call;
* :func:`broadcast`: a complex tensor sent as its real view (2.6's gloo refuses complex);
* :func:`allreduce_options` (``asyncOp`` where it exists), :func:`clone_store` (``Store.clone()``
  or a second client), :func:`meta_device` (``torch._dynamo`` imported first, for 2.6),
  :func:`input_dtypes` (the profiler's dtypes on any release), :data:`TORCH_FULLY_SHARD_ON_CPU`.

Each difference, release by release, and what was run: ``docs/torch-versions.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> padded, piece = torch.arange(4.0), torch.empty(4)
    >>> reduce_scatter_single(piece, padded)          # piece = this rank's chunk of the sum
    >>> all_gather_single(padded, piece)              # padded = every rank's piece, in rank order
    >>> padded
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

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


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """``tensor`` = rank ``src``'s (global) or group rank ``group_src``'s ``tensor``, complex ones too."""
    wire = torch.view_as_real(tensor) if tensor.is_complex() else tensor  # same memory: ``tensor`` is written
    return dist.broadcast(wire, src=src, group=group, async_op=async_op, group_src=group_src)


def skip_frames(fn) -> None:
    """Dynamo runs ``fn``'s own frames as Python and compiles the frames they call (``recursive=False``'s skip)."""
    from torch._dynamo.decorators import skip  # Dynamo takes seconds to import: only once a wrapper is built

    skip(fn)


#: Decorator: Dynamo never compiles the function or anything it calls; Dynamo is imported at the first call.
run_eagerly = torch._disable_dynamo


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


def tcp_client(store: dist.TCPStore) -> dist.TCPStore:
    """A new client connection to ``store``'s server (same host, port and timeout): 2.6's ``clone``."""
    return dist.TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)


def input_dtypes(prof) -> dict:
    """``{event id: [dtype names of its inputs]}`` for ``prof``'s events (torch 2.6: from its Kineto events)."""
    events = prof.events()
    if not events or hasattr(events[0], "input_dtypes"):
        return {e.id: e.input_dtypes for e in events}
    return {k.correlation_id(): k.dtypes() for k in prof.profiler.kineto_results.events()}
