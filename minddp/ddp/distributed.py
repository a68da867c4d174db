"""``minddp.DistributedDataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Built the way torch builds it: a module that owns a :class:`~minddp.ddp.reducer.Reducer`, not a
subclass of the teaching stages (what it shares with ``fsdp``, the same start and ``no_sync``, is
:mod:`minddp.ddp.base`). Each part comes from the stage that introduced the idea:

1. **construction**: the same model on every rank (checked, as ``simple``), rank 0's parameters and
   buffers broadcast; the reducer plans buckets (``bucket``) from torch's first-iteration plan;
2. **forward**: raise if the last backward left gradients unreduced; rebuild the plan once from the
   observed gradient order; broadcast buffers; decide whether the backward syncs (``no_sync()``, as
   ``ga``); with ``find_unused_parameters``, find the parameters the graph will not reach;
3. **backward**: the reducer's hooks fill buckets and send them while backward goes on, as
   ``bucket-async`` does, but in the plan's order; its end-of-backward callback waits and writes back, all inside
   ``loss.backward()``. :meth:`finish_gradient_synchronization` is a no-op, for the shared loop.

The full map to the stages and to torch: ``docs/ddp.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = DistributedDataParallel(torch.nn.Linear(4, 2))   # as torch.nn.parallel's
    >>> model(torch.ones(3, 4)).sum().backward()                # gradients averaged when this returns
    >>> model.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from minddp.comm.plain import resolve_group
from minddp.ddp.base import DataParallelBase, same_start
from minddp.ddp.buffers import broadcast_coalesced
from minddp.ddp.debug_reducer import DebugReducer
from minddp.ddp.join import ShadowingJoinHook, highest_rank
from minddp.ddp.plan import torch_caps
from minddp.ddp.reducer import Reducer
from minddp.debug.switch import attach
from minddp.runtime import compat
from minddp.runtime.compiling import eager_under_compile, runs_as_python, split_at_buckets
from minddp.runtime.envflags import env_flag
from minddp.runtime.nested import map_tensors
from minddp.stages.bucket_plan import check_bucket_cap_mb


class DistributedDataParallel(DataParallelBase, Joinable):
    """torch's DDP: same constructor, same behaviour (module doc, steps 1-3)."""

    def __init__(
        self,
        module: nn.Module,
        device_ids=None,
        output_device=None,
        broadcast_buffers: bool = True,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        check_consistency: bool | None = None,
    ):
        DataParallelBase.__init__(self)
        Joinable.__init__(self)
        group = resolve_group(process_group)
        self._device = _check_devices(module, device_ids, output_device)
        _check_trainable(module)
        check_bucket_cap_mb(bucket_cap_mb)
        self.module = module
        self.process_group = group
        self.device_ids, self.output_device = device_ids, output_device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb, self.first_bucket_cap_mb = torch_caps(bucket_cap_mb)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._divide_by_initial_world_size = True  # uneven inputs (join): divide by the world, as torch
        same_start(module, group)  # step 1
        #: Debug mode's checks (None: off; on with MINDDP_DEBUG=1 or minddp.debug.enable()): docs/debugging.md.
        self.watch = attach(self)
        self.reducer = self._make_reducer()
        eager_under_compile(self)  # torch.compile(ddp) compiles the module, not this forward (docs/ddp.md)
        #: The submodules holding buffers, found once (as torch lists its buffers once): walking every
        #: submodule before each synced step costs ~1 µs a module, and most models have no buffers at all.
        self._buffer_owners = [m for m in module.modules() if next(m.buffers(recurse=False), None) is not None]
        #: Per-step cross-rank check of plan and launch order (None: on in debug mode).
        self.check_consistency = self.watch is not None if check_consistency is None else check_consistency
        #: Raise on every rank when an averaged gradient holds NaN/Inf (``MINDDP_CHECK_FINITE=1``).
        self.check_finite = env_flag("MINDDP_CHECK_FINITE")
        if static_graph:
            self._set_static_graph()

    def _make_reducer(self) -> Reducer:
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        return (Reducer if self.watch is None else DebugReducer)(
            [p for _, p in named],
            [n for n, _ in named],
            self.process_group,
            self.bucket_cap_mb,
            self.first_bucket_cap_mb,
            self.find_unused_parameters,
            self.gradient_as_bucket_view,
        )

    # Settings the reducer reads mid-backward live on it (plain attributes, no nn.Module __setattr__ cost).
    check_consistency = property(
        lambda self: self.reducer.check_consistency,
        lambda self, on: setattr(self.reducer, "check_consistency", bool(on)),
    )
    check_finite = property(
        lambda self: self.reducer.check_finite, lambda self, on: setattr(self.reducer, "check_finite", bool(on))
    )
    static_graph = property(lambda self: self.reducer.static_graph)

    def _set_static_graph(self) -> None:
        """Declare the graph the same every iteration (torch's name; before the first forward).

        The parameters the first synced iteration does not use are found once
        (graph walk and bitmap all_reduce, as ``find_unused_parameters``) and
        taken as unused from then on, with no walk or extra collective per step;
        the bucket plan is rebuilt after the first iteration, unused parameters
        included.
        """
        if self.reducer.synced_steps > 0:
            raise RuntimeError(
                "_set_static_graph() must be called before the first training iteration "
                "(or pass static_graph=True to the constructor)"
            )
        self.reducer.static_graph = True

    # -- pickling (copy.deepcopy, torch.save), as torch's DDP ----------------------------------------

    def __getstate__(self) -> dict:
        """Everything but the process group and the reducer (neither can be pickled; both are rebuilt)."""
        if self.watch is not None:
            raise RuntimeError("a minddp.DistributedDataParallel in debug mode cannot be pickled: save ddp.module")
        if self.process_group is not dist.group.WORLD:
            raise RuntimeError(
                "pickling (copy.deepcopy, torch.save) a minddp.DistributedDataParallel works only "
                "with the default process group, as in torch; save ddp.module instead"
            )
        state = dict(self.__dict__)
        state["_reducer_settings"] = {
            "check_consistency": self.check_consistency,
            "check_finite": self.check_finite,
            "static_graph": self.static_graph,
        }
        del state["process_group"], state["reducer"]
        return state

    def __setstate__(self, state: dict) -> None:
        """A working wrapper on the default group, with a fresh reducer (no comm hook registered), as torch's."""
        settings = state.pop("_reducer_settings")
        super().__setstate__(state)
        self.process_group = resolve_group(None)
        self.reducer = self._make_reducer()
        for name, value in settings.items():
            setattr(self.reducer, name, value)

    #: The current buckets, as indices into the trainable parameters (``module.parameters()`` order). Set, before
    #: the first step, to a plan saved with a checkpoint (``reducer.settled_plan()``): those buckets, no rebuild
    #: (docs/ddp.md, *Checkpoints*).
    bucket_plan = property(lambda self: self.reducer.plan, lambda self, plan: self.reducer.load_plan(plan))

    def register_comm_hook(self, state, hook) -> None:
        """Send buckets through ``hook(state, bucket) -> Future[Tensor]`` (torch's signature); once, before training."""
        self.reducer.register_comm_hook(state, hook)

    def forward(self, *inputs, **kwargs):
        """Step 2, then the module's forward (compiled: its graph cut where buckets fill; docs/ddp.md, *Compiled*)."""
        will_sync, inputs, kwargs = self._before_module(inputs, kwargs)
        with split_at_buckets(self.module, self.bucket_cap_mb, self.first_bucket_cap_mb):
            outputs = self.module(*inputs, **kwargs)
        if will_sync:
            self._after_module(outputs)
        return outputs

    @runs_as_python  # even in torch.compile(ddp): Dynamo compiles the module only
    def _before_module(self, inputs: tuple, kwargs: dict) -> tuple[bool, tuple, dict]:
        """Step 2 up to the module's call: whether the coming backward syncs, and the inputs on the module's device."""
        reducer = self.reducer
        will_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if will_sync:
            reducer.check_prior_reduction_finished()
        work = Join.notify_join_context(self)  # uneven inputs: joined ranks count those still going
        reducer.divisor = None  # None: the world size
        if work is not None and not self._divide_by_initial_world_size:
            work.wait()
            reducer.divisor = int(work.result()[0].item())  # average over the ranks still training
        if torch.is_grad_enabled():  # also a no_sync() forward, as torch: the rebuild comes at the same step
            reducer.maybe_rebuild()
        reducer.hooks_for(will_sync)  # no Python hook per parameter in a backward that does not sync
        self._sync_buffers()
        if compat.join_enabled(self):  # tell the joined ranks whether this step's backward syncs
            dist.all_reduce(torch.tensor([int(will_sync)], device=self._device), group=self.process_group)
        self.require_forward_param_sync = will_sync  # torch's rule: next forward broadcasts only after a sync
        if self.device_ids:
            inputs, kwargs = map_tensors(lambda t: t.to(self._device, non_blocking=True), (inputs, kwargs))
        return will_sync, inputs, kwargs

    @runs_as_python  # a graph walk and tensor hooks
    def _after_module(self, outputs) -> None:
        """Step 2 after the module: the coming backward syncs (with ``find_unused_parameters``, what it will skip)."""
        self.reducer.prepare_for_backward(outputs)

    def _sync_buffers(self, joined: bool = False) -> None:
        """``broadcast_buffers``: rank 0's buffers; under join(), the highest rank still training's (as torch)."""
        if (
            self.broadcast_buffers
            and self._buffer_owners
            and self.process_group.size() > 1
            and self.require_forward_param_sync
        ):
            source = highest_rank(self.process_group, not joined, self._device) if compat.join_enabled(self) else 0
            broadcast_coalesced(self._buffers_now(), self.process_group, source)

    def _buffers_now(self) -> list[torch.Tensor]:
        """``module.buffers()`` (its order, each tensor once), read from the owners found at construction.

        Read afresh each time: ``module.to()`` and ``module.half()`` replace the buffer tensors.
        """
        seen, buffers = set(), []
        for owner in self._buffer_owners:
            for buffer in owner.buffers(recurse=False):
                if id(buffer) not in seen:
                    seen.add(id(buffer))
                    buffers.append(buffer)
        return buffers

    def finish_gradient_synchronization(self) -> None:
        """Nothing left to do: the end-of-backward callback already did it (kept for shared loops)."""
        self.reducer.wait_and_write_back()

    def _unsynced_work(self) -> str | None:
        return "bucket all_reduces are still in flight" if self.reducer.work_in_flight() else None

    # -- uneven inputs: torch's Join ------------------------------------------------------------------

    def join(
        self, divide_by_initial_world_size: bool = True, enable: bool = True, throw_on_early_termination: bool = False
    ) -> Join:
        """Train on uneven inputs: ``with model.join(): for batch in this_ranks_batches: ...``.

        A rank that runs out of batches *joins*: until every rank has, it
        shadows the collectives of the others' steps (their buffer broadcast,
        their gradient buckets with zeros, their unused-parameter bitmap), so
        nobody waits for ever. Gradients are averaged over the whole world
        (joined ranks contribute zeros) or, with
        ``divide_by_initial_world_size=False``, over the ranks still training.
        At the end every rank takes the parameters of the last rank to join.
        Same semantics and arguments as torch's ``DistributedDataParallel.join``.
        """
        return Join(
            [self], enable, throw_on_early_termination, divide_by_initial_world_size=divide_by_initial_world_size
        )

    def join_hook(self, **kwargs) -> JoinHook:
        return ShadowingJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self._device

    @property
    def join_process_group(self) -> dist.ProcessGroup:
        return self.process_group


