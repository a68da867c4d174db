"""Sharded checkpoints (zero1, zero2, fsdp through torch.distributed.checkpoint): resume is bitwise, and reshards.

Oracles: the uninterrupted run (an interrupted run resumed from its
checkpoint must end with the same bits), the state the 2-rank run held when
it saved (a 3-rank run must load exactly it, put together from its chunks),
and single-process training for the 3-rank continuation. Then the train
command: resume equals the uninterrupted run, and a 2-rank checkpoint resumes
at 3 ranks.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import toy_models
from cli_checks import SMALL_RUN

from minddp import launch
from minddp.ladder import make_optimizer, wrap
from minddp.ladder.loop import train_step
from minddp.sharding.shards import chunk_range
from minddp.train import run as train
from minddp.train import sharded_checkpoint

STAGES = ["zero1", "zero2", "fsdp"]
ROWS = 4
LR = 0.01


def batches(world: int, phase: int) -> list[dict]:
    """Two steps of global batches; phase 1 and 2 draw different ones (phase 2 may run at another world size)."""
    return toy_models.global_batches("llama", 2, ROWS * world, seed=phase)


def build(stage: str, seed: int):
    model = toy_models.build("llama", seed)
    wrapped = wrap(stage, model, bucket_cap_mb=0.001)
    return model, wrapped, make_optimizer(stage, model, torch.optim.AdamW, lr=LR)


def steps(stage, model, wrapped, optimizer, global_batches) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    for batch in global_batches:
        train_step(wrapped, optimizer, [toy_models.shard(batch, rank, world)], toy_models.loss_fn)


def full(wrapped, model) -> torch.Tensor:
    params = wrapped.full_parameters() if hasattr(wrapped, "full_parameters") else dict(model.named_parameters())
    return torch.cat([params[n].detach().reshape(-1) for n, _ in toy_models.build("llama", 0).named_parameters()])


def local_state(stage, model, optimizer) -> dict:
    """This rank's optimizer state by parameter name: its chunk of each per-element tensor, flattened."""
    names = {id(p): n for n, p in model.named_parameters()}
    if stage == "zero1":
        pairs = [(names[id(p)], chunk) for p, chunk in optimizer.chunks.items()]
        states = optimizer.optim.state
    else:
        pairs = [(names[id(p)], p) for p in model.parameters()]
        states = optimizer.state
    return {name: {k: v.detach().reshape(-1).clone() for k, v in states[t].items()} for name, t in pairs}


def save_then_resume(stage: str, folder: str) -> dict:
    """At 2 ranks: uninterrupted 4 steps; 2 steps + save; a fresh model (other weights) + load + 2 steps."""
    rank = dist.get_rank()
    model, wrapped, optimizer = build(stage, 100 + rank)
    steps(stage, model, wrapped, optimizer, batches(2, 1) + batches(2, 2))
    uninterrupted = full(wrapped, model)
    model, wrapped, optimizer = build(stage, 100 + rank)
    steps(stage, model, wrapped, optimizer, batches(2, 1))
    sharded_checkpoint.save(
        folder, wrapped, model, optimizer, step=2, config={"stage": stage}, extra={"losses": [rank]}
    )
    at_save = {"params": full(wrapped, model), "state": local_state(stage, model, optimizer)}
    model, wrapped, optimizer = build(stage, 500 + rank)
    step, mine = sharded_checkpoint.load(folder, wrapped, model, optimizer)
    steps(stage, model, wrapped, optimizer, batches(2, 2))
    return {
        "uninterrupted": uninterrupted,
        "resumed": full(wrapped, model),
        "step": step,
        "mine": mine["losses"],
        "at_save": at_save,
    }


def load_at_three(stage: str, folder: str) -> dict:
    rank = dist.get_rank()
    model, wrapped, optimizer = build(stage, 900 + rank)
    step, mine = sharded_checkpoint.load(folder, wrapped, model, optimizer)
    loaded = {"params": full(wrapped, model), "state": local_state(stage, model, optimizer), "mine": mine["losses"]}
    steps(stage, model, wrapped, optimizer, batches(3, 2))
    return {**loaded, "continued": full(wrapped, model)}


def whole_state(per_rank: list[dict]) -> dict:
    """The full optimizer state from each rank's chunks (consecutive in rank order); whole ones as they are."""
    numel = {n: p.numel() for n, p in toy_models.build("llama", 0).named_parameters()}
    out = {}
    for name in per_rank[0]:
        for key, value in per_rank[0][name].items():
            chunked = value.dim() == 1 and value.numel() != numel[name] and key != "step"
            out[(name, key)] = torch.cat([r[name][key] for r in per_rank]) if chunked else value
    return out


