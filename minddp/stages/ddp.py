"""Stage ``ddp``: ``minddp.DistributedDataParallel``, a drop-in for torch's DDP.

:mod:`bucket_async` already sends buckets during backward. What a real
training script needs on top, this class adds, each idea in its own module:

1. **construction** (:mod:`ddp_guard`): check that every rank holds the same
   parameters (names, shapes, dtypes), then broadcast rank 0's parameters and
   buffers; start from torch's first-iteration plan (one bucket, or with
   ``find_unused_parameters`` buckets filled in registration order;
   ``bucket_cap_mb=None`` = 25 MiB with a 1 MiB first bucket);
2. **forward**: raise if the previous backward left gradients unreduced
   (torch's "Expected to have finished reduction..."); at the first forward
   after the first synced backward (a ``no_sync()`` one too, as in torch)
   rebuild the plan once from the observed gradient-ready order
   (:mod:`ddp_rebuild`); broadcast buffers from rank 0 (``broadcast_buffers``,
   once per step and coalesced, :mod:`ddp_buffers`);
   with ``find_unused_parameters`` walk the graph from the outputs to find the
   parameters this backward will not reach (:mod:`ddp_unused`);
3. **first gradient hook of a backward**: queue the end-of-backward callback
   (:mod:`autograd_callback`) and mark the unused parameters ready;
4. **each full bucket** is launched only once every lower-index bucket has
   been: every rank issues its collectives in the same order, so no rank can
   pair bucket 2 with another rank's bucket 1;
5. **end of backward** (automatic, inside ``loss.backward()``): launch any
   bucket that never filled (zeros for the missing gradients, so no rank
   waits for ever), agree on globally unused parameters (bitmap all_reduce),
   run the consistency guard in debug mode, wait for every bucket and write
   the averages back. With ``gradient_as_bucket_view`` the ``.grad`` tensors
   *are* views into the bucket buffers, so nothing is copied back.

:meth:`finish_gradient_synchronization` stays, as a no-op after step 5, so
loops written for the earlier stages run unchanged; ``no_sync()`` and
``register_comm_hook`` come from the earlier stages.

Example::

    >>> model = minddp.DistributedDataParallel(net)        # as torch.nn.parallel.DistributedDataParallel
    >>> loss_fn(model(x), y).backward()                     # gradients averaged when this returns
    >>> optimizer.step()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm import wire
from minddp.stages.autograd_callback import at_end_of_backward
from minddp.stages.bucket import BackwardProgress
from minddp.stages.bucket_async import AsyncBucketDDP
from minddp.stages.bucket_plan import plan_first_iteration_like_torch
from minddp.stages.ddp_buffers import broadcast_coalesced
from minddp.stages.ddp_guard import check_consistency, debug_enabled
from minddp.stages.ddp_rebuild import agree_on_order, plan_from_order
from minddp.stages.ddp_unused import globally_used, params_in_graph

DEFAULT_BUCKET_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_CAP_MB = 1.0


class DDPProgress(BackwardProgress):
    """A backward's progress, plus what steps 3-5 need: has it started, which buckets filled and went."""

    def __init__(self, layouts):
        super().__init__(layouts)
        self.started = False                      # step 3 done for this backward
        self.filled = [False] * len(layouts)      # bucket b has all its gradients
        self.next_bucket = 0                      # the lowest-index bucket not launched yet
        self.launched: list[int] = []             # launch order (read by the consistency check)


