"""Deliberately wrong versions of the exercises' model answers, one classic mistake each.

``tests/test_exercises.py`` runs :func:`minddp.exercises.check` on each and
asserts that the checker names the mistake. They live in a module of their
own so the ranks can import them by name.
"""

from __future__ import annotations

import contextlib
import itertools
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import get_world_size  # a name of its own: HalvesWorldImported asks it without the group

from minddp import stages
from minddp.comm import Wire
from minddp.comm.default_hooks import allreduce_hook
from minddp.exercises import solutions
from minddp.runtime.compat import all_gather_single, reduce_scatter_single


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


class BroadcastsIntoCopies(solutions.SimpleDDP):
    """Broadcasts, but into copies (``p.data.clone()``): the module's own tensors never receive rank 0's values."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data.clone(), src=0)


class BroadcastWithoutNoGrad(solutions.SimpleDDP):
    """A right answer: the model answer's broadcast outside ``torch.no_grad()`` (02's exercise does not ask for it).
    torch 2.13's gloo broadcast writes into a leaf that requires grad without complaint; a torch that refused
    (``a leaf Variable that requires grad is being used in an in-place operation``) would fail its test."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


class CopiedBackWithoutNoGrad(solutions.SimpleDDP):
    """Broadcasts into a detached copy, then copies rank 0's values back into each parameter outside
    ``torch.no_grad()``: autograd refuses an in-place write into a leaf that requires grad, on any torch (the
    same error a torch whose broadcast asks autograd raises for :class:`BroadcastWithoutNoGrad`)."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group
        for tensor in [*module.parameters(), *module.buffers()]:
            received = tensor.detach().clone()
            dist.broadcast(received, src=0)
            tensor.copy_(received)


class Summed(solutions.SimpleDDP):
    """all_reduce sums: forgets to divide by the world size."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)


class DividesIntoANewTensor(solutions.SimpleDDP):
    """Divides out of place and drops the quotient (``p.grad / world``): p.grad keeps the sum."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad / dist.get_world_size()  # noqa: B018 (the mistake: a new tensor, dropped)


class NoGradientGuard(solutions.SimpleDDP):
    """Averages every .grad without ``if p.grad is not None``: raises on a parameter that got no gradient."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


class GradAccumNoGradientGuard(solutions.GradAccumDDP):
    """:class:`NoGradientGuard`'s finish under ``no_sync()``'s flag."""

    def finish_gradient_synchronization(self):
        if self.sync_this_backward:
            NoGradientGuard.finish_gradient_synchronization(self)


class DividedTwice(solutions.SimpleDDP):
    """Divides before the all_reduce and again after it: the average of the average's 1 / world size."""

    def finish_gradient_synchronization(self):
        world = dist.get_world_size()
        for p in self.module.parameters():
            p.grad /= world
            dist.all_reduce(p.grad)
            p.grad /= world


class DividedByAccum(solutions.SimpleDDP):
    """Divides by the world size and by k, the checker's 3 micro-batches, although the loss was already divided by k."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size() * 3


class SyncedAtTheLastMicroBatch(solutions.SimpleDDP):
    """Syncs only after every third finish, the last of the checker's 3 micro-batches: right, in fewer syncs."""

    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.finishes = 0

    def finish_gradient_synchronization(self):
        self.finishes += 1
        if self.finishes % 3 == 0:
            super().finish_gradient_synchronization()


class HardCodedWorldSize(solutions.SimpleDDP):
    """Divides by 2, the notebook's number of ranks, instead of asking for the world size: right on 2 ranks only."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2


class SumsANewTensor(solutions.SimpleDDP):
    """all_reduce of ``p.grad / n``: the division makes a new tensor, which holds the average and is thrown away."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad / dist.get_world_size())


class SumsAClone(solutions.SimpleDDP):
    """Averages a clone of each gradient and never writes it back into ``.grad``."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            g = p.grad.clone()
            dist.all_reduce(g)
            g /= dist.get_world_size()


class ReducesTheParameters(solutions.SimpleDDP):
    """all_reduces (and divides) each parameter instead of its gradient: ``.grad`` stays this rank's own."""

    def finish_gradient_synchronization(self):
        with torch.no_grad():
            for p in self.module.parameters():
                dist.all_reduce(p)
                p /= dist.get_world_size()


class HookReducesTheParameters(solutions.HookDDP):
    """The grad hook is handed the parameter, and all_reduces it (and divides) instead of its ``.grad``."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            with torch.no_grad():
                dist.all_reduce(param)
                param /= dist.get_world_size()


class Flattened(solutions.SimpleDDP):
    """Averages right, but in one all_reduce of every gradient flattened together (the bucket stages' idea)."""

    def finish_gradient_synchronization(self):
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


class BroadcastsTheGradients(solutions.SimpleDDP):
    """Every copy applies the same gradient, but rank 0's, broadcast, instead of the average over the ranks."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.broadcast(p.grad, src=0)


class BroadcastsInEveryForward(solutions.SimpleDDP):
    """Right gradients, but rank 0's parameters and buffers broadcast again before every forward "to be safe":
    a collective per tensor per micro-batch that the same start and the same update make needless."""

    def forward(self, *inputs, **kwargs):
        with torch.no_grad():
            for tensor in [*self.module.parameters(), *self.module.buffers()]:
                dist.broadcast(tensor, src=0)
        return self.module(*inputs, **kwargs)


class BroadcastsTheAverage(solutions.SimpleDDP):
    """Right gradients, averaged, then broadcast from rank 0 "to be safe": every rank already held that average."""

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                dist.broadcast(p.grad, src=0)


class ReducesThenDivides(solutions.SimpleDDP):
    """dist.reduce (notebook 01 shows it just before all_reduce) then the division: only rank 0 holds the average."""

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.reduce(p.grad, dst=0)
                p.grad /= dist.get_world_size()


class AssignsTheAllReduce(solutions.SimpleDDP):
    """Takes all_reduce for a function that returns the sum: it sums in place and returns None, so the division
    after it meets None."""

    def finish_gradient_synchronization(self):
        world = dist.get_world_size()
        for p in self.module.parameters():
            p.grad = dist.all_reduce(p.grad) / world


class DividesThenAssignsTheAllReduce(solutions.SimpleDDP):
    """Divides first, then keeps all_reduce's result, None, as the gradient."""

    def finish_gradient_synchronization(self):
        world = dist.get_world_size()
        for p in self.module.parameters():
            p.grad /= world
            p.grad = dist.all_reduce(p.grad)


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


# -------------------------------------------------------------------------------- ga
class NoOpNoSync(solutions.GradAccumDDP):
    """no_sync() that does nothing: every micro-batch's backward syncs."""

    @contextlib.contextmanager
    def no_sync(self):
        yield


class NoSyncNeverRestored(solutions.GradAccumDDP):
    """no_sync() turns the sync off and never turns it back on: the last micro-batch does not sync either."""

    @contextlib.contextmanager
    def no_sync(self):
        self.require_backward_grad_sync = False
        yield


class NoSyncSetsTrue(solutions.GradAccumDDP):
    """Sets the flag back to True when the block ends instead of restoring it: a no_sync() inside a no_sync() turns
    the outer block's sync back on."""

    @contextlib.contextmanager
    def no_sync(self):
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True


class NoSyncWithoutFinally(solutions.GradAccumDDP):
    """Restores the flag after a plain yield, not in a finally: an exception inside the block leaves the sync off
    (learner reads 03, round 11)."""

    @contextlib.contextmanager
    def no_sync(self):
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        yield
        self.require_backward_grad_sync = before


class UnwrittenNoSync(solutions.GradAccumDDP):
    """The notebook's skeleton of ga's no_sync(): raises on entering the block, before any forward runs."""

    @contextlib.contextmanager
    def no_sync(self):
        raise NotImplementedError("no_sync()")
        yield


class DecidesInFinish(solutions.GradAccumDDP):
    """Reads the flag in finish instead of forward: finish runs after the with-block, when the flag is on again."""

    def finish_gradient_synchronization(self):
        if self.require_backward_grad_sync:
            solutions.SimpleDDP.finish_gradient_synchronization(self)


class ForwardReturnsNothing(solutions.GradAccumDDP):
    """Records the decision and runs the module, but forgets to return its output: the loss gets None."""

    def forward(self, *inputs, **kwargs):
        self.sync_this_backward = self.require_backward_grad_sync
        self.module(*inputs, **kwargs)


class ForwardOnlyTurnsSyncOff(solutions.GradAccumDDP):
    """Records only the 'off' decision (``if not self.require_backward_grad_sync: self.sync_this_backward = False``):
    after the first no_sync() nothing turns it back on, so no backward syncs again (learner read 03, round 16,
    finding 11)."""

    def forward(self, *inputs, **kwargs):
        if not self.require_backward_grad_sync:
            self.sync_this_backward = False
        return solutions.SimpleDDP.forward(self, *inputs, **kwargs)


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


class TensorHookOnTheMethod(solutions.HookDDP):
    """Registers the model answer's ``_grad_ready(param)`` as a *tensor* hook: it is handed the incoming gradient,
    whose ``.grad`` is None, so the all_reduce gets None."""

    def __init__(self, module, process_group=None):
        solutions.GradAccumDDP.__init__(self, module, process_group)
        for p in module.parameters():
            p.register_hook(self._grad_ready)


class TensorHookSyncsTheParameter(solutions.HookDDP):
    """Calls the model answer's ``_grad_ready(param)`` from a *tensor* hook on each parameter: the hook runs before
    autograd adds the last micro-batch into ``.grad``, so it averages the earlier micro-batches' sum, and the last
    micro-batch's own part is added on top, unsynced (learner read 03, round 11, finding 5)."""

    def __init__(self, module, process_group=None):
        solutions.GradAccumDDP.__init__(self, module, process_group)
        for p in module.parameters():
            p.register_hook(lambda grad, p=p: self._grad_ready(p))


class HookLambdaReadsTheLoopsLast(solutions.HookDDP):
    """Registers ``lambda _: self._grad_ready(p)`` in a loop over the parameters: each lambda reads ``p`` when it
    runs, after the loop, so every hook syncs the last parameter and the others stay local (learner read 03, round
    16, finding 10)."""

    def __init__(self, module, process_group=None):
        solutions.GradAccumDDP.__init__(self, module, process_group)
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(lambda _: self._grad_ready(p))  # noqa: B023 (the mistake)


class HookAssignsTheAllReduce(solutions.HookDDP):
    """Takes all_reduce's result for the sum in the grad hook: it is None, and the division after it meets None."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            param.grad = dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()


class AsyncTensorHookDividesFirst(solutions.AsyncHookDDP):
    """hook-async's idea (divide, then start the all_reduce) registered as a *tensor* hook: it is handed the incoming
    gradient, whose ``.grad`` is None, and the division meets None before any all_reduce starts."""

    def __init__(self, module, process_group=None):
        solutions.GradAccumDDP.__init__(self, module, process_group)
        self.in_flight = []
        for p in module.parameters():
            p.register_hook(self._grad_ready)

    def _grad_ready(self, param):
        if self.sync_this_backward:
            param.grad /= dist.get_world_size()
            self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))


class IgnoresNoSync(solutions.HookDDP):
    """Syncs from the hook in every backward, also in those of forwards run inside no_sync()."""

    def _grad_ready(self, param):
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()


class ReadsTheFlagInBackward(solutions.HookDDP):
    """Decides in the hook, during backward, from torch's flag, not from what the forward noted: a backward run
    after no_sync()'s with-block (only the forward inside, as torch allows) syncs."""

    def _grad_ready(self, param):
        if self.require_backward_grad_sync:
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


class AsyncDividesTwice(solutions.AsyncHookDDP):
    """Divides before the send, as the idea does, and again after the wait, as the notebook's other place allows."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            param.grad /= dist.get_world_size()
            self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self):
        for param, work in self.in_flight:
            work.wait()
            param.grad /= dist.get_world_size()
        self.in_flight.clear()


class AsyncWaitsInHook(solutions.HookDDP):
    """Starts each all_reduce with async_op=True, then waits for it at once, in the hook: still blocking."""

    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []

    def _grad_ready(self, param):
        if self.sync_this_backward:
            work = dist.all_reduce(param.grad, async_op=True)
            work.wait()  # the wait that hook-async removes
            self.in_flight.append((param, work))

    def finish_gradient_synchronization(self):
        for param, _ in self.in_flight:
            param.grad /= dist.get_world_size()
        self.in_flight.clear()


class AsyncWaitsForThePrevious(solutions.AsyncHookDDP):
    """Waits, in the hook, for the all_reduce before this one, then starts this one: one in flight at a time."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            if self.in_flight:
                self.in_flight[-1][1].wait()  # one message in flight at a time: the others waited for in backward
            self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))


