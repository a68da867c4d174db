"""Stage ``hook-async``: start each gradient's all_reduce and keep going.

One change to :mod:`hook`: the collective is launched with ``async_op=True``
semantics (the hook returns a Future and we do *not* wait on it), so autograd
continues computing earlier layers' gradients while gloo/NCCL moves the later
layers' ones. The futures are kept, and
:meth:`~minddp.stages.hook.HookDDP.finish_gradient_synchronization` waits
for all of them once, just before ``optimizer.step()``.

That is real overlap: communication hidden behind computation. The cost left
is one collective per parameter, each paying the fixed latency of a message;
:mod:`bucket` attacks that.

Example::

    >>> model = AsyncHookDDP(net)
    >>> model(x).sum().backward()               # all_reduces run during backward
    >>> model.finish_gradient_synchronization()  # wait for them, write back
"""

from minddp.stages.hook import HookDDP


class AsyncHookDDP(HookDDP):
    """HookDDP whose per-parameter all_reduces are waited for only at the end."""

    async_op = True
