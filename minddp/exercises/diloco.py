"""Notebook 10's exercises: DiLoCo's outer sync, and streaming DiLoCo's fragment schedule, checked on real ranks.

:func:`check_outer_sync` checks a learner's ``outer_sync(params, synced, outer)``, called on every
replica after its H-th inner step: ``params`` the model's (local) weights, ``synced`` the weights of
the last sync (copies), ``outer`` the outer optimizer over ``params``. On the checker's 2 ranks:

1. **the candidates** (first), from the same start on the checker's own group (:func:`candidate`): a small
   network trains 3 rounds of H inner steps (AdamW, each rank on its own data) with DiLoCo's sync
   (checked against :class:`minddp.DiLoCo` by the tests, as is the model answer
   :func:`~minddp.exercises.solutions.outer_sync`) and the wrong ideas (:data:`MISTAKES`): the
   pseudo-gradient's sign flipped, the outer step taken from the local weights (or from their mean) instead of the
   restored synced ones, plain averaging called DiLoCo, the pseudo-gradients summed, the local weights summed
   (synced − their sum taken as the pseudo-gradient), the synced weights never updated,
   the outer step taken with the last inner gradient (no ``p.grad = g``) or with the inner gradients averaged
   in place of the pseudo-gradient, the average divided by the world size twice (``ReduceOp.AVG``, then ``/=``
   again), the synced weights overwritten with the local ones before the restore, the pseudo-gradient taken in
   place in the synced copies (``s -= p``: the restore then puts it in the parameters), the mean of the local
   weights kept as the new synced ones (``s.copy_(s - g)``) in place of the outer step's result, an outer step that
   never moves;
2. **yours**: the same rounds with your sync after each; the weights and synced weights after every sync, what
   the outer optimizer saw (:class:`NotedSGD`) and whether ``synced`` shares the parameters' storage;
3. **verdict**: a raise or a hang first (an in-place change to a parameter outside ``torch.no_grad()`` named as
   such, and so are gloo's refusal of ``ReduceOp.AVG`` on older torch and a None met where a tensor was expected:
   all_reduce's result, or a ``.grad`` cleared by ``zero_grad()``, :func:`_none_hint`), then an all_reduce started with
   ``async_op=True`` and never waited for (what the sync computed then depends on timing: named whatever yours
   matches), then the candidate yours matches
   (:func:`close`), a single mistake before two of them at once (:data:`PAIRS`), named with what to change (an
   outer step that never moves by its cause, :data:`NO_MOVE`: no ``outer.step()``, its ``.grad`` never set (only
   ``zero_grad()`` called) or cleared by ``zero_grad()``, its ``.grad`` set to all_reduce's result (None), a zero
   pseudo-gradient taken after the restore, the restore after the step), then ``synced``
   aliased to the parameters, then ``outer.step()`` called more than once a sync (inside the loop over the
   parameters), then a sync that stepped an optimizer of its own (made in the sync) or moved the
   weights by hand, then replicas that disagree after a sync, then an outer step handed a multiple of the averaged
   pseudo-gradient (``g /= world * H``: a per-step gradient; :func:`scaled`), then the first difference from
   DiLoCo's.

:func:`check_fragment_schedule` checks ``fragment_to_send(step, sync_every, fragments, delay)``: which fragment's
pseudo-gradient leaves after inner step ``step`` (1, 2, ...), or ``None``. Each rank calls it for two periods of
every schedule in :data:`SCHEDULES`; a schedule that differs across replicas is named first (they would sum
different fragments, or wait for ever), then the first schedule and step where it differs from streaming DiLoCo's
(:func:`~minddp.exercises.solutions.fragment_to_send`, the schedule :class:`minddp.DiLoCo` keeps), steps counted
from 0 in both the send step and the fragment (the whole schedule one step early) named as such, a bool where
None belongs (``cond and fragment``) named as such, a fragment number past the last (no ``% fragments``) named as
such, and so are a schedule silent at a delay of 0 (``step % turn == turn - delay``: ``step % turn`` never reaches
``turn``), more than one send per turn, none at all at another delay (a missing ``return``), fragments numbered
from 1, the next (or the previous) turn's fragment, a turn of sync_every steps (the ``// fragments`` forgotten), a
fragment sent delay steps after its turn starts, and a fragment numbered by the period or a send one step early or
late in every turn (an off-by-one), each with a schedule silent at a delay of 0 said beside it, read off the whole
schedule.

Example (2 checker ranks, a few seconds: not run by the doctests)::

    >>> from minddp.exercises import check_outer_sync, solutions
    >>> check_outer_sync(solutions.outer_sync)                 # doctest: +SKIP
    ✓ outer sync: after 3 syncs of 3 inner steps on 2 ranks ...
"""

from __future__ import annotations

import contextlib
import functools
import re

import torch
import torch.distributed as dist

from minddp.exercises import harness, solutions
from minddp.exercises.checker import ALL_REDUCE_RETURNS_NONE, Verdict, _problem, _run

ROUNDS, SYNC_EVERY = 3, 3
#: The schedules checked, two periods each: H = 6 in 3 fragments of 2 steps, each sent 1 step before its turn ends;
#: notebook 10's H = 16 in 2 fragments of 8 steps, τ = 6 (where "τ steps before the end" is not "τ steps after the
#: start" nor "1 step after the start"); and τ = 0, sent as its turn ends.
SCHEDULES = [
    {"sync_every": 6, "fragments": 3, "delay": 1},
    {"sync_every": 16, "fragments": 2, "delay": 6},
    {"sync_every": 12, "fragments": 4, "delay": 0},
]
INNER_LR = 0.05


# -- the wrong ideas: DiLoCo's sync with one idea changed ---------------------------------------------------