class BucketAsyncWaitsInSend(solutions.BucketDDP):
    """bucket-async written as bucket plus a list: each bucket's all_reduce is waited for as it is sent."""

    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.in_flight = []

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, async_op=True)
        work.wait()
        self.in_flight.append((grads, flat, work))

    def finish_gradient_synchronization(self):
        for grads, flat, _ in self.in_flight:
            self._write_back(grads, flat / dist.get_world_size())
        self.in_flight.clear()


class AsyncNeverWaits(solutions.AsyncHookDDP):
    """Starts each all_reduce in the hook, then divides in finish without waiting: a race with the network."""

    def finish_gradient_synchronization(self):
        for param, _ in self.in_flight:
            param.grad /= dist.get_world_size()
        self.in_flight.clear()


class AsyncWaitsForTheLastOnly(solutions.AsyncHookDDP):
    """Waits for the last all_reduce only, as if they arrived in order (gloo may run several at once)."""

    def finish_gradient_synchronization(self):
        if self.in_flight:  # finish runs after the no_sync() micro-batches too, with nothing in flight
            self.in_flight[-1][1].wait()
        for param, _ in self.in_flight:
            param.grad /= dist.get_world_size()
        self.in_flight.clear()


class BucketAsyncNeverWaits(solutions.AsyncBucketDDP):
    """Copies each bucket's flat buffer back in finish without waiting for its all_reduce."""

    def finish_gradient_synchronization(self):
        for grads, flat, _ in self.in_flight:
            self._write_back(grads, flat / dist.get_world_size())
        self.in_flight.clear()


class BucketAsyncSummed(solutions.AsyncBucketDDP):
    """Waits for every bucket in finish but copies back the sum, not the average."""

    def finish_gradient_synchronization(self):
        for grads, flat, work in self.in_flight:
            work.wait()
            self._write_back(grads, flat)
        self.in_flight.clear()


class AsyncNeverCleared(solutions.AsyncHookDDP):
    """Waits for every all_reduce and divides after the wait, but never empties the list: the next step's finish
    waits again for the last step's works and divides their parameters' gradients again."""

    def finish_gradient_synchronization(self):
        for param, work in self.in_flight:
            work.wait()
            param.grad /= dist.get_world_size()


class AsyncDividesFirstNeverCleared(solutions.AsyncHookDDP):
    """Divides in the hook before the send (the idea's way), waits for every one in finish, never empties the list:
    the gradients come out right, and each finish waits again for every earlier step's all_reduces."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            param.grad /= dist.get_world_size()
            self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self):
        for _, work in self.in_flight:
            work.wait()


class BucketAsyncNeverCleared(solutions.AsyncBucketDDP):
    """Waits for every bucket and writes it back, but never empties the list: the gradients come out right (the
    last step's tensors it writes into again were replaced by zero_grad), and the list grows every step."""

    def finish_gradient_synchronization(self):
        for grads, flat, work in self.in_flight:
            work.wait()
            self._write_back(grads, flat / dist.get_world_size())


class HookDoesNotWait(solutions.AsyncHookDDP):
    """Asked for 'hook' (wait in the hook), writes hook-async: the messages travel on during backward."""


class BucketCountNotReset(solutions.BucketDDP):
    """Counts down each bucket's gradients and sends it at zero, but never resets the count: step 2 sends nothing."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            b = self.bucket_of[param]
            self.waiting[b] -= 1
            if self.waiting[b] == 0:
                self._send_bucket(b)


class BucketWritesBackReversed(solutions.BucketDDP):
    """Pairs the flat buffer's slices with the bucket's gradients in reverse order: a slice lands in a gradient of
    another size."""

    @staticmethod
    def _write_back(grads, average):
        for grad, piece in zip(reversed(grads), average.split([g.numel() for g in grads])):
            grad.copy_(piece.view_as(grad))


class BucketCopiesWithoutView(solutions.BucketDDP):
    """Copies each slice of the flat buffer back without shaping it as its gradient: a 1-D slice into a 2-D weight's
    gradient."""

    @staticmethod
    def _write_back(grads, average):
        for grad, piece in zip(grads, average.split([g.numel() for g in grads])):
            grad.copy_(piece)


class BucketCatsUnflattened(solutions.BucketDDP):
    """Joins the bucket's gradients with torch.cat as they are, not flattened: a weight's 2-D gradient and a bias's
    1-D one."""

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat(grads)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        self._write_back(grads, flat)


class BucketAssignsTheAllReduce(solutions.BucketDDP):
    """Takes all_reduce's result for the bucket's sum: it is None, and the division after it meets None."""

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat = dist.all_reduce(flat)
        flat /= dist.get_world_size()
        self._write_back(grads, flat)


class BucketSentAtFirstGradient(solutions.BucketDDP):
    """Sends a bucket when its first gradient is in, not its last: the other members are averaged as they stood before
    this backward added to them, and the backward then adds this rank's own last micro-batch on top."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            b = self.bucket_of[param]
            self.waiting[b] -= 1
            if self.waiting[b] == len(self.buckets[b]) - 1:
                self._send_bucket(b)
            if self.waiting[b] == 0:
                self.waiting[b] = len(self.buckets[b])


class BucketAsyncSentAtFirstGradient(solutions.AsyncBucketDDP):
    """bucket-async sending a bucket at its first gradient: the flat copy holds the other members' gradients from
    before this backward, and finish writes their average over the gradients backward went on to accumulate."""

    _grad_ready = BucketSentAtFirstGradient._grad_ready  # the same early send; _send_bucket is the async one


class BucketCountsEveryBackward(solutions.BucketDDP):
    """Counts each gradient in every backward, the no_sync() ones too, and resets the count only when it sends: the
    count reaches zero unsent inside no_sync() and goes negative, so the syncing backward never sends."""

    def _grad_ready(self, param):
        b = self.bucket_of[param]
        self.waiting[b] -= 1
        if self.sync_this_backward and self.waiting[b] == 0:
            self.waiting[b] = len(self.buckets[b])
            self._send_bucket(b)


class BucketTestsBeforeCounting(solutions.BucketDDP):
    """Tests the count before it decrements it: at the bucket's last gradient the count is still 1, so the bucket is
    never sent in the backward that fills it (the count reaches 0 only after the test)."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            b = self.bucket_of[param]
            if self.waiting[b] == 0:
                self.waiting[b] = len(self.buckets[b])
                self._send_bucket(b)
            self.waiting[b] -= 1


class HookSyncsTwice(solutions.HookDDP):
    """'hook' without its empty finish: it inherits ga's, which sends every gradient again after the hooks did (the
    gradients stay right: the average of an average), so every sync is made twice."""

    finish_gradient_synchronization = solutions.GradAccumDDP.finish_gradient_synchronization


class AsyncDividesInFlight(solutions.AsyncHookDDP):
    """hook's hook with async_op=True and its division kept after the launch: it writes into p.grad while gloo may
    still read it or write the sum over it (a race: right when the division lands first)."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            work = dist.all_reduce(param.grad, async_op=True)
            param.grad /= dist.get_world_size()
            self.in_flight.append((param, work))

    def finish_gradient_synchronization(self):
        for _, work in self.in_flight:
            work.wait()
        self.in_flight.clear()


class BucketAsyncDividesInFlight(solutions.AsyncBucketDDP):
    """Divides the flat bucket right after launching its all_reduce, before the wait: a write into a tensor in
    flight."""

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, async_op=True)
        flat /= dist.get_world_size()
        self.in_flight.append((grads, flat, work))

    def finish_gradient_synchronization(self):
        for grads, flat, work in self.in_flight:
            work.wait()
            self._write_back(grads, flat)
        self.in_flight.clear()


