"""``--resume`` of ``ddp`` and ``zero1`` with PowerSGD: the resumed run equals the uninterrupted one bit for bit.

Oracle: the uninterrupted run of the same command (2 ranks, gloo). PowerSGD keeps memory per bucket
(error feedback, P and Q, keyed by bucket index), and ``ddp``'s buckets are rebuilt from the observed
gradient order after the first step, so a resumed wrapper must start from the plan the saved memory was
made for. Run A trains 4 steps (PowerSGD compressing from step 2); run B stops after step k and saves;
run C resumes B to step 4. C's losses and step-4 checkpoint (model, optimizer, every rank's PowerSGD
memory, the bucket plan) must equal A's bitwise, for k = 1 (saved while the rebuild was still to come)
and k = 3 (saved with compressed memory). Then the combinations that cannot resume exactly are refused
in one line before any rank starts, and the plan API refuses misuse.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
import toy_models
from cli_checks import SMALL_RUN, usage_error
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from minddp import DistributedDataParallel, launch
from minddp.comm.registry import make_hook
from minddp.ladder.loop import train_step
from minddp.runtime.untrusted import load_torch_data
from minddp.train import run as train
from minddp.train import sharded_checkpoint
from minddp.train.checkpoint import read_checkpoint
from minddp.train.rng import as_data, from_data

STEPS = 4
COMMON = [
    "--no-profile",
    *SMALL_RUN,
    "--seed",
    "3",
    "--powersgd-start-iter",
    "2",
    "--timeout",
    "60",
]
#: hook -> {stage: the steps after which a run of it is stopped, then resumed}; each hook's stages run together.
#: PowerSGD keeps memory per bucket; fp16 keeps none (the other stages a user would resume, torch's DDP among them).
SCENARIOS = {"powersgd": {"ddp": (1, 3), "zero1": (3,)}, "fp16": {"ddp": (3,), "zero2": (3,), "torch": (3,)}}
CASES = [(hook, k, stage) for hook, stages in SCENARIOS.items() for stage, ks in stages.items() for k in ks]


def _main(*argv: str) -> None:
    assert train.main([*COMMON, *argv]) == 0


def _losses(path) -> dict[str, list[float]]:
    return {stage: row["losses"] for stage, row in json.loads(path.read_text())["stages"].items()}


def _saved(folder, stage: str):
    return folder / (stage if stage in ("zero1", "zero2") else f"{stage}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per hook: A (its stages, uninterrupted); Bk (those stopped after step k); Ck (each resumed from Bk)."""
    tmp, out = tmp_path_factory.mktemp("resume"), {}
    for hook, stages in SCENARIOS.items():
        base = tmp / hook
        _main("--hook", hook, "--stage", ",".join(stages), "--steps", str(STEPS), "--save-every", str(STEPS),
              "--checkpoint-dir", str(base / "a"), "--summary-json", str(base / "a.json"))  # fmt: skip
        for k in sorted({k for ks in stages.values() for k in ks}):
            stopped = ",".join(stage for stage, ks in stages.items() if k in ks)
            _main("--hook", hook, "--stage", stopped, "--steps", str(k), "--save-every", str(k),
                  "--checkpoint-dir", str(base / f"b{k}"))  # fmt: skip
        for stage, ks in stages.items():
            for k in ks:
                saved, summary = _saved(base / f"b{k}", stage), base / f"c{k}-{stage}.json"
                out[hook, k, stage] = {"shares_at_save": _shares(saved)}
                _main("--hook", hook, "--stage", stage, "--steps", str(STEPS), "--save-every", str(STEPS),
                      "--resume", str(saved), "--checkpoint-dir", str(base / f"b{k}"),
                      "--summary-json", str(summary))  # fmt: skip
                out[hook, k, stage]["losses"] = _losses(summary)[stage]
        out[hook] = _losses(base / "a.json")
    return {"tmp": tmp, **out}


