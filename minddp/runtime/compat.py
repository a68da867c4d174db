"""Torch's collective names across the releases minddp supports (torch 2.6 to 2.15).

torch 2.13 renamed two collectives that write into one flat tensor:

======================================  ======================================
2.6 to 2.12                             2.13 on
======================================  ======================================
``dist.all_gather_into_tensor``         ``dist.all_gather_single``
``dist.reduce_scatter_tensor``          ``dist.reduce_scatter_single``
======================================  ======================================

The old names are still there in 2.13 to 2.15, with the same arguments; 2.13
marks them deprecated (a ``FutureWarning`` on every call), 2.15 keeps them
as plain aliases. So minddp calls the new name where torch has it and the old
one where it does not: no ``AttributeError`` on 2.6 to 2.12, no warning on
2.13. The name is looked up on each call (one ``getattr``), so a test can take
the new names away from ``torch.distributed`` and see the old ones used.

One option is new too: ``dist.AllreduceOptions().asyncOp`` (in 2.13 and
2.15, default ``True``; not in 2.6) says whether the caller waits on the
collective's Future, which decides which CUDA stream NCCL runs on. 2.6's
allreduce is always asynchronous in that sense. :func:`allreduce_options` sets it where it exists.

One collective changed what it takes: ``dist.broadcast`` sends a complex
tensor as its real view (``torch.view_as_real``) in 2.13 and 2.15, as
``all_reduce`` and ``all_gather`` already did in 2.6; 2.6's ``broadcast``
hands the complex tensor to the backend, and gloo refuses it ("Invalid scalar
type"). :func:`broadcast` sends the real view on every release.

Building a model on the meta device: torch 2.6's ``torch._dynamo`` runs
tensor operations when first imported, which fail under ``torch.device("meta")``
("Tensor.item() cannot be called on meta tensors"), and transformers imports it
lazily (``torch.compiler.disable``) when a model class is first used.
:func:`meta_device` imports it first.

torch's own ``fully_shard`` (FSDP2) runs on CPU from 2.13 (at the latest) on:
in 2.6 its all-gather records an event on a CPU stream, which has no
``record_event`` (``AttributeError``). :data:`TORCH_FULLY_SHARD_ON_CPU` says
which; minddp's benchmark refuses ``torch-fsdp`` on CPU where it is false.

The profiler's events: ``FunctionEvent.input_dtypes`` (2.13, 2.15) is not in
2.6, whose Kineto events carry the same list (``KinetoEvent.dtypes()``, keyed
by the correlation id that is the ``FunctionEvent``'s ``id``).
:func:`input_dtypes` reads whichever there is.

And one method: ``Store.clone()`` (in 2.13 and 2.15, not in 2.6) opens a
second connection to the same store, so that a thread (minddp's heartbeat)
does not share a socket with the training thread. :func:`clone_store` does
that on 2.6 by connecting a new ``TCPStore`` client to the same host and port.

Example::

    >>> from minddp.runtime.compat import all_gather_single, reduce_scatter_single
    >>> reduce_scatter_single(piece, padded, group=group)     # piece = this rank's chunk of the sum
    >>> all_gather_single(padded, piece, group=group)         # padded = every rank's piece, in rank order
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
    wire = torch.view_as_real(tensor) if tensor.is_complex() else tensor     # same memory: ``tensor`` is written
    return dist.broadcast(wire, src=src, group=group, async_op=async_op, group_src=group_src)


def meta_device() -> torch.device:
    """``torch.device("meta")``, to build a model under ``with``, with torch._dynamo imported first (torch 2.6)."""
    import torch._dynamo  # noqa: F401  (its import-time tensor ops fail under a meta default device in 2.6)
    return torch.device("meta")


def allreduce_options(op=dist.ReduceOp.SUM) -> dist.AllreduceOptions:
    """Options for ``ProcessGroup.allreduce``: ``op``, asynchronous (the caller waits on the Future) on every torch."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    if hasattr(opts, "asyncOp"):        # not in 2.6, whose allreduce is always asynchronous
        opts.asyncOp = True
    return opts


def clone_store(store: dist.Store) -> dist.Store:
    """A second connection to ``store``'s server, safe to use from another thread (torch's ``Store.clone``)."""
    if hasattr(store, "clone"):
        return store.clone()
    if isinstance(store, dist.TCPStore):     # torch 2.6: no clone; a new client of the same server
        return tcp_client(store)
    raise TypeError(f"torch {torch.__version__} cannot open a second connection to a {type(store).__name__} "
                    f"(no Store.clone): pass a TCPStore, or use torch 2.13 or later")


def tcp_client(store: dist.TCPStore) -> dist.TCPStore:
    """A new client connection to ``store``'s server (same host, port and timeout): 2.6's ``clone``."""
    return dist.TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)


def input_dtypes(prof) -> dict:
    """``{event id: [dtype names of its inputs]}`` for ``prof``'s events (torch 2.6: from its Kineto events)."""
    events = prof.events()
    if not events or hasattr(events[0], "input_dtypes"):
        return {e.id: e.input_dtypes for e in events}
    return {k.correlation_id(): k.dtypes() for k in prof.profiler.kineto_results.events()}
