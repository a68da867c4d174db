"""The reducer: buckets of gradients, reduced during backward, in order, finished inside ``backward()``.

:mod:`minddp.stages.bucket_async` grown into what torch's C++ ``Reducer`` does for its DDP:

1. **plan and buffers** (as ``bucket``): one flat buffer per bucket, allocated once; torch's first
   plan, rebuilt once from the observed gradient order (:mod:`minddp.ddp.plan`);
2. **autograd hooks** (as ``hook``): each parameter counted ready in its bucket; hooks of a backward
   that did not go through the wrapper's forward are ignored, as torch ignores them;
3. **in-order launch** (new): a full bucket is sent only once every lower-index one has been, so no
   rank pairs bucket 2 with another rank's bucket 1;
4. **the send**: gradients copied into the bucket, handed to the comm hook or the fast built-in
   average (:mod:`minddp.ddp.fast`); with ``gradient_as_bucket_view`` each ``.grad`` *is* its slot;
5. **automatic end of backward** (new): a callback queued on autograd's engine when backward reaches
   the forward's outputs launches unfilled buckets, settles unused parameters, waits, writes back.

Each step in order, and where it follows torch: ``docs/ddp.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import DistributedDataParallel
    >>> ddp = DistributedDataParallel(torch.nn.Linear(4, 2))         # owns a Reducer
    >>> ddp(torch.ones(3, 4)).sum().backward()       # buckets sent, waited for and written back in here
    >>> ddp.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import launch_label
from minddp.comm.wire import Wire
from minddp.ddp.fast import BucketLayout, builtin_average, named_range
from minddp.ddp.plan import agree_on_order, plan_first_iteration_like_torch, plan_from_order
from minddp.debug.ddp_guards import (
    check_consistency,
    check_same_settings,
    describe_hook_state,
    finite_check,
    unfinished_reduction,
)
from minddp.runtime import compat
from minddp.runtime.device import message_device
from minddp.stages.graph import parameters_reached, tensors_in


class Progress:
    """What the current synced backward has delivered so far; a fresh one for each.

    A plain object rather than attributes of an ``nn.Module``: every assignment
    to a module attribute first checks whether the value is a parameter, a
    buffer or a submodule (a few µs each, mid-backward), and this bookkeeping
    changes many times a step.
    """

    __slots__ = ("remaining", "ready", "started", "through_outputs", "filled", "next_bucket", "launched")

    def __init__(self, layouts: list[BucketLayout]):
        self.remaining = [len(layout.params) for layout in layouts]  # gradients still to come, per bucket
        self.ready: set[int] = set()  # id() of each parameter delivered
        self.started = False  # step 5's callback queued
        self.through_outputs = False  # ... by an output's gradient hook
        self.filled = [False] * len(layouts)
        self.next_bucket = 0  # the lowest-index bucket not sent yet
        self.launched: list[int] = []  # send order (read by the debug guard)


@dataclass
class Pending:
    """A bucket whose communication is in flight."""

    bucket: GradBucket
    layout: BucketLayout
    future: torch.futures.Future
    hook_name: str
    expected: tuple  # (numel, dtype) of the buffer the hook was handed
    check: Callable[[torch.Tensor], None] | None = None  # the NaN/Inf check, run once the result is in


class Reducer:
    """Owns the buckets of one ``DistributedDataParallel`` and syncs them during backward (module doc)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        names: list[str],
        group: dist.ProcessGroup,
        bucket_cap_mb: float | None,
        first_bucket_cap_mb: float | None,
        find_unused_parameters: bool,
        gradient_as_bucket_view: bool,
    ):
        self.params, self.names, self.group = params, names, group
        self.bucket_cap_mb, self.first_bucket_cap_mb = bucket_cap_mb, first_bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.position = {id(p): i for i, p in enumerate(params)}
        # No hook registered: the built-in average on a plain wire.
        self.hook, self.state, self.hook_registered = allreduce_hook, Wire(group), False
        self.check_consistency = False
        self.check_finite = False
        self.static_graph = False  # set before the first iteration (DistributedDataParallel._set_static_graph)
        self.static_unused: list[nn.Parameter] = []  # with static_graph: what the first iteration did not use
        self.divisor: int | None = None  # average over this many ranks (None: the world; join can lower it)
        self.expect_hooks = False  # set by a forward whose backward syncs, cleared at its end
        self.local_used = torch.zeros(len(params), dtype=torch.bool)
        self.unused_here: list[nn.Parameter] = []  # not in this forward's graph (find_unused)
        self.ready_order: list[int] = []  # first synced backward's gradient-ready order
        self.synced_steps = 0
        self.rebuilt = False
        self.unfinished: list[str] = []  # parameters left without gradient last time
        self.pending: list[Pending] = []
        self.settings_checked = False
        self.set_plan(
            plan_first_iteration_like_torch(params, bucket_cap_mb, first_bucket_cap_mb, find_unused_parameters)
        )  # step 1
        self.output_hook = _weak_method(self._on_output_grad)  # weak: output tensors may outlive the reducer
        on_grad_ready = _weak_method(self._on_grad_ready)  # step 2
        self.handles = [p.register_post_accumulate_grad_hook(on_grad_ready) for p in params]
        weakref.finalize(self, _remove_all, self.handles)
        # Where each hook sits (its parameter's hook dict and key), to take it out and put it back (hooks_for).
        self.hook_slots = compat.hook_slots(self.handles)
        self.hook_fn = on_grad_ready
        self.hooks_live = True

    # -- step 1: the plan -----------------------------------------------------------------------------

    def set_plan(self, plan: list[list[int]]) -> None:
        """Lay out buckets for ``plan`` (lists of indices into ``params``)."""
        self.plan = plan
        self.layouts = [BucketLayout([self.params[i] for i in bucket]) for bucket in plan]
        self.buffers = [
            torch.empty(layout.numel, dtype=layout.params[0].dtype, device=layout.params[0].device)
            for layout in self.layouts
        ]
        self.bucket_of = {id(self.params[i]): b for b, bucket in enumerate(plan) for i in bucket}
        self.progress = Progress(self.layouts)
        if self.gradient_as_bucket_view:
            # New buffers: move existing gradients into them, so .grad keeps being a bucket view.
            for layout, flat in zip(self.layouts, self.buffers):
                flat.zero_()
                for param, view in zip(layout.params, layout.views(flat)):
                    if param.grad is not None:
                        view.copy_(param.grad)
                        param.grad = view

    def searching_unused(self) -> bool:
        """Does this iteration walk the graph and all_reduce the used-bitmap? (find_unused, or static's first)"""
        return self.find_unused_parameters or (self.static_graph and self.synced_steps == 0)

    def maybe_rebuild(self) -> None:
        """At a forward: rebuild the plan once from the first synced backward's order (same on every rank)."""
        if self.rebuilt or self.find_unused_parameters or self.synced_steps == 0:
            return
        self.rebuilt = True
        order = agree_on_order(self.ready_order, len(self.params), self.group)
        if order is not None:
            self.set_plan(plan_from_order(self.params, order, self.bucket_cap_mb, self.first_bucket_cap_mb))

    def settled_plan(self) -> list[list[int]] | None:
        """The plan every later step sends (for a checkpoint); None before the first synced step (call on every rank).

        The one rebuild comes at the forward after the first synced backward; a
        save between the two does it now (the same broadcast, so the same plan
        on every rank), so what a checkpoint keeps is what the next step sends.
        """
        if self.synced_steps == 0:
            return None
        self.maybe_rebuild()
        return [list(bucket) for bucket in self.plan]

    def load_plan(self, plan: list[list[int]]) -> None:
        """Start from a :meth:`settled_plan` saved by a run of this model: its buckets from the first step, no rebuild.

        No rebuild because the saved run did its one rebuild before the plan was
        saved (with ``find_unused_parameters`` there is none, in torch as here):
        a per-bucket memory saved beside the plan (PowerSGD's) fits its buckets.
        """
        if self.synced_steps or self.pending:
            raise RuntimeError("a saved bucket plan is set before the first training step; build a new wrapper for it")
        _check_plan(plan, self.params)
        self.set_plan([list(bucket) for bucket in plan])
        self.rebuilt = True

    def register_comm_hook(self, state, hook) -> None:
        """Send buckets through ``hook(state, bucket)``; minddp's own ``allreduce_hook`` is the built-in."""
        if not callable(hook):
            raise TypeError(
                f"comm hook must be callable as hook(state, bucket) -> torch.futures.Future, got "
                f"{type(hook).__name__}; pass the function itself, e.g. register_comm_hook(None, allreduce_hook)"
            )
        if self.hook_registered:
            raise RuntimeError("register_comm_hook can only be called once; build a new wrapper to use another hook")
        self.hook, self.hook_registered = hook, True
        # minddp's allreduce_hook computes what the built-in average computes; torch keeps its built-in
        # hooks in C++ too. The state given (a group, or a Wire with a meter or transport) is honoured.
        self.state = Wire.of(state) if hook is allreduce_hook else state

    # -- forward: what the coming backward needs ------------------------------------------------------

    def hooks_for(self, will_sync: bool) -> None:
        """Step 2's hooks in place for a forward whose backward syncs; out of the way of a ``no_sync`` one.

        torch's reducer hooks are C++ and cost nothing in a backward that does
        not sync. A Python hook costs about a microsecond per parameter (the
        engine takes the GIL, wraps the parameter, runs a frame), on every
        ``no_sync`` micro-batch, only to return. So a forward that will not
        sync takes the hooks out of the parameters' hook dicts (a dict delete
        each) and the next synced forward puts them back: twice per optimizer
        step under gradient accumulation, never without it. They stay while a
        synced forward's backward is still to come (``expect_hooks``: a
        ``no_sync`` forward may come between the two), and while ``no_sync``
        backwards must record which parameters they use (``searching_unused``).
        Put back, a hook runs after the parameter's other post-accumulate-grad
        hooks, where torch's reducer hook runs.
        """
        live = will_sync or self.expect_hooks or self.searching_unused()
        if live == self.hooks_live:
            return
        self.hooks_live = live
        compat.put_hooks(self.hook_slots, self.hook_fn if live else None)

    def check_prior_reduction_finished(self) -> None:
        if self.unfinished:  # the last synced backward left parameters without a gradient: say why (guard.py)
            frozen = [n for n in self.unfinished if not self.params[self.names.index(n)].requires_grad]
            raise unfinished_reduction(self.unfinished, frozen, self.find_unused_parameters, dist.get_rank(self.group))

    def prepare_for_backward(self, outputs: Any) -> None:
        """The coming backward syncs; with ``find_unused_parameters``, note what its graph will not reach."""
        self.expect_hooks = True
        for tensor in tensors_in(outputs):  # step 5: the backward reaches the outputs first
            if tensor.requires_grad:
                tensor.register_hook(self.output_hook)
        if self.searching_unused():
            reached = parameters_reached(outputs)
            self.unused_here = [p for p in self.params if id(p) not in reached]
        elif self.static_graph:
            self.unused_here = self.static_unused

    # -- steps 2-4: during backward -------------------------------------------------------------------

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        if self.expect_hooks:
            self._start_backward(through_outputs=True)

    def _start_backward(self, through_outputs: bool) -> None:
        """Step 5: once per synced backward, queue the end-of-backward callback."""
        progress = self.progress
        if progress.started:
            return
        progress.started, progress.through_outputs = True, through_outputs
        compat.at_backward_end(self._finalize_backward)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if self.searching_unused():  # no_sync backwards count as use too; only read then
            self.local_used[self.position[id(param)]] = True
        if self.expect_hooks:
            self._grad_ready(param)

    def _grad_ready(self, param: nn.Parameter) -> None:
        progress = self.progress
        if not progress.started:  # a backward that did not pass through the outputs' hooks
            self._start_backward(through_outputs=False)
        if not progress.ready:  # the first gradient: the unused parameters are ready too (as torch)
            for unused in self.unused_here:
                self._mark_ready(unused)
        if self.synced_steps == 0:  # the first synced backward's order feeds the rebuild
            self.ready_order.append(self.position[id(param)])
        self._mark_ready(param)

    def _mark_ready(self, param: nn.Parameter) -> None:
        b, progress = self.bucket_of[id(param)], self.progress
        if id(param) in progress.ready:
            raise RuntimeError(
                f"gradient of {self.names[self.position[id(param)]]!r} became ready twice in one backward "
                "(a parameter used in the forward of an earlier backward of the same step?); "
                "run the extra backwards inside no_sync()"
            )
        progress.ready.add(id(param))
        progress.remaining[b] -= 1
        if progress.remaining[b] == 0:
            self._bucket_filled(b)

    def _bucket_filled(self, b: int) -> None:
        progress = self.progress
        progress.filled[b] = True  # step 3
        while progress.next_bucket < len(self.layouts) and progress.filled[progress.next_bucket]:
            progress.launched.append(progress.next_bucket)
            self._launch(progress.next_bucket)
            progress.next_bucket += 1

    def _launch(self, b: int) -> None:
        """Step 4: copy the bucket's gradients into its buffer and send it."""
        layout, flat = self.layouts[b], self.buffers[b]
        views, grads = layout.views(flat), [p.grad for p in layout.params]
        if any(g is None for g in grads):
            for view, grad in zip(views, grads):
                view.zero_() if grad is None else view.copy_(grad)
        else:
            compat.foreach_copy_(views, grads)  # one call for the whole bucket, not one per gradient
        if not self.settings_checked:  # once, before the first collective of the first sync
            check_same_settings(self.settings(), self.group)
            self.settings_checked = True
        bucket = GradBucket(b, flat, layout.params, is_last=b == len(self.layouts) - 1)
        local_finite = bool(torch.isfinite(flat).all()) if self.check_finite else True
        if self.hook is allreduce_hook:
            with named_range(lambda: launch_label(bucket, allreduce_hook)):
                future = builtin_average(self.state, layout, flat, self.divisor)
        else:
            future = self._run_hook(bucket)
        pending = Pending(
            bucket, layout, future, getattr(self.hook, "__name__", type(self.hook).__name__), (flat.numel(), flat.dtype)
        )
        if self.check_finite:
            names = [self.names[self.position[id(p)]] for p in layout.params]
            pending.check = finite_check(b, names, local_finite, dist.get_rank(self.group))
        self.pending.append(pending)
        if self.gradient_as_bucket_view:
            for param, view in zip(layout.params, views):
                if param.grad is not None:
                    param.grad = view  # the reduction lands in .grad directly: no copy back

    def _run_hook(self, bucket: GradBucket) -> torch.futures.Future:
        with named_range(lambda: launch_label(bucket, self.hook)):
            future = self.hook(self.state, bucket)
        if not isinstance(future, compat.future_type()):  # a collective's own Future, or a torch.futures.Future
            raise TypeError(
                f"comm hook {getattr(self.hook, '__name__', self.hook)} returned {type(future).__name__}, not a "
                "torch.futures.Future; return the future of the collective (e.g. dist.all_reduce(..., "
                "async_op=True).get_future()) or fut.then(...)"
            )
        return future

    def settings(self) -> dict:
        """What all ranks must agree on to pair their collectives: hook, its state, bucket sizes, cap."""
        return {
            "hook": getattr(self.hook, "__name__", type(self.hook).__name__),
            "hook state": describe_hook_state(self.state) if self.hook_registered else None,
            "bucket sizes": [layout.numel for layout in self.layouts],
            "bucket_cap_mb": self.bucket_cap_mb,
        }

    # -- step 5: end of backward ----------------------------------------------------------------------

    def _finalize_backward(self) -> None:
        """Run by autograd at the end of each synced backward."""
        progress = self.progress
        if not progress.ready:
            # No parameter's gradient came (autograd.grad on the outputs, as a gradient penalty does): as in
            # torch, whose reducer hears only the parameters' hooks, the step's backward is still to come.
            progress.started = False
            return
        unfinished = [b for b, filled in enumerate(progress.filled) if not filled]
        missing = [
            self.names[self.position[id(p)]]
            for b in unfinished
            for p in self.layouts[b].params
            if id(p) not in progress.ready
        ]
        for b in unfinished:
            self._bucket_filled(b)  # zeros for the missing gradients: every rank sends every bucket
        if self.searching_unused():
            used = self._give_grads_to_globally_used()
            if self.static_graph:  # learnt once: these stay unused, and join the rebuilt plan last
                self.static_unused = [p for i, p in enumerate(self.params) if not used[i]]
                self.ready_order += [i for i in range(len(self.params)) if not used[i]]
        if self.check_consistency:
            check_consistency(
                self.plan, [layout.numel for layout in self.layouts], progress.launched, self.names, self.group
            )
        # Raised at the next forward, like torch; with find_unused_parameters a parameter reached from
        # an output the loss did not use simply got no gradient (torch's hooks fire for it, with zeros),
        # if the backward went through the outputs at all (torch's _DDPSink; not a gradient penalty alone).
        settled = (self.find_unused_parameters and progress.through_outputs) or self.static_graph
        self.unfinished = [] if settled else missing
        self.progress = Progress(self.layouts)
        self.unused_here = []
        self.expect_hooks = False
        self.wait_and_write_back()
        self.synced_steps += 1

    def _give_grads_to_globally_used(self) -> torch.Tensor:
        """A parameter another rank used gets the average here too; one nobody used keeps its .grad."""
        counts = self.local_used.to(message_device(self.group), torch.int32)
        dist.all_reduce(counts, group=self.group)  # bookkeeping, not gradient traffic: not metered
        self.local_used.zero_()
        used = counts > 0
        for i, param in enumerate(self.params):
            if counts[i] > 0 and param.grad is None:
                if not self.gradient_as_bucket_view:
                    param.grad = torch.zeros_like(param)  # the average is copied into it
                    continue
                b = self.bucket_of[id(param)]
                slot = next(k for k, p in enumerate(self.layouts[b].params) if p is param)
                param.grad = self.layouts[b].views(self.buffers[b])[slot]
        return used

    def wait_and_write_back(self) -> None:
        """Wait for every bucket in flight, check what the hooks returned, copy the averages into ``.grad``."""
        pending, self.pending = self.pending, []
        for p in pending:
            result = p.future.wait()
            if isinstance(result, list) and len(result) == 1:  # collectives' own futures hold [tensor]
                result = result[0]
            numel, dtype = p.expected
            if not isinstance(result, torch.Tensor) or result.numel() != numel:
                got = f"shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else type(result).__name__
                raise RuntimeError(
                    f"comm hook {p.hook_name} returned {got} for bucket {p.bucket.index()}, but a hook must return "
                    f"a tensor of the bucket buffer's shape ({numel},): decompress before returning"
                )
            # Another dtype (torch's fp16_compress_wrapper returns its fp16 buffer) is cast back, as torch does.
            result = result.view(-1).to(dtype)
            if p.check is not None:
                p.check(result)
            layout = p.layout
            pairs = [
                (param.grad, view)
                for param, view, there in zip(layout.params, layout.views(result), layout.grads_in(result))
                if param.grad is not None and not there
            ]
            if pairs:
                compat.foreach_copy_([g for g, _ in pairs], [v for _, v in pairs])  # one call per bucket

    def shadow_backward(self) -> None:
        """A joined rank's part in a step of the others: every collective of a synced backward, with zeros.

        The same buckets in the same order through the same hook (so a hook
        that sends several collectives per bucket, like PowerSGD, is matched
        too), then the unused-parameter bitmap and the debug guard.
        """
        if not self.settings_checked:
            check_same_settings(self.settings(), self.group)
            self.settings_checked = True
        futures = []
        for b, (layout, buffer) in enumerate(zip(self.layouts, self.buffers)):
            flat = torch.zeros_like(buffer)  # not the buffer itself: with bucket views it is .grad
            bucket = GradBucket(b, flat, layout.params, is_last=b == len(self.layouts) - 1)
            futures.append(
                builtin_average(self.state, layout, flat) if self.hook is allreduce_hook else self._run_hook(bucket)
            )
        for future in futures:
            future.wait()
        if self.searching_unused():
            dist.all_reduce(
                torch.zeros(len(self.params), dtype=torch.int32, device=message_device(self.group)), group=self.group
            )
        if self.check_consistency:
            check_consistency(
                self.plan,
                [layout.numel for layout in self.layouts],
                list(range(len(self.layouts))),
                self.names,
                self.group,
            )
        self.synced_steps += 1

    def work_in_flight(self) -> bool:
        return bool(self.pending)


