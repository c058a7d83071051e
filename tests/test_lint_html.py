"""`qdq lint --format html` and `qdq fix --report-html`: a picture of each finding's neighbourhood, with
Q/DQ coloured by parameters, read back from the page's data; and, where Chromium is installed, the
pictures drawn in a real browser."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

import cli
from browser import CHROMIUM, RENDER, needs_chromium, png_pixels
from builders import GraphBuilder
from qdq.reports import html as html_report
from test_compare_html import Page

CORPUS = Path(__file__).parent / "corpus" / "ort"
YOLO = CORPUS / "yolo_u8_per_tensor.onnx"  # onnxruntime quantize_static: five Concats and a pool mismatched


def pictures(html: str) -> dict[str, dict]:
    """The page's picture data by holder id."""
    data = re.search(r"<script type='application/json' id='onnx-pictures-data'>(.*?)</script>", html).group(1)
    return {p["holder"]: p for p in json.loads(data)}


def lint(tmp_path: Path, model: Path, target: str, fmt: str) -> str:
    out = tmp_path / f"report.{fmt}"
    assert cli.main(["lint", str(model), "--target", target, "--format", fmt, "-o", str(out)]) in (0, 1)
    return out.read_text()


def maxpool_model(path: Path, pool: str = "pool") -> Path:
    """Conv → MaxPool (named `pool`) whose output Q/DQ has twice the input's scale: what onnxruntime cannot drop."""
    g = GraphBuilder()
    x = g.input("x", [1, 3, 8, 8])
    conv = g.node("Conv", [g.qdq(x, 0.02), g.weight("w", np.full((4, 3, 3, 3), 0.1, np.float32))], name="conv")
    pool = g.node("MaxPool", [g.qdq(conv, 0.05, name="before_pool")], name=pool, kernel_shape=[2, 2])
    g.output(g.node("Relu", [g.qdq(pool, 0.1, name="after_pool")], name="relu"), [1, 4, 3, 3])
    return g.save(path)


def mismatch_colours(picture: dict) -> set[str]:
    """The colours of the Q/DQ boxes next to the finding's node: two or more when scales differ."""
    centre = next(n["id"] for n in picture["nodes"] if "centre" in n["cls"])
    near = {a for a, b, *_ in picture["edges"] if b == centre} | {b for a, b, *_ in picture["edges"] if a == centre}
    return {n["fill"] for n in picture["nodes"] if n["id"] in near and "fill" in n}


def test_each_concat_and_pool_scale_mismatch_is_a_picture(tmp_path):
    report = json.loads(lint(tmp_path, YOLO, "npu", "json"))
    html = lint(tmp_path, YOLO, "npu", "html")
    page, drawn = Page(html), pictures(html)
    findings = sorted(report["findings"], key=lambda f: (-["info", "warning", "error"].index(f["severity"]),
                                                          f["code"], f["node"] or ""))
    assert len(drawn) == len(findings) == len([i for i in page.ids if i.startswith("finding-")])
    mismatches = [(k, f) for k, f in enumerate(findings, 1) if f["code"] in ("QDQ401", "QDQ402")]
    assert Counter(f["code"] for _, f in mismatches) == {"QDQ401": 5, "QDQ402": 1}
    for k, finding in mismatches:
        picture = drawn[f"picture-{k}"]
        [centre] = [n for n in picture["nodes"] if "centre" in n["cls"]]
        assert centre["lines"][0] in ("Concat", "GlobalAveragePool") and centre["lines"][1] == finding["node"]
        assert len(mismatch_colours(picture)) >= 2, f"{finding['node']}: the mismatch is not visible"
        assert f"rule-{finding['code']}" in page.ids
    assert set(page.links) <= set(page.ids) and page.external == []


def test_equal_parameters_share_a_colour_and_different_ones_do_not(tmp_path):
    for picture in pictures(lint(tmp_path, YOLO, "npu", "html")).values():
        by_params = {}
        for node in picture["nodes"]:
            if "fill" in node:
                by_params.setdefault(node["lines"][2], set()).add(node["fill"])
        assert all(len(fills) == 1 for fills in by_params.values())
        assert len({next(iter(f)) for f in by_params.values()}) == len(by_params) == len(picture["legend"])


def test_a_maxpool_mismatch_is_drawn_with_its_producer_and_consumer(tmp_path):
    html = lint(tmp_path, maxpool_model(tmp_path / "pool.onnx"), "ort", "html")
    [picture] = [p for p in pictures(html).values()
                 if any(n["lines"][:2] == ["MaxPool", "pool"] and "centre" in n["cls"] for n in p["nodes"])]
    ops = Counter(n["lines"][0] for n in picture["nodes"])
    assert ops == {"Conv": 1, "MaxPool": 1, "Relu": 1, "Q → DQ": 3}
    assert len(mismatch_colours(picture)) == 2
    assert sorted(picture["legend"]) == ["scale 0.02 zp 0", "scale 0.05 zp 0", "scale 0.1 zp 0"]


