"""``minddp.FullyShardedDataParallel``: ZeRO-3, every rank keeps a shard of the parameters too.

ZeRO-2 still keeps every parameter whole on every rank. FSDP keeps only this rank's chunk of each
and assembles a piece of the model, a **unit** (a block, picked with ``shard``), just when it runs:

1. **construction**: same model everywhere (checked), broadcast, each unit's parameters replaced by
   their shards; a parameter in no unit (or tied across two) stays whole: *replicated*;
2. **before a unit's forward**: all-gather its shards (in ``compute_dtype``), and prefetch the next
   unit;
3. **after it**: drop the full parameters; a saved-tensor hook keeps notes of *where* instead;
4. **before a unit's backward**: the first note unpacked gathers the unit again, prefetches the one
   before;
5. **after it**: one autograd function per unit (:class:`Unshard`) sees all its gradients:
   reduce-scatter them without waiting, drop the full parameters (replicated ones: all_reduce, as in
   DDP);
6. **end of backward** (queued on autograd's engine): wait, give each shard its ``.grad``.

Memory, ``no_sync``, whole state dicts, the tests: ``docs/sharding.md`` (FSDP).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = FullyShardedDataParallel(torch.nn.Linear(4, 2))       # one unit: the whole model
    >>> optimizer = torch.optim.AdamW(model.parameters())            # the fp32 shards
    >>> model(torch.ones(3, 4)).sum().backward()                      # reduce-scattered when it returns
    >>> [tuple(p.grad.shape) for p in model.parameters()]
    [(8,), (2,)]
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.comm.wire import Wire
from minddp.ddp.base import DataParallelBase, same_start
from minddp.debug.switch import attach
from minddp.runtime import compat
from minddp.runtime.nested import map_tensors
from minddp.sharding.hooks import reduce_scatter_hook
from minddp.sharding.shards import chunk_range, chunk_size, pack_rank_major, split_block, unpack_rank_major


@dataclass
class Unit:
    """One sharded unit: its module, its parameters' shards, and what is gathered of it right now."""

    index: int
    module: nn.Module
    shards: list[nn.Parameter]  # this rank's chunks, fp32 master copies, 1-D
    shapes: list[torch.Size]  # the full parameters' shapes
    places: list[tuple[nn.Module, str, int]]  # (owner, attribute, shard index): where the module holds each
    full: list[torch.Tensor] | None = None  # gathered full parameters (compute dtype), while needed
    gathering: tuple | None = None  # an all-gather in flight: (receiving buffer, Future)
    accumulated: list[torch.Tensor | None] = field(default_factory=list)  # no_sync gradients

    @property
    def numels(self) -> list[int]:
        return [s.numel() for s in self.shapes]


@dataclass(frozen=True)
class Saved:
    """What the saved-tensor hook keeps instead of a piece of a unit's full parameter (part 3)."""

    owner: "FullyShardedDataParallel"  # held by the graph, as Unshard's ctx holds it: backward needs it
    unit: int
    param: int
    size: torch.Size
    stride: tuple
    offset: int


def unpack(saved):
    """Part 4's hook: a saved tensor as it was; a note, by the wrapper that wrote it."""
    return saved.owner._unpack(saved) if isinstance(saved, Saved) else saved


class Unshard(torch.autograd.Function):
    """Forward: the unit's gathered full parameters. Backward: their gradients, all at once, to part 5."""

    @staticmethod
    def forward(ctx, fsdp: "FullyShardedDataParallel", unit: Unit, *shards: torch.Tensor):
        ctx.fsdp, ctx.unit = fsdp, unit
        outputs = tuple(t.detach() for t in unit.full)  # new objects (a unit may run twice), same storage
        ctx.mark_non_differentiable(*(o for o, s in zip(outputs, shards) if not s.requires_grad))
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        ctx.fsdp._unit_backward_done(ctx.unit, grads)
        return (None, None) + (None,) * len(grads)


