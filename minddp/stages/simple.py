"""Stage ``simple``: the same start, averaged gradients. The whole idea of data parallelism.

The first rung. Each rank holds a full copy of the model and trains on its own shard of the batch:

1. **same start**: at construction, rank 0's parameters and buffers are broadcast to every rank;
2. **same update**: after ``backward()``, :meth:`finish_gradient_synchronization` hands each
   gradient to the comm hook (by default: divide by the world size, all_reduce), waits, writes the
   average back.

The mean of the shards' gradients is the single-process gradient on the global batch, so every rank
takes the same step. Two checks (:mod:`minddp.stages.checks`) turn a model or a branch that differs
between ranks into an error on every rank. Later stages change *when* and *how much* is sent, never
*what*.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = SimpleDDP(torch.nn.Linear(4, 2))
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> model.finish_gradient_synchronization()        # every gradient is now the mean over ranks
    >>> model.module.bias.grad
    tensor([3., 3.])

Why each step, and the checks: ``docs/ladder.md``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.plain import allreduce_hook, broadcast
from minddp.debug.switch import attach
from minddp.stages.checks import ParameterUse, check_same_model


class SimpleDDP(nn.Module):
    """Broadcast at start, average every gradient after backward."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
        super().__init__()
        self.module = module
        self.process_group = process_group
        check_same_model(module, process_group)  # the broadcast below would not notice different models
        with torch.no_grad():  # 1. same start
            for tensor in [*module.parameters(), *module.buffers()]:
                broadcast(tensor, group_src=0, group=process_group)
        # How gradients travel: plain averaging unless another hook is registered (once, as torch allows).
        self.comm_hook, self.comm_state, self.hook_registered = allreduce_hook, process_group, False
        self.parameters_used = ParameterUse(module, process_group)
        attach(self)  # debug mode's checks, while it is on (minddp/debug); nothing when off

    def register_comm_hook(self, state, hook) -> None:
        """Send gradients through ``hook(state, bucket) -> Future[Tensor]`` instead of plain averaging; once."""
        if self.hook_registered:  # as torch's DDP: a second hook would silently replace the first
            raise RuntimeError("register_comm_hook can only be called once; build a new wrapper to use another hook")
        self.comm_hook, self.comm_state, self.hook_registered = hook, state, True

    def forward(self, *inputs, **kwargs):
        outputs = self.module(*inputs, **kwargs)
        self.parameters_used.saw(outputs)  # checked across ranks before the first gradient is sent
        return outputs

    def finish_gradient_synchronization(self) -> None:
        """Average every gradient across ranks (2. same update). Call after ``backward()``."""
        self.parameters_used.check()
        params = [p for p in self.module.parameters() if p.grad is not None]
        for index, param in enumerate(reversed(params)):  # backward made the last layers' first
            bucket = GradBucket(index, param.grad.reshape(-1), [param], is_last=index == len(params) - 1)
            average = self.comm_hook(self.comm_state, bucket).wait()
            param.grad.copy_(average.view_as(param.grad))
