"""The doctor's checks: the configurations a machine allows, and a check that fails where a stage is wrong.

The command itself (``python -m minddp.doctor``: every rung against one process, the table, the exit status)
runs whole in the GPU report's dry run, on the CPU (``tests/test_gpu_report.py``).
"""

from __future__ import annotations

import torch.distributed as dist

from minddp import launch
from minddp.doctor import check_rank, configurations
from minddp.ladder import register_stage
from minddp.stages import SimpleDDP


def test_the_configurations_a_machine_allows():
    assert configurations(0) == [("2 ranks, CPU", "auto", 2)]
    assert configurations(1) == [("1 rank, NCCL", "nccl", 1), ("2 ranks sharing 1 GPU", "auto", 2)]
    assert configurations(8) == [
        ("1 rank, NCCL", "nccl", 1),
        ("8 ranks, NCCL", "nccl", 8),
        ("9 ranks sharing 8 GPUs", "auto", 9),
    ]


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


def test_a_check_that_raises_is_a_failed_row_and_the_configurations_after_it_still_run(monkeypatch):
    # The first GPU run (docs/devices.md): HTA raised inside the profiled check of the first configuration and
    # the doctor stopped there, so the second configuration was never checked and no table was printed.
    import minddp.doctor as doctor
    import minddp.runtime.launch as launching

    def fake_launch(fn, stages, world_size, backend, timeout_s):  # the training checks are not what is tested
        return [[("simple", True, 0.1, "fine")] for _ in range(world_size)]

    def profile_raises(backend, world, folder):
        raise AssertionError()  # what HTA 0.5.0's temporal breakdown raised, with no message

    monkeypatch.setattr(doctor, "configurations", lambda gpus: [("first", "gloo", 2), ("second", "gloo", 2)])
    monkeypatch.setattr(launching, "launch", fake_launch)
    monkeypatch.setattr(doctor, "profile_check", profile_raises)
    checks = doctor.run(say=lambda line: None)
    assert [(c.config, c.name, c.ok) for c in checks] == [
        ("first", "simple", True),
        ("first", "profiled run", False),
        ("second", "simple", True),
        ("second", "profiled run", False),
    ]
    assert checks[1].detail == "AssertionError: no message"
