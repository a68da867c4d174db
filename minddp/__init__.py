"""minddp: PyTorch's DistributedDataParallel, rebuilt stage by stage, readable and runnable.

Start with :mod:`minddp.stages` (the build-up, one idea per file),
:mod:`minddp.comm` (the comm hooks every stage sends through) and
:mod:`minddp.launch` (starting ranks); the production
:class:`DistributedDataParallel` lives in :mod:`minddp.ddp`. The sharded rungs after it
(ZeRO-1, ZeRO-2, FSDP) are in :mod:`minddp.sharding`; the rungs for slow links, which sync every H
steps instead of every step (:class:`LocalSGD`, :class:`DiLoCo`), in :mod:`minddp.diloco`.
"""

from minddp import debug  # debug mode: MINDDP_DEBUG=1 (read here) or minddp.debug.enable() (docs/debugging.md)
from minddp.ddp import DistributedDataParallel
from minddp.diloco import DiLoCo, LocalSGD
from minddp.ladder import STAGES, build_stage
from minddp.runtime.launch import RankError, launch
from minddp.sharding import FullyShardedDataParallel, Zero2DDP, ZeroRedundancyOptimizer
from minddp.stages import AsyncBucketDDP, AsyncHookDDP, BucketDDP, GradAccumDDP, HookDDP, SimpleDDP

__version__ = "0.1.0"

__all__ = [
    "debug",
    "launch",
    "RankError",
    "STAGES",
    "build_stage",
    "SimpleDDP",
    "GradAccumDDP",
    "HookDDP",
    "AsyncHookDDP",
    "BucketDDP",
    "AsyncBucketDDP",
    "DistributedDataParallel",
    "ZeroRedundancyOptimizer",
    "Zero2DDP",
    "FullyShardedDataParallel",
    "LocalSGD",
    "DiLoCo",
]
