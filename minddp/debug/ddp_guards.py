"""The production DDP's cross-rank guards: the same settings, the same buckets, finite gradients.

The teaching stages check that ranks hold the same model and use the same
parameters (:mod:`minddp.stages.checks`). Real training scripts go wrong in
more ways, each of which would otherwise pair the wrong tensors in a
collective, hang, or train on garbage. Guards 1 to 3 raise the same one-line
finding on every rank (:func:`minddp.debug.findings.finding`; guards 1 and 2 as
a :class:`~minddp.debug.findings.CrossRankError`, a ``RuntimeError``):

1. :func:`check_same_settings`, once, just before the first bucket is sent:
   all ranks all-gather their comm hook (and its state's settings) and
   bucket sizes; a rank that differs (another ``--hook``, another
   ``bucket_cap_mb``) would sum unrelated tensors;
2. :func:`check_consistency`, every step in debug mode (``MINDDP_DEBUG=1`` or
   ``check_consistency=True``): each rank all-gathers a fingerprint of its
   bucket plan and launch order; a mismatch raises before the averaged
   gradients are written back, with a readable diff;
3. :func:`finite_check`, with ``check_finite=True`` (or
   ``MINDDP_CHECK_FINITE=1``): the *averaged* bucket is checked for NaN/Inf.
   A NaN on any rank makes the sum non-finite on every rank, so every rank
   raises at the same bucket without an extra collective, and each says
   whether its own gradient was already non-finite;
4. :func:`unfinished_reduction`, at the forward after a synced backward that
   left parameters without a gradient: which cause, and its fix (a loss that
   missed the outputs, a parameter frozen after wrapping, an unused one). Not a
   cross-rank check (this rank's own gradients): it starts with torch's words,
   which users search for.

Debug mode (``MINDDP_DEBUG=1``) turns guard 2 on and adds the checks of
:mod:`minddp.ddp.debug_reducer` and :mod:`minddp.debug.watch`.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> check_same_settings({"hook": "allreduce_hook", "bucket sizes": [1024]}, None)   # raises if ranks differ
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch
import torch.distributed as dist

from minddp.debug import collective_check, switch
from minddp.debug.findings import CrossRankError, finding
from minddp.runtime import keep


def describe_hook_state(state) -> str | None:
    """The hook state as ranks can compare it: its settings, never its memory address.

    A state class with its own ``__repr__`` (minddp's ``PowerSGDState``, a
    ``Wire``) is described by it; one without (torch's ``PowerSGDState``) by
    its type and its public scalar fields.
    """
    if state is None or isinstance(state, dist.ProcessGroup):
        return None
    cls = type(state)
    if cls.__repr__ is not object.__repr__:
        return repr(state)
    names = sorted(set(getattr(cls, "__slots__", ())) | set(getattr(state, "__dict__", {})))
    fields = [(n, getattr(state, n, None)) for n in names if not n.startswith("_")]
    shown = ", ".join(f"{n}={v!r}" for n, v in fields if isinstance(v, (bool, int, float, str, type(None))))
    return f"{cls.__name__}({shown})"


def _all_gather_object(value, group: dist.ProcessGroup) -> list:
    """Every rank's ``value``: torch's ``all_gather_object`` with its tensors kept until gloo lets go
    (:mod:`minddp.runtime.keep`), checked as that call by debug mode."""
    everyone: list = [None] * dist.get_world_size(group)
    (collective_check.checked_gather if switch.enabled() else keep.all_gather_object)(everyone, value, group=group)
    return everyone


def check_same_settings(settings: dict, group: dist.ProcessGroup) -> None:
    """Step 1: raise on every rank unless all ranks send gradients with the same settings."""
    everyone = _all_gather_object(settings, group)
    diffs = [
        f"{key}: rank {rank} has {theirs[key]!r}, rank 0 has {everyone[0][key]!r}"
        for rank, theirs in enumerate(everyone[1:], start=1)
        for key in settings
        if theirs.get(key) != everyone[0].get(key)
    ]
    if diffs:
        raise CrossRankError(
            finding(
                "ranks send gradients differently, so their all_reduces would mix unrelated tensors",
                "; ".join(diffs),
                "give every rank the same comm hook and bucket_cap_mb",
                dist.get_rank(),
            )
        )


def fingerprint(plan: list[list[int]], sizes: list[int], launched: list[int]) -> tuple:
    """A few integers per bucket: enough to tell two plans or launch orders apart."""
    return (tuple((n, zlib.crc32(repr(bucket).encode())) for bucket, n in zip(plan, sizes)), tuple(launched))


def check_consistency(
    plan: list[list[int]], sizes: list[int], launched: list[int], names: list[str], group: dist.ProcessGroup
) -> None:
    """Step 2: all_gather this step's fingerprint; raise on every rank if any rank differs from rank 0."""
    everyone = _all_gather_object(fingerprint(plan, sizes, launched), group)
    reference = everyone[0]
    diffs = []
    for rank, theirs in enumerate(everyone):
        if theirs == reference:
            continue
        (buckets0, order0), (buckets, order) = reference, theirs
        if len(buckets) != len(buckets0):
            diffs.append(f"rank {rank} has {len(buckets)} buckets, rank 0 has {len(buckets0)}")
        for b, (x0, x) in enumerate(zip(buckets0, buckets)):
            if x0 != x:
                diffs.append(
                    f"bucket {b}: rank {rank} has {x[0]} elements (checksum {x[1]}), "
                    f"rank 0 has {x0[0]} (checksum {x0[1]})"
                )
        if order != order0:
            diffs.append(f"launch order: rank {rank} {list(order)}, rank 0 {list(order0)}")
    if diffs:
        local = "; ".join(f"bucket {b}: {[names[i] for i in bucket]}" for b, bucket in enumerate(plan))
        raise CrossRankError(
            finding(
                "ranks disagree on the bucket plan or launch order, so their all_reduces would mix different gradients",
                " | ".join(diffs) + f" | this rank (rank {dist.get_rank(group)} of its group) plans {local}",
                "build the same model on every rank and register the same parameters in the same order (and do "
                "not change requires_grad on one rank only)",
                dist.get_rank(),
                "minddp consistency guard",
            )
        )


def finite_check(bucket_index: int, names: list[str], local_finite: bool, rank: int) -> Callable:
    """Step 3: a ``check(result)`` that raises if the averaged bucket holds NaN/Inf."""

    def check(tensor: torch.Tensor) -> None:
        if not bool(torch.isfinite(tensor).all()):
            here = (
                "this rank's own gradient was already non-finite before communication"
                if not local_finite
                else "this rank's own gradient was finite, so another rank sent the NaN/Inf"
            )
            raise FloatingPointError(
                finding(
                    "NaN or Inf in an averaged gradient",
                    f"the averaged gradient of bucket {bucket_index} ({', '.join(names[:4])}"
                    f"{', ...' if len(names) > 4 else ''}) contains NaN or Inf on rank {rank}; {here}",
                    "look for a diverging loss (lower the learning rate, clip gradients) or bad input on that rank",
                    rank,
                    "minddp check_finite",
                )
            )

    return check


def unfinished_reduction(missing: list[str], frozen: list[str], find_unused: bool, rank: int) -> RuntimeError:
    """Step 4: the error for parameters ``missing`` a gradient in the last synced backward, by cause.

    ``frozen`` are those among them that no longer require grad: frozen after the wrapper was built,
    which ``find_unused_parameters`` does not fix (it would average this rank's zeros in).
    """
    prior = "Expected to have finished reduction in the prior iteration before starting a new one. "
    if find_unused:  # the flag is on: the backward missed the outputs
        return RuntimeError(
            prior + f"Parameters {missing} received no gradient on rank {rank}, and that backward did not go "
            "through the forward's outputs (a loss built only from autograd.grad's results, e.g. a gradient "
            "penalty alone): make the loss use the outputs too (e.g. add 0 * output.sum()), as torch's DDP requires"
        )
    if frozen:
        return RuntimeError(
            prior + f"Parameters {frozen} have requires_grad=False on rank {rank}, but required grad when "
            "DistributedDataParallel was built, so this rank sent zeros for them: set requires_grad before wrapping, "
            "the same on every rank (find_unused_parameters=True does not fix a frozen parameter)"
        )
    return RuntimeError(
        prior + "Your module has parameters that were not used in producing loss: "
        f"{missing} received no gradient on rank {rank}. Pass find_unused_parameters=True to "
        "minddp.DistributedDataParallel (as to torch's), or make every parameter contribute to the loss (make sure "
        "all forward outputs are used in it)"
    )
