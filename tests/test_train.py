"""``python -m minddp.train`` end to end: every stage, traces, real-data path, torchrun, bad input.

Oracles: ``single`` (one process on the global batch) for the loss curve of a
distributed stage; the ``--world-size 2`` run for the torchrun run; the
trace files themselves (parsed) for what was profiled.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import SMALL_RUN, refused_before_any_rank, usage_error
from processes import run_torchrun, torchrun_args

from minddp.train import run as train
from minddp.train.config import stage_choices
from minddp.train.data import ShardSampler

FIXTURE = str(Path(__file__).parent / "data" / "mrpc_tiny")
TINY = [
    *SMALL_RUN,
    "--seed",
    "3",
]


def _run(argv, tmp_path, name) -> dict:
    out = tmp_path / f"{name}.json"
    rc = train.main(argv + ["--summary-json", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def _trace_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory):
    """The on-disk MRPC-schema data set, trained by `single` and by `bucket-async` on 2 ranks."""
    tmp = tmp_path_factory.mktemp("fixture_runs")
    common = ["--dataset", FIXTURE, "--steps", "30", "--no-profile", "--lr", "3e-3", *TINY]
    return {stage: _run(["--stage", stage, *common], tmp, stage) for stage in ("single", "bucket-async")}, common


def test_every_stage_end_to_end_writes_traces_and_config(tmp_path):
    summary = _run(
        [
            "--stage",
            "all",
            "--steps",
            "3",
            "--profile-steps",
            "1",
            "--trace-dir",
            str(tmp_path),
            "--run-name",
            "all",
            "--trace-gzip",
            "--analyze",
            "--bucket-cap-mb",  # the bucketed stages take it, the others are built without it
            "4",
            *TINY,
        ],
        tmp_path,
        "all",
    )
    expected = [s for s in stage_choices() if s != "all"]
    assert sorted(summary["stages"]) == sorted(expected)
    for stage in expected:
        folder = tmp_path / "all" / stage
        config = json.loads((folder / "config.json").read_text())
        assert config["stage"] == stage and config["steps"] == 3
        ranks = [0] if stage == "single" else [0, 1]
        assert sorted(p.name for p in folder.glob("rank*.pt.trace.json.gz")) == [
            f"rank{r}.pt.trace.json.gz" for r in ranks
        ]
        for r in ranks:
            names = {e.get("name", "") for e in _trace_events(str(folder / f"rank{r}.pt.trace.json.gz"))}
            assert any(n.startswith("minddp.train_step#") for n in names), (stage, r)
            has_all_reduce = any("all_reduce" in n or "allreduce" in n for n in names)
            assert has_all_reduce == (stage != "single"), (stage, r)
            # every minddp stage's buckets in the named ranges the analysis reads, named after the hook it sends
            # through (the teaching stages' wrapped in them by the ladder; ddp, zero2 and fsdp name their own)
            launched = {n.rpartition(" hook=")[2] for n in names if n.startswith("minddp.bucket_launch#")}
            hook = "reduce_scatter_hook" if stage in ("zero2", "fsdp") else "allreduce_hook"
            assert launched == (set() if stage in ("single", "torch") else {hook}), (stage, r, launched)
        s = summary["stages"][stage]
        assert 0.0 <= s["accuracy"] <= 1.0 and len(s["losses"]) == 3
        # every stage's metrics file: each step's loss as the summary has it, the held-out measurement at the end
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert [line["loss"] for line in lines if line["kind"] == "step"] == s["losses"]
        assert [(e["step"], e["accuracy"]) for e in lines if e["kind"] == "eval"] == [(3, s["accuracy"])]
    assert (tmp_path / "all" / "summary.json").exists()
    # --analyze ran on this very run; the call counts it reads from the traces follow the stages' designs
    # (the timing relations are asserted in tests/test_analysis_stages.py on a larger model).
    from minddp.analysis import analyze_run

    table = analyze_run(tmp_path / "all").stages
    calls = table["allreduce_calls_per_step"]
    assert calls["single"] == 0
    assert calls["bucket"] < calls["hook"] / 3 and calls["bucket-async"] == calls["bucket"]
    assert calls["ga"] == calls["hook"] == calls["hook-async"]
    # simple has no no_sync(): it syncs after each of the 2 micro-batches, which is what ga saves
    assert calls["simple"] == 2 * calls["ga"]
    # the gradient's bytes: all_reduced, or reduce-scattered by the sharded stages (all_reduces on gloo, counted
    # as reduce-scatters from their launch ranges)
    nbytes = table["allreduce_bytes_per_step"] + table["reducescatter_bytes_per_step"]
    assert table.loc["zero2", "allreduce_calls_per_step"] == 0 < table.loc["zero2", "reducescatter_calls_per_step"]
    assert nbytes["ga"] > 0 and nbytes["simple"] == 2 * nbytes["ga"]
    assert all(nbytes[s] == nbytes["ga"] for s in expected if s not in ("single", "simple"))


def test_real_data_path_loss_goes_down_and_matches_single(fixture_runs):
    runs, _ = fixture_runs
    for stage, summary in runs.items():
        assert summary["data_source"] == FIXTURE
        losses = summary["stages"][stage]["losses"]
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < first - 0.05, (stage, first, last)
    single = runs["single"]["stages"]["single"]["losses"]
    ddp = runs["bucket-async"]["stages"]["bucket-async"]["losses"]
    # Same data, seeds and global batch; only float summation order differs, and Adam compounds it.
    assert ddp == pytest.approx(single, rel=1e-3, abs=2e-4)
    # 2 ranks x 4 per micro-batch x 2 micro-batches each step: the global batch `single` trained on.
    assert runs["single"]["stages"]["single"]["all_reduce_calls_per_step"] == 0
    assert runs["bucket-async"]["stages"]["bucket-async"]["all_reduce_calls_per_step"] >= 1


def test_torchrun_matches_world_size_2(fixture_runs, tmp_path):
    runs, common = fixture_runs
    out = tmp_path / "torchrun.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = torchrun_args(
        "-m",
        "minddp.train",
        "--stage",
        "bucket-async",
        *common,
        "--summary-json",
        str(out),
    )
    proc = run_torchrun(args, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world_size"] == 2
    want = runs["bucket-async"]["stages"]["bucket-async"]
    assert got["stages"]["bucket-async"]["losses"] == pytest.approx(want["losses"], rel=1e-5, abs=1e-6)
    assert got["stages"]["bucket-async"]["accuracy"] == pytest.approx(want["accuracy"])


def test_stage_all_under_torchrun_trains_every_stage(tmp_path):
    # One torchrun job runs one launch per stage (an earlier launcher hung on the second).
    out = tmp_path / "all.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = torchrun_args(
        "-m",
        "minddp.train",
        "--stage",
        "all",
        "--steps",
        "2",
        "--no-profile",
        *TINY,
        "--summary-json",
        str(out),
    )
    proc = run_torchrun(args, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert sorted(got["stages"]) == sorted(s for s in stage_choices() if s != "all")
    assert all(len(s["losses"]) == 2 for s in got["stages"].values())


@pytest.mark.parametrize(
    "argv, cause",
    [
        (["--stage", "nope"], "--stage"),
        (["--stage", "ddp,nope"], "unknown stage nope"),
        (["--stage", "all,ddp"], "'all' already means every stage"),
        (["--hook", "nope"], "--hook"),
        (["--model", "./no/such/model"], "no model folder"),
        (["--dataset", "./no/such/data"], "no such file"),
        (["--world-size", "0"], "--world-size"),
        (["--grad-accum", "0"], "--grad-accum"),
        (["--global-batch-size", "10"], "divisible"),
        (["--global-batch-size", "12", "--batch-size", "4"], "contradicts"),
        (["--steps", "many"], "--steps"),
        (["--analyze", "--no-profile"], "--no-profile"),
        # NaN passes `x <= 0` (every comparison with NaN is false): each number is checked finite first
        (["--lr", "inf"], "argument --lr: 'inf' is not a finite number"),
        (["--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
        (["--lr", "0"], "argument --lr: must be above 0"),
        (["--bucket-cap-mb", "nan"], "argument --bucket-cap-mb: 'nan' is not a finite number"),
        (["--bucket-cap-mb", "inf"], "argument --bucket-cap-mb: 'inf' is not a finite number"),
        (["--timeout", "nan"], "argument --timeout: 'nan' is not a finite number"),
        (["--timeout", "inf"], "argument --timeout: 'inf' is not a finite number"),
        (["--timeout", "1e300"], "argument --timeout: must be at most"),
        (["--hang-timeout", "-1"], "argument --hang-timeout: must be at least 0 (0 = off)"),
        (["--powersgd-min-compression-rate", "nan"], "not a finite number"),
        (["--seed", "-1"], "argument --seed: must be at least 0"),
        (["--profile-steps", "-1"], "argument --profile-steps"),
        (["--eval-examples", "-5"], "argument --eval-examples"),
        (["--save-every", "-1"], "argument --save-every"),
    ],
)
def test_bad_input_is_a_usage_line_and_one_error_line_exit_2_before_any_rank(argv, cause, capsys, monkeypatch):
    refused_before_any_rank(argv, cause, capsys, monkeypatch)


@pytest.mark.parametrize(
    "env, cause",
    [
        ("MINDDP_TIMEOUT", "MINDDP_TIMEOUT='abc' is not a finite number of seconds"),
        ("MINDDP_HANG_TIMEOUT", "MINDDP_HANG_TIMEOUT='abc'"),
    ],
)
def test_a_bad_environment_value_is_named_like_an_option(env, cause):
    proc = subprocess.run(
        [sys.executable, "-m", "minddp.train", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, env: "abc"},
    )
    assert proc.returncode == 2
    usage_error(proc.stderr, "train", cause)


def test_bad_input_from_the_shell_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "minddp.train", "--world-size", "0"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    usage_error(proc.stderr, "train", "--world-size")


def test_shard_sampler_splits_each_global_batch_disjointly():
    n, batch, world = 23, 3, 2
    for epoch in (0, 1):
        shards = []
        for r in range(world):
            s = ShardSampler(n, batch, world, r, seed=5)
            s.set_epoch(epoch)
            shards.append(list(s))
        whole = ShardSampler(n, batch * world, 1, 0, seed=5)
        whole.set_epoch(epoch)
        glob = list(whole)
        assert len(glob) == (n // (batch * world)) * batch * world  # drop-last: 18 of 23
        for b in range(len(shards[0]) // batch):
            per_rank = [set(sh[b * batch : (b + 1) * batch]) for sh in shards]
            assert not per_rank[0] & per_rank[1]
            assert per_rank[0] | per_rank[1] == set(glob[b * batch * world : (b + 1) * batch * world])


def _torch_powersgd_with_two_buckets(signal: str):
    """torch's DDP with its powerSGD_hook, two buckets and more on gloo, with the ranks' order of collectives made
    to differ as it may by chance: torch issues a bucket's first all_reduce from the hook (the thread running backward)
    and its next from a Future callback, and gloo pairs the ranks' collectives by the order each rank issues them.

    In the first compressing step rank 1 issues bucket 0's and bucket 1's first all_reduces before rank 0 issues any
    (rank 0 waits for ``signal``, a file rank 1 writes); then rank 0 waits until bucket 0's callback has issued its
    next all_reduce before it goes on to bucket 1. Rank 0's second collective is then bucket 0's P, rank 1's is
    bucket 1's first: no timing decides it (the waits are for events, not for time)."""
    import threading
    import time

    import torch
    from torch_oracle import cpu_safe_torch_powersgd

    cpu_safe_torch_powersgd()
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch.nn.parallel import DistributedDataParallel

    issued = threading.Condition()
    count = [0]  # all_reduces this rank issued, from any thread
    plain_all_reduce = dist.all_reduce

    def all_reduce(*args, **kwargs):
        work = plain_all_reduce(*args, **kwargs)
        with issued:
            count[0] += 1
            issued.notify_all()
        return work

    dist.all_reduce = all_reduce  # torch's hook calls dist.all_reduce by name
    rank, compressing_calls = dist.get_rank(), [0]

    def hook(state, bucket):
        k = compressing_calls[0] if state.iter >= state.start_powerSGD_iter else None
        compressing_calls[0] += k is not None
        if k == 0 and rank == 0:
            while not Path(signal).exists():  # rank 1 has issued two buckets' first all_reduces
                time.sleep(0.01)
            before = count[0]
        future = torch_psgd.powerSGD_hook(state, bucket)
        if k == 0 and rank == 0:
            with issued:  # bucket 0's first all_reduce and the one its callback issues
                issued.wait_for(lambda: count[0] >= before + 2)
        if k == 1 and rank == 1:
            Path(signal).touch()
        return future

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets in flight
    ddp.register_comm_hook(torch_psgd.PowerSGDState(None, start_powerSGD_iter=2), hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(5):
        ddp(torch.randn(8, 64) * (dist.get_rank() + 1)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_torch_stage_skips_only_hooks_torch_cannot_run_here(tmp_path):
    """The skip reasons are torch's real failures: its powerSGD_hook with several buckets on gloo dies where the ranks'
    collectives are issued in different orders, made certain here (before: left to chance, it could pass by luck)."""
    from minddp import RankError
    from minddp.runtime.launch import launch

    assert train.torch_hook_unavailable("powersgd", "gloo", 0.1).endswith("to compare with it")
    assert train.torch_hook_unavailable("powersgd", "gloo", 25) is None
    assert train.torch_hook_unavailable("fp16", "gloo", 0.1) is None
    assert "NCCL" in train.torch_hook_unavailable("bf16", "gloo", 25)
    with pytest.raises(RankError) as failed:  # the order of the ranks' collectives made to differ (the function's doc)
        launch(_torch_powersgd_with_two_buckets, str(tmp_path / "signal"), world_size=2, timeout_s=10, stall_s=30)
    # gloo's failure (a collective's error, or gloo aborting the process), not a hang of the test's own waits
    assert failed.value.exc_type in ("RuntimeError", "ProcessDied"), str(failed.value)


@pytest.mark.parametrize(
    "name, content, cause",
    [
        ("pairs.txt", b"sentence1,sentence2,label\na,b,1\n", "is a file of a kind minddp cannot read; give a .csv/"),
        (
            "pairs.csv",
            b'sentence1,sentence2,label\n"caf\xe9 au lait",b,1\n',
            "is not UTF-8 text (utf-8 cannot decode byte 0xe9 at position",
        ),
        ("pairs.csv", b"first,second,label\na,b,1\n", "lacks column(s) sentence1, sentence2"),
    ],
)
def test_a_data_file_is_read_or_refused_with_its_reason(name, content, cause, tmp_path, capsys, monkeypatch):
    # Before: one CSV file gave "Couldn't find any data file" (it exists), and non-UTF-8 data hid its cause.
    # A good file trains: tests/test_reliability_checkpoint.py trains on one CSV file.
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    path = tmp_path / name
    path.write_bytes(content)
    assert train.main(["--dataset", str(path), "--steps", "2"]) == 2
    usage_error(capsys.readouterr().err, "train", cause)


def test_a_comma_list_of_stages_runs_those_stages_in_that_order():
    assert train.parse_args(["--stage", "ddp,single,ddp"]).stages() == ["ddp", "single"]
    assert train.parse_args(["--stage", "all"]).stages() == [s for s in stage_choices() if s != "all"]
    with pytest.raises(train.ConfigError, match="--resume continues one stage's run"):
        train.parse_args(["--stage", "ddp,single", "--resume", __file__])
