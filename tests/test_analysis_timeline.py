"""The per-bucket timeline of a run with every stage, torch's DDP included: one shared axis, backward drawn.

The traces come from one launch of 2 ranks that profiles every stage in turn
(``single``, the six teaching stages, ``ddp``, ``torch``), each wrapped with
:func:`minddp.ladder.wrap` and driven by :func:`minddp.ladder.loop.train_step` with
3 micro-batches, on a small MLP. Oracles: *where* each stage sends its
gradients is fixed by its code, not by timing (``ga`` sends in finish, after
the last backward; ``simple`` after every backward; the hook-based stages and
torch's reducer from autograd hooks, inside the backward), so the timeline
must show exactly that; and the figure must put every stage on one axis, with
one backward band per micro-batch per stage and nothing cut off.
"""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from minddp.analysis import analyze_run
from minddp.analysis.report import plot_timeline
from minddp.runtime.launch import launch

STAGES = ["single", "simple", "ga", "hook", "hook-async", "bucket", "bucket-async", "ddp", "torch"]
MICRO = 3


def _profile_every_stage(out: str) -> None:
    import torch.distributed as dist

    from minddp.ladder import wrap
    from minddp.ladder.loop import train_step
    from minddp.runtime.profiling import StepProfiler

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    micro = [(torch.randn(32, 128, generator=g), torch.randn(32, 1, generator=g)) for _ in range(MICRO)]

    def loss_fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    for stage in STAGES:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(4)], nn.Linear(128, 1))
        wrapped = wrap(stage, model, bucket_cap_mb=0.07)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        train_step(wrapped, opt, micro, loss_fn)  # torch rebuilds its buckets after step 1
        dist.barrier()  # ranks that never talk (single) start together
        with StepProfiler(f"{out}/{stage}", rank, total_steps=2, active=1, memory=False) as prof:
            for _ in range(2):
                train_step(wrapped, opt, micro, loss_fn)
                prof.step()
        if rank == 0:
            with open(f"{out}/{stage}/config.json", "w") as f:
                json.dump({"run_name": "timeline", "stage": stage, "world_size": 2, "grad_accum": MICRO}, f)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "timeline"
    launch(_profile_every_stage, str(out), world_size=2)
    return analyze_run(out)


def test_every_stage_has_its_micro_batches_and_torch_its_buckets(result):
    phases = result.phases[result.phases["rank"] == 0]
    for stage in STAGES:
        backward = phases[(phases["stage"] == stage) & (phases["phase"] == "backward")]
        assert len(backward) == MICRO, stage
        assert (backward["start_us"] < backward["end_us"]).all()
    b = result.buckets[result.buckets["rank"] == 0]
    torch_rows = b[b["stage"] == "torch"]
    assert len(torch_rows) == result.stages.loc["torch", "allreduce_calls_per_step"] > 1
    assert (torch_rows["launch"] == "reducer").all() and not torch_rows["comm_end_us"].isna().any()
    assert "single" not in set(b["stage"])


def test_where_each_stage_sends_follows_from_its_code(result):
    phases, b = result.phases[result.phases["rank"] == 0], result.buckets[result.buckets["rank"] == 0]

    def backwards(stage):
        p = phases[(phases["stage"] == stage) & (phases["phase"] == "backward")].sort_values("start_us")
        return list(zip(p["start_us"], p["end_us"]))

    def sent(stage):
        return sorted(b.loc[b["stage"] == stage, "ready_us"])

    last_end = backwards("ga")[-1][1]
    assert all(t >= last_end for t in sent("ga"))  # ga: after the last backward only
    for (_, end), (start, _) in zip(backwards("simple"), backwards("simple")[1:]):
        assert any(end <= t <= start for t in sent("simple"))  # simple: after every backward
    for stage in ("hook", "hook-async", "bucket", "bucket-async", "ddp", "torch"):
        start, end = backwards(stage)[-1]
        assert all(start <= t <= end for t in sent(stage)), stage  # from autograd hooks, during backward


def test_the_timeline_puts_every_stage_on_one_axis_with_its_backward(result, tmp_path):
    fig = plot_timeline(result, tmp_path / "timeline.png")
    try:
        assert len(fig.axes) == 1  # one shared time axis
        ax = fig.axes[0]
        assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == STAGES
        for stage in STAGES:
            bands = [c for c in ax.collections if c.get_gid() == f"backward:{stage}"]
            assert len(bands) == 1 and len(bands[0].get_paths()) == MICRO, stage
        phases, buckets = result.phases, result.buckets  # the plot shows rank 0
        latest = (
            max(phases.loc[phases["rank"] == 0, "end_us"].max(), buckets.loc[buckets["rank"] == 0, "comm_end_us"].max())
            / 1e3
        )
        assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] >= latest  # nothing cut off by the axis
        assert (tmp_path / "timeline.png").stat().st_size > 10_000
    finally:
        plt.close(fig)


