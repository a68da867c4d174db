"""Memory per rank, measured from the tensors a rank holds (not estimated).

Filled in below: bytes of parameters, gradients and optimizer state.
"""

from __future__ import annotations

from typing import Iterable

import torch


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view and what it views count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes() > 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors on this rank (a ZeRO-1 optimizer: its local optimizer's)."""
    local = getattr(optimizer, "optim", optimizer)
    return storage_bytes(v for state in local.state.values() for v in state.values() if torch.is_tensor(v))
