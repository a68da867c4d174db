"""``minddp.DistributedDataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Built the way torch builds it: a module that owns a
:class:`~minddp.ddp.reducer.Reducer` (composition, not a subclass of the
teaching stages). The teaching stages show one idea each; this class puts
them together with what a real training script needs, each part mapped to
the stage that introduced the idea (``docs/ddp.md`` has the full map):

1. **construction**: check that every rank holds the same model
   (:func:`~minddp.stages.checks.check_same_model`, as in ``simple``), then
   broadcast rank 0's parameters and buffers (``simple``'s step 1); the
   reducer plans buckets (``bucket``) starting from torch's first-iteration
   plan (``bucket_cap_mb=None`` = 25 MiB with a 1 MiB first bucket);
2. **forward**: raise if the previous backward left gradients unreduced
   (torch's "Expected to have finished reduction..."); at the first forward
   after the first synced backward, rebuild the plan from the observed
   gradient order; broadcast buffers from rank 0 (``broadcast_buffers``, once
   per step, coalesced); decide whether the coming backward syncs
   (``no_sync()``, as ``ga``), and with ``find_unused_parameters`` find the
   parameters its graph will not reach;
3. **backward**: the reducer's autograd hooks (``hook``) fill buckets and
   send them in order while backward goes on (``bucket-async``), and its
   end-of-backward callback waits for them and writes the averages back,
   all inside ``loss.backward()``: a plain ``loss.backward();
   optimizer.step()`` loop needs no extra call.

:meth:`finish_gradient_synchronization` exists, as a no-op, so loops written
for the teaching stages run unchanged.

Example::

    >>> model = minddp.DistributedDataParallel(net)        # as torch.nn.parallel.DistributedDataParallel
    >>> loss_fn(model(x), y).backward()                     # gradients averaged when this returns
    >>> optimizer.step()
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.wire import resolve_group
from minddp.ddp.buffers import broadcast_coalesced
from minddp.ddp.reducer import Reducer
from minddp.envflags import env_flag
from minddp.stages.checks import check_same_model

DEFAULT_BUCKET_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_CAP_MB = 1.0


class DistributedDataParallel(nn.Module):
    """torch's DDP: same constructor, same behaviour (module doc, steps 1-3)."""

    def __init__(self, module: nn.Module, device_ids=None, output_device=None, broadcast_buffers: bool = True,
                 process_group: dist.ProcessGroup | None = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 check_consistency: bool | None = None):
        super().__init__()
        group = resolve_group(process_group)
        self._device = _check_devices(module, device_ids, output_device)
        _check_not_wrapped(module, self)
        self.module = module
        self.process_group = group
        self.device_ids, self.output_device = device_ids, output_device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        check_same_model(module, group)                                                     # step 1
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, group_src=0, group=group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.reducer = Reducer([p for _, p in named], [n for n, _ in named], group, self.bucket_cap_mb,
                               DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else None,
                               find_unused_parameters, gradient_as_bucket_view)
        #: Per-step cross-rank check of plan and launch order (None: on when MINDDP_DEBUG=1).
        self.check_consistency = env_flag("MINDDP_DEBUG") if check_consistency is None else check_consistency
        #: Raise on every rank when an averaged gradient holds NaN/Inf (``MINDDP_CHECK_FINITE=1``).
        self.check_finite = env_flag("MINDDP_CHECK_FINITE")

    # Settings the reducer reads mid-backward live on it (plain attributes, no nn.Module __setattr__ cost).
    check_consistency = property(lambda self: self.reducer.check_consistency,
                                 lambda self, on: setattr(self.reducer, "check_consistency", bool(on)))
    check_finite = property(lambda self: self.reducer.check_finite,
                            lambda self, on: setattr(self.reducer, "check_finite", bool(on)))

    @property
    def bucket_plan(self) -> list[list[int]]:
        """The current buckets, as indices into the trainable parameters (``module.parameters()`` order)."""
        return self.reducer.plan

    def register_comm_hook(self, state, hook) -> None:
        """Send buckets through ``hook(state, bucket) -> Future[Tensor]`` (torch's signature); once, before training."""
        self.reducer.register_comm_hook(state, hook)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally for the backwards of forwards run inside (as ``ga``)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        """Step 2, then the module's forward."""
        reducer = self.reducer
        will_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if will_sync:
            reducer.check_prior_reduction_finished()
        if torch.is_grad_enabled():      # also a no_sync() forward, as torch: the rebuild comes at the same step
            reducer.maybe_rebuild()
        if self.broadcast_buffers and self.process_group.size() > 1 and self.require_forward_param_sync:
            broadcast_coalesced(list(self.module.buffers()), self.process_group)
        self.require_forward_param_sync = will_sync   # torch's rule: next forward broadcasts only after a sync
        if self.device_ids:
            inputs, kwargs = _to_device((inputs, kwargs), self._device)
        outputs = self.module(*inputs, **kwargs)
        if will_sync:
            reducer.prepare_for_backward(outputs)
        return outputs

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to do: the end-of-backward callback already did it (kept for shared loops)."""
        self.reducer.wait_and_write_back()

    def _unsynced_work(self) -> str | None:
        return "bucket all_reduces are still in flight" if self.reducer.work_in_flight() else None


def _check_not_wrapped(module: nn.Module, wrapper: nn.Module) -> None:
    """A module wrapped twice would sync every gradient twice: refuse it."""
    owner = getattr(module, "_minddp_wrapper", None)
    if owner is not None and owner() is not None:
        raise RuntimeError(
            f"this {type(module).__name__} is already wrapped by {type(owner()).__name__}; "
            "wrap a model once (use the existing wrapper, or wrap a fresh copy of the model)"
        )
    object.__setattr__(module, "_minddp_wrapper", weakref.ref(wrapper))


def _check_devices(module: nn.Module, device_ids, output_device) -> torch.device:
    """The module's one device; device_ids/output_device only make sense for a single-GPU module."""
    devices = {p.device for p in module.parameters()}
    if len(devices) > 1:
        raise ValueError(f"minddp.DistributedDataParallel wraps single-device modules, but the parameters are on "
                         f"{sorted(map(str, devices))}: move the module to one device (one GPU per rank)")
    device = devices.pop() if devices else torch.device("cpu")
    if device.type == "cpu" and (device_ids is not None or output_device is not None):
        raise ValueError(f"device_ids and output_device only work with GPU modules, but got device_ids={device_ids}, "
                         f"output_device={output_device} for a module on the CPU: leave both as None")
    if device_ids is not None:
        wanted = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in device_ids]
        if wanted != [device]:
            raise ValueError(f"device_ids must be the one device the module is on ([{device}]), got {device_ids}: "
                             "move the module to this rank's GPU first (module.to(local_rank))")
    return device


def _to_device(obj, device: torch.device):
    """Tensors in nested tuples/lists/dicts moved to ``device`` (torch's DDP moves inputs to device_ids[0])."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