def candidate(
    params,
    synced,
    outer,
    group=None,
    *,
    sign=1,
    restore=True,
    divide=True,
    keep=True,
    weights=False,
    grad=True,
    step=True,
    world=None,
    inner_grads=False,
    twice=False,
    early=False,
    added=False,
    in_synced=False,
    mean=False,
    from_weights=False,
    from_mean=False,
):
    """DiLoCo's sync with one idea changed: ``sign=-1`` averages local − synced; ``restore=False`` steps from the
    local weights; ``divide=False`` sums; ``keep=False`` never updates the synced weights; ``weights=True``
    averages the weights themselves (local SGD) and never steps the outer optimizer; ``grad=False`` never hands
    the average to the outer optimizer (it steps with the last inner gradient); ``step=False`` never lets the outer
    optimizer move the restored weights (the pseudo-gradient taken after the restore is zero, or no outer.step());
    ``world=2`` divides by a fixed 2 whatever the world size; ``inner_grads=True`` averages the inner gradients (the
    last backward's ``p.grad``) in place of the pseudo-gradient; ``twice=True`` divides by the world size twice
    (``ReduceOp.AVG``, then ``/= world`` again); ``early=True`` copies the local weights into the synced ones
    before the restore (which then restores the local weights) and not after the step; ``added=True`` adds the
    average to ``.grad`` (``p.grad += g``), onto the last inner gradient still there; ``in_synced=True`` takes the
    pseudo-gradient in place in the synced copies (``s -= p``) and averages it there, so the restore copies the
    averaged pseudo-gradient into the parameters; ``mean=True`` keeps ``s − g`` (synced − the averaged
    pseudo-gradient: the mean of the local weights) as the new synced weights, not the outer step's result;
    ``from_weights=True`` all_reduces the local weights and takes synced − the result as the pseudo-gradient (with
    ``divide=False``: synced − their sum); ``from_mean=True`` steps from the mean of the local weights (synced − the
    averaged pseudo-gradient) in place of the synced weights."""
    world = world or dist.get_world_size(group)
    with torch.no_grad():
        sent = [
            p.detach().clone() if weights or from_weights else p.grad.clone() if inner_grads else sign * (s - p)
            for p, s in zip(params, synced)
        ]
        if in_synced:  # synced − local written over the synced copies themselves
            sent = [s.sub_(p) for p, s in zip(params, synced)]
        for t in sent:
            dist.all_reduce(t, group=group)
            if divide:
                t /= world * world if twice else world
        if from_weights:  # synced − the local weights' all_reduce
            sent = [s - t for s, t in zip(synced, sent)]
        if early:
            for p, s in zip(params, synced):
                s.copy_(p)
        for p, s, t in zip(params, synced, sent):
            if weights:
                p.copy_(t)
                continue
            if restore:
                p.copy_(s - t if from_mean else s)
            if added:
                p.grad += t
            elif grad:
                p.grad = t
    if step and not weights:
        outer.step()
    if keep and not early:
        with torch.no_grad():
            for p, s, t in zip(params, synced, sent):
                s.copy_(s - t if mean else p)


#: name -> (the wrong idea, what the verdict says).
MISTAKES = {
    "sign": (
        functools.partial(candidate, sign=-1),
        "the pseudo-gradient points the wrong way: you averaged local − synced, DiLoCo averages synced − local (a "
        "gradient points against the step taken), so the outer step moved the weights away from what the replicas "
        "learnt; flip it",
    ),
    "from_local": (
        functools.partial(candidate, restore=False),
        "the outer step started from the local weights: put the synced weights back in the parameters "
        "(p.copy_(synced)) before outer.step(); the averaged pseudo-gradient already holds what the replicas "
        "learnt, and stepping from this replica's own weights counts its progress twice and the replicas drift apart",
    ),
    "from_mean": (
        functools.partial(candidate, from_mean=True),
        "the outer step started from the mean of the local weights (the averaged weights left in the parameters), "
        "not from the synced weights: put the synced weights back, p.copy_(s), before outer.step(); the averaged "
        "pseudo-gradient synced − mean already holds what the replicas learnt, and stepping from the mean adds it "
        "once more",
    ),
    "averaging": (
        functools.partial(candidate, weights=True),
        "that is plain averaging (local SGD: the mean of the local weights, an outer SGD with lr 1 and no "
        "momentum), not DiLoCo: hand the averaged pseudo-gradient to the outer optimizer as .grad and let it step "
        "from the synced weights (an outer learning rate and momentum of its own are what DiLoCo adds)",
    ),
    "summed": (
        functools.partial(candidate, divide=False),
        "the pseudo-gradients were summed, not averaged: divide by the world size after the all_reduce, in place "
        "(g /= world); a division forgotten, or written g = g / world, which makes a new tensor and leaves the "
        "summed one in your list",
    ),
    "summed_weights": (
        functools.partial(candidate, from_weights=True, divide=False),
        "the local weights were summed, not averaged: all_reduce left their sum, so your pseudo-gradient is synced − "
        "the sum; divide the sum by the world size before taking synced − it (synced − the mean of the local "
        "weights is the averaged pseudo-gradient)",
    ),
    "stale": (
        functools.partial(candidate, keep=False),
        "the synced weights were never updated (or were copied before outer.step()): after outer.step() copy the "
        "new weights into synced in place, s.copy_(p), or every pseudo-gradient is measured from the first start; "
        "a name rebound in your function (synced = [...], or s = p.clone() in a loop) changes nothing the caller "
        "holds",
    ),
    "inner_grad": (
        functools.partial(candidate, grad=False),
        "the outer step used the last inner gradient, not the pseudo-gradient: set each p.grad to the averaged "
        "pseudo-gradient (p.grad = g) before outer.step(), or the outer optimizer steps with what the last "
        "backward left in .grad",
    ),
    "added_to_grad": (
        functools.partial(candidate, added=True),
        "the averaged pseudo-gradient was added to the last inner gradient (p.grad += g, or p.grad.add_(g)): .grad "
        "still holds what this replica's last backward left there, so the outer step used both, and the replicas "
        "differ; set it, p.grad = g",
    ),
    "averaged_inner_grads": (
        functools.partial(candidate, inner_grads=True),
        "the outer step used the inner gradients averaged over the replicas (the last backward's p.grad), which "
        "is a DDP step's gradient, not the pseudo-gradient: average synced − local, what each replica moved over "
        "its H inner steps, and hand that to p.grad",
    ),
    "divided_twice": (
        functools.partial(candidate, twice=True),
        "the pseudo-gradient was divided twice by the world size (all_reduce with ReduceOp.AVG already returns the "
        "mean; dividing it again by dist.get_world_size() halves it on 2 ranks): divide once, either op=AVG alone or "
        "the default SUM then g /= world",
    ),
    "kept_early": (
        functools.partial(candidate, early=True),
        "the synced weights were overwritten with the local ones before the restore (s.copy_(p) before "
        "p.copy_(s)), so the restore put the local weights back: the outer step started from them, and the new "
        "synced weights are the local ones, not the outer step's result: compute synced − local, put the synced "
        "weights back, step, and only then s.copy_(p)",
    ),
    "in_synced": (
        functools.partial(candidate, in_synced=True),
        "the pseudo-gradient was taken in place in the synced copies (s -= p, or s.sub_(p)) and averaged there, so "
        "the synced weights were gone before the restore: p.copy_(s) put the averaged pseudo-gradient in the "
        "parameters and the outer step started from it; compute it into a new tensor (g = s - p), leave synced "
        "as it is until after outer.step(), then s.copy_(p)",
    ),
    "kept_mean": (
        functools.partial(candidate, mean=True),
        "the new synced weights are the mean of the replicas' local weights (synced − the averaged pseudo-gradient, "
        "s.copy_(s - g)), not the outer step's result: your parameters are DiLoCo's after sync 1, but from then on "
        "each pseudo-gradient is measured from weights no replica holds; after outer.step() keep what it left in "
        "the parameters, s.copy_(p)",
    ),
    "no_move": (
        functools.partial(candidate, step=False),
        "the outer step did not move the weights (every sync ends on the last synced weights): either outer.step() "
        "was never called, or the pseudo-gradient was taken after the synced weights were put back (synced − "
        "local is then zero); compute synced − local first, then restore, set .grad, step",
    ),
}

