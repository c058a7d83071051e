"""The engine graphs of `qdq compare --format html`: what the page's data says each box shows and links
to, against the JSON report; the regions that start collapsed; and, where Chromium is installed, the
drawing in a real browser (the boxes are there, every link resolves, the picture is not blank)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

import cli
from browser import CHROMIUM, RENDER, needs_chromium, png_pixels
from qdq.reports.engine_graph import COLLAPSE_ABOVE
from test_compare_html import PAIRS, Page, graph_data, run

_spec = importlib.util.spec_from_file_location(
    "html_render", Path(__file__).resolve().parent.parent / "benchmarks" / "html_render.py")
BENCH = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(BENCH)


def boxes(data: dict, side: str) -> dict[str, dict]:
    """A side's boxes by layer name (a box's tooltip starts with the full name)."""
    [layers] = [s["layers"] for s in data["sides"] if s["key"] == side]
    return {box["title"].split("\n")[0]: box for box in layers}


@pytest.mark.parametrize("pair", PAIRS, ids=list(PAIRS))
def test_every_layer_a_difference_names_is_a_highlighted_box_linked_to_it(capsys, pair):
    a, b = PAIRS[pair]
    report = json.loads(run(capsys, "json", a, b))
    page = Page(run(capsys, "html", a, b))
    data = graph_data(page.html)
    by_side = {"a": boxes(data, "a"), "b": boxes(data, "b")}
    named: dict[tuple[str, str], set[int]] = {}
    for i, diff in enumerate(report["differences"], 1):
        layers = [("a", diff["a"]), ("b", diff["b"])] + [("b", p) for p in diff["details"].get("b_pieces", [])]
        for side, name in layers:
            if name is not None:
                box = by_side[side][name]
                assert diff["kind"] in box["cls"].split(), (i, name)
                named.setdefault((side, name), set()).add(i)
    for side, side_boxes in by_side.items():
        for name, box in side_boxes.items():
            first = min(named.get((side, name), {0}))
            assert box["href"] == (f"#diff-{first}" if first else f"#pair-{box['j']}")
            assert box["href"][1:] in page.ids and ("badge" not in box or box["badge"]["href"][1:] in page.ids)
            highlights = set(box["cls"].split()) & {"only-in-a", "only-in-b", "precision", "fusion"}
            assert bool(highlights) == bool(first), f"{name} highlighted without a difference, or not highlighted"
    # Paired layers share a row; a layer only one side has leaves that row empty on the other.
    for j, row in enumerate(report["pairs"], 1):
        for side in ("a", "b"):
            assert (row[side] is not None) == (by_side[side].get(row[side], {}).get("j") == j)


@pytest.mark.parametrize("pair, expected", [("mobilenet-8.4", 15), ("resnet18-qat", 8)])
def test_extra_quantize_layers_of_the_qat_engine_are_boxes_linked_to_QDQ802(capsys, pair, expected):
    """NVIDIA's MobileNetV2 QAT engine has 15 standalone Q layers its residual-quantized twin lacks, ResNet-18
    8 (tests/test_trt_engine_pairs.py says why): each is a red box in B's column, linked to its difference
    and, by its badge, to QDQ802."""
    a, b = PAIRS[pair]
    report = json.loads(run(capsys, "json", a, b))
    page = Page(run(capsys, "html", a, b))
    b_boxes = boxes(graph_data(page.html), "b")
    extra = [(i, d) for i, d in enumerate(report["differences"], 1)
             if d["kind"] == "only-in-b" and d["details"]["role"] == "qdq"]
    assert len(extra) == expected and {d["rule"] for _, d in extra} == {"QDQ802"}
    for i, diff in extra:
        box = b_boxes[diff["b"]]
        assert box["cls"].split() == ["qdq", "only-in-b"] and box["lines"][1].startswith("Quantize ")
        assert box["href"] == f"#diff-{i}" and box["badge"] == {"text": "QDQ802", "href": "#rule-QDQ802"}
    assert {f"diff-{i}" for i, _ in extra} | {"rule-QDQ802"} <= set(page.ids)
    assert sum("only-in-b" in box["cls"] for box in b_boxes.values() if box["cls"].startswith("qdq")) == expected


def test_a_large_drawing_starts_with_the_regions_without_differences_collapsed(capsys, tmp_path):
    a, b = BENCH.synthetic_pair(tmp_path, layers=400, every=3)
    data = graph_data(run(capsys, "html", a, b))
    assert len(data["rows"]) > COLLAPSE_ABOVE
    assert [block["collapsed"] for block in data["blocks"]] == [not block["diffs"] for block in data["blocks"]]
    open_regions = [block["region"] for block in data["blocks"] if not block["collapsed"]]
    assert open_regions == [f"features.{k}" for k in range(0, 120, 3)]  # the blocks B changed
    small = graph_data(run(capsys, "html", *PAIRS["mobilenet-8.4"]))
    assert not any(block["collapsed"] for block in small["blocks"])


@needs_chromium
def test_chromium_draws_the_boxes_and_every_link_resolves(tmp_path):
    html, png = tmp_path / "compare.html", tmp_path / "graphs.png"
    RENDER.write_compare(html)
    data = graph_data(html.read_text())
    drawn = Page(RENDER.dump_dom(html, CHROMIUM))
    assert drawn.ids and set(drawn.links) <= set(drawn.ids)
    expected = {f"g{side['key']}-{box['j']}" for side in data["sides"] for box in side["layers"]}
    assert expected <= set(drawn.ids)
    extra = re.findall(r'<g class="node qdq only-in-b" id="gb-\d+">((?:(?!</g>).)*)</g>', drawn.html, re.DOTALL)
    assert len(extra) == 15
    assert all(re.search(r'<a href="#diff-\d+">', box) and '<a class="badge" href="#rule-QDQ802">' in box for box in extra)
    RENDER.screenshot(html, png, (1280, 1400), CHROMIUM, "graphs-alone")
    _, _, pixels = png_pixels(png)
    colours = Counter(pixels)
    assert len(colours) >= 16, "a blank or nearly blank picture"
    assert colours[bytes.fromhex("ffdddd")] > 2000, "no extra Q box (only in B) drawn"
    assert colours[bytes.fromhex("ffeecc")] > 2000, "no precision-change box drawn"


@needs_chromium
def test_a_link_into_a_collapsed_region_opens_it(capsys, tmp_path):
    a, b = BENCH.synthetic_pair(tmp_path, layers=400, every=3)
    html = tmp_path / "large.html"
    assert cli.main(["compare", str(a), str(b), "--format", "html", "-o", str(html)]) == 0
    data = graph_data(html.read_text())
    hidden = next(j for j, block in enumerate(data["rows"], 1)
                  if data["blocks"][block]["collapsed"] and data["blocks"][block]["layers"]["b"] > 1)
    opened = Page(RENDER.dump_dom(html, CHROMIUM, f"gb-{hidden}"))
    assert f"gb-{hidden}" in opened.ids
    drawn_rows = int(re.search(r'data-rows="(\d+)"', opened.html).group(1))
    # The opened region shows all its rows; every other collapsed region is still one row.
    opened_block, rows_of = data["rows"][hidden - 1], Counter(data["rows"])
    expected = len(data["rows"]) - sum(rows_of[k] - 1 for k, block in enumerate(data["blocks"])
                                       if block["collapsed"] and k != opened_block)
    assert drawn_rows == expected < len(data["rows"])
