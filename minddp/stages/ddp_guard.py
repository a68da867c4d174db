"""Cross-rank checks: the same model everywhere, and the same buckets in the same order.

Collectives only check sizes, if that. Two ranks that disagree on which
gradients sit in which bucket, or on the order buckets are sent, can sum one
layer's gradient into another's of the same size and train on silently
corrupted gradients. Two checks catch it:

1. :func:`~minddp.stages.checks.verify_replicas`, once at construction of
   every stage (so it lives with the checks all stages share): every rank
   describes its parameters (name, shape, dtype); the descriptions are
   all-gathered and any difference raises on every rank, naming the rank and
   the parameter;
2. :func:`check_consistency`, every step in debug mode (``MINDDP_DEBUG=1`` or
   ``check_consistency=True``): each rank all-gathers a small fingerprint (per
   bucket: element count and a checksum of its parameter indices; and the
   order buckets were launched in); a mismatch raises on every rank, before
   the averaged gradients are written back, with a readable diff.

Example::

    >>> check_consistency(plan, sizes, launched, names, group)
"""

from __future__ import annotations

import os
import zlib

import torch.distributed as dist


def debug_enabled() -> bool:
    """``MINDDP_DEBUG=1`` in the environment turns the per-step check on."""
    return os.environ.get("MINDDP_DEBUG", "0") not in ("", "0", "false", "False")


def fingerprint(plan: list[list[int]], sizes: list[int], launched: list[int]) -> tuple:
    """A few integers per bucket: enough to tell two plans or launch orders apart."""
    return (tuple((n, zlib.crc32(repr(bucket).encode())) for bucket, n in zip(plan, sizes)), tuple(launched))


def check_consistency(plan: list[list[int]], sizes: list[int], launched: list[int], names: list[str],
                      group: dist.ProcessGroup) -> None:
    """Step 2: all_gather this step's fingerprint; raise on every rank if any rank differs from rank 0."""
    mine = fingerprint(plan, sizes, launched)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    diffs = []
    for rank, theirs in enumerate(everyone):
        if theirs == reference:
            continue
        (buckets0, order0), (buckets, order) = reference, theirs
        if len(buckets) != len(buckets0):
            diffs.append(f"rank {rank} has {len(buckets)} buckets, rank 0 has {len(buckets0)}")
        for b, (x0, x) in enumerate(zip(buckets0, buckets)):
            if x0 != x:
                diffs.append(f"bucket {b}: rank {rank} has {x[0]} elements (checksum {x[1]}), "
                             f"rank 0 has {x0[0]} (checksum {x0[1]})")
        if order != order0:
            diffs.append(f"launch order: rank {rank} {list(order)}, rank 0 {list(order0)}")
    if diffs:
        local = "; ".join(f"bucket {b}: {[names[i] for i in bucket]}" for b, bucket in enumerate(plan))
        raise RuntimeError(
            "minddp consistency guard: ranks disagree on the bucket plan or launch order, so their all_reduces "
            "would mix different gradients: " + " | ".join(diffs) + f" | this rank (rank {dist.get_rank(group)}) "
            f"plans {local}. Every rank must build the same model and register the same parameters in the same "
            "order (and must not change requires_grad on one rank only)"
        )
