"""What users get wrong with the stages, and the errors that tell them so (instead of a hang or wrong grads).

The teaching stages make two checks (the same model; the same parameters used
on every rank); the production DDP adds torch's (a hook registered once and
callable, ...). Oracle for the unused-parameter case: torch's DDP with
``find_unused_parameters=True`` on the same 2-rank script.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import RankError, launch
from minddp.comm.default_hooks import allreduce_hook
from minddp.comm.wire import Traffic
from minddp.ladder import STAGES, build_stage, options_for, wrap

TEACHING = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]


class SkipsABranch(torch.nn.Module):
    """``unused`` is never used on any rank; ``rank_only`` is used on rank 0 only when ``per_rank``."""

    def __init__(self, per_rank: bool = False):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)
        self.rank_only = torch.nn.Linear(4, 4)
        self.per_rank = per_rank

    def forward(self, x):
        if self.per_rank and dist.get_rank() == 0:
            return self.rank_only(self.used(x))
        return self.used(x)


def unused_everywhere(stage) -> dict:
    """Three steps with a parameter no rank uses: final parameters and the unused grads."""
    torch.manual_seed(0)
    model = SkipsABranch()
    ddp = (
        TorchDDP(model, find_unused_parameters=True)
        if stage == "torch"
        else build_stage(stage, model, **options_for(stage, bucket_cap_mb=0.0001))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(10 * step + dist.get_rank()))
        ddp(x).pow(2).sum().backward()
        if stage != "torch":
            ddp.finish_gradient_synchronization()
        grads = [p.grad for p in model.unused.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "unused_grads": [g is None for g in grads],
    }


@pytest.mark.parametrize("stage", TEACHING)
def test_a_parameter_no_rank_uses_trains_like_torch_find_unused_parameters(stage):
    ours = launch(unused_everywhere, stage, world_size=2, timeout_s=60)
    torch_runs = launch(unused_everywhere, "torch", world_size=2, timeout_s=60)
    for rank in range(2):
        assert ours[rank]["unused_grads"] == [True, True], ours[rank]
        assert torch.allclose(ours[rank]["params"], torch_runs[rank]["params"], rtol=1e-6, atol=1e-7)


def used_on_one_rank(stage):
    torch.manual_seed(0)
    ddp = build_stage(stage, SkipsABranch(per_rank=True), **options_for(stage, bucket_cap_mb=0.0001))
    ddp(torch.randn(2, 4)).sum().backward()
    ddp.finish_gradient_synchronization()


@pytest.mark.parametrize("stage", TEACHING)
def test_a_branch_taken_on_one_rank_only_is_named_on_every_rank(stage):
    with pytest.raises(RankError) as info:
        launch(used_on_one_rank, stage, world_size=2, timeout_s=30)
    assert set(info.value.errors) == {0, 1}  # every rank says it, none hangs
    for text in info.value.errors.values():
        assert "used different parameters on different ranks" in text, text
        assert "'rank_only.weight' on ranks [0] only" in text and "find_unused_parameters=True" in text


def second_hook(wrapped, hook=allreduce_hook) -> str:
    """Register a comm hook twice; what the second call raises (or "accepted")."""
    wrapped.register_comm_hook(None, hook)
    try:
        wrapped.register_comm_hook(None, hook)
    except Exception as e:  # torch's DDP raises RuntimeError
        return f"{type(e).__name__}: {e}"
    return "accepted"


def misuse_checks():
    out = {"twice": {stage: second_hook(build_stage(stage, torch.nn.Linear(3, 3))) for stage in STAGES}}
    out["twice"]["torch"] = second_hook(TorchDDP(torch.nn.Linear(3, 3)), torch_hooks.allreduce_hook)
    for stage in ("bucket-async", "ddp"):  # the notebooks' measured hook: wrapped, then registered once
        traffic = Traffic()
        torch.manual_seed(0)  # the same gradient on both ranks: no cancellation in the sum
        wrapped = wrap(stage, torch.nn.Linear(3, 3), hook="fp16", measure=traffic)
        wrapped(torch.randn(4, 3)).pow(2).sum().backward()
        wrapped.finish_gradient_synchronization()
        out["measured", stage] = traffic.relative_error()
    try:
        build_stage("ddp", torch.nn.Linear(2, 2)).register_comm_hook(None, "allreduce")
    except TypeError as e:
        out["not_callable"] = str(e)
    return out


@pytest.fixture(scope="module")
def misuse():
    return launch(misuse_checks, world_size=2, timeout_s=30)


def test_ddp_misuse_errors_say_cause_and_fix(misuse):
    for rank_out in misuse:
        assert "must be callable" in rank_out["not_callable"]


def test_every_stage_refuses_a_second_comm_hook_as_torch_does(misuse):
    """torch's DDP refuses a second register_comm_hook; a stage that took it would silently drop the first."""
    for rank_out in misuse:
        twice = rank_out["twice"]
        theirs = twice.pop("torch")
        assert theirs.startswith("RuntimeError: register_comm_hook") and "can only be called once" in theirs, theirs
        assert set(twice) == set(STAGES)
        # Equal halves sum exactly, so the one error is the cast to fp16: above 0, at most its unit roundoff.
        for stage in ("bucket-async", "ddp"):
            assert 0 < rank_out["measured", stage] <= 2**-11, (stage, rank_out["measured", stage])
        for stage, ours in twice.items():
            assert ours == (
                "RuntimeError: register_comm_hook can only be called once; build a new wrapper to use another hook"
            ), (stage, ours)


