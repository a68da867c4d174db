"""The communication-hook layer: every stage talks to the network through it.

``hook(state, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]`` as
in torch. Modules mirror ``torch.distributed.algorithms.ddp_comm_hooks``:
:mod:`default_hooks`, :mod:`powerSGD_hook`, :mod:`debugging_hooks`;
:mod:`registry` names them for the CLI, :mod:`wire` meters what they send.

Example::

    >>> from minddp.comm import powerSGD_hook as powerSGD
    >>> ddp.register_comm_hook(powerSGD.PowerSGDState(None, start_powerSGD_iter=2), powerSGD.powerSGD_hook)

or, to count what a hook sends, a :class:`Wire` with a :class:`Traffic` meter as its state::

    >>> from minddp.comm import Traffic, Wire, default_hooks
    >>> traffic = Traffic()
    >>> ddp.register_comm_hook(Wire(None, traffic=traffic), default_hooks.allreduce_hook)
    >>> train_step(...); traffic.calls, traffic.bytes        # collectives and bytes this rank sent
"""

# The hook modules themselves, as in torch: ``from minddp.comm import powerSGD_hook as powerSGD``
# then ``powerSGD.PowerSGDState`` / ``powerSGD.powerSGD_hook``.
from minddp.comm import debugging_hooks, default_hooks, powerSGD_hook  # noqa: E402  (modules)
from minddp.comm.grad_bucket import GradBucket
from minddp.comm.powerSGD_hook import PowerSGDState
from minddp.comm.registry import hook_names, make_hook
from minddp.comm.wire import Traffic, Wire

__all__ = ["GradBucket", "Traffic", "Wire", "hook_names", "make_hook", "PowerSGDState",
           "default_hooks", "powerSGD_hook", "debugging_hooks"]
