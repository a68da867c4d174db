"""Any folder of per-rank profiler traces reads, not only the train command's: each file's rank from its contents
(``distributedInfo``, what torch records and HTA reads) or its name, GPU traces through HTA, and ``--compare``.

The oracles: HolisticTraceAnalysis itself on HTA's own sample folder (two ranks of a real NCCL job,
``tests/data/hta-gpu-traces``), the rank each file's JSON names, and a torch DDP job profiled the way torch's
docs show (``tensorboard_trace_handler``: files named after host and pid, no rank in the name), whose ranks
and collectives are known.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from analysis_fixtures import half_covered_step, write_trace
from cli_checks import usage_error

from minddp import launch
from minddp.analysis import analyze_run
from minddp.analysis.__main__ import main
from minddp.analysis.events import TraceError, load_run, rank_files

SAMPLE = Path(__file__).resolve().parent / "data" / "hta-gpu-traces"


def recorded_rank(path: Path) -> int:
    return json.loads(gzip.open(path).read())["distributedInfo"]["rank"]


@pytest.fixture(scope="module")
def sample():
    """HTA on the sample folder as the blog calls it (the numbers minddp must give back), and minddp's reading."""
    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        hta = TraceAnalysis(trace_dir=str(SAMPLE))
        temporal = hta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = hta.get_comm_comp_overlap(visualize=False).set_index("rank")
    return temporal, overlap, analyze_run(SAMPLE)


def test_a_folder_of_htas_own_traces_reads_through_hta_with_htas_numbers(sample):
    temporal, overlap, result = sample
    files = rank_files(SAMPLE)
    assert {r: recorded_rank(p) for r, p in files.items()} == {0: 0, 1: 1}  # the ranks their JSON names
    assert result.run == "hta-gpu-traces" and list(result.stages.index) == ["hta-gpu-traces"]
    summary = result.summary.set_index("rank")
    assert set(summary["source"]) == {"hta"}
    for rank in (0, 1):
        assert summary.loc[rank, "idle_time_us"] == temporal.loc[rank, "idle_time(us)"]
        assert summary.loc[rank, "comm_comp_overlap_pctg"] == overlap.loc[rank, "comp_comm_overlap_pctg"]


def test_the_rank_comes_from_the_trace_not_from_the_order_of_names(tmp_path):
    # rank 1's trace under a name that sorts first, rank 0's under one that sorts last, neither naming a rank
    shutil.copy(SAMPLE / "sampled_rank-1.json.gz", tmp_path / "a.json.gz")
    shutil.copy(SAMPLE / "sampled_rank-0.json.gz", tmp_path / "z.json.gz")
    (tmp_path / "notes.json").write_text('{"what": "not a trace"}')  # other JSON beside them is left alone
    assert rank_files(tmp_path) == {0: tmp_path / "z.json.gz", 1: tmp_path / "a.json.gz"}


def test_without_distributed_info_the_rank_comes_from_the_name(tmp_path):
    write_trace(tmp_path / "worker_rank3.json", half_covered_step())
    write_trace(tmp_path / "worker_rank-2.json", half_covered_step(1))
    write_trace(tmp_path / "other.txt", half_covered_step())  # not .json: not read
    assert rank_files(tmp_path) == {2: tmp_path / "worker_rank-2.json", 3: tmp_path / "worker_rank3.json"}


def test_one_unnamed_trace_is_rank_0_and_what_cannot_be_told_apart_is_refused(tmp_path):
    one = tmp_path / "one"
    write_trace(one / "trace.json", half_covered_step())
    assert rank_files(one) == {0: one / "trace.json"}
    two = tmp_path / "two"
    write_trace(two / "a.json", half_covered_step())
    write_trace(two / "b.json", half_covered_step())
    with pytest.raises(TraceError, match="cannot tell which rank .*a.json.* rename each trace rank<N>.json"):
        rank_files(two)
    same = tmp_path / "same"
    shutil.copy(SAMPLE / "sampled_rank-0.json.gz", same.mkdir() or same / "first.json.gz")
    shutil.copy(SAMPLE / "sampled_rank-0.json.gz", same / "second.json.gz")
    with pytest.raises(TraceError, match=r"two traces of rank 0 \(first.json.gz, second.json.gz\)"):
        rank_files(same)


def test_a_folder_whose_traces_lie_deeper_is_told_where(tmp_path, capsys):
    shutil.copytree(SAMPLE, tmp_path / "report" / "traces" / "gpu")
    assert main([str(tmp_path / "report")]) == 2
    usage_error(capsys.readouterr().err, "analyze", f"the traces lie deeper, in {tmp_path / 'report' / 'traces'}")


