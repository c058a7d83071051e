"""`qdq compare --format html` read back: the page against the JSON report and the fixture files, and
(where Chromium is installed) the page rendered in a real browser."""

from __future__ import annotations

import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

import cli
from browser import CHROMIUM, RENDER, needs_chromium, png_pixels
from qdq.reports.engine_html import COLOURS, TOP_LAYERS

TRT = Path(__file__).parent / "fixtures" / "trt" / "trex-v0.1.x"
MOBILENET = TRT / "tests-inputs"
RESNET = TRT / "pytorch" / "resnet" / "A100"
TF_RESNET = TRT / "tensorflow" / "resnet" / "RTX-3090"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}

PAIRS = {
    "mobilenet-8.4": (MOBILENET / "mobilenet_v2_residuals.qat.onnx.engine.graph.json",
                      MOBILENET / "mobilenet.qat.onnx.engine.graph.json"),
    "resnet18-qat": (RESNET / "qat-residual" / "resnet-qat-residual.onnx.engine.graph.json",
                     RESNET / "qat" / "resnet-qat.onnx.engine.graph.json"),
    "resnet50-fp32-fp16": (TF_RESNET / "fp32" / "resnet.onnx.engine.graph.json",
                           TF_RESNET / "fp16" / "resnet.onnx.engine.graph.json"),
}


class Page(HTMLParser):
    """What the tests read of a page: ids, links, tags, texts by id, class and tag, and table rows by id.

    `cells[row_id][classes]` is the text of a classed element inside the row `row_id`, keyed by the
    classes from the cell down (`"a"` for the A cell, `"a name"` for the layer name in it).
    """

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[str] = []  # href="#..." targets
        self.chart_links: list[str] = []
        self.external: list[str] = []  # any other href or src
        self.tags: Counter = Counter()
        self.text: dict[str, str] = {}
        self.by_class: dict[str, list[str]] = {}
        self.by_tag: dict[str, list[str]] = {}
        self.cells: dict[str, dict[str, str]] = {}
        self._open: list[dict] = []
        self.html = html
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] += 1
        if "id" in attrs:
            self.ids.append(attrs["id"])
        for key in ("href", "src"):
            target = attrs.get(key)
            if target is not None and target.startswith("#"):
                self.links.append(target[1:])
                if any(e["tag"] == "svg" for e in self._open):
                    self.chart_links.append(target[1:])
            elif target is not None:
                self.external.append(target)
        if tag not in VOID:
            self._open.append({"tag": tag, "attrs": attrs, "text": []})

    def handle_endtag(self, tag):
        while self._open:
            element = self._open.pop()
            text = "".join(element["text"])
            attrs = element["attrs"]
            self.by_tag.setdefault(element["tag"], []).append(text)
            if "id" in attrs:
                self.text[attrs["id"]] = text
            if "class" in attrs:
                self.by_class.setdefault(attrs["class"], []).append(text)
                self._cell(attrs["class"], text)
            if element["tag"] == tag:
                return

    def _cell(self, own_class: str, text: str) -> None:
        rows = [i for i, e in enumerate(self._open) if e["tag"] == "tr" and "id" in e["attrs"]]
        if rows:
            classes = [e["attrs"]["class"] for e in self._open[rows[-1] + 1:] if "class" in e["attrs"]]
            self.cells.setdefault(self._open[rows[-1]]["attrs"]["id"], {})[" ".join(classes + [own_class])] = text

    def handle_data(self, data):
        for element in self._open:
            element["text"].append(data)


def graph_data(html: str) -> dict:
    """The JSON the page's script draws the engine graphs from."""
    return json.loads(re.search(r"<script type='application/json' id='engine-graph-data'>(.*?)</script>", html).group(1))


def drawn_boxes(html: str) -> set[str]:
    """The ids of the layer boxes the script draws (`ga-3`: A's layer in row 3), from the page's data."""
    return {f"g{side['key']}-{layer['j']}" for side in graph_data(html)["sides"] for layer in side["layers"]}


def run(capsys, fmt: str, a: Path, b: Path, *options) -> str:
    assert cli.main(["compare", str(a), str(b), "--format", fmt, *map(str, options)]) == 0
    return capsys.readouterr().out


def profiles(a: Path, b: Path) -> list[Path]:
    return ["--profile-a", a.with_name(a.name.replace(".graph.", ".profile.")),
            "--profile-b", b.with_name(b.name.replace(".graph.", ".profile."))]


def average_ms(graph: Path) -> dict[str, float]:
    rows = json.loads(graph.with_name(graph.name.replace(".graph.", ".profile.")).read_text())[1:]
    return {row["name"]: row["averageMs"] for row in rows}


def quantity(text: str) -> tuple[float, str]:
    """'355.9 µs' -> (355.9, 'µs')."""
    number, unit = re.fullmatch(r"\s*([-+\d.]+) (µs|ms)\s*", text).groups()
    return float(number), unit


@pytest.mark.parametrize("pair", PAIRS, ids=list(PAIRS))
def test_every_difference_is_a_table_row_and_every_link_resolves(capsys, pair):
    a, b = PAIRS[pair]
    options = profiles(a, b) if pair != "resnet50-fp32-fp16" else []
    report = json.loads(run(capsys, "json", a, b, *options))
    page = Page(run(capsys, "html", a, b, *options))
    assert report["differences"]
    rows = [page.cells[i] for i in page.ids if i.startswith("diff-")]
    assert len(rows) == len(report["differences"])
    for row, diff in zip(rows, report["differences"]):
        assert (row["kind"], row["region"], row["what"]) == (diff["kind"], diff["region"], diff["message"])
        assert (row.get("a name"), row.get("b name")) == (diff["a"], diff["b"])
        assert row["rule"] == (diff["rule"] or "")
        assert row["onnx"].split() == diff["qdq_nodes"]
    assert len(page.ids) == len(set(page.ids))
    assert set(page.links) <= set(page.ids) | drawn_boxes(page.html)
    assert {f"rule-{d['rule']}" for d in report["differences"] if d["rule"]} <= set(page.links)
    assert len([i for i in page.ids if i.startswith("pair-")]) == len(report["pairs"])
    assert page.external == [] and page.tags["link"] == 0  # scripts are inline: none has a src


