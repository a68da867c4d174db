"""Checkpoints that lose nothing: save, crash during the next save, resume == the uninterrupted run.

Oracle: the uninterrupted run of the same command. Run A trains 6 steps with
PowerSGD (error feedback + warm start, compressing from step 2) and saves at
steps 3 and 6. Run B is the same command, but rank 0 is SIGKILLed half-way
through writing its step-6 checkpoint. Run C resumes from what B left. C's
losses and its step-6 checkpoint (model, optimizer, every rank's PowerSGD
memory) must equal A's bitwise, and B's step-3 checkpoint must have survived
the crash byte for byte. Then: refusals of files that do not fit.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import signal

import pytest
import torch
import torch.distributed as dist
from cli_checks import SMALL_RUN, usage_error
from torch import nn

from minddp import RankError, launch
from minddp.train import run as train
from minddp.train.checkpoint import CheckpointError, atomic_write, load_checkpoint, read_checkpoint, save_checkpoint

STAGE = "bucket-async"
COMMON = [
    "--stage",
    STAGE,
    "--steps",
    "6",
    "--save-every",
    "3",
    "--no-profile",
    *SMALL_RUN,
    "--seed",
    "3",
    "--hook",
    "powersgd",
    "--powersgd-start-iter",
    "2",
    "--timeout",
    "30",
]


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def die_during_second_save(cfg, stage, data, folder, note):
    """train_rank, but rank 0 SIGKILLs itself half-way through writing its second checkpoint."""
    import minddp.train.checkpoint as ckpt

    saves = []

    def write_half_then_die(f, data):
        saves.append(1)
        if len(saves) == 2:
            target = os.path.join(cfg.checkpoint_dir, f"{stage}.pt")
            with open(note, "w") as out:  # what the good checkpoint was, just before the crash
                out.write(_sha(target))
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        f.write(data)

    ckpt._write_all = write_half_then_die
    return train.train_rank(cfg, stage, data, folder)


def _rank_share(ckpt: dict, rank: int) -> dict:
    return torch.load(io.BytesIO(ckpt["ranks"][rank]), weights_only=True)  # plain data (see the last tests)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    a, b = tmp / "a", tmp / "b"
    assert train.main(COMMON + ["--checkpoint-dir", str(a), "--summary-json", str(tmp / "a.json")]) == 0
    cfg = train.parse_args(COMMON + ["--checkpoint-dir", str(b)])
    data, backend, run_dir = train.prepare(cfg)
    with pytest.raises(RankError) as crash:
        launch(
            die_during_second_save,
            cfg,
            STAGE,
            data,
            run_dir,
            str(tmp / "sha"),
            world_size=2,
            backend=backend,
            timeout_s=cfg.timeout,
        )
    survived = {
        "sha_before": (tmp / "sha").read_text(),
        "sha_after": _sha(b / f"{STAGE}.pt"),
        "litter": sorted(os.listdir(b)),
        "crash": crash.value,
    }
    survived["step"] = read_checkpoint(str(b / f"{STAGE}.pt"))["step"]
    assert (
        train.main(
            COMMON
            + ["--checkpoint-dir", str(b), "--resume", str(b / f"{STAGE}.pt"), "--summary-json", str(tmp / "c.json")]
        )
        == 0
    )
    survived["after_resume"] = sorted(os.listdir(b))
    return {
        "tmp": tmp,
        "a": a,
        "b": b,
        "survived": survived,
        "losses": {k: json.loads((tmp / f"{k}.json").read_text())["stages"][STAGE]["losses"] for k in "ac"},
    }


def test_crash_during_a_save_leaves_the_previous_checkpoint_intact(runs):
    s = runs["survived"]
    assert s["crash"].rank == 0 and s["crash"].exc_type == "ProcessDied" and s["crash"].step == 5
    assert s["sha_after"] == s["sha_before"] and s["step"] == 3
    # the half-written temporary file is all the crash left; it sits beside the good file, never over it
    assert s["litter"][0].startswith(f".{STAGE}.pt.tmp-") and s["litter"][1:] == [f"{STAGE}.pt"]
    # and the next save (the resumed run's) removed it: its writer is gone
    assert s["after_resume"] == [f"{STAGE}.pt"]


def test_a_save_removes_only_the_temporaries_whose_writer_is_gone(tmp_path):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(gone.stdout), os.getppid()  # a pid that exited, one that runs
    path = tmp_path / "x.pt"
    for pid in (dead_pid, live_pid):
        (tmp_path / f".x.pt.tmp-{pid}").write_bytes(b"half")
    (tmp_path / ".other.pt.tmp-1").write_bytes(b"not ours")  # another checkpoint's: left alone
    atomic_write(b"new", str(path))
    assert sorted(os.listdir(tmp_path)) == [".other.pt.tmp-1", f".x.pt.tmp-{live_pid}", "x.pt"]


def test_resumed_run_equals_the_uninterrupted_one_bitwise(runs):
    assert runs["losses"]["c"] == runs["losses"]["a"] and len(runs["losses"]["a"]) == 6
    a = read_checkpoint(str(runs["a"] / f"{STAGE}.pt"))
    c = read_checkpoint(str(runs["b"] / f"{STAGE}.pt"))
    assert a["step"] == c["step"] == 6
    assert a["model"].keys() == c["model"].keys()
    assert all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    sa, sc = a["optimizer"]["state"], c["optimizer"]["state"]
    assert sa.keys() == sc.keys() and all(torch.equal(sa[i][k], sc[i][k]) for i in sa for k in sa[i])
    for rank in (0, 1):
        ha, hc = _rank_share(a, rank)["hook_state"], _rank_share(c, rank)["hook_state"]
        assert ha["iter"] == hc["iter"] == 6 and ha["error_dict"]  # PowerSGD was compressing
        for memory in ("error_dict", "p_memory_dict", "q_memory_dict"):
            assert ha[memory].keys() == hc[memory].keys()
            assert all(torch.equal(ha[memory][k], hc[memory][k]) for k in ha[memory])
        assert ha["rng"] == hc["rng"]  # PowerSGD's numpy generator, as plain values
        ra, rc = _rank_share(a, rank)["rng"], _rank_share(c, rank)["rng"]
        assert torch.equal(ra["torch"], rc["torch"]) and ra["numpy"] == rc["numpy"]


@pytest.mark.parametrize(
    "extra, cause",
    [
        (["--world-size", "3", "--global-batch-size", "24", "--batch-size", "4"], "saved by 2 ranks, this run has 3"),
        (["--hook", "allreduce"], "--hook 'powersgd' there, 'allreduce' here"),
        (["--seed", "4"], "--seed 3 there, 4 here"),
        (["--steps", "3"], "is at step 6 already; give --steps above 6"),
        (["--stage", "all"], "pick that --stage instead of 'all'"),
        (["--stage", "ddp"], "--stage 'bucket-async' there, 'ddp' here"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused_in_one_line_before_any_rank(runs, extra, cause, capsys, monkeypatch):
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    argv = COMMON + ["--resume", str(runs["a"] / f"{STAGE}.pt")]
    for i in range(0, len(extra), 2):  # later options win in argparse; drop the old value for clarity
        if extra[i] in argv:
            j = argv.index(extra[i])
            del argv[j : j + 2]
    assert train.main(argv + extra) == 2
    usage_error(capsys.readouterr().err, "train", cause)


@pytest.mark.parametrize("content", [b"\x93NUMPY random bytes \x00\xff" * 40, b'{"step": 3, "model": "json"}'])
def test_a_resume_file_that_is_no_checkpoint_is_one_line_before_any_rank(content, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(content)
    assert train.main(COMMON + ["--resume", str(bad), "--checkpoint-dir", str(tmp_path)]) == 2
    usage_error(capsys.readouterr().err, "train", "is not a checkpoint (not a file torch.save wrote")


def test_resume_checks_the_model_up_front_when_the_same_data_path_now_builds_another(tmp_path, capsys, monkeypatch):
    # The offline model's vocabulary comes from the data: the same --dataset path with new words builds a
    # larger embedding. Before, the ranks found out (exit 1); now the parent does, before starting any.
    data = tmp_path / "pairs.csv"
    rows = [f"{a} met {b},{b} met {a},{int(a < b)}" for a in "abcdefgh" for b in "abcdefgh"]
    data.write_text("sentence1,sentence2,label\n" + "\n".join(rows) + "\n")
    argv = [
        "--stage",
        STAGE,
        "--dataset",
        str(data),
        "--steps",
        "3",
        "--save-every",
        "2",
        "--no-profile",
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--max-seq-len",
        "16",
        "--eval-examples",
        "4",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--timeout",
        "30",
    ]
    assert train.main(argv) == 0  # a single CSV file is a data set (10% held out)
    with open(data, "a") as f:
        f.write("\n".join(f"zebra{i} quokka{i},yak{i},1" for i in range(20)) + "\n")
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    capsys.readouterr()
    assert train.main(argv + ["--resume", str(tmp_path / "ck" / f"{STAGE}.pt"), "--steps", "4"]) == 2
    usage_error(capsys.readouterr().err, "train", "holds another model: 'model.embed_tokens.weight' is")


def test_corrupt_truncated_foreign_and_other_model_files_are_refused(runs, tmp_path):
    good = runs["a"] / f"{STAGE}.pt"
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 3])
    with pytest.raises(CheckpointError, match="corrupt or truncated.*resume from an earlier checkpoint"):
        read_checkpoint(str(truncated))
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(2)}, foreign)
    with pytest.raises(CheckpointError, match="not a minddp checkpoint"):
        read_checkpoint(str(foreign))
    config = read_checkpoint(str(good))["config"]
    with pytest.raises(CheckpointError, match="holds another model: entries only in the checkpoint"):
        load_checkpoint(str(good), model=nn.Linear(2, 2), config=config)


def test_an_exception_during_a_write_keeps_the_old_file_and_leaves_no_litter(tmp_path, monkeypatch):
    import minddp.train.checkpoint as ckpt

    path = tmp_path / "x.pt"
    atomic_write(b"old and good", str(path))

    def fail_half_way(f, data):
        f.write(data[:3])
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_all", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(b"new", str(path))
    assert path.read_bytes() == b"old and good" and os.listdir(tmp_path) == ["x.pt"]


def save_and_load_on_ranks(path):
    """save_checkpoint in a 2-rank group: rank 0 writes once, every rank gets its own share back."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + dist.get_rank())  # per-rank RNG stream to get back
    save_checkpoint(
        path, model=model, optimizer=opt, step=7, config={"world_size": 2}, extra={"losses": [float(dist.get_rank())]}
    )
    expected = torch.rand(3)
    torch.manual_seed(999)
    ckpt = load_checkpoint(path, model=model, config={"world_size": 2}, rank=dist.get_rank())
    from minddp.train.checkpoint import restore

    restore(ckpt, optimizer=opt)
    return ckpt["step"], ckpt["rank"]["losses"], torch.equal(torch.rand(3), expected)