def _profiled_torch_ddp(folder: str) -> tuple[int, int]:
    """A user's own torch DDP job, profiled as torch's docs show (with shapes): 1 warm-up step, 2 recorded."""
    from torch.profiler import profile, schedule, tensorboard_trace_handler

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 8))
    handler = tensorboard_trace_handler(folder, use_gzip=True)
    with profile(
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1), on_trace_ready=handler, record_shapes=True
    ) as prof:
        for _ in range(3):
            model(torch.randn(4, 32)).sum().backward()
            prof.step()
    return dist.get_rank(), sum(p.numel() for p in model.parameters())


def test_a_users_own_torch_ddp_traces_read_with_their_ranks_and_collectives(tmp_path):
    folder = tmp_path / "my_ddp"
    per_rank = launch(_profiled_torch_ddp, str(folder), world_size=2)
    numel = per_rank[0][1]
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and not any("rank" in n for n in names), names  # host_pid.time.pt.trace.json.gz
    files = rank_files(folder)
    assert sorted(files) == [0, 1] and {recorded_rank(p) for p in files.values()} == {0, 1}
    stages = analyze_run(folder).stages
    # one bucket (torch's 25 MiB cap holds the whole model): one all_reduce of every parameter per step
    assert stages.loc["my_ddp", "steps"] == 2
    assert stages.loc["my_ddp", "allreduce_calls_per_step"] == 1
    assert stages.loc["my_ddp", "allreduce_bytes_per_step"] == numel * 4


def test_compare_takes_two_folders_of_traces_as_one_row(tmp_path, sample):
    from minddp.analysis import compare_runs
    from minddp.analysis.__main__ import one_row

    _, overlap, sample_result = sample
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    write_trace(mine / "rank0.json", half_covered_step())  # by hand: overlap 50 %
    write_trace(theirs / "trace.json", half_covered_step())
    assert main(["--compare", str(mine), str(theirs)]) == 0
    table = compare_runs(*one_row([sample_result, analyze_run(mine)]))
    assert list(table.index) == ["traces"]  # the runs are the folders, each one stage: one row
    row = table.loc["traces", "comm_comp_overlap_pctg"]
    assert row["hta-gpu-traces"] == overlap["comp_comm_overlap_pctg"].mean() and row["mine"] == 50.0
    stages = [analyze_run(mine), analyze_run(theirs)]
    for result, name in zip(stages, ("ddp", "bucket")):  # two stages of train runs: named by both
        result.stages.rename(index={"theirs": name, "mine": name}, inplace=True)
        result.summary["stage"] = name
    assert list(compare_runs(*one_row(stages)).index) == ["ddp vs bucket"]


def test_a_train_runs_stage_folder_keeps_its_names(tmp_path):
    stage = tmp_path / "demo" / "bucket"
    for r in (0, 1):
        write_trace(stage / f"rank{r}.pt.trace.json", half_covered_step(r))
    (stage / "config.json").write_text('{"stage": "bucket", "world_size": 2}')
    for path in (stage, stage.parent):
        run = load_run(path)
        assert (run.name, list(run.stages)) == ("demo", ["bucket"])


def _compute_only_rank0_with_a_negative_copy(folder: Path) -> Path:
    """HTA's sample, its rank 0 left with compute kernels and one copy of negative duration after them: a trace
    HTA 0.5.0's temporal breakdown rejects (non-compute time below 0), as it rejected the first GPU run's."""
    folder.mkdir()
    for path in sorted(SAMPLE.glob("*.json.gz")):
        trace = json.loads(gzip.open(path).read())
        if recorded_rank(path) == 0:
            kept = [
                e
                for e in trace["traceEvents"]
                if e.get("cat") not in ("gpu_memcpy", "gpu_memset")
                and not (e.get("cat") == "kernel" and "nccl" in e["name"].lower())
            ]
            kernels = [e for e in kept if e.get("cat") == "kernel"]
            end = max(e["ts"] + e["dur"] for e in kernels)  # the copy: the last kernel recorded, moved past them all
            copy = dict(kernels[-1], cat="gpu_memcpy", name="Memcpy DtoD (Device -> Device)", ts=end + 100, dur=-50)
            trace["traceEvents"] = [*kept, copy]
        (folder / path.name[: -len(".gz")]).write_text(json.dumps(trace))
    return folder


