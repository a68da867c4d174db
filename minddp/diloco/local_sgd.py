"""Rung ``local-sgd``: every replica trains alone for H steps, then the replicas average their weights.

Builds on ``simple``, with one change: what is averaged, and how often. ``simple`` averages every
gradient after every backward, so a slow link is paid every step; here each replica takes ``sync_every``
(H) optimizer steps on its own shard with no communication at all, and only then are the *weights*
averaged: H times fewer messages, each the size of the model.

1. **same start**: at construction rank 0's parameters and buffers are broadcast (``simple``'s step 1);
2. **inner steps**: the training loop is an ordinary one; a post-hook on its optimizer
   (``register_step_post_hook``, as torchft's ``LocalSGD``) counts the steps;
3. **average**: after every H-th step the trainable parameters go to the comm hook as one flat bucket
   (the default hook divides by the world size and sums: the mean) and the mean is copied back.

With plain SGD and H = 1 this is DDP (the mean of the replicas' steps is the step on the mean
gradient); with larger H the replicas drift apart between syncs, and that drift is what costs
accuracy (DiLoCo, the next rung, adds an outer optimizer to win it back). Only the parameters are
averaged, as torchft and torch's ``PeriodicModelAverager`` do: buffers (BatchNorm's statistics) stay
each replica's own. The change::

         def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
    +        self.hook_handle = optimizer.register_step_post_hook(self._after_step)  # step 2
    -    def finish_gradient_synchronization(self) -> None:
    +    def _after_step(self, optimizer, args, kwargs) -> None:
    +        if self.steps % self.sync_every == 0:
    -            bucket = GradBucket(index, param.grad.reshape(-1), [param], is_last=index == len(params) - 1)
    +        bucket = GradBucket(0, torch.cat([p.detach().reshape(-1) for p in params]), params, is_last=True)
    -            param.grad.copy_(average.view_as(param.grad))
    +            param.copy_(mean.view_as(param))

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = torch.nn.Linear(4, 2)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with LocalSGD(model, optimizer, sync_every=2) as local_sgd:
    ...     for step in range(4):                          # an ordinary loop
    ...         optimizer.zero_grad()
    ...         model(torch.ones(3, 4)).sum().backward()
    ...         optimizer.step()                           # after steps 2 and 4: the weights averaged
    >>> local_sgd.syncs, local_sgd.sent_bytes             # two syncs of 10 fp32 weights
    (2, 80)

More: ``docs/diloco.md``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.plain import allreduce_hook, broadcast
from minddp.comm.send import send
from minddp.debug.switch import attach
from minddp.diloco.fragments import check_not_sharded, check_optimizer, check_schedule, trainable
from minddp.stages.checks import check_same_model


class LocalSGD:
    """Average the weights every ``sync_every`` optimizer steps; a context manager around an ordinary loop.

    ``syncs`` counts the averages taken, ``sent_bytes`` the bytes handed to the comm hook (what the
    default hook sends; a compressing hook sends fewer, which a metered ``Wire`` counts). Leaving the
    ``with`` block removes the optimizer hook. ``same_start=False`` skips step 1 (no collective at
    construction): the replicas are built the same already (one seed, as torchft's ``init_sync=False``),
    or a fault-tolerant sync heals them (:mod:`minddp.ft.diloco`).
    """

    role = "the optimizer"  # how the messages name the optimizer it is given
    sharded = True  # each replica trains alone between syncs: debug mode compares its collectives only (minddp/debug)

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        sync_every: int,
        process_group: dist.ProcessGroup | None = None,
        *,
        same_start: bool = True,
    ):
        check_schedule(sync_every)  # before any collective: a bad value is the same error on every rank
        check_not_sharded(module, optimizer)
        self.module, self.optimizer, self.sync_every, self.process_group = module, optimizer, sync_every, process_group
        self.params = trainable(module)
        check_optimizer(optimizer, self.params, self.role, exact=False)
        if same_start:  # (False: built the same already, or healed by a fault-tolerant sync: minddp.ft.diloco)
            check_same_model(module, process_group)  # the broadcast below would not notice different models
            with torch.no_grad():  # step 1
                for tensor in [*module.parameters(), *module.buffers()]:
                    broadcast(tensor, group_src=0, group=process_group)
        self.comm_hook, self.comm_state, self.hook_registered = allreduce_hook, process_group, False
        self.steps = self.syncs = self.sent_bytes = 0
        self.hook_handle = optimizer.register_step_post_hook(self._after_step)  # step 2
        attach(self)  # debug mode's collective check, while it is on (minddp/debug); nothing when off

    def register_comm_hook(self, state, hook) -> None:
        """Send through ``hook(state, bucket) -> Future[Tensor]`` instead of plain averaging; once, as the stages."""
        if self.hook_registered:
            raise RuntimeError("register_comm_hook can only be called once; build a new one to use another hook")
        self.comm_hook, self.comm_state, self.hook_registered = hook, state, True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop syncing: the optimizer's hook is removed (what leaving the ``with`` block does)."""
        self.hook_handle.remove()

    def _after_step(self, optimizer, args, kwargs) -> None:
        """Step 3: after every ``sync_every``-th optimizer step, replace the weights by their mean over the replicas."""
        self.steps += 1
        if self.steps % self.sync_every == 0:
            with torch.no_grad():
                self._average(self.params)
            self.syncs += 1

    def _average(self, params: list[nn.Parameter]) -> None:
        bucket = GradBucket(0, torch.cat([p.detach().reshape(-1) for p in params]), params, is_last=True)
        self.sent_bytes += bucket.buffer().numel() * bucket.buffer().element_size()
        average = send(self.comm_hook, self.comm_state, bucket).wait()
        for param, mean in zip(params, average.split([p.numel() for p in params])):
            param.copy_(mean.view_as(param))

    def state_dict(self) -> dict:
        """Where the loop is in its period (steps since the start), and the counts: what a checkpoint needs."""
        return {"steps": self.steps, "syncs": self.syncs, "sent_bytes": self.sent_bytes}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.syncs, self.sent_bytes = state["steps"], state["syncs"], state["sent_bytes"]
