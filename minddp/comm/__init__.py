"""The communication-hook layer: every stage talks to the network through it.

``hook(state, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]`` as
in torch. Modules mirror ``torch.distributed.algorithms.ddp_comm_hooks``:
:mod:`default_hooks`, :mod:`powerSGD_hook`, :mod:`debugging_hooks`;
:mod:`registry` names them for the CLI, :mod:`wire` meters and reroutes what they send.
The teaching stages import only :mod:`plain` (``broadcast``, the default
``allreduce_hook``) and :mod:`grad_bucket`; :mod:`send` is the named profiler
range the ladder wraps their hook in: ``docs/layout.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import DistributedDataParallel
    >>> from minddp.comm.powerSGD_hook import PowerSGDState, powerSGD_hook
    >>> ddp = DistributedDataParallel(torch.nn.Linear(16, 16))
    >>> ddp.register_comm_hook(PowerSGDState(None, start_powerSGD_iter=2), powerSGD_hook)
    >>> ddp(torch.ones(2, 16)).sum().backward()      # averaged by the hook, inside backward
"""

# The hook modules themselves, as in torch: ``from minddp.comm import powerSGD_hook as powerSGD``
# then ``powerSGD.PowerSGDState`` / ``powerSGD.powerSGD_hook``.
from minddp.comm import debugging_hooks, default_hooks, powerSGD_hook  # noqa: E402  (modules)
from minddp.comm.grad_bucket import GradBucket
from minddp.comm.powerSGD_hook import PowerSGDState
from minddp.comm.registry import hook_names, make_hook
from minddp.comm.wire import Traffic, Wire

__all__ = [
    "GradBucket",
    "Traffic",
    "Wire",
    "hook_names",
    "make_hook",
    "PowerSGDState",
    "default_hooks",
    "powerSGD_hook",
    "debugging_hooks",
]
