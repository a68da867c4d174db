"""What users get wrong, and the errors that tell them so (instead of a hang or wrong grads)."""

import pytest
import torch
import torch.distributed as dist

from minddp import RankError, launch
from minddp.comm.default_hooks import allreduce_hook
from minddp.stages import build_stage


class SkipsABranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def unused_parameter(stage):
    torch.manual_seed(0)
    ddp = build_stage(stage, SkipsABranch(), bucket_cap_mb=None)
    ddp(torch.randn(2, 4)).sum().backward()
    ddp.finish_gradient_synchronization()


@pytest.mark.parametrize("stage", ["bucket", "bucket-async"])
def test_unused_parameter_names_it_and_points_at_find_unused_parameters(stage):
    with pytest.raises(RankError) as info:
        launch(unused_parameter, stage, world_size=2, timeout_s=30)
    assert set(info.value.errors) == {0, 1}                 # every rank says it, none hangs
    assert "unused.weight" in str(info.value) and "find_unused_parameters" in str(info.value)


def misuse_checks():
    out = {}
    model = torch.nn.Linear(3, 3)
    ddp = build_stage("hook", model)
    try:
        build_stage("bucket", model)
    except RuntimeError as e:
        out["double_wrap"] = str(e)
    ddp.register_comm_hook(None, allreduce_hook)
    try:
        ddp.register_comm_hook(None, allreduce_hook)
    except RuntimeError as e:
        out["twice"] = str(e)
    try:
        build_stage("simple", torch.nn.Linear(2, 2)).register_comm_hook(None, "allreduce")
    except TypeError as e:
        out["not_callable"] = str(e)
    # backward twice with sync, no finish in between (bucket stages track this)
    b = build_stage("bucket-async", torch.nn.Linear(3, 3))
    x = torch.randn(2, 3)
    b(x).sum().backward()
    try:
        b(x).sum().backward()
    except RuntimeError as e:
        out["backward_twice"] = str(e)
    return out


def test_misuse_errors_say_cause_and_fix():
    out = launch(misuse_checks, world_size=2, timeout_s=30)
    for rank_out in out:
        assert "already wrapped" in rank_out["double_wrap"] and "wrap a model once" in rank_out["double_wrap"]
        assert "only be called once" in rank_out["twice"]
        assert "must be callable" in rank_out["not_callable"]
        assert "became ready twice" in rank_out["backward_twice"] and "no_sync" in rank_out["backward_twice"]


def test_unknown_stage_name():
    with pytest.raises(ValueError, match="unknown stage 'bukket'"):
        build_stage("bukket", torch.nn.Linear(1, 1))


def test_stages_need_a_process_group():
    with pytest.raises(RuntimeError, match="not initialised"):
        build_stage("simple", torch.nn.Linear(1, 1))
