"""The stateless hooks: plain averaging, and averaging in 16-bit floats.

Every hook has torch's signature ``hook(state, bucket) -> Future[Tensor]``;
for these the state is the process group (``None`` = the default group).

* :func:`allreduce_hook` divides the bucket by the world size and sums it
  across ranks: the mean gradient, exactly what a stage does with no hook.
* :func:`fp16_compress_hook` / :func:`bf16_compress_hook` do the same in a
  16-bit float, halving the bytes on the wire, and cast back afterwards.
* :func:`builtin_allreduce_hook` is the same average without the Python
  callback that turns the result into a tensor: what the stages do when no
  hook is registered (torch's C++ reducer makes the same split).
* :func:`fp16_compress_wrapper` / :func:`bf16_compress_wrapper` put that
  cast around *any* hook, so ``fp16_compress_hook`` is literally
  ``fp16_compress_wrapper(allreduce_hook)``.

Unlike torch 2.13, the bf16 variants are not refused on gloo: gloo sums
bfloat16 tensors correctly, so there is no reason to require NCCL.

Supported dtypes: the compress hooks and PowerSGD take real floating-point
buckets (fp16, bf16, fp32, fp64; fp64 is allowed, it just loses what the
cast loses). They refuse complex buckets, where the cast would silently
drop the imaginary part (and PowerSGD's transposes would need conjugates),
with :func:`check_real_floating`; plain :func:`allreduce_hook` takes any dtype.

Example::

    >>> ddp.register_comm_hook(None, fp16_compress_hook)
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from minddp.comm import wire
from minddp.comm.grad_bucket import GradBucket


def allreduce_hook(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future:
    """Average the bucket across ranks: divide by the world size, then sum.

    Dividing *before* summing keeps large gradients from overflowing in low
    precision and costs the same as dividing after.
    """
    group = wire.resolve_group(process_group)
    tensor = bucket.buffer().div_(group.size())
    return wire.all_reduce(tensor, group)


def builtin_allreduce_hook(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future:
    """What every stage does when no hook is registered: the average, scaled as torch's reducer scales it.

    Two differences from :func:`allreduce_hook`, both taken from torch's C++
    reducer, which averages by itself when no hook is registered:

    1. **no Python callback**: the Future is the collective's own (value
       ``[tensor]``, which the stages unwrap), so nothing in Python runs on the
       comm thread when it completes (:func:`minddp.comm.wire.start_all_reduce`
       says why that matters). torch refuses a Python hook whose Future holds
       a list, so to register on torch's DDP use :func:`allreduce_hook`;
    2. **the same rounding** (:func:`scale_like_torch`): a gradient copied
       into the bucket is multiplied by ``1/world``, one that already lives
       in the bucket (``gradient_as_bucket_view``, or a one-parameter bucket
       that *is* the gradient) is divided by ``world``. For world sizes that
       are not powers of two the two round differently in the last bit, and
       doing what torch does makes ``minddp.DistributedDataParallel`` train
       bit for bit like torch's DDP (tested on 3 ranks).
    """
    group = wire.resolve_group(process_group)
    scale_like_torch(bucket, group.size())
    return wire.start_all_reduce(bucket.buffer(), group)


def scale_like_torch(bucket: GradBucket, world: int) -> None:
    """Step 2 of :func:`builtin_allreduce_hook`: ``× 1/world`` for copied gradients, ``÷ world`` for aliased ones.

    torch's reducer scales each gradient as it enters the bucket
    (``at::mul_out(bucket_view, grad, 1/world)``) unless the gradient and its
    slot are the same memory, which it divides in place. Copy-then-multiply
    rounds exactly like that fused multiply; the check per parameter is one
    pointer comparison.

    When ``world`` is a power of two (2, 4, 8 ... ranks) the check is skipped:
    multiplying a real float by ``1/world`` and dividing it by ``world`` are then
    the same exact scaling by a power of two, so they round alike whichever
    gradients were copied in.
    """
    buffer = bucket.buffer()
    exact = world & (world - 1) == 0 and buffer.is_floating_point()    # power of two: both round alike
    aliased = [] if exact else bucket._layout.grads_in(buffer)
    if not any(aliased):
        buffer.mul_(1.0 / world)            # every gradient was copied in (the common case), or exact: one pass
    elif all(aliased):
        buffer.div_(world)
    else:                                   # some slots are .grad, some copies (unused parameters)
        views = bucket._layout.views(buffer)
        torch._foreach_div_([v for v, a in zip(views, aliased) if a], world)
        torch._foreach_mul_([v for v, a in zip(views, aliased) if not a], 1.0 / world)


def check_real_floating(bucket: GradBucket, hook_name: str) -> None:
    """Refuse a bucket this hook's math cannot represent (complex or integer), naming the fix."""
    dtype = bucket.buffer().dtype
    if not dtype.is_floating_point:
        why = "its imaginary part would be lost" if dtype.is_complex else "it is not a float"
        raise TypeError(
            f"comm hook {hook_name} supports real floating-point gradients only, but bucket {bucket.index()} "
            f"holds {str(dtype).replace('torch.', '')} ({why}); "
            "use allreduce_hook for this model, or keep complex parameters as real pairs (torch.view_as_real)"
        )


def _compress_wrapper(dtype: torch.dtype, label: str, hook):
    """Run ``hook`` on a copy of the bucket cast to ``dtype``; cast its result back.

    1. cast the bucket's buffer to ``dtype`` (a new, smaller tensor);
    2. hand the hook a bucket whose buffer is that tensor;
    3. when the hook's future completes, copy its result back into the
       original buffer (casting up) and return that buffer.
    """

    @functools.wraps(hook)
    def wrapped(state, bucket: GradBucket) -> torch.futures.Future:
        check_real_floating(bucket, wrapped.__name__)
        original = bucket.buffer()
        bucket.set_buffer(original.to(dtype))                                  # step 1 + 2
        fut = hook(state, bucket)
        bucket.set_buffer(original)

        def decompress(f: torch.futures.Future) -> torch.Tensor:              # step 3
            value = f.value()
            return original.copy_(value[0] if isinstance(value, list) else value)

        return fut.then(decompress)

    wrapped.__name__ = f"{label}_compress_wrapper({getattr(hook, '__name__', 'hook')})"
    return wrapped


def fp16_compress_wrapper(hook):
    """Cast the gradients to float16 around ``hook`` and back to their dtype after."""
    return _compress_wrapper(torch.float16, "fp16", hook)


def bf16_compress_wrapper(hook):
    """Cast the gradients to bfloat16 around ``hook`` and back to their dtype after."""
    return _compress_wrapper(torch.bfloat16, "bf16", hook)


def fp16_compress_hook(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future:
    """Average in float16: half the bytes of :func:`allreduce_hook` on fp32 gradients."""
    return _fp16_allreduce(process_group, bucket)


def bf16_compress_hook(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future:
    """Average in bfloat16 (fp32's range, fewer mantissa bits); runs on gloo and NCCL."""
    return _bf16_allreduce(process_group, bucket)


_fp16_allreduce = fp16_compress_wrapper(allreduce_hook)
_bf16_allreduce = bf16_compress_wrapper(allreduce_hook)
