"""Which part of each tensor a rank keeps: the one layout every sharded rung uses.

A tensor of ``n`` elements, flattened, is cut into ``world`` chunks of ``c = ceil(n / world)``; rank
``r`` keeps ``[r c, (r + 1) c)`` (clipped to ``n``). Every tensor is cut, so:

1. **balance**: each rank keeps ``n / world`` elements of every tensor, give or take ``world - 1``;
2. **the same chunks as DTensor's** ``Shard(0)``, so DCP saves and reshards them;
3. **rank-major buffers** (:func:`pack_rank_major`): all of rank 0's chunks, then rank 1's..., each
   padded to ``c``; a reduce-scatter leaves rank ``r`` its chunks, an all-gather gives every rank the
   buffer back, and :func:`unpack_rank_major` puts each tensor together again.

More: ``docs/sharding.md`` (The chunk layout).

Example::

    >>> chunk_range(10, world=4, rank=3)          # c = 3: ranks keep 0:3, 3:6, 6:9, 9:10
    (9, 10)
    >>> pack_rank_major([torch.arange(3.), torch.arange(10., 14.)], world=2)
    tensor([ 0.,  1., 10., 11.,  2.,  0., 12., 13.])
"""

from __future__ import annotations

import torch


def chunk_size(numel: int, world: int) -> int:
    """``c = ceil(numel / world)``: the most elements any rank keeps of this tensor."""
    return -(-numel // world)


def chunk_range(numel: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s chunk of a flattened tensor of ``numel`` elements."""
    c = chunk_size(numel, world)
    start = min(rank * c, numel)
    return start, min(start + c, numel)


def pack_rank_major(flats: list[torch.Tensor], world: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Part 3: one buffer of ``world`` equal blocks; block ``r`` holds rank ``r``'s chunk of each tensor, padded."""
    sizes = [chunk_size(f.numel(), world) for f in flats]
    if out is None:
        out = flats[0].new_empty(world * sum(sizes))
    blocks = out.view(world, sum(sizes))
    offset = 0
    for flat, c in zip(flats, sizes):
        padded = torch.nn.functional.pad(flat.reshape(-1), (0, world * c - flat.numel()))  # zeros at the end
        blocks[:, offset : offset + c].copy_(padded.view(world, c))  # row r = rank r's chunk
        offset += c
    return out


def unpack_rank_major(buffer: torch.Tensor, numels: list[int], world: int) -> list[torch.Tensor]:
    """Part 3, backwards: each tensor's elements from a gathered rank-major buffer, each in a new storage."""
    sizes = [chunk_size(n, world) for n in numels]
    blocks = buffer.view(world, sum(sizes))
    out, offset = [], 0
    for n, c in zip(numels, sizes):
        whole = buffer.new_empty(world * c)
        whole.view(world, c).copy_(blocks[:, offset : offset + c])  # the chunks in rank order
        out.append(whole[:n])  # padding cut off
        offset += c
    return out


def split_block(block: torch.Tensor, numels: list[int], world: int, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s chunk of each tensor, as views of its block (padding left out)."""
    out, offset = [], 0
    for n in numels:
        start, end = chunk_range(n, world, rank)
        out.append(block[offset : offset + end - start])
        offset += chunk_size(n, world)
    return out
