"""Handing a bucket to a comm hook inside a named profiler range, which the trace analysis reads.

``send(hook, state, bucket)`` is ``hook(state, bucket)`` inside a profiler range named
``minddp.bucket_launch#<index> numel=<n> dtype=<t> hook=<name>``. A trace then shows when each bucket
was ready and handed to the network, and :mod:`minddp.analysis` matches each range to the collective
it started. The production wrappers label their own sends (``zero2`` and ``fsdp`` call :func:`send`,
the DDP's reducer names its ranges by :func:`launch_label`). The teaching stages call their hook
plainly, and the ladder, which registers it, registers it as :func:`in_launch_range` (``hook``, inside
the range): so every trace of a stage the train command, the benchmark or a notebook builds carries the
ranges, while a learner's path has none of this.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.comm.default_hooks import allreduce_hook
    >>> from minddp.comm.grad_bucket import GradBucket
    >>> p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.full((3,), 2.0)
    >>> future = send(allreduce_hook, None, GradBucket(0, p.grad.view(-1), [p], is_last=True))
    >>> p.grad.copy_(future.wait().view_as(p.grad))       # the average, written back
    tensor([2., 2., 2.])
    >>> in_launch_range(allreduce_hook).__name__           # the same, as a hook: named as the one it calls
    'allreduce_hook'
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


def in_launch_range(hook):
    """``hook``, each call of it inside its named range (:func:`send`): what the ladder registers on a stage."""

    def sent(state, bucket):
        return send(hook, state, bucket)

    sent.__name__ = hook_name(hook)  # the user's hook's name, in a trace and in an error
    return sent