def as_unit_predicate(shard) -> Callable[[nn.Module], bool] | None:
    """``shard`` as a predicate: a module type or a tuple/list of types, or a predicate already (None: no units)."""
    if shard is None:
        return None
    if isinstance(shard, type):
        shard = (shard,)
    if isinstance(shard, (tuple, list, set)):
        types = tuple(shard)
        return lambda m: isinstance(m, types)
    if callable(shard):
        return shard
    raise TypeError(f"shard must be a predicate module -> bool or module types, got {type(shard).__name__}")


def blocks_of(model: nn.Module) -> Callable[[nn.Module], bool]:
    """A ``shard`` predicate: every element of every ``nn.ModuleList`` (a transformer's blocks).

    A model without a ``ModuleList`` is one unit, the whole model.
    """
    items = {id(child) for m in model.modules() if isinstance(m, nn.ModuleList) for child in m}
    return (lambda m: id(m) in items) if items else (lambda m: m is model)


class FullyShardedDataParallel(DataParallelBase):
    """ZeRO-3: units of parameters gathered for their forward and backward, gradients reduce-scattered.

    ``shard=None`` makes the whole module one unit. ``process_group`` may be a
    :class:`~minddp.comm.wire.Wire` (to meter or reroute the collectives).
    """

    sharded = True  # each rank holds its own shard: debug mode compares its collectives only (minddp/debug)

    def __init__(self, module: nn.Module, *, process_group=None, compute_dtype: torch.dtype | None = None, shard=None):
        super().__init__()
        self.module = module
        self.wire = Wire.of(process_group)
        self.world, self.rank = self.wire.size(), self.wire.group.rank()
        self.compute_dtype = compute_dtype
        self.comm_hook, self.comm_state, self.hook_registered = reduce_scatter_hook, self.wire, False
        same_start(module, self.wire.group)  # part 1
        attach(self)  # debug mode's collective check, while it is on (minddp/debug)
        self.units = self._make_units(module, as_unit_predicate(shard))
        owned = {id(s) for unit in self.units for s in unit.shards}
        self.replicated = [
            (owner, name, p)
            for owner in module.modules()
            for name, p in owner.named_parameters(recurse=False, remove_duplicate=False)
            if id(p) not in owned
        ]
        me = weakref.ref(self)
        self.handles = []
        for unit in self.units:
            self.handles.append(unit.module.register_forward_pre_hook(lambda m, args, u=unit: me()._before_forward(u)))
            self.handles.append(unit.module.register_forward_hook(lambda m, args, out, u=unit: me()._after_forward(u)))
        for p in {id(p): p for _, _, p in self.replicated if p.requires_grad}.values():
            self.handles.append(p.register_post_accumulate_grad_hook(lambda p: me()._replicated_grad_ready(p)))
        weakref.finalize(self, lambda handles: [h.remove() for h in handles], self.handles)
        self.forward_order: list[int] = [u.index for u in self.units]  # a guess until the first forward
        self.seen_order: list[int] = []
        self.pending: list[tuple[Unit, GradBucket, torch.futures.Future]] = []  # reduce-scatters in flight
        self.pending_replicated: list[tuple[torch.Tensor, torch.futures.Future]] = []
        self.require_backward_grad_sync = self.sync_this_backward = True
        self.callback_queued = False
        self.backward_seen: set[int] = set()  # units whose backward has begun (prefetch once each)
        self.live: dict[int, tuple[int, int]] = {}  # storage address of a gathered full parameter -> (unit, index)

    # -- part 1: units and shards ----------------------------------------------------------------------

    def _make_units(self, module: nn.Module, is_unit) -> list[Unit]:
        candidates = [module] if is_unit is None else [m for m in module.modules() if is_unit(m)]
        holders: dict[int, list[tuple[nn.Module, str]]] = {}
        params: dict[int, nn.Parameter] = {}
        for owner in module.modules():
            for name, p in owner.named_parameters(recurse=False, remove_duplicate=False):
                holders.setdefault(id(p), []).append((owner, name))
                params[id(p)] = p
        members: dict[int, list[int]] = {id(u): [] for u in candidates}
        subtree = {id(u): {id(m) for m in u.modules()} for u in candidates}
        for pid, places in holders.items():
            # The innermost unit holding every place of this parameter owns it (modules() lists outer first).
            inside = [u for u in candidates if all(id(o) in subtree[id(u)] for o, _ in places)]
            if inside:
                members[id(inside[-1])].append(pid)
        units = []
        for u in candidates:
            if not members[id(u)]:
                continue
            shards, shapes, places = [], [], []
            for i, pid in enumerate(members[id(u)]):
                p = params[pid]
                start, end = chunk_range(p.numel(), self.world, self.rank)
                shard = nn.Parameter(p.detach().reshape(-1)[start:end].clone(), requires_grad=p.requires_grad)
                shards.append(shard)
                shapes.append(p.shape)
                for owner, name in holders[pid]:
                    compat.parameter_dict(owner)[name] = shard  # at rest the module holds the shard
                    places.append((owner, name, i))
            units.append(Unit(len(units), u, shards, shapes, places, accumulated=[None] * len(shards)))
        return units

    # -- parts 2-3: forward ----------------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self.pending or self.pending_replicated:
            raise RuntimeError(
                "the previous backward's gradients are still being reduced: call "
                "finish_gradient_synchronization() (or let backward finish) before the next forward"
            )
        self.sync_this_backward = self.require_backward_grad_sync
        self.seen_order = []
        if self.compute_dtype is not None:  # floating inputs compute in the compute dtype too
            cast = lambda t: t.to(self.compute_dtype) if t.is_floating_point() else t  # noqa: E731
            inputs, kwargs = map_tensors(cast, (inputs, kwargs))
        # the hooks reach the wrapper weakly (a note holds it): a collective started in here keeps them (gloo's Work
        # holds the state of the thread that started it) until its Work is dropped, maybe after wait() returned
        me = weakref.ref(self)
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: me()._pack(t), unpack)
        with hooks, self._replicated_in_compute_dtype():
            outputs = self.module(*inputs, **kwargs)
        if self.seen_order:
            self.forward_order = self.seen_order  # prefetch by what ran, next time
        return outputs

    @contextlib.contextmanager
    def _replicated_in_compute_dtype(self):
        """Replicated parameters cast (differentiably: their fp32 gradients come back) for the forward."""
        if self.compute_dtype is None:
            yield
            return
        cast = {}
        for owner, name, p in self.replicated:
            cast.setdefault(id(p), p.to(self.compute_dtype) if p.is_floating_point() else p)
            compat.parameter_dict(owner)[name] = cast[id(p)]
        try:
            yield
        finally:
            for owner, name, p in self.replicated:
                compat.parameter_dict(owner)[name] = p

    def _before_forward(self, unit: Unit) -> None:
        """Part 2: gather (or take the prefetched gather), put the full parameters in, prefetch the next unit."""
        self.seen_order.append(unit.index)
        self._gather(unit)
        self._prefetch(unit, +1)
        full = Unshard.apply(self, unit, *unit.shards)
        for owner, name, i in unit.places:
            compat.parameter_dict(owner)[name] = full[i]

    def _after_forward(self, unit: Unit) -> None:
        """Part 3: the shards back in, the full parameters dropped (the saved-tensor hook kept notes instead)."""
        for owner, name, i in unit.places:
            compat.parameter_dict(owner)[name] = unit.shards[i]
        if torch.is_grad_enabled() and unit.index == self.forward_order[-1]:
            return  # the backward starts with the last unit: keep it gathered rather than gather it again
        self._free(unit)

    def _pack(self, tensor: torch.Tensor):
        """Part 3: a saved tensor that lies in a gathered unit's parameter is kept as a note of where."""
        where = self.live.get(tensor.untyped_storage().data_ptr())
        if where is None:
            return tensor
        return Saved(self, *where, tensor.size(), tensor.stride(), tensor.storage_offset())

    def _unpack(self, saved: Saved) -> torch.Tensor:
        """Part 4: the note becomes the tensor again, from the unit's parameters gathered anew."""
        self._backward_started()
        unit = self.units[saved.unit]
        self._gather(unit)  # at once if prefetched (or kept from the forward)
        if unit.index not in self.backward_seen:  # its backward starts: ask for the unit before it
            self.backward_seen.add(unit.index)
            self._prefetch(unit, -1)
        return unit.full[saved.param].as_strided(saved.size, saved.stride, saved.offset)

    # -- the all-gathers -------------------------------------------------------------------------------

    def gather_block(self, unit: Unit) -> int:
        """The block this rank sends to gather ``unit``, in values: each shard padded to ``ceil(numel / world)``,
        back to back."""
        return sum(chunk_size(n, self.world) for n in unit.numels)

    def _start_gather(self, unit: Unit) -> None:
        """Send this rank's shards (in the compute dtype), padded to equal chunks; receive everyone's."""
        if unit.full is not None or unit.gathering is not None:
            return
        dtype = self.compute_dtype or unit.shards[0].dtype
        block = torch.cat(
            [
                nn.functional.pad(s.detach().to(dtype), (0, chunk_size(n, self.world) - s.numel()))
                for s, n in zip(unit.shards, unit.numels)
            ]
        )
        gathered = block.new_empty(self.world * self.gather_block(unit))
        with torch.profiler.record_function(f"minddp.all_gather_launch#{unit.index}"):
            unit.gathering = (gathered, self.wire.all_gather(gathered, block))

    def _gather(self, unit: Unit) -> None:
        """Wait for the unit's all-gather (starting it if nobody did) and unpack its full parameters."""
        if unit.full is not None:
            return
        self._start_gather(unit)
        gathered, future = unit.gathering
        future.wait()
        unit.gathering = None
        unit.full = [
            t.view(shape) for t, shape in zip(unpack_rank_major(gathered, unit.numels, self.world), unit.shapes)
        ]
        self.live.update(
            {t.untyped_storage().data_ptr(): (unit.index, i) for i, t in enumerate(unit.full) if t.numel()}
        )

    def _prefetch(self, unit: Unit, direction: int) -> None:
        """Start the gather of the unit that ran after (+1, forward) or before (-1, backward) this one."""
        order = self.forward_order
        if unit.index in order:
            k = order.index(unit.index) + direction
            if 0 <= k < len(order):
                self._start_gather(self.units[order[k]])

    def _free(self, unit: Unit) -> None:
        if unit.full is not None:
            for t in unit.full:
                self.live.pop(t.untyped_storage().data_ptr(), None)
            unit.full = None

    # -- parts 5-6: backward ---------------------------------------------------------------------------

    def _backward_started(self) -> None:
        """Queue part 6 at the end of this backward (as torch's DDP and ours do)."""
        if not self.callback_queued:
            self.callback_queued = True
            compat.at_backward_end(self.finish_gradient_synchronization)

    def _unit_backward_done(self, unit: Unit, grads: tuple) -> None:
        """Part 5: the unit's gradients, cast to the master dtype, reduce-scattered without waiting."""
        self._backward_started()
        self._free(unit)
        master = [g.to(s.dtype) if g is not None else None for g, s in zip(grads, unit.shards)]
        for i, (g, acc) in enumerate(zip(master, unit.accumulated)):  # earlier no_sync backwards' sums
            if acc is not None:
                master[i] = acc if g is None else acc + g
        if not self.sync_this_backward:
            unit.accumulated = master
            return
        unit.accumulated = [None] * len(unit.shards)
        flat = pack_rank_major(
            [
                g if g is not None else torch.zeros(shape, dtype=s.dtype, device=s.device)
                for g, s, shape in zip(master, unit.shards, unit.shapes)
            ],
            self.world,
        )
        bucket = GradBucket(unit.index, flat, unit.shards, is_last=unit.index == 0)
        self.pending.append((unit, bucket, send(self.comm_hook, self.comm_state, bucket)))

    def _replicated_grad_ready(self, p: nn.Parameter) -> None:
        """Part 5, replicated: average the whole gradient (divide, all-reduce), without waiting."""
        self._backward_started()
        if self.sync_this_backward:
            self.pending_replicated.append((p, self.wire.all_reduce(p.grad.div_(self.world))))

    def finish_gradient_synchronization(self) -> None:
        """Part 6: wait for every reduction; each shard gets its averaged gradient (runs by itself after backward)."""
        self.callback_queued = False
        self.backward_seen = set()
        pending, self.pending = self.pending, []
        for unit, bucket, future in pending:
            for shard, piece in zip(unit.shards, split_block(future.wait(), unit.numels, self.world, self.rank)):
                if shard.requires_grad:
                    shard.grad = piece.clone() if shard.grad is None else shard.grad + piece
        replicated, self.pending_replicated = self.pending_replicated, []
        for p, future in replicated:
            future.wait()
        for unit in self.units:  # gathered (or prefetched) for a backward that did not need it after all:
            if unit.gathering is not None:  # the optimizer is about to change the shards, so drop it
                unit.gathering[1].wait()
                unit.gathering = None
            self._free(unit)

    def register_comm_hook(self, state, hook) -> None:
        """Reduce-scatter by ``hook(state, bucket)`` (:mod:`minddp.sharding.hooks`); ``state`` carries the gathers."""
        if self.hook_registered:  # as torch's FSDP and DDP: a second hook would replace the first
            raise RuntimeError("register_comm_hook can only be called once; build a new wrapper to use another hook")
        self.comm_hook, self.comm_state, self.hook_registered = hook, state, True
        self.wire = Wire.of(state) if state is not None else self.wire

    # -- whole tensors in and out ----------------------------------------------------------------------

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` (master dtype) on every rank, as ``module.named_parameters()`` names them."""
        out = {}
        where = {id(s): (unit, i) for unit in self.units for i, s in enumerate(unit.shards)}
        for name, p in self.module.named_parameters():
            if id(p) not in where:
                out[name] = p.detach().clone()
                continue
            unit, i = where[id(p)]
            block = nn.functional.pad(p.detach(), (0, chunk_size(unit.numels[i], self.world) - p.numel()))
            gathered = block.new_empty(self.world * block.numel())
            self.wire.all_gather(gathered, block).wait()
            out[name] = unpack_rank_major(gathered, [unit.numels[i]], self.world)[0].view(unit.shapes[i])
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unwrapped module's ``state_dict()``: full parameters and buffers, on every rank."""
        full = self.full_parameters()
        state = self.module.state_dict()
        return {k: full.get(k, v.detach().clone()) for k, v in state.items()}

    @torch.no_grad()
    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load whole tensors (a :meth:`full_state_dict`, or the plain model's): each rank keeps its chunks."""
        where = {id(s): (unit, i) for unit in self.units for i, s in enumerate(unit.shards)}
        for name, tensor in self.module.state_dict(keep_vars=True).items():
            if name not in state_dict:
                raise KeyError(f"the state dict has no {name!r}: load a full state dict of this model")
            if id(tensor) in where:
                unit, i = where[id(tensor)]
                start, end = chunk_range(unit.numels[i], self.world, self.rank)
                tensor.copy_(state_dict[name].reshape(-1)[start:end])
            else:
                tensor.copy_(state_dict[name])
