"""Unused parameters: which parameters the forward actually used, and agreeing on it across ranks.

A model may skip a branch (on some steps, on some ranks). Its parameters then
never get a gradient hook, their buckets never fill, and a DDP that waits for
them waits forever. With ``find_unused_parameters=True``:

1. after the forward, walk the autograd graph back from the outputs
   (:func:`params_in_graph`): every ``AccumulateGrad`` node found holds a
   parameter this backward will reach; the others are *locally unused* and
   are marked ready (a zero gradient in the bucket) at the first hook;
2. every backward (no_sync ones too) marks the parameters whose hook fired in
   a local bitmap; at the sync, one all_reduce of the bitmap
   (:func:`globally_used`) tells every rank which parameters no rank used;
3. those keep their ``.grad`` untouched (as torch does), so every rank's
   optimizer sees the same thing: no gradient, no momentum update. A
   parameter used on another rank gets the averaged gradient here as well,
   even if this rank did not use it.

The bitmap all_reduce goes straight to ``torch.distributed`` (it is
bookkeeping, not gradient traffic, so the wire's meter does not count it),
and it costs one small collective per step: that is why the flag is off by
default.

Example::

    >>> used = params_in_graph(model(x), params)     # ids of params reachable from the output
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _tensors_in(obj: Any) -> list[torch.Tensor]:
    """Tensors inside a forward's output (tensors, tuples, lists, dicts, ModelOutput)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors_in(item)]
    return []


def params_in_graph(outputs: Any) -> set[int]:
    """Step 1: ids of the leaf tensors whose ``AccumulateGrad`` node is reachable from ``outputs``."""
    seen, found = set(), set()
    stack = [t.grad_fn for t in _tensors_in(outputs) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)   # only AccumulateGrad nodes have one
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def globally_used(local_used: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Step 2: bool per parameter, True where any rank used it since the last sync."""
    counts = local_used.to(torch.int32)
    dist.all_reduce(counts, group=group)
    return counts > 0