def test_the_legend_names_only_what_can_be_seen():
    # Notebook 06's figure: a finish range of a few microseconds on a step of seconds is drawn under a pixel wide;
    # its legend entry named a purple no one could find. A row with a visible finish keeps the entry.
    from minddp.analysis.timeline import draw_steps

    def labels(finish):
        row = {"label": "s", "forward": [(0, 400)], "backward": [(400, 900)], "finish": finish, "end": 1000}
        fig = draw_steps([row])
        names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        plt.close(fig)
        return names

    assert "finish" not in labels([(900, 900.01)])  # 1/100000 of the axis
    assert "finish" in labels([(900, 950)])  # 1/20 of it
    assert {"forward", "backward", "step ends"} <= set(labels([]))


def test_a_check_leaves_the_band_it_falls_in_visible():
    # Notebook 05's figure: the check's hatch covered the whole band, so a check just after a backward's first
    # autograd node hid that band's start and looked as if it came between the forward and the backward. The hatch
    # now covers the band's top half only, and its legend names the check, not a wait (05 draws gloo's range).
    from minddp.analysis.timeline import draw_steps

    row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "checks": [(41, 60)], "end": 100}
    fig = draw_steps([row])
    ax = fig.axes[0]
    (band,) = [c for c in ax.collections if c.get_gid() == "backward:s"]
    (check,) = [c for c in ax.collections if c.get_gid() == "checks:s"]
    band_y, check_y = band.get_paths()[0].vertices[:, 1], check.get_paths()[0].vertices[:, 1]
    assert band_y.min() == check_y.min() and check_y.max() < band_y.max()  # the band's lower part shows
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    assert "parameter check" in names and not any("wait" in n for n in names)


def test_a_check_that_is_gloos_range_is_drawn_as_one_not_as_a_wait():
    # Notebook 05's figure drew the check's gloo all_gather range in the waits' red, which every other drawing uses
    # for the training thread standing still; a row whose checks are gloo's ranges draws them in the messages' orange.
    from matplotlib.colors import to_rgba

    from minddp.analysis.timeline import COLORS, draw_steps

    def colour(**extra):
        row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "checks": [(41, 60)], "end": 100, **extra}
        fig = draw_steps([row])
        (check,) = [c for c in fig.axes[0].collections if c.get_gid() == "checks:s"]
        plt.close(fig)
        return tuple(check.get_facecolor()[0])

    assert colour() == to_rgba(COLORS["wait"])  # the thread's time in the check (03): a wait
    assert colour(checks_in_flight=True) == to_rgba(COLORS["message"])


def test_the_legend_says_what_an_orange_bar_is():
    # Notebook 09's figure: its orange bars are gloo's all_reduce ranges, which include the wait for the other rank
    # and for a core, and the legend called them "message on the wire". Only an emulated link's modeled transfer is.
    from minddp.analysis.timeline import draw_steps

    def labels(**extra):
        row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "messages": [(60, 95)], "end": 100}
        fig = draw_steps([dict(row, **extra)])
        names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        plt.close(fig)
        return names

    gloo, link = labels(), labels(link="1gbit")
    assert "collective in flight (held open included)" in gloo and "message on the wire" not in gloo
    assert "message on the wire" in link and "collective in flight (held open included)" not in link


