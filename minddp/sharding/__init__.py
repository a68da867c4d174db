"""The sharded rungs after DDP: keep only a part of the model state on each rank.

(The table of rungs is completed as they are added.)
"""

from minddp.sharding.zero1 import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
