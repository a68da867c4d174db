"""The exercise checker on real ranks: model answers pass, each classic mistake is named, nothing hangs.

Oracles: the checker itself compares against a single process on the global
batch and torch's DDP; here the *mistakes* are known by construction
(``exercise_mistakes.py``: each wrong version differs from a model answer by
one mistake), so each verdict must name exactly that mistake. The model
answers, and the ladder's own stages, must pass. One cluster of 2 ranks
serves every case (the checker keeps its ranks between checks).
"""

from __future__ import annotations

import time

import pytest
import torch

import exercise_mistakes as wrong
import minddp.stages as ladder
from minddp.exercises import check, check_hook, checker, solutions

TIMEOUT = 8.0     # seconds a collective may wait: the hang case waits this long, the others never do


@pytest.fixture(scope="module", autouse=True)
def checker_ranks():
    checker.ranks(2, TIMEOUT)
    yield
    checker.shutdown()


def verdict_of(stage, like, **kw):
    v = check(stage, like=like, timeout_s=TIMEOUT, **kw)
    assert "\n" not in v.line, v.line
    return v


@pytest.mark.timeout(240)
def test_model_answers_and_the_ladder_pass():
    for like, answer in solutions.STAGES.items():
        v = verdict_of(answer, like)
        assert v.ok and v.line.startswith(f"✓ {like}:"), v.line
    # The ladder's stages (which send through the comm-hook layer) are answers too.
    for like, stage in [("simple", ladder.SimpleDDP), ("ga", ladder.GradAccumDDP), ("hook", ladder.HookDDP),
                        ("hook-async", ladder.AsyncHookDDP), ("bucket", ladder.BucketDDP),
                        ("bucket-async", ladder.AsyncBucketDDP)]:
        v = verdict_of(stage, like)
        assert v.ok, v.line
    # The counts in the verdict are the measured ones: simple syncs all 6 parameters after each of 3
    # micro-batches, ga once, bucket once per bucket (2 for the default cap).
    assert "18 all_reduce calls per step" in verdict_of(solutions.SimpleDDP, "simple").line
    assert "6 all_reduce calls per step" in verdict_of(solutions.GradAccumDDP, "ga").line
    assert "2 all_reduce calls per step" in verdict_of(solutions.BucketDDP, "bucket").line
    v = check_hook(solutions.fp16_compress_hook, like="fp16", timeout_s=TIMEOUT)
    assert v.ok and "2 bytes per value" in v.line, v.line


MISTAKES = [
    (wrong.NoBroadcast, "simple", "the broadcast is missing"),
    (wrong.ParametersOnly, "simple", "the buffers were not broadcast"),
    (wrong.Summed, "simple", "summed, not averaged"),
    (wrong.NeverSynced, "simple", "gradients were not synchronized"),
    (wrong.Unfinished, "simple", "raised NotImplementedError in finish_gradient_synchronization"),
    (solutions.SimpleDDP, "ga", "wrong number of collectives: 18 all_reduce calls in step 1, where 'ga' makes 6"),
    (wrong.IncomingGradient, "hook", "the incoming gradient of the last micro-batch was synced"),
    (wrong.IgnoresNoSync, "hook", "came from the micro-batches run inside no_sync()"),
    (wrong.AfterBackward, "hook", "started in finish_gradient_synchronization(), after backward"),
    (wrong.AsyncSummed, "hook-async", "forgot the division"),
    (solutions.HookDDP, "bucket", "one per bucket"),
    (wrong.BucketNotCopiedBack, "bucket", "gradients were not synchronized"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage,like,named", MISTAKES, ids=[f"{m[1]}-{m[0].__name__}" for m in MISTAKES])
def test_each_mistake_is_named(stage, like, named):
    v = verdict_of(stage, like)
    assert not v.ok and v.line.startswith(f"✗ {like}:") and named in v.line, v.line


@pytest.mark.timeout(120)
def test_a_rank_that_hangs_is_named_within_the_timeout():
    start = time.monotonic()
    v = verdict_of(wrong.RankZeroOnly, "simple")
    took = time.monotonic() - start
    assert not v.ok and "a rank hung: rank 0 waited" in v.line, v.line
    assert "line" in v.line and "dist.all_reduce(p.grad)" in v.line, v.line   # where, in the learner's code
    assert took < 2 * TIMEOUT + 30, took
    assert verdict_of(solutions.SimpleDDP, "simple").ok      # and the checker's ranks still work


HOOK_MISTAKES = [
    (wrong.hook_sum_only, "forgot the division"),
    (wrong.hook_raw_future, "holds a list of 1, not one tensor"),
    (wrong.hook_stays_fp16, "float16 tensor"),
    (wrong.hook_not_compressed, "sent 4 bytes per gradient value, the model answer 2"),
    (wrong.hook_waits, "not a torch.futures.Future"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hook,named", HOOK_MISTAKES, ids=[m[0].__name__ for m in HOOK_MISTAKES])
def test_each_hook_mistake_is_named(hook, named):
    v = check_hook(hook, like="fp16", timeout_s=TIMEOUT)
    assert not v.ok and named in v.line, v.line


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="choose one of simple, ga"):
        check(solutions.SimpleDDP, like="nope")
    with pytest.raises(TypeError, match="takes a stage class"):
        check(torch.nn.Linear(1, 1), like="simple")            # an instance, not the class
    with pytest.raises(ValueError, match="choose one of fp16"):
        check_hook(solutions.fp16_compress_hook, like="topk")
