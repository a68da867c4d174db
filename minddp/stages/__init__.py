"""The build-up of data parallelism, one idea per file.

Read in this order; each class overrides only what its idea needs, and this
package holds only what a learner reads with them (the bucket plan, the checks,
the graph walk). The production ``ddp`` stage lives apart, in :mod:`minddp.ddp`,
where torch parity and speed may cost readability, and takes nothing from these
classes:

================  =============================  =======================================================
name              class                          the one idea it adds
================  =============================  =======================================================
``simple``        ``SimpleDDP``                  broadcast at start; average every grad after backward
``ga``            ``GradAccumDDP``               ``no_sync()``: skip the sync on accumulation steps
``hook``          ``HookDDP``                    sync each grad from an autograd hook, during backward
``hook-async``    ``AsyncHookDDP``               the same, without waiting: overlap
``bucket``        ``BucketDDP``                  one all_reduce per bucket of grads, not per grad
``bucket-async``  ``AsyncBucketDDP``             ``hook-async``'s change on buckets: sent while backward goes on
``ddp``           ``DistributedDataParallel``    torch's DDP, in its own package (:mod:`minddp.ddp`): drop-in,
                                                 automatic finish, rebuilt plan, unused parameters, bucket views
================  =============================  =======================================================

``single`` (no wrapper, one process) and ``torch`` (torch's own DDP) are the
baselines the train command and the tests compare against. The registry of
stages by name, and the one function that wraps a model in any of them, are
in :mod:`minddp.ladder`.
"""

from minddp.stages.bucket import BucketDDP
from minddp.stages.bucket_async import AsyncBucketDDP
from minddp.stages.bucket_plan import plan_buckets
from minddp.stages.grad_accum import GradAccumDDP
from minddp.stages.hook import HookDDP
from minddp.stages.hook_async import AsyncHookDDP
from minddp.stages.simple import SimpleDDP

__all__ = ["plan_buckets", "SimpleDDP", "GradAccumDDP", "HookDDP", "AsyncHookDDP", "BucketDDP", "AsyncBucketDDP"]
