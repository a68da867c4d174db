"""The one walker over nested values: tensors inside tuples, lists, dicts and dataclasses.

A forward's inputs and outputs, a checkpoint's state and a hook's state are nested containers of
tensors. :func:`map_tensors` rebuilds such a value with a function applied to each tensor (to move
inputs to a device, cast them, copy state to the CPU); :func:`tensors_in` lists them (to find what a
backward will reach).

Example::

    >>> import torch
    >>> batch = {"x": torch.ones(2), "pair": (torch.zeros(1), "label")}
    >>> map_tensors(lambda t: t * 2, batch)["x"].tolist()
    [2.0, 2.0]
    >>> len(tensors_in(batch))
    2
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor in it; anything else is kept as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):  # before dataclasses: a Hugging Face ModelOutput is both; its dict view is the truth
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [map_tensors(fn, v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # a namedtuple takes fields
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: map_tensors(fn, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    return obj


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside ``obj``, in the order :func:`map_tensors` visits them."""
    found: list[torch.Tensor] = []
    map_tensors(lambda t: found.append(t) or t, obj)  # rebuilt with the same tensors, then dropped
    return found
