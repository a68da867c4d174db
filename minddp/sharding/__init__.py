"""The sharded rungs after DDP: keep only a part of the model state on each rank.

(The table of rungs is completed as they are added.)
"""

from minddp.sharding.fsdp import FullyShardedDataParallel
from minddp.sharding.zero1 import ZeroRedundancyOptimizer
from minddp.sharding.zero2 import Zero2DDP

__all__ = ["ZeroRedundancyOptimizer", "Zero2DDP", "FullyShardedDataParallel"]
