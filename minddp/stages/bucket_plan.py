"""Which parameters share a bucket: the plan, computed once, with no process group.

Rules (as torch's DDP documents them):

1. walk the parameters in **reverse** registration order, because backward
   produces the last layers' gradients first, so a bucket of neighbours in
   that order fills up early and can be sent while backward goes on;
2. keep adding parameters to the current bucket while its size stays within
   ``bucket_cap_mb`` (MiB, a float: ``0.0016`` is a valid cap); a parameter
   that would push it over the cap starts a new bucket, and a parameter
   larger than the cap gets a bucket of its own;
3. ``bucket_cap_mb=None`` means no cap: everything in one bucket;
4. parameters of different dtype or device never share a bucket (a flat
   buffer has one dtype and lives on one device).

Example::

    >>> plan_buckets([w1, b1, w2, b2], bucket_cap_mb=None)
    [[3, 2, 1, 0]]
"""

from __future__ import annotations

import torch

MB = 1024 * 1024


def plan_buckets(params: list[torch.Tensor], bucket_cap_mb: float | None,
                 first_bucket_cap_mb: float | None = None) -> list[list[int]]:
    """Group parameter indices into buckets; returns indices into ``params``.

    ``first_bucket_cap_mb`` lets the first bucket be smaller (torch's DDP uses
    1 MiB) so the first all_reduce starts as early as possible.
    """
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0 or None, got {bucket_cap_mb!r}")
    open_buckets: dict[tuple, list[int]] = {}   # (dtype, device) -> bucket being filled
    open_bytes: dict[tuple, int] = {}
    closed: list[list[int]] = []

    def cap_bytes() -> float:
        if bucket_cap_mb is None:
            return float("inf")
        first = first_bucket_cap_mb if (first_bucket_cap_mb is not None and not closed) else bucket_cap_mb
        return first * MB

    for index in reversed(range(len(params))):                                  # step 1
        p = params[index]
        key = (p.dtype, p.device)                                              # step 4
        size = p.numel() * p.element_size()
        bucket = open_buckets.get(key)
        if bucket and open_bytes[key] + size > cap_bytes():                    # step 2
            closed.append(bucket)
            bucket = None
        if bucket is None:
            bucket = open_buckets[key] = []
            open_bytes[key] = 0
        bucket.append(index)
        open_bytes[key] += size
    closed.extend(b for b in open_buckets.values() if b)                       # step 3
    return closed