#: The single mistakes that combine into another wrong sync (a pair is run only as a candidate: each pair's verdict
#: is its two single verdicts). Averaging the weights, a step that never moves and the synced weights kept before
#: the restore leave nothing for a second to change.
PAIRED = ("sign", "from_local", "summed", "stale", "inner_grad", "divided_twice", "averaged_inner_grads")
#: The pairs whose sync is one of its mistakes alone (a sum never divided is not divided twice; gradients never
#: handed to the outer step are not averaged; the inner gradients have no sign to flip): not run.
SAME_AS_ONE = {"summed+divided_twice", "inner_grad+divided_twice", "inner_grad+averaged_inner_grads",
               "sign+averaged_inner_grads"}  # fmt: skip
PAIRS = {
    f"{a}+{b}": functools.partial(candidate, **MISTAKES[a][0].keywords, **MISTAKES[b][0].keywords)
    for i, a in enumerate(PAIRED)
    for b in PAIRED[i + 1 :]
    if f"{a}+{b}" not in SAME_AS_ONE
}

#: The wrong idea that only another world size shows (run there after a sync matched DiLoCo's on 2 ranks).
FIXED_WORLD = {
    "fixed_world": (
        functools.partial(candidate, world=2),
        "the pseudo-gradient was divided by a fixed 2, which is the world size only on 2 ranks: divide by "
        "dist.get_world_size() (a hard-coded world size)",
    ),
}

#: A sync that ends where no_move's does, told apart by what the outer optimizer saw (:class:`NotedSGD`): the kind
#: -> what the verdict says after "the outer step did not move the weights" (or instead of it).
NO_MOVE = {
    "never_stepped": "the outer step did not move the weights: outer.step() was never called; call it after setting "
    "each p.grad to the averaged pseudo-gradient",
    "grads_unset": "the outer step did not move the weights: your sync never gave .grad the averaged "
    "pseudo-gradient: outer.zero_grad() cleared the last inner gradient and no tensor was set after it, so "
    "outer.step() found every .grad None or zero; set each p.grad to the averaged pseudo-gradient (the tensor you "
    "all_reduced), then call outer.step()",
    "grads_cleared": "the outer step did not move the weights: when outer.step() ran every .grad was None or zero, "
    "cleared by outer.zero_grad() after p.grad = g (zero_grad sets each .grad to None, so the step skips every "
    "parameter); set p.grad last, right before outer.step() (zero_grad is not needed: p.grad = g replaces the old "
    "gradient)",
    "grads_none": "the outer step did not move the weights: when outer.step() ran every .grad was None, and "
    f"outer.zero_grad() was not called: the value your sync gave p.grad was None ({ALL_REDUCE_RETURNS_NONE}, "
    "so p.grad = dist.all_reduce(...) sets it to None); all_reduce the pseudo-gradient, then set p.grad to that "
    "tensor",
    "zero_pseudo": "the outer step did not move the weights: its .grad was zero, the pseudo-gradient taken after the "
    "synced weights were put back (synced − local is then zero); compute synced − local first, then restore, set "
    ".grad, step",
    "restored_after": "the synced weights were put back after outer.step(), over its result (every sync ends on the "
    "last synced weights): put them back before outer.step(), which then moves them, and keep what it leaves",
}

#: A sync whose new synced weights share the parameters' storage (after it, ``s`` and ``p`` are one tensor).
ALIASED = (
    "synced holds the parameters themselves (synced[i] = p, p.detach() or p.data share p's storage), so the next "
    "pseudo-gradient synced − local is zero on every replica and nothing is averaged again (the replicas drift "
    "apart): copy the values in place, s.copy_(p), inside torch.no_grad()"
)

#: A sync whose parameters were given the synced weights' storage (after it, ``p`` lives in ``s``'s tensor).
RESTORED_BY_DATA = (
    "the parameters were put back with p.data = s (or p.set_(s)), so each parameter now lives in its synced "
    "tensor: the inner steps move the synced weights too, and the next pseudo-gradient synced − local is zero: put "
    "the synced weights back by copying their values, p.copy_(s), inside torch.no_grad()"
)

#: A sync that stepped the outer optimizer more than once (``outer.step()`` inside the loop over the parameters).
STEPPED_OFTEN = (
    "each call steps every parameter, those not yet put back with this replica's inner gradient still in their "
    ".grad, and adds to the momentum again; set every p.grad in the loop, then call outer.step() once, after it"
)

#: A sync that moved the weights without the outer optimizer (``outer.step()`` never called).
BY_HAND = (
    "outer.step() was never called: your sync moved the weights itself (p.copy_(...) or p -= ...), which is not "
    "DiLoCo's outer optimizer (SGD, lr 0.7, Nesterov momentum 0.9); set each p.grad to the averaged "
    "pseudo-gradient and call outer.step()"
)

#: A sync whose outer step found a multiple of the averaged pseudo-gradient in ``.grad`` (:func:`scaled`), said after
#: "the outer step's .grad was 1/10 of the averaged pseudo-gradient in sync 1".
SCALED = (
    "(every value, the same factor): DiLoCo hands the outer optimizer synced − local averaged over the replicas as "
    "it is, what each replica moved over all its H inner steps, not a per-step gradient; divide by the world size "
    "alone (not by H as well, nor by any other number): the outer learning rate sets the step's size"
)

#: A sync that started an all_reduce with ``async_op=True`` and never waited for it (the order of its calls:
#: :class:`minddp.exercises.harness.Events`), said after "in sync N, K all_reduce(s) started with async_op=True".
NEVER_WAITED = (
    "were never waited for (no .wait() on the Work it returned, nor on that Work's Future): such an all_reduce "
    "goes on in the background while your sync divides its tensor, hands it to p.grad and steps, so what the outer "
    "step uses (this replica's own pseudo-gradient, the sum or the mean) depends on timing and can differ between "
    "replicas; call .wait() on each Work before you use its tensor, or leave async_op out"
)

#: A sync that made an optimizer of its own and stepped it (``outer.step()`` never called).
OWN_OPTIMIZER = (
    "outer.step() was never called: your sync made an optimizer of its own (torch.optim.SGD(...) inside the "
    "function) and stepped that one; made anew at each sync, it starts every sync with no momentum, where DiLoCo's "
    "outer momentum carries over from one sync to the next: step the outer optimizer passed in, which keeps its "
    "state across syncs"
)

