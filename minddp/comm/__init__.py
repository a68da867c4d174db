"""The communication-hook layer: every stage talks to the network through it.

``hook(state, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]`` as
in torch. Modules mirror ``torch.distributed.algorithms.ddp_comm_hooks``:
:mod:`default_hooks`, :mod:`powerSGD_hook`, :mod:`debugging_hooks`.
"""

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.wire import traffic

__all__ = ["GradBucket", "traffic"]
