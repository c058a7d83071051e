"""Render qdq's HTML reports in headless Chromium: the pictures in docs/, and the browser the tests use.

    python docs/render_pages.py                 # writes docs/compare.png, compare_graphs.png, lint.png, fix.png
    python docs/render_pages.py --only lint --html /tmp/lint.html

The compare pages are of NVIDIA TREx's MobileNetV2 QAT pair on a TITAN RTX (TensorRT 8.4), with
profiles: A has the residual inputs quantized (good), B does not (bad). The lint page is of the
onnxruntime quantize_static YOLO-style model of the test corpus, linted for the NPU; the fix page is
of the same model fixed for TensorRT.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIR = Path("tests/fixtures/trt/trex-v0.1.x/tests-inputs")  # relative to ROOT: the page shows these paths
GOOD, BAD = "mobilenet_v2_residuals.qat.onnx.engine", "mobilenet.qat.onnx.engine"
LINT_MODEL = Path("tests/corpus/ort/yolo_u8_per_tensor.onnx")
SIZE = (1280, 2000)


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def write_compare(path: Path) -> None:
    """`qdq compare` on the pair, run from the repository root as a user would."""
    subprocess.run([sys.executable, "cli.py", "compare", str(PAIR / f"{GOOD}.graph.json"), str(PAIR / f"{BAD}.graph.json"),
                    "--profile-a", str(PAIR / f"{GOOD}.profile.json"), "--profile-b", str(PAIR / f"{BAD}.profile.json"),
                    "--format", "html", "-o", str(path.resolve())], cwd=ROOT, check=True)


def write_lint(path: Path) -> None:
    """`qdq lint --format html` on the corpus model (exit 1: it has findings)."""
    done = subprocess.run([sys.executable, "cli.py", "lint", str(LINT_MODEL), "--target", "npu", "--format", "html",
                           "-o", str(path.resolve())], cwd=ROOT)
    if done.returncode not in (0, 1):
        raise SystemExit(f"render_pages: qdq lint exited {done.returncode}")


def write_fix(path: Path) -> None:
    """`qdq fix --dry-run --report-html` on the corpus model (exit 0: it fixes clean)."""
    subprocess.run([sys.executable, "cli.py", "fix", str(LINT_MODEL), "--target", "trt", "--dry-run",
                    "--report-html", str(path.resolve())], cwd=ROOT, check=True, capture_output=True)


def _chromium(chromium: str | None, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run headless Chromium. --no-sandbox: it refuses to start as root (containers, CI) otherwise;
    the pages are local files whose scripts only draw."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise SystemExit("render_pages: no chromium found (install Debian's chromium, or pass --chromium PATH)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args],
                              check=True, capture_output=True, timeout=timeout)


def screenshot(html: Path, png: Path, size: tuple[int, int] = SIZE, chromium: str | None = None,
               fragment: str = "") -> None:
    """The top `size` pixels of the page, opened at `#fragment` (the compare page's #graphs-alone shows its
    drawing alone: Chromium's --screenshot does not follow a scroll to an element further down)."""
    _chromium(chromium, f"--window-size={size[0]},{size[1]}", f"--screenshot={png.resolve()}",
              html.resolve().as_uri() + (f"#{fragment}" if fragment else ""))
    if not png.exists():
        raise SystemExit(f"render_pages: chromium wrote no {png}")


def dump_dom(html: Path, chromium: str | None = None, fragment: str = "") -> str:
    """The page's DOM after its scripts ran, as HTML text."""
    return _chromium(chromium, "--dump-dom", html.resolve().as_uri() + (f"#{fragment}" if fragment else "")).stdout.decode()


# name: (how the page is written, picture, window size, element to scroll to)
PICTURES = {
    "compare": (write_compare, "compare.png", SIZE, ""),
    "compare-graphs": (write_compare, "compare_graphs.png", (1280, 1400), "graphs-alone"),
    "lint": (write_lint, "lint.png", (1280, 1600), ""),
    "fix": (write_fix, "fix.png", (1500, 1500), ""),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=PICTURES, help="one picture (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs (default: docs/)")
    parser.add_argument("--html", type=Path, help="with --only: also keep the HTML page here")
    parser.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    for name in [args.only] if args.only else list(PICTURES):
        write, picture, size, fragment = PICTURES[name]
        with tempfile.TemporaryDirectory() as tmp:
            html = args.html if args.only and args.html else Path(tmp) / "page.html"
            write(html)
            screenshot(html, args.out / picture, size, args.chromium, fragment)
        print(f"wrote {args.out / picture}")


if __name__ == "__main__":
    main()