#: What the checker adds to the error of an in-place update of a parameter outside ``torch.no_grad()``.
NO_GRAD_HINT = (
    " (the parameters require grad, so autograd refuses an in-place change to them: do the sync's copies and "
    "divisions inside torch.no_grad(), as an optimizer's step does, with torch imported in the cell that defines "
    "your function; outer.step() may stay outside it)"
)

#: What the checker adds to gloo's refusal of ReduceOp.AVG (older torch releases have no average on gloo).
AVG_MESSAGE = "Cannot use ReduceOp.AVG with Gloo"
AVG_HINT = (
    " (this torch's gloo, the backend of the checker's CPU ranks, has no ReduceOp.AVG: all_reduce with the default "
    "SUM, then divide by dist.get_world_size(), in place)"
)


#: What the checker adds to a NameError for a module: the function reaches the ranks with the kernel's names only.
class NotedSGD(torch.optim.SGD):
    """DiLoCo's outer SGD (0.7, momentum 0.9, Nesterov), noting what a sync does with it: each ``zero_grad()`` (and
    whether every ``.grad`` was still the one the sync began with, ``entry``: the last inner gradient) and,
    at each ``step()``, whether the ``.grad`` it finds is set, zero or ``None``, and whether the parameters hold
    ``start`` (the synced weights the sync began with: put back before the step); ``grads``: the ``.grad`` its
    first step found."""

    def __init__(self, params):
        super().__init__(params, lr=0.7, momentum=0.9, nesterov=True)
        self.notes: list[str] = []
        self.start: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] | None = None  # the .grad the round's first step found (zeros for None)
        self.entry: list[tuple] = []  # each .grad when the sync began (the last inner gradient), and its values

    def zero_grad(self, set_to_none: bool = True) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        unset = bool(self.entry) and all(
            p.grad is g and (g is None or g.equal(v)) for p, (g, v) in zip(params, self.entry)
        )
        self.notes.append("zero_grad:unset" if unset else "zero_grad")  # unset: each .grad the inner one still
        super().zero_grad(set_to_none)

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        seen = (
            "none"
            if all(g is None for g in grads)
            else "zero"
            if all(g is None or not g.any() for g in grads)
            else "set"
        )
        restored = all(p.equal(s) for p, s in zip(params, self.start))
        if self.entry and all(p.grad is None or p.grad is g for p, (g, _) in zip(params, self.entry)):
            self.notes.append("grads:untouched")  # no .grad given a new tensor in this sync
        if self.grads is None:
            self.grads = [torch.zeros_like(p) if g is None else g.detach().clone() for p, g in zip(params, grads)]
        self.notes.append(f"step:{seen}:{'restored' if restored else 'local'}")
        return super().step(closure)


# -- on every rank --------------------------------------------------------------------------------------------


def inner_step(model: torch.nn.Module, inner: torch.optim.Optimizer, step: int, rank: int) -> None:
    """One inner step of replica ``rank`` on its own data of ``step``."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = (
        torch.randn(harness.PER_RANK, harness.IN, generator=g),
        torch.randn(harness.PER_RANK, harness.OUT, generator=g),
    )
    inner.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()


def rounds_with(sync, rank: int, group, seen: dict | None = None) -> list[dict]:
    """Steps 1-2: ROUNDS rounds of SYNC_EVERY inner steps from the same start, ``sync`` after each; ``seen["outer"]``
    (where given): what the outer optimizer saw in the round running, kept there if ``sync`` raises."""
    model = harness.make_net(0)  # the same network on every rank
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=INNER_LR)
    outer = NotedSGD(params)
    synced = [p.detach().clone() for p in params]
    storages = [p.untyped_storage().data_ptr() for p in params]
    history = []
    for r in range(ROUNDS):
        for t in range(SYNC_EVERY):
            inner_step(model, inner, r * SYNC_EVERY + t, rank)
        outer.notes, outer.start, outer.grads = [], [s.clone() for s in synced], None
        outer.entry = [(p.grad, None if p.grad is None else p.grad.clone()) for p in params]
        if seen is not None:
            seen["outer"] = outer.notes
        events = harness.Events()  # which collective launched with async_op=True was never waited for
        with _counting_all_reduce() as calls, _counting_optimizers() as made:
            if group is None:
                try:
                    with events.recording():
                        sync(params, synced, outer)
                finally:  # what it left in flight, finished here: the next round starts from settled tensors
                    for _, work in events.works:
                        if work is not None:
                            work.wait()
            else:
                sync(params, synced, outer, group=group)
        history.append(
            {
                "params": [p.detach().clone() for p in params],
                "synced": [s.clone() for s in synced],
                "outer": outer.notes,
                "grads": outer.grads,
                "aliased": any(_shares(s, p) for s in synced for p in params),
                "moved": any(p.untyped_storage().data_ptr() != ptr for p, ptr in zip(params, storages)),
                "all_reduces": len(calls),
                "unwaited": len(events.unwaited()) if group is None else 0,
                "optimizers": len(made),
            }
        )
    return history


@contextlib.contextmanager
def _counting_all_reduce():
    """Within: ``dist.all_reduce`` called through the module (as ``dist.all_reduce(...)`` is) is counted."""
    calls, real = [], dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield calls
    finally:
        dist.all_reduce = real


@contextlib.contextmanager
def _counting_optimizers():
    """Within: each optimizer made (any ``torch.optim.Optimizer``: their ``__init__`` ends in the base class's) is
    counted."""
    made, real = [], torch.optim.Optimizer.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = counted
    try:
        yield made
    finally:
        torch.optim.Optimizer.__init__ = real


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """``a`` is ``b`` up to float32 rounding (:func:`minddp.exercises.harness.close` on each tensor).

    A learner may average in another order (divide before or after the sum), a few float32 roundings
    per sync, carried through 3 rounds of AdamW; 1e-4 of each tensor's norm is far above that and far
    below any two candidates' distance (a flipped sign, a missing restore: the outer step's own size).
    """
    return len(a) == len(b) and all(harness.close(x, y) for x, y in zip(a, b))


def outer_sync_finding(mine: list[dict], candidates: dict[str, list[dict]], everyone: list) -> dict | None:
    """Step 3 on one rank: the first thing wrong, or ``None`` for DiLoCo's sync."""
    right = candidates["diloco"]
    # first: with an all_reduce never waited for, what the sync computed depends on timing, whatever it matches
    unwaited = next((r for r, m in enumerate(mine) if m.get("unwaited")), None)
    if unwaited is not None:
        return {"kind": "never_waited", "sync": unwaited + 1, "unwaited": mine[unwaited]["unwaited"]}
    for name in candidates:  # in the order run: diloco, then each mistake (from_local before ranks_differ)
        theirs = candidates[name]
        if all(close(m["params"], t["params"]) and close(m["synced"], t["synced"]) for m, t in zip(mine, theirs)):
            if name == "diloco":
                return None
            return {"kind": no_move_cause(mine[0]["outer"]) if name == "no_move" else name}
    aliased = next((r for r, m in enumerate(mine) if m["aliased"]), None)
    if aliased is not None:
        return {"kind": "restored_by_data" if mine[aliased].get("moved") else "aliased", "sync": aliased + 1}
    steps = [sum(n.startswith("step:") for n in m["outer"]) for m in mine]
    often = next((r for r, n in enumerate(steps) if n > 1), None)
    if often is not None:  # before the replicas' difference: the extra steps use each replica's inner gradients
        return {"kind": "stepped_often", "sync": often + 1, "steps": steps[often]}
    if not any(n.startswith("step:") for m in mine for n in m["outer"]):
        return {"kind": "own_optimizer" if any(m.get("optimizers") for m in mine) else "by_hand"}
    for r, rounds in enumerate(zip(*everyone)):
        if not all(close(x["params"], rounds[0]["params"]) for x in rounds[1:]):
            return {"kind": "ranks_differ", "sync": r + 1, "all_reduces": mine[r].get("all_reduces", 0)}
    scale = scaled(mine[0], right[0])
    if scale is not None:
        return {"kind": "scaled", "scale": scale}
    for r, (m, t) in enumerate(zip(mine, right)):
        for what in ("params", "synced"):
            if not close(m[what], t[what]):
                diffs = [float((a - b).abs().max()) for a, b in zip(m[what], t[what])]
                worst = max(range(len(diffs)), key=diffs.__getitem__)
                return {"kind": "other", "sync": r + 1, "what": what, "diff": diffs[worst], "tensor": worst}
    return {"kind": "other", "sync": ROUNDS, "what": "params", "diff": float("nan"), "tensor": 0}


