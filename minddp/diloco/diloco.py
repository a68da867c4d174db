"""Rung ``diloco``: average what each replica learnt since the last sync, and let an outer optimizer apply it.

Builds on ``local-sgd``: the replicas still train alone for H (``sync_every``) inner steps, but instead of
averaging the weights they average a *pseudo-gradient* and step an outer optimizer with it (Douillard et
al., 2023, arXiv 2311.08105; the default outer optimizer is theirs: SGD, lr 0.7, momentum 0.9, Nesterov):

1. **synced weights**: at construction (after the same start) each replica keeps a copy of the weights,
   the last ones all replicas agreed on;
2. **pseudo-gradient**: after the H-th inner step, synced − local (the way a gradient points: the
   negative of what the replica moved) goes to the comm hook, which averages it across replicas;
3. **outer step**: the weights go back to the synced ones, the averaged pseudo-gradient becomes their
   ``.grad``, the outer optimizer steps, and the result is the new synced weights.

With outer SGD(lr=1, momentum=0) item 3 is ``synced − mean(synced − local)`` = the mean of the local
weights: local SGD. An outer learning rate and momentum of its own are what DiLoCo adds.

**Streaming** (Streaming DiLoCo, arXiv 2501.18512; ``fragments``, ``fragment_sync_delay``,
``fragment_update_alpha``): the model is cut into K fragments (:func:`~minddp.diloco.fragments.split_fragments`)
that take turns, one every H/K inner steps, so a sync moves about 1/K of the model (runs of whole tensors:
one large tensor makes them unequal) and each fragment still syncs once every H steps:

4. a fragment's pseudo-gradient is sent τ inner steps *before* its turn ends, and its Future kept:
   only the turn's last step, τ steps later, calls its ``wait()``, so it can travel during those
   steps (one fragment in flight at a time: τ < H/K);
5. at the end of its turn, item 3 for that fragment alone (the others keep their local weights);
6. the weights the replica goes on training from are the new synced weights mixed with the local ones that
   went on training meanwhile: ``(1 − α)·synced + α·local`` (α = 0: the synced weights, the τ steps' progress on
   it dropped); the synced copy keeps the outer step's result, unmixed.

The schedule, the signs and α's direction are torchft's (``torchft.local_sgd.DiLoCo``; the tests compare the
parameters bit for bit): fragment 0 first, each sent at inner step H/K − τ of its turn, the outer step taken from
the synced weights, ``synced.lerp_(local, α)``. Two deliberate differences: one outer optimizer may serve every
fragment (only the fragment whose turn it is has a ``.grad`` during its step, so the others keep their weights and
state; torchft's DiLoCo would step them too with the inner gradients they still hold, so its users give one outer
optimizer per fragment, which this class takes as well), and the synced weights stay on the parameters' device
(torchft keeps them in host memory). The change, for plain DiLoCo, in lines of ``_send`` and ``_outer_sync``,
a few left out::

    -        bucket = GradBucket(0, torch.cat([p.detach().reshape(-1) for p in params]), params, is_last=True)
    +        pseudo = torch.cat([(s - p.detach()).reshape(-1) for p, s in zip(params, synced)])  # item 2
             ...  # item 2: averaged by the comm hook as local SGD's weights were, into mean_pseudo
    -        for param, mean in zip(params, average.split([p.numel() for p in params])):
    -            param.copy_(mean.view_as(param))
    +        for param, weights, grad in zip(params, synced, mean_pseudo.split([p.numel() for p in params])):
    +            param.copy_(weights)  # item 3: the synced weights put back
    +            param.grad = grad.view_as(param)  # item 3: the averaged pseudo-gradient, their gradient
    +        self._outer_step(params)  # item 3: the outer optimizer steps
    +        for param, weights in zip(params, synced):
    +            weights.copy_(param)  # item 3: the new synced weights

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> model = torch.nn.Linear(4, 2)
    >>> inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> with DiLoCo(model, inner, None, sync_every=4) as diloco:    # None: outer SGD(0.7, 0.9, Nesterov)
    ...     for step in range(8):
    ...         inner.zero_grad()
    ...         model(torch.ones(3, 4)).sum().backward()
    ...         inner.step()                               # after steps 4 and 8: an outer step
    >>> diloco.syncs, [p.equal(s) for p, s in zip(model.parameters(), diloco.synced[0])]
    (2, [True, True])

More: ``docs/diloco.md``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minddp.comm.grad_bucket import GradBucket
from minddp.comm.send import send
from minddp.diloco import state
from minddp.diloco.fragments import check_schedule, outer_per_fragment, split_fragments
from minddp.diloco.local_sgd import LocalSGD

#: DiLoCo's outer optimizer (the paper's, and torchft's examples'): ``torch.optim.SGD`` with these settings.
OUTER_DEFAULTS = {"lr": 0.7, "momentum": 0.9, "nesterov": True}


class DiLoCo(LocalSGD):
    """Inner steps alone, then an outer step on the averaged pseudo-gradient; streamed in fragments if asked.

    ``outer_optimizer``: one optimizer over the model's trainable parameters, a list of one per
    fragment (torchft's form), or ``None`` for ``SGD(lr=0.7, momentum=0.9, nesterov=True)``.
    ``fragments``: a number K, or a list of submodules that partition the model (torchft's form).
    ``syncs`` counts fragment syncs (K per H steps), ``sent_bytes`` the bytes handed to the comm hook.
    """

    role = "the inner optimizer"

    def __init__(
        self,
        module: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        sync_every: int | None = None,
        *,
        fragments: int | list[nn.Module] = 1,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        process_group: dist.ProcessGroup | None = None,
        same_start: bool = True,
    ):
        count = fragments if isinstance(fragments, int) else len(fragments)
        check_schedule(sync_every, count, fragment_sync_delay, fragment_update_alpha)  # one line, every rank
        self.fragments = split_fragments(module, fragments)
        if outer_optimizer is None:
            outer_optimizer = torch.optim.SGD([p for f in self.fragments for p in f], **OUTER_DEFAULTS)
        self.outer = outer_per_fragment(outer_optimizer, self.fragments)
        super().__init__(module, inner_optimizer, sync_every, process_group, same_start=same_start)  # the hook
        self.per_turn, self.delay, self.alpha = sync_every // count, fragment_sync_delay, fragment_update_alpha
        self.synced = [[p.detach().clone() for p in params] for params in self.fragments]  # item 1
        self.in_flight: tuple[int, torch.futures.Future] | None = None

    def _after_step(self, optimizer, args, kwargs) -> None:
        """Steps 4-5: in each turn of ``per_turn`` inner steps, send its fragment τ steps before the end, apply it."""
        self.steps += 1
        fragment = (self.steps - 1) // self.per_turn % len(self.fragments)  # the one whose turn it is
        into = self.steps % self.per_turn
        with torch.no_grad():
            if into == (self.per_turn - self.delay) % self.per_turn:
                with torch.profiler.record_function(f"minddp.fragment_send#{fragment}"):  # a label in the traces
                    self._send(fragment)
            if into == 0:
                with torch.profiler.record_function(f"minddp.fragment_apply#{fragment}"):
                    self._apply(fragment)

    def _send(self, fragment: int) -> None:
        """Step 2 (and 4): start averaging this fragment's pseudo-gradient; keep its Future, do not wait."""
        params, synced = self.fragments[fragment], self.synced[fragment]
        pseudo = torch.cat([(s - p.detach()).reshape(-1) for p, s in zip(params, synced)])  # item 2
        bucket = GradBucket(fragment, pseudo, params, is_last=fragment == len(self.fragments) - 1)
        self.sent_bytes += pseudo.numel() * pseudo.element_size()
        self.in_flight = (fragment, send(self.comm_hook, self.comm_state, bucket))  # item 2; item 3 waits for it

    def _apply(self, fragment: int) -> None:
        """Steps 3, 5, 6: wait for the Future _send kept, the outer sync, mix with α."""
        sent, future = self.in_flight
        assert sent == fragment, f"fragment {sent} in flight at fragment {fragment}'s turn: the schedule is broken"
        mean_pseudo, self.in_flight = future.wait(), None  # in _apply: the kept Future waited for
        params, synced = self.fragments[fragment], self.synced[fragment]
        local = [p.detach().clone() for p in params] if self.alpha else []
        self._outer_sync(params, synced, mean_pseudo)  # item 3 (item 5: this fragment's alone)
        for param, mine in zip(params, local):  # item 6 (α = 0: the synced weights as they are)
            param.lerp_(mine, self.alpha)
        self.syncs += 1

    def _outer_sync(self, params: list[nn.Parameter], synced: list[torch.Tensor], mean_pseudo: torch.Tensor) -> None:
        """Step 3, DiLoCo's idea: the synced weights back, the averaged pseudo-gradient as ``.grad``, outer step."""
        for param, weights, grad in zip(params, synced, mean_pseudo.split([p.numel() for p in params])):
            param.copy_(weights)  # item 3: the synced weights put back
            param.grad = grad.view_as(param)  # item 3: the averaged pseudo-gradient, their gradient
        self._outer_step(params)  # item 3: the outer optimizer steps
        for param, weights in zip(params, synced):
            weights.copy_(param)  # item 3: the new synced weights

    def _outer_step(self, params: list[nn.Parameter]) -> None:
        """The outer optimizer steps ``params`` (one fragment) alone: every other ``.grad`` is hidden meanwhile."""
        fragment = next(i for i, f in enumerate(self.fragments) if f is params)
        others = [p for i, f in enumerate(self.fragments) if i != fragment for p in f]
        hidden = [p.grad for p in others]
        for p in others:
            p.grad = None
        self.outer[fragment].step()
        for p, grad in zip(others, hidden):
            p.grad = grad
        for p in params:
            p.grad = None  # the inner loop's next backward starts from nothing, as after zero_grad()

    def close(self) -> None:
        """Stop syncing. A fragment still in flight is waited for (no collective left behind) and dropped."""
        super().close()
        if self.in_flight is not None:
            self.in_flight[1].wait()
            self.in_flight = None

    def state_dict(self) -> dict:
        """What DiLoCo adds to a checkpoint: the counts, the synced weights, the outer optimizers' state and a
        fragment in flight (waited for: its averaged pseudo-gradient is saved); torchft's users lost the first two.

        With the model's and the inner optimizer's state it resumes bit for bit. Between syncs every replica's
        weights are its own, so each rank saves and loads its own; and load them *after* building the DiLoCo,
        whose same start broadcasts rank 0's weights. (:mod:`minddp.diloco.state`.)
        """
        return state.saved(self, super().state_dict())

    def load_state_dict(self, saved: dict) -> None:
        state.load(self, saved)  # checked whole first: nothing is changed by a state of another model
        super().load_state_dict(saved)
