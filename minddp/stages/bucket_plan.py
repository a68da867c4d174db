"""Which parameters share a bucket: the plan, computed once, with no process group.

Rules (the ones torch's DDP applies; a test checks the plan against torch's own
``_compute_bucket_assignment_by_size``):

1. walk the parameters in **reverse** registration order: backward produces the last layers'
   gradients first, so a bucket of neighbours in that order fills early and travels during backward;
2. close the current bucket as soon as it holds ``bucket_cap_mb`` (MiB, a float) or more, so a
   bucket overshoots the cap by at most its last parameter;
3. ``bucket_cap_mb=None`` means no cap: everything in one bucket;
4. parameters of different dtype or device never share a bucket (a flat buffer has one of each);
5. ``first_bucket_cap_mb``, if given, caps the first bucket of each dtype instead: torch's DDP, left at its
   default cap (:data:`DEFAULT_CAP_MB`), makes its first bucket :data:`FIRST_BUCKET_MB` (1 MiB), so that the
   first all_reduce starts early in backward rather than after 25 MiB of gradients (``docs/ladder.md``,
   "The bucket lesson"); :func:`bucket_caps` is that rule, for every bucketed wrapper.

Example (4 KiB weights, 64 B biases; a cap of 4 KiB = 1/256 MiB)::

    >>> w1, b1, w2, b2 = torch.zeros(32, 32), torch.zeros(16), torch.zeros(32, 32), torch.zeros(16)
    >>> plan_buckets([w1, b1, w2, b2], bucket_cap_mb=None)
    [[3, 2, 1, 0]]
    >>> plan_buckets([w1, b1, w2, b2], bucket_cap_mb=1 / 256)
    [[3, 2], [1, 0]]
    >>> plan_buckets([w1, b1.double(), w2, b2], bucket_cap_mb=None)     # one dtype per bucket
    [[3, 2, 0], [1]]
    >>> plan_buckets([w1, b1, w2, b2], bucket_cap_mb=1, first_bucket_cap_mb=1 / 1024)   # a 1 KiB first bucket
    [[3, 2], [1, 0]]
"""

from __future__ import annotations

import math
from numbers import Real

import torch

MB = 1024 * 1024
#: torch's DDP when ``bucket_cap_mb`` is left out (``None``): buckets of 25 MiB...
DEFAULT_CAP_MB = 25.0
#: ...except the first, of 1 MiB: torch's own first-bucket size, which a test compares with this.
FIRST_BUCKET_MB = 1.0


def bucket_caps(bucket_cap_mb: float | None, first_bucket_mb: float = FIRST_BUCKET_MB) -> tuple[float, float | None]:
    """Rule 5: ``(cap, first bucket's cap)``; ``(25, first_bucket_mb)`` at None, else ``(bucket_cap_mb, None)``."""
    return (DEFAULT_CAP_MB, first_bucket_mb) if bucket_cap_mb is None else (bucket_cap_mb, None)


def check_bucket_cap_mb(cap) -> None:
    """Refuse in one line what ``--bucket-cap-mb`` refuses (0, negatives, nan, inf) and a str or bool; None is fine.

    Every constructor that takes a cap runs it (the bucketed stages, ``ddp``, ``zero2``, :func:`minddp.ladder.wrap`).
    """
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, Real) or not 0 < cap < math.inf):
        raise _refusal(cap)


def _refusal(cap) -> Exception:
    """The one line: what was given and what to pass (a positive number typed as a string: that number)."""
    text = cap.strip() if isinstance(cap, str) else ""
    hint = text if text.replace(".", "", 1).isdigit() and float(text) > 0 else "25 (torch's default cap)"
    kind = ValueError if isinstance(cap, Real) and not isinstance(cap, bool) else TypeError
    return kind(f"bucket_cap_mb must be a finite number of MiB above 0 or None, got {cap!r}: pass bucket_cap_mb={hint}")


def plan_buckets(
    params: list[torch.Tensor], bucket_cap_mb: float | None, first_bucket_cap_mb: float | None = None
) -> list[list[int]]:
    """Group parameter indices into buckets (rules 1-5 of the module doc); returns indices into ``params``."""
    check_bucket_cap_mb(bucket_cap_mb)
    open_buckets: dict[tuple, list[int]] = {}  # (dtype, device) -> bucket being filled
    open_bytes: dict[tuple, int] = {}
    n_closed: dict[tuple, int] = {}  # buckets closed so far, per (dtype, device)
    closed: list[list[int]] = []

    def cap_bytes(key: tuple) -> float:
        if bucket_cap_mb is None:
            return float("inf")  # rule 3
        first = first_bucket_cap_mb is not None and n_closed.get(key, 0) == 0
        return int((first_bucket_cap_mb if first else bucket_cap_mb) * MB)  # rule 5; whole bytes, as torch

    for index in reversed(range(len(params))):  # rule 1
        p = params[index]
        key = (p.dtype, p.device)  # rule 4
        open_buckets.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + p.numel() * p.element_size()
        if open_bytes[key] >= cap_bytes(key):  # rule 2
            closed.append(open_buckets.pop(key))
            open_bytes[key] = 0
            n_closed[key] = n_closed.get(key, 0) + 1
    closed.extend(b for b in open_buckets.values() if b)  # the last, partly filled buckets
    return closed
