"""minddp: PyTorch's DistributedDataParallel, rebuilt stage by stage, readable and runnable.

Start with :mod:`minddp.stages` (the build-up), :mod:`minddp.comm` (the
comm hooks every stage uses) and :mod:`minddp.launch` (starting ranks).
"""

from minddp.launch import RankError, launch
from minddp.stages import (STAGES, AsyncBucketDDP, AsyncHookDDP, BucketDDP, DistributedDataParallel, GradAccumDDP,
                           HookDDP, SimpleDDP, build_stage)

__version__ = "0.1.0"

__all__ = ["launch", "RankError", "STAGES", "build_stage", "SimpleDDP", "GradAccumDDP", "HookDDP",
           "AsyncHookDDP", "BucketDDP", "AsyncBucketDDP", "DistributedDataParallel"]
