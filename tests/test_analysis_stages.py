"""A short profile of every stage on CPU (2 ranks), analysed: the blog's findings, as relations.

The traces come from a small generator here, in the layout the train command writes
(``<run>/<stage>/rank<r>.pt.trace.json`` + ``config.json``), driven by the same
``minddp.ladder.loop.train_step`` and profiler schedule (wait=0, warmup=1, active=N), on an MLP
of 10 x 256 x 256 layers. The train command's own ``--stage all --analyze`` output is
checked in tests/test_train.py.

What the tests assert is what each stage's code decides, read from the order of
events on the training thread: where each all_reduce is started (inside backward, or
after it), and for the stages that wait inside backward, that gloo had started the
collective before the next backward node ran (the wait returned, so it had). How much
of the wire time then hides under compute (the overlap %) depends on how the OS runs
gloo's threads beside the ranks: the blog's finding that the async stages hide more
is a target of the benchmark (``minddp.bench.targets``, step 7), judged on a quiet
machine, not here.
"""

import json
import os
import re
import shutil
import struct
import subprocess

import pytest
import torch
from torch import nn

from minddp.analysis import analyze_run
from minddp.analysis.__main__ import main
from minddp.ladder import build_stage, options_for
from minddp.ladder.loop import train_step
from minddp.runtime.launch import launch

STAGES = ["simple", "ga", "hook", "hook-async", "bucket", "bucket-async"]
STEPS = 3


def _profile_rank(stage, out, steps, grad_accum):
    import torch.distributed as dist

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(10)], nn.Linear(256, 1))
    ddp = build_stage(stage, model, **options_for(stage, bucket_cap_mb=0.6))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    batch = (torch.randn(64, 256, generator=gen), torch.randn(64, 1, generator=gen))

    def loss_fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    def save(prof):
        prof.export_chrome_trace(os.path.join(out, stage, f"rank{rank}.pt.trace.json"))

    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, record_shapes=True, on_trace_ready=save
    ) as prof:
        for _ in range(steps + 1):
            train_step(ddp, opt, [batch] * grad_accum, loss_fn)
            prof.step()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "allstages"
    for stage in STAGES:
        os.makedirs(out / stage)
        grad_accum = 2 if stage == "ga" else 1
        launch(_profile_rank, stage, str(out), STEPS, grad_accum, world_size=2)
        (out / stage / "config.json").write_text(
            json.dumps(
                {
                    "stage": stage,
                    "world_size": 2,
                    "steps": STEPS,
                    "grad_accum": grad_accum,
                    "hook": "allreduce",
                    "run_name": "allstages",
                }
            )
        )
    return out


def _micro_batches(trace):
    """Per micro-batch of the profiled steps: (its backward nodes' (start, end), the all_reduce calls started in
    its range, with their start), on the training thread."""
    from minddp.analysis.cpu import rank_intervals

    iv = rank_intervals(trace)
    window = [(s, e) for _, s, e in iv.steps]
    out = []
    for fb in sorted((e for e in trace.events if e["name"] == "minddp.forward_backward"), key=lambda e: e["ts"]):
        if not any(s <= fb["ts"] < e for s, e in window):
            continue
        start, end = fb["ts"], fb["ts"] + fb["dur"]
        nodes = sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in trace.events
            if e["name"].startswith("autograd::engine::evaluate_function") and start <= e["ts"] <= end
        )
        calls = sorted(e["ts"] for e in trace.events if e["name"] == "c10d::allreduce_" and start <= e["ts"] <= end)
        out.append((nodes, calls))
    return out


