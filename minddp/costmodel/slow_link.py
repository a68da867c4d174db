"""The step-time model for the slow-link rungs: H inner steps as one profile, and what a step costs on a link.

DDP sends every gradient every step; ``local-sgd`` and ``diloco`` send the model (or one fragment of it)
once per sync. The model (:mod:`minddp.costmodel.step`) replays a profile with the waiting taken out; for
these rungs the profile is one **period** of ``sync_every`` inner steps (:func:`period`):

1. **compute**: H times one inner step without communication (the micro-batches' forward and backward,
   the optimizer step: a :class:`~minddp.costmodel.compute.ComputeProfile`'s);
2. **messages**: each fragment's bytes (:func:`fragment_bytes`: the split :class:`minddp.DiLoCo` makes),
   handed over at the inner step its schedule sends it (τ steps before its turn ends) and waited for at
   the end of its turn, as :class:`~minddp.DiLoCo` does; one fragment, no delay: the whole model, sent
   and waited for right after the H-th step.

:func:`per_step` replays it on a link and divides by H: the time per inner step, and the **compute
utilisation** as Streaming DiLoCo (arXiv 2501.18512) reports it: the share of the time the replica
computes (1 when every message is hidden). :func:`ddp_step` is the same for DDP (the ``ddp`` stage's
buckets, :func:`~minddp.costmodel.compute.synthesize`). docs/benchmarks.md (*Slow links*) sets them
beside measured step times; ``notebooks/10_diloco.py`` finds the link where DDP stops being usable.

Example::

    >>> from minddp.costmodel.compute import from_throughput
    >>> cp = from_throughput([4_000_000], 1_000_000, 512, 1e12, micro_batches=1)  # 1 M parameters, 3 ms a step
    >>> ddp, diloco = ddp_step(cp, "home", world=2), per_step(cp, "home", sync_every=100, world=2)
    >>> round(ddp["utilisation"], 3), round(diloco["utilisation"], 2)   # 4 MB over 20 Mbit/s every step, or 1 in 100
    (0.002, 0.16)
"""

from __future__ import annotations

from minddp.costmodel.compute import ComputeProfile, synthesize
from minddp.costmodel.step import Message, StepProfile, predict


def inner_step_seconds(cp: ComputeProfile) -> float:
    """One inner step without communication: every micro-batch's forward and backward, then the optimizer."""
    return cp.micro_batches * (cp.forward + cp.backward) + cp.optimizer


def fragment_bytes(model, fragments: int) -> list[int]:
    """The bytes of each fragment :class:`minddp.DiLoCo` cuts ``model`` into (its trainable parameters' split)."""
    from minddp.diloco.fragments import split_fragments

    return [sum(p.numel() * p.element_size() for p in run) for run in split_fragments(model, fragments)]


def period(
    cp: ComputeProfile,
    sync_every: int,
    fragments: list[int] | None = None,
    delay: int = 0,
    world: int = 2,
    stage: str = "diloco",
) -> StepProfile:
    """Steps 1-2: one period of ``sync_every`` inner steps; ``fragments``: each fragment's bytes (default: the
    whole model, ``cp.total_bytes``, as one)."""
    sizes = list(fragments or [cp.total_bytes])
    step = inner_step_seconds(cp)
    turn = sync_every // len(sizes)
    messages = [
        Message(at=((k + 1) * turn - delay) * step, wait_at=(k + 1) * turn * step, nbytes=nbytes)
        for k, nbytes in enumerate(sizes)
    ]
    return StepProfile(
        stage, world, sync_every * step, messages, 0.0, f"{stage}: H={sync_every}, {len(sizes)} fragments"
    )


def _row(prediction, steps: int) -> dict:
    return {
        "step_s": prediction.step / steps,
        "compute_s": prediction.compute / steps,
        "exposed_s": prediction.exposed / steps,
        "utilisation": prediction.compute / prediction.step if prediction.step > 0 else 1.0,
    }


def per_step(
    cp: ComputeProfile,
    link,
    sync_every: int,
    fragments: list[int] | None = None,
    delay: int = 0,
    world: int = 2,
) -> dict:
    """A period (:func:`period`) replayed on ``link``, per inner step: ``step_s``, ``compute_s``, ``exposed_s``
    and ``utilisation`` (compute over step)."""
    return _row(predict(period(cp, sync_every, fragments, delay, world), link), sync_every)


def ddp_step(cp: ComputeProfile, link, world: int = 2, bucket_cap_mb: float = 25.0) -> dict:
    """DDP's step (the ``ddp`` stage's buckets) on ``link``, as :func:`per_step` reports a slow-link rung's."""
    return _row(predict(synthesize(cp, "ddp", bucket_cap_mb, world), link), 1)