def test_a_view_hta_fails_on_leaves_its_columns_empty_says_why_and_the_rest_still_reads(tmp_path):
    from hta.trace_analysis import TraceAnalysis

    from minddp.analysis.gpu import HTAViewFailed

    folder = _compute_only_rank0_with_a_negative_copy(tmp_path / "odd")
    with contextlib.redirect_stdout(io.StringIO()):
        hta = TraceAnalysis(trace_files={recorded_rank_json(p): str(p) for p in folder.glob("*.json")})
        with pytest.raises(AssertionError):  # HTA itself: the failure minddp must survive
            hta.get_temporal_breakdown(visualize=False)
        overlap = hta.get_comm_comp_overlap(visualize=False).set_index("rank")
    with pytest.warns(HTAViewFailed) as caught:
        result = analyze_run(folder)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, HTAViewFailed)]
    assert "get_temporal_breakdown failed" in message and "AssertionError" in message
    assert "rank 0: 1 GPU event(s) of negative or missing duration" in message
    summary = result.summary.set_index("rank")
    assert summary[["idle_time_us", "compute_pctg", "non_compute_pctg"]].isna().all().all()
    ours, htas = summary["comm_comp_overlap_pctg"], overlap["comp_comm_overlap_pctg"]
    assert ours.loc[0] != ours.loc[0] and htas.loc[0] != htas.loc[0]  # NaN for both: rank 0 kept no NCCL kernel
    assert ours.loc[1] == htas.loc[1]  # the views HTA could compute are HTA's numbers
    assert (
        summary.loc[1, "allreduce_calls_per_step"]
        == analyze_run(SAMPLE).summary.set_index("rank").loc[1, "allreduce_calls_per_step"]
    )  # minddp's per-step reading of the untouched rank is unchanged
    assert not result.kernels.empty  # the kernel breakdown still came


H200 = Path(__file__).resolve().parent / "data" / "h200-ddp-1rank"


def test_a_breakdown_htas_rounding_breaks_is_read_again_with_htas_own_switch_and_says_so(monkeypatch):
    """A real H200 trace whose sub-microsecond kernels HTA 0.5.0's rounding makes negative (its README).
    Oracles: HTA itself, failing by default and reading the same file with its switch on."""
    from hta.trace_analysis import TraceAnalysis

    from minddp.analysis.gpu import NS_ROUNDING_OFF, HTAViewFailed, HTAViewReadAgain, rounded_negative

    trace = load_run(H200).stages["ddp"].ranks[0]
    files = {0: str(trace.path.resolve())}
    monkeypatch.delenv(NS_ROUNDING_OFF, raising=False)
    with contextlib.redirect_stdout(io.StringIO()):
        hta = TraceAnalysis(trace_files=files)
        with pytest.raises(AssertionError):  # HTA itself, as HTA reads by default
            hta.get_temporal_breakdown(visualize=False)
        frame = hta.t.traces[0]
        negative = frame[frame["stream"].ne(-1) & frame["dur"].lt(0)]
        names = hta.t.symbol_table.get_sym_table()
        monkeypatch.setenv(NS_ROUNDING_OFF, "1")
        expected = TraceAnalysis(trace_files=files).get_temporal_breakdown(visualize=False).iloc[0]
        monkeypatch.delenv(NS_ROUNDING_OFF)
    # every kernel HTA's parse left with a negative duration is one rounded_negative names, by name and count
    # (HTA keeps fewer: it drops the last profiled step; it also moves its times, so they are not compared)
    ours = Counter(e["name"] for e in rounded_negative(trace))
    htas = Counter(names[n] for n in negative["name"])
    assert len(negative) > 0 and not htas - ours
    with pytest.warns(HTAViewReadAgain) as caught:
        row = analyze_run(H200).summary.set_index("rank").loc[0]
    assert not [w for w in caught if issubclass(w.category, HTAViewFailed)]
    (message,) = [str(w.message) for w in caught if w.category is HTAViewReadAgain]
    assert f"rank 0: {ours.total()} GPU event(s) under 1 us" in message and f"{NS_ROUNDING_OFF}=1" in message
    assert NS_ROUNDING_OFF not in __import__("os").environ  # put back as it was
    # the numbers are HTA's own, read with its switch
    assert row["idle_time_us"] == expected["idle_time(us)"]
    assert row["compute_time_us"] == expected["compute_time(us)"]
    assert row["non_compute_time_us"] == expected["non_compute_time(us)"]


def recorded_rank_json(path: Path) -> int:
    return json.loads(path.read_text())["distributedInfo"]["rank"]
