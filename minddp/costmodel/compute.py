"""A stage's step built from compute timings alone: for bucket caps never run, and for clusters never seen.

A profiled step (:mod:`minddp.costmodel.trace`) answers only for the stage, cap and rank count it was
taken at; for "what if the cap were 1 MiB?" or "what at 512 GPUs?" the model builds the step from a
:class:`ComputeProfile`: what one micro-batch costs without communication, and when in its backward
each gradient is ready. It is **measured** (:func:`probe`: the bare model's forward/backward with a
hook per parameter, the optimizer step, the host's cost per message and per byte, the real network's
all_reduce at two sizes) or **given** (:func:`from_throughput`: parameters and a compute speed), and
:func:`synthesize` **builds** the step by the stage's rules (every stage but ``fsdp``, whose units a
compute profile does not know). docs/scaling.md, "a compute profile", lists the rules stage by stage.

Example::

    >>> from minddp.costmodel.step import predict
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    >>> cp = probe(model, [torch.ones(4, 64)], lambda m, b: m(b).sum())   # on every rank: 2 small all_reduces
    >>> cp.nbytes                                        # each gradient's bytes, as the buckets see them
    [16384, 256, 512, 8]
    >>> predict(synthesize(cp, "bucket-async", bucket_cap_mb=1.0, world=4), "1gbit").step > 0
    True
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from minddp.costmodel.step import WAITS, Message, StepProfile
from minddp.stages.bucket_plan import bucket_caps, plan_buckets

MB = 1024 * 1024
#: The stages that send one message per gradient: no buckets, so no cap.
PER_GRADIENT = ("simple", "ga", "hook", "hook-async")


@dataclass
class ComputeProfile:
    """One micro-batch's compute, and when each gradient is ready (seconds; module doc)."""

    nbytes: list[int]  # per trainable parameter, registration order
    forward: float
    backward: float
    ready: list[float]  # per parameter: seconds after backward began
    optimizer: float = 0.0
    micro_batches: int = 1
    per_message: float = 0.0  # host time to hand one message to the comm layer
    per_byte: float = 0.0  # host time per byte flattened into a bucket (and as much to copy back)
    real_a: float = 0.0  # the real network's all_reduce: a + b * bytes (0: a real cluster)
    real_b: float = 0.0
    names: list[str] = field(default_factory=list)
    used: list[float] = field(default_factory=list)  # per parameter: seconds after forward began that its first
    # module starts (empty: in registration order, by bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes)

    def real(self, nbytes: int) -> float:
        return self.real_a + self.real_b * nbytes

    def used_at(self) -> list[float]:
        """When the forward first needs each parameter: measured, or spread over it in registration order."""
        if self.used:
            return self.used
        total, before, out = max(1, self.total_bytes), 0, []
        for nbytes in self.nbytes:
            out.append(self.forward * before / total)
            before += nbytes
        return out

    def ready_order(self) -> list[int]:
        """Parameter indices in the order their gradients became ready."""
        return sorted(range(len(self.ready)), key=lambda i: (self.ready[i], -i))


def plan_for(
    cp: ComputeProfile, stage: str, bucket_cap_mb: float | None, first_bucket_mb: float | None = None
) -> list[list[int]]:
    """The buckets ``stage`` would form (indices into the parameters), as in :mod:`minddp.stages.bucket_plan`.

    ``bucket_cap_mb`` as the stages and torch's DDP take it (:func:`~minddp.stages.bucket_plan.bucket_caps`):
    ``None`` is torch's default (25 MiB, the first bucket 1 MiB); a cap given is every bucket's, unless
    ``first_bucket_mb`` caps the first (a what-if: torch does that only at its default, with its
    own first-bucket size, :func:`~minddp.runtime.compat.default_first_bucket_bytes`).
    """
    if stage in PER_GRADIENT:
        return [[i] for i in reversed(range(len(cp.nbytes)))]
    bucket_cap_mb, first = bucket_caps(bucket_cap_mb)
    order = list(reversed(range(len(cp.nbytes)))) if stage in ("bucket", "bucket-async", "zero2") else cp.ready_order()
    sized = [_Sized(cp.nbytes[i]) for i in order]  # plan_buckets reads numel and element_size: bytes
    plan = plan_buckets(list(reversed(sized)), bucket_cap_mb, first if first_bucket_mb is None else first_bucket_mb)
    backwards = list(reversed(order))
    return [[backwards[j] for j in bucket] for bucket in plan]


class _Sized:
    """A stand-in parameter of ``nbytes`` bytes for :func:`plan_buckets` (same dtype and device for all)."""

    dtype, device = torch.float32, torch.device("cpu")

    def __init__(self, nbytes: int):
        self._bytes = nbytes

    def numel(self) -> int:
        return self._bytes

    def element_size(self) -> int:
        return 1


def zero1_gather_plan(cp: ComputeProfile) -> list[list[int]]:
    """``zero1``'s all-gather buckets: the parameters in registration order, 25 MiB a bucket."""
    from minddp.sharding.zero1 import BUCKET_CAP_MB

    return plan_buckets([_Sized(n) for n in cp.nbytes], BUCKET_CAP_MB)