def _shares(path) -> dict[int, dict]:
    """Each rank's share of a checkpoint (file or sharded folder), read as data."""
    if path.is_dir():
        return sharded_checkpoint.read_rank_extras(str(path), [0, 1])
    ckpt = read_checkpoint(str(path))
    return {r: from_data(load_torch_data(io.BytesIO(b))) for r, b in enumerate(ckpt["ranks"])}


def _tensors(path) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint holds (model, optimizer), by name; a sharded folder's chunks put together."""
    if not path.is_dir():
        ckpt = read_checkpoint(str(path))
        optim = {f"optim.{i}.{k}": v for i, s in ckpt["optimizer"]["state"].items() for k, v in s.items()}
        return {**{f"model.{k}": v for k, v in ckpt["model"].items()}, **optim}
    saved = sharded_checkpoint._metadata(str(path)).state_dict_metadata
    flat = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in saved.items()
            if isinstance(m, TensorStorageMetadata)}  # fmt: skip
    state = {
        "model": {k[len("model.") :]: t for k, t in flat.items() if k.startswith("model.")},
        "optim": {"state": {}},
    }
    for k, t in flat.items():
        if k.startswith("optim.state."):
            name, _, key = k[len("optim.state.") :].rpartition(".")
            state["optim"]["state"].setdefault(name, {})[key] = t
    sharded_checkpoint._load(state, str(path), alone=True)  # into whole tensors, in this process
    return flat


def _same_hook_memory(a: dict, c: dict) -> None:
    assert a["iter"] == c["iter"] == STEPS and a["error_dict"], "PowerSGD was not compressing: the test proves nothing"
    for memory in ("error_dict", "p_memory_dict", "q_memory_dict"):
        assert a[memory].keys() == c[memory].keys()
        assert all(torch.equal(a[memory][i], c[memory][i]) for i in a[memory]), memory
    assert as_data(a["rng"]) == as_data(c["rng"])  # PowerSGD's numpy generator, as plain values


@pytest.mark.parametrize("hook, k, stage", CASES)
def test_resumed_at_step_k_equals_the_uninterrupted_run_bitwise(runs, hook, k, stage):
    resumed = runs[hook, k, stage]
    assert resumed["losses"] == runs[hook][stage] and len(resumed["losses"]) == STEPS
    a, c = _saved(runs["tmp"] / hook / "a", stage), _saved(runs["tmp"] / hook / f"b{k}", stage)
    ta, tc = _tensors(a), _tensors(c)
    assert ta.keys() == tc.keys() and any(key.startswith("optim.") for key in ta)
    assert all(torch.equal(ta[key], tc[key]) for key in ta), [key for key in ta if not torch.equal(ta[key], tc[key])]
    sa, sc = _shares(a), _shares(c)
    for rank in (0, 1):
        if hook == "powersgd":
            _same_hook_memory(sa[rank]["hook_state"], sc[rank]["hook_state"])
        else:
            assert sa[rank]["hook_state"] is sc[rank]["hook_state"] is None
        assert sa[rank].get("bucket_plan") == sc[rank].get("bucket_plan")
    if stage in ("ddp", "zero1"):
        # what B saved is the plan the uninterrupted run trained with after its rebuild (at k=1 the rebuild
        # was still to come when B saved: the save made it), and it is not the one-bucket first plan
        plan = sa[0]["bucket_plan"]
        assert [share["bucket_plan"] for share in resumed["shares_at_save"].values()] == [plan, plan]
        assert len(plan) > 1


def test_a_zero1_checkpoint_with_powersgd_resumes_only_at_its_world_size(runs, capsys, monkeypatch):
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    argv = [
        *COMMON,
        "--hook",
        "powersgd",
        "--stage",
        "zero1",
        "--steps",
        "5",
        "--resume",
        str(runs["tmp"] / "powersgd" / "b3" / "zero1"),
    ]
    assert train.main(argv + ["--world-size", "3", "--batch-size", "4", "--checkpoint-dir", str(runs["tmp"])]) == 2
    usage_error(capsys.readouterr().err, "train", "PowerSGD's memory (error feedback, P and Q) is each rank's own")


