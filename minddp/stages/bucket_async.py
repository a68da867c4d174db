"""Stage ``bucket-async``: buckets sent while backward goes on.

:mod:`bucket` with one change: a full bucket's all_reduce is started and not
waited for (``async_op = True``). Backward keeps computing the earlier
layers while the bucket travels; the futures are completed once in
:meth:`~minddp.stages.bucket.BucketDDP.finish_gradient_synchronization`,
before ``optimizer.step()``.

This is the shape of torch's DDP: few messages, each overlapping the rest of
backward. What torch adds beyond it is in :mod:`minddp.stages.ddp`.

Example::

    >>> model = AsyncBucketDDP(net, bucket_cap_mb=25)
    >>> model(x).sum().backward()
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from minddp.stages.bucket import BucketDDP


class AsyncBucketDDP(BucketDDP):
    """BucketDDP whose bucket all_reduces are waited for only at the end."""

    async_op = True
