"""Stage ``bucket-async``: buckets sent while backward goes on.

Nothing new to write: this stage is :mod:`bucket`'s buckets with
:mod:`hook_async`'s not-waiting. A full bucket's all_reduce is started and
its Future kept; backward keeps computing the earlier layers while the
bucket travels; :meth:`finish_gradient_synchronization` waits for them all
once, before ``optimizer.step()``.

How Python combines the two: the class lists both parents, and each method
comes from the first parent in that list that defines it
(``AsyncBucketDDP.__mro__``): ``_grad_ready`` and ``_write_back`` from
:class:`~minddp.stages.bucket.BucketDDP` (count, flatten, copy back),
``_sent`` from :class:`~minddp.stages.hook_async.AsyncHookDDP` (keep the
Future, don't wait). ``finish_gradient_synchronization`` runs both: the
bucket's first (send the buckets that did not fill), then, through
``super()``, hook-async's (wait for everything in flight).

This is the shape of torch's DDP: few messages, each overlapping the rest of
backward. What torch adds beyond it is in :mod:`minddp.ddp`.

Example::

    >>> model = AsyncBucketDDP(net, bucket_cap_mb=25)
    >>> model(x).sum().backward()
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from minddp.stages.bucket import BucketDDP
from minddp.stages.hook_async import AsyncHookDDP


class AsyncBucketDDP(BucketDDP, AsyncHookDDP):
    """BucketDDP whose bucket all_reduces are waited for only at the end."""