def test_an_orange_bar_is_drawn_no_longer_than_its_range_and_names_what_it_is():
    # Notebook 05's figure: each bar had a 0.5-pt brown edge line, so dozens of narrow bars drew longer than their
    # ranges and covered the gaps between them (the orange read longer than the table's time in flight); and a row
    # of the analysis, whose bars are the messages' all_reduce ranges only, had the legend's "collective in flight",
    # which in the table counts every collective. Oracle: no stroke, so a bar's drawn extent is its path's, which
    # must be its span; back to back bars in two shades; the row's own legend word.
    from types import SimpleNamespace

    import pandas as pd
    from matplotlib.colors import to_hex

    from minddp.analysis.timeline import draw_steps, rows_from_analysis

    spans = [(60, 70), (50, 60), (80, 81)]  # not in order of start: the shades go by start
    row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "messages": spans, "end": 100}
    fig = draw_steps([row])
    (bars,) = [c for c in fig.axes[0].collections if c.get_gid() == "messages:s"]
    assert list(bars.get_linewidths()) == [0]
    extents = [(round(p.vertices[:, 0].min(), 6), round(p.vertices[:, 0].max(), 6)) for p in bars.get_paths()]
    assert sorted(extents) == sorted(spans)
    (again,) = [c for c in fig.axes[0].collections if c.get_gid() == "messages_alt:s"]  # the second by start
    assert [(p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in again.get_paths()] == [(60, 70)]
    assert list(again.get_linewidths()) == [0] and to_hex(again.get_facecolor()[0]) != to_hex(bars.get_facecolor()[0])
    plt.close(fig)

    phase = pd.DataFrame(
        [(0, "s", name, a, b) for name, a, b in [("forward", 0, 40e3), ("backward", 40e3, 90e3), ("step", 0, 100e3)]],
        columns=["rank", "stage", "phase", "start_us", "end_us"],
    )
    sent = pd.DataFrame(
        [(0, "s", 55e3, 60e3, 70e3)], columns=["rank", "stage", "ready_us", "comm_start_us", "comm_end_us"]
    )
    (analysed,) = rows_from_analysis(SimpleNamespace(phases=phase, buckets=sent))
    fig = draw_steps([analysed])
    names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert "all_reduce range (held open included)" in names and not any("in flight" in n for n in names)


def test_notebook_06s_figure_draws_each_mark_in_its_phase_with_no_lengths():
    # lesson.handed_picture: phases in order, each the same width, each mark inside the slot of the phase it was
    # handed over in (oracle: the times given, phase by phase), none on the axes' edge, and no time axis
    from minddp.notebook import lesson

    def row(fw, bw, opt):
        return {"forward": fw, "backward": bw, "optimizer": [opt], "finish": [], "end": opt[1]}

    looks = {  # one micro-batch each: forward, backward, update; a long forward must not draw longer
        "a": {"row": row([(0, 900)], [(900, 1000)], (1010, 1020)), "handed": {"calls": [950, 990], "gathers": [0]}},
        "b": {"row": row([(0, 100)], [(100, 400)], (410, 420)), "handed": {"calls": [405], "gathers": [415]}},
    }
    fig = lesson.handed_picture(looks, ["a", "b"], title="t")
    ax = fig.axes[0]
    bars = {}
    for c in ax.collections:  # one broken_barh per phase drawn: (x, width) by row
        (path,) = c.get_paths()
        xs, ys = path.vertices[:, 0], path.vertices[:, 1]
        bars.setdefault(round(float(ys.min() + 0.4)), []).append((float(xs.min()), float(xs.max())))
    widths = {w for spans in bars.values() for a, b in spans for w in [round(b - a, 6)]}
    assert widths == {1.0}, widths  # every phase one unit wide, whatever its time
    marks = {}
    for line in ax.get_lines():
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            marks.setdefault(round(float(y)), []).append((line.get_label(), float(x)))
    fwd_a, bwd_a, opt_a = sorted(bars[0])
    got_a = sorted(marks[0], key=lambda m: m[1])
    gradient = "gradient collective handed over"
    assert [label for label, _ in got_a] == ["all-gather of parameters handed over"] + 2 * [gradient]
    assert fwd_a[0] < got_a[0][1] < fwd_a[1] and all(bwd_a[0] < x < bwd_a[1] for _, x in got_a[1:])
    spans_b = sorted(bars[1])
    assert len(spans_b) == 3  # forward, backward, update
    got_b = sorted(marks[1], key=lambda m: m[1])
    # 405 falls between the backward (ends 400) and the update (starts 410): a slot of its own between them
    assert spans_b[1][1] < got_b[0][1] < spans_b[2][0], (spans_b, got_b)
    assert spans_b[2][0] < got_b[1][1] < spans_b[2][1]
    lo, hi = ax.get_xlim()
    assert all(lo < x < hi and min(x - lo, hi - x) > 0.1 for m in marks.values() for _, x in m)
    assert list(ax.get_xticks()) == [] and "same width" in ax.get_xlabel()
    # two kinds in one phase: each kind spread evenly across it on its own line, countable (not interleaved)
    both = {"c": {"row": row([(0, 100)], [(100, 400)], (410, 420)), "handed": {"calls": [110, 130, 150],
                                                                               "gathers": [120]}}}  # fmt: skip
    ax_c = lesson.handed_picture(both, ["c"], title="t").axes[0]
    fwd_c, bwd_c, _ = sorted(
        (float(c.get_paths()[0].vertices[:, 0].min()), float(c.get_paths()[0].vertices[:, 0].max()))
        for c in ax_c.collections
    )
    lines = {}
    for line in ax_c.get_lines():
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            lines.setdefault(float(y), []).append(round((float(x) - bwd_c[0]) / (bwd_c[1] - bwd_c[0]), 6))
    assert sorted(sorted(v) for v in lines.values()) == [[round(1 / 6, 6), 0.5, round(5 / 6, 6)], [0.5]], lines
    # each bar named as handed_in names its phase, left to right in each row
    named = {}
    for t in ax.texts:
        named.setdefault(round(t.get_position()[1] + 0.2), []).append((t.get_position()[0], t.get_text()))
    assert {y: [n for _, n in sorted(v)] for y, v in named.items()} == {
        y: ["forward 1", "backward 1", "update"] for y in (0, 1)
    }
    plt.close(fig)


def test_the_legend_swatch_of_the_message_bars_shows_both_shades():
    # Notebook 09's figure (read 14): the bars alternate two shades of orange, the legend showed one, and a learner
    # could take the darker bars for another kind of time. Oracle: the colours of the swatches the legend draws.
    from matplotlib.colors import to_hex
    from matplotlib.patches import Rectangle

    from minddp.analysis.timeline import COLORS, draw_steps

    def swatches(rows):
        fig = draw_steps(rows)
        legend = fig.axes[0].get_legend()
        names = [t.get_text() for t in legend.get_texts()]
        colours = {to_hex(r.get_facecolor()) for r in legend.findobj(Rectangle) if r is not legend.legendPatch}
        plt.close(fig)
        return names, colours

    base = {"forward": [(0, 40)], "backward": [(40, 90)], "end": 100}
    light, dark = to_hex(COLORS["message"]), to_hex(COLORS["message_alt"])
    _, colours = swatches([dict(base, label="s", messages=[(50, 60), (60, 70)])])
    assert {light, dark} <= colours
    _, colours = swatches([dict(base, label="s", messages=[(50, 60)])])  # one bar: no second shade drawn or shown
    assert light in colours and dark not in colours
    # notebook 05: each row names its bars in its own words, and each entry keeps its label
    names, colours = swatches(
        [dict(base, label="a", messages=[(50, 60), (60, 70)], wire="a's"), dict(base, label="b", messages=[(50, 60)])]
    )
    assert {"a's", "collective in flight (held open included)"} <= set(names) and {light, dark} <= colours


def test_messages_open_at_once_are_drawn_apart_so_none_hides_another():
    # Notebooks 05 and 09 (read 14): gloo's ranges of two collections in flight together were drawn on one band, the
    # later bar over the earlier, so a bar could vanish under another. Oracle: the spans given; each drawn with its
    # own extent, in lanes whose heights do not overlap, and bars that never overlap keep one full-height lane.
    from minddp.analysis.timeline import draw_steps

    def drawn(messages):
        row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "messages": messages, "end": 100}
        fig = draw_steps([row])
        got = []
        for c in fig.axes[0].collections:
            if str(c.get_gid()).startswith("messages:"):
                for p in c.get_paths():
                    xs, ys = p.vertices[:, 0], p.vertices[:, 1]
                    got.append(((float(xs.min()), float(xs.max())), (float(ys.min()), float(ys.max()))))
        plt.close(fig)
        return sorted(got)

    together = drawn([(50, 80), (55, 60), (62, 70)])  # the first open while the other two run
    assert [x for x, _ in together] == [(50, 80), (55, 60), (62, 70)]
    (first_y,) = {y for x, y in together if x == (50, 80)}
    for x, (lo, hi) in together:
        if x != (50, 80):
            assert hi <= first_y[0] + 1e-9 or lo >= first_y[1] - 1e-9, (x, lo, hi, first_y)  # beside, not over
    apart = drawn([(50, 55), (55, 60)])  # back to back: one lane, the band's full height
    assert {y for _, y in apart} == {y for x, y in drawn([(50, 55)])}