def synthesize(
    cp: ComputeProfile, stage: str, bucket_cap_mb: float | None, world: int, first_bucket_mb: float | None = None
) -> StepProfile:
    """The step ``stage`` would take with these compute timings (module doc; the caps as :func:`plan_for`'s)."""
    if stage not in WAITS:
        raise ValueError(
            f"the model builds the stages {', '.join(WAITS)}; got {stage!r}"
            + (" (fsdp is read from a profiled step: python -m minddp.model predict)" if stage == "fsdp" else "")
        )
    plan = plan_for(cp, stage, bucket_cap_mb, first_bucket_mb)
    bytes_of = [sum(cp.nbytes[i] for i in bucket) for bucket in plan]
    bucketed = stage not in PER_GRADIENT
    gradients = "reduce_scatter" if stage == "zero2" else "all_reduce"
    messages: list[Message] = []
    t = 0.0

    def send(at: float, nbytes: int, kind: str = gradients, flatten: int | None = None) -> float:
        """Hand one message over at ``at``; returns when the training thread is free again."""
        cost = cp.per_message + (cp.per_byte * (nbytes if flatten is None else flatten) if bucketed else 0.0)
        messages.append(Message(at=at + cost, wait_at=at + cost, nbytes=nbytes, kind=kind, real=cp.real(nbytes)))
        return at + cost

    if stage == "zero2":  # this step's forward gathers what the last optimizer step changed
        used = cp.used_at()
        for bucket, nbytes in reversed(list(zip(plan, bytes_of))):  # the last bucket holds the first layers
            t = send(t, nbytes, "all_gather", flatten=nbytes // world)
        t += cp.per_byte * cp.total_bytes  # each copied into the full parameters (counted before the forward)
        for m, bucket in zip(messages, reversed(plan)):
            m.wait_at = max(m.at, t + min(used[i] for i in bucket))
    for micro in range(cp.micro_batches):
        last = micro == cp.micro_batches - 1
        t += cp.forward
        if stage in ("simple", "ga"):
            t += cp.backward
            if stage == "simple" or last:
                for nbytes in bytes_of:
                    t = send(t, nbytes)
                    t += cp.per_byte * nbytes  # write back
            continue
        if not last:
            t += cp.backward
            continue
        start, delay, first = t, 0.0, len(messages)
        for bucket, nbytes in sorted(zip(plan, bytes_of), key=lambda b: max(cp.ready[i] for i in b[0])):
            ready = start + max(cp.ready[i] for i in bucket) + delay
            delay = send(ready, nbytes) - start - max(cp.ready[i] for i in bucket)
        t = start + cp.backward + delay
        if WAITS[stage] == "later":
            for m in messages[first:]:
                m.wait_at = t
        t += cp.per_byte * cp.total_bytes / (world if stage == "zero2" else 1)  # write back (zero2: a shard)
    t += cp.optimizer / (world if stage in ("zero1", "zero2") else 1)  # sharded: each rank steps 1/world
    if stage == "zero1":  # then gathers everyone's, and waits for all
        first = len(messages)
        for bucket in zero1_gather_plan(cp):
            nbytes = sum(cp.nbytes[i] for i in bucket)
            t = send(t, nbytes, "all_gather", flatten=nbytes // world)
        for m in messages[first:]:
            m.wait_at = t
        t += cp.per_byte * cp.total_bytes * (world - 1) / world  # the others' parts copied in
    return StepProfile(
        stage, world, t, messages, 0.0, f"synthesized ({stage}, cap {bucket_cap_mb}, first {first_bucket_mb})"
    )


# -- measured ---------------------------------------------------------------------------------------------


def probe(
    model: torch.nn.Module, micro_batches: list, loss_fn, repeats: int = 3, measure_network: bool = True
) -> ComputeProfile:
    """Time the bare model (module doc). Collective when ``measure_network``: every rank must call it."""
    params = [p for p in model.parameters() if p.requires_grad]
    stamps: dict[int, float] = {}

    def note(i: int):
        def ready(_) -> None:
            stamps.setdefault(i, time.perf_counter())

        return ready

    handles = [p.register_post_accumulate_grad_hook(note(i)) for i, p in enumerate(params)]
    index = {id(p): i for i, p in enumerate(params)}
    starts: dict[int, float] = {}

    def starting(owned: list[int]):
        def pre(module, args) -> None:
            now = time.perf_counter()
            for i in owned:
                starts.setdefault(i, now)

        return pre

    for module in model.modules():  # when the forward first reaches each parameter's module
        owned = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
        if owned:
            handles.append(module.register_forward_pre_hook(starting(owned)))
    forwards, backwards, readies, uses = [], [], [], []
    try:
        for _ in range(repeats + 1):  # the first round warms up
            for batch in micro_batches:
                stamps.clear()
                starts.clear()
                t0 = time.perf_counter()
                loss = loss_fn(model, batch) / len(micro_batches)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                forwards.append(t1 - t0)
                backwards.append(t2 - t1)
                readies.append([stamps.get(i, t2) - t1 for i in range(len(params))])
                uses.append([starts.get(i, t1) - t0 for i in range(len(params))])
    finally:
        for h in handles:
            h.remove()
    skip = len(micro_batches)
    ready = [statistics.median(r[i] for r in readies[skip:]) for i in range(len(params))]
    used = [statistics.median(u[i] for u in uses[skip:]) for i in range(len(params))]
    grads = [p.grad for p in params]
    per_byte = _copy_cost(grads)
    optimizer = _optimizer_cost(params)
    model.zero_grad(set_to_none=True)
    cp = ComputeProfile(
        nbytes=[p.numel() * p.element_size() for p in params],
        forward=statistics.median(forwards[skip:]),
        backward=statistics.median(backwards[skip:]),
        ready=ready,
        optimizer=optimizer,
        micro_batches=len(micro_batches),
        per_byte=per_byte,
        names=[n for n, p in model.named_parameters() if p.requires_grad],
        used=used,
    )
    if measure_network:
        cp.per_message, cp.real_a, cp.real_b = _network_cost()
    return cp


def _copy_cost(grads: list) -> float:
    """Seconds per byte to flatten the gradients into one buffer (torch.cat)."""
    grads = [g for g in grads if g is not None]
    if not grads:
        return 0.0
    nbytes = sum(g.numel() * g.element_size() for g in grads)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.cat([g.reshape(-1) for g in grads])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / nbytes


def _optimizer_cost(params: list) -> float:
    """One AdamW step and zero_grad, timed on a copy of the parameters (the model's are left alone)."""
    if sum(p.numel() * p.element_size() for p in params) > 256 * MB:
        return 0.0  # too big to copy for a probe: leave it out
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for twin, p in zip(twins, params):
        twin.grad = torch.zeros_like(twin) if p.grad is None else p.grad.detach().clone()
    optimizer = torch.optim.AdamW(twins, lr=1e-3)
    times = []
    for _ in range(3):
        grads = [t.grad for t in twins]
        t0 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        for twin, g in zip(twins, grads):
            twin.grad = g
    return statistics.median(times[1:])


def _network_cost() -> tuple[float, float, float]:
    """(host seconds to hand a message over, a, b) with the real all_reduce taking a + b·bytes. Collective."""
    import torch.distributed as dist

    from minddp.comm.default_hooks import allreduce_hook
    from minddp.comm.grad_bucket import GradBucket
    from minddp.comm.link import Link
    from minddp.comm.wire import Wire
    from minddp.runtime.device import current_device, message_device

    link = Link("loopback")  # the same code path as a run with a link (its thread, its futures)
    wire = Wire(None, link=link)
    launch, sizes, medians = [], [1024, 1 << 20], []
    for nbytes in sizes:
        times = []
        for i in range(6):
            dist.barrier()
            t0 = time.perf_counter()
            fut = allreduce_hook(
                wire, GradBucket(0, torch.ones(nbytes // 4, device=current_device()), [], is_last=True)
            )
            t1 = time.perf_counter()
            fut.wait()
            if i:
                times.append(time.perf_counter() - t0)
                launch.append(t1 - t0)
        medians.append(statistics.median(times))
    link.close()
    measured = torch.tensor([statistics.median(launch), *medians], dtype=torch.float64, device=message_device())
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)  # every rank ends with the same numbers
    per_message, small, large = measured.tolist()
    b = max(0.0, (large - small) / (sizes[1] - sizes[0]))
    return per_message, max(0.0, small - b * sizes[0]), b


# -- given --------------------------------------------------------------------------------------------------


def from_throughput(
    nbytes: list[int],
    params_count: int,
    tokens_per_micro_batch: int,
    flops_per_second: float,
    micro_batches: int,
    optimizer_s: float = 0.0,
    backward_share: float = 2 / 3,
    per_message: float = 0.0,
) -> ComputeProfile:
    """A ComputeProfile from a model's size and a compute speed (module doc, "given").

    A transformer's training step costs about ``6 · parameters · tokens`` FLOPs
    (2 forward, 4 backward); ``backward_share`` of it is backward. Gradients are
    ready in reverse registration order, each after the backward work of
    everything after it (in proportion to bytes).
    """
    micro = 6.0 * params_count * tokens_per_micro_batch / flops_per_second
    forward, backward = micro * (1 - backward_share), micro * backward_share
    total, ready, done = sum(nbytes), [0.0] * len(nbytes), 0
    for i in reversed(range(len(nbytes))):
        done += nbytes[i]
        ready[i] = backward * done / total
    return ComputeProfile(
        nbytes=list(nbytes),
        forward=forward,
        backward=backward,
        ready=ready,
        optimizer=optimizer_s,
        micro_batches=micro_batches,
        per_message=per_message,
    )


__all__ = [
    "PER_GRADIENT",
    "ComputeProfile",
    "plan_for",
    "zero1_gather_plan",
    "synthesize",
    "probe",
    "from_throughput",
    "MB",
]
