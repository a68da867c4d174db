"""The bucket plan follows the documented rules and matches torch's own; no process group needed."""

import random

import pytest
import torch
import torch.distributed as dist

from minddp.stages import plan_buckets

MB = 1024 * 1024


def params(*numels, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in numels]


def test_none_means_one_bucket_in_reverse_order():
    assert plan_buckets(params(3, 5, 7, 2), None) == [[3, 2, 1, 0]]


def test_bucket_closes_once_it_reaches_the_cap_in_reverse_order():
    ps = params(100, 200, 300, 50, 25)            # fp32: 400, 800, 1200, 200, 100 bytes
    plan = plan_buckets(ps, 1000 / MB)
    assert [i for b in plan for i in b] == [4, 3, 2, 1, 0]    # reverse order, every param once
    for bucket in plan[:-1]:
        size = sum(ps[i].numel() * 4 for i in bucket)
        assert size >= 1000 and size - ps[bucket[-1]].numel() * 4 < 1000   # closed by its last param
    assert plan == [[4, 3, 2], [1, 0]]     # 100 + 200 + 1200 bytes reach the cap; 800 + 400 too


def test_fractional_cap_is_valid():
    ps = params(*[100] * 10)                       # 400 bytes each
    plan = plan_buckets(ps, 0.0016)                # 0.0016 MiB = 1677 bytes -> closed at 2000
    assert [len(b) for b in plan] == [5, 5]


def test_param_larger_than_cap_closes_its_bucket():
    plan = plan_buckets(params(10, 10_000, 10), 100 / MB)
    assert plan == [[2, 1], [0]]


def test_dtypes_never_share_a_bucket():
    ps = params(4, 4) + params(4, dtype=torch.float16) + params(4)
    plan = plan_buckets(ps, None)
    for bucket in plan:
        assert len({ps[i].dtype for i in bucket}) == 1
    assert sorted(i for b in plan for i in b) == [0, 1, 2, 3]


def test_small_first_bucket():
    ps = params(*[1000] * 6)                       # 4000 bytes each
    plan = plan_buckets(ps, 9000 / MB, first_bucket_cap_mb=4000 / MB)
    assert plan == [[5], [4, 3, 2], [1, 0]]


@pytest.mark.parametrize("cap", [0, -1.0])
def test_bad_cap_is_refused(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        plan_buckets(params(1), cap)


def torch_plan(ps, cap_mb, first_cap_mb=None):
    """torch's reducer's assignment over the parameters in reverse order (what its rebuild does)."""
    limits = [int(cap_mb * MB)] if first_cap_mb is None else [int(first_cap_mb * MB), int(cap_mb * MB)]
    order = list(reversed(range(len(ps))))
    buckets, _ = dist._compute_bucket_assignment_by_size([ps[i] for i in order], limits, [], order)
    return [list(b) for b in buckets]


@pytest.mark.parametrize("seed", range(20))
def test_plan_matches_torchs_reducer(seed):
    rng = random.Random(seed)
    ps = params(*[rng.choice([1, 7, 64, 300, 1000, 4096, 20_000]) for _ in range(rng.randint(1, 40))])
    if seed % 3 == 0:                              # a second dtype fills its own buckets
        ps += params(*[rng.choice([5, 600, 3000]) for _ in range(5)], dtype=torch.float16)
    cap_mb = rng.choice([100, 4000, 16_000, 50_000]) / MB
    first = rng.choice([None, 2000 / MB])
    want = torch_plan(ps, cap_mb, first)
    got = plan_buckets(ps, cap_mb, first_bucket_cap_mb=first)
    assert sorted(map(sorted, got)) == sorted(map(sorted, want))   # same buckets...
    one_dtype = [b for b in got if ps[b[0]].dtype == torch.float32]
    assert one_dtype == [b for b in want if ps[b[0]].dtype == torch.float32]   # ...filled in the same order
