"""What travels together and when: the model in fragments, and the refusals made before any rank talks.

The slow-link rungs check everything they are given here, with no process group, so that a bad value is
one line on every rank (the same values give the same error everywhere) and never a hang or a silent
divergence; the train command asks the same functions before it starts any rank.

1. :func:`check_schedule`: ``sync_every`` (H) a whole number of steps, divisible by the ``fragments``
   (K); the delay τ below a turn's H/K steps (one fragment in flight at a time); α in [0, 1];
2. :func:`split_fragments`: K contiguous runs of the trainable parameters, in the model's order, of
   about equal size (or the fragments a torchft user names as modules, checked to cover the model once);
3. :func:`check_optimizer`: an optimizer over exactly the parameters it must step (:func:`outer_per_fragment`:
   DiLoCo's outer one, for each fragment); :func:`check_not_sharded`: no sharded model or optimizer (every
   replica holds all of its weights).

Example::

    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    >>> [[tuple(p.shape) for p in f] for f in split_fragments(model, 2)]
    [[(4, 4), (4,)], [(4, 4), (4,)]]
    >>> check_schedule(sync_every=10, fragments=3)
    Traceback (most recent call last):
    ValueError: sync_every=10 is not divisible by fragments=3: every fragment syncs once in sync_every steps, one ...
"""

from __future__ import annotations

from numbers import Integral, Real

import torch
from torch import nn

#: The names :func:`check_schedule` says in its messages: the API's; the train command passes its flags.
API_NAMES = {
    "sync_every": "sync_every",
    "fragments": "fragments",
    "delay": "fragment_sync_delay",
    "alpha": "fragment_update_alpha",
}

#: Where sharded models and optimizers come from: minddp's zero2 and fsdp and ZeRO-1, and torch's own.
SHARDED_MODULES = ("minddp.sharding", "torch.distributed.fsdp", "torch.distributed.optim.zero_redundancy_optimizer")


