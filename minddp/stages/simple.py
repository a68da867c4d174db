"""Stage ``simple``: same start, averaged gradients. The whole idea of data parallelism.

Each rank holds a full copy of the model and trains on its own shard of the
global batch. Two things keep the copies identical:

1. **same start**: at construction, rank 0's parameters and buffers are
   broadcast to every rank (random init differs per process otherwise);
2. **same update**: after ``loss.backward()`` every rank holds the gradient
   of *its* shard; :meth:`finish_gradient_synchronization` replaces it by the
   mean over ranks (an all_reduce of the sum, divided by the world size).
   Since the global-batch loss is the mean of the shard losses, that mean
   gradient is exactly the single-process gradient on the global batch, and
   every rank's optimizer takes the same step.

Nothing overlaps here: all communication starts after backward has ended.
And nothing can be skipped: with several micro-batches per optimizer step
this stage must be synced after each backward (:func:`minddp.loop.train_step`
does so for a wrapper without ``no_sync()``); :mod:`grad_accum` adds the
``no_sync()`` that sends only once per step.
Later stages change *when* and *how much* is sent, never *what*.

This class also holds what every stage shares: the wrapped ``.module``, the
comm-hook plumbing (:meth:`register_comm_hook`), the parameter list, and the
misuse checks of :mod:`minddp.stages.checks` (the same model on every rank,
checked before the broadcast; the same hook and buckets, checked before the
first gradient is sent; no ``optimizer.step()`` with work in flight; and,
with ``check_finite``, no NaN/Inf gradient).

Example::

    >>> model = SimpleDDP(torch.nn.Linear(4, 2))
    >>> model(x).sum().backward()
    >>> model.finish_gradient_synchronization()   # grads are now averaged
    >>> optimizer.step()
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm import hook_runner, wire
from minddp.comm.default_hooks import builtin_allreduce_hook
from minddp.comm.grad_bucket import GradBucket
from minddp.stages import checks


def broadcast_module_state(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Overwrite every parameter and buffer with rank 0's copy."""
    src = wire.src_rank(group)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src, group=group)


def check_not_wrapped(module: nn.Module, wrapper: nn.Module) -> None:
    """A module wrapped twice would sync every gradient twice: refuse it."""
    owner = getattr(module, "_minddp_wrapper", None)
    if owner is not None and owner() is not None:
        raise RuntimeError(
            f"this {type(module).__name__} is already wrapped by {type(owner()).__name__}; "
            "wrap a model once (use the existing wrapper, or wrap a fresh copy of the model)"
        )
    object.__setattr__(module, "_minddp_wrapper", weakref.ref(wrapper))


class SimpleDDP(nn.Module):
    """Broadcast at start, average every gradient after backward."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
        super().__init__()
        self.module = module
        self.process_group = wire.resolve_group(process_group)
        self.world_size = dist.get_world_size(self.process_group)
        # model.parameters() yields a tied (shared) tensor once, so it is synced once;
        # frozen parameters have no gradient to sync.
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._param_names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
        # No hook registered: the built-in average (allreduce_hook's math, no callback on the comm thread).
        self._comm_hook, self._comm_state = builtin_allreduce_hook, self.process_group
        self._hook_registered = False
        #: Set ``wire``'s meter to also measure ||g - ĝ|| / ||g|| (costs an extra all_reduce).
        self.measure_compression_error = False
        #: Raise on every rank when an averaged gradient holds NaN/Inf (``MINDDP_CHECK_FINITE=1``).
        self.check_finite = checks.finite_check_enabled()
        self._settings_checked = False
        check_not_wrapped(module, self)
        # A broadcast between different models would fail obscurely or hang: compare first.
        checks.verify_replicas(module, self.process_group)
        broadcast_module_state(module, self.process_group)            # step 1
        checks.guard_optimizer_step(self)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- the comm hook layer --------------------------------------------------

    def register_comm_hook(self, state, hook) -> None:
        """Use ``hook(state, bucket) -> Future[Tensor]`` instead of plain averaging.

        As in torch: register once, before the first backward.
        """
        hook_runner.check_hook(hook)
        if self._hook_registered:
            raise RuntimeError(
                "register_comm_hook can only be called once; build a new wrapper to use another hook"
            )
        self._comm_hook, self._comm_state, self._hook_registered = hook, state, True

    def _launch(self, bucket: GradBucket) -> hook_runner.PendingBucket:
        if not self._settings_checked:  # once, before the first collective of the first sync
            checks.check_same_settings(self._sync_settings(), self.process_group)
            self._settings_checked = True
        local_finite = bool(torch.isfinite(bucket.buffer()).all()) if self.check_finite else True
        pending = hook_runner.launch(self._comm_hook, self._comm_state, bucket, self.process_group,
                                     self.measure_compression_error)
        if self.check_finite:
            names = [self._param_names.get(id(p), "?") for p in bucket.parameters()]
            pending.check = checks.finite_check(bucket.index(), names, local_finite,
                                                dist.get_rank(self.process_group))
        return pending

    def _sync_settings(self) -> dict:
        """What all ranks must agree on to pair their collectives: stage, hook, bucket sizes."""
        return {"stage": type(self).__name__,
                "hook": getattr(self._comm_hook, "__name__", type(self._comm_hook).__name__),
                "hook state": checks.describe_hook_state(self._comm_state),
                "bucket sizes": [layout.numel for layout in getattr(self, "_layouts", [])],
                # the cap too: ddp's first-iteration plan is one bucket whatever the cap, its rebuild is not
                "bucket_cap_mb": getattr(self, "bucket_cap_mb", None)}

    def _unsynced_work(self) -> str | None:
        """What is still in flight, in words (None: nothing); stages that launch early override it."""
        return None

    def _param_bucket(self, param: nn.Parameter, index: int) -> GradBucket:
        """A bucket of one parameter whose buffer *is* its gradient, viewed flat."""
        grad = param.grad
        if not grad.is_contiguous():  # rare (custom autograd functions); keep the view trick honest
            param.grad = grad = grad.contiguous()
        return GradBucket(index, grad.view(-1), [param], is_last=index == len(self._params) - 1)

    # -- the sync -------------------------------------------------------------

    def _should_sync(self) -> bool:
        return True

    def finish_gradient_synchronization(self) -> None:
        """Average every gradient across ranks (step 2). Call after ``backward()``."""
        if not self._should_sync():
            return
        for index, param in enumerate(reversed(self._params)):  # backward produces the last layers first
            if param.grad is not None:
                hook_runner.complete(self._launch(self._param_bucket(param, index)))