def test_stages_compare_as_the_blog_found(run_dir):
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_run

    result = analyze_run(run_dir)
    s = result.stages
    assert list(s.index) == STAGES
    calls = s["allreduce_calls_per_step"]
    print(s[["comm_comp_overlap_pctg", "allreduce_calls_per_step", "step_time_us"]].round(1).to_string())
    assert ((0 <= s["comm_comp_overlap_pctg"]) & (s["comm_comp_overlap_pctg"] <= 100)).all()
    run = load_run(run_dir)
    for stage in STAGES:
        for trace in run.stages[stage].ranks.values():
            micro = _micro_batches(trace)
            assert len(micro) == STEPS * (2 if stage == "ga" else 1), (stage, len(micro))
            for nodes, started in micro:
                last_node = nodes[-1][0]
                inside = [t for t in started if nodes[0][0] <= t < last_node]
                if stage in ("simple", "ga"):
                    # all comm after backward: nothing started before its last node (ga's first micro-batch
                    # starts nothing at all)
                    assert inside == [], (stage, inside)
                else:
                    # the others start all_reduces from autograd's hooks, while backward has nodes to run
                    assert len(inside) >= 1, (stage, nodes[:3], started)
            if stage in ("hook", "bucket"):
                # they wait inside backward: each collective had started on gloo's thread (its range opened)
                # before the next backward node began, since the wait returned only once it was done
                iv = rank_intervals(trace)
                runs = sorted(e["ts"] for e in iv.allreduces)
                for nodes, started in micro:
                    for t in started:
                        after = [a for a, _ in nodes if a > t]
                        if after:
                            assert [r for r in runs if t <= r < after[0]], (stage, t, after[0])
    # one all_reduce per parameter for the per-parameter stages; far fewer with buckets
    n_params = 2 * 10 + 2
    for stage in ("simple", "ga", "hook", "hook-async"):
        assert calls[stage] == n_params
    assert calls["bucket"] <= calls["hook"] / 3
    assert calls["bucket"] == calls["bucket-async"]
    # every stage sends the same bytes per step: the whole gradient, once
    assert s["allreduce_bytes_per_step"].nunique() == 1
    assert s["allreduce_bytes_per_step"].iloc[0] == 4 * (10 * (256 * 256 + 256) + 256 + 1)


def test_ga_reduces_only_on_the_sync_micro_step(run_dir):
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_run

    for trace in load_run(run_dir).stages["ga"].ranks.values():
        iv = rank_intervals(trace)
        fwd_bwd = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace.events if e["name"] == "minddp.forward_backward")
        assert len(fwd_bwd) == 2 * STEPS
        for i, (_, start, end) in enumerate(iv.steps):
            no_sync_end = fwd_bwd[2 * i][1]  # the first micro-batch of the step ran under no_sync()
            calls = [e["ts"] for e in iv.allreduces if start <= e["ts"] < end]
            assert calls and min(calls) > no_sync_end


def test_bucket_timeline_shows_async_buckets_leaving_before_backward_ends(run_dir):
    result = analyze_run(run_dir)
    b = result.buckets
    for stage in ("bucket", "bucket-async"):
        d = b[(b["stage"] == stage) & (b["rank"] == 0)]
        assert len(d) == result.stages.loc[stage, "allreduce_calls_per_step"]
        assert (d["ready_us"] <= d["launched_us"]).all()
        assert not d["comm_end_us"].isna().any()  # every bucket's all_reduce was found
        assert (d["ready_us"] <= d["comm_start_us"]).all() and (d["comm_start_us"] < d["comm_end_us"]).all()
    a = b[(b["stage"] == "bucket-async") & (b["rank"] == 0)].sort_values("order")
    # async: the first bucket is launched (handed to gloo) while later buckets are still being filled by
    # backward: the last one is ready after the first has left (the order of the training thread's events)
    assert len(a) > 1 and a["ready_us"].iloc[-1] > a["launched_us"].iloc[0]


