"""ZeRO-1: each rank keeps the optimizer state of its part of the parameters only.

Every DDP rank takes the same step on the same parameters, so it keeps the same optimizer state too
(Adam: ``8Ψ`` bytes beside ``4Ψ`` of parameters). ZeRO-1 cuts it in ``world`` parts:

1. **plan**: every parameter is cut into ``world`` chunks (:mod:`minddp.sharding.shards`); rank
   ``r`` owns chunk ``r`` of each (whole tensors, for optimizers not in :data:`ELEMENTWISE`);
2. **the local optimizer**: ``optimizer_class`` built on this rank's chunks only (views into the
   parameters, with the same groups and options), so its state is ``8Ψ / world`` bytes;
3. **step**: each chunk gets its part of the (already averaged) gradient; the local optimizer steps;
4. **all-gather**: every rank's updated chunks to every rank, one all-gather per bucket.

The gradients are averaged by the DDP it is used with (any rung, or torch's). Balance, optimizers
that need whole tensors, state dicts, the tests: ``docs/sharding.md`` (ZeRO-1).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> net = torch.nn.Linear(4, 2)
    >>> optimizer = ZeroRedundancyOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3)
    >>> net(torch.ones(3, 4)).sum().backward()       # under DDP: averaged gradients
    >>> optimizer.step(); optimizer.zero_grad()      # this rank's chunks, then the all-gather
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minddp.comm.wire import Wire
from minddp.sharding.shards import chunk_range
from minddp.stages.bucket_plan import plan_buckets

#: Optimizers whose update of each element reads only that element's gradient and state (and scalars
#: such as the step count): stepping any chunk of a tensor gives that chunk of the whole tensor's step.
ELEMENTWISE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.RMSprop,
    torch.optim.Rprop,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.ASGD,
)
#: Parameters gathered together in one all-gather, at most (MiB), as DDP's buckets.
BUCKET_CAP_MB = 25.0


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """``optimizer_class`` with its state sharded over ``process_group`` (torch's name and signature).

    ``process_group`` may also be a :class:`~minddp.comm.wire.Wire`, to meter
    or reroute the all-gathers. ``param_groups`` are the full parameter groups
    (a learning-rate scheduler changes them as usual); ``optim`` is this
    rank's local optimizer.
    """

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer], process_group=None, **defaults):
        if issubclass(optimizer_class, torch.optim.LBFGS):
            raise ValueError(
                "ZeroRedundancyOptimizer cannot shard LBFGS: it keeps one history over all "
                "parameters together and steps them with one line search; use it unsharded"
            )
        self.initialized = False
        super().__init__(params, defaults)
        self.wire = Wire.of(process_group)
        self.world, self.rank = self.wire.size(), self.wire.group.rank()
        self.optimizer_class = optimizer_class
        self.elementwise = issubclass(optimizer_class, ELEMENTWISE)
        self.params = [p for group in self.param_groups for p in group["params"]]
        self.index = {id(p): i for i, p in enumerate(self.params)}  # a parameter's position, as in a state dict
        for i, p in enumerate(self.params):
            if not p.is_contiguous():
                raise ValueError(
                    f"ZeroRedundancyOptimizer needs contiguous parameters, but parameter {i} "
                    f"(shape {list(p.shape)}) is not; make it contiguous before building the optimizer"
                )
        self.ranges = self._plan()  # part 1
        # Part 2: this rank's chunk of each parameter, a view into the parameter's data.
        self.chunks = {}
        for p, ranges in zip(self.params, self.ranges):
            start, end = ranges[self.rank]
            if not self.owned_whole(p):
                self.chunks[p] = p.detach().view(-1)[start:end]  # may be empty: every rank steps every tensor
            elif end > start:
                self.chunks[p] = p.detach()  # owned whole, in its own shape
        local_groups = [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [self.chunks[p] for p in group["params"] if p in self.chunks],
            }
            for group in self.param_groups
        ]
        self.optim = optimizer_class(local_groups, **defaults)
        for group, local in zip(self.param_groups, self.optim.param_groups):
            for key, value in local.items():
                group.setdefault(key, value)  # the class's defaults, visible to schedulers too
        self.buckets = [[self.params[i] for i in b] for b in plan_buckets(self.params, BUCKET_CAP_MB)]
        self.consolidated: dict | None = None
        self.initialized = True

    def owned_whole(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is owned whole by one rank: for optimizers that need whole tensors, and 0-d parameters."""
        return not self.elementwise or p.dim() == 0

    def _plan(self) -> list[list[tuple[int, int]]]:
        """Part 1: ``(start, end)`` of each rank's chunk of each parameter's flattened elements."""
        owned = [0] * self.world  # elements owned whole so far, per rank
        owner = {}
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            if self.owned_whole(self.params[i]):
                owner[i] = min(range(self.world), key=lambda r: owned[r])
                owned[owner[i]] += self.params[i].numel()
        return [
            [(0, p.numel()) if owner[i] == r else (p.numel(), p.numel()) for r in range(self.world)]
            if i in owner
            else [chunk_range(p.numel(), self.world, r) for r in range(self.world)]
            for i, p in enumerate(self.params)
        ]

    def add_param_group(self, param_group: dict) -> None:
        if self.initialized:
            raise RuntimeError(
                "ZeroRedundancyOptimizer plans its shards once: build a new one with every "
                "parameter group instead of adding a group later"
            )
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """Parts 3-4: update this rank's chunks with their chunks of the gradients, then all-gather the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for local, group in zip(self.optim.param_groups, self.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})  # e.g. a scheduler's new lr
        for p, chunk in self.chunks.items():  # part 3
            start, end = self._range(p)
            chunk.grad = None if p.grad is None else (p.grad if self.owned_whole(p) else p.grad.reshape(-1)[start:end])
        self.optim.step()
        self.consolidated = None  # a consolidated state dict is out of date now
        for chunk in self.chunks.values():
            chunk.grad = None  # a view keeps the whole gradient alive: let it go
        self._all_gather()  # part 4
        return loss

    def _range(self, p: torch.Tensor) -> tuple[int, int]:
        return self.ranges[self.index[id(p)]][self.rank]

    def gather_block(self, bucket) -> int:
        """Part 4's block for ``bucket``, in values: the most of it any rank holds (each rank's chunks back to back,
        padded to this)."""
        ranges = [self.ranges[self.index[id(p)]] for p in bucket]
        return max(sum(end - start for start, end in (r[k] for r in ranges)) for k in range(self.world))

    def _all_gather(self) -> None:
        """Part 4: per bucket, every rank's chunks back to back (padded to the largest), gathered, copied in."""
        pending = []
        for b, bucket in enumerate(self.buckets):
            ranges = [self.ranges[self.index[id(p)]] for p in bucket]
            block = self.gather_block(bucket)
            mine = [p.detach().view(-1)[r[self.rank][0] : r[self.rank][1]] for p, r in zip(bucket, ranges)]
            send = torch.cat(mine + [bucket[0].new_zeros(block - sum(m.numel() for m in mine))])
            gathered = bucket[0].new_empty(self.world * block)
            with torch.profiler.record_function(f"minddp.all_gather_launch#{b}"):  # named, as DDP's buckets
                pending.append((bucket, ranges, block, gathered, self.wire.all_gather(gathered, send)))
        for bucket, ranges, block, gathered, future in pending:
            future.wait()
            for k in range(self.world):
                if k == self.rank:
                    continue  # this rank's parts are in place already
                offset = k * block
                for p, r in zip(bucket, ranges):
                    start, end = r[k]
                    p.detach().view(-1)[start:end].copy_(gathered[offset : offset + end - start])
                    offset += end - start

    # -- state dicts: the whole optimizer's, as torch's optimizers write them ---------------------------

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's state onto rank ``to`` (call on every rank); there :meth:`state_dict` returns it."""
        mine = {
            self.index[id(p)]: {
                k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in self.optim.state[chunk].items()
            }
            for p, chunk in self.chunks.items()
            if chunk in self.optim.state
        }
        everyone = [None] * self.world if self.rank == to else None
        dist.gather_object(mine, everyone, group=self.wire.group, group_dst=to)
        if self.rank == to:
            self.consolidated = {
                i: merged
                for i, p in enumerate(self.params)
                if (merged := self._merge(i, p, [s.get(i) for s in everyone])) is not None
            }

    def _merge(self, i: int, p: torch.Tensor, per_rank: list[dict | None]) -> dict | None:
        """One parameter's state from its parts: per-element tensors put back together, the rest as they are."""
        present = [s for s in per_rank if s is not None]
        if not present:
            return None  # never stepped (no gradient yet): no state, as in torch
        if self.owned_whole(p):
            return present[0]  # its one owner's
        merged = {}
        for key, value in present[0].items():
            if torch.is_tensor(value) and value.dim() == 1 and value.numel() == self._length(i, 0):
                merged[key] = torch.cat([s[key] for s in per_rank]).view(p.shape)
            else:
                merged[key] = value  # scalars (the step count): the same on every rank
        return merged

    def _length(self, i: int, rank: int) -> int:
        start, end = self.ranges[i][rank]
        return end - start

    def state_dict(self) -> dict:
        """The whole optimizer's state dict, on the rank :meth:`consolidate_state_dict` gathered it to.

        The same dict ``optimizer_class`` would return unsharded, so it loads
        into one, or into a ZeroRedundancyOptimizer of any world size.
        """
        if self.consolidated is None:
            raise RuntimeError(
                "ZeroRedundancyOptimizer.state_dict() needs the state gathered first: call "
                "optimizer.consolidate_state_dict(to=r) on every rank, then state_dict() on rank r "
                "(after the last step)"
            )
        groups, start = [], 0
        for group in self.param_groups:
            groups.append(
                {
                    **{k: v for k, v in group.items() if k != "params"},
                    "params": list(range(start, start + len(group["params"]))),
                }
            )
            start += len(group["params"])
        return {"state": dict(self.consolidated), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a whole optimizer's state dict (from :meth:`state_dict`, or an unsharded optimizer's) on every rank."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                f"this state dict has parameter groups of {[len(g['params']) for g in saved_groups]} "
                f"parameters, this optimizer {[len(g['params']) for g in self.param_groups]}: load the "
                "state of an optimizer built over the same parameters"
            )
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        local_state, local_groups, n = {}, [], 0
        for group, local in zip(self.param_groups, self.optim.param_groups):
            ids = []
            for p in group["params"]:
                if p not in self.chunks:
                    continue
                i = self.index[id(p)]
                saved = state_dict["state"].get(i, state_dict["state"].get(str(i)))
                if saved is not None:
                    local_state[n] = {k: self._my_part(i, p, v) for k, v in saved.items()}
                ids.append(n)
                n += 1
            local_groups.append({**{k: v for k, v in local.items() if k != "params"}, "params": ids})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        for local, group in zip(self.optim.param_groups, self.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})

    def _my_part(self, i: int, p: torch.Tensor, value):
        """This rank's part of one saved state value: a slice of a per-element tensor, the rest as it is."""
        if self.owned_whole(p) or not torch.is_tensor(value) or value.shape != p.shape:
            return value
        start, end = self.ranges[i][self.rank]
        return value.reshape(-1)[start:end].clone()
