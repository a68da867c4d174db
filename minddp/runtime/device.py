"""Where a rank computes and how ranks talk: the one place that decides, and the rule for messages.

Every entry point (the launcher, the train command, the notebook runner, the benchmark, the doctor)
asks :func:`choose` instead of deciding for itself: NCCL and one GPU per rank when every rank can
have one, ranks sharing the GPUs over gloo when they outnumber them, gloo on the CPU without a GPU.
Every tensor a collective carries lives on a device its group serves (``docs/devices.md``): gradients
and weights on the rank's device, bookkeeping messages on :func:`message_device`.

Example::

    >>> choose("auto", local_world_size=2, gpus=1).why
    '2 ranks share the GPU: gloo with CUDA tensors, since NCCL needs one GPU per rank (--backend gloo: the CPU)'
    >>> choose("auto", local_world_size=2, gpus=0).device(1)
    device(type='cpu')
    >>> parse_backend("cpu:gloo,cuda:nccl")
    {'cpu': 'gloo', 'cuda': 'nccl'}
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")


def env_seconds(name: str, default: float) -> float:
    """Seconds from environment variable ``name`` (``default`` when unset or empty; NaN when not a number)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        return float("nan")


#: Collective timeout when nobody says otherwise. A teaching tool should fail
#: within minutes, not after torch's default half hour.
#: A value that is not a number reads as NaN here, so that importing never fails; the train command
#: refuses it up front, naming the variable.
DEFAULT_TIMEOUT_S = env_seconds("MINDDP_TIMEOUT", 300.0)


@dataclass(frozen=True)
class Placement:
    """Where the ranks of one machine compute and how they talk: what :func:`choose` decided, and why.

    ``backend`` is the name a user reads (``"gloo"`` or ``"nccl"``); ``device_type`` is where the ranks
    compute (``"cpu"`` or ``"cuda"``); ``gpus`` how many GPUs the ranks share out (rank ``r`` takes GPU
    ``r % gpus``); ``why`` says it in one line.
    """

    backend: str
    device_type: str
    gpus: int
    why: str

    def group_backend(self) -> str:
        """What ``init_process_group`` gets: NCCL with gloo beside it for CPU tensors, or plain gloo.

        Since torch 2.6 a group built as ``"nccl"`` serves CUDA tensors only; naming gloo for the CPU
        keeps object collectives and barriers working in minddp's groups (``docs/devices.md``).
        """
        return "cpu:gloo,cuda:nccl" if self.backend == "nccl" else "gloo"

    def device(self, local_rank: int) -> torch.device:
        """The device local rank ``local_rank`` computes on."""
        if self.device_type == "cuda":
            return torch.device("cuda", local_rank % self.gpus)
        return torch.device("cpu")


