"""``python -m minddp.doctor`` on the CPU: every rung checked against one process, the table, the exit status."""

from __future__ import annotations

import os
import subprocess
import sys

import torch.distributed as dist

from minddp import launch
from minddp.doctor import check_rank, configurations
from minddp.ladder import STAGES, register_stage
from minddp.stages import SimpleDDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_configurations_a_machine_allows():
    assert configurations(0) == [("2 ranks, CPU", "auto", 2)]
    assert configurations(1) == [("1 rank, NCCL", "nccl", 1), ("2 ranks sharing 1 GPU", "auto", 2)]
    assert configurations(8) == [
        ("1 rank, NCCL", "nccl", 1),
        ("8 ranks, NCCL", "nccl", 8),
        ("9 ranks sharing 8 GPUs", "auto", 9),
    ]


def test_the_doctor_passes_on_this_machine_and_says_what_it_checked():
    done = subprocess.run(
        [sys.executable, "-m", "minddp.doctor"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        (line[28:54].strip(), line[54:62].strip())
        for line in done.stdout.splitlines()
        if line.startswith("2 ranks, CPU")
    }
    for stage in [
        *STAGES,
        "torch",
        "ddp + fp16 hook",
        "ddp + bf16 hook",
        "ddp + powersgd hook",
        "train command, profiled",
        "trace read by minddp",
    ]:
        assert (stage, "ok") in rows, (stage, done.stdout)
    assert ("trace read by HTA", "skipped") in rows  # CPU traces: HTA reads GPU traces only
    assert "0 failed" in done.stdout.splitlines()[-1]


class SummingDDP(SimpleDDP):
    """A classic mistake: gradients summed over ranks, not averaged."""

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.mul_(dist.get_world_size())


def _check_a_summing_stage():
    register_stage("summing", SummingDDP)
    return check_rank(["summing", "simple"])


def test_a_stage_that_sums_instead_of_averaging_fails_its_check():
    rows = launch(_check_a_summing_stage, world_size=2)[0]
    by_name = {name: (ok, detail) for name, ok, _, detail in rows}
    assert by_name["simple"][0] is True
    ok, detail = by_name["summing"]
    assert ok is False and "max |w - single|" in detail and "bound" in detail
