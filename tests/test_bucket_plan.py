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
    ps = params(100, 200, 300, 50, 25)  # fp32: 400, 800, 1200, 200, 100 bytes
    plan = plan_buckets(ps, 1000 / MB)
    assert [i for b in plan for i in b] == [4, 3, 2, 1, 0]  # reverse order, every param once
    for bucket in plan[:-1]:
        size = sum(ps[i].numel() * 4 for i in bucket)
        assert size >= 1000 and size - ps[bucket[-1]].numel() * 4 < 1000  # closed by its last param
    assert plan == [[4, 3, 2], [1, 0]]  # 100 + 200 + 1200 bytes reach the cap; 800 + 400 too


def test_fractional_cap_is_valid():
    ps = params(*[100] * 10)  # 400 bytes each
    plan = plan_buckets(ps, 0.0016)  # 0.0016 MiB = 1677 bytes -> closed at 2000
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
    ps = params(*[1000] * 6)  # 4000 bytes each
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
    if seed % 3 == 0:  # a second dtype fills its own buckets
        ps += params(*[rng.choice([5, 600, 3000]) for _ in range(5)], dtype=torch.float16)
    cap_mb = rng.choice([100, 4000, 16_000, 50_000]) / MB
    first = rng.choice([None, 2000 / MB])
    want = torch_plan(ps, cap_mb, first)
    got = plan_buckets(ps, cap_mb, first_bucket_cap_mb=first)
    assert sorted(map(sorted, got)) == sorted(map(sorted, want))  # same buckets...
    one_dtype = [b for b in got if ps[b[0]].dtype == torch.float32]
    assert one_dtype == [b for b in want if ps[b[0]].dtype == torch.float32]  # ...filled in the same order


class _Flat(torch.nn.Module):
    def __init__(self, ps):
        super().__init__()
        self.ps = torch.nn.ParameterList(ps)

    def forward(self):
        return sum((p.float() * p.float()).sum() for p in self.ps)


def torch_first_iteration_plans(cases):
    """What torch's DDP hands its comm hook in its first backward, as lists of parameter indices (one rank)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    out = []
    for sizes, cap_mb, find_unused in cases:
        model = _Flat([torch.nn.Parameter(torch.randn(n, dtype=dt)) for n, dt in sizes])
        index = {id(p): i for i, p in enumerate(model.parameters())}
        seen = {}

        def hook(state, bucket):
            seen[bucket.index()] = [index[id(p)] for p in bucket.parameters()]
            return allreduce_hook(state, bucket)

        kw = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
        ddp = DistributedDataParallel(model, find_unused_parameters=find_unused, **kw)
        ddp.register_comm_hook(None, hook)
        ddp().backward()
        out.append([seen[b] for b in sorted(seen)])
    return out


def test_first_iteration_plan_matches_torchs_ddp():
    """``ddp`` starts where torch's DDP starts (one bucket; or, with find_unused_parameters, buckets filled in
    registration order and launched last-filled first), the oracle being torch's DDP itself."""
    from minddp.ddp.plan import plan_first_iteration_like_torch
    from minddp.runtime.launch import launch

    rng = random.Random(5)
    cases = []
    for k in range(8):
        sizes = [(rng.choice([1, 7, 64, 300, 1000, 4096]), torch.float32) for _ in range(rng.randint(2, 25))]
        if k % 4 >= 2:  # a second dtype: with and without find_unused_parameters
            sizes += [(rng.choice([5, 600]), torch.float16) for _ in range(3)]
        cases.append((sizes, rng.choice([None, 2000 / MB, 9000 / MB]), k % 2 == 1))
    want = launch(torch_first_iteration_plans, cases, world_size=1, backend="gloo", timeout_s=120)[0]
    for (sizes, cap_mb, find_unused), expected in zip(cases, want):
        ps = [torch.nn.Parameter(torch.zeros(n, dtype=dt)) for n, dt in sizes]
        default = cap_mb is None
        got = plan_first_iteration_like_torch(ps, 25.0 if default else cap_mb, 1.0 if default else None, find_unused)
        assert got == expected, (cap_mb, find_unused, got, expected)


def _chain():
    """12 weights of 256 KiB, no biases: backward finishes them strictly in reverse order, so every DDP sees
    the same gradient order and plans buckets from it alone."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(12)])


def _plans_after_rebuild(cap_mb):
    """The buckets of each stage at ``cap_mb`` (None: the default), and those torch's DDP hands its comm hook
    in its third backward, after it rebuilt its plan from the order it saw (one rank)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from minddp.ladder import build_stage

    kw = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    out = {}
    for stage in ("bucket", "bucket-async", "zero2"):
        model = _chain()
        wrapped = build_stage(stage, model, **kw)
        where = {id(p): i for i, p in enumerate(model.parameters())}
        if stage == "zero2":  # it holds its shards in the module: number its full parameters
            where = {id(p): i for i, p in enumerate(wrapped.full)}
        out[stage] = [[where[id(p)] for p in bucket] for bucket in wrapped.buckets]
    model, seen = _chain(), []
    index = {id(p): i for i, p in enumerate(model.parameters())}

    def hook(state, bucket):
        seen.append([index[id(p)] for p in bucket.parameters()])
        return allreduce_hook(state, bucket)

    ddp = DistributedDataParallel(model, **kw)
    ddp.register_comm_hook(None, hook)
    ours = build_stage("ddp", _chain(), **kw)
    for _ in range(3):
        seen.clear()
        for wrapped in (ddp, ours):
            wrapped(torch.ones(2, 256)).sum().backward()
    out["ddp"] = [list(b) for b in ours.reducer.plan]
    return {"torch": seen, **out}


def _on_one_rank():
    from torch.nn.parallel import DistributedDataParallel

    return {
        "torch's default cap": DistributedDataParallel(torch.nn.Linear(2, 2)).bucket_bytes_cap,
        **{cap: _plans_after_rebuild(cap) for cap in (None, 0.5)},
    }


@pytest.fixture(scope="module")
def on_one_rank():
    from minddp.runtime.launch import launch

    return launch(_on_one_rank, world_size=1, backend="gloo", timeout_s=120)[0]


def test_the_default_caps_are_torchs(on_one_rank):
    """The stages' default (``bucket_cap_mb=None``) is torch's DDP's: 25 MiB, and a first bucket of
    ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``; the oracles are torch's own constant and its DDP's cap."""
    from minddp.stages.bucket_plan import DEFAULT_CAP_MB, FIRST_BUCKET_MB

    assert FIRST_BUCKET_MB * MB == dist._DEFAULT_FIRST_BUCKET_BYTES
    assert on_one_rank["torch's default cap"] == DEFAULT_CAP_MB * MB


@pytest.mark.parametrize("cap_mb", [None, 0.5])
def test_the_bucketed_stages_and_ddp_plan_as_torchs_ddp(on_one_rank, cap_mb):
    """Left at None, the first bucket holds 1 MiB (4 weights of 256 KiB) and the rest shares one 25 MiB bucket;
    a cap given is every bucket's: torch's rule, in every bucketed stage, ``zero2`` and ``ddp``; the oracle is
    torch's DDP after its rebuild."""
    plans = dict(on_one_rank[cap_mb])
    want = plans.pop("torch")
    pairs = [[11, 10], [9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]
    assert want == ([[11, 10, 9, 8], [7, 6, 5, 4, 3, 2, 1, 0]] if cap_mb is None else pairs)
    for stage, got in plans.items():
        assert got == want, stage