@pytest.fixture(scope="module")
def report(run_dir):
    """``python -m minddp.analyze RUN --report`` on the run: the page's text and what the console printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([str(run_dir), "--report"]) == 0
    return (run_dir / "report.html").read_text(), out.getvalue()


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_and_compare_write_pngs_and_html(run_dir, report, capsys):
    html, _ = report
    for name in ("temporal_breakdown.png", "overlap.png", "comm.png", "bucket_timeline.png"):
        width, height = _png_size(run_dir / name)
        assert 400 <= width <= 3000 and 250 <= height <= 3000, (name, width, height)
        assert (run_dir / name).stat().st_size > 10_000  # bars and labels drawn, not an empty canvas
        assert name in html
    for stage in STAGES:
        assert stage in html
    assert main(["--compare", str(run_dir), str(run_dir), "--report"]) == 0
    out = capsys.readouterr().out
    assert "A:allstages" in out and "B:allstages" in out
    _png_size(run_dir / "compare-allstages" / "overlap.png")


def _non_compute_by_hand(run_dir) -> dict[str, float]:
    """Per stage: the median over the profiled steps (ranks averaged step by step) of |comm in the step| minus
    |comm under compute in the step|, in ms: the non-compute time, computed here from the intervals alone."""
    import statistics

    from minddp.analysis import metrics
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_run

    out = {}
    for stage, traces in load_run(run_dir).stages.items():
        per_step: dict[int, list[float]] = {}
        for trace in traces.ranks.values():
            iv = rank_intervals(trace)
            for number, start, end in iv.steps:
                comm = metrics.intersect(iv.comm, [(start, end)])
                hidden = metrics.intersect(comm, iv.compute)
                per_step.setdefault(number, []).append(metrics.length(comm) - metrics.length(hidden))
        out[stage] = statistics.median(statistics.mean(v) for v in per_step.values()) / 1e3
    return out


def test_report_opens_with_the_verdict_ranked_by_the_measured_non_compute_time(run_dir, report):
    page, printed = report
    verdict = page.index("class='verdict'")
    assert verdict < page.index("<figure>") and page.index("<figure>") == page.index(
        "<figure><img src='bucket_timeline"
    )
    table = page[page.index("<table class='ranking'", verdict) : page.index("</table>", verdict)]
    rows = re.findall(r"<tr data-stage='([^']+)'><td>(\d+)</td>.*?<td>([\d.]+) \(.*?<td class='why'>(.*?)</td>", table)
    shown = [stage for stage, *_ in rows]
    assert sorted(shown) == sorted(STAGES)
    by_hand = _non_compute_by_hand(run_dir)
    assert shown == sorted(STAGES, key=by_hand.get)  # the order printed is the order of the numbers measured
    for stage, place, median, why in rows:
        assert abs(float(median) - by_hand[stage]) <= 0.05 + 1e-9, (stage, median, by_hand[stage])  # printed at .1f
        assert int(place) == shown.index(stage) + 1
    whys = {stage: why for stage, *_, why in rows}
    for stage in ("simple", "hook", "hook-async"):
        assert whys[stage].startswith("22 all_reduces"), whys[stage]  # one per parameter: 10 x (weight, bias) + 2
    # The share of message time during backward is read from gloo's own ranges, which its worker thread can close
    # late under load (seen: an all_reduce of simple's, waited for before the step ended, whose range ran 2.7 ms into
    # the next step's backward): so the sentence's share is checked for its form here, and where simple and ga send
    # (after backward, on the training thread) in test_stages_compare_as_the_blog_found.
    for stage in STAGES:
        share = re.search(r"; (\d+) % of its [\d.]+ ms of messages in flight ran during backward; ", whys[stage])
        assert share and 0 <= int(share.group(1)) <= 100, whys[stage]
    assert "On a CPU (gloo)" in page and "On a CPU (gloo)" in printed
    console = printed.splitlines()
    assert max(len(line) for line in console) <= 120
    assert [line.split()[1] for line in console if re.match(r"^\s*\d+ \S", line)][: len(STAGES)] == shown


def _browser() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


#: Written into a copy of the page: once every image has loaded, each one's box and natural size, as JSON.
_MEASURE = """<script>window.addEventListener('load', () => {
  const boxes = [...document.images].map(i => { const r = i.getBoundingClientRect();
    return {src: i.getAttribute('src'), left: r.left, right: r.right, width: r.width, natural: i.naturalWidth}; });
  const pre = document.createElement('pre'); pre.id = 'boxes';
  pre.textContent = JSON.stringify({inner: window.innerWidth, boxes: boxes}); document.body.appendChild(pre);
});</script>"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_figure_of_the_report_is_whole_in_a_browser(run_dir, report, tmp_path, width):
    """Headless Chromium renders the page; every image loaded and lies inside the window, at both common widths."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium to render the page with (Debian: apt-get install chromium; .ci/run installs it)")
    page, _ = report
    probe = run_dir / f"report-probe-{width}.html"  # beside the page, so its images load as they do for a reader
    probe.write_text(page.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={width},1000",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probe.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r"<pre id=\"boxes\">(.*?)</pre>", dom, re.S)
    assert found, dom[-2000:]
    measured = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    images = {b["src"]: b for b in measured["boxes"]}
    assert set(images) == {"bucket_timeline.png", "temporal_breakdown.png", "overlap.png", "comm.png"}
    for src, box in images.items():
        assert box["natural"] > 0, src  # the file loaded
        assert 0 <= box["left"] and box["right"] <= measured["inner"] and box["width"] > 300, (src, box, measured)
