"""Stage ``hook``: sync each gradient the moment autograd has finished it.

Waiting for the end of backward wastes time: the last layer's gradient is
final long before the first layer's is computed. Autograd can tell us when a
parameter's gradient is done:

1. at construction, register ``register_post_accumulate_grad_hook`` on every
   parameter that needs a gradient. It fires after autograd has *added* this
   backward's contribution into ``param.grad``, so the hook reads the
   accumulated gradient (correct under gradient accumulation too) and fires
   once per backward even for a tied parameter used twice. The hook reaches
   this wrapper through a weak reference: a parameter holding its wrapper
   would make a cycle through autograd's C++ side that Python's garbage
   collector cannot see, and the wrapper, with its process group and that
   group's threads, would live until the interpreter exits;
2. in the hook, if this backward syncs, hand the hook layer a bucket of this
   one parameter and start its all_reduce;
3. here (``async_op = False``) wait for it right away, inside backward. The
   communication now interleaves with backward, but autograd stands still
   while we wait: interleaving is not overlapping. :mod:`hook_async` fixes
   that by one flag.

:meth:`finish_gradient_synchronization` completes whatever is still pending
(nothing, for this synchronous stage).

Example::

    >>> model = HookDDP(net)
    >>> model(x).sum().backward()        # grads are averaged during backward
    >>> model.finish_gradient_synchronization(); optimizer.step()
"""

from __future__ import annotations

import weakref

from torch import nn

from minddp.comm import hook_runner
from minddp.comm.grad_bucket import GradBucket
from minddp.stages.grad_accum import GradAccumDDP


class HookDDP(GradAccumDDP):
    """Per-parameter autograd hooks that sync each gradient during backward."""

    #: Wait for each bucket's communication at once (False) or at the end (True).
    async_op = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending: list[hook_runner.PendingBucket] = []
        self._index = {id(p): i for i, p in enumerate(reversed(self._params))}
        on_grad_ready = _weak_method(self._on_grad_ready)
        self._hook_handles = [                                                    # step 1
            p.register_post_accumulate_grad_hook(on_grad_ready) for p in self._params
        ]
        weakref.finalize(self, _remove_all, self._hook_handles)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if self._sync_this_backward:                                              # step 2
            self._grad_ready(param)

    def _grad_ready(self, param: nn.Parameter) -> None:
        self._submit(self._param_bucket(param, self._index[id(param)]))

    def _submit(self, bucket: GradBucket) -> None:
        pending = self._launch(bucket)
        if self.async_op:
            self._pending.append(pending)
        else:
            hook_runner.complete(pending)                                         # step 3

    def _unsynced_work(self) -> str | None:
        return f"{len(self._pending)} gradient all_reduce(s) are still in flight" if self._pending else None

    def finish_gradient_synchronization(self) -> None:
        """Wait for all communication still in flight and write it back."""
        pending, self._pending = self._pending, []
        for p in pending:
            hook_runner.complete(p)

    def remove_hooks(self) -> None:
        """Detach from autograd (e.g. before wrapping the module in another stage)."""
        _remove_all(self._hook_handles)


def _weak_method(method):
    """A function calling ``method`` while its object lives, doing nothing after."""
    # weakref.WeakMethod would do, but its __call__ is Python code that builds a bound method on
    # every call, and this runs once per parameter per backward (a profile showed it).
    func, ref = method.__func__, weakref.ref(method.__self__)

    def call(*args):
        obj = ref()
        if obj is not None:
            func(obj, *args)
    return call


def _remove_all(handles: list) -> None:
    """Remove every hook in ``handles`` and empty the list (the finalizer may call this again)."""
    for handle in handles:
        handle.remove()
    handles.clear()
