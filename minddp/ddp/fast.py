"""The production DDP's fast path: the built-in average, sent the way torch's C++ reducer sends it.

The teaching stages send every bucket through a Python comm hook (readable, a few tens of
microseconds a bucket). The production DDP, for plain averaging, does the same average with three
differences, for speed or for bit-for-bit parity with torch's DDP:

1. **views computed once** (:class:`BucketLayout`): where each gradient sits in its bucket;
2. **the same rounding as torch** (:func:`scale_like_torch`): ``× 1/world`` as a gradient is copied
   in, ``÷ world`` for one already there (``gradient_as_bucket_view``): for world sizes that are not
   powers of two the two differ in the last bit, and doing as torch does trains bit for bit like it;
3. **straight to the process group** (:func:`start_sum`): options built once, the collective's own
   Future, no Python callback (which would wait for the GIL on gloo's worker thread).

The wire's transport, meter and link are honoured: only how a sum is started changes. Where each
piece sits in torch: ``docs/ddp.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.comm.wire import Wire
    >>> params = [torch.ones(2, 2), torch.ones(3)]
    >>> flat = torch.cat([p.reshape(-1) for p in params]) * 2      # a bucket of their gradients
    >>> builtin_average(Wire.of(None), BucketLayout(params), flat).wait()     # Future of [the average]
    [tensor([2., 2., 2., 2., 2., 2., 2.])]
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from minddp.comm.wire import Wire
from minddp.runtime import compat, keep


class BucketLayout:
    """Where each parameter's gradient lives inside a bucket's flat buffer (step 1)."""

    __slots__ = ("params", "offsets", "numels", "shapes", "numel", "_cache")

    def __init__(self, params: list[torch.Tensor]):
        self.params = list(params)
        self.numels = [p.numel() for p in self.params]
        self.shapes = [p.shape for p in self.params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(self.params))]
        self.numel = sum(self.numels)
        self._cache: tuple | None = None

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of ``flat`` (no copy), kept for the last buffer asked for.

        The key is the memory itself (address, dtype, size); the kept views hold
        that memory alive, so no other tensor can appear at the same address.
        """
        return self._views_and_addresses(flat)[0]

    def _views_and_addresses(self, flat: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
        key = (flat.data_ptr(), flat.dtype, flat.numel(), flat.device)
        if self._cache is None or self._cache[0] != key:
            views = [flat[o : o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]
            self._cache = (key, (views, [v.data_ptr() for v in views]))
        return self._cache[1]

    def grads_in(self, flat: torch.Tensor) -> list[bool]:
        """Per parameter: does its ``.grad`` already live in ``flat`` (same memory, same dtype)?"""
        addresses, dtype = self._views_and_addresses(flat)[1], flat.dtype
        return [
            p.grad is not None and p.grad.data_ptr() == address and p.grad.dtype == dtype
            for p, address in zip(self.params, addresses)
        ]


def scale_like_torch(layout: BucketLayout, buffer: torch.Tensor, world: int) -> None:
    """Step 2: ``× 1/world`` for gradients copied into the bucket, ``÷ world`` for those living in it.

    When ``world`` is a power of two the check is skipped: multiplying a real
    float by ``1/world`` and dividing it by ``world`` are then the same exact
    scaling, so they round alike.
    """
    exact = world & (world - 1) == 0 and buffer.is_floating_point()
    aliased = [] if exact else layout.grads_in(buffer)
    if not any(aliased):
        buffer.mul_(1.0 / world)  # every gradient was copied in (the common case), or exact
    elif all(aliased):
        buffer.div_(world)
    else:  # some slots are .grad, some copies (unused parameters)
        views = layout.views(buffer)
        compat.foreach_div_([v for v, a in zip(views, aliased) if a], world)
        compat.foreach_mul_([v for v, a in zip(views, aliased) if not a], 1.0 / world)


_SUM = compat.allreduce_options(dist.ReduceOp.SUM)  # the caller waits on the Future (on GPUs: NCCL's own stream)


def start_sum(tensor: torch.Tensor, wire: Wire) -> torch.futures.Future:
    """Step 3: sum ``tensor`` in place across ``wire``'s group; the collective's own Future (value ``[tensor]``).

    A complex tensor travels as its real view (the sums of the real and of the
    imaginary parts), as in ``torch.distributed.all_reduce``; its Future then
    holds that view, so on this rare path a callback hands back ``[tensor]``.
    """
    if wire.traffic is not None:
        wire.traffic.record(tensor)
    if wire.transport is not None:
        wire.transport(tensor, wire.group)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([tensor])
    elif not tensor.is_complex():
        fut = wire.group.allreduce([tensor], _SUM).get_future()
    else:

        def as_sent(done: torch.futures.Future) -> list[torch.Tensor]:
            done.value()  # a failed collective fails this Future too
            return [tensor]

        sent = keep.held(torch.view_as_real(tensor))  # a view made here: kept until gloo lets go of it
        fut = keep.then(wire.group.allreduce(list(sent), _SUM).get_future(), as_sent)
    return fut if wire.link is None else wire.link.carry(fut, tensor, wire.size())


def builtin_average(
    wire: Wire, layout: BucketLayout, flat: torch.Tensor, divisor: int | None = None
) -> torch.futures.Future:
    """The production DDP's plain average of one bucket over ``divisor`` ranks (None: all), scaled as torch does."""
    scale_like_torch(layout, flat, wire.size() if divisor is None else divisor)
    return start_sum(flat, wire)


def named_range(label):
    """A profiler range named ``label()`` while a profiler records; a null context (label not built) otherwise."""
    if compat.profiler_on():
        return compat.fast_range(label())
    return contextlib.nullcontext()