def scaled(mine: dict, right: dict) -> float | None:
    """The factor c where sync 1's outer step (one step, from the restored synced weights) found ``.grad`` = c ×
    DiLoCo's averaged pseudo-gradient, every value (:func:`close`), c not 1; else ``None``. Before sync 1 both
    trained the same inner steps from the same start, so the two ``.grad`` are comparable value by value."""
    steps = [n for n in mine["outer"] if n.startswith("step:")]
    if steps != ["step:set:restored"] or mine.get("grads") is None or right.get("grads") is None:
        return None
    flat = torch.cat([g.reshape(-1) for g in mine["grads"]])
    want = torch.cat([g.reshape(-1) for g in right["grads"]])
    c = float(flat @ want / (want @ want))
    return c if abs(c - 1) > 1e-3 and harness.close(flat, c * want) else None


def no_move_cause(notes: list[str]) -> str:
    """Why a sync's outer step did not move the weights, from what its outer optimizer saw (:class:`NotedSGD`)."""
    steps = [n.split(":") for n in notes if n.startswith("step:")]
    if not steps:
        return "never_stepped"
    _, grad, where = steps[0]
    before = notes[: notes.index(":".join(steps[0]))]
    cleared = [n for n in before if n.startswith("zero_grad")]
    if grad in ("none", "zero") and cleared and cleared[-1] == "zero_grad":
        return "grads_cleared"
    if grad in ("none", "zero") and cleared and "grads:untouched" in before:  # zero_grad() met the inner .grad
        return "grads_unset"
    if grad == "none":  # never cleared, so set to None: the learner kept all_reduce's result
        return "grads_none"
    if grad == "zero":
        return "zero_pseudo"
    return "restored_after" if where == "local" else "no_move"


@contextlib.contextmanager
def checking(fn):
    """Around either check on a rank: a group of the checker's own, one report printed whatever happens."""
    checker = dist.new_group(backend="gloo")
    progress = harness.Progress()
    report: dict = {"rank": dist.get_rank(), "world": dist.get_world_size(), "finding": None}
    try:
        with harness.reporting(progress, harness.stage_files(fn), report):
            yield checker, progress, report
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(checker)


def check_outer_sync_on_rank(fn, every_mistake: bool = True) -> None:
    """Steps 1-3 on this rank; one report line (:data:`minddp.exercises.harness.MARK`). ``every_mistake=False``
    (the check at another world size, after yours matched DiLoCo's): DiLoCo's candidate alone."""
    with checking(fn) as (checker, progress, report):
        rank = report["rank"]
        # the candidates first: a rank whose learner's code raises releases its peer by interrupting it, and an
        # interrupted first optimizer step (its lazy imports) would leave this worker broken for the next check
        progress.phase = "running the candidates"
        candidates = {"diloco": rounds_with(candidate, rank, checker)}
        others = MISTAKES if every_mistake else FIXED_WORLD
        candidates.update({name: rounds_with(wrong, rank, checker) for name, (wrong, _) in others.items()})
        if every_mistake:  # after every single mistake: a pair is named only when no single one matches
            candidates.update({name: rounds_with(wrong, rank, checker) for name, wrong in PAIRS.items()})
        progress.phase = "running your outer_sync"
        mine = rounds_with(fn, rank, None, seen=report)
        everyone: list = [None] * report["world"]
        dist.all_gather_object(everyone, mine, group=checker)
        report["finding"] = outer_sync_finding(mine, candidates, everyone)
        if report["finding"] is None:
            right = candidates["diloco"]
            report["max_diff"] = max(
                float((a - b).abs().max()) for m, t in zip(mine, right) for a, b in zip(m["params"], t["params"])
            )


def check_schedule_on_rank(fn) -> None:
    """The schedule on this rank for two periods, gathered; one report line."""
    with checking(fn) as (checker, progress, report):
        progress.phase = "calling your fragment_to_send"
        mine = [[fn(step, *_args(s)) for step in range(1, 2 * s["sync_every"] + 1)] for s in SCHEDULES]
        answer = [
            [solutions.fragment_to_send(step, *_args(s)) for step in range(1, 2 * s["sync_every"] + 1)]
            for s in SCHEDULES
        ]
        everyone: list = [None] * report["world"]
        dist.all_gather_object(everyone, mine, group=checker)
        report["finding"] = schedule_finding(everyone, answer)
        report["schedule"] = mine


def _args(schedule: dict) -> tuple[int, int, int]:
    return schedule["sync_every"], schedule["fragments"], schedule["delay"]


def schedule_finding(everyone: list[list[list]], answer: list[list]) -> dict | None:
    """The first schedule (index ``at``) and step where the ranks disagree, else where rank 0's differs, else None."""
    for at, (theirs, right) in enumerate(zip(zip(*everyone), answer)):
        for step, sends in enumerate(zip(*theirs), start=1):
            if len(set(map(repr, sends))) > 1:
                return {"kind": "differs", "at": at, "step": step, "sends": list(sends)}
        for step, (mine, want) in enumerate(zip(theirs[0], right), start=1):
            if isinstance(mine, bool):  # ``cond and fragment`` is False where cond is
                return {"kind": "bool", "at": at, "step": step, "mine": mine, "right": want}
            if mine is not None and type(mine) is not int:
                return {"kind": "not_whole", "at": at, "step": step, "mine": mine, "right": want}
            if mine != want:
                return {"kind": "wrong", "at": at, "step": step, "mine": mine, "right": want}
    return None


