"""The bucket plan follows the documented rules; no process group needed."""

import pytest
import torch

from minddp.stages import plan_buckets

MB = 1024 * 1024


def params(*numels, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in numels]


def test_none_means_one_bucket_in_reverse_order():
    assert plan_buckets(params(3, 5, 7, 2), None) == [[3, 2, 1, 0]]


def test_cap_respected_and_reverse_order():
    ps = params(100, 200, 300, 50, 25)            # fp32: 400, 800, 1200, 200, 100 bytes
    plan = plan_buckets(ps, 1000 / MB)
    assert [i for b in plan for i in b] == [4, 3, 2, 1, 0]    # reverse order, every param once
    for bucket in plan:
        size = sum(ps[i].numel() * 4 for i in bucket)
        assert size <= 1000 or len(bucket) == 1     # over the cap only as a lone big param
    assert plan == [[4, 3], [2], [1], [0]]     # 800 + 400 bytes would exceed 1000


def test_fractional_cap_is_valid():
    ps = params(*[100] * 10)                       # 400 bytes each
    plan = plan_buckets(ps, 0.0016)                # 0.0016 MiB = 1677 bytes -> 4 per bucket
    assert [len(b) for b in plan] == [4, 4, 2]


def test_param_larger_than_cap_gets_its_own_bucket():
    plan = plan_buckets(params(10, 10_000, 10), 100 / MB)
    assert plan == [[2], [1], [0]]


def test_dtypes_never_share_a_bucket():
    ps = params(4, 4) + params(4, dtype=torch.float16) + params(4)
    plan = plan_buckets(ps, None)
    for bucket in plan:
        assert len({ps[i].dtype for i in bucket}) == 1
    assert sorted(i for b in plan for i in b) == [0, 1, 2, 3]


def test_small_first_bucket():
    ps = params(*[1000] * 6)                       # 4000 bytes each
    plan = plan_buckets(ps, 9000 / MB, first_bucket_cap_mb=4000 / MB)
    assert plan == [[5], [4, 3], [2, 1], [0]]


@pytest.mark.parametrize("cap", [0, -1.0])
def test_bad_cap_is_refused(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        plan_buckets(params(1), cap)
