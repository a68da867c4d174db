"""Deliberately wrong versions of the exercises' model answers, one classic mistake each.

``tests/test_exercises.py`` runs :func:`minddp.exercises.check` on each and
asserts that the checker names the mistake. They live in a module of their
own so the ranks can import them by name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minddp.exercises import solutions


# -------------------------------------------------------------------------------- simple
class NoBroadcast(solutions.SimpleDDP):
    """Forgets step 1: every rank keeps its own random initialisation."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group


class ParametersOnly(solutions.SimpleDDP):
    """Broadcasts the parameters but not the buffers."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)


class Summed(solutions.SimpleDDP):
    """all_reduce sums: forgets to divide by the world size."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)


class NeverSynced(solutions.SimpleDDP):
    """Broadcasts at the start, then never talks again."""

    def finish_gradient_synchronization(self):
        pass


class RankZeroOnly(solutions.SimpleDDP):
    """Only rank 0 joins the all_reduce: it waits for ever for rank 1."""

    def finish_gradient_synchronization(self):
        if dist.get_rank() == 0:
            for p in self.module.parameters():
                dist.all_reduce(p.grad)


class Unfinished(solutions.SimpleDDP):
    """The notebook's skeleton, not filled in yet."""

    def finish_gradient_synchronization(self):
        raise NotImplementedError("average every gradient")


# -------------------------------------------------------------------------------- hook
class IncomingGradient(solutions.GradAccumDDP):
    """Syncs from a *tensor* hook: the incoming gradient of the last micro-batch, not the accumulated one."""

    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        for p in module.parameters():
            p.register_hook(self._average_incoming)

    def _average_incoming(self, grad):
        if not self.sync_this_backward:
            return grad
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad / dist.get_world_size()

    def finish_gradient_synchronization(self):
        pass


class IgnoresNoSync(solutions.HookDDP):
    """Syncs from the hook in every backward, also in those of forwards run inside no_sync()."""

    def _grad_ready(self, param):
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()


class AfterBackward(solutions.GradAccumDDP):
    """A 'hook' stage that still sends everything in finish, after backward (ga's shape)."""


# -------------------------------------------------------------------------------- hook-async, bucket
class AsyncSummed(solutions.AsyncHookDDP):
    """Waits for every all_reduce but forgets the division."""

    def finish_gradient_synchronization(self):
        for _, work in self.in_flight:
            work.wait()
        self.in_flight.clear()


class BucketNotCopiedBack(solutions.BucketDDP):
    """Reduces a flat copy of the bucket and never writes it back into the gradients."""

    def _sync_bucket(self, b):
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
        dist.all_reduce(flat)


# -------------------------------------------------------------------------------- fp16 hook
def hook_sum_only(process_group, bucket):
    """Casts and sums, forgets to divide."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divided_twice(process_group, bucket):
    """Divides by the world size before the sum and again after it: half the average on 2 ranks."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()).to(torch.float32))


def hook_raw_future(process_group, bucket):
    """Hands back all_reduce's own Future, whose value is a list."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).get_future()


def hook_stays_fp16(process_group, bucket):
    """Forgets to cast the average back to the bucket's dtype."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).get_future().then(lambda f: f.value()[0])


def hook_not_compressed(process_group, bucket):
    """Averages correctly, in float32: nothing saved on the wire."""
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


def hook_waits(process_group, bucket):
    """Returns the averaged tensor itself instead of a Future."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    dist.all_reduce(compressed)
    return compressed.to(torch.float32)