def test_names_from_the_model_are_escaped(tmp_path):
    hostile = "<script>alert(1)</script> & \"x\" 'y'"
    html = lint(tmp_path, maxpool_model(tmp_path / "pool.onnx", pool=hostile), "ort", "html")
    page = Page(html)
    assert page.tags["script"] == 4 and page.external == []  # the picture data and three inline scripts
    assert hostile in page.by_tag["code"]
    assert any(node["title"] == f"MaxPool {hostile}" for p in pictures(html).values() for node in p["nodes"])


def test_a_page_draws_at_most_MAX_PICTURES(tmp_path, monkeypatch):
    monkeypatch.setattr(html_report, "MAX_PICTURES", 10)
    html = lint(tmp_path, YOLO, "npu", "html")
    assert len(pictures(html)) == 10 and html.count("No picture: a page draws at most 10.") == 285 - 10


def test_fix_report_draws_each_finding_before_and_after(tmp_path):
    model, fixed, report = maxpool_model(tmp_path / "pool.onnx"), tmp_path / "fixed.onnx", tmp_path / "fix.html"
    assert cli.main(["fix", str(model), "--target", "ort", "-o", str(fixed), "--report-html", str(report)]) == 0
    html = report.read_text()
    drawn, page = pictures(html), Page(html)
    numbers = [int(i.removeprefix("finding-")) for i in page.ids if i.startswith("finding-")]
    assert numbers and {f"before-{k}" for k in numbers} | {f"after-{k}" for k in numbers} <= set(drawn)
    pool = next(k for k in numbers if any(n["lines"][:2] == ["MaxPool", "pool"] and "centre" in n["cls"]
                                          for n in drawn[f"before-{k}"]["nodes"]))
    assert len(mismatch_colours(drawn[f"before-{pool}"])) == 2
    assert len(mismatch_colours(drawn[f"after-{pool}"])) == 1, "after the fix the pool's in and out share a scale"
    assert "fixed" in page.by_class and set(page.links) <= set(page.ids)



def test_before_and_after_pictures_share_their_colours(tmp_path):
    """For TensorRT the fix moves the pool's output to the input's scale and leaves the conv's input
    alone: each parameter keeps its colour from the first picture to the second."""
    model, fixed, report = maxpool_model(tmp_path / "pool.onnx"), tmp_path / "fixed.onnx", tmp_path / "fix.html"
    assert cli.main(["fix", str(model), "--target", "trt", "-o", str(fixed), "--report-html", str(report)]) == 0
    drawn = pictures(report.read_text())
    pairs = [(drawn[h]["legend"], drawn[h.replace("before-", "after-")]["legend"]) for h in drawn
             if h.startswith("before-") and h.replace("before-", "after-") in drawn]
    shared = [(before, after, set(before) & set(after)) for before, after in pairs]
    assert any(common for *_, common in shared)
    assert all(before[p] == after[p] for before, after, common in shared for p in common)


def test_fix_report_to_a_missing_folder_is_refused_before_any_work(tmp_path, capsys):
    model, fixed = maxpool_model(tmp_path / "pool.onnx"), tmp_path / "fixed.onnx"
    code = cli.main(["fix", str(model), "--target", "ort", "-o", str(fixed), "--report-html",
                     str(tmp_path / "missing" / "fix.html")])
    assert code == 2 and not fixed.exists()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@needs_chromium
def test_chromium_draws_every_picture(tmp_path):
    """On the small MaxPool model: the YOLO page (285 pictures) takes Chromium 4 s a run; docs/lint.png is of it."""
    html, png = tmp_path / "report.html", tmp_path / "lint.png"
    expected = pictures(lint(tmp_path, maxpool_model(tmp_path / "pool.onnx"), "ort", "html"))
    drawn = Page(RENDER.dump_dom(html, CHROMIUM))
    holders = re.findall(r'<div class="picture" id="([^"]+)"><svg[^>]*>(.*?)</svg>', drawn.html, re.DOTALL)
    assert {holder for holder, _ in holders} == set(expected)
    for holder, svg in holders:
        assert svg.count('<g class="node') == len(expected[holder]["nodes"])
    assert set(drawn.links) <= set(drawn.ids)
    RENDER.screenshot(html, png, (1280, 1600), CHROMIUM)
    _, _, pixels = png_pixels(png)
    colours = Counter(pixels)
    assert len(colours) >= 16, "a blank or nearly blank picture"
    assert colours[bytes.fromhex("cc0000")] > 100, "no finding node (red border) drawn"