class BucketAsyncReadsBeforeWait(solutions.AsyncBucketDDP):
    """Copies each bucket back first and waits after (the two lines of finish swapped): it reads the flat buffer
    while gloo may still write the sum into it (a race: right when the sum landed first)."""

    def finish_gradient_synchronization(self):
        for grads, flat, work in self.in_flight:
            self._write_back(grads, flat / dist.get_world_size())
            work.wait()
        self.in_flight.clear()


class AsyncDividesEveryFinish(solutions.AsyncHookDDP):
    """Keeps only the works, and in finish divides every parameter's gradient: finish runs after the no_sync()
    micro-batches too, so their local gradients are divided as well, with nothing summed."""

    def finish_gradient_synchronization(self):
        for _, work in self.in_flight:
            work.wait()
        self.in_flight.clear()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad /= dist.get_world_size()


class HookDividesOutsideTheGuard(solutions.HookDDP):
    """Divides after the ``if self.sync_this_backward:`` block, not inside it: the grad hook runs in every backward,
    so the no_sync() micro-batches' own gradients are divided too, with nothing summed; finish is the template's
    ``pass`` (learner read round 17, 03-b, finding 12: the verdict blamed finish)."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()


class HookNeverWaits(solutions.HookDDP):
    """Divides, then starts each all_reduce with async_op=True in the grad hook and never waits; finish is the
    template's ``pass`` (learner read round 20, 03-b, finding 6: the verdict pointed to hook-async's finish)."""

    def _grad_ready(self, param):
        if self.sync_this_backward:
            param.grad /= dist.get_world_size()
            dist.all_reduce(param.grad, async_op=True)


class AsyncDividesOutsideTheGuard(solutions.AsyncHookDDP):
    """Divides before the send, as the idea does, but outside ``if self.sync_this_backward:``: every backward's
    grad hook divides, the no_sync() ones' too; finish only waits."""

    def _grad_ready(self, param):
        param.grad /= dist.get_world_size()
        if self.sync_this_backward:
            self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self):
        for _, work in self.in_flight:
            work.wait()
        self.in_flight.clear()


class BucketAsyncNotCopiedBack(solutions.AsyncBucketDDP):
    """Waits for every bucket and divides its flat copy, but never writes it back into the gradients."""

    def finish_gradient_synchronization(self):
        for _, flat, work in self.in_flight:
            work.wait()
            flat /= dist.get_world_size()
        self.in_flight.clear()


class BucketAsyncKeepsParameters(solutions.AsyncBucketDDP):
    """Keeps the bucket's parameters (``self.buckets[b]``) where its gradient tensors were meant; the inherited
    finish then writes the averages back into the parameters, in place: autograd refuses a leaf that requires grad
    (learner read round 14, 03, finding 12)."""

    def _send_bucket(self, b):
        params = self.buckets[b]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.in_flight.append((params, flat, dist.all_reduce(flat, group=self.process_group, async_op=True)))


class BucketFlattensTheParameters(solutions.BucketDDP):
    """Flattens the bucket's members themselves (``self.buckets[b]`` holds parameters), not their ``.grad``, and
    writes the averaged slices back into the gradients: torch.cat copies, so no collective is handed a parameter,
    and every ``.grad`` ends as its parameter's values (learner read round 14, 03-c, finding 4)."""

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([q.reshape(-1) for q in self.buckets[b]])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        self._write_back(grads, flat)


class BucketAsyncFlattensTheParameters(solutions.AsyncBucketDDP):
    """bucket-async's ``_send_bucket`` flattening the parameters, not their ``.grad``: the inherited finish writes
    their average over ranks, each parameter's own values, into the gradients."""

    def _send_bucket(self, b):
        grads = [p.grad for p in self.buckets[b]]
        flat = torch.cat([q.reshape(-1) for q in self.buckets[b]])
        self.in_flight.append((grads, flat, dist.all_reduce(flat, group=self.process_group, async_op=True)))


class BucketNotCopiedBack(solutions.BucketDDP):
    """Reduces a flat copy of the bucket and never writes it back into the gradients."""

    def _send_bucket(self, b):
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
        dist.all_reduce(flat)


# -------------------------------------------------------------------------------- halves (notebook 06)
def _halves_plain_all_reduce(tensor, group):
    """The shortcut: sums with one all_reduce, not with its two halves."""
    dist.all_reduce(tensor, group=group)


def _halves_on_the_ring(tensor, group):
    """Pads right, then sums with the ring's two halves (notebook 06's first cell): point-to-point messages."""
    from minddp.collectives import TRANSPORTS

    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    TRANSPORTS["ring"].reduce_scatter(piece, padded, group)
    TRANSPORTS["ring"].all_gather(padded, piece, group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _padded(tensor, group):
    """Step 1 of the model answer: ``(flat, padded, n)``, the flat tensor padded to a multiple of the world size."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    return flat, torch.nn.functional.pad(flat, (0, -flat.numel() % n)), n


def _halves_summed(tensor, group, async_op=False):
    """Steps 1-3 of the model answer, right: the flat tensor padded, reduce-scattered and all-gathered in place."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group, async_op=async_op)
    all_gather_single(padded, piece, group=group, async_op=async_op)
    return padded[: flat.numel()].view_as(tensor)


def _halves_padding_kept(tensor, group):
    """Reduce-scatter and all-gather right, then forgets to write the sum back into ``tensor``."""
    _halves_summed(tensor, group)


def _halves_not_padded(tensor, group):
    """Forgets step 1: hands the flat tensor, whatever its length, to the two collectives."""
    flat = tensor.reshape(-1)
    piece = flat.new_empty(flat.numel() // dist.get_world_size(group))
    reduce_scatter_single(piece, flat, group=group)
    all_gather_single(flat, piece, group=group)


def _halves_averaged(tensor, group):
    """Divides by the world size after the sum, as an all_reduce hook would: the hook has divided already."""
    tensor.copy_(_halves_summed(tensor, group) / dist.get_world_size(group))


def _halves_reduce_op_avg(tensor, group):
    """Averages in the reduce-scatter (``op=ReduceOp.AVG``), the model answer otherwise: the hook has divided."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, op=dist.ReduceOp.AVG, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_rebound(tensor, group):
    """Step 4 as a rebinding of the name: ``tensor`` (the caller's) is never written."""
    tensor = _halves_summed(tensor, group)  # noqa: F841 (the mistake: a new name, not a copy)


def _halves_not_waited(tensor, group):
    """Starts both collectives with async_op=True and copies before either is waited for."""
    tensor.copy_(_halves_summed(tensor, group, async_op=True))


def _halves_not_gathered(tensor, group):
    """Forgets step 3: reduce-scatters, then copies the padded tensor back, where only this rank's piece is summed."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_piece_unpadded(tensor, group):
    """Pads right, but sizes ``piece`` from the unpadded length (numel // n): one element short on odd buckets."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(flat.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_in_two(tensor, group):
    """Right sums, but each half of the bucket sent on its own: two reduce-scatters and two all-gathers."""
    for part in tensor.reshape(-1).tensor_split(2):
        part.copy_(_halves_summed(part, group))


def _summed_back(tensor, padded, n, group):
    """Steps 2-4 of the model answer on the padded tensor a mistake made: reduce-scatter into a piece of
    ``padded.numel() // n``, all-gather back into ``padded``, copy its first ``tensor.numel()`` into ``tensor``."""
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: tensor.numel()].view_as(tensor))


def _halves_pad_wrong_sign(tensor, group):
    """Pads by ``numel % n`` where ``-numel % n`` is needed: the same at 2 ranks, one element short of a multiple
    at 3 for the 323-element bucket (padded by 2 to 325)."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, flat.numel() % n))
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_pad_by_first_dimension(tensor, group):
    """Pads by ``-tensor.size(0) % n``, the first dimension's, where the length's is needed: the same on the flat
    buckets (their one dimension is their length); on the checker's 5 × 8 tensor 1 at 2 ranks, where 0 is needed."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    _summed_back(tensor, torch.nn.functional.pad(flat, (0, -tensor.size(0) % n)), n, group)


def _halves_pad_by_last_dimension(tensor, group):
    """Pads by ``-tensor.size(-1) % n``, the last dimension's: right at 2 ranks on the 5 × 8 tensor (8 is even), at 3
    ranks 1 where 2 is needed."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    _summed_back(tensor, torch.nn.functional.pad(flat, (0, -tensor.size(-1) % n)), n, group)


def _halves_two_hard_coded(tensor, group):
    """Pads to an even length and cuts the piece at half of it: a hard-coded 2 where the world size belongs."""
    flat = tensor.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, flat.numel() % 2))
    piece = padded.new_empty(padded.numel() // 2)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_pad_two_hard_coded(tensor, group):
    """A hard-coded 2 in the padding only, the piece cut for the world size: at 3 ranks the 323-element bucket,
    padded to 324, goes through (3 divides 324 too), and the 112-element one, even, is left unpadded."""
    flat = tensor.reshape(-1)
    _summed_back(tensor, torch.nn.functional.pad(flat, (0, -flat.numel() % 2)), dist.get_world_size(group), group)


def _halves_gathered_unpadded(tensor, group):
    """Pads and reduce-scatters right, then all-gathers into the flat, unpadded tensor (to save the copy)."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(flat, piece, group=group)


def _halves_padding_copied_back(tensor, group):
    """Reduce-scatters and all-gathers the padded tensor right, then copies all of it back, padding included."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded.view_as(tensor))


def _halves_piece_copied_back(tensor, group):
    """Reduce-scatters and all-gathers the padded tensor right, then copies back this rank's piece, not the sum."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(piece)


def _halves_copied_back_flat(tensor, group):
    """Copies the sum back flat, without ``.view_as(tensor)``: right on the flat buckets, refused by ``copy_`` on a
    tensor of more dimensions (it broadcasts a 1-D tensor along the last dimension only)."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()])


def _halves_assigned_back_flat(tensor, group):
    """Writes the sum back by slice assignment without ``.view_as(tensor)``, padding cut off: right on the flat
    buckets; on a tensor of more dimensions torch refuses it as ``copy_`` does, in other words ("the expanded size")."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor[:] = padded[: flat.numel()]


def _halves_padded_unflattened(tensor, group):
    """Pads the tensor as it was handed, without flattening it: right on the flat buckets; on a 5 × 8 tensor
    ``F.pad`` pads the last dimension, and gloo's reduce-scatter, which cuts the first (5 rows), refuses it."""
    n = dist.get_world_size(group)
    padded = torch.nn.functional.pad(tensor, (0, -tensor.numel() % n))
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: tensor.numel()].view_as(tensor))


