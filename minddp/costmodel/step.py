"""One training step as the model sees it, and what it becomes on another network.

**The profile** (:class:`StepProfile`): one step of a stage with every moment the training thread
waited for the network taken out (its *compute time*), and on that clock each message's hand-over
``at``, first need ``wait_at`` (the same moment for a stage that waits right away, later for one that
keeps going), ``nbytes``, ``kind``, and ``real``, the real collective's time (the floor under any
emulated link). **The prediction** (:func:`predict`) replays it on a link, event by event, with one
clock for the training thread and one for the NIC:

1. a *send* at compute time ``at`` happens at wall time ``at + shift`` (the waiting so far); the NIC
   carries it when free for the link's modeled time; it is done when that and the real collective
   have ended, plus ``late`` (the emulation's delivery delay; 0 for a real network);
2. a *wait* at ``wait_at`` on a message not yet done stands still until it is: ``shift`` grows;
3. the step takes ``compute + shift``.

The same replay gives the exposed time (the waiting it added: the step against the same stage on a free
link), the time on the link, the overlap and the non-compute and communication shares, each by its function
in :mod:`minddp.analysis.metrics`, with the replay's compute everything but its waits; docs/scaling.md,
section 3, defines them and says what the replay leaves out.

Example::

    >>> p = StepProfile("bucket-async", world=2, compute=0.040,
    ...                 messages=[Message(at=0.030, wait_at=0.038, nbytes=400_000)])
    >>> predict(p, "1gbit").step        # 0.4 MB take 3.3 ms over 1 Gbit/s: hidden by the 8 ms of compute
    0.04
    >>> late = StepProfile("bucket-async", world=2, compute=0.040,
    ...                    messages=[Message(at=0.038, wait_at=0.039, nbytes=400_000)])
    >>> round(predict(late, "1gbit").exposed, 4)       # sent 1 ms before it is needed: 2.3 ms exposed
    0.0023
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minddp.analysis import metrics
from minddp.comm.link import LinkSpec, parse_link

#: The stages the model builds from a compute profile (:func:`minddp.costmodel.compute.synthesize`: the bucket
#: what-if, ``auto``, the projections), and how each waits for its gradients' messages: "now" (right after
#: sending) or "later" (a wait point after backward).
WAITS = {
    "simple": "now",
    "ga": "now",
    "hook": "now",
    "bucket": "now",
    "hook-async": "later",
    "bucket-async": "later",
    "ddp": "later",
    "torch": "later",
    "zero1": "later",
    "zero2": "later",
}

#: Stages the model reads from a profiled step (:mod:`minddp.costmodel.trace`): those, and ``fsdp``, whose
#: messages follow its units; a sharded stage's trace shows where each of its messages was waited for.
TRACED_WAITS = {**WAITS, "fsdp": "later"}


@dataclass
class Message:
    """One collective of a step, on the compute clock (module doc)."""

    at: float
    wait_at: float
    nbytes: int
    kind: str = "all_reduce"
    real: float = 0.0


@dataclass
class StepProfile:
    """A step with the waiting taken out: ``compute`` seconds, and the messages sent along the way."""

    stage: str
    world: int
    compute: float
    messages: list[Message] = field(default_factory=list)
    late: float = 0.0  # each delivery's delay beyond its modeled end (emulation only)
    source: str = ""

    def with_world(self, world: int) -> "StepProfile":
        """The same step on ``world`` ranks (same per-rank work: data parallelism's weak scaling)."""
        return replace(self, world=world)

    def on_real_network(self) -> "StepProfile":
        """Drop what belongs to the profiled machine's own network: the real collectives and the emulation's delay."""
        return replace(self, messages=[replace(m, real=0.0) for m in self.messages], late=0.0)

    def scaled(self, factor: float) -> "StepProfile":
        """Every compute time times ``factor`` (e.g. to remove the profiler's own overhead)."""
        return replace(
            self,
            compute=self.compute * factor,
            messages=[replace(m, at=m.at * factor, wait_at=m.wait_at * factor) for m in self.messages],
        )


@dataclass
class Prediction:
    """What :func:`predict` says about one step (seconds), and the replayed timeline."""

    step: float
    compute: float
    exposed: float
    comm: float
    waits: list[tuple[float, float]]
    transfers: list[tuple[float, float]]

    def _compute(self) -> list[tuple[float, float]]:
        """The replay's compute: every moment from its first to its last event that is not a wait."""
        ends = [e for _, e in self.transfers]
        return metrics.subtract([(0.0, max([self.step, *ends]))], self.waits)

    @property
    def overlap_pct(self) -> float:
        """*Overlap*: the share of the transfers' time during which the replay computed (did not wait)."""
        return metrics.overlap_pct(self.transfers, self._compute())

    @property
    def comm_share_pct(self) -> float:
        return 100.0 * self.comm / self.step if self.step > 0 else 0.0

    @property
    def non_compute_pct(self) -> float:
        """The blog's *non-compute* share: transfers while nothing computed, over the step; in the replay, where
        every moment that is not a wait computes, it is the exposed time over the step."""
        window = [(0.0, self.step)]
        return 100.0 * metrics.non_compute(window, self._compute(), self.transfers) / self.step if self.step else 0.0

    def row(self) -> dict:
        return {
            "step_ms": 1e3 * self.step,
            "compute_ms": 1e3 * self.compute,
            "exposed_ms": 1e3 * self.exposed,
            "comm_ms": 1e3 * self.comm,
            "overlap_pct": self.overlap_pct,
            "comm_share_pct": self.comm_share_pct,
            "non_compute_pct": self.non_compute_pct,
        }


def predict(profile: StepProfile, link: LinkSpec | str, world: int | None = None) -> Prediction:
    """Steps 1-3 of the module doc: ``profile`` replayed on ``link`` (at ``world`` ranks, default the profile's)."""
    spec = parse_link(link)
    n = profile.world if world is None else world
    events = sorted(
        [(m.at, 0, i) for i, m in enumerate(profile.messages)]
        + [(max(m.wait_at, m.at), 1, i) for i, m in enumerate(profile.messages)]
    )  # never before its send
    shift, nic_free = 0.0, float("-inf")
    done: dict[int, float] = {}
    waits, transfers = [], []
    for t, is_wait, i in events:
        now = t + shift
        m = profile.messages[i]
        if not is_wait:  # step 1
            start = max(now, nic_free)
            nic_free = start + spec.seconds(m.kind, m.nbytes, n)
            done[i] = max(nic_free, now + m.real) + profile.late
            transfers.append((start, done[i]))
        elif done[i] > now:  # step 2
            waits.append((now, done[i]))
            shift += done[i] - now
    return Prediction(
        step=profile.compute + shift,
        compute=profile.compute,
        exposed=shift,  # step 3
        comm=metrics.in_flight(transfers),
        waits=waits,
        transfers=transfers,
    )


__all__ = ["WAITS", "TRACED_WAITS", "Message", "StepProfile", "Prediction", "predict"]
