"""Model answers to the notebooks' exercises: each stage as a learner would write it, with ``torch.distributed``.

The stages in :mod:`minddp.stages` send every gradient through the comm-hook layer, so that every
stage takes fp16 or PowerSGD; an exercise asks only for the idea, written straight on
``dist.broadcast`` and ``dist.all_reduce``. These are those answers, one class per stage
(:data:`STAGES`: ``SimpleDDP`` for ``like="simple"``, then ``GradAccumDDP``, ``HookDDP``,
``AsyncHookDDP``, ``BucketDDP``, ``AsyncBucketDDP``, ``HalvesDDP``), each building on the one before
as the ladder does, one comm hook, :func:`fp16_compress_hook` (``like="fp16"``), notebook 07's
:func:`ft_shard` (:func:`minddp.exercises.check_shard`), and notebook 10's :func:`outer_sync` and
:func:`fragment_to_send` (:mod:`minddp.exercises.diloco`), and notebook 09's :func:`handed_over_after`
(:mod:`minddp.exercises.compiled`);
:func:`minddp.exercises.check` measures a learner's version against the one ``like=`` names. They keep
only what the checker needs. ``notebooks/README.md`` (*The model answers*) tables what each adds.

Example::

    >>> from minddp.exercises import check, solutions
    >>> from minddp.exercises.checker import shutdown
    >>> shutdown()                                      # fresh checker ranks
    >>> check(solutions.BucketDDP, like="bucket")       # 2 real ranks, then 3 (it passed): a few seconds
    (starting 2 ranks for the checks on 2 ranks; they stay for the next ones)
    (starting 3 ranks for the checks on 3 ranks; they stay for the next ones)
    ✓ bucket: ...
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from minddp import stages
from minddp.collectives.halves import halves_all_reduce
from minddp.comm import Wire
from minddp.comm.default_hooks import allreduce_hook
from minddp.stages.bucket_plan import plan_buckets


class SimpleDDP(nn.Module):
    """Same start (broadcast), same update (average every gradient after backward)."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group
        with torch.no_grad():  # rank 0's values are no part of training: keep autograd out of the write
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0, group=process_group)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        world = dist.get_world_size(self.process_group)
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.process_group)  # the sum over ranks...
                param.grad /= world  # ...divided: the average


class GradAccumDDP(SimpleDDP):
    """Skip the sync for backwards of forwards run inside ``no_sync()``."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__(module, process_group)
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.sync_this_backward = True  # what the last forward decided

    @contextlib.contextmanager
    def no_sync(self):
        before = self.require_backward_grad_sync  # restored, not set: a no_sync() inside a no_sync() stays off
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def forward(self, *inputs, **kwargs):
        self.sync_this_backward = self.require_backward_grad_sync  # decided at forward, as torch does
        return super().forward(*inputs, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        if self.sync_this_backward:
            super().finish_gradient_synchronization()


class HookDDP(GradAccumDDP):
    """Average each gradient from its post-accumulate-grad hook, as soon as autograd has finished it."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__(module, process_group)
        for param in module.parameters():
            if param.requires_grad:
                # Fires after this backward's gradient was *added* into param.grad: the accumulated one.
                param.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param: nn.Parameter) -> None:
        if self.sync_this_backward:
            dist.all_reduce(param.grad, group=self.process_group)  # blocks: backward waits here
            param.grad /= dist.get_world_size(self.process_group)

    def finish_gradient_synchronization(self) -> None:
        pass  # every gradient was averaged during backward


class AsyncHookDDP(HookDDP):
    """Start each gradient's all_reduce from its hook without waiting; wait for all of them in finish."""

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []  # (parameter, work) of the all_reduces started

    def _grad_ready(self, param: nn.Parameter) -> None:
        if self.sync_this_backward:
            work = dist.all_reduce(param.grad, group=self.process_group, async_op=True)
            self.in_flight.append((param, work))  # backward goes on while this one travels

    def finish_gradient_synchronization(self) -> None:
        world = dist.get_world_size(self.process_group)
        for param, work in self.in_flight:
            work.wait()
            param.grad /= world
        self.in_flight.clear()


class BucketDDP(HookDDP):
    """One all_reduce per bucket: flatten the bucket's gradients, sum them in one call, copy them back."""

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float = 25):
        super().__init__(module, process_group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [[params[i] for i in bucket] for bucket in plan_buckets(params, bucket_cap_mb)]
        self.bucket_of = {p: b for b, members in enumerate(self.buckets) for p in members}
        self.waiting = [len(members) for members in self.buckets]  # gradients each bucket still waits for

    def _grad_ready(self, param: nn.Parameter) -> None:
        if self.sync_this_backward:
            b = self.bucket_of[param]
            self.waiting[b] -= 1
            if self.waiting[b] == 0:  # the bucket's last gradient: send the whole bucket
                self.waiting[b] = len(self.buckets[b])
                self._send_bucket(b)

    def _send_bucket(self, b: int) -> None:
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.process_group)
        flat /= dist.get_world_size(self.process_group)
        self._write_back(grads, flat)

    @staticmethod
    def _write_back(grads: list[torch.Tensor], average: torch.Tensor) -> None:
        for grad, piece in zip(grads, average.split([g.numel() for g in grads])):
            grad.copy_(piece.view_as(grad))


