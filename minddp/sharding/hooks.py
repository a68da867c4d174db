"""Comm hooks for the sharded stages: average a bucket and keep only this rank's shard of it.

A DDP comm hook returns the whole averaged bucket. A *reduce-scatter hook*
has the same signature, ``hook(state, bucket) -> Future[Tensor]``, but the
bucket's buffer is laid out rank-major (:func:`~minddp.sharding.shards.pack_rank_major`:
rank 0's chunks of every gradient, then rank 1's...) and the Future holds
this rank's piece of the average only, ``1/world`` of the buffer:

* :func:`reduce_scatter_hook` divides by the world size and reduce-scatters
  (the sharded twin of :func:`~minddp.comm.default_hooks.allreduce_hook`);
* ``fp16_compress_wrapper(reduce_scatter_hook)`` /
  ``bf16_compress_wrapper(...)``: the same in 16 bits, half the bytes on the
  wire (the DDP stages' compress wrappers, unchanged: they cast a shard back
  up as they cast a whole bucket back up).

Hooks that need each gradient's shape (PowerSGD's low-rank matrices) have no
reduce-scatter form: :func:`sharded_hook` refuses them with the reason.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.comm.default_hooks import fp16_compress_wrapper
    >>> from minddp.sharding.zero2 import Zero2DDP
    >>> model = Zero2DDP(torch.nn.Linear(4, 2))
    >>> model.register_comm_hook(None, fp16_compress_wrapper(reduce_scatter_hook))    # half the bytes
    >>> model(torch.ones(3, 4)).sum().backward(); model.finish_gradient_synchronization()
    >>> [p.grad.dtype for p in model.parameters()]       # cast back up, as a whole bucket would be
    [torch.float32, torch.float32]
"""

from __future__ import annotations

import torch

from minddp.collectives import NO_COMMUNICATION
from minddp.comm.default_hooks import bf16_compress_wrapper, fp16_compress_wrapper
from minddp.comm.grad_bucket import GradBucket
from minddp.comm.wire import Wire


def reduce_scatter_hook(state, bucket: GradBucket) -> torch.futures.Future:
    """Average the bucket across ranks and keep this rank's piece: divide by the world size, reduce-scatter."""
    wire = Wire.of(state)
    flat = bucket.buffer().div_(wire.size())
    return wire.reduce_scatter(flat.new_empty(flat.numel() // wire.size()), flat)


_COMPRESSED = {"fp16": fp16_compress_wrapper(reduce_scatter_hook), "bf16": bf16_compress_wrapper(reduce_scatter_hook)}


#: The hook names the sharded stages take (the DDP hooks' names; PowerSGD has no reduce-scatter form).
NAMES = ("allreduce", "fp16", "bf16", "noop")


def check_name(name: str) -> None:
    """A one-line ValueError unless the sharded stages can take the hook called ``name``."""
    if name not in NAMES:
        raise ValueError(
            f"hook {name!r} has no reduce-scatter form for the sharded stages (it needs each gradient "
            f"whole, as PowerSGD's matrices do); use {', '.join(NAMES)} with zero2 and fsdp"
        )


def sharded_hook(name: str, wire: Wire | None):
    """``(state, hook)`` for a sharded stage, by the DDP hook's name (``allreduce``, ``fp16``, ``bf16``, ``noop``).

    ``noop`` keeps the hook and makes the wire send nothing
    (:data:`~minddp.collectives.NO_COMMUNICATION`), so the all-gathers are
    skipped as well: the no-communication limit of a sharded stage.
    """
    check_name(name)
    if name == "allreduce":
        return wire, reduce_scatter_hook
    if name in _COMPRESSED:
        return wire, _COMPRESSED[name]
    # noop: nothing is sent, so nothing is metered (as noop_hook sends nothing)
    return Wire(Wire.of(wire).group, transport=NO_COMMUNICATION), reduce_scatter_hook
