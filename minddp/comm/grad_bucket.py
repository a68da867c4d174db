"""GradBucket: what a communication hook is handed.

A flat 1-D tensor (``buffer()``) holding a few parameters' gradients back to back, and those parameters
(``gradients()``: views of the buffer, one per parameter). A per-parameter stage's bucket holds one parameter;
a bucketed stage's, many. The method names are ``torch.distributed.GradBucket``'s: a hook written for torch's
DDP runs on minddp's stages unchanged, and the other way round.

Example::

    >>> w, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.zeros(3))
    >>> bucket = GradBucket(0, torch.arange(9.0), [w, b], is_last=True)
    >>> [g.shape for g in bucket.gradients()]
    [torch.Size([2, 3]), torch.Size([3])]
"""

from __future__ import annotations

import torch


class GradBucket:
    """A flat gradient buffer for a group of parameters, as a comm hook sees it."""

    def __init__(self, index: int, buffer: torch.Tensor, parameters: list[torch.Tensor], is_last: bool):
        self._index = index
        self._buffer = buffer
        self._parameters = list(parameters)
        self._is_last = is_last

    def index(self) -> int:
        """Position of this bucket in the step's launch order (0 = sent first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient tensor to communicate."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the flat tensor (e.g. by a compressed copy of it)."""
        self._buffer = buffer

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients this bucket holds, in buffer order."""
        return list(self._parameters)

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of ``buffer()``, shaped like the parameters."""
        pieces = self._buffer.split([p.numel() for p in self._parameters])
        return [piece.view(p.shape) for piece, p in zip(pieces, self._parameters)]

    def is_last(self) -> bool:
        """Whether this is the last bucket of the step (the model's first layers)."""
        return self._is_last

    def __repr__(self) -> str:
        return f"GradBucket(index={self._index}, numel={self._buffer.numel()}, params={len(self._parameters)})"