class AsyncBucketDDP(BucketDDP):
    """Buckets whose all_reduces are waited for only in finish."""

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float = 25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight = []  # (gradients, flat buffer, work) per bucket sent

    def _send_bucket(self, b: int) -> None:
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.in_flight.append((grads, flat, dist.all_reduce(flat, group=self.process_group, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        world = dist.get_world_size(self.process_group)
        for grads, flat, work in self.in_flight:
            work.wait()
            self._write_back(grads, flat / world)
        self.in_flight.clear()


class HalvesDDP(stages.AsyncBucketDDP):
    """bucket-async (the ladder's stage) whose buckets are summed by a reduce-scatter, then an all-gather.

    Notebook 06's exercise: the learner writes the transport
    (:func:`minddp.collectives.halves.halves_all_reduce` is the answer) and
    plugs it into a :class:`~minddp.comm.Wire`.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float = 25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.register_comm_hook(Wire(process_group, transport=halves_all_reduce), allreduce_hook)


def fp16_compress_hook(process_group, bucket) -> torch.futures.Future:
    """Average the bucket in float16 (half the payload: 2 bytes a value instead of 4) and hand back float32.

    1. cast the bucket's flat gradient to float16 and divide by the world size before the sum: the sum is
       then the average, which overflows only from about float16's largest value, 65504, up (a sum of n
       undivided values overflows from about 65504 / n);
    2. start the all_reduce (a sum) and take its Future;
    3. when it completes, cast the sum (of values already divided: the average) back to the
       bucket's dtype: the Future's value must be one tensor of the bucket's size and dtype.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(dist.get_world_size(group))  # step 1
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()  # step 2
    return fut.then(lambda done: done.value()[0].to(buffer.dtype))  # step 3


def ft_shard(batch, rank: int, world: int):
    """This rank's rows of a step's global batch, when ``world`` ranks train it now (notebook 07).

    Rows ``[rank·B // world, (rank+1)·B // world)`` of the ``B`` rows: consecutive, as even as integer
    division makes them, every row to exactly one of the ``world`` ranks of the moment, so the
    survivors of a lost process train its rows too.
    """
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


#: ``like=`` name -> model answer.
def outer_sync(params, synced, outer) -> None:
    """Notebook 10: DiLoCo's outer sync, after the H-th inner step on every replica
    (:func:`minddp.exercises.check_outer_sync`): the pseudo-gradient synced − local averaged over the
    replicas, the synced weights put back, the outer optimizer stepped, the result kept as the new synced."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]  # the way a gradient points
        for g in pseudo:
            dist.all_reduce(g)
            g /= dist.get_world_size()
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s)  # the outer step starts from the weights every replica agreed on
            p.grad = g
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def fragment_to_send(step: int, sync_every: int, fragments: int, delay: int) -> int | None:
    """Notebook 10: the fragment whose pseudo-gradient leaves after inner step ``step`` (1, 2, ...), or ``None``
    (:func:`minddp.exercises.check_fragment_schedule`): a turn of ``sync_every // fragments`` steps per fragment,
    fragment 0 first, each sent ``delay`` steps before its turn ends; from the step alone, so every replica agrees."""
    per_turn = sync_every // fragments  # steps in a turn
    if step % per_turn != (per_turn - delay) % per_turn:
        return None
    return (step - 1) // per_turn % fragments  # the turn's number (steps counted from 1), modulo the fragments


def handed_over_after(pieces: list[list[int]], cap: int) -> list[int]:
    """Notebook 09: for each bucket, the piece after whose backward it is handed over
    (:func:`minddp.exercises.check_handover`)."""
    after, bucket, last = [], [], 0  # bucket: the open bucket's sizes
    for i, piece in enumerate(pieces):
        for size in piece:
            bucket, last = bucket + [size], i
            if sum(bucket) >= cap:  # closed: handed over once piece i's backward ends
                after.append(i)
                bucket = []
    if bucket:  # the gradients left, 0 bytes too, make a last bucket
        after.append(last)
    return after


STAGES = {
    "simple": SimpleDDP,
    "ga": GradAccumDDP,
    "hook": HookDDP,
    "hook-async": AsyncHookDDP,
    "bucket": BucketDDP,
    "bucket-async": AsyncBucketDDP,
    "halves": HalvesDDP,
}

#: ``like=`` name -> model answer of a comm hook.
HOOKS = {"fp16": fp16_compress_hook}

__all__ = [
    "SimpleDDP",
    "GradAccumDDP",
    "HookDDP",
    "AsyncHookDDP",
    "BucketDDP",
    "AsyncBucketDDP",
    "HalvesDDP",
    "fp16_compress_hook",
    "ft_shard",
    "handed_over_after",
    "STAGES",
    "HOOKS",
]