# -- in the notebook ------------------------------------------------------------------------------------------


def _checked(fn, on_rank, name: str, shape: str, describe, world_size: int, timeout_s: float):
    """Both checks' first steps: ``fn`` called on ``world_size`` ranks by ``on_rank``; its reports, and the
    failing :class:`Verdict` (a raise, a hang, the ranks' finding described by ``describe``) or ``None``."""
    if not callable(fn):
        raise TypeError(f"check_{name.replace(' ', '_')}() takes a function {shape}, got {fn!r}")
    reports = _run(on_rank, (fn,), world_size, timeout_s)
    problem = _problem(name, reports, timeout_s, describe)
    messages = [(r.get("error") or {}).get("message", "") for r in reports.values() if r]
    if problem and any(NO_GRAD_MESSAGE in m for m in messages):
        problem += NO_GRAD_HINT
    if problem and any(AVG_MESSAGE in m for m in messages):
        problem += AVG_HINT
    return reports, (Verdict(False, problem, reports) if problem else None)


#: The start of autograd's error for an in-place change to a parameter (a leaf that requires grad).
NO_GRAD_MESSAGE = "a leaf Variable that requires grad is being used in an in-place operation"


def check_outer_sync(fn, *, world_size: int = 2, timeout_s: float = 20.0) -> Verdict:
    """Check ``outer_sync(params, synced, outer)`` (module doc) on ``world_size`` ranks; one :class:`Verdict`."""
    name = "outer sync"
    shape = "outer_sync(params, synced, outer)"
    reports, failed = _checked(fn, check_outer_sync_on_rank, name, shape, _outer_sync_text, world_size, timeout_s)
    if failed is not None:
        return Verdict(False, failed.line + _none_hint(reports), reports)
    first = reports[min(reports)]
    # a sync that divides by a fixed 2 is DiLoCo's on 2 ranks: run it again on OTHER_WORLD ranks beside DiLoCo's
    # alone (only an answer that passed pays for it: a few seconds, the first time to start those ranks)
    other = world_size + 1
    again = _run(check_outer_sync_on_rank, (fn, False), other, timeout_s)
    trouble = _problem(name, again, timeout_s, _outer_sync_text)
    if trouble is not None:
        return Verdict(
            False,
            f"✗ {name}: on {world_size} ranks your sync is DiLoCo's, but not on {other}: " + trouble.split(": ", 1)[1],
            again,
        )
    return Verdict(
        True,
        f"✓ {name}: after {ROUNDS} syncs of {SYNC_EVERY} inner steps on {first['world']} ranks (and again on {other}), "
        "your weights and "
        f"synced weights are DiLoCo's (largest difference {first['max_diff']:.1e}): the pseudo-gradient synced − "
        "local averaged over the replicas, the outer SGD (0.7, momentum 0.9, Nesterov) stepped from the synced "
        "weights, the result kept as the new synced weights",
        reports,
    )


#: What the checker adds to a None met where a .grad was expected after ``outer.zero_grad()`` (``p.grad.copy_(g)``).
ZERO_GRAD_NONE_HINT = (
    " (outer.zero_grad() sets each .grad to None, so there is no .grad tensor to change in place: assign the "
    "averaged pseudo-gradient, p.grad = g, which replaces the old gradient without zero_grad)"
)


def _none_hint(reports: dict) -> str:
    """What to add to a raise that met None: a None divided by a number (the world size) is all_reduce's result;
    another None after ``outer.zero_grad()`` is a cleared .grad; any other is all_reduce's result."""
    raised = [r for r in reports.values() if r and "NoneType" in (r.get("error") or {}).get("message", "")]
    if not raised:
        return ""
    message = raised[0]["error"]["message"]
    if re.search(r"'NoneType' and '(int|float)'", message) or not any(
        n.startswith("zero_grad") for n in raised[0].get("outer", ())
    ):
        return f" ({ALL_REDUCE_RETURNS_NONE})"
    return ZERO_GRAD_NONE_HINT


def _outer_sync_text(f: dict, report: dict) -> str:
    if f["kind"] in MISTAKES:
        return MISTAKES[f["kind"]][1]
    if f["kind"] in FIXED_WORLD:
        return FIXED_WORLD[f["kind"]][1]
    if f["kind"] in PAIRS:
        first, second = f["kind"].split("+")
        return f"two mistakes at once: {MISTAKES[first][1]}; and {MISTAKES[second][1]}"
    if f["kind"] in NO_MOVE:
        return NO_MOVE[f["kind"]]
    if f["kind"] == "aliased":
        return f"after sync {f['sync']}, " + ALIASED
    if f["kind"] == "restored_by_data":
        return f"after sync {f['sync']}, " + RESTORED_BY_DATA
    if f["kind"] == "stepped_often":
        return f"outer.step() was called {f['steps']} times in sync {f['sync']}, DiLoCo's sync once: " + STEPPED_OFTEN
    if f["kind"] == "never_waited":
        return f"in sync {f['sync']}, {f['unwaited']} all_reduce(s) started with async_op=True " + NEVER_WAITED
    if f["kind"] == "by_hand":
        return BY_HAND
    if f["kind"] == "scaled":
        c, n = f["scale"], round(1 / f["scale"]) if f["scale"] else 0
        factor = f"1/{n} of" if n > 1 and abs(1 / c - n) < 1e-3 * n else f"{c:.3g} ×"
        return f"the outer step's .grad was {factor} the averaged pseudo-gradient in sync 1 " + SCALED
    if f["kind"] == "own_optimizer":
        return OWN_OPTIMIZER
    if f["kind"] == "ranks_differ" and f.get("all_reduces"):
        return (
            f"the replicas hold different weights after sync {f['sync']}, though your sync called all_reduce "
            f"{f['all_reduces']} time(s): the tensor handed to p.grad is not the one all_reduce averaged (a copy "
            "averaged, or .grad set from another tensor); all_reduce the pseudo-gradient in place, divide it by the "
            "world size and hand that same tensor to p.grad"
        )
    if f["kind"] == "ranks_differ":
        return (
            f"the replicas hold different weights after sync {f['sync']}: average the pseudo-gradient over the "
            "ranks (dist.all_reduce, then divide by the world size) so that every replica takes the same outer step"
        )
    return (
        f"your {f['what']} differ from DiLoCo's after sync {f['sync']} (largest difference {f['diff']:.2g} in "
        f"tensor {f['tensor']}) and match none of the usual mistakes"
    )


