"""What ``torch.compile`` sees of a stage: its own lines run eagerly, its module compiled, cut where buckets fill.

A wrapper's forward is bookkeeping (does this backward sync, which parameters did it use) around one
call of the user's module; the gradients travel during backward. Under ``torch.compile``, in either
pattern (``stage(torch.compile(model))``, as nanoGPT does, or ``torch.compile(stage)``):

1. **the wrapper's own lines run eagerly** (:func:`eager_under_compile`, at construction): Dynamo
   skips its ``forward`` frames and compiles the frames they call, the module's; what else they call
   (the graph walk) is marked ``compat.run_eagerly``, as torch's DDP marks its forward's context. So
   ``torch.compile(stage)`` has no graph break of minddp's making;
2. **the compiled graph is cut where buckets fill** (:func:`split_at_buckets`, around the module's
   call): a compiled graph's backward is *one* autograd node, which hands over every gradient at its
   end, so no bucket could be sent before all of backward is done. Dynamo cuts the graph into pieces
   of about ``bucket_cap_mb`` of parameters, counted in reverse order of use (its ``DDPOptimizer``,
   ``torch/_dynamo/backends/distributed.py``), and compiles each piece apart: each piece's backward
   hands over its gradients, their buckets are sent, and the earlier pieces' backward runs meanwhile.
   Dynamo does this while a DDP module is *active* (torch's DDP marks itself so during its forward);
   a minddp stage marks its bucket size the same way.

torch's DDPOptimizer makes its first piece 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``,
the first bucket of torch's DDP at its default cap), whatever the cap, and refuses a ``bucket_cap_mb``
below that. minddp makes each piece the size of a bucket, the first one included, so bucket *k* is
full when piece *k*'s backward ends. Where the pieces fall and why: ``docs/ddp.md`` (*Compiled*).

Example (what Dynamo reads while the stage's module runs)::

    >>> from torch.nn.parallel import DistributedDataParallel as TorchDDP
    >>> with split_at_buckets(bucket_cap_mb=0.25):
    ...     TorchDDP._get_active_ddp_module().bucket_bytes_cap, torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    (262144, 262144)
    >>> TorchDDP._get_active_ddp_module() is None       # only during the call
    True
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp.runtime import compat
from minddp.stages.bucket_plan import MB


def eager_under_compile(wrapper: nn.Module) -> None:
    """Step 1: Dynamo skips the frames of the wrapper's own ``forward`` methods and compiles the frames they call."""
    for cls in type(wrapper).__mro__:
        if cls.__module__.startswith("minddp.") and "forward" in vars(cls):
            compat.skip_frames(vars(cls)["forward"])


@contextlib.contextmanager
def split_at_buckets(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None = None):
    """Step 2: while the module runs, Dynamo cuts each graph it compiles into pieces the size of the buckets.

    ``bucket_cap_mb`` as the stage's buckets, ``first_bucket_cap_mb`` its first bucket's (``None``: the
    same); ``bucket_cap_mb=None`` (one bucket) cuts nothing. A module that is not compiled sees no change.
    """
    if bucket_cap_mb is None:
        yield
        return
    cap = int(bucket_cap_mb * MB)  # whole bytes, as the buckets (bucket_plan.py)
    first = cap if first_bucket_cap_mb is None else int(first_bucket_cap_mb * MB)
    before = TorchDDP._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES
    TorchDDP._active_ddp_module = SimpleNamespace(bucket_bytes_cap=cap)  # all Dynamo reads of torch's DDP
    dist._DEFAULT_FIRST_BUCKET_BYTES = first  # DDPOptimizer's first piece: the first bucket, as the others
    try:
        yield
    finally:
        TorchDDP._active_ddp_module, dist._DEFAULT_FIRST_BUCKET_BYTES = before


def is_compiled(module: nn.Module) -> bool:
    """Is ``module`` a ``torch.compile(model)``? Dynamo then traces the hooks of the modules inside it too."""
    from torch._dynamo.eval_frame import OptimizedModule  # imported by torch.compile already, if it is one

    return isinstance(module, OptimizedModule)