def test_save_gathers_every_ranks_share_and_restores_its_rng(tmp_path):
    path = str(tmp_path / "two.pt")
    out = launch(save_and_load_on_ranks, path, world_size=2, timeout_s=30)
    assert out == [(7, [0.0], True), (7, [1.0], True)]


# -- a checkpoint is data: a crafted one never runs ---------------------------------------------------------


class RunsWhenUnpickled:
    """What a crafted checkpoint carries: unpickled with code allowed, it creates the folder ``path``.

    That folder is the oracle: had anything in the file run, it would exist.
    """

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _save_alone(state: dict, folder) -> None:
    """``dcp.save`` in this process, without a group (torch 2.6 takes no ``no_dist`` and assumes it)."""
    import inspect
    import warnings

    import torch.distributed.checkpoint as dcp

    kwargs = {"no_dist": True} if "no_dist" in inspect.signature(dcp.save).parameters else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder), **kwargs)


def _crafted(kind: str, tmp_path, runs) -> tuple[str, list[str]]:
    """A crafted --resume path of ``kind`` and the command's stage options; its code would create tmp/ran."""
    from minddp.train import sharded_checkpoint

    code = RunsWhenUnpickled(tmp_path / "ran")
    if kind == "whole file":  # the payload is the file torch.load reads
        path = tmp_path / "crafted.pt"
        torch.save({"format": "minddp-checkpoint/2", "step": 3, "model": code}, path)
        return str(path), COMMON
    if kind == "a rank's share":  # a real checkpoint, one rank's share swapped: read in the launcher by check_contents
        real = torch.load(runs["a"] / f"{STAGE}.pt", weights_only=True)
        share = io.BytesIO()
        torch.save({"rng": code, "hook_state": None, "losses": []}, share)
        real["ranks"][1] = share.getvalue()
        torch.save(real, tmp_path / "swapped.pt")
        return str(tmp_path / "swapped.pt"), COMMON
    folder = tmp_path / "zero1"
    sharded = ["--stage", "zero1", "--steps", "6", "--no-profile", *SMALL_RUN]
    meta = {"format": sharded_checkpoint.FORMAT, "step": 3, "config": {}, "world_size": 1}
    if kind == "sharded .metadata":  # DCP's own index of the folder, a pickle DCP reads with pickle.load
        folder.mkdir()
        (folder / ".metadata").write_bytes(pickle.dumps(code))
    else:  # a value DCP stores with torch.save and reads with torch.load(weights_only=False)
        _save_alone({"model": {"w": torch.ones(2)}, "ranks": {"0": code}}, folder)
    (folder / sharded_checkpoint.META).write_text(json.dumps(meta))
    return str(folder), sharded