def _halves_padded_unflattened_unshaped(tensor, group):
    """Pads the tensor without flattening it and copies back without ``view_as``: refused as the one above."""
    n = dist.get_world_size(group)
    padded = torch.nn.functional.pad(tensor, (0, -tensor.numel() % n))
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: tensor.numel()])


def _halves_copied_back_transposed(tensor, group):
    """Shapes the flat sum as the tensor's shape reversed and transposes it back (columns first): right on the flat
    buckets, whose shape reversed is their own; on a tensor of 5 x 8 the values land in the wrong places."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape[::-1]).t())


def _halves_copied_from_input(tensor, group):
    """Gathers the pieces into a new tensor, then copies back from the padded input (this rank's own values)."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    gathered = torch.empty_like(padded)
    all_gather_single(gathered, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_copied_back_unpadded(tensor, group):
    """Sums the padded tensor right, then copies back ``flat`` (a view of ``tensor``), believing F.pad padded it in
    place: the tensor gets its own values back."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(flat.view_as(tensor))


def _halves_world_without_group(tensor, group):
    """The model answer, but the world size asked without the group: ``dist.get_world_size()``."""
    n = dist.get_world_size()
    flat = tensor.reshape(-1)
    _summed_back(tensor, torch.nn.functional.pad(flat, (0, -flat.numel() % n)), n, group)


def _halves_world_imported(tensor, group):
    """The world size asked without the group through a name imported from torch.distributed, not ``dist.``."""
    n = get_world_size()
    flat = tensor.reshape(-1)
    _summed_back(tensor, torch.nn.functional.pad(flat, (0, -flat.numel() % n)), n, group)


def _halves_collectives_without_group(tensor, group):
    """The model answer, but both collectives called without ``group=``: the whole world's, not the group's."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded)
    all_gather_single(padded, piece)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_list_collectives_without_group(tensor, group):
    """The list collectives (``dist.reduce_scatter``, ``dist.all_gather``) over the padded tensor's pieces, without
    ``group=``: the whole world's, not the group's."""
    flat, padded, n = _padded(tensor, group)
    pieces = list(padded.chunk(n))  # views: gathering into them fills padded
    piece = torch.empty_like(pieces[0])
    dist.reduce_scatter(piece, [p.clone() for p in pieces])
    dist.all_gather(pieces, piece)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_list_collectives(tensor, group):
    """Right, with the list collectives (``dist.reduce_scatter``, ``dist.all_gather``) and ``group=``."""
    flat, padded, n = _padded(tensor, group)
    pieces = list(padded.chunk(n))  # views: gathering into them fills padded
    piece = torch.empty_like(pieces[0])
    dist.reduce_scatter(piece, [p.clone() for p in pieces], group=group)
    dist.all_gather(pieces, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_world_group(tensor, group):
    """The model answer with ``dist.group.WORLD`` hard-wired where ``group`` belongs: the world's size and both
    collectives over the whole world, not over the group the transport was handed."""
    world = dist.group.WORLD
    n = dist.get_world_size(world)
    flat = tensor.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % n))
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=world)
    all_gather_single(padded, piece, group=world)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_collectives_world_group(tensor, group):
    """The world size asked of ``group``, but both collectives given ``group=dist.group.WORLD``."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=dist.group.WORLD)
    all_gather_single(padded, piece, group=dist.group.WORLD)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_group_as_op(tensor, group):
    """Passes the group to the reduce-scatter by position, where its third parameter is ``op``."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group)
    all_gather_single(padded, piece, group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_scatter_swapped(tensor, group):
    """Hands the reduce-scatter (input, output) where it takes (output, input)."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(padded, piece, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_gather_swapped(tensor, group):
    """Hands the all-gather (input, output) where it takes (output, input)."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(piece, padded, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_gathered_first(tensor, group):
    """Makes the two calls in the wrong order: all-gathers the fresh piece into the padded tensor, then
    reduce-scatters it."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    all_gather_single(padded, piece, group=group)
    reduce_scatter_single(piece, padded, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_padded_at_front(tensor, group):
    """Pads at the front, ``F.pad(flat, (pad, 0))``, and cuts the padding off the end, ``padded[: flat.numel()]``:
    a bucket the world size does not divide comes back shifted by its padding."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    padded = torch.nn.functional.pad(flat, (-flat.numel() % n, 0))
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_cut_from_front(tensor, group):
    """Pads at the end, as the model answer does, but cuts the padding off the front, ``padded[-flat.numel():]``."""
    flat, padded, n = _padded(tensor, group)
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[-flat.numel() :].view_as(tensor))


class _Halves(stages.AsyncBucketDDP):
    transport = None

    def __init__(self, module, process_group=None, bucket_cap_mb=25):
        super().__init__(module, process_group, bucket_cap_mb)
        self.register_comm_hook(Wire(process_group, transport=type(self).transport), allreduce_hook)


def _halves_piece_without_device(tensor, group):
    """Makes the piece without a device, ``torch.empty(k)``: right on CPU ranks, on the wrong device on GPU ones."""
    flat, padded, n = _padded(tensor, group)
    piece = torch.empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_padding_without_device(tensor, group):
    """Pads with ``torch.zeros(pad)``, made without a device: right on CPU ranks, refused by torch.cat on GPU ones."""
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    padded = torch.cat([flat, torch.zeros(-flat.numel() % n)])
    piece = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(piece, padded, group=group)
    all_gather_single(padded, piece, group=group)
    tensor.copy_(padded[: flat.numel()].view_as(tensor))


def _halves_with(name: str, transport) -> type:
    """Notebook 06's HalvesDDP with ``transport`` (its docstring names the mistake), importable as ``name``."""
    doc = f"Notebook 06's HalvesDDP whose transport {transport.__doc__[0].lower()}{transport.__doc__[1:]}"
    return type(name, (_Halves,), {"transport": staticmethod(transport), "__doc__": doc, "__module__": __name__})


HalvesPlainAllReduce = _halves_with("HalvesPlainAllReduce", _halves_plain_all_reduce)
HalvesOnTheRing = _halves_with("HalvesOnTheRing", _halves_on_the_ring)
HalvesNotWrittenBack = _halves_with("HalvesNotWrittenBack", _halves_padding_kept)
HalvesNotPadded = _halves_with("HalvesNotPadded", _halves_not_padded)
HalvesAveraged = _halves_with("HalvesAveraged", _halves_averaged)
HalvesReduceOpAvg = _halves_with("HalvesReduceOpAvg", _halves_reduce_op_avg)
HalvesRebound = _halves_with("HalvesRebound", _halves_rebound)
HalvesInTwo = _halves_with("HalvesInTwo", _halves_in_two)
HalvesNotWaited = _halves_with("HalvesNotWaited", _halves_not_waited)
HalvesNotGathered = _halves_with("HalvesNotGathered", _halves_not_gathered)
HalvesPieceUnpadded = _halves_with("HalvesPieceUnpadded", _halves_piece_unpadded)
HalvesPadWrongSign = _halves_with("HalvesPadWrongSign", _halves_pad_wrong_sign)
HalvesPadByFirstDimension = _halves_with("HalvesPadByFirstDimension", _halves_pad_by_first_dimension)
HalvesPadByLastDimension = _halves_with("HalvesPadByLastDimension", _halves_pad_by_last_dimension)
HalvesTwoHardCoded = _halves_with("HalvesTwoHardCoded", _halves_two_hard_coded)
HalvesPadTwoHardCoded = _halves_with("HalvesPadTwoHardCoded", _halves_pad_two_hard_coded)
HalvesGatheredUnpadded = _halves_with("HalvesGatheredUnpadded", _halves_gathered_unpadded)
HalvesPaddingCopiedBack = _halves_with("HalvesPaddingCopiedBack", _halves_padding_copied_back)
HalvesPieceCopiedBack = _halves_with("HalvesPieceCopiedBack", _halves_piece_copied_back)
HalvesCopiedBackFlat = _halves_with("HalvesCopiedBackFlat", _halves_copied_back_flat)
HalvesAssignedBackFlat = _halves_with("HalvesAssignedBackFlat", _halves_assigned_back_flat)
HalvesPaddedUnflattened = _halves_with("HalvesPaddedUnflattened", _halves_padded_unflattened)
HalvesPaddedUnflattenedUnshaped = _halves_with("HalvesPaddedUnflattenedUnshaped", _halves_padded_unflattened_unshaped)
HalvesCopiedBackTransposed = _halves_with("HalvesCopiedBackTransposed", _halves_copied_back_transposed)
HalvesCopiedBackUnpadded = _halves_with("HalvesCopiedBackUnpadded", _halves_copied_back_unpadded)
HalvesCopiedFromInput = _halves_with("HalvesCopiedFromInput", _halves_copied_from_input)
HalvesWorldWithoutGroup = _halves_with("HalvesWorldWithoutGroup", _halves_world_without_group)
HalvesWorldImported = _halves_with("HalvesWorldImported", _halves_world_imported)
HalvesCollectivesWithoutGroup = _halves_with("HalvesCollectivesWithoutGroup", _halves_collectives_without_group)
HalvesGroupAsOp = _halves_with("HalvesGroupAsOp", _halves_group_as_op)
HalvesWorldGroup = _halves_with("HalvesWorldGroup", _halves_world_group)
HalvesCollectivesWorldGroup = _halves_with("HalvesCollectivesWorldGroup", _halves_collectives_world_group)
HalvesListCollectives = _halves_with("HalvesListCollectives", _halves_list_collectives)  # a right answer
HalvesListCollectivesWithoutGroup = _halves_with(
    "HalvesListCollectivesWithoutGroup", _halves_list_collectives_without_group
)
HalvesScatterSwapped = _halves_with("HalvesScatterSwapped", _halves_scatter_swapped)
HalvesGatherSwapped = _halves_with("HalvesGatherSwapped", _halves_gather_swapped)
HalvesGatheredFirst = _halves_with("HalvesGatheredFirst", _halves_gathered_first)
HalvesPaddedAtFront = _halves_with("HalvesPaddedAtFront", _halves_padded_at_front)
HalvesCutFromFront = _halves_with("HalvesCutFromFront", _halves_cut_from_front)
HalvesPieceWithoutDevice = _halves_with("HalvesPieceWithoutDevice", _halves_piece_without_device)
HalvesPaddingWithoutDevice = _halves_with("HalvesPaddingWithoutDevice", _halves_padding_without_device)


