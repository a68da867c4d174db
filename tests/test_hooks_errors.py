"""Bad input to the hook layer gets a one-line error that names the cause and the fix."""

from __future__ import annotations

import pickle
import re

import pytest
import torch
import torch.distributed as dist
from test_hooks_support import batch, fresh, loss_fn, make_model, wrap

from minddp import launch
from minddp.comm import GradBucket, PowerSGDState, hook_names, make_hook
from minddp.comm.default_hooks import allreduce_hook
from minddp.runtime.launch import RankError


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(start_powerSGD_iter=1), "start_powerSGD_iter must be >= 2"),
        (dict(start_powerSGD_iter=0, use_error_feedback=True, warm_start=False), "start_powerSGD_iter must be >= 2"),
        (dict(matrix_approximation_rank=0), "matrix_approximation_rank must be an integer >= 1"),
        (dict(matrix_approximation_rank=1.5), "matrix_approximation_rank must be an integer >= 1"),
    ],
)
def test_powersgd_state_refuses_bad_settings(kwargs, words):
    with pytest.raises(ValueError, match=words):
        PowerSGDState(None, **kwargs)


def test_powersgd_state_allows_early_start_without_memory_and_pickles_without_group():
    state = PowerSGDState(None, start_powerSGD_iter=1, use_error_feedback=False, warm_start=False)
    assert state.start_powerSGD_iter == 1
    state = PowerSGDState(lambda: None, start_powerSGD_iter=2)  # an unpicklable stand-in for a group
    state.error_dict[0] = torch.arange(3.0)
    loaded = pickle.loads(pickle.dumps(state))
    assert loaded.process_group is None and torch.equal(loaded.error_dict[0], torch.arange(3.0))


def test_registry_names_and_errors():
    names = hook_names()
    for name in ("allreduce", "fp16", "bf16", "powersgd", "batched-powersgd", "noop", "fp16+powersgd"):
        assert name in names
    state, _ = make_hook("powersgd", matrix_approximation_rank=4, start_powerSGD_iter=None)
    assert state.matrix_approximation_rank == 4 and state.start_powerSGD_iter == 1_000  # None = default
    with pytest.raises(ValueError, match="unknown hook 'powersdg'"):
        make_hook("powersdg")
    with pytest.raises(TypeError, match="unknown PowerSGD option"):
        make_hook("powersgd", rank=2)


def test_torch_hook_reads_the_same_table_as_make_hook():
    """Every name minddp's registry takes is torch's hook of that name (oracle: torch's own modules), with the
    same state and the same refusals."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

    from minddp.comm.registry import torch_hook

    for name in hook_names():
        (state, theirs), (_, ours) = torch_hook(name), make_hook(name)
        assert theirs.__module__.startswith("torch.distributed.algorithms.ddp_comm_hooks."), (name, theirs)
        assert ours.__module__.startswith("minddp.comm."), (name, ours)
        if "+" not in name:
            assert theirs.__name__ == ours.__name__, name
        assert isinstance(state, torch_powersgd.PowerSGDState) == ("powersgd" in name), (name, state)
    assert torch_hook("bf16")[1] is torch_default.bf16_compress_hook
    state, _ = torch_hook("powersgd", matrix_approximation_rank=3, start_powerSGD_iter=None)
    assert state.matrix_approximation_rank == 3 and state.start_powerSGD_iter == 1_000  # None = torch's default
    with pytest.raises(ValueError, match="unknown hook 'powersdg'"):
        torch_hook("powersdg")
    with pytest.raises(TypeError, match="unknown PowerSGD option"):
        torch_hook("powersgd", rank=2)


def test_grad_bucket_gradients_are_views_of_the_buffer():
    w, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.zeros(3))
    bucket = GradBucket(0, torch.arange(9.0), [w, b], is_last=True)
    gw, gb = bucket.gradients()
    assert gw.shape == (2, 3) and gb.shape == (3,)
    bucket.buffer().mul_(2)
    assert torch.equal(gb, torch.tensor([12.0, 14.0, 16.0])) and bucket.parameters()[0] is w


def _wrong_shape(_, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer()[:-1].clone())
    return fut


def _not_a_future(_, bucket):
    return bucket.buffer()


def rank_misuse(case: str):
    """The production DDP checks what a hook is and returns (the teaching stages leave that out)."""
    model = make_model()
    if case == "not-callable":
        wrap("ddp", fresh(model), None, "allreduce")
    if case == "twice":
        ddp = wrap("ddp", fresh(model), None, allreduce_hook)
        ddp.register_comm_hook(None, allreduce_hook)
    hook = {"wrong-shape": _wrong_shape, "not-a-future": _not_a_future}[case]
    ddp = wrap("ddp", fresh(model), None, hook)
    loss_fn(ddp, batch(dist.get_rank(), 0)).backward()


@pytest.mark.parametrize(
    "case, exc, words",
    [
        ("not-callable", "TypeError", "comm hook must be callable"),
        ("twice", "RuntimeError", "register_comm_hook can only be called once"),
        ("wrong-shape", "RuntimeError", r"returned shape \(1535,\) for bucket 0.*bucket buffer.s shape \(1536,\)"),
        ("not-a-future", "TypeError", "returned Tensor, not a torch.futures.Future"),
    ],
)
def test_misused_hooks_fail_clearly(case, exc, words):
    with pytest.raises(RankError) as info:
        launch(rank_misuse, case, world_size=1)
    assert info.value.exc_type == exc, info.value.traceback
    assert re.search(words, info.value.traceback), info.value.traceback
