"""``--compare`` answers "what changed": the settings that differ, one table of A, B, Δ and B/A, noise marked.

Two runs made by hand (analysis_fixtures), so every number is known without the code under test: each profiled
step is 100 µs long, computes during its first 40 µs, and has one all_reduce in flight from 20 µs to ``end``; its
non-compute time (in flight, nothing computing) is ``end - 40`` µs. Run B differs from run A by its link
(config.json) and, by hand:

* ``simple``: A's two steps expose 20 and 30 µs, B's 40 and 50: the ranges do not meet, a real change of +20 µs;
* ``bucket``: A's 20 and 30, B's 25 and 35: the ranges overlap, so the +5 µs is within the runs' own spread;
* ``hook`` is in A only, ``ddp`` in B only: named, never a NaN row;
* step times (100 µs) and calls (1 all_reduce of 10 floats) are equal at every step: left out as the same.
"""

from __future__ import annotations

import re

from analysis_fixtures import GLOO, write_stage, x

from minddp.analysis import analyze_run
from minddp.analysis.__main__ import main
from minddp.analysis.compare import config_changes, difference


def _steps(ends: list[float], offset: float) -> list[dict]:
    events = []
    for n, end in enumerate(ends, start=1):
        o = offset + 1000.0 * n
        events += [
            x(f"ProfilerStep#{n}", o, 100),
            x("aten::mm", o, 40),
            x("gloo:all_reduce", o + 20, end - 20, tid=GLOO, **{"Input Dims": [[10]], "Input type": ["float"]}),
        ]
    return events


def _run(folder, stages: dict[str, list[float]], link):
    for stage, ends in stages.items():
        ranks = {0: _steps(ends, 0.0), 1: _steps(ends, 1.0)}
        write_stage(folder / stage, ranks, stage=stage, world_size=2, run_name=folder.name, link=link)
    return folder


def _runs(tmp_path):
    a = _run(tmp_path / "plain", {"simple": [60, 70], "bucket": [60, 70], "hook": [60, 70]}, None)
    b = _run(tmp_path / "linked", {"simple": [80, 90], "bucket": [65, 75], "ddp": [60, 70]}, "1gbit")
    return a, b


def test_compare_names_the_change_and_prints_a_b_delta_ratio(tmp_path, capsys):
    a, b = _runs(tmp_path)
    assert main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    assert "link: None → 1gbit" in out and "run_name" not in out  # the setting, not the run's name
    assert "Not compared: hook only in A, ddp only in B." in out, out
    assert "nan" not in out.lower()
    assert re.search(r"A\s+B\s+Δ = B − A\s+B/A", out), out
    rows = [line.split() for line in out.splitlines() if "non-compute (ms)" in line]
    # (stage,) number, A, B, Δ, B/A, note: medians 25 and 45 µs, then 25 and 30 µs, in ms
    assert rows[0][:1] == ["simple"] and rows[0][-4:] == ["0.025", "0.045", "+0.02", "1.80"], rows
    assert rows[1][:1] == ["bucket"] and rows[1][-6:] == ["0.025", "0.03", "+0.005", "1.20", "within", "spread"]
    assert not [line for line in out.splitlines() if "step (ms)" in line and "left out" not in line]
    assert "left out, the same at every step of both runs: step (ms)" in " ".join(out.split())


def test_difference_table_and_changes_against_the_hand_computed_numbers(tmp_path):
    a, b = (analyze_run(p) for p in _runs(tmp_path))
    assert config_changes(a.configs, b.configs) == [("link", "None", "1gbit")]
    table = difference(a, b)
    only = dict(zip(table.loc[table["number"] == "", "stage"], table.loc[table["number"] == "", "note"]))
    assert only == {"hook": "only in A", "ddp": "only in B"}
    exposed = table[table["number"] == "non-compute (ms)"].set_index("stage")
    assert exposed.loc["simple", ["A", "A_min", "A_max", "B", "B_min", "B_max"]].tolist() == [
        0.025,
        0.02,
        0.03,
        0.045,
        0.04,
        0.05,
    ]
    assert abs(exposed.loc["simple", "delta"] - 0.02) < 1e-12 and exposed.loc["simple", "note"] == ""
    assert exposed.loc["bucket", "note"] == "within spread"
    step = table[table["number"] == "step (ms)"].set_index("stage")
    assert (step["note"] == "same").all() and (step["ratio"] == 1.0).all()


def test_compare_report_page_has_the_changes_and_the_difference_table(tmp_path, capsys):
    a, b = _runs(tmp_path)
    assert main(["--compare", str(a), str(b), "--report"]) == 0
    page = (a / f"compare-{b.name}" / "report.html").read_text()
    changes = page[page.index("id='changes'") : page.index("id='difference'")]
    assert "<code>link</code>: None → 1gbit" in changes
    assert "<b>hook</b> only in A" in changes and "<b>ddp</b> only in B" in changes
    head = page[page.index("id='difference'") : page.index("</tr>", page.index("id='difference'"))]
    assert "A = plain, B = linked" in changes
    assert [re.sub("<[^>]+>", "", c) for c in re.findall(r"<th[^>]*>(.*?)</th>", head)] == [
        "stage",
        "number",
        "A",
        "B",
        "Δ = B − A",
        "B/A",
        "note",
    ]
    assert page.index("id='changes'") < page.index("class='verdict'")  # what changed comes first


def test_a_run_named_with_quotes_angles_ampersands_and_spaces_reaches_the_page_as_its_name(tmp_path, capsys):
    """A run's name is its folder's: ``a "b" <c> & d's``, and so is a stage's. On the compare page (whose step
    pictures are named after the runs) every image's address is percent-encoded and loads the file written, and
    the headings, headlines and tables name the run and the stage as written, read back by the standard library's
    HTML parser (the oracle)."""
    from html.parser import HTMLParser
    from urllib.parse import unquote

    from analysis_fixtures import linked_step

    odd, plain = tmp_path / 'a "b" <c> & d\'s', tmp_path / "plain"
    stage = "my <i> stage & 'its' \"twin\""  # a stage is named after its folder too (no slash, then)
    for folder in (odd, plain):
        for name in ("hook", stage):
            events = {0: linked_step(), 1: linked_step(1.0)}
            write_stage(folder / name, events, stage=name, world_size=2, run_name=folder.name)
    assert main(["--compare", str(odd), str(plain), "--report"]) == 0
    capsys.readouterr()
    out = odd / "compare-plain"

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.images, self.headings, self.tags, self.text, self._in = [], [], [], [], None

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "img":
                self.images.append(dict(attrs))
            self._in = tag if tag in ("h1", "h2") else None

        def handle_data(self, data):
            self.text.append(data)
            if self._in:
                self.headings.append(data)

    page = Page()
    page.feed((out / "report.html").read_text())
    sources = [image["src"] for image in page.images]
    assert any(odd.name in unquote(s) for s in sources), sources  # the run's own step picture is on the page
    for src in sources:
        assert re.fullmatch(r"[A-Za-z0-9._~%/-]+", src), src  # an address: nothing a browser must guess at
        assert (out / unquote(src)).is_file(), src
    assert f"Verdict: {odd.name}" in page.headings and "c" not in page.tags  # the name as text, never a tag
    assert stage in page.text and "i" not in page.tags  # in the verdict's headline and tables, as written