# -------------------------------------------------------------------------------- fp16 hook
def hook_sum_only(process_group, bucket):
    """Casts and sums, forgets to divide."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divides_into_a_new_tensor(process_group, bucket):
    """Casts, divides out of place and drops the quotient: the sum is sent."""
    compressed = bucket.buffer().to(torch.float16)
    compressed / dist.get_world_size()  # noqa: B018 (the mistake: a new tensor, dropped)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divides_the_original_buffer(process_group, bucket):
    """Makes the float16 copy, then divides the float32 buffer instead of it: the copy, undivided, is summed."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16)
    buffer.div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_sends_the_buffer(process_group, bucket):
    """Makes and divides the float16 copy, then all_reduces the float32 buffer: the undivided float32 sum."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(dist.get_world_size(process_group))  # noqa: F841 (never sent)
    fut = dist.all_reduce(buffer, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divided_twice(process_group, bucket):
    """Divides by the world size before the sum and again after it: half the average on 2 ranks."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()).to(torch.float32))


def hook_hard_coded_two(process_group, bucket):
    """Divides by 2, the notebooks' world size, written as a number: exact on 2 ranks, 1.5 times the average on 3."""
    compressed = bucket.buffer().to(torch.float16).div_(2)
    fut = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_hard_coded_three(process_group, bucket):
    """Divides by 3, a divisor outside harness.HARD_CODED: on the check's 2 ranks, 2/3 of the average."""
    compressed = bucket.buffer().to(torch.float16).div_(3)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divides_in_flight(process_group, bucket):
    """Starts the all_reduce of the float16 copy, then divides that copy: a write while the network may be reading
    it (learner read 04, round 20, 3: passed or failed by the race)."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    compressed.div_(dist.get_world_size())
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_returns_local(process_group, bucket):
    """All_reduces a float16 copy but hands back its own bucket, divided: this rank's gradients, never reduced."""
    local = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(local.to(torch.float16), async_op=True).get_future()
    return fut.then(lambda f: local)


def hook_reduce_op_avg(process_group, bucket):
    """Asks the all_reduce to average (ReduceOp.AVG) instead of dividing first: gloo on torch 2.6 refuses it
    (docs/torch-versions.md); where gloo has it (2.13), the float16 sum comes before the division and overflows."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, op=dist.ReduceOp.AVG, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_bfloat16(process_group, bucket):
    """Casts to bfloat16 instead of float16: the same bytes, about 8 times float16's rounding error."""
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_raw_future(process_group, bucket):
    """Hands back all_reduce's own Future, whose value is a list."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).get_future()


def hook_callback_returns_nothing(process_group, bucket):
    """Writes the average back into the bucket in a callback that returns nothing: its Future holds None."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())

    def back(f):
        bucket.buffer().copy_(f.value()[0])

    return dist.all_reduce(compressed, async_op=True).get_future().then(back)


def hook_callback_returns_a_list(process_group, bucket):
    """Returns a one-element list from its callback, as torch's older fp16 hooks did: the Future holds a list."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).get_future().then(lambda f: [f.value()[0].float()])


def hook_casts_the_list(process_group, bucket):
    """Casts the Future's value back as if it were the tensor: it is a list holding the sum."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).get_future().then(lambda f: f.value().float())


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


def hook_divides_after_the_sum(process_group, bucket):
    """Sums in float16, then divides: right on small gradients, inf where the float16 sum overflows."""
    compressed = bucket.buffer().to(torch.float16)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32).div_(dist.get_world_size()))


def hook_blocks(process_group, bucket):
    """Waits for its all_reduce inside the hook, then hands back an already-completed Future."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    dist.all_reduce(compressed)  # blocking: backward stands still here
    done = torch.futures.Future()
    done.set_result(compressed.to(torch.float32))
    return done


def hook_waits_on_its_work(process_group, bucket):
    """async_op=True, then work.wait() before returning the work's Future: still blocking."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)
    work.wait()
    return work.get_future().then(lambda f: f.value()[0].to(torch.float32))


# -------------------------------------------------------------------------------- shard (notebook 07)
def shard_keeps_its_rows(batch, rank, world):
    """Notebook 07's question 3: each rank keeps its rows of the first world (3 ranks), whatever the world now."""
    x, y = batch
    lo, hi = rank * len(x) // 3, (rank + 1) * len(x) // 3
    return x[lo:hi], y[lo:hi]


def shard_rows_of_the_pair(batch, rank, world):
    """len(batch) for the row count: the batch is the pair (x, y), so only rows 0-1 are ever split."""
    x, y = batch
    lo, hi = rank * len(batch) // world, (rank + 1) * len(batch) // world
    return x[lo:hi], y[lo:hi]


def shard_floor_sized(batch, rank, world):
    """len(x) // world rows each: the remainder (a row at world 3 of 10 rows) is never trained."""
    x, y = batch
    n = len(x) // world
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def shard_shifted_by_one(batch, rank, world):
    """The rung's bounds shifted one row on, x[lo+1:hi+1]: 3, 3, 3 rows at world 3 of 10, as a floor split takes,
    but row 0 goes to no rank, not the remainder's row 9 (a floor split's mistake it did not make)."""
    x, y = batch
    lo, hi = rank * len(x) // world + 1, (rank + 1) * len(x) // world + 1
    return x[lo:hi], y[lo:hi]


def shard_floor_of_the_first_world(batch, rank, world):
    """len(x) // 3 rows each, the starting world's 3 written where `world` belongs: wrong already at world 3, where
    the floor division's remainder (row 9 of 10) goes to no rank, and at world 2 too."""
    x, y = batch
    n = len(x) // 3
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def shard_overlapping(batch, rank, world):
    """An exclusive end taken as inclusive, x[lo:hi+1]: each boundary row is trained by two ranks."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo : hi + 1], y[lo : hi + 1]


def shard_strided(batch, rank, world):
    """A right answer, written otherwise: every world-th row from this rank's index."""
    x, y = batch
    return x[rank::world], y[rank::world]


def shard_unfinished(batch, rank, world):
    """Notebook 07's skeleton, not filled in yet."""
    raise NotImplementedError("this rank's rows")


def shard_float_division(batch, rank, world):
    """The slice ends computed with `/`: floats, which a slice refuses."""
    x, y = batch
    lo, hi = rank * len(x) / world, (rank + 1) * len(x) / world
    return x[lo:hi], y[lo:hi]


def shard_returns_the_batch(batch, rank, world):
    """Every rank trains the whole batch (the ranks' gradients are then all the same, and the split gone)."""
    return batch


def shard_reads_the_group_rank(batch, rank, world):
    """The process group's rank and size instead of the rank and world it is given."""
    x, y = batch
    rank, world = dist.get_rank(), dist.get_world_size()
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_reads_the_slot(batch, rank, world):
    """torchrun's habit: the environment's RANK, which the ft launcher sets to the process's slot."""
    x, y = batch
    rank = int(os.environ["RANK"])
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_world_from_the_environment(batch, rank, world):
    """torchrun's habit for the world: the environment's WORLD_SIZE, which the ft launcher does not set."""
    x, y = batch
    world = int(os.environ["WORLD_SIZE"])
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_slot_or_rank(batch, rank, world):
    """The environment's RANK where there is one (on the ranks: the slot), else the rank it is given."""
    x, y = batch
    rank = int(os.environ.get("RANK", rank))
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


_calls = itertools.count()


