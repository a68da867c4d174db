"""ZeRO-1 (``minddp.ZeroRedundancyOptimizer``) trains exactly like one process on the global batch.

Oracles: a single process with the unsharded optimizer on the global batch
(as in ``test_stages_equivalence``), and torch's own
``ZeroRedundancyOptimizer`` over torch's DDP. The ranks start from different
weights, so only the DDP broadcast and ZeRO's all-gather can make them agree.
One launch per world size runs every case; the tests read its results.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import toy_models
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import DistributedDataParallel, ZeroRedundancyOptimizer, launch
from minddp.ladder import build_stage, options_for
from minddp.ladder.loop import train_step
from minddp.sharding.memory import optimizer_state_bytes

STEPS, ROWS = 4, 4
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "adafactor": (torch.optim.Adafactor, dict(lr=0.01)),  # needs whole tensors: owned whole by one rank
}
CASES = [(model, opt) for model in ("mlp", "tied", "llama") for opt in ("adamw", "sgd")] + [("llama", "adafactor")]
LADDER = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]


def groups_of(model: torch.nn.Module) -> list[dict]:
    """Two parameter groups with different learning rates (biases apart), so groups are exercised."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() > 1]},
        {"params": [p for p in params if p.dim() <= 1], "lr": 0.003},
    ]


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def train(model_name: str, opt_name: str, wrapper: str, accum: int = 1, zero: str = "minddp"):
    """On this rank: ``wrapper`` (a ladder stage, ``ddp`` or ``torch``) + a ZeRO optimizer; final params, state dict."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = toy_models.build(model_name, 100 + rank)
    if wrapper == "torch":
        wrapped = TorchDDP(model)
    elif wrapper == "ddp":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=0.001)
    elif wrapper == "ddp-like-torch":  # torch's default buckets: gloo then sums in the same order
        wrapped = DistributedDataParallel(model)
    else:
        wrapped = build_stage(wrapper, model, **options_for(wrapper, bucket_cap_mb=0.001))
    cls, kw = OPTIMIZERS[opt_name]
    if zero == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

        optimizer = TorchZero(groups_of(model), cls, **kw)
    else:
        optimizer = ZeroRedundancyOptimizer(groups_of(model), cls, **kw)
    for batch in toy_models.global_batches(model_name, STEPS, ROWS * world * accum):
        micro = [toy_models.shard(toy_models.shard(batch, m, accum), rank, world) for m in range(accum)]
        train_step(wrapped, optimizer, micro, toy_models.loss_fn)
    optimizer.consolidate_state_dict(to=0)
    return flat(model), optimizer.state_dict() if rank == 0 else None


def balance(model_name: str) -> list[int]:
    """AdamW state bytes each rank holds after one step of an offline model (every gradient zero)."""
    from minddp.train.models import build_model

    model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)  # the offline data's vocabulary
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    mine = torch.tensor([optimizer_state_bytes(optimizer)])
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [int(t) for t in everyone]


def rank_main(world: int) -> dict:
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for model_name, opt_name in CASES:
            out[("ddp", model_name, opt_name)] = train(model_name, opt_name, "ddp")
        out[("ddp-accum", "mlp", "adamw")] = train("mlp", "adamw", "ddp", accum=3)
        for stage in LADDER + ["torch"]:
            out[(stage, "mlp", "sgd")] = train("mlp", "sgd", stage, accum=2 if stage == "ga" else 1)
        for opt_name in ("adamw", "sgd"):  # torch's ZeRO over torch's DDP: the same run, torch's code
            out[("torch-zero", "llama", opt_name)] = train("llama", opt_name, "torch", zero="torch")
            out[("ddp-like-torch", "llama", opt_name)] = train("llama", opt_name, "ddp-like-torch")
    out["warnings"] = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if "minddp" in str(w.filename) or "sharding" in str(w.message)
    ]
    if world in (2, 3):
        out["balance"] = {name: balance(name) for name in ("tiny-llama", "small-llama")}
    return out


def single_process(model_name: str, opt_name: str, world: int, accum: int = 1):
    model = toy_models.build(model_name, 100)
    cls, kw = OPTIMIZERS[opt_name]
    optimizer = cls(groups_of(model), **kw)
    for batch in toy_models.global_batches(model_name, STEPS, ROWS * world * accum):
        for m in range(accum):
            (toy_models.loss_fn(model, toy_models.shard(batch, m, accum)) / accum).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat(model), optimizer.state_dict()


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def runs(request):
    world = request.param
    return world, launch(rank_main, world, world_size=world, timeout_s=300)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)  # as tight as the DDP stages' own test


def test_zero1_matches_single_process_and_keeps_ranks_identical(runs):
    world, per_rank = runs
    for key in [k for k in per_rank[0] if isinstance(k, tuple) and k[0] in ("ddp", "ddp-accum")]:
        accum = 3 if key[0] == "ddp-accum" else 1
        reference, _ = single_process(key[1], key[2], world, accum)
        finals = [r[key][0] for r in per_rank]
        assert all(torch.equal(finals[0], f) for f in finals[1:]), f"{key}: ranks differ"
        assert close(finals[0], reference), f"{key}: off by {(finals[0] - reference).abs().max():.3g}"


def test_consolidated_state_dict_is_the_unsharded_optimizers(runs):
    world, per_rank = runs
    for model_name, opt_name in CASES:
        _, reference = single_process(model_name, opt_name, world)
        ours = per_rank[0][("ddp", model_name, opt_name)][1]
        assert ours["state"].keys() == reference["state"].keys(), (model_name, opt_name)
        assert [{k: v for k, v in g.items() if k != "initial_lr"} for g in ours["param_groups"]] == reference[
            "param_groups"
        ]
        for i, state in reference["state"].items():
            for k, v in state.items():
                assert close(ours["state"][i][k], v) if torch.is_tensor(v) else ours["state"][i][k] == v, (
                    model_name,
                    opt_name,
                    i,
                    k,
                )
        cls, kw = OPTIMIZERS[opt_name]  # and it loads into the unsharded optimizer
        cls(groups_of(toy_models.build(model_name, 0)), **kw).load_state_dict(ours)


def test_zero1_works_under_every_stage_of_the_ladder_and_torch_ddp(runs):
    world, per_rank = runs
    for stage in LADDER + ["torch"]:
        reference, _ = single_process("mlp", "sgd", world, accum=2 if stage == "ga" else 1)
        final = per_rank[0][(stage, "mlp", "sgd")][0]
        assert close(final, reference), f"{stage}: off by {(final - reference).abs().max():.3g}"


def test_zero1_equals_torchs_zero_redundancy_optimizer(runs):
    """Same grads (both DDPs average alike, to the bit), same elementwise update: the bits agree."""
    world, per_rank = runs
    for opt_name in ("adamw", "sgd"):
        ours = per_rank[0][("ddp-like-torch", "llama", opt_name)][0]
        torchs = per_rank[0][("torch-zero", "llama", opt_name)][0]
        assert torch.equal(ours, torchs), f"{opt_name}: {(ours - torchs).abs().max():.3g} from torch's ZeRO"


def test_optimizer_state_is_balanced_within_one_percent_on_the_offline_models(runs):
    world, per_rank = runs
    for name, per_rank_bytes in per_rank[0]["balance"].items():
        assert len(per_rank_bytes) == world
        spread = (max(per_rank_bytes) - min(per_rank_bytes)) / max(per_rank_bytes)
        assert spread < 0.01, f"{name} at {world} ranks: {per_rank_bytes} ({100 * spread:.2f} %)"


def test_no_warnings(runs):
    _, per_rank = runs
    assert all(r["warnings"] == [] for r in per_rank), per_rank[0]["warnings"]


def test_refuses_lbfgs_with_the_reason():
    with pytest.raises(ValueError, match="LBFGS"):
        ZeroRedundancyOptimizer([torch.nn.Parameter(torch.ones(2))], torch.optim.LBFGS)
