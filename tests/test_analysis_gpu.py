"""The GPU path returns HolisticTraceAnalysis's own numbers, in the CPU path's columns."""

import contextlib
import io
import shutil
from pathlib import Path

import pytest
from analysis_fixtures import half_covered_step, write_stage

from minddp.analysis import SUMMARY_COLUMNS, analyze_run

GPU_TRACES = Path(__file__).resolve().parent / "data" / "hta-gpu-traces"  # HTA's sample, copied (its README)


def test_gpu_trace_gives_htas_numbers_in_the_cpu_columns(tmp_path):
    # HTA called directly, the way the blog does, on a folder of the two rank traces
    direct = tmp_path / "direct"
    direct.mkdir()
    for r in (0, 1):
        shutil.copy(GPU_TRACES / f"sampled_rank-{r}.json.gz", direct)
    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        hta = TraceAnalysis(trace_dir=str(direct))
        temporal = hta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = hta.get_comm_comp_overlap(visualize=False).set_index("rank")
        kernels, _ = hta.get_gpu_kernel_breakdown(visualize=False)

    # the same traces laid out as a minddp run (config.json beside them, which HTA must not see)
    stage = tmp_path / "gpurun" / "bucket"
    stage.mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(GPU_TRACES / f"sampled_rank-{r}.json.gz", stage / f"rank{r}.pt.trace.json.gz")
    (stage / "config.json").write_text('{"stage": "bucket", "world_size": 2, "run_name": "gpurun"}')
    result = analyze_run(stage.parent)

    summary = result.summary.set_index("rank")
    assert set(summary["device"]) == {"gpu"} and set(summary["source"]) == {"hta"}
    for rank in (0, 1):
        row = summary.loc[rank]
        assert row["total_time_us"] == temporal.loc[rank, "kernel_time(us)"]
        assert row["compute_time_us"] == temporal.loc[rank, "compute_time(us)"]
        assert row["non_compute_time_us"] == temporal.loc[rank, "non_compute_time(us)"]
        assert row["idle_time_us"] == temporal.loc[rank, "idle_time(us)"]
        assert row["idle_pctg"] == temporal.loc[rank, "idle_time_pctg"]
        assert row["comm_comp_overlap_pctg"] == overlap.loc[rank, "comp_comm_overlap_pctg"]
        # per-step numbers come from the trace: both ranks profiled 2 steps with all_reduces in them
        assert row["steps"] == 2 and row["allreduce_calls_per_step"] > 0 and row["allreduce_bytes_per_step"] > 0
        assert 0 < row["comm_time_per_step_us"] < row["step_time_us"]
    assert list(result.kernels["kernel_type"]) == list(kernels["kernel_type"])
    assert list(result.kernels["sum"]) == pytest.approx(list(kernels["sum"]))

    # the CPU path fills exactly the same columns
    cpu_run = write_stage(tmp_path / "cpurun" / "bucket", {0: half_covered_step(), 1: half_covered_step(1)}).parent
    cpu = analyze_run(cpu_run)
    assert list(cpu.summary.columns) == list(result.summary.columns) == SUMMARY_COLUMNS
    assert list(cpu.stages.columns) == list(result.stages.columns)
    assert not result.summary[SUMMARY_COLUMNS[5:]].isna().any().any()


def test_hta_cannot_analyse_a_cpu_trace(tmp_path):
    """Why the CPU path exists: HTA itself fails on a CPU trace (if this starts passing, revisit routing)."""
    folder = tmp_path / "cpu"
    write_stage(folder, {0: half_covered_step()})
    (folder / "rank0.pt.trace.json").rename(folder / "rank0.json")
    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(Exception):
            TraceAnalysis(trace_dir=str(folder)).get_temporal_breakdown(visualize=False)


def test_ranks_sharing_a_gpu_count_gloo_host_transfers_as_communication():
    """Ranks sharing a GPU talk over gloo (docs/devices.md): no NCCL kernel, the messages are gloo's host
    ranges. minddp's GPU reading counts them as communication, so overlap is measured, not NaN."""
    from minddp.analysis import gpu
    from minddp.analysis.events import RankTrace
    from minddp.analysis.metrics import overlap_pct

    events = [
        {"name": "ProfilerStep#1", "ph": "X", "ts": 0.0, "dur": 100.0, "tid": 1, "cat": "user_annotation"},
        {"name": "ampere_sgemm", "ph": "X", "ts": 10.0, "dur": 40.0, "tid": 7, "cat": "kernel"},
        {
            "name": "gloo:all_reduce",
            "ph": "X",
            "ts": 30.0,
            "dur": 40.0,
            "tid": 2,
            "cat": "cpu_op",
            "args": {"Input Dims": [[256]], "Input type": ["float"]},
        },
    ]
    trace = RankTrace(rank=0, path=Path("rank0.pt.trace.json"), events=events)
    assert gpu.is_gpu_trace(trace)
    iv = gpu.rank_intervals(trace)
    assert iv.comm == [(30.0, 70.0)] and iv.compute == [(10.0, 50.0)]
    assert [e["name"] for e in iv.allreduces] == ["gloo:all_reduce"]
    assert overlap_pct(iv.comm, iv.compute) == 50.0  # 20 of the message's 40 us under the kernel
