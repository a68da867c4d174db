"""The two checks the teaching stages make, so that a mistake is an error and not a hang.

Collectives only compare sizes, if that. Two ranks that disagree on what they
send do not fail cleanly: they hang, abort inside gloo, or worse, sum one
rank's gradient of one layer with another rank's gradient of another layer
and train on, silently diverging. So the stages check two things, each with
one small collective, and raise the same error on every rank:

1. :func:`check_same_model`, at construction, before the broadcast: every
   rank describes its parameters (name, shape, dtype); the descriptions are
   all-gathered and any difference is named (rank and parameter);
2. :func:`check_same_parameters_used`, after each forward: every rank marks
   which parameters the forward's graph reaches (a backward will give exactly
   those a gradient); the marks are all-gathered, and a parameter reached on
   some ranks but not on others is named. Such a model (a branch taken on one
   rank only) needs ``minddp.DistributedDataParallel(...,
   find_unused_parameters=True)``, as with torch's DDP.

Everything else torch's DDP checks (the same hook and bucket sizes on every
rank, ``optimizer.step()`` before the sync, NaN gradients, a bucket plan that
drifts) is checked by the production :class:`minddp.DistributedDataParallel`,
not here.

Example::

    >>> check_same_model(module, group)                      # raises on every rank if a rank differs
    >>> check_same_parameters_used(module(x), module, group)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minddp.graph import parameters_reached


def check_same_model(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Step 1: raise on every rank unless all ranks hold parameters of the same names, shapes, dtypes."""
    mine = [(name, tuple(p.shape), str(p.dtype).replace("torch.", "")) for name, p in module.named_parameters()]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if len(theirs) != len(reference):
            raise RuntimeError(
                f"DistributedDataParallel expects the same model across all ranks, but rank {rank} has "
                f"{len(theirs)} parameters while rank 0 has {len(reference)}: build the same model on every rank"
            )
        for (n0, s0, d0), (n, s, d) in zip(reference, theirs):
            if (n0, s0, d0) != (n, s, d):
                raise RuntimeError(
                    f"DistributedDataParallel expects the same model across all ranks: parameter {n!r} on "
                    f"rank {rank} has shape {list(s)} dtype {d}, but rank 0's {n0!r} has shape {list(s0)} "
                    f"dtype {d0} (size mismatch); build the same model (same config) on every rank"
                )


def check_same_parameters_used(outputs: Any, module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Step 2: raise on every rank unless this forward reached the same trainable parameters everywhere."""
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not named or not torch.is_grad_enabled():      # no backward will follow, nothing will be sent
        return
    reached = parameters_reached(outputs)
    mine = torch.tensor([id(p) in reached for _, p in named], dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    everyone = torch.stack(gathered)                      # ranks x parameters: 1 where reached
    differ = (everyone.min(0).values != everyone.max(0).values).nonzero().view(-1).tolist()
    if differ:
        where = "; ".join(f"{named[i][0]!r} on ranks {everyone[:, i].nonzero().view(-1).tolist()} only"
                          for i in differ[:4])
        raise RuntimeError(
            f"this forward used different parameters on different ranks ({where}{'; ...' if len(differ) > 4 else ''}), "
            "so the ranks would send different gradients and pair unrelated tensors in their all_reduces; "
            "take the same branches on every rank, or use "
            "minddp.DistributedDataParallel(..., find_unused_parameters=True), which handles such models"
        )
