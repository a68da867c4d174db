"""Bad input: a usage line and one line naming the problem, exit status 2, never a pandas stack trace."""

import gzip
import json

import pytest
import torch
from analysis_fixtures import half_covered_step, write_stage
from cli_checks import usage_error

from minddp import launch
from minddp.analysis.__main__ import main


def _run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return code, err


def _good_stage(folder, run_name="r1", offset=0.0):
    return write_stage(
        folder,
        {0: half_covered_step(offset), 1: half_covered_step(offset + 1)},
        stage=folder.name,
        world_size=2,
        run_name=run_name,
    )


@pytest.mark.parametrize(
    "case", ["missing", "empty", "truncated-json", "truncated-gz", "world-size", "other-run-stage", "other-run-rank"]
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, case):
    run = tmp_path / "run"
    if case != "missing":
        run.mkdir()
    if case == "truncated-json":
        stage = _good_stage(run / "simple")
        text = (stage / "rank1.pt.trace.json").read_text()
        (stage / "rank1.pt.trace.json").write_text(text[: len(text) // 2])
    elif case == "truncated-gz":
        stage = _good_stage(run / "simple")
        (stage / "rank1.pt.trace.json").unlink()
        blob = gzip.compress(json.dumps({"traceEvents": half_covered_step()}).encode())
        (stage / "rank1.pt.trace.json.gz").write_bytes(blob[: len(blob) // 2])
    elif case == "world-size":
        stage = _good_stage(run / "simple")
        (stage / "rank1.pt.trace.json").unlink()
    elif case == "other-run-stage":
        _good_stage(run / "simple", run_name="r1")
        _good_stage(run / "hook", run_name="r2")
    elif case == "other-run-rank":
        stage = _good_stage(run / "simple")
        # rank 1 copied in from a run recorded an hour later
        write_stage(stage, {1: half_covered_step(offset=3.6e9)})
    code, err = _run_cli(capsys, run)
    assert code == 2
    expected = {
        "missing": "does not exist",
        "empty": "no rank traces",
        "truncated-json": "truncated",
        "truncated-gz": "truncated",
        "world-size": "world_size=2",
        "other-run-stage": "different runs",
        "other-run-rank": "different runs",
    }[case]
    usage_error(err, "analyze", expected)


def test_cli_needs_a_run_or_compare(capsys):
    code, err = _run_cli(capsys)
    assert code == 2
    usage_error(err, "analyze", "--compare")


def test_good_folder_passes_the_same_checks(tmp_path, capsys):
    """The checks above must not refuse a healthy run (else they prove nothing)."""
    run = tmp_path / "run"
    _good_stage(run / "simple")
    _good_stage(run / "hook")
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "simple" in out and "hook" in out


def test_ranks_a_moment_apart_are_one_run_and_hours_apart_are_refused(tmp_path):
    from minddp.analysis.events import SAME_RUN_GAP_US, RankTrace, TraceError, _check_recorded_together

    def trace(rank, start_us):
        return RankTrace(rank, tmp_path / f"rank{rank}.json", [{"ts": start_us, "dur": 1000.0, "ph": "X"}])

    # traces that name no job (another tool's) are judged by their clocks: the single-process baseline's ranks
    # never talk, and one may record its step just after the other's ended
    _check_recorded_together(tmp_path, {0: trace(0, 0.0), 1: trace(1, 1000.0 + SAME_RUN_GAP_US / 4)})
    with pytest.raises(TraceError, match="not recorded at the same time"):
        _check_recorded_together(tmp_path, {0: trace(0, 0.0), 1: trace(1, 3600e6)})


def _profiled_alone(folder):
    """Each rank profiles a step of its own, never communicating (as the single baseline does)."""
    import torch.distributed as dist

    from minddp.runtime.profiling import StepProfiler

    with StepProfiler(folder, rank=dist.get_rank(), total_steps=1, memory=False) as prof:
        torch.ones(4, 4) @ torch.ones(4, 4)
        prof.step()
    return prof.written


def test_traces_name_their_job_and_only_one_jobs_traces_are_one_run(tmp_path):
    """minddp's launcher gives its ranks one job id, which their traces name: one job's ranks are one run whatever
    their clocks say, two jobs' ranks are refused even where their clocks overlap."""
    from minddp.analysis.events import TraceError, _check_recorded_together, read_trace
    from minddp.runtime.profiling import JOB

    first = launch(_profiled_alone, str(tmp_path / "a"), world_size=2, timeout_s=60)
    second = launch(_profiled_alone, str(tmp_path / "b"), world_size=2, timeout_s=60)
    a = {r: read_trace(p, r) for r, p in enumerate(first)}
    b = {r: read_trace(p, r) for r, p in enumerate(second)}
    assert len({t.meta[JOB] for t in a.values()}) == 1 and a[0].meta[JOB] != b[0].meta[JOB]
    for t in a.values():  # an hour apart: still one job's
        t.events = [{**e, "ts": e["ts"] + 3600e6 * t.rank} for e in t.events]
    _check_recorded_together(tmp_path, a)
    with pytest.raises(TraceError, match="come from different jobs"):
        _check_recorded_together(tmp_path, {0: a[0], 1: b[1]})
    b[1].meta.pop(JOB)  # one names a job, the other none (another tool's): not one job either
    with pytest.raises(TraceError, match="rank 1: none"):
        _check_recorded_together(tmp_path, {0: a[0], 1: b[1]})


def test_printed_tables_read_in_ms_and_percent_within_120_columns(tmp_path, capsys):
    """One format for numbers in what minddp prints: the console's µs columns are printed in ms and its shares in %,
    each unit in the header, the values scaled accordingly (the stored DataFrame, the oracle here, keeps HTA's µs),
    every line within 120 columns; the wide table, with bytes in MiB, is what the files hold."""
    from minddp.analysis import analyze_run
    from minddp.analysis.report import readable

    run = tmp_path / "run"
    _good_stage(run / "simple")
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "step ms" in out and "compute %" in out and "comm ms" in out, out
    assert "_us" not in out and "_pctg" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    stages = analyze_run(str(run)).stages
    row = next(line for line in out.splitlines() if line.startswith("simple "))
    # step 100 µs -> 0.1 ms; compute 40 % (40 of 100 µs); comm 40 µs -> 0.0 ms at one decimal
    assert row.split()[1:3] == [f"{stages.loc['simple', 'step_time_us'] / 1000:.1f}", "40.0"], row
    shown = readable(stages)
    assert shown.loc["simple", "step time (ms)"] == stages.loc["simple", "step_time_us"] / 1000
    assert shown.loc["simple", "allreduce per step (MiB)"] == stages.loc["simple", "allreduce_bytes_per_step"] / 2**20
    assert shown.loc["simple", "compute (%)"] == stages.loc["simple", "compute_pctg"]
