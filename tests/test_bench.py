"""Smoke test of ``python -m minddp.bench``: one short round, real ranks, checks files and columns.

No timing is asserted (timings are for the benchmark to report). What is
checked against independent facts: the payload bytes an all_reduce stage
sends per step equal the model's trainable parameter bytes (computed here from
the model itself), torch's DDP (counted through its hook) sends the same, and
noop_hook sends nothing; the derived columns follow from the raw ones.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from minddp.bench import COLUMNS, bench_configs
from minddp.bench.__main__ import main

ARGS = ["--quick", "--stages", "ddp,torch", "--variants", "noop,gabv", "--batch-size", "2", "--grad-accum", "1",
        "--max-seq-len", "16"]


def _param_bytes() -> int:
    """Trainable parameter bytes of the model the benchmark builds (same data, same vocabulary)."""
    from minddp.config import parse_args
    from minddp.train import prepare
    from minddp.models import build_model
    cfg = parse_args(["--max-seq-len", "16", "--no-profile"])
    data, _, _ = prepare(cfg)
    model = build_model(cfg.model, data.vocab_size, data.pad_token_id, cfg.seed)
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def test_bench_quick_run_writes_table_csv_json_png(tmp_path):
    out = tmp_path / "bench"
    assert main(ARGS + ["--out", str(out)]) == 0
    for name in ("results.md", "results.csv", "results.json", "step_times.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "step_times.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "results.csv") as f:
        rows = {r["config"]: r for r in csv.DictReader(f)}
    expected = [c.name for c in bench_configs(["ddp", "torch"], ["noop", "gabv"])]
    assert list(rows) == expected
    assert list(next(iter(rows.values()))) == COLUMNS
    table = (out / "results.md").read_text()
    assert all(f"| {name} |" in table for name in expected)
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["command"].startswith("python -m minddp.bench --quick") and meta["rounds"] == 1

    param_bytes = _param_bytes()
    for name in ("ddp", "torch", "ddp+gabv", "torch+gabv"):
        assert float(rows[name]["allreduce_bytes_per_step"]) == param_bytes, name
        assert float(rows[name]["allreduce_calls_per_step"]) >= 1
        assert float(rows[name]["median_ms"]) > 0 and float(rows[name]["peak_mib"]) > 0
        assert 0 <= float(rows[name]["overlap_min_pct"]) <= float(rows[name]["overlap_pct"]) \
            <= float(rows[name]["overlap_max_pct"]) <= 100
    assert rows["torch"]["traffic_source"] == "hook" and rows["ddp"]["traffic_source"] == "wire"
    for name in ("ddp+noop", "torch+noop"):
        assert float(rows[name]["allreduce_bytes_per_step"]) == 0 and float(rows[name]["overlap_pct"]) == 0
    for name, noop in (("ddp", "ddp+noop"), ("torch", "torch+noop")):
        r = rows[name]
        assert float(r["exposed_comm_ms"]) == pytest.approx(float(r["median_ms"]) - float(rows[noop]["median_ms"]))
        assert float(r["q1_ms"]) <= float(r["median_ms"]) <= float(r["q3_ms"])
    assert float(rows["ddp"]["ratio_to_torch"]) == pytest.approx(
        float(rows["ddp"]["median_ms"]) / float(rows["torch"]["median_ms"]))
    assert rows["ddp+gabv"]["ref"] == "torch+gabv"


def test_overlap_pools_ranks_and_rounds_as_one_ratio():
    from minddp.bench.report import overlap_summary
    # (hidden, comm) per round, per rank: round 1 hides 4 of 6, round 2 hides 1 of 6
    rank0, rank1 = [(1.0, 2.0), (0.0, 2.0)], [(3.0, 4.0), (1.0, 4.0)]
    pooled, lo, hi = overlap_summary([rank0, rank1])
    assert pooled == pytest.approx(100 * 5 / 12)     # one ratio of sums, not the mean of ratios (37.5)
    assert (lo, hi) == pytest.approx((100 / 6, 400 / 6))
    assert overlap_summary([[(0.0, 0.0)], [(0.0, 0.0)]]) == (0.0, 0.0, 0.0)    # noop: nothing to hide


@pytest.mark.parametrize("argv, fragment", [
    (["--stages", "ddp,nope"], "--stages: unknown ['nope']"),
    (["--variants", "zip"], "--variants: unknown ['zip']"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment):
    proc = subprocess.run([sys.executable, "-m", "minddp.bench", *argv], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minddp.bench: error:") and fragment in lines[0], proc.stderr