def _whole(value, low: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= low


def check_schedule(sync_every, fragments: int = 1, delay=0, alpha=0.0, names: dict = API_NAMES) -> None:
    """Step 1: raise ``ValueError`` (one line: the value, why, what to give) unless the schedule can run."""
    h, k, d, a = (names[key] for key in ("sync_every", "fragments", "delay", "alpha"))
    if not _whole(sync_every, 1):
        raise ValueError(f"{h} must be a whole number of optimizer steps, 1 or more; got {sync_every!r}")
    if not _whole(fragments, 1):
        raise ValueError(f"{k} must be a whole number of fragments, 1 or more; got {fragments!r}")
    if sync_every % fragments:
        low, high = max(1, sync_every // fragments) * fragments, (sync_every // fragments + 1) * fragments
        raise ValueError(
            f"{h}={sync_every} is not divisible by {k}={fragments}: every fragment syncs once in {h} steps, "
            f"one every {h}/{k} steps; give a multiple of {fragments} such as {low if low != sync_every else high}"
        )
    per_turn = sync_every // fragments
    if not _whole(delay, 0) or delay >= per_turn:
        raise ValueError(
            f"{d}={delay!r} is not a whole number of steps below a turn's {h}/{k} = {per_turn} steps: "
            f"a fragment's message must be applied before the next one leaves (one in flight); give 0"
            + (f" to {per_turn - 1}" if per_turn > 1 else "")
        )
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"{a}={alpha!r} is outside [0, 1]: it is the local weights' share in the mix (0 takes the synced "
            "weights, 1 keeps the local ones); give a number from 0 to 1"
        )


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the slow-link rungs sync: the model's trainable ones, in its order (a tied one once)."""
    return [p for p in model.parameters() if p.requires_grad]


def split_fragments(model: nn.Module, fragments) -> list[list[nn.Parameter]]:
    """Step 2: the trainable parameters in ``fragments`` runs (an int K), or as the modules given (a list).

    K contiguous runs of whole tensors, each closed once the parameters so far reach its share of the
    total (its ``k/K``), every run holding at least one tensor.
    """
    params = trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters: nothing to train or to sync")
    if not isinstance(fragments, Integral):
        return _named_fragments(params, list(fragments))
    if fragments > len(params):
        raise ValueError(
            f"fragments={fragments} is more than the model's {len(params)} trainable tensors: a fragment is a run "
            f"of whole tensors; give {len(params)} or fewer"
        )
    total, seen, runs = sum(p.numel() for p in params), 0, [[]]
    for i, p in enumerate(params):
        full = seen >= len(runs) * total / fragments  # the open run holds its share
        if runs[-1] and len(runs) < fragments and (full or len(params) - i == fragments - len(runs)):
            runs.append([])
        runs[-1].append(p)
        seen += p.numel()
    return runs


def _named_fragments(params: list[nn.Parameter], modules: list) -> list[list[nn.Parameter]]:
    """torchft's form: a list of modules, whose trainable parameters must cover the model's exactly once."""
    if not modules or not all(isinstance(m, nn.Module) for m in modules):
        raise TypeError("fragments must be a number, or a list of the model's submodules (one per fragment)")
    runs = [trainable(m) for m in modules]
    ids = [id(p) for run in runs for p in run]
    if sorted(ids) != sorted(id(p) for p in params) or any(not run for run in runs):
        raise ValueError(
            "the fragments' modules must hold every trainable parameter of the model exactly once (none twice, "
            "none left out, none from elsewhere, no empty fragment); pass modules that partition the model"
        )
    return runs


def check_optimizer(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], role: str, exact: bool) -> None:
    """Step 3: ``optimizer`` steps only ``params`` (and, if ``exact``, every one of them), else one line says why.

    ``role`` names it in the message (``the inner optimizer``, ``the outer optimizer of fragment 1``).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{role} must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    held = {id(p): p for group in optimizer.param_groups for p in group["params"]}
    wanted = {id(p) for p in params}
    strangers = [p for key, p in held.items() if key not in wanted]
    if strangers:
        raise ValueError(
            f"{role} holds {len(strangers)} tensor(s) that are not the model's trainable parameters it must step "
            f"(the first of shape {list(strangers[0].shape)}): build it over those parameters "
            "(model.parameters(), or the fragment's)"
        )
    missing = [p for p in params if id(p) not in held]
    if exact and missing:
        raise ValueError(
            f"{role} misses {len(missing)} of the trainable parameters it must step (the first of shape "
            f"{list(missing[0].shape)}): they would be reset to the synced weights at every sync and never move; "
            "build it over model.parameters() (or the fragment's)"
        )


def outer_per_fragment(outer, fragments: list[list[nn.Parameter]]) -> list[torch.optim.Optimizer]:
    """Step 3: DiLoCo's outer optimizer for each fragment: the one given for all, or one each (torchft's form)."""
    if not isinstance(outer, (list, tuple)):
        check_optimizer(outer, [p for f in fragments for p in f], "the outer optimizer", exact=True)
        check_not_sharded(outer)
        return [outer] * len(fragments)
    if len(outer) != len(fragments):
        raise ValueError(
            f"{len(outer)} outer optimizers for {len(fragments)} fragments: give one per fragment, "
            "or one over the whole model"
        )
    for i, (optimizer, params) in enumerate(zip(outer, fragments)):
        check_optimizer(optimizer, params, f"the outer optimizer of fragment {i}", exact=True)
    check_not_sharded(*outer)
    return list(outer)


def check_not_sharded(*objects) -> None:
    """Step 3: refuse a model (or a submodule) or optimizer that shards the weights across ranks."""
    for obj in objects:
        for part in obj.modules() if isinstance(obj, nn.Module) else [obj]:
            kind = type(part)
            if kind.__module__.startswith(SHARDED_MODULES):
                raise ValueError(
                    f"{kind.__name__} shards the weights across ranks, but local SGD and DiLoCo keep the whole model "
                    "on every replica and average it: give the plain model and optimizer (a replica may be DDP)"
                )