def gpu_count() -> int:
    """How many GPUs this process can see (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose(
    requested: str = "auto", local_world_size: int = 1, gpus: int | None = None, nccl: bool | None = None
) -> Placement:
    """Decide where ``local_world_size`` ranks on this machine compute and how they talk.

    * ``auto`` with a GPU for every rank: NCCL, one GPU per rank;
    * ``auto`` with fewer GPUs than ranks (one GPU, several ranks): the ranks share the GPUs and talk over
      gloo with CUDA tensors (NCCL refuses two ranks on one GPU);
    * ``auto`` without a GPU, or ``gloo`` asked for: gloo on the CPU;
    * ``nccl`` asked for without a GPU per rank: an error that says so.

    ``gpus`` and ``nccl`` default to what this machine has (tests pass them to fake a machine). The
    environment variable ``MINDDP_BACKEND`` (``gloo`` or ``nccl``) replaces ``auto`` where it is set.
    """
    if requested == "auto":  # MINDDP_BACKEND: a default for every "auto" (the test suite sets gloo: the CPU)
        requested = os.environ.get("MINDDP_BACKEND", "").strip() or "auto"
        if requested not in BACKENDS:
            raise ValueError(
                f"MINDDP_BACKEND={requested!r} is not a backend: set it to one of {', '.join(BACKENDS)}, or unset it"
            )
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    gpus = gpu_count() if gpus is None else gpus
    nccl = dist.is_nccl_available() if nccl is None else nccl
    n = local_world_size
    ranks = f"{n} rank{'s' if n != 1 else ''}"
    if requested == "nccl":
        if gpus < n or not nccl:
            have = f"{gpus} GPU{'s' if gpus != 1 else ''}" + ("" if nccl else ", and this torch has no NCCL")
            raise ValueError(
                f"backend 'nccl' needs one GPU per rank: {n} local ranks but {have}; "
                "use --backend auto (ranks share the GPUs over gloo), --backend gloo (CPU) "
                "or fewer ranks"
            )
        return Placement("nccl", "cuda", gpus, f"{ranks} on {gpus} GPUs: NCCL, one GPU per rank")
    if requested == "gloo" or gpus == 0:
        why = "gloo on the CPU (asked for)" if requested == "gloo" else "no GPU: gloo on the CPU"
        return Placement("gloo", "cpu", 0, f"{ranks}, {why}")
    if gpus >= n and nccl:
        return Placement("nccl", "cuda", gpus, f"{ranks} on {gpus} GPUs: NCCL, one GPU per rank")
    if gpus >= n:
        return Placement(
            "gloo", "cuda", gpus, f"{ranks} on {gpus} GPUs: gloo with CUDA tensors (this torch has no NCCL)"
        )
    share = "the GPU" if gpus == 1 else f"{gpus} GPUs"
    return Placement(
        "gloo",
        "cuda",
        gpus,
        f"{ranks} share {share}: gloo with CUDA tensors, since NCCL needs one GPU per rank (--backend gloo: the CPU)",
    )


#: The device this process's rank computes on, once :func:`use` has set it (the launcher does).
_rank_device: torch.device | None = None


def use(placement: Placement, local_rank: int) -> torch.device:
    """In a rank: take its device (and make it the current CUDA device); :func:`current_device` returns it."""
    global _rank_device
    _rank_device = placement.device(local_rank)
    if _rank_device.type == "cuda":
        torch.cuda.set_device(_rank_device)
    return _rank_device


def current_device() -> torch.device:
    """The device of this rank: the one the launcher gave it, else read from the initialised process group."""
    if _rank_device is not None:
        return _rank_device
    if dist.is_initialized() and not group_serves(None, "cpu"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def backends_by_device(group: dist.ProcessGroup | None = None) -> dict[str, str]:
    """Which backend carries ``group``'s tensors on each device type, from its backend string.

    ``"gloo"`` serves the CPU and CUDA (all_reduce, broadcast and all_gather of CUDA tensors),
    ``"nccl"`` CUDA alone, ``"cpu:gloo,cuda:nccl"`` each device type as named.
    """
    return parse_backend(str(dist.get_backend(group)))


def parse_backend(name: str) -> dict[str, str]:
    """``"gloo"`` -> ``{"cpu": "gloo", "cuda": "gloo"}``; ``"cpu:gloo,cuda:nccl"`` -> each as named."""
    name = name.lower().strip()
    if ":" not in name:
        return {"cuda": "nccl"} if name == "nccl" else {"cpu": name, "cuda": name}
    pairs = (part.split(":", 1) for part in name.split(","))
    return {device.strip(): backend.strip() for device, backend in pairs}


def group_serves(group: dist.ProcessGroup | None, device_type: str) -> bool:
    """Does ``group`` take tensors on ``device_type`` (``"cpu"`` or ``"cuda"``)?"""
    return device_type in backends_by_device(group)


def message_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a bookkeeping message for ``group`` lives (a count, a flag, a mask; not gradients or weights).

    The rule (``docs/devices.md``): a message is on a device its group serves. The CPU when the group
    serves it (gloo, or NCCL with gloo beside it: no GPU sync for a few bytes), else this rank's GPU
    (a plain NCCL group, e.g. one a user's script built).
    """
    if group_serves(group, "cpu"):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def gloo_on_cuda(group: dist.ProcessGroup | None, tensor: torch.Tensor) -> bool:
    """Would gloo carry this CUDA tensor (ranks sharing a GPU)? gloo takes CUDA tensors in all_reduce,
    broadcast and all_gather only: point-to-point messages then go through the CPU (:func:`staged`)."""
    return tensor.is_cuda and backends_by_device(group).get("cuda") == "gloo"


@contextlib.contextmanager
def staged(tensor: torch.Tensor, group: dist.ProcessGroup | None):
    """Yield a tensor for a point-to-point message or a collective gloo cannot do on CUDA: ``tensor``
    itself, or a CPU copy that is copied back into ``tensor`` afterwards when gloo carries a CUDA tensor."""
    if not gloo_on_cuda(group, tensor):
        yield tensor
        return
    host = tensor.to("cpu")
    yield host
    tensor.copy_(host)


def timeout_delta(seconds: float | None) -> datetime.timedelta:
    return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S if seconds is None else seconds)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (a no-op on the CPU), so timings mean what they say."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
