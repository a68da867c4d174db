"""Running a comm hook on a bucket, and writing its answer back into ``.grad``.

Every stage syncs gradients the same way, whatever its grouping or timing:

1. **launch**: call ``hook(state, bucket)``; it starts the communication and
   returns a Future at once;
2. **complete** (now, for synchronous stages; just before the optimizer step,
   for asynchronous ones): wait for the Future, check that the hook kept its
   promise (a tensor shaped like the bucket's buffer, of its dtype), and copy
   each parameter's slice of the result into that parameter's ``.grad``
   (skipped when the slice *is* the ``.grad`` already, as when a hook reduced
   the buffer in place and the buffer is a view of the gradient).

With ``measure_error`` the exact average of the uncompressed buffer is
computed beside the hook (an extra all_reduce that the traffic meter does
not count), and ||g - ĝ||² and ||g||² are added to :data:`wire.traffic`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from minddp.comm import wire
from minddp.comm.grad_bucket import GradBucket

try:    # the same named range as torch.profiler.record_function, entered and left in C++
    from torch._C._profiler import _RecordFunctionFast as _named_range
except ImportError:  # pragma: no cover - older torch
    _named_range = torch.profiler.record_function


def check_hook(hook) -> None:
    """Refuse at registration what could only fail later, mid-backward."""
    if not callable(hook):
        raise TypeError(
            f"comm hook must be callable as hook(state, bucket) -> torch.futures.Future, got {type(hook).__name__}; "
            "pass the function itself, e.g. register_comm_hook(None, allreduce_hook)"
        )


@dataclass
class PendingBucket:
    bucket: GradBucket
    future: torch.futures.Future
    hook_name: str
    expected: tuple            # (numel, dtype) of the buffer the hook was handed
    exact: torch.futures.Future | None = None
    #: Optional ``check(result)`` run once the result is in (e.g. the NaN/Inf check): raising here,
    #: at wait time, reaches the user as it is, where raising inside a Future callback would be
    #: wrapped by torch in a "Got the following error when running the callback" RuntimeError.
    check: Callable[[torch.Tensor], None] | None = None


def launch(hook, state, bucket: GradBucket, group, measure_error: bool = False) -> PendingBucket:
    """Step 1: start the hook's communication for ``bucket``; return without waiting."""
    buffer = bucket.buffer()
    # Read before the hook runs: a hook may resize the buffer in place while it works
    # (torch's batched PowerSGD pads it to a square) and restore it when done.
    expected = (buffer.numel(), buffer.dtype)
    exact = None
    if measure_error:
        # The reference average, on a copy, straight through torch (not metered).
        ref = buffer.detach().to(torch.float32).div(dist.get_world_size(group))
        exact = dist.all_reduce(ref, group=group, async_op=True).get_future()
    name = getattr(hook, "__name__", type(hook).__name__)
    # A named range per bucket launch: the trace then shows when each bucket was
    # ready and handed to the wire (the analysis module reads these).
    # record_function goes through torch's op dispatcher on entry and exit (~100 µs a launch under
    # the profiler); the fast variant costs a few µs. Unprofiled, the range would record nothing,
    # so neither it nor its label is built.
    launch_range = (_named_range(f"minddp.bucket_launch#{bucket.index()} numel={buffer.numel()} "
                                 f"dtype={str(buffer.dtype).replace('torch.', '')} hook={name}")
                    if torch.autograd.profiler._is_profiler_enabled else contextlib.nullcontext())
    with launch_range:
        fut = hook(state, bucket)
    # torch.futures.Future wraps torch._C.Future; collectives and .then() hand back the C type.
    if not isinstance(fut, torch._C.Future):
        raise TypeError(
            f"comm hook {name} returned {type(fut).__name__}, not a torch.futures.Future; "
            "return the future of the collective (e.g. wire.all_reduce(...)) or fut.then(...)"
        )
    return PendingBucket(bucket, fut, name, expected, exact)


def complete(pending: PendingBucket) -> None:
    """Step 2: wait, validate, and write the averaged gradients back."""
    result = pending.future.wait()
    if isinstance(result, list) and len(result) == 1:  # torch-style hooks return [tensor]
        result = result[0]
    numel, dtype = pending.expected
    if not isinstance(result, torch.Tensor) or result.numel() != numel or result.dtype != dtype:
        got = f"shape {tuple(result.shape)}, dtype {result.dtype}" if isinstance(result, torch.Tensor) \
            else type(result).__name__
        raise RuntimeError(
            f"comm hook {pending.hook_name} returned {got} for bucket {pending.bucket.index()}, "
            f"but a hook must return a tensor of the bucket buffer's shape ({numel},) and dtype {dtype}: "
            "decompress and cast back before returning"
        )
    result = result.view(-1)
    if pending.check is not None:
        pending.check(result)
    if pending.exact is not None:
        exact = pending.exact.wait()[0]
        wire.traffic.error_sq += float((result.float() - exact).pow(2).sum())
        wire.traffic.norm_sq += float(exact.pow(2).sum())
    layout = pending.bucket._layout
    pairs = [(param.grad, view) for param, view, there in zip(layout.params, layout.views(result),
                                                                 layout.grads_in(result))
             if param.grad is not None and not there]
    if pairs:
        torch._foreach_copy_([g for g, _ in pairs], [v for _, v in pairs])   # one call per bucket
