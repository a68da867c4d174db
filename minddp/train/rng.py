"""Every random stream a training step can draw from, saved and restored with a checkpoint.

A checkpoint is read as data only (:mod:`minddp.runtime.untrusted`), so what it holds must be
plain: tensors, numbers, strings, lists, tuples, dicts. torch's and Python's streams are; numpy's
(``np.random.get_state()``: an array) and a ``np.random.RandomState`` object (PowerSGD's) are not,
so :func:`as_data` writes them as plain values and :func:`from_data` rebuilds them.

Example::

    >>> import torch
    >>> from minddp.train.rng import rng_state, set_rng_state
    >>> saved = rng_state(); a = torch.rand(2)
    >>> set_rng_state(saved); bool((torch.rand(2) == a).all())
    True
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

#: The keys that mark numpy values written as plain ones (no real state dict uses them).
_ARRAY, _RANDOM_STATE = "minddp.numpy.ndarray", "minddp.numpy.RandomState"


def rng_state() -> dict:
    """Every random stream a training step can draw from, on this rank (plain values only)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = as_data(np.random.get_state())
    except ImportError:  # numpy is optional for torch; nothing to save then
        pass
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(from_data(state["numpy"]))


def as_data(obj: Any) -> Any:
    """``obj`` with every numpy array and ``RandomState`` inside (dicts, lists, tuples) written as plain values."""
    np = sys.modules.get("numpy")  # not imported: obj holds nothing of numpy's
    if np is not None and isinstance(obj, np.random.RandomState):
        return {_RANDOM_STATE: as_data(obj.get_state())}
    if np is not None and isinstance(obj, np.ndarray):
        return {_ARRAY: (obj.dtype.str, list(obj.shape), obj.ravel().tolist())}
    if isinstance(obj, dict):
        return {k: as_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(as_data(v) for v in obj)
    return obj


def from_data(obj: Any) -> Any:
    """The inverse of :func:`as_data`."""
    if isinstance(obj, dict) and len(obj) == 1 and _ARRAY in obj:
        import numpy as np

        dtype, shape, values = obj[_ARRAY]
        return np.array(values, dtype=np.dtype(dtype)).reshape(shape)
    if isinstance(obj, dict) and len(obj) == 1 and _RANDOM_STATE in obj:
        import numpy as np

        generator = np.random.RandomState()
        generator.set_state(from_data(obj[_RANDOM_STATE]))
        return generator
    if isinstance(obj, dict):
        return {k: from_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(from_data(v) for v in obj)
    return obj
