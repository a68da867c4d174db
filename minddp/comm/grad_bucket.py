"""GradBucket: what a communication hook is handed.

A bucket is a flat 1-D tensor (``buffer()``) holding the gradients of a few
parameters back to back, plus the bookkeeping to see them one by one again
(``gradients()`` are views into the buffer, in the bucket's parameter order).
Stages that sync one parameter at a time hand hooks a bucket of one parameter
whose buffer *is* the parameter's ``.grad`` viewed flat; bucketed stages hand
a bucket of many. The names mirror ``torch.distributed.GradBucket`` so a hook
written for torch reads the same here.

Example::

    >>> w, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.zeros(3))
    >>> bucket = GradBucket(0, torch.arange(9.0), [w, b], is_last=True)
    >>> [g.shape for g in bucket.gradients()]
    [torch.Size([2, 3]), torch.Size([3])]
"""

from __future__ import annotations

import torch


class BucketLayout:
    """Where each parameter's gradient lives inside a flat buffer.

    Computed once per bucket at construction (offsets, sizes, shapes), so a
    training step never recomputes it.
    """

    __slots__ = ("params", "offsets", "numels", "shapes", "numel", "_cache")

    def __init__(self, params: list[torch.Tensor]):
        self.params = list(params)
        self.offsets, self.numels, self.shapes = [], [], []
        offset = 0
        for p in self.params:
            self.offsets.append(offset)
            self.numels.append(p.numel())
            self.shapes.append(p.shape)
            offset += p.numel()
        self.numel = offset
        self._cache: tuple | None = None

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Split a flat tensor of this layout into per-parameter views (no copy).

        The views of the last tensor asked for are kept: a bucketed stage asks
        for the views of the same reused buffer twice a step, and slicing it
        anew costs Python work per parameter. The key is the memory itself
        (address, dtype); the kept views hold that memory alive, so no other
        tensor can appear at the same address while they are kept.
        """
        return self._views_and_addresses(flat)[0]

    def _views_and_addresses(self, flat: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
        """:meth:`views`, and the address each view starts at (kept with them, for :meth:`grads_in`)."""
        key = (flat.data_ptr(), flat.dtype, flat.numel(), flat.device)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        views = [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]
        self._cache = (key, (views, [v.data_ptr() for v in views]))
        return self._cache[1]

    def grads_in(self, flat: torch.Tensor) -> list[bool]:
        """Per parameter: does its ``.grad`` already live in ``flat`` (the same memory, same dtype)?

        True under ``gradient_as_bucket_view``, or where a hook reduced the
        buffer in place and the buffer is a view of the gradient; such a
        gradient needs no copy back, and torch's reducer scales it by
        division rather than by multiplication.
        """
        addresses, dtype = self._views_and_addresses(flat)[1], flat.dtype
        return [p.grad is not None and p.grad.data_ptr() == address and p.grad.dtype == dtype
                for p, address in zip(self.params, addresses)]


class GradBucket:
    """A flat gradient buffer for a group of parameters, as a comm hook sees it."""

    def __init__(self, index: int, buffer: torch.Tensor, parameters: list[torch.Tensor] | BucketLayout,
                 is_last: bool):
        self._index = index
        self._layout = parameters if isinstance(parameters, BucketLayout) else BucketLayout(parameters)
        if buffer.dim() != 1 or buffer.numel() != self._layout.numel:
            raise ValueError(
                f"GradBucket buffer must be 1-D with {self._layout.numel} elements, got shape {tuple(buffer.shape)}"
            )
        self._buffer = buffer
        self._is_last = is_last

    def index(self) -> int:
        """Position of this bucket in the step's launch order (0 = launched first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient tensor to communicate."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the flat tensor (e.g. after compressing it in place into another)."""
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of ``buffer()``, in ``parameters()`` order."""
        return list(self._layout.views(self._buffer))   # a copy: the layout keeps its own list

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients this bucket holds."""
        return list(self._layout.params)

    def is_last(self) -> bool:
        """Whether this is the last bucket of the step (the model's first layers)."""
        return self._is_last

    def __repr__(self) -> str:
        return f"GradBucket(index={self._index}, numel={self._buffer.numel()}, params={len(self._layout.params)})"
