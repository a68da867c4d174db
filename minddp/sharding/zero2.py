"""Stage ``zero2``: reduce-scatter the gradients, so each rank keeps (and steps) only its shard.

Builds on ``bucket-async``. ZeRO-1 all_reduces whole gradients and uses ``1/world`` of them; ZeRO-2
asks the network for just that part. Four changes: 1. each trainable parameter's chunk on this rank
becomes a *shard*, an ``nn.Parameter`` viewing the full one, which the optimizer steps; 2. a full
bucket is laid out rank-major and reduce-scattered, its full gradients dropped; 3. each shard gets
its chunk of the average as ``.grad``; 4. the next forward all-gathers the parameters bucket by
bucket, each layer waiting only for its own. Memory, hooks, ``no_sync``: ``docs/sharding.md``.

Why a subclass of the teaching class rather than a base of its own: everything but those four changes is
``bucket-async``'s (the same start, the checks, ``no_sync``, the plan by torch's rule, the autograd hooks
held weakly, the count, the kept Futures, the refusal of an unfinished step), and a base of its own would
write all of it again. It overrides only methods each stage overrides in turn (``forward``,
``_send_bucket``, ``_write_back``, ``finish_gradient_synchronization``), adds its forward hooks to the
stage's ``handles`` (removed with it, as the autograd hooks are), and asks for nothing a teaching file
keeps only for it: its cap for ``torch.compile`` comes from the one rule (``bucket_caps``), and its
buckets are labelled for the trace analysis by :func:`~minddp.comm.send.send` here, not by the stage.
The change::

    -class AsyncBucketDDP(BucketDDP):
    +class Zero2DDP(AsyncBucketDDP):
         def _send_bucket(self, b: int) -> None:
    +        flat = pack_rank_major(grads, self.world)
         def _write_back(self, bucket: GradBucket, shard_average: torch.Tensor) -> None:
    -        pieces = average.view(-1).split([p.numel() for p in bucket.parameters()])
    +                shard.grad = chunk if shard.grad is None else shard.grad + chunk
    +    def gather_parameters(self, wait: bool = True) -> None:

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = Zero2DDP(torch.nn.Linear(4, 2), bucket_cap_mb=25)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.5)     # the shards
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> model.finish_gradient_synchronization()
    >>> [tuple(p.grad.shape) for p in model.parameters()]             # a shard's gradient: 1/world of it
    [(8,), (2,)]
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.comm.wire import Wire
from minddp.runtime import compat
from minddp.runtime.compiling import eager_under_compile, split_at_buckets
from minddp.sharding.hooks import reduce_scatter_hook
from minddp.sharding.shards import chunk_range, chunk_size, pack_rank_major, split_block, unpack_rank_major
from minddp.stages.bucket_async import AsyncBucketDDP
from minddp.stages.bucket_plan import bucket_caps


class Zero2DDP(AsyncBucketDDP):
    """bucket-async whose buckets are reduce-scattered into per-rank gradient shards (module doc)."""

    sharded = True  # each rank steps its own shard: debug mode compares its collectives only (minddp/debug)

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None):
        super().__init__(module, process_group, bucket_cap_mb)  # broadcast, autograd hooks, bucket plan (torch's rule)
        self.comm_hook = reduce_scatter_hook
        wire = Wire.of(process_group)
        self.world, self.rank = wire.size(), wire.group.rank()
        self.full = [p for p in module.parameters() if p.requires_grad]
        self.shard: dict[nn.Parameter, nn.Parameter] = {}
        for p in self.full:  # part 1
            if not p.is_contiguous():
                raise ValueError(
                    f"zero2 needs contiguous parameters; one of shape {list(p.shape)} is not: "
                    "make it contiguous before wrapping"
                )
            start, end = chunk_range(p.numel(), self.world, self.rank)
            self.shard[p] = nn.Parameter(p.detach().view(-1)[start:end])  # a view: updates land in p
        # Every place the module holds a parameter (a tied one is held twice), to swap full and shard.
        self.places = [
            (owner, name, p)
            for owner in module.modules()
            for name, p in owner.named_parameters(recurse=False, remove_duplicate=False)
            if p in self.shard
        ]
        self.had_grad: set[nn.Parameter] = set()
        self.stale = False  # True after a sync: the next forward all-gathers first
        self.gathering: dict[int, tuple] = {}  # bucket -> (its parameters, receiving buffer, Future), in flight
        self.holding_full = False  # the module holds the full parameters (in a forward), not the shards
        self.lent = False  # ... because the module was called on its own (``_module_forward``)
        eager_under_compile(self)  # torch.compile(zero2) compiles the module, not these forwards (runtime/compiling.py)
        self.compiled = compat.is_compiled(module)  # torch.compile(model): Dynamo traces the layers' hooks (part 4) too
        self._hold("shard")
        me = weakref.ref(self)  # held weakly and removed with the wrapper, as its autograd hooks (hook.py)
        # Part 4: each module that holds parameters waits for their buckets just before its forward.
        holders = {id(owner): owner for owner, _, _ in self.places}
        for owner in holders.values():
            buckets = sorted({self.bucket_of[p] for o, _, p in self.places if o is owner})
            self.handles.append(owner.register_forward_pre_hook(lambda m, args, b=buckets: me()._wait_for(b)))
        # Called on its own (say, to evaluate), the module takes its full parameters for the forward too; a
        # compiled one's model as well (evaluated eagerly; in the compiled forward these hooks find it full).
        whole = compat.uncompiled(module)
        self.handles.append(whole.register_forward_pre_hook(lambda m, args: me()._module_forward(starts=True)))
        self.handles.append(whole.register_forward_hook(lambda m, args, out: me()._module_forward(starts=False)))

    def _hold(self, which: str) -> None:
        """Put the shards (at rest) or the full parameters (during a forward) in the module."""
        for owner, name, p in self.places:
            compat.parameter_dict(owner)[name] = self.shard[p] if which == "shard" else p
        self.holding_full = which == "full"

    def forward(self, *inputs, **kwargs):
        if self.stale:  # part 4; a compiled module's hooks find the gather done (runtime/compiling.py)
            self.gather_parameters(wait=self.compiled)
        self._hold("full")
        try:
            # compiled: the graph cut where buckets end
            with split_at_buckets(self.module, *bucket_caps(self.bucket_cap_mb)):
                return super().forward(*inputs, **kwargs)  # the module's forward and the checks see them too
        finally:
            self._wait_for(list(self.gathering))  # buckets no layer asked for (unused parameters)
            self._hold("shard")

    def _module_forward(self, starts: bool) -> None:
        """The module called without this wrapper: full parameters for its forward, as :meth:`forward` gives."""
        if starts and not self.holding_full:
            if self.stale:
                self.gather_parameters(wait=False)
            self._hold("full")
            self.lent = True
        elif not starts and self.lent:
            self._wait_for(list(self.gathering))
            self._hold("shard")
            self.lent = False

    def _send_bucket(self, b: int) -> None:
        """Part 2: rank-major copy of the bucket's gradients to the reduce-scatter hook; drop the full gradients."""
        members = self.buckets[b]
        self.had_grad.update(p for p in members if p.grad is not None)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in members]
        flat = pack_rank_major(grads, self.world)
        for p in members:
            p.grad = None
        bucket = GradBucket(b, flat, members, is_last=b == len(self.buckets) - 1)
        self._sent(bucket, send(self.comm_hook, self.comm_state, bucket))  # the hook's call, in a named profiler range

    def _write_back(self, bucket: GradBucket, shard_average: torch.Tensor) -> None:
        """Part 3: this rank's chunk of each averaged gradient becomes its shard's ``.grad``."""
        members = bucket.parameters()
        for p, chunk in zip(members, split_block(shard_average, [p.numel() for p in members], self.world, self.rank)):
            if p in self.had_grad:
                shard = self.shard[p]
                shard.grad = chunk if shard.grad is None else shard.grad + chunk

    def finish_gradient_synchronization(self) -> None:
        super().finish_gradient_synchronization()
        if self.sync_this_backward:
            self.had_grad.clear()
            self.stale = True  # the optimizer updates the shards next

    def gather_block(self, members) -> int:
        """Part 4's block for a bucket's ``members``, in values: each one's chunk padded to ``ceil(numel / world)``,
        back to back."""
        return sum(chunk_size(p.numel(), self.world) for p in members)

    @torch.no_grad()
    def gather_parameters(self, wait: bool = True) -> None:
        """Part 4: start every rank's shards on their way into every rank's full parameters; ``wait``: finish now.

        (Called with ``wait`` after loading shards, and by :meth:`full_parameters`.)
        """
        wire = Wire.of(self.comm_state)
        for b in reversed(range(len(self.buckets))):  # the last bucket holds the first layers
            members = self.buckets[b]
            block = torch.cat(
                [
                    nn.functional.pad(
                        self.shard[p].detach(), (0, chunk_size(p.numel(), self.world) - self.shard[p].numel())
                    )
                    for p in members
                ]
            )
            gathered = block.new_empty(self.world * self.gather_block(members))
            with torch.profiler.record_function(f"minddp.all_gather_launch#{b}"):  # named, as send() names buckets
                self.gathering[b] = (members, gathered, wire.all_gather(gathered, block))
        self.stale = False
        if wait:
            self._wait_for(list(self.gathering))

    @torch.no_grad()
    def _wait_for(self, buckets: list[int]) -> None:
        """Part 4: wait for these buckets' all-gathers (if still in flight) and copy them into the full parameters."""
        for b in buckets:
            if b in self.gathering:
                members, gathered, future = self.gathering.pop(b)
                future.wait()
                for p, full in zip(members, unpack_rank_major(gathered, [p.numel() for p in members], self.world)):
                    p.view(-1).copy_(full)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unwrapped module's ``state_dict()`` with whole parameters (its own holds the shards)."""
        full = self.full_parameters()
        return {k: full.get(k, v.detach().clone()) for k, v in self.module.state_dict().items()}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` on every rank (all-gathered first if a step may have changed the shards)."""
        if self.stale:
            self.gather_parameters()
        self._hold("full")
        try:
            return {name: p.detach().clone() for name, p in self.module.named_parameters()}
        finally:
            self._hold("shard")
