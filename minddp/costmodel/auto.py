"""``--bucket-cap-mb auto``: the cap the step-time model predicts fastest, chosen at the start of a run.

Small buckets hide behind the rest of backward but each pays the per-message cost; large ones pay it
rarely but leave the last bucket's transfer exposed. Where the balance lies depends on the model, the
ranks and the link, so it is measured (docs/scaling.md, "Bucket cap: what-if, and
``--bucket-cap-mb auto``", says why the rule is what it is):

1. **probe** the bare model on this run's first micro-batches (:func:`~minddp.costmodel.compute.probe`;
   every rank takes part);
2. **predict** the stage's step for each cap in :data:`CANDIDATES` (plus "one bucket") on the run's
   link (without ``--link``: this machine's network, as probed);
3. **choose** the fastest plan; among plans within :data:`NEAR` (3 %) of it, the one with the fewest
   buckets, named by the smallest cap that gives it; rank 0's choice is broadcast;
4. **say** which cap, its buckets, its predicted step, and the caps either side, on one line.

Example::

    >>> from minddp.costmodel.compute import ComputeProfile
    >>> cp = ComputeProfile(nbytes=[4_000_000] * 4, forward=0.010, backward=0.030,  # 4 gradients of 4 MB,
    ...                     ready=[0.030, 0.0225, 0.015, 0.0075])                   # ready through backward
    >>> choice = best_cap(cp, "bucket-async", world=8, link="1gbit")
    >>> choice.cap_mb, choice.buckets
    (5.0, 2)
    >>> print(choice.explain())
    --bucket-cap-mb auto: 5 MiB (2 buckets) for bucket-async on 8 ranks over 1gbit: predicted 250.4 ms/step, ...
    >>> from minddp.comm.link import Link                         # on every rank of a run (here, one):
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    >>> batches = iter([[{"x": torch.ones(4, 64)}]])              # 17 KB of gradients: one bucket at any cap
    >>> cap, why = choose_bucket_cap(model, "bucket-async", batches, lambda m, b: m(b["x"]).sum(),
    ...                              Link("1gbit"), torch.device("cpu"), say=print)
    --bucket-cap-mb auto: 0.025 MiB (1 bucket) for bucket-async on 1 ranks over 1gbit: predicted ... ms/step, ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from minddp.costmodel.compute import PER_GRADIENT, ComputeProfile, plan_for, probe, synthesize
from minddp.costmodel.step import WAITS, predict

#: Plans predicted within this share of the fastest count as tied (step 3).
NEAR = 0.03
#: Caps tried (MiB), log-spaced over what torch users set; plus ``None`` (one bucket).
CANDIDATES = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0]
#: Stages whose step depends on the cap (``zero1``: its gradients' buckets, ``ddp``'s; ``zero2``: its
#: reduce-scatters' and all-gathers').
BUCKETED = tuple(s for s in WAITS if s not in PER_GRADIENT)
#: Why a stage that is not bucketed ignores the cap.
UNUSED = {"fsdp": "stage fsdp sends one all-gather and one reduce-scatter per unit (a transformer block)"}


@dataclass
class CapChoice:
    cap_mb: float
    buckets: int
    predicted: dict  # cap -> (buckets, predicted step seconds)
    stage: str
    world: int
    link: str

    def explain(self) -> str:
        best = self.predicted[self.cap_mb][1]
        others = ", ".join(
            f"{c:g} MiB: {b} bucket{'s' if b > 1 else ''}, {1e3 * t:.1f}"
            for c, (b, t) in self.predicted.items()
            if c != self.cap_mb
        )
        return (
            f"--bucket-cap-mb auto: {self.cap_mb:g} MiB ({self.buckets} bucket{'s' if self.buckets > 1 else ''}) "
            f"for {self.stage} on {self.world} ranks over {self.link}: predicted {1e3 * best:.1f} ms/step, the "
            f"fewest buckets within {100 * NEAR:g} % of the fastest plan tried [{others or 'no other'} ms/step]; "
            "smaller caps pay the per-message cost more often, larger ones leave more of the last bucket's "
            "transfer after backward (minddp.costmodel)"
        )


def best_cap(cp: ComputeProfile, stage: str, world: int, link, candidates=CANDIDATES) -> CapChoice:
    """Steps 2-3 on one compute profile (no collective)."""
    from minddp.comm.link import parse_link

    spec = parse_link(link) if link is not None else parse_link("loopback")
    plans: dict[tuple, list] = {}  # plan -> [smallest cap giving it, buckets, predicted]
    for cap in sorted(candidates):
        plan = plan_for(cp, stage, cap)
        key = tuple(map(tuple, plan))
        if key not in plans:
            plans[key] = [cap, len(plan), predict(synthesize(cp, stage, cap, world), spec).step]
    fastest = min(t for _, _, t in plans.values())
    near = [v for v in plans.values() if v[2] <= fastest * (1 + NEAR)]
    cap, buckets, _ = min(near, key=lambda v: (v[1], v[0]))  # the fewest buckets among the near-fastest
    predicted = {c: (b, t) for c, b, t in plans.values()}
    return CapChoice(cap, buckets, predicted, stage, world, spec.name)


def choose_bucket_cap(
    model: torch.nn.Module, stage: str, batches, loss_fn, link, device, say=None
) -> tuple[float | None, str]:
    """Steps 1-4 on every rank of a run; returns the cap (MiB) to build ``stage`` with, and why.

    A stage that does not bucket its messages gets ``None`` and a line saying so, without a probe.
    """
    if stage not in BUCKETED:
        why = (
            f"--bucket-cap-mb auto: {UNUSED.get(stage, f'stage {stage} sends one message per gradient')}, "
            "the cap is unused"
        )
        if say:
            say(why)
        return None, why
    micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
    cp = probe(model, micro, loss_fn)  # step 1
    box = [best_cap(cp, stage, dist.get_world_size(), None if link is None else link.spec)]  # steps 2-3
    dist.broadcast_object_list(box, src=0)
    choice, why = box[0], box[0].explain()
    if say:
        say(why)  # step 4
    return choice.cap_mb, why


__all__ = ["NEAR", "CANDIDATES", "BUCKETED", "UNUSED", "CapChoice", "best_cap", "choose_bucket_cap"]