@pytest.mark.parametrize(
    "argv, cause",
    [
        (["--stage", "torch"], "torch's DDP rebuilds its buckets after the first step of every run"),
        (["--stage", "bucket-async", "--bucket-cap-mb", "auto"], "auto picks the cap from this run's own timing"),
        (["--stage", "zero2"], "has no reduce-scatter form"),
        (["--stage", "fsdp"], "has no reduce-scatter form"),
    ],
)
def test_a_powersgd_resume_that_cannot_continue_exactly_is_refused_in_one_line(argv, cause, tmp_path, capsys,
                                                                               monkeypatch):  # fmt: skip
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    resume = tmp_path / "saved"
    resume.mkdir() if argv[1] in ("zero2", "fsdp") else resume.write_bytes(b"")
    assert (
        train.main([*COMMON, "--hook", "powersgd", *argv, "--resume", str(resume), "--checkpoint-dir", str(tmp_path)])
        == 2
    )
    usage_error(capsys.readouterr().err, "train", cause)


# -- the plan, in the wrapper's API --------------------------------------------------------------


def plan_api(world: int) -> dict:
    """Train 2 steps, settle the plan; a fresh wrapper loads it and keeps it; misuse is refused."""
    import torch.distributed as dist

    rank, out = dist.get_rank(), {}
    batches = [toy_models.shard(b, rank, world) for b in toy_models.global_batches("mlp", 2, 4 * world)]

    def ddp():
        wrapped = DistributedDataParallel(toy_models.build("mlp", seed=0), bucket_cap_mb=0.001)
        wrapped.register_comm_hook(*make_hook("powersgd", start_powerSGD_iter=2))
        return wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1)

    first, opt = ddp()
    out["before"] = first.reducer.settled_plan()
    out["first"] = first.bucket_plan
    for batch in batches:
        train_step(first, opt, [batch], toy_models.loss_fn)
    out["settled"] = first.reducer.settled_plan()
    # a fresh wrapper keeps a loaded plan through the steps after which it would rebuild: the saved one, and
    # one in registration order (the opposite of the order gradients come in, which a rebuild would follow)
    out["registration"] = [[i] for i, p in enumerate(first.module.parameters()) if p.requires_grad]
    for name, plan in (("settled", out["settled"]), ("registration", out["registration"])):
        second, opt = ddp()
        second.bucket_plan = plan
        for batch in batches:
            train_step(second, opt, [batch], toy_models.loss_fn)
        out[f"kept {name}"] = (second.bucket_plan, plan)
    for bad in ([[0]], [[0, 0], *out["settled"]], [[]], "0,1", [[i for b in out["settled"] for i in b], [99]]):
        try:
            ddp()[0].bucket_plan = bad
        except ValueError as exc:
            out.setdefault("bad", []).append(str(exc))
    try:
        second.bucket_plan = out["settled"]
    except RuntimeError as exc:
        out["late"] = str(exc)
    return out


def test_a_loaded_plan_is_kept_without_a_rebuild_and_a_plan_that_does_not_fit_is_refused():
    for out in launch(plan_api, 2, world_size=2):
        assert out["before"] is None  # nothing settled before a synced step
        assert out["settled"] != out["first"] and len(out["settled"]) > 1  # the rebuild happened
        assert out["settled"] != out["registration"]  # so the second plan is not what a rebuild would make
        assert (
            out["kept settled"][0] == out["kept settled"][1]
            and out["kept registration"][0] == out["kept registration"][1]
        )
        assert len(out["bad"]) == 5 and all(
            m.startswith("this bucket plan does not fit the model") and "\n" not in m for m in out["bad"]
        ), out["bad"]
        assert out["late"].startswith("a saved bucket plan is set before the first training step")
