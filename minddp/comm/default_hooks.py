"""The stateless hooks: plain averaging, and averaging in 16-bit floats.

Torch's signature ``hook(state, bucket) -> Future[Tensor]``; the state is the process group (``None``
= the default group) or a :class:`~minddp.comm.wire.Wire` around one.

* :func:`allreduce_hook`: divide by the world size, sum across ranks: what every stage does by default
  (it lives in :mod:`minddp.comm.plain`, the teaching stages' short path, and is the same function here);
* :func:`fp16_compress_hook` / :func:`bf16_compress_hook`: the same in 16 bits, half the bytes;
* :func:`fp16_compress_wrapper` / :func:`bf16_compress_wrapper`: that cast around *any* hook.

bf16 is not refused (torch 2.13's ``register_comm_hook`` refuses its bf16 hooks unless torch was built with
CUDA and NCCL 2.10+, or XPU and XCCL, whatever the group's backend); a complex bucket is refused by the compress
hooks. More: ``docs/hooks.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import AsyncBucketDDP
    >>> model = AsyncBucketDDP(torch.nn.Linear(4, 2))
    >>> model.register_comm_hook(None, fp16_compress_hook)      # sent as fp16, cast back to fp32
    >>> model(torch.ones(3, 4)).sum().backward(); model.finish_gradient_synchronization()
    >>> model.module.bias.grad
    tensor([3., 3.])
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.plain import allreduce_hook
from minddp.comm.wire import Wire
from minddp.runtime import keep

__all__ = [
    "allreduce_hook",
    "fp16_compress_hook",
    "bf16_compress_hook",
    "fp16_compress_wrapper",
    "bf16_compress_wrapper",
    "check_real_floating",
]


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

    1. cast the bucket's buffer to ``dtype`` (a new, smaller tensor) and hand
       the hook the bucket with that buffer;
    2. put the original buffer back in the bucket;
    3. when the hook's future completes, copy its result into the original
       buffer (casting up) and return that buffer; a reduce-scatter hook
       (:mod:`minddp.sharding.hooks`) hands back this rank's shard only,
       which is cast up as a new tensor instead.
    """

    @functools.wraps(hook)
    def wrapped(state, bucket: GradBucket) -> torch.futures.Future:
        check_real_floating(bucket, wrapped.__name__)
        original = bucket.buffer()
        bucket.set_buffer(*keep.held(original.to(dtype)))  # step 1 (kept until gloo lets go of it)
        fut = hook(state, bucket)
        bucket.set_buffer(original)  # step 2

        def decompress(f: torch.futures.Future) -> torch.Tensor:  # step 3
            value = f.value()
            value = value[0] if isinstance(value, list) else value
            if value.numel() != original.numel():  # a reduce-scatter's shard
                return value.to(original.dtype)
            return original.copy_(value)

        return keep.then(fut, decompress)

    wrapped.__name__ = f"{label}_compress_wrapper({getattr(hook, '__name__', 'hook')})"
    return wrapped


def fp16_compress_wrapper(hook):
    """Cast the gradients to float16 around ``hook`` and back to their dtype after."""
    return _compress_wrapper(torch.float16, "fp16", hook)


def bf16_compress_wrapper(hook):
    """Cast the gradients to bfloat16 around ``hook`` and back to their dtype after."""
    return _compress_wrapper(torch.bfloat16, "bf16", hook)


def fp16_compress_hook(process_group: dist.ProcessGroup | Wire | None, bucket: GradBucket) -> torch.futures.Future:
    """Average in float16: half the bytes of :func:`allreduce_hook` on fp32 gradients."""
    return _fp16_allreduce(process_group, bucket)


def bf16_compress_hook(process_group: dist.ProcessGroup | Wire | None, bucket: GradBucket) -> torch.futures.Future:
    """Average in bfloat16 (fp32's range, fewer mantissa bits); runs on gloo and NCCL."""
    return _bf16_allreduce(process_group, bucket)


_fp16_allreduce = fp16_compress_wrapper(allreduce_hook)
_bf16_allreduce = bf16_compress_wrapper(allreduce_hook)