def each_stage(fn, folder: str) -> dict:
    return {stage: fn(stage, f"{folder}/{stage}") for stage in STAGES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("sharded"))
    two = launch(each_stage, save_then_resume, tmp, world_size=2, timeout_s=240)
    three = launch(each_stage, load_at_three, tmp, world_size=3, timeout_s=240)
    return {stage: ([r[stage] for r in two], [r[stage] for r in three]) for stage in STAGES}


@pytest.mark.parametrize("stage", STAGES)
def test_interrupted_and_resumed_equals_uninterrupted_bitwise(runs, stage):
    two, _ = runs[stage]
    for rank, r in enumerate(two):
        assert r["step"] == 2 and r["mine"] == [rank]
        assert torch.equal(r["resumed"], r["uninterrupted"]), (
            f"{stage} rank {rank}: {(r['resumed'] - r['uninterrupted']).abs().max():.3g}"
        )


@pytest.mark.parametrize("stage", STAGES)
def test_a_checkpoint_saved_at_two_ranks_loads_at_three(runs, stage):
    two, three = runs[stage]
    assert all(torch.equal(r["params"], two[0]["at_save"]["params"]) for r in three)
    saved, loaded = whole_state([r["at_save"]["state"] for r in two]), whole_state([r["state"] for r in three])
    assert saved.keys() == loaded.keys()
    for key in saved:
        assert torch.equal(saved[key], loaded[key]), (stage, key)
    assert [r["mine"] for r in three] == [[0], [1], [0]]  # rank 2 takes rank 0's extras (2 % 2)
    # ... and trains on: as one process that did the same two phases
    model = toy_models.build("llama", 100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for batch in batches(2, 1) + batches(3, 2):
        toy_models.loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    reference = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for r in three:  # 3-rank sums round otherwise than one process, as the DDP stages' do on this model
        assert torch.allclose(r["continued"], reference, rtol=1e-5, atol=1e-5), (
            f"{stage}: {(r['continued'] - reference).abs().max():.3g}"
        )


def test_chunks_are_dtensor_shards():
    """minddp's chunks are the ones DTensor's Shard(0) cuts, so DCP can reshard them (torch's own split)."""
    for n in (1, 5, 10, 64, 1001):
        for world in (2, 3, 4):
            pieces = list(torch.arange(n).chunk(world))  # DTensor's Shard(0) cuts as torch.chunk
            pieces += [torch.arange(0)] * (world - len(pieces))
            assert [chunk_range(n, world, r) for r in range(world)] == [
                (int(p[0]), int(p[-1]) + 1) if p.numel() else (n, n) for p in pieces
            ], (n, world)


COMMON = [
    "--stage",
    "fsdp",
    "--no-profile",
    *SMALL_RUN,
    "--seed",
    "5",
    "--timeout",
    "60",
]


def test_train_command_resumes_a_sharded_stage_bitwise_and_at_another_world_size(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert (
        train.main(COMMON + ["--steps", "4", "--checkpoint-dir", str(a), "--summary-json", str(tmp_path / "a.json")])
        == 0
    )
    assert train.main(COMMON + ["--steps", "2", "--save-every", "2", "--checkpoint-dir", str(b)]) == 0
    assert (b / "fsdp" / "minddp.json").exists()
    assert (
        train.main(
            COMMON
            + [
                "--steps",
                "4",
                "--resume",
                str(b / "fsdp"),
                "--checkpoint-dir",
                str(b),
                "--summary-json",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    losses = {k: json.loads((tmp_path / f"{k}.json").read_text())["stages"]["fsdp"]["losses"] for k in "ac"}
    assert losses["a"] == losses["c"]
    # At 3 ranks the command accepts it (loading it at 3 ranks is the test above; the run is the same code).
    cfg = train.parse_args(COMMON + ["--steps", "3", "--world-size", "3", "--resume", str(b / "fsdp")])
    shapes = train.model_shapes(cfg, train.prepare(cfg)[0])
    train.check_resume(cfg, shapes)
    with pytest.raises(train.ConfigError, match="another run"):  # but not another run's
        train.check_resume(
            train.parse_args(COMMON + ["--steps", "3", "--seed", "6", "--resume", str(b / "fsdp")]), shapes
        )
