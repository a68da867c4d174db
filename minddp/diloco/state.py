"""What DiLoCo adds to a checkpoint, and how it is put back: resumed bit for bit, a fragment in flight included.

torchft's users lost two of these in their checkpoints (a replica that resumed, or joined, had a loss
bump): the synced weights the next pseudo-gradient is measured from, and the outer optimizer's
momentum. A third is DiLoCo's own: with a delay τ a fragment may be in flight when the checkpoint is
taken; its message is waited for and the *averaged* pseudo-gradient saved, so the resumed run applies
the same average at the same step without sending anything again.

Keys: ``steps``, ``syncs``, ``sent_bytes`` (:class:`~minddp.diloco.local_sgd.LocalSGD`'s), ``synced``
(parameter name -> tensor), ``outer`` (the outer optimizers' ``state_dict()``, each once, in fragment
order), ``in_flight`` (``None`` or ``{"fragment": k, "average": tensor}``). Plain tensors and numbers:
``torch.load(..., weights_only=True)`` reads them.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import DiLoCo
    >>> model = torch.nn.Linear(4, 2)
    >>> inner = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> diloco = DiLoCo(model, inner, None, sync_every=2)
    >>> sorted(diloco.state_dict())
    ['in_flight', 'outer', 'sent_bytes', 'steps', 'synced', 'syncs']
    >>> sorted(diloco.state_dict()["synced"])
    ['bias', 'weight']
"""

from __future__ import annotations

import torch


def saved(diloco, counts: dict) -> dict:
    """``counts`` (LocalSGD's state) with the synced weights, the outer optimizers' state and a fragment in flight."""
    names = {p: n for n, p in diloco.module.named_parameters()}
    in_flight = None
    if diloco.in_flight is not None:  # waited for: the average is what the resumed run applies
        fragment, future = diloco.in_flight
        in_flight = {"fragment": fragment, "average": future.wait().clone()}
        diloco.in_flight = (fragment, done(in_flight["average"]))
    synced = {names[p]: s.clone() for ps, ss in zip(diloco.fragments, diloco.synced) for p, s in zip(ps, ss)}
    return {
        **counts,
        "synced": synced,
        "outer": [o.state_dict() for o in distinct(diloco.outer)],
        "in_flight": in_flight,
    }


def load(diloco, state: dict) -> None:
    """Put ``state`` (from :func:`saved`, on a DiLoCo of the same model and fragments) back into ``diloco``."""
    names = {p: n for n, p in diloco.module.named_parameters()}
    wanted = {names[p] for params in diloco.fragments for p in params}
    if set(state["synced"]) != wanted:
        raise ValueError(
            f"this state is of another model: its synced weights differ from the model's at "
            f"{sorted(set(state['synced']) ^ wanted)[:3]}; load a state saved from the same model"
        )
    outers = distinct(diloco.outer)
    if len(outers) != len(state["outer"]):
        raise ValueError(
            f"this state holds {len(state['outer'])} outer optimizer(s), this DiLoCo {len(outers)}: "
            "build it with the outer optimizers the state was saved with"
        )
    for params, synced in zip(diloco.fragments, diloco.synced):
        for p, s in zip(params, synced):
            s.copy_(state["synced"][names[p]])
    for optimizer, saved_state in zip(outers, state["outer"]):
        optimizer.load_state_dict(saved_state)
    flight = state["in_flight"]
    diloco.in_flight = None if flight is None else (flight["fragment"], done(flight["average"].clone()))


def distinct(optimizers: list) -> list:
    """Each optimizer once, in order (one outer optimizer may serve every fragment)."""
    return list({id(o): o for o in optimizers}.values())


def done(value) -> torch.futures.Future:
    """A Future that already holds ``value``."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(value)
    return future
