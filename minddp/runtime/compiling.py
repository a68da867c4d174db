"""What ``torch.compile`` sees of a wrapper: its forward run as Python, its module compiled and cut.

1. :func:`eager_under_compile` (at construction): Dynamo skips the wrapper's ``forward`` frames and compiles
   what they call, the module: no graph break of minddp's making in ``torch.compile(wrapper)``;
2. :func:`split_at_buckets` (around the module's call): Dynamo's ``DDPOptimizer`` cuts the compiled graph
   into pieces of a bucket each, as for torch's DDP, so each bucket is sent once its piece's backward ends.

Torch-level mechanism (Dynamo's frame skip, the active DDP module Dynamo reads), so it lives in the
runtime, below every wrapper, and knows none of them: ``ddp`` and ``zero2`` take both steps themselves;
the teaching stages stay plain (their files show the idea, not this) and
:func:`minddp.ladder.compile_ready` gives one both steps, called by :func:`minddp.ladder.build_stage` when
the module it wraps is compiled (as ``--compile`` does).

Why, and the limits: ``docs/ddp.md`` (*Compiled*). Example::

    >>> with split_at_buckets(bucket_cap_mb=0.25):     # what Dynamo reads while the module runs
    ...     torch.nn.parallel.DistributedDataParallel._get_active_ddp_module().bucket_bytes_cap
    262144
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

MB = 1024 * 1024  # the caps are in MiB, as every wrapper takes them


def eager_under_compile(wrapper: nn.Module) -> None:
    """Step 1: Dynamo runs the wrapper's own ``forward`` frames as Python and compiles the frames they call."""
    from torch._dynamo.decorators import skip  # Dynamo takes seconds to import: not before a wrapper is built

    for cls in type(wrapper).__mro__:
        if cls.__module__.startswith("minddp.") and "forward" in vars(cls):
            skip(vars(cls)["forward"])  # recursive=False's skip: this code's frames only


@contextlib.contextmanager
def split_at_buckets(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None = None):
    """Step 2: while the module runs, Dynamo cuts each graph it compiles into pieces the size of the buckets.

    ``first_bucket_cap_mb``: the first bucket's (``None``: as the others); ``bucket_cap_mb=None`` (one
    bucket) cuts nothing. A module that is not compiled sees no change.
    """
    if bucket_cap_mb is None:
        yield
        return
    before = TorchDDP._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES
    TorchDDP._active_ddp_module = SimpleNamespace(bucket_bytes_cap=int(bucket_cap_mb * MB))  # all Dynamo reads
    dist._DEFAULT_FIRST_BUCKET_BYTES = int((first_bucket_cap_mb or bucket_cap_mb) * MB)  # DDPOptimizer's first
    try:
        yield
    finally:
        TorchDDP._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES = before