def test_same_file_names_are_told_apart_by_folder(capsys):
    page = Page(run(capsys, "html", *PAIRS["resnet50-fp32-fp16"]))
    assert page.by_tag["h1"] == ["qdq compare: fp32/resnet.onnx.engine.graph.json vs fp16/resnet.onnx.engine.graph.json"]
    assert "chart" not in page.ids  # no profiles, no chart


def test_chart_axis_and_totals_match_the_profiles(capsys):
    a, b = PAIRS["mobilenet-8.4"]
    times = {"a": average_ms(a), "b": average_ms(b)}
    report = json.loads(run(capsys, "json", a, b, *profiles(a, b)))
    page = Page(run(capsys, "html", a, b, *profiles(a, b)))
    # Totals: sums of the profiles' averageMs; both engines run in under a millisecond, so in µs.
    for side in ("a", "b"):
        value, unit = quantity(page.text[f"total-{side}"])
        assert unit == "µs" and value == pytest.approx(1000 * sum(times[side].values()), abs=0.05)
    assert page.text["axis-label"] == "time per layer, averageMs (µs)"
    for side, graph in (("A", a), ("B", b)):
        assert any(t.startswith(f"{side}: {graph.name}  total ") for t in page.by_tag["text"])
    ticks = [float(t) for t in page.by_class["tick"]]
    assert ticks[0] == 0 and len(ticks) >= 3
    assert all(t == pytest.approx(ticks[1] * k) for k, t in enumerate(ticks))
    # Each bar is its layer's averageMs, and the axis ends at the first tick above the longest bar.
    bars = {"a": [], "b": []}
    for side in bars:
        for title in page.by_class[f"bar-{side}"]:
            name, shown = title[3:].rsplit(": ", 1)
            value, _ = quantity(shown)
            assert value == pytest.approx(1000 * times[side][name], abs=0.05)
            bars[side].append(name)
    longest = 1000 * max(times[s][n] for s in bars for n in bars[s])
    assert ticks[-2] < longest <= ticks[-1]
    # The rows drawn are the TOP_LAYERS pairs with the largest |B - A|; the rest are counted and summed.
    drawn = [int(link.removeprefix("pair-")) for link in page.chart_links]
    timed = {j: p for j, p in enumerate(report["pairs"], 1) if p["a_ms"] or p["b_ms"]}
    hidden = set(timed) - set(drawn)
    delta = {j: abs((p["b_ms"] or 0) - (p["a_ms"] or 0)) for j, p in timed.items()}
    assert len(drawn) == TOP_LAYERS and min(delta[j] for j in drawn) >= max(delta[j] for j in hidden)
    note = next(t for t in page.by_class["muted"] if "more layers are not drawn" in t)
    count, rest_a, rest_b = re.search(r"(\d+) more layers are not drawn \(A ([\d.]+) µs, B ([\d.]+) µs", note).groups()
    assert int(count) == len(hidden)
    assert float(rest_a) == pytest.approx(1000 * sum(timed[j]["a_ms"] or 0 for j in hidden), abs=0.05)
    assert float(rest_b) == pytest.approx(1000 * sum(timed[j]["b_ms"] or 0 for j in hidden), abs=0.05)


def test_strings_from_the_engine_files_are_escaped(capsys, tmp_path):
    hostile = ["QuantizeLinear_2", "<script>alert(1)</script> & \"x\" 'y'", "Conv_3 <img src=x onerror=alert(1)>"]
    a = tmp_path / "a<b>&'\".json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({"Layers": [hostile[0], hostile[2]], "Bindings": []}))
    b.write_text(json.dumps({"Layers": hostile, "Bindings": []}))
    profile_a, profile_b = tmp_path / "pa.json", tmp_path / "pb.json"
    profile_a.write_text(json.dumps([{"count": 1}] + [{"name": n, "averageMs": 0.01} for n in (hostile[0], hostile[2])]))
    profile_b.write_text(json.dumps([{"count": 1}] + [{"name": n, "averageMs": 0.02} for n in hostile]))
    page = Page(run(capsys, "html", a, b, "--profile-a", profile_a, "--profile-b", profile_b))
    assert page.tags["img"] == 0 and page.external == []
    assert page.tags["script"] == 4  # the graph data and the three inline scripts: no name ended one early
    assert hostile[1] in [row.get("b name") for row in page.cells.values()]
    assert any(hostile[1] in title for title in page.by_tag["title"])  # the chart's bar tooltips
    assert str(a) in page.by_tag["code"] and a.name in page.by_tag["h1"][0]


@needs_chromium
def test_chromium_renders_the_page_with_both_engines_bars(tmp_path):
    html, png = tmp_path / "compare.html", tmp_path / "compare.png"
    RENDER.write_compare(html)
    RENDER.screenshot(html, png, (1000, 1400), CHROMIUM)
    width, height, pixels = png_pixels(png)
    colours = Counter(pixels)
    assert (width, height) == (1000, 1400)
    assert len(colours) >= 16, "a blank or nearly blank page"
    for side, hex_colour in COLOURS.items():
        assert colours[bytes.fromhex(hex_colour[1:])] > 500, f"no bar of engine {side} drawn"