def check_fragment_schedule(fn, *, world_size: int = 2, timeout_s: float = 20.0) -> Verdict:
    """Check ``fragment_to_send(step, sync_every, fragments, delay)`` (module doc); one :class:`Verdict`."""
    name = "fragment schedule"
    shape = "fragment_to_send(step, sync_every, fragments, delay)"
    reports, failed = _checked(fn, check_schedule_on_rank, name, shape, _schedule_text, world_size, timeout_s)
    if failed is not None:
        return failed
    said = []
    for schedule, mine in zip(SCHEDULES, reports[min(reports)]["schedule"]):
        h, k, tau = _args(schedule)
        sends = ", ".join(f"fragment {f} after step {s}" for s, f in enumerate(mine, start=1) if f is not None)
        said.append(f"with H = {h}, {k} fragments and a delay of {tau} (turns of {h // k} steps): {sends}")
    return Verdict(
        True,
        f"✓ {name}: every replica sends " + "; ".join(said) + ": one fragment per turn, each delay steps "
        "before its turn ends, the same on every replica",
        reports,
    )


def _send_step_shift(schedules: list[list]) -> tuple[int, bool]:
    """-1 (or +1) where every schedule sends once a turn, one step before (or after) streaming DiLoCo's send step
    in the turn, whatever the fragment; else 0. Turns of 2 steps cannot tell the two apart: the other schedules do.
    A schedule with a delay of 0 that sends nothing is left out, and said (the second value): ``(step − 1) % turn
    == turn − delay`` is one step late at every other delay and never reaches ``turn``."""
    silent = [s["delay"] == 0 and all(x is None for x in mine) for s, mine in zip(SCHEDULES, schedules)]
    for shift in (-1, 1):
        ok = True
        for schedule, mine, quiet in zip(SCHEDULES, schedules, silent):
            h, k, tau = _args(schedule)
            turn = h // k
            ok = ok and (
                quiet
                or all((x is not None) == (s % turn == (turn - tau + shift) % turn) for s, x in enumerate(mine, 1))
            )
        if ok:
            return shift, any(silent)
    return 0, False