@pytest.mark.parametrize("kind", ["whole file", "a rank's share", "sharded .metadata", "sharded value"])
def test_a_crafted_checkpoint_never_runs_and_is_refused_in_one_line_before_any_rank(
    kind, runs, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    path, argv = _crafted(kind, tmp_path, runs)
    assert train.main(argv + ["--resume", path, "--checkpoint-dir", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "ran").exists()  # the oracle: its code would have made this folder
    error = usage_error(
        capsys.readouterr().err, "train", "was refused unread (nothing in it ran): it names posix.mkdir"
    )
    assert error.endswith(("--save-every", "--save-every with a sharded stage")), error  # and the fix


def test_a_raw_pickle_is_refused_by_its_format_before_it_is_read(tmp_path, capsys, monkeypatch):
    # Not a zip archive: never handed to an unpickler at all.
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(RunsWhenUnpickled(tmp_path / "ran")))
    assert train.main(COMMON + ["--resume", str(raw), "--checkpoint-dir", str(tmp_path)]) == 2
    assert not (tmp_path / "ran").exists()
    usage_error(capsys.readouterr().err, "train", "is not a checkpoint (not a file torch.save wrote: no zip archive)")


def test_every_part_of_a_real_checkpoint_is_plain_data(runs):
    # What makes the data-only reading possible: the file, and every rank's share (RNG states, PowerSGD's memory
    # and its numpy generator), load with torch's weights_only reader and nothing added to its list of globals.
    ckpt = torch.load(runs["a"] / f"{STAGE}.pt", weights_only=True)
    shares = [torch.load(io.BytesIO(b), weights_only=True) for b in ckpt["ranks"]]
    assert all(share["hook_state"] is not None and "numpy" in share["rng"] for share in shares)


#: Where the package unpickles with code allowed, and why no one but its own processes can write what it reads
#: there: each reads what a parent and the processes it started send each other through pipes.
TRUSTED_CHANNELS = {
    ("minddp/runtime/launch.py", "pickle.loads"): "the function and arguments, from the launcher's process arguments",
    ("minddp/runtime/launch.py", "torch.load"): "a rank's result, through its own pipe",
    ("minddp/runtime/processes.py", "pickle.loads"): "a child's messages, through its own pipe (ChildPipes.mailbox)",
    ("minddp/ft/launch.py", "pickle.loads"): "the task, from the ft launcher's process arguments",
    ("minddp/notebook/worker.py", "pickle.loads"): "a cell's function (cloudpickle), through the kernel's queue",
    ("minddp/notebook/cluster.py", "torch.load"): "a cell's value, through a rank's queue",
    ("minddp/exercises/lost_rank.py", "cloudpickle.loads"): "a learner's shard function, in the ft launcher's task",
}


def test_nothing_in_the_package_unpickles_with_code_allowed_but_its_own_pipes():
    # The oracle is the source itself: every call that unpickles with code allowed (pickle.load/loads,
    # cloudpickle's, torch.load without weights_only=True, numpy's allow_pickle, pandas' read_pickle) is one of
    # the channels above. A new one fails here until it reads as data or is shown to be such a channel.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = set()
    for path in sorted((root / "minddp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            name = f"{owner}.{node.func.attr}"
            kwargs = {k.arg: k.value for k in node.keywords}
            weights_only = kwargs.get("weights_only")
            unsafe = (
                name in ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "pd.read_pickle")
                or (name == "torch.load" and not (isinstance(weights_only, ast.Constant) and weights_only.value))
                or (
                    node.func.attr == "load"
                    and isinstance(kwargs.get("allow_pickle"), ast.Constant)
                    and kwargs["allow_pickle"].value
                )
            )
            if unsafe:
                found.add((str(path.relative_to(root)), name))
    assert found == set(TRUSTED_CHANNELS), sorted(found ^ set(TRUSTED_CHANNELS))