def shard_shuffled_each_call(batch, rank, world):
    """A new random order at every call, as torch.randperm from the global generator gives (here seeded by a call
    counter, so the case is deterministic: two calls, two orders, as with the global generator)."""
    x, y = batch
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(next(_calls)))
    rows = order[rank * len(x) // world : (rank + 1) * len(x) // world]
    return x[rows], y[rows]


def shard_ignores_rank(batch, rank, world):
    """The right size for the world, but every rank takes the first rows."""
    x, y = batch
    return x[: len(x) // world], y[: len(x) // world]


def _slot():
    return int(os.environ["RANK"])


def shard_slot_through_a_helper(batch, rank, world):
    """The environment's RANK, read in a helper function of the learner's own, not in shard itself."""
    x, y = batch
    lo, hi = _slot() * len(x) // world, (_slot() + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def _group_rank():
    return dist.get_rank()


def shard_group_rank_through_a_helper(batch, rank, world):
    """The process group's rank, read in a helper function of the learner's own."""
    x, y = batch
    lo, hi = _group_rank() * len(x) // world, (_group_rank() + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_of_twelve_rows(batch, rank, world):
    """12, ToyTask's rows per global batch, hard-coded where len(x) belongs: the checker's batches have 10."""
    x, y = batch
    lo, hi = rank * 12 // world, (rank + 1) * 12 // world
    return x[lo:hi], y[lo:hi]


def shard_of_ten_rows(batch, rank, world):
    """The rung's split of a batch of exactly 10 rows, hard-coded: right for the checker's run, wrong for others."""
    x, y = batch
    rows = list(range(rank * 10 // world, (rank + 1) * 10 // world))
    return x[rows], y[rows]


def shard_wrong_alone(batch, rank, world):
    """The rung's split at worlds 3 and 2; alone (world 1), half the batch: a world the checker's run never has."""
    x, y = batch
    hi = len(x) // 2 if world == 1 else (rank + 1) * len(x) // world
    lo = rank * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_numpy(batch, rank, world):
    """The right rows, returned as numpy arrays."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi].numpy(), y[lo:hi].numpy()


def shard_changes_dtype(batch, rank, world):
    """The right rows, cast to float64: a float32 model's forward fails on every rank, in every attempt."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi].double(), y[lo:hi].double()


def shard_chunked(batch, rank, world):
    """torch's chunk: right for the run's 10 rows at worlds 3, 2, 1, but chunk makes pieces of ceil(B / world) rows,
    so 4 rows at world 3 are 2 pieces of 2, and rank 2 has none (an IndexError)."""
    x, y = batch
    return x.chunk(world)[rank], y.chunk(world)[rank]


def shard_targets_misaligned(batch, rank, world):
    """x's rows and y's rows of the same count, but not the same rows: y taken from the batch shifted by one."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y.roll(1, 0)[lo:hi]


def shard_all_to_rank_zero(batch, rank, world):
    """Every row to rank 0, none to the others: each row trained once, but the work not split."""
    x, y = batch
    rows = slice(None) if rank == 0 else slice(0, 0)
    return x[rows], y[rows]


def shard_split_by_count(batch, rank, world):
    """torch's split read as a count: split(world) cuts pieces of `world` rows, so the ranks take the first pieces."""
    x, y = batch
    return x.split(world)[rank], y.split(world)[rank]


def shard_pieces_of_world_rows(batch, rank, world):
    """split(world)'s pieces cut by hand: `world` taken for a piece's size, x[rank*world:(rank+1)*world]."""
    x, y = batch
    return x[rank * world : (rank + 1) * world], y[rank * world : (rank + 1) * world]


def shard_fixed_pieces_of_four(batch, rank, world):
    """ToyTask's 12 // 3 written as a constant: pieces of 4 rows, whatever `world` and len(x) are."""
    x, y = batch
    return x[4 * rank : 4 * (rank + 1)], y[4 * rank : 4 * (rank + 1)]


def shard_typo_without_parentheses(batch, rank, world):
    """`rank+1*len(x)//world` for `(rank+1)*len(x)//world`: rank 2 of world 3 has none, and rows 4-9 go to no rank."""
    x, y = batch
    lo, hi = rank * len(x) // world, rank + 1 * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_with_its_row_count(batch, rank, world):
    """ToyTask.shard's triple (x, y, the batch's row count) where the checker asks for the pair (x, y)."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi], len(x)


def shard_ceiling_sized(batch, rank, world):
    """ceil(B / world) rows each, the last rank the rest: every row once; at 4 rows and world 3, rank 2 has none,
    but no rank takes more than ceil(4 / 3) = 2 rows, as many as in any split of 4 rows among 3 (right)."""
    x, y = batch
    n = -(-len(x) // world)
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def shard_remainder_to_the_last(batch, rank, world):
    """len(x) // world rows each and the last rank the rest as well: every row once, and right on the run's 10 rows
    (3, 3, 4), but 11 rows at world 3 are 3, 3, 5, where an even split gives no rank more than ceil(11 / 3) = 4."""
    x, y = batch
    n = len(x) // world
    hi = len(x) if rank == world - 1 else (rank + 1) * n
    return x[rank * n : hi], y[rank * n : hi]


def shard_one_remainder_row_to_the_last(batch, rank, world):
    """len(x) // world rows each and one more for the last rank: right on the run's 10 rows (3, 3, 4 at world 3;
    5, 5 at world 2), but 11 rows at world 3 leave a remainder of 2, and row 10 goes to no rank."""
    x, y = batch
    n = len(x) // world
    lo = rank * n
    hi = lo + n + (rank == world - 1)
    return x[lo:hi], y[lo:hi]


def shard_targets_unsliced(batch, rank, world):
    """This rank's rows of x, but all of y: the targets left whole."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y


def shard_inputs_unsliced(batch, rank, world):
    """This rank's rows of y, but all of x: the inputs left whole."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x, y[lo:hi]


#: The environment's RANK read once, when this module ran (on a rank, the launcher's RANK: the process's slot).
SLOT = int(os.environ.get("RANK", 0))


def shard_slot_from_a_global(batch, rank, world):
    """The slot, read from the environment into a module-level global (above), not in shard itself."""
    x, y = batch
    lo, hi = SLOT * len(x) // world, (SLOT + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


# -------------------------------------------------------------------------------- notebook 10: DiLoCo
# The wrong ideas written as a learner would (one flat vector, the mean taken as halves summed or as a sum then
# divided), not the checker's own candidates: the verdicts must name them by what they compute.


def _flat_mean(tensors, halve_first: bool = False, divide: bool = True):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if halve_first:
        flat /= dist.get_world_size()
    dist.all_reduce(flat)
    parts = (flat if halve_first or not divide else flat / dist.get_world_size()).split([t.numel() for t in tensors])
    return [part.view_as(t) for part, t in zip(parts, tensors)]


def _outer(params, synced, outer, pseudo, restore: bool = True, keep: bool = True, clear: bool = False) -> None:
    """The outer step with ``pseudo`` as the gradient: from the synced weights (``restore``), kept (``keep``);
    ``clear``: ``outer.zero_grad()`` between setting the gradients and the step."""
    with torch.no_grad():
        for p, s, g in zip(params, synced, pseudo):
            if restore:
                p.copy_(s)
            p.grad = g.clone()
    if clear:
        outer.zero_grad()
    outer.step()
    if keep:
        with torch.no_grad():
            for p, s in zip(params, synced):
                s.copy_(p)


def outer_sync_flat(params, synced, outer):
    """A right answer, written otherwise: one flat all_reduce of the halves."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)], halve_first=True)
    _outer(params, synced, outer, pseudo)


def outer_sync_local_minus_synced(params, synced, outer):
    """The pseudo-gradient as 'what the replica learnt' (local - synced), stepped as if it were a gradient."""
    with torch.no_grad():
        pseudo = _flat_mean([p - s for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo)


def outer_sync_from_local(params, synced, outer):
    """The averaged pseudo-gradient handed to the outer optimizer while the parameters still hold the local ones."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, restore=False)


def outer_sync_averages_weights(params, synced, outer):
    """'DiLoCo' as the mean of the replicas' weights (local SGD): the outer optimizer never steps."""
    with torch.no_grad():
        for p, s, mean in zip(params, synced, _flat_mean(list(params))):
            p.copy_(mean)
            s.copy_(mean)


def outer_sync_not_averaged(params, synced, outer):
    """Each replica steps with its own pseudo-gradient: nothing is sent."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
    _outer(params, synced, outer, pseudo)


def outer_sync_summed(params, synced, outer):
    """all_reduce sums: the pseudo-gradients added up over the replicas, never divided."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)], divide=False)
    _outer(params, synced, outer, pseudo)


def outer_sync_keeps_the_first_start(params, synced, outer):
    """Right until the end, where the new weights never become the synced ones."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)], halve_first=True)
    _outer(params, synced, outer, pseudo, keep=False)


def outer_sync_forgets_the_grad(params, synced, outer):
    """The average computed and the synced weights put back, but never handed over as .grad: the outer step
    takes whatever the last inner backward left there."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s in zip(params, synced):
            p.copy_(s)
    del pseudo
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_restores_first(params, synced, outer):
    """The synced weights put back first, then synced − local taken: zero, so the outer step never moves."""
    with torch.no_grad():
        for p, s in zip(params, synced):
            p.copy_(s)
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo)


def outer_sync_forgets_the_step(params, synced, outer):
    """Everything but outer.step(): the restored synced weights are kept as they were."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s)
            p.grad = g.clone()
            s.copy_(p)


def outer_sync_keeps_before_the_step(params, synced, outer):
    """The synced weights 'updated' right after the restore, before outer.step(): they never change."""
    outer_sync_forgets_the_step(params, synced, outer)  # everything up to the step, the synced copy included
    outer.step()


def outer_sync_restores_after_the_step(params, synced, outer):
    """The outer step taken from the local weights, then the synced weights put back over its result."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, g in zip(params, pseudo):
            p.grad = g.clone()
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            p.copy_(s)
            s.copy_(p)


def outer_sync_aliases_synced(params, synced, outer):
    """Right, but the new synced weights kept as the parameters themselves (p.detach() shares p's storage)."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, keep=False)
    for i, p in enumerate(params):
        synced[i] = p.detach()


def outer_sync_zero_grad_after_setting(params, synced, outer):
    """Right, but with the training loop's habit: outer.zero_grad() just before outer.step() clears what was set."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, clear=True)


def outer_sync_zero_grad_instead_of_setting(params, synced, outer):
    """Learner read 22 (10-v #1): p.grad = g forgotten, outer.zero_grad() meant to clear the inner gradient: the
    step finds every .grad None, though no .grad was ever set for zero_grad to clear."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s in zip(params, synced):
            p.copy_(s)
    del pseudo  # averaged, never handed to .grad
    outer.zero_grad()
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_without_no_grad(params, synced, outer):
    """The model answer without torch.no_grad(): the in-place copy into a parameter that requires grad raises."""
    pseudo = [s - p for p, s in zip(params, synced)]
    for g in pseudo:
        dist.all_reduce(g)
        g /= dist.get_world_size()
    for p, s, g in zip(params, synced, pseudo):
        p.copy_(s)
        p.grad = g
    outer.step()
    for p, s in zip(params, synced):
        s.copy_(p)


def outer_sync_unfinished(params, synced, outer):
    """Notebook 10's skeleton, not filled in yet."""
    raise NotImplementedError("average the pseudo-gradient, step the outer optimizer from the synced weights")


def outer_sync_rebinds_synced(params, synced, outer):
    """Right, but the new synced weights made by rebinding the name: the caller's list is never changed."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, keep=False)
    synced = [p.detach().clone() for p in params]  # noqa: F841 (the mistake: a new list the caller never sees)


def outer_sync_rebinds_the_division(params, synced, outer):
    """all_reduce in place, then the division rebinding the loop's name: the list keeps the sums."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g)
            g = g / dist.get_world_size()  # noqa: PLW2901 (the mistake: a new tensor, the list keeps the sum)
    _outer(params, synced, outer, pseudo)


def outer_sync_restores_by_data(params, synced, outer):
    """The synced weights put back with p.data = s: the parameter now lives in synced's storage."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s, g in zip(params, synced, pseudo):
            p.data = s
            p.grad = g.clone()
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_by_hand(params, synced, outer):
    """The outer step written by hand (plain SGD at 0.7 from the synced weights), outer.step() never called."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s - 0.7 * g)
            s.copy_(p)


def outer_sync_averages_a_copy(params, synced, outer):
    """The all_reduce on a copy, while .grad gets the replica's own pseudo-gradient."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            mean = g.clone()
            dist.all_reduce(mean)
            mean /= dist.get_world_size()
    _outer(params, synced, outer, pseudo)


def outer_sync_never_waits(params, synced, outer):
    """Notebook 04's async all_reduce, its Work never waited for: the division, p.grad = g and the outer step race
    the all_reduce (what they see depends on timing; the checker names it from the order of the calls)."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g, async_op=True)
            g /= dist.get_world_size()
    _outer(params, synced, outer, pseudo)


def outer_sync_waits_on_its_futures(params, synced, outer):
    """Async all_reduces, each Work's Future waited for before the division: DiLoCo's sync."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        works = [dist.all_reduce(g, async_op=True) for g in pseudo]
        torch.futures.wait_all([w.get_future() for w in works])
        for g in pseudo:
            g /= dist.get_world_size()
    _outer(params, synced, outer, pseudo)


def outer_sync_pseudo_in_synced(params, synced, outer):
    """The pseudo-gradient taken in place in the synced copies (s -= p) and averaged there: the synced weights are
    gone, so the restore (p.copy_(s)) puts the averaged pseudo-gradient in the parameters."""
    with torch.no_grad():
        for p, s in zip(params, synced):
            s -= p
            dist.all_reduce(s)
            s /= dist.get_world_size()
    _outer(params, synced, outer, synced)


def outer_sync_keeps_the_mean(params, synced, outer):
    """Right until the end, where the new synced weights are kept as synced − the averaged pseudo-gradient (the mean
    of the replicas' local weights, "the weights all replicas agreed on"), not the outer step's result."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, keep=False)
    with torch.no_grad():
        for s, g in zip(synced, pseudo):
            s.copy_(s - g)


def outer_sync_sums_the_weights(params, synced, outer):
    """DiLoCo from weight averaging ("stepping by synced − the mean of the local weights"): the local weights
    all_reduced in place and never divided, so the pseudo-gradient is synced − their sum."""
    with torch.no_grad():
        for p in params:
            dist.all_reduce(p)
        pseudo = [s - p for p, s in zip(params, synced)]
    _outer(params, synced, outer, pseudo)


def outer_sync_steps_from_the_mean(params, synced, outer):
    """DiLoCo from weight averaging: the local weights averaged in place, the pseudo-gradient synced − that mean, and
    the outer step taken from the mean left in the parameters, the synced weights never put back."""
    with torch.no_grad():
        for p in params:
            dist.all_reduce(p)
            p /= dist.get_world_size()
        pseudo = [s - p for p, s in zip(params, synced)]
    _outer(params, synced, outer, pseudo, restore=False)


def outer_sync_two_replicas(params, synced, outer):
    """The model answer with the world size written as 2: right on 2 ranks only."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g)
            g /= 2
    _outer(params, synced, outer, pseudo)


# The model answer typed in a notebook whose kernel never imported torch (only torch.distributed as dist): the
# function reaches the checker's ranks without a `torch`, and `torch.no_grad()` raises NameError there.
_kernel = {"dist": dist, "__name__": __name__}
exec(  # noqa: S102
    "def outer_sync_without_import_torch(params, synced, outer):\n"
    "    with torch.no_grad():\n"
    "        pseudo = [s - p for p, s in zip(params, synced)]\n",
    _kernel,
)
outer_sync_without_import_torch = _kernel["outer_sync_without_import_torch"]


def outer_sync_divides_by_world_size(params, synced, outer):
    """The model answer with ``g /= world_size``, as the %%distributed cells had it: a name the checker's ranks lack."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g)
            g /= world_size  # noqa: F821
    _outer(params, synced, outer, pseudo)


def schedule_counts_steps_from_zero(step, sync_every, fragments, delay):
    """The turn's number as step // per_turn, as if steps counted from 0: one step late at each turn's last step."""
    per_turn = sync_every // fragments
    return step // per_turn % fragments if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_true_division(step, sync_every, fragments, delay):
    """A turn's length with / instead of //: the right fragments, as floats (0.0, 1.0, ...)."""
    per_turn = sync_every / fragments
    return (step - 1) // per_turn % fragments if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_by_rank(step, sync_every, fragments, delay):
    """Each replica starts from its own fragment: fragment (turn + rank) % K, so no two send the same one."""
    per_turn = sync_every // fragments
    if step % per_turn != (per_turn - delay) % per_turn:
        return None
    return ((step - 1) // per_turn + dist.get_rank()) % fragments


def schedule_delay_after_the_turn_starts(step, sync_every, fragments, delay):
    """Sent delay steps after the turn starts, not delay steps before it ends (the same only when 2·delay is a turn)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == delay % per_turn else None


def schedule_ignores_the_delay(step, sync_every, fragments, delay):
    """Sent after the first step of every turn, whatever the delay."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == 1 % per_turn else None


def schedule_without_the_modulo(step, sync_every, fragments, delay):
    """The turn's number sent as the fragment: right for one period, then fragments K, K+1, ... that do not exist."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_turn_minus_delay(step, sync_every, fragments, delay):
    """Sent where step % turn == turn - delay: right while delay > 0, never at 0 (step % turn stops at turn - 1)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == per_turn - delay else None


def schedule_next_turns_fragment(step, sync_every, fragments, delay):
    """The fragment of the turn after this one: (step + delay) // turn, the turn the send step's τ steps reach."""
    per_turn = sync_every // fragments
    return (step + delay) // per_turn % fragments if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_previous_turns_fragment(step, sync_every, fragments, delay):
    """The fragment of the turn before this one: step // turn − 1, right only at a delay of 0 (where the send step
    is the turn's last, a multiple of the turn)."""
    per_turn = sync_every // fragments
    return (step // per_turn - 1) % fragments if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_turn_of_sync_every(step, sync_every, fragments, delay):
    """A turn taken as sync_every steps (the ``// fragments`` forgotten): one fragment sent every H steps."""
    return (step - 1) // sync_every % fragments if step % sync_every == (sync_every - delay) % sync_every else None


def schedule_fragment_of_the_period(step, sync_every, fragments, delay):
    """The fragment numbered by the period (``(step - 1) // sync_every``) instead of the turn, the send step right:
    every turn of a period sends the same fragment."""
    turn = sync_every // fragments
    return (step - 1) // sync_every % fragments if step % turn == (turn - delay) % turn else None


def schedule_fragment_of_the_period_from_zero(step, sync_every, fragments, delay):
    """The fragment numbered by the period counted from step 0 (``step // sync_every``), the send step right."""
    turn = sync_every // fragments
    return step // sync_every % fragments if step % turn == (turn - delay) % turn else None


def schedule_numbered_from_one(step, sync_every, fragments, delay):
    """Fragments numbered 1 to K: the right turns, each fragment one too high (K itself at the last turn)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments + 1 if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_every_step(step, sync_every, fragments, delay):
    """The turn's fragment after every step of the turn, not once, delay steps before its end."""
    return (step - 1) // (sync_every // fragments) % fragments


def schedule_at_the_end_of_the_turn(step, sync_every, fragments, delay):
    """Sent when the turn ends, not delay steps before: no step left to overlap the message with."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == 0 else None


class BroadcastFromOwnRank(solutions.SimpleDDP):
    """Broadcasts with src=rank: every rank thinks it is the source, so none receives rank 0's weights."""

    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module, self.process_group = module, process_group
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=dist.get_rank())


def shard_last_row_short(batch, rank, world):
    """An exclusive end taken one row short: `hi - 1` in a slice whose end is already excluded."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world - 1
    return x[lo:hi], y[lo:hi]


def shard_ranks_from_one(batch, rank, world):
    """Ranks counted from 1: rank r takes rows (r-1)·B // world up to r·B // world, the ft rung's rank r - 1's, so
    rank 0's slice x[-4:0] (B = 10, world 3) is empty and the last rank's share goes to no rank."""
    x, y = batch
    lo, hi = (rank - 1) * len(x) // world, rank * len(x) // world
    return x[lo:hi], y[lo:hi]


def shard_last_end_minus_one(batch, rank, world):
    """The last rank's slice ended at -1, read as "to the end" (or as an inclusive end): x[lo:-1] leaves out the
    batch's last row."""
    x, y = batch
    lo = rank * len(x) // world
    hi = (rank + 1) * len(x) // world if rank < world - 1 else -1
    return x[lo:hi], y[lo:hi]


def shard_targets_squeezed(batch, rank, world):
    """The right rows, but y squeezed to 1-D: (rows,) where the batch's targets are (rows, 1)."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi].squeeze()


def shard_one_row_per_rank(batch, rank, world):
    """One row per rank: the rank's number used as an index, x[rank], which takes one row (and drops the row
    dimension) where the rank's share of the batch's rows is a range of them."""
    x, y = batch
    return x[rank], y[rank]


def shard_ceiling_pieces_by_hand(batch, rank, world):
    """chunk written by hand: pieces of ceil(B / world) rows, piece `rank` taken; 4 rows at world 3 make 2 pieces,
    and rank 2's index is past the last (an IndexError), with no call to chunk for the checker to read."""
    x, y = batch
    size = -(-len(x) // world)
    return torch.split(x, size)[rank], torch.split(y, size)[rank]


def shard_rows_from_the_features(batch, rank, world):
    """The row count taken from the wrong dimension: x.shape[1], each row's 8 features, where the rows are len(x) =
    x.shape[0] (10): a fixed 8 rows split, 2, 3, 3 at world 3, and rows 8-9 go to no rank."""
    x, y = batch
    n = x.shape[1]
    lo, hi = rank * n // world, (rank + 1) * n // world
    return x[lo:hi], y[lo:hi]


def shard_world_before_rank(batch, world, rank):
    """The model answer's split with its last two parameters in the other order: called shard(batch, rank, world),
    its `world` is the rank given, 0 for rank 0 (a ZeroDivisionError)."""
    x, y = batch
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    return x[lo:hi], y[lo:hi]


def outer_sync_flipped_from_local(params, synced, outer):
    """Two mistakes at once: local − synced averaged, and the outer step taken from the local weights."""
    with torch.no_grad():
        pseudo = _flat_mean([p - s for p, s in zip(params, synced)])
    _outer(params, synced, outer, pseudo, restore=False)


def outer_sync_summed_and_stale(params, synced, outer):
    """Two mistakes at once: the pseudo-gradients summed, and the synced weights never updated."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)], divide=False)
    _outer(params, synced, outer, pseudo, keep=False)


def outer_sync_with_avg(params, synced, outer):
    """DiLoCo's sync with the average taken by the all_reduce itself (ReduceOp.AVG): right where the backend has it."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
    _outer(params, synced, outer, pseudo)


def outer_sync_avg_then_divided(params, synced, outer):
    """The average taken twice: all_reduce with ReduceOp.AVG (already the mean), then divided by the world size
    again, so the pseudo-gradient is the mean over the world size (half of it on 2 ranks)."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
            g /= dist.get_world_size()
    _outer(params, synced, outer, pseudo)


def outer_sync_refused_avg(params, synced, outer):
    """What outer_sync_with_avg meets on a torch whose gloo has no ReduceOp.AVG (2.6, 2.7): gloo's own refusal,
    raised here in its words, since this torch's gloo averages."""
    raise RuntimeError("Cannot use ReduceOp.AVG with Gloo")


def outer_sync_averages_inner_grads(params, synced, outer):
    """The inner gradients (what the last backward left in p.grad) averaged over the replicas, the synced weights
    put back, and the outer optimizer stepped with them: a DDP step's gradient, not the pseudo-gradient."""
    with torch.no_grad():
        for p, s in zip(params, synced):
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
            p.copy_(s)
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def schedule_one_step_early(step, sync_every, fragments, delay):
    """Sent one step before streaming DiLoCo's send step: turn − delay − 1 (an off-by-one in the send step)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == (per_turn - delay - 1) % per_turn else None


def schedule_one_step_late(step, sync_every, fragments, delay):
    """Sent one step after streaming DiLoCo's send step: turn − delay + 1 (an off-by-one in the send step)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if step % per_turn == (per_turn - delay + 1) % per_turn else None


def outer_sync_fresh_outer(params, synced, outer):
    """DiLoCo's sync with an outer SGD (0.7, Nesterov momentum 0.9) made anew at each sync, not the `outer` passed in:
    its momentum is lost between syncs."""
    fresh = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s)
            p.grad = g.clone()
    fresh.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def schedule_fragment_by_the_step(step, sync_every, fragments, delay):
    """The right send step, the fragment numbered by the step, (step − 1) % fragments, instead of by the turn."""
    per_turn = sync_every // fragments
    return (step - 1) % fragments if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_always_fragment_0(step, sync_every, fragments, delay):
    """The right send step, fragment 0 every time."""
    per_turn = sync_every // fragments
    return 0 if step % per_turn == (per_turn - delay) % per_turn else None


def schedule_late_from_zero(step, sync_every, fragments, delay):
    """Steps made 0-based on one side only: (step − 1) % turn == turn − delay, one step late at every delay above 0
    and silent at 0 (a remainder never reaches turn)."""
    per_turn = sync_every // fragments
    return (step - 1) // per_turn % fragments if (step - 1) % per_turn == per_turn - delay else None


def hook_without_async_op(process_group, bucket):
    """Leaves out async_op=True: the all_reduce blocks and returns None, which has no .get_future()."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_then_on_the_work(process_group, bucket):
    """Calls .then on what all_reduce(async_op=True) returns, a Work, without taking its Future (.get_future())."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    return dist.all_reduce(compressed, async_op=True).then(lambda f: f.value()[0].to(torch.float32))


def hook_divides_by_world_size(process_group, bucket):
    """Divides by world_size, the %%distributed cells' name: the kernel, whose names the hook runs with, has none."""
    compressed = bucket.buffer().to(torch.float16).div_(world_size)  # noqa: F821 (the mistake)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_divides_by_n(process_group, bucket):
    """Divides by n, notebook 04's n = world_size of a %%rank cell: the kernel, whose names the hook runs with, has
    none (learner read 04-f 5)."""
    compressed = bucket.buffer().to(torch.float16).div_(n)  # noqa: F821 (the mistake)
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_asks_the_state_its_size(process_group, bucket):
    """Divides by process_group.size(): in training the state is None (the default group), which has no .size()."""
    compressed = bucket.buffer().to(torch.float16).div_(process_group.size())
    fut = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_ignores_the_group(process_group, bucket):
    """Right in every number, but on the default group: dist.get_world_size() and all_reduce without group=, whatever
    process group it is handed (learner read 04, round 23, 1)."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def hook_passes_the_group_as_handed(process_group, bucket):
    """A right answer: the group as handed, None in training (the default group) included, with no dist.group.WORLD
    in its place, as notebook 04's cell asks (learner read 04, round 24, 4)."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size(process_group))
    fut = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(torch.float32))


def outer_sync_avg_then_divided_and_rebinds_synced(params, synced, outer):
    """Two mistakes at once: the average taken twice (ReduceOp.AVG, then / world again), and the new synced weights
    made by rebinding the name (the caller's list never changes)."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
            g /= dist.get_world_size()
    _outer(params, synced, outer, pseudo, keep=False)
    synced = [p.detach().clone() for p in params]  # noqa: F841 (the second mistake)


def outer_sync_inner_grads_from_local(params, synced, outer):
    """Two mistakes at once: the inner gradients averaged in place of the pseudo-gradient, and the outer step taken
    from the local weights (no restore)."""
    with torch.no_grad():
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_keeps_before_the_restore(params, synced, outer):
    """The new synced weights copied from the parameters before the restore (s.copy_(p) first): the synced weights
    become the local ones, the restore puts the local weights back, and the outer step starts from them."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s in zip(params, synced):
            s.copy_(p)
    _outer(params, synced, outer, pseudo, keep=False)


def outer_sync_keeps_the_avg_result(params, synced, outer):
    """Learner read 10-r11: all_reduce's result kept as the gradient, p.grad = dist.all_reduce(s - p, op=AVG):
    all_reduce returns None, so every .grad is None and the step moves nothing, with no zero_grad called."""
    with torch.no_grad():
        for p, s in zip(params, synced):
            g = s - p
            p.copy_(s)
            p.grad = dist.all_reduce(g, op=dist.ReduceOp.AVG)
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_divides_the_sum_result(params, synced, outer):
    """Learner read 10-r11: g = dist.all_reduce(s - p), then g /= world: the None all_reduce returns, divided."""
    with torch.no_grad():
        for p, s in zip(params, synced):
            g = dist.all_reduce(s - p)
            g /= dist.get_world_size()
            p.copy_(s)
            p.grad = g
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_copies_into_cleared_grads(params, synced, outer):
    """Learner read 10-r11: outer.zero_grad() (each .grad set to None), then p.grad.copy_(g): there is no .grad."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
    outer.zero_grad()
    with torch.no_grad():
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s)
            p.grad.copy_(g)
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def schedule_forgets_the_return(step, sync_every, fragments, delay):
    """The send branch computes the fragment and never returns it: None after every step, at every delay."""
    turn = sync_every // fragments
    if step % turn == (turn - delay) % turn:
        fragment = (step - 1) // turn % fragments  # noqa: F841 (the mistake: no return)
    return None


def outer_sync_steps_per_parameter(params, synced, outer):
    """outer.step() inside the loop over the parameters: each call steps every parameter, those not yet handled
    with the inner gradient still in their .grad, and the momentum builds up once per parameter."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g)
            g /= dist.get_world_size()
    for p, s, g in zip(params, synced, pseudo):
        with torch.no_grad():
            p.copy_(s)
        p.grad = g
        outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_all_in_one_loop(params, synced, outer):
    """The whole sync per parameter in one loop (average, restore, .grad, outer.step(), keep), so the outer
    optimizer steps once per parameter."""
    for p, s in zip(params, synced):
        with torch.no_grad():
            g = s - p
            dist.all_reduce(g)
            g /= dist.get_world_size()
            p.copy_(s)
        p.grad = g
        outer.step()
        with torch.no_grad():
            s.copy_(p)


def schedule_and_or(step, sync_every, fragments, delay):
    """``cond and fragment``: False (not None) on every step that sends nothing."""
    per_turn = sync_every // fragments
    return step % per_turn == (per_turn - delay) % per_turn and (step - 1) // per_turn % fragments


def schedule_steps_from_zero_throughout(step, sync_every, fragments, delay):
    """Steps counted from 0 in both halves: sent where step % turn == turn − delay − 1, the fragment step // turn;
    at every step what streaming DiLoCo sends one step later (learner read 10-r10 finding 5a)."""
    per_turn = sync_every // fragments
    return step // per_turn % fragments if step % per_turn == per_turn - delay - 1 else None


def schedule_period_fragment_silent_at_zero(step, sync_every, fragments, delay):
    """The fragment numbered by the period, (step − 1) // sync_every, and the send step tested as
    step % turn == turn − delay, silent at a delay of 0 (learner read 10-r10 finding 5b)."""
    per_turn = sync_every // fragments
    return (step - 1) // sync_every % fragments if step % per_turn == per_turn - delay else None


def schedule_position_in_the_period(step, sync_every, fragments, delay):
    """The fragment taken from the step's place in the period, (step % sync_every − 1) // turn, with the right send
    step: right until a period's last step sends, where step % sync_every is 0 and it sends −1 (learner read
    10-r16 finding 3: named as a missing ``% fragments``)."""
    per_turn = sync_every // fragments
    return (step % sync_every - 1) // per_turn if step % per_turn == (per_turn - delay) % per_turn else None


def outer_sync_adds_to_the_grad(params, synced, outer):
    """The averaged pseudo-gradient added onto .grad (p.grad += g) in place of set: the last inner backward's
    gradient, still in .grad, rides along into the outer step."""
    with torch.no_grad():
        pseudo = _flat_mean([s - p for p, s in zip(params, synced)])
        for p, s, g in zip(params, synced, pseudo):
            p.copy_(s)
            p.grad += g
    outer.step()
    with torch.no_grad():
        for p, s in zip(params, synced):
            s.copy_(p)


def outer_sync_per_step_gradient(params, synced, outer):
    """The pseudo-gradient made a per-step gradient: averaged over the replicas and over the H = 10 inner steps of
    notebook 10's first run as well (``g /= world * H``), so the outer step gets a tenth of DiLoCo's."""
    with torch.no_grad():
        pseudo = [s - p for p, s in zip(params, synced)]
        for g in pseudo:
            dist.all_reduce(g)
            g /= dist.get_world_size() * 10
    _outer(params, synced, outer, pseudo)