def test_unknown_stage_name():
    with pytest.raises(ValueError, match="unknown stage 'bukket'"):
        build_stage("bukket", torch.nn.Linear(1, 1))


def test_stages_need_a_process_group():
    # the teaching stage meets torch's own message; the production DDP names minddp's launcher
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        build_stage("simple", torch.nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match="not initialised: start ranks with minddp.launch"):
        build_stage("ddp", torch.nn.Linear(1, 1))


# -- a forgotten finish_gradient_synchronization() ------------------------------------------------------------

#: The stages that keep something between backward and finish (hook-async: Futures; the bucketed stages and
#: zero2: each bucket's count), where a forgotten finish carries into the next step.
KEEPING = ["hook-async", "bucket", "bucket-async", "zero2"]


def _two_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def finish_left_out(stage: str) -> dict:
    """A synced backward without its finish, then the next forwards; then the finish the message asks for."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(dist.get_rank()))
    ddp = build_stage(stage, _two_layers())
    ddp(x).sum().backward()  # finish_gradient_synchronization() left out
    out = {}
    with torch.no_grad():
        ddp(x)  # records no graph: evaluation between backward and finish is no new step
    for what in ("next forward", "no_sync forward"):
        try:
            quiet = getattr(ddp, "no_sync", None) if what == "no_sync forward" else None  # simple has none
            with quiet() if quiet is not None else torch.enable_grad():
                ddp(x)
            out[what] = "accepted"
        except RuntimeError as e:
            out[what] = str(e)
    ddp.finish_gradient_synchronization()  # the call added: the stage trains on, as one that never missed it
    fresh = build_stage(stage, _two_layers())
    for wrapped in (ddp, fresh):
        wrapped.zero_grad(set_to_none=True)
        wrapped(x).sum().backward()
        wrapped.finish_gradient_synchronization()
    out["same as a fresh one"] = all(torch.equal(a.grad, b.grad) for a, b in zip(ddp.parameters(), fresh.parameters()))
    return out


@pytest.mark.parametrize("stage", TEACHING + ["zero2"])
def test_a_forgotten_finish_is_refused_at_the_next_forward_on_every_rank(stage):
    """torch's DDP finishes at the end of backward and raises "Expected to have finished reduction in the prior
    iteration" for its own unfinished case; the stages that keep work for finish refuse a forward that records a
    graph until finish was called (before: a bucket counted twice was never sent again, silently)."""
    for out in launch(finish_left_out, stage, world_size=2, timeout_s=60):
        if stage in KEEPING:
            for what in ("next forward", "no_sync forward"):
                assert out[what].startswith("Expected to have finished reduction in the prior iteration"), out
                assert "call model.finish_gradient_synchronization() after every backward" in out[what], out
        else:  # simple, ga and hook keep nothing between backward and finish: nothing to carry over
            assert out["next forward"] == out["no_sync forward"] == "accepted", out
        assert out["same as a fresh one"], out


def test_build_stage_refuses_an_option_the_stage_does_not_take():
    """No process group is needed: the option is refused before the stage is built (before: ignored)."""
    with pytest.raises(
        TypeError,
        match=r"stage 'bucket' takes no option 'bucket_cap' \(did you mean 'bucket_cap_mb'\?\): it takes bucket_cap_mb",
    ):
        build_stage("bucket", torch.nn.Linear(1, 1), bucket_cap=1)
    with pytest.raises(TypeError, match="stage 'simple' takes no option 'bucket_cap_mb': it takes none"):
        build_stage("simple", torch.nn.Linear(1, 1), bucket_cap_mb=1)
    with pytest.raises(TypeError, match="stage 'fsdp' takes no option 'bucket_cap_mb': it takes compute_dtype, shard"):
        build_stage("fsdp", torch.nn.Linear(1, 1), bucket_cap_mb=1)
    # one call site for every stage picks each one's options; a name no stage takes is still refused
    assert options_for("simple", bucket_cap_mb=4) == {} and options_for("zero2", bucket_cap_mb=4) == {
        "bucket_cap_mb": 4
    }
    assert options_for("fsdp", bucket_cap_mb=4, shard=None) == {"shard": None}
    with pytest.raises(TypeError, match="no stage takes the option 'bucket_cap' \\(did you mean 'bucket_cap_mb'\\?\\)"):
        options_for("simple", bucket_cap=4)