class DistributedDataParallel(AsyncBucketDDP):
    """torch's DDP semantics on top of :class:`AsyncBucketDDP` (module doc, steps 1-5)."""

    progress_type = DDPProgress

    def __init__(self, module: nn.Module, device_ids=None, output_device=None, broadcast_buffers: bool = True,
                 process_group: dist.ProcessGroup | None = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 check_consistency: bool | None = None):
        group = wire.resolve_group(process_group)
        self._device = _check_devices(module, device_ids, output_device)
        # Read by the base class constructor (the static plan), so set before it runs.
        self.first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else None
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        # step 1: the base constructor checks the replicas agree, then broadcasts rank 0's state
        super().__init__(module, group, DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb)
        self.device_ids, self.output_device = device_ids, output_device
        self.broadcast_buffers = broadcast_buffers
        self.require_forward_param_sync = True
        #: Per-step cross-rank check of plan and launch order (None: on when MINDDP_DEBUG=1).
        self.check_consistency = debug_enabled() if check_consistency is None else check_consistency
        self._position = {id(p): i for i, p in enumerate(self._params)}
        self._local_used = torch.zeros(len(self._params), dtype=torch.bool)
        self._unused_here: list[nn.Parameter] = []     # not in this forward's graph (find_unused)
        self._ready_order: list[int] = []              # first synced backward's gradient-ready order
        self._synced_steps = 0
        self._has_rebuilt_buckets = False
        self._unfinished: list[str] = []               # parameters left without gradient last time

    def _static_plan(self) -> list[list[int]]:
        """torch's first-iteration plan (step 1), so that even the first step rounds like torch's DDP."""
        return plan_first_iteration_like_torch(self._params, self.bucket_cap_mb, self.first_bucket_cap_mb,
                                               self.find_unused_parameters)

    # -- step 2: forward --------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        will_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if will_sync:
            self._ensure_prior_reduction_finished()
        if torch.is_grad_enabled():      # also a no_sync() forward, as torch: the rebuild comes at the same step
            self._maybe_rebuild_buckets()
        if self.broadcast_buffers and self.world_size > 1 and self.require_forward_param_sync:
            broadcast_coalesced(list(self.module.buffers()), self.process_group)       # (ddp_buffers)
        self.require_forward_param_sync = will_sync   # torch's rule: next forward broadcasts only after a sync
        if self.device_ids:
            inputs, kwargs = _to_device((inputs, kwargs), self._device)
        outputs = super().forward(*inputs, **kwargs)
        if will_sync and self.find_unused_parameters:
            used = params_in_graph(outputs)
            self._unused_here = [p for p in self._params if id(p) not in used]
        return outputs

    def _ensure_prior_reduction_finished(self) -> None:
        if self._unfinished:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. "
                "Your module has parameters that were not used in producing loss: "
                f"{self._unfinished} received no gradient on rank {dist.get_rank(self.process_group)}. "
                "Pass find_unused_parameters=True to minddp.DistributedDataParallel (as to torch's), or make "
                "every parameter contribute to the loss (make sure all forward outputs are used in it)"
            )

    def _maybe_rebuild_buckets(self) -> None:
        # Same decision on every rank: it depends only on how many synced steps finished.
        if self._has_rebuilt_buckets or self.find_unused_parameters or self._synced_steps == 0:
            return
        self._has_rebuilt_buckets = True
        order = agree_on_order(self._ready_order, len(self._params), self.process_group)
        if order is not None:
            self._set_plan(plan_from_order(self._params, order, self.bucket_cap_mb, self.first_bucket_cap_mb))

    def _set_plan(self, plan: list[list[int]]) -> None:
        super()._set_plan(plan)
        if self.gradient_as_bucket_view:
            # New buffers: move existing gradients into them, so .grad keeps being a bucket view.
            for layout, flat in zip(self._layouts, self._bucket_buffers):
                flat.zero_()
                for param, view in zip(layout.params, layout.views(flat)):
                    if param.grad is not None:
                        view.copy_(param.grad)
                        param.grad = view

    # -- steps 3 and 4: during backward -----------------------------------------

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if self.find_unused_parameters:   # only read then; a tensor write per gradient is not free
            self._local_used[self._position[id(param)]] = True   # no_sync backwards count as use too
        super()._on_grad_ready(param)

    def _grad_ready(self, param: nn.Parameter) -> None:
        if not self._progress.started:                                                  # step 3
            self._progress.started = True
            at_end_of_backward(self._finalize_backward)
            for unused in self._unused_here:
                super()._grad_ready(unused)
        if self._synced_steps == 0:          # the first synced backward's order feeds the rebuild
            self._ready_order.append(self._position[id(param)])
        super()._grad_ready(param)

    def _bucket_filled(self, b: int) -> None:
        progress = self._progress
        progress.filled[b] = True                                                       # step 4
        while progress.next_bucket < len(self._layouts) and progress.filled[progress.next_bucket]:
            progress.launched.append(progress.next_bucket)
            self._launch_bucket(progress.next_bucket)
            progress.next_bucket += 1

    def _launch_bucket(self, b: int) -> None:
        super()._launch_bucket(b)
        if self.gradient_as_bucket_view:
            layout = self._layouts[b]
            for param, view in zip(layout.params, layout.views(self._bucket_buffers[b])):
                if param.grad is not None:
                    param.grad = view      # the reduction lands in .grad directly: no copy back

    # -- step 5: end of backward ------------------------------------------------

    def _finalize_backward(self) -> None:
        """Run by autograd at the end of each synced backward (see :mod:`autograd_callback`)."""
        progress = self._progress
        unfinished = [b for b, filled in enumerate(progress.filled) if not filled]
        missing = [self._param_names[id(p)] for b in unfinished for p in self._layouts[b].params
                   if id(p) not in progress.ready]
        for b in unfinished:
            self._bucket_filled(b)        # zeros for the missing gradients: every rank sends every bucket
        if self.find_unused_parameters:
            self._give_grads_to_globally_used()
        if self.check_consistency:
            check_consistency(self.bucket_plan, [layout.numel for layout in self._layouts], progress.launched,
                              [self._param_names[id(p)] for p in self._params], self.process_group)
        self._unfinished = missing        # raised at the next forward, like torch
        self._reset_readiness()
        self._unused_here = []
        super().finish_gradient_synchronization()   # wait for every bucket, write averages back
        self._synced_steps += 1

    def _give_grads_to_globally_used(self) -> None:
        """A parameter another rank used gets the average here too; one nobody used keeps its .grad."""
        used = globally_used(self._local_used, self.process_group)
        self._local_used.zero_()
        for i, param in enumerate(self._params):
            if used[i] and param.grad is None:
                if not self.gradient_as_bucket_view:
                    param.grad = torch.zeros_like(param)    # the average is copied into it
                    continue
                b = self._bucket_of[id(param)]
                slot = next(k for k, p in enumerate(self._layouts[b].params) if p is param)
                param.grad = self._layouts[b].views(self._bucket_buffers[b])[slot]

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to do: the end-of-backward callback already did it (kept for shared loops)."""
        super().finish_gradient_synchronization()


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
