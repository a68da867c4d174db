"""Where a rank computes and how ranks talk: the one place that decides.

Every entry point (the launcher, the train CLI, the notebook runner, the
benchmark) asks this module instead of deciding for itself, so a machine with
GPUs gets NCCL and one GPU per rank, and a laptop gets gloo on the CPU, with
no other line of minddp knowing the difference.

Example::

    >>> backend = choose_backend("auto", local_world_size=2)   # "gloo" on a CPU box
    >>> device = rank_device(local_rank=1, backend=backend)    # cpu, or cuda:1
"""

from __future__ import annotations

import datetime
import os

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


def choose_backend(requested: str = "auto", local_world_size: int = 1) -> str:
    """Return the process-group backend to use.

    ``auto`` means NCCL when every local rank can have a GPU of its own, else
    gloo. Asking for ``nccl`` without enough GPUs is an error that says so.
    """
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= local_world_size and dist.is_nccl_available() else "gloo"
    if requested == "nccl" and gpus < local_world_size:
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: {local_world_size} local ranks but {gpus} GPUs; "
            "use --backend gloo (CPU) or fewer ranks"
        )
    return requested


def rank_device(local_rank: int, backend: str) -> torch.device:
    """The device a rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def current_device() -> torch.device:
    """The device of this rank, read from the initialised process group."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def timeout_delta(seconds: float | None) -> datetime.timedelta:
    return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S if seconds is None else seconds)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (a no-op on the CPU), so timings mean what they say."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
