"""What ``torch.compile`` sees of a bucketed stage: its bookkeeping run as Python, its module compiled and cut.

1. :func:`eager_under_compile`, at construction: Dynamo skips the frames of the wrapper's ``forward``
   methods (its bookkeeping; the graph walk they call is ``torch._disable_dynamo``'s) and compiles the
   frames they call, the module's: ``torch.compile(stage)`` has no graph break of minddp's making;
2. :func:`split_at_buckets`, around the module's call: a compiled backward is one autograd node that
   hands over every gradient at its end, so Dynamo's ``DDPOptimizer`` cuts the graph into pieces of a
   bucket each, compiled apart, as it does for torch's DDP: while the module runs, the stage is the
   *active DDP module* Dynamo reads ``bucket_bytes_cap`` from. Each piece's backward then hands over its
   bucket, sent while the pieces before it compute. torch makes the first piece 1 MiB whatever the cap
   (and refuses a smaller cap); here the first piece is the first bucket, so bucket *k* is full when
   piece *k*'s backward ends.

Why, and the limits: ``docs/ddp.md`` (*Compiled*).

Example (what Dynamo reads while the stage's module runs)::

    >>> from torch.nn.parallel import DistributedDataParallel as TorchDDP
    >>> with split_at_buckets(bucket_cap_mb=0.25):
    ...     TorchDDP._get_active_ddp_module().bucket_bytes_cap, torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    (262144, 262144)
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp.stages.bucket_plan import MB


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


def is_compiled(module: nn.Module) -> bool:
    """Is ``module`` a ``torch.compile(model)``? Dynamo then traces the hooks of the modules inside it too."""
    from torch._dynamo.eval_frame import OptimizedModule  # imported by torch.compile already, if it is one

    return isinstance(module, OptimizedModule)