def _delay_ignored(schedules: list[list]) -> str:
    """ "last" (or "first") where every schedule sends each turn's fragment after the turn's last (or first) step,
    whatever its delay; else "". Right only at a delay of 0 (or of turn − 1), so the other schedules tell."""
    for where, at in (("last", 0), ("first", 1)):
        if all(
            mine
            == [(s - 1) // (h // k) % k if s % (h // k) == at % (h // k) else None for s in range(1, len(mine) + 1)]
            for (h, k, _), mine in zip(map(_args, SCHEDULES), schedules)
        ):
            return where
    return ""


def _place_in_the_period(schedule: dict, steps: int) -> list:
    """Streaming DiLoCo's send steps, each sending ``(step % sync_every − 1) // turn``: the fragment taken from the
    step's place in the period, right but after a period's last step, where ``step % sync_every`` is 0 and it
    gives −1 (a −1 that a ``% fragments`` would turn into the last fragment)."""
    h, k, tau = _args(schedule)
    return [
        (step % h - 1) // (h // k) if solutions.fragment_to_send(step, h, k, tau) is not None else None
        for step in range(1, steps + 1)
    ]


def _silent_at_zero() -> str:
    """What a schedule that sends nothing at a delay of 0 does, why, and the send condition that fixes it."""
    h, k, _ = _args(next(s for s in SCHEDULES if s["delay"] == 0))
    turn = h // k
    return (
        f"with a delay of 0 (H = {h}, {k} fragments) it sends no fragment at all: a remainder modulo {turn} runs from "
        f"0 to {turn - 1}, so it never equals turn − delay = {turn}: send where step % turn == (turn − delay) % turn"
    )


def _schedule_text(f: dict, report: dict) -> str:
    h, k, tau = _args(SCHEDULES[f["at"]])
    where = f"with H = {h}, {k} fragments and a delay of {tau}, after step {f['step']}"
    if f["kind"] == "differs":
        who = "; ".join(f"rank {r}: {s!r}" for r, s in enumerate(f["sends"]))
        return (
            f"the schedule differs across replicas: {where} ({who}); the replicas would sum "
            "different fragments' pseudo-gradients (or one would wait for ever): decide from the step alone, "
            "never from the rank"
        )
    turn = h // k
    if f["kind"] == "bool":
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: a step that sends nothing "
            "returns None and a step that sends returns the fragment's number; a bool is neither (cond and fragment "
            "gives False where cond is false): return None on those steps, with an if"
        )
    if f["kind"] == "not_whole":
        return (
            f"{where} yours sends {f['mine']!r}: a fragment is a whole number (an index into the fragments), "
            f"streaming DiLoCo sends {f['right']!r}: a turn's length is sync_every // fragments (floor division), "
            "not sync_every / fragments, which is a float"
        )
    mine = report["schedule"][f["at"]]
    right = [solutions.fragment_to_send(step, h, k, tau) for step in range(1, len(mine) + 1)]
    if all(
        theirs == [solutions.fragment_to_send(step + 1, *_args(s)) for step in range(1, len(theirs) + 1)]
        for s, theirs in zip(SCHEDULES, report["schedule"])
    ):
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours counts the steps from 0: "
            "after every step yours sends what streaming DiLoCo sends after the next one, in every schedule (the send "
            "step and the fragment both one step early); steps count from 1 (the first inner step is step 1): your "
            "formulas applied to step − 1 are streaming DiLoCo's"
        )
    sent, turns = sum(x is not None for x in mine), len(mine) // turn
    if sent > turns:
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours sends {sent} fragments "
            f"in these {turns} turns of {turn} steps, streaming DiLoCo one per turn, after step {turn} − {tau} = "
            f"{turn - tau} of the turn: return None after every other step"
        )
    if sent == 0 and tau > 0:  # a delay of 0 that sends nothing is named below, with its cause
        return (
            f"{where} yours sends None, streaming DiLoCo sends {f['right']!r}: yours sends no fragment at all in these "
            f"{turns} turns of {turn} steps (None after every step), streaming DiLoCo one per turn, after step "
            f"{turn} − {tau} = {turn - tau} of the turn: check that the branch that sends returns the fragment (a "
            "missing return gives None) and that its condition, step % turn == (turn − delay) % turn, is true once "
            "a turn"
        )
    sends = [(x, r) for x, r in zip(mine, right) if r is not None]
    if all(x == r + 1 for x, r in sends) and all(x is None for x, r in zip(mine, right) if r is None):
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours numbers the fragments "
            f"1 to {k}, and they are numbered from 0 ({k} fragments: 0 to {k - 1}, indices into the fragments): "
            "drop the + 1"
        )
    if f["mine"] == f["step"] // turn % k and f["right"] == (f["step"] - 1) // turn % k:
        first = (f["step"] - 1) // turn * turn + 1
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: steps count from 1: step "
            f"{f['step']} is the last of its turn (steps {first} to {first + turn - 1}), so the turn's number is "
            f"(step − 1) // {turn}, not step // {turn}"
        )
    # the next turn's (after steps counted from 0: at a delay of 0, step // turn is (step + delay) // turn) or the
    # previous turn's fragment (step // turn − 1: right at a delay of 0 alone)
    for shift, which, instead in (
        (1, "after", f"(step + delay) // {turn} % {k}"),
        (-1, "before", f"step // {turn} − 1"),
    ):
        if all(x == (r + shift) % k for x, r in sends) and all(x is None for x, r in zip(mine, right) if r is None):
            first = (f["step"] - 1) // turn * turn + 1
            return (
                f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours sends the fragment "
                f"of the turn {which} this one; step {f['step']} is in the turn of steps {first} to "
                f"{first + turn - 1}, fragment {f['right']}'s, and the fragment sent during a turn is that turn's own, "
                f"applied at its end: (step − 1) // {turn} % {k}, not {instead}"
            )
    if all(
        mine == [(s - 1) // h % k if s % h == (h - tau) % h else None for s in range(1, len(mine) + 1)]
        for (h, k, tau), mine in zip(map(_args, SCHEDULES), report["schedule"])
    ):
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours takes a turn as "
            f"sync_every = {h} steps: a turn is sync_every // fragments = {turn} steps, so that each of the {k} "
            f"fragments has its turn once in every H = {h} steps"
        )
    silent = [s["delay"] == 0 and all(x is None for x in mine) for s, mine in zip(SCHEDULES, report["schedule"])]
    for back, period in ((1, "(step − 1)"), (0, "step")):  # the period's number, steps counted from 1 or from 0
        if all(
            quiet
            or mine
            == [
                (s - back) // h % k if s % (h // k) == (h // k - tau) % (h // k) else None
                for s in range(1, len(mine) + 1)
            ]
            for (h, k, tau), mine, quiet in zip(map(_args, SCHEDULES), report["schedule"], silent)
        ):
            return (
                f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours numbers the fragment "
                f"by the period, {period} // sync_every, so every turn of a period sends the same fragment; the "
                f"fragment is the turn's number, (step − 1) // {turn} % {k}, not {period} // {h} % {k}"
                + (f"; {_silent_at_zero()}" if any(silent) else "")
            )
    ignored = _delay_ignored(report["schedule"])
    if ignored:
        lh, lk, ltau = _args(max(SCHEDULES, key=lambda x: x["sync_every"] // x["fragments"]))  # the longest turn
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours ignores the delay: it "
            f"sends each fragment after its turn's {ignored} step at every delay, and it leaves delay steps before its "
            f"turn ends (with H = {lh}, {lk} fragments and a delay of {ltau}: after step {lh // lk} − {ltau} = "
            f"{lh // lk - ltau} of each turn of {lh // lk}): send where step % turn == (turn − delay) % turn"
        )
    after_start = [(s - 1) // turn % k if s % turn == tau % turn else None for s in range(1, len(mine) + 1)]
    if mine == after_start:
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours sends each fragment "
            f"delay steps after its turn starts (step % turn == delay), and it leaves delay steps before its turn "
            f"ends, so that the step that applies it comes delay steps later: here after step {turn} − {tau} = "
            f"{turn - tau} of each turn of {turn}, not {tau % turn or turn} (the two agree only where 2·delay is a "
            "turn); send where step % turn == (turn − delay) % turn"
        )
    shift, silent = _send_step_shift(report["schedule"])
    if shift:
        lh, lk, ltau = _args(max(SCHEDULES, key=lambda x: x["sync_every"] // x["fragments"]))  # the longest turn
        lturn = lh // lk
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: an off-by-one in the send "
            f"step: yours sends each fragment one step {'earlier' if shift < 0 else 'later'} in its turn than "
            f"streaming DiLoCo, in every schedule{' with a delay above 0' if silent else ''} (with H = {lh}, {lk} "
            f"fragments and a delay of {ltau}: after step {(lturn - ltau + shift - 1) % lturn + 1} of each turn of "
            f"{lturn}, not {lturn} − {ltau} = {lturn - ltau})"
            + (f", and {_silent_at_zero()}" if silent else ": send where step % turn == (turn − delay) % turn")
        )
    if all(theirs == _place_in_the_period(s, len(theirs)) for s, theirs in zip(SCHEDULES, report["schedule"])):
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours takes the fragment from "
            f"step % sync_every, (step % sync_every − 1) // turn: steps count from 1, so after a period's last step "
            f"({h}, {2 * h}, ...) step % {h} is 0, not {h}, and yours gives −1; the fragment is the turn's number, "
            f"(step − 1) // {turn} % {k}"
        )
    if isinstance(f["mine"], int) and not 0 <= f["mine"] < k:
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: there is no fragment "
            f"{f['mine']} ({k} fragments: 0 to {k - 1}); after the last fragment's turn the next period starts again "
            "at fragment 0, so the fragment is the turn's number modulo the fragments (turn % fragments)"
        )
    if tau == 0 and all(sent is None for sent in report["schedule"][f["at"]]):
        # right at the other delays, silent at 0: the send step tested as step % turn == turn − delay
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}, and with this delay of 0 yours "
            f"sends no fragment at all: a delay of 0 sends after each turn's last step ({turn}, {2 * turn}, "
            f"{3 * turn}, ...), where step % {turn} is 0; step % {turn} runs from 0 to {turn - 1}, so it never equals "
            f"turn − delay = {turn}: send where step % turn == (turn − delay) % turn"
        )
    if all(
        [x is None for x in theirs]
        == [solutions.fragment_to_send(step, *_args(s)) is None for step in range(1, 1 + len(theirs))]
        for s, theirs in zip(SCHEDULES, report["schedule"])
    ):  # the send steps right in every schedule, a fragment none of the named numberings above
        number = (f["step"] - 1) // turn
        return (
            f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: yours sends after the right "
            f"steps, in every schedule, but not the right fragment: the fragment is the number of the turn the step "
            f"is in, counted from 0 (steps 1 to {turn} are turn 0, steps {turn + 1} to {2 * turn} turn 1, ...), "
            f"modulo the fragments: step {f['step']} is in turn {number}, so fragment (step − 1) // {turn} % {k} = "
            f"{f['right']}"
        )
    return (
        f"{where} yours sends {f['mine']!r}, streaming DiLoCo sends {f['right']!r}: a turn is sync_every // "
        f"fragments = {turn} steps, fragment 0 first, each sent delay steps before its turn ends (here after step "
        f"{turn} − {tau} = {turn - tau} of each turn)"
    )