def _check_trainable(module: nn.Module) -> None:
    """torch's refusals: nothing to train, and sparse gradients (torch reduces those apart; minddp does not)."""
    if not any(p.requires_grad for p in module.parameters()):
        raise RuntimeError(
            "DistributedDataParallel is not needed when a module doesn't have any parameter that "
            "requires a gradient (every parameter is frozen): train without the wrapper"
        )
    for name, m in module.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad:
            raise ValueError(
                f"minddp.DistributedDataParallel does not support sparse gradients, but {name!r} is "
                f"{type(m).__name__}(sparse=True): build it with sparse=False (a dense gradient), or "
                "use torch's DistributedDataParallel, which reduces sparse gradients on gloo"
            )


def _check_devices(module: nn.Module, device_ids, output_device) -> torch.device:
    """The module's one device; device_ids/output_device only make sense for a single-GPU module."""
    devices = {p.device for p in module.parameters()}
    if len(devices) > 1:
        raise ValueError(
            f"minddp.DistributedDataParallel wraps single-device modules, but the parameters are on "
            f"{sorted(map(str, devices))}: move the module to one device (one GPU per rank)"
        )
    device = devices.pop() if devices else torch.device("cpu")
    if device.type == "cpu" and (device_ids is not None or output_device is not None):
        raise ValueError(
            f"device_ids and output_device only work with GPU modules, but got device_ids={device_ids}, "
            f"output_device={output_device} for a module on the CPU: leave both as None"
        )
    if device_ids is not None:
        wanted = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in device_ids]
        if wanted != [device]:
            raise ValueError(
                f"device_ids must be the one device the module is on ([{device}]), got {device_ids}: "
                "move the module to this rank's GPU first (module.to(local_rank))"
            )
    return device
