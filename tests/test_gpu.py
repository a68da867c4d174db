"""The GPU path: run where CUDA is, skipped (with the reason) where it is not.

The rest of the suite runs on the CPU by choice (conftest.py sets ``MINDDP_BACKEND=gloo``); these tests
take that choice away and let minddp pick as it does for a user: NCCL with a GPU per rank, ranks
sharing a GPU over gloo with CUDA tensors. Each stage is checked against one process on the global
batch on the same GPU (:func:`minddp.doctor.check_rank`), and the doctor runs whole.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from minddp import launch
from minddp.doctor import check_rank
from minddp.ladder import STAGES
from minddp.runtime.device import choose

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU path)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def auto_choice(monkeypatch):
    monkeypatch.delenv("MINDDP_BACKEND", raising=False)


def _every_rung(placement_device_type):
    from minddp.runtime.device import current_device

    assert current_device().type == placement_device_type
    return check_rank([*STAGES, "torch"])


def _assert_all_passed(per_rank):
    for rows in per_rank:
        failed = [(name, detail) for name, ok, _, detail in rows if not ok]
        assert failed == []


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="needs a torch with NCCL")
def test_one_rank_under_nccl_trains_every_rung_like_one_process(auto_choice):
    _assert_all_passed(launch(_every_rung, "cuda", world_size=1, backend="nccl", timeout_s=120))


def test_more_ranks_than_gpus_share_them_over_gloo_and_train_every_rung(auto_choice):
    ranks = torch.cuda.device_count() + 1
    placement = choose("auto", local_world_size=ranks)
    assert (placement.backend, placement.device_type) == ("gloo", "cuda")
    _assert_all_passed(launch(_every_rung, "cuda", world_size=ranks, timeout_s=300))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_gpu_per_rank_under_nccl(auto_choice):
    _assert_all_passed(launch(_every_rung, "cuda", world_size=torch.cuda.device_count(), timeout_s=300))


def test_the_doctor_passes_on_this_gpu_machine():
    env = {k: v for k, v in os.environ.items() if k != "MINDDP_BACKEND"}
    done = subprocess.run(
        [sys.executable, "-m", "minddp.doctor"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
