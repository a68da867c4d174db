"""Handing one bucket to a comm hook: the one call every teaching stage makes.

``send(hook, state, bucket)`` is ``hook(state, bucket)`` inside a named
profiler range, ``minddp.bucket_launch#<index> numel=<n> dtype=<t> hook=<name>``.
A trace then shows when each bucket was ready and handed to the network, and
:mod:`minddp.analysis` matches each range to the collective it started. The
hook returns at once with a Future; waiting on it is the stage's choice
(right away, or later: that choice is the difference between ``hook`` and
``hook-async``, and between ``bucket`` and ``bucket-async``).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.comm.default_hooks import allreduce_hook
    >>> from minddp.comm.grad_bucket import GradBucket
    >>> p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.full((3,), 2.0)
    >>> future = send(allreduce_hook, None, GradBucket(0, p.grad.view(-1), [p], is_last=True))
    >>> p.grad.copy_(future.wait().view_as(p.grad))       # the average, written back
    tensor([2., 2., 2.])
"""

from __future__ import annotations

import torch

from minddp.comm.grad_bucket import GradBucket


def hook_name(hook) -> str:
    return getattr(hook, "__name__", type(hook).__name__)


def launch_label(bucket: GradBucket, hook) -> str:
    """The profiler range's name for this bucket (the analysis parses it)."""
    buffer = bucket.buffer()
    dtype = str(buffer.dtype).replace("torch.", "")
    return f"minddp.bucket_launch#{bucket.index()} numel={buffer.numel()} dtype={dtype} hook={hook_name(hook)}"


def send(hook, state, bucket: GradBucket) -> torch.futures.Future:
    """Start ``hook``'s communication for ``bucket``; return its Future without waiting."""
    with torch.profiler.record_function(launch_label(bucket, hook)):
        return hook(state, bucket)
