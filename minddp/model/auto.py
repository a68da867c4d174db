"""``--bucket-cap-mb auto``: the cap the step-time model predicts fastest, chosen at the start of a run.

A bucket cap trades two costs. Small buckets leave early, so most of the
communication hides behind the rest of backward, but every bucket pays the
link's per-message cost (``2(N−1)·α`` for a ring all_reduce) and the host's
(the hook, the launch). Large buckets pay those few times, but the last one
is only ready at the very end of backward, and all of its transfer is
exposed. Where the balance lies depends on the model (how big its gradients
are and when they become ready), the number of ranks and the link, so it is
measured rather than guessed:

1. **probe** (:func:`~minddp.model.compute.probe`): a few forward/backward
   passes of the bare model on this run's first micro-batches, timing when
   each gradient is ready; the host's cost per message and per byte; the
   real network's all_reduce (every rank takes part);
2. **predict** the stage's step for caps from 0.025 to 100 MiB
   (:data:`CANDIDATES`, plus "one bucket"), each as the plan it gives
   (:func:`~minddp.model.compute.synthesize`, :func:`~minddp.model.step.predict`)
   on the run's link (without ``--link``: this machine's network, as probed);
3. **choose** the fastest plan; among plans within 0.5 % of it, the one
   with the fewest buckets (less host work the model may miss), named by the
   smallest cap that gives it; rank 0's choice is broadcast, so every rank
   builds the same buckets;
4. **say** which cap, its buckets, its predicted step, and the caps either
   side, on one line.

Example::

    >>> cap, why = choose_bucket_cap(model, "bucket-async", batches, loss_fn, Link("1gbit"), device, say=print)
    --bucket-cap-mb auto: 0.25 MiB (2 buckets) for bucket-async on 2 ranks over 1gbit: ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from minddp.model.compute import ComputeProfile, plan_for, probe, synthesize
from minddp.model.step import predict

#: Caps tried (MiB), log-spaced over what torch users set; plus ``None`` (one bucket).
CANDIDATES = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0]
#: Stages whose step depends on the cap.
BUCKETED = ("bucket", "bucket-async", "ddp", "torch")


@dataclass
class CapChoice:
    cap_mb: float
    buckets: int
    predicted: dict            # cap -> (buckets, predicted step seconds)
    stage: str
    world: int
    link: str

    def explain(self) -> str:
        best = self.predicted[self.cap_mb][1]
        others = ", ".join(f"{c:g} MiB: {b} bucket{'s' if b > 1 else ''}, {1e3 * t:.1f}"
                           for c, (b, t) in self.predicted.items() if c != self.cap_mb)
        return (f"--bucket-cap-mb auto: {self.cap_mb:g} MiB ({self.buckets} bucket{'s' if self.buckets > 1 else ''}) "
                f"for {self.stage} on {self.world} ranks over {self.link}: predicted {1e3 * best:.1f} ms/step, the "
                f"fastest of the bucket plans tried [{others or 'no other'} ms/step]; smaller caps pay the per-message "
                "cost more often, larger ones leave more of the last bucket's transfer after backward (minddp.model)")


def best_cap(cp: ComputeProfile, stage: str, world: int, link, candidates=CANDIDATES) -> CapChoice:
    """Steps 2-3 on one compute profile (no collective)."""
    from minddp.comm.link import parse_link
    spec = parse_link(link) if link is not None else parse_link("loopback")
    plans: dict[tuple, list] = {}                     # plan -> [smallest cap giving it, buckets, predicted]
    for cap in sorted(candidates):
        plan = plan_for(cp, stage, cap)
        key = tuple(map(tuple, plan))
        if key not in plans:
            plans[key] = [cap, len(plan), predict(synthesize(cp, stage, cap, world), spec).step]
    fastest = min(t for _, _, t in plans.values())
    near = [v for v in plans.values() if v[2] <= fastest * 1.005]
    cap, buckets, _ = min(near, key=lambda v: (v[1], v[0]))    # the fewest buckets among the near-fastest
    predicted = {c: (b, t) for c, b, t in plans.values()}
    return CapChoice(cap, buckets, predicted, stage, world, spec.name)


def choose_bucket_cap(model: torch.nn.Module, stage: str, batches, loss_fn, link, device, say=None
                      ) -> tuple[float | None, str]:
    """Steps 1-4 on every rank of a run; returns the cap (MiB) to build ``stage`` with, and why."""
    micro = [{k: v.to(device) for k, v in b.items()} for b in next(batches)]
    cp = probe(model, micro, loss_fn)                                                              # step 1
    world = dist.get_world_size()
    if stage not in BUCKETED:
        why = f"--bucket-cap-mb auto: stage {stage} sends one message per gradient, the cap is unused"
    else:
        box = [best_cap(cp, stage, world, None if link is None else link.spec)]                  # steps 2-3
        dist.broadcast_object_list(box, src=0)
        choice = box[0]
        why = choice.explain()
    if say:
        say(why)                                                                                   # step 4
    return (choice.cap_mb if stage in BUCKETED else None), why


__all__ = ["CANDIDATES", "BUCKETED", "CapChoice", "best_cap", "choose_bucket_cap"]
