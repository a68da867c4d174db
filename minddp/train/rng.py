"""Every random stream a training step can draw from, saved and restored with a checkpoint.

Example::

    >>> import torch
    >>> from minddp.train.rng import rng_state, set_rng_state
    >>> saved = rng_state(); a = torch.rand(2)
    >>> set_rng_state(saved); bool((torch.rand(2) == a).all())
    True
"""

from __future__ import annotations

import random

import torch


def rng_state() -> dict:
    """Every random stream a training step can draw from, on this rank."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
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

        np.random.set_state(state["numpy"])
