"""Keeping torch's own hooks usable as the oracle on every machine the suite runs on.

torch's ``powerSGD_hook`` calls ``torch.cuda.synchronize(device)`` whenever CUDA is available, with the
device of the bucket, so on a GPU machine it raises for CPU tensors ("Expected a cuda device, but got:
cpu") inside a Future callback (a defect of torch, seen on the H100 run). The suite runs on the CPU on
every machine (conftest.py); a rank that compares with torch's PowerSGD calls
:func:`cpu_safe_torch_powersgd` first, which makes that synchronize a no-op for CPU devices only.
On a machine without CUDA it changes nothing.
"""

import torch


def cpu_safe_torch_powersgd() -> None:
    if not torch.cuda.is_available() or getattr(torch.cuda.synchronize, "cpu_safe", False):
        return
    real = torch.cuda.synchronize

    def synchronize(device=None):
        if device is not None and torch.device(device).type == "cpu":
            return  # nothing of a CPU tensor runs on a GPU stream
        real(device)

    synchronize.cpu_safe = True
    torch.cuda.synchronize = synchronize