def test_bars_back_to_back_in_a_lane_differ_in_shade():
    # Notebook 09's refresh of lanes(): the shades alternated by start over the whole row, not within a lane, so
    # the 1st and 3rd message, back to back in lane 0 with the 2nd open beside them in lane 1, were both drawn light
    # and read as one bar. Oracle: the spans given; of two bars drawn at one height where one ends as the next
    # starts, exactly one is drawn again in the second shade.
    from minddp.analysis.timeline import draw_steps

    row = {"label": "s", "forward": [(0, 40)], "backward": [(40, 90)], "end": 100}
    row["messages"] = [(50, 60), (55, 80), (60, 70)]  # the 2nd open while the 1st ends and the 3rd begins
    fig = draw_steps([row])
    drawn = {"messages": [], "messages_alt": []}
    for c in fig.axes[0].collections:
        key = str(c.get_gid()).split(":")[0]
        if key in drawn:
            for p in c.get_paths():
                xs, ys = p.vertices[:, 0], p.vertices[:, 1]
                drawn[key].append(((float(xs.min()), float(xs.max())), (float(ys.min()), float(ys.max()))))
    plt.close(fig)
    pairs = [(a, b) for a in drawn["messages"] for b in drawn["messages"] if a[1] == b[1] and a[0][1] == b[0][0]]
    assert pairs, drawn  # the 1st and the 3rd share a lane, back to back
    for a, b in pairs:
        assert (a in drawn["messages_alt"]) != (b in drawn["messages_alt"]), (a, b, drawn)