def _check_plan(plan, params: list[nn.Parameter]) -> None:
    """A one-line ValueError unless ``plan`` puts each of ``params`` in one bucket, of one dtype and device."""
    n = len(params)
    ok = isinstance(plan, (list, tuple)) and all(
        isinstance(b, (list, tuple)) and b and all(isinstance(i, int) and 0 <= i < n for i in b) for b in plan
    )
    if not ok or sorted(i for b in plan for i in b) != list(range(n)):
        raise ValueError(
            f"this bucket plan does not fit the model: a plan lists each of its {n} trainable parameters "
            "(indices 0..n-1) in exactly one non-empty bucket; load the plan saved by a run of this model"
        )
    mixed = [b for b, bucket in enumerate(plan) if len({(params[i].dtype, params[i].device) for i in bucket}) > 1]
    if mixed:
        raise ValueError(
            f"this bucket plan does not fit the model: bucket {mixed[0]} mixes dtypes or devices; "
            "load the plan saved by a run of this model"
        )


def _weak_method(method):
    """A function calling ``method`` while its object lives, doing nothing after.

    weakref.WeakMethod would do, but its ``__call__`` builds a bound method on
    every call, and this runs once per parameter per backward. Weak because the
    parameters keep their hooks on autograd's C++ side, where a cycle back to
    the reducer would never be collected.
    """
    func, ref = method.__func__, weakref.ref(method.__self__)

    def call(*args):
        obj = ref()
        if obj is not None:
            func(obj, *args)

    return call


def _remove_all(handles: list) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()
