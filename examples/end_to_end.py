"""End to end: train a small CNN on digits, FX QAT, export, lint, fix for npu/trt/ort, verify, feed the npu scales back.

The pipeline a user of qdq runs, on scikit-learn's digits (8×8, upsampled to 32×32, offline):

1. train the float network (`DigitsNet`: residual Add, MaxPool, nearest Upsample, Concat);
2. FX QAT with learned power-of-two thresholds (`qdq.fx.tqt_pow2_qconfig_mapping`, what the NPU
   takes) and `qdq.fx.export` to QDQ ONNX;
3. `qdq lint` the export for each target, `qdq fix` it for npu, trt and ort, and compare every
   fixed model with the export (`qdq.verify`);
4. load the npu-fixed scales into the FX model (`qdq.fx.load_scales`, which freezes them),
   fine-tune briefly, export again and fix for npu again: with the hardware's scales already in
   the network, that second fix has nothing left to move but exporter artefacts.

It says on stderr which stage is running, then prints one table (accuracy on the test split in onnxruntime, lint findings before → after the
fix, the fix's SQNR, latency, changes). `make_demo_model.py` runs it at the default settings and
bundles its QAT export as `examples/models/demo_fx_qat.onnx`, the model of the README's first command.

    python examples/end_to_end.py [--epochs N] [--qat-steps N] [--finetune-steps N] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # networks.py, next to this file

import networks  # noqa: E402

from qdq import fix, lint, load_model, load_target, save_model  # noqa: E402
from qdq.engine.registry import all_rules  # noqa: E402
from qdq.fx import export, int8_backend_config, load_scales, tqt_pow2_qconfig_mapping  # noqa: E402
from qdq.reports.json import dumps  # noqa: E402
from qdq.rewrite.rule import Change, FixSafety, Severity  # noqa: E402
from qdq.verification.verify import compare, compare_arrays, make_inputs  # noqa: E402

DEMO_MODEL = Path(__file__).resolve().parent / "models" / "demo_fx_qat.onnx"
TARGETS = ("npu", "trt", "ort")
SIZE = 32  # digits are upsampled to SIZE×SIZE (networks.load_data)


# --------------------------------------------------------------------------- network


def conv_bn_relu(cin: int, cout: int, k: int = 3, stride: int = 1, relu: bool = True) -> nn.Sequential:
    """Conv (with bias, as most exported models have) + BatchNorm (+ ReLU); FX QAT fuses them into one ConvBn."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class DigitsNet(nn.Module):
    """A stride-2 stem, a residual block, a MaxPool'd deeper path brought back by nearest Upsample and
    concatenated with the block's output (an FPN step), a 1×1 fuse conv, GAP and a Linear head."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = conv_bn_relu(1, width, 3, 2)  # 32 → 16
        self.block = nn.Sequential(conv_bn_relu(width, width), conv_bn_relu(width, width, relu=False))
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)  # 16 → 8
        self.deep = conv_bn_relu(width, 2 * width)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")  # 8 → 16
        self.fuse = conv_bn_relu(3 * width, 2 * width, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, networks.NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.relu(self.block(x) + x)
        deep = self.upsample(self.deep(self.pool(x)))
        x = self.fuse(torch.cat([deep, x], 1))
        return self.fc(torch.flatten(self.gap(x), 1))


# --------------------------------------------------------------------------- pipeline


@dataclass
class Settings:
    epochs: int = 8  # float training (then epochs // 4 at lr / 10)
    qat_steps: int = 400  # QAT batches of 32
    finetune_steps: int = 100  # batches after loading the npu scales
    lr: float = 3e-3  # float training
    qat_lr: float = 5e-4
    finetune_lr: float = 1e-4
    seed: int = 0
    train_limit: int | None = None  # use only this many training images (fast tests)
    test_limit: int | None = None
    latency_runs: int = 500


@dataclass
class Row:
    """One line of the table; None where a column does not apply."""

    name: str
    path: str
    accuracy: float  # top-1 on the test split, onnxruntime with graph optimizations (ORT_ENABLE_ALL)
    accuracy_as_written: float  # the same, optimizations off (the file exactly as written)
    latency_ms: float = 0.0  # median, batch 1, one thread, ORT_ENABLE_ALL (`latencies`)
    target: str | None = None
    findings_before: int | None = None  # every lint finding of the fixed model's input, this target
    findings_after: int | None = None
    clean: bool | None = None  # nothing at warning or above left after the fix
    sqnr_db: float | None = None  # the fixed model's logits against its input's, on the test split
    verified: bool | None = None  # qdq fix's own check: random inputs, min SQNR 10 dB
    changes: int | None = None
    approximate_changes: int | None = None  # changes whose numerics are not bit-exact
    findings: dict[str, int] = field(default_factory=dict)  # per target, for the QAT export row


@dataclass
class Report:
    data: str
    settings: Settings
    rows: list[Row]
    scales_loaded: int  # fake-quants load_scales wrote
    fake_quants: int  # fake-quants of the FX model
    unmatched: list[str]  # fake-quants with no Q/DQ in the npu-fixed file
    load_problems: list[str]
    seconds: float

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)


def run(settings: Settings, out: Path) -> Report:
    """The whole pipeline; every ONNX file it makes goes to `out`."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    data, source = _data(settings)
    rows = []
    say = _stages(start)

    say(f"training the float network ({settings.epochs} epochs)")
    model = train_float(data, settings)
    float_path = networks.export_float(model, out / "float.onnx", channels=1)
    rows.append(_measure("float", float_path, data))

    say(f"FX QAT ({settings.qat_steps} batches) and export")
    prepared = prepare_qat(model, data, settings)
    qat_path = export_qat(prepared, data, out / "qat.onnx")
    qat_row = _measure("QAT export", qat_path, data)
    qat_row.findings = {t: len(lint(load_model(qat_path), load_target(t)).findings) for t in TARGETS}
    rows.append(qat_row)

    for target in TARGETS:
        say(f"qdq fix --target {target}, verify, accuracy")
        rows.append(fix_and_measure(f"{target} fix", target, qat_path, out / f"qat_{target}.onnx", data))

    say(f"loading the npu-fixed scales, fine-tuning ({settings.finetune_steps} batches), fixing again")
    load = load_scales(prepared, out / "qat_npu.onnx")
    prepared = finetune(prepared, data, settings)
    again = export_qat(prepared, data, out / "finetuned.onnx")
    rows.append(fix_and_measure("feedback + npu fix", "npu", again, out / "finetuned_npu.onnx", data))

    say(f"latency ({settings.latency_runs} runs per model)")
    for row, ms in zip(rows, latencies([Path(r.path) for r in rows], data[2][:1].numpy(), settings.latency_runs)):
        row.latency_ms = ms
    fake_quants = sum(isinstance(m, torch.ao.quantization.FakeQuantizeBase) for m in prepared.modules())
    return Report(source, settings, rows, len(load.loaded), fake_quants, load.unmatched_fx, load.problems,
                  time.perf_counter() - start)


def _stages(start: float):
    """A function that says on stderr which stage starts, with the time so far: the run takes minutes."""
    def say(stage: str) -> None:
        print(f"[{time.perf_counter() - start:5.0f} s] {stage}", file=sys.stderr, flush=True)
    return say


def _data(settings: Settings) -> tuple[networks.Data, str]:
    source = "digits" if networks.has_sklearn() else "glyphs"
    train_x, train_y, test_x, test_y = networks.load_data(1, SIZE, settings.seed, source)
    return (train_x[:settings.train_limit], train_y[:settings.train_limit],
            test_x[:settings.test_limit], test_y[:settings.test_limit]), source


def train_float(data: networks.Data, settings: Settings) -> nn.Module:
    """`epochs` of Adam, then a quarter as many at a tenth of the rate: constant-rate Adam ends noisy
    (8 epochs at 3e-3 alone: 91.7 % on the test split; with the 2 slower ones: 99.4 %)."""
    torch.manual_seed(settings.seed)
    model = networks.train(DigitsNet(), data, settings.epochs, settings.lr, settings.seed)
    return networks.train(model, data, max(1, settings.epochs // 4), settings.lr / 10, settings.seed + 1)


def prepare_qat(model: nn.Module, data: networks.Data, settings: Settings) -> nn.Module:
    """FX QAT from the trained float model with learned power-of-two thresholds (TQT)."""
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    torch.manual_seed(settings.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        prepared = prepare_qat_fx(
            copy.deepcopy(model).train(), tqt_pow2_qconfig_mapping(), (data[0][:1],),
            backend_config=int8_backend_config(),
        )
    return _train_steps(prepared, data, settings.qat_steps, settings.qat_lr, settings.seed)


def finetune(prepared: nn.Module, data: networks.Data, settings: Settings) -> nn.Module:
    """A few more QAT batches with the scales load_scales froze: only weights and BatchNorm move."""
    return _train_steps(prepared, data, settings.finetune_steps, settings.finetune_lr, settings.seed + 1)


def _train_steps(model: nn.Module, data: networks.Data, steps: int, lr: float, seed: int) -> nn.Module:
    """`steps` Adam batches of 32; frozen parameters (thresholds load_scales fixed) get no gradient, so stay."""
    epochs = -(-steps * 32 // len(data[0]))  # enough epochs for `steps` batches of 32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        return networks.train(model, data, epochs, lr, seed, max_steps=steps)


def export_qat(prepared: nn.Module, data: networks.Data, path: Path) -> Path:
    """`qdq.fx.export`, batch 1, opset 17; leaves the model in eval mode with observers off."""
    return export(prepared, (data[0][:1],), path, opset=networks.OPSET, input_names=["input"], output_names=["logits"])


def fix_and_measure(name: str, target: str, source: Path, fixed_path: Path, data: networks.Data) -> Row:
    """Lint `source` for `target`, fix it, save it, compare it with `source`, measure it."""
    ruleset = load_target(target)
    before = lint(load_model(source), ruleset)
    model = load_model(source)
    result = fix(model, ruleset)
    save_model(model, fixed_path)
    verification = compare(source, fixed_path, make_inputs(source), atol=np.inf, rtol=0.0, min_sqnr=10.0)
    row = _measure(name, fixed_path, data)
    row.target = target
    row.findings_before, row.findings_after = len(before.findings), len(result.result.findings)
    row.clean = result.converged and not result.result.failing(Severity.WARNING)
    reference = networks.predict_onnx(source, data[2], optimize=False)
    candidate = networks.predict_onnx(fixed_path, data[2], optimize=False)
    row.sqnr_db = compare_arrays("logits", reference, candidate).sqnr_db
    row.verified = verification.passed
    row.changes = len(result.changes)
    row.approximate_changes = sum(1 for c in result.changes if not _exact(c))
    return row


def _exact(change: Change) -> bool:
    """Bit-exact: the rule's fixes always are, or this change says it was (a BatchNorm folded exactly)."""
    return change.values.get("exact", all_rules()[change.code].fix_safety == FixSafety.EXACT) is True


def _measure(name: str, path: Path, data: networks.Data) -> Row:
    return Row(name, str(path), networks.accuracy(path, data), networks.accuracy(path, data, optimize=False))


def latencies(paths: list[Path], x: np.ndarray, runs: int) -> list[float]:
    """Median ms of one batch-1 run of each model: one thread, ORT_ENABLE_ALL, after 10 warm-up runs.

    The models take turns, 10 runs each, so a burst of load from other processes slows them all
    alike instead of one of them.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in paths]
    feeds = [{s.get_inputs()[0].name: x} for s in sessions]
    times: list[list[float]] = [[] for _ in paths]
    for turn in range(1 + -(-runs // 10)):
        for session, feed, spent in zip(sessions, feeds, times):
            for _ in range(10):
                begin = time.perf_counter()
                session.run(None, feed)
                if turn:  # the first turn warms up
                    spent.append(time.perf_counter() - begin)
    return [1000 * float(np.median(spent)) for spent in times]


# --------------------------------------------------------------------------- table


def table(report: Report) -> str:
    """The report as a Markdown table, one row per model."""
    header = ("model", "top-1 % (ORT_ENABLE_ALL)", "top-1 % (no graph opt.)", "findings before → after", "fix SQNR dB",
              "verify", "changes (approx.)", "latency ms")
    lines = [header]
    for r in report.rows:
        if r.findings:
            findings = ", ".join(f"{t} {n}" for t, n in r.findings.items())
        elif r.target is not None:
            findings = f"{r.target} {r.findings_before} → {r.findings_after}" + ("" if r.clean else " (not clean)")
        else:
            findings = "-"
        lines.append((
            r.name, f"{100 * r.accuracy:.2f}", f"{100 * r.accuracy_as_written:.2f}", findings,
            "-" if r.sqnr_db is None else f"{r.sqnr_db:.1f}",
            "-" if r.verified is None else ("pass" if r.verified else "FAIL"),
            "-" if r.changes is None else f"{r.changes} ({r.approximate_changes})",
            f"{r.latency_ms:.3f}",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings()
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="float training epochs")
    parser.add_argument("--qat-steps", type=int, default=defaults.qat_steps, help="FX QAT batches")
    parser.add_argument("--finetune-steps", type=int, default=defaults.finetune_steps,
                        help="batches after loading the npu-fixed scales")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, help="keep the ONNX files here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the table as JSON")
    args = parser.parse_args(argv)
    if min(args.epochs, args.qat_steps) < 1 or args.finetune_steps < 0:
        parser.error("--epochs and --qat-steps must be at least 1, --finetune-steps at least 0")
    settings = Settings(epochs=args.epochs, qat_steps=args.qat_steps, finetune_steps=args.finetune_steps,
                        seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="qdq-e2e-") as folder:
        out = args.out or Path(folder)
        report = run(settings, out)
    print(f"data: {report.data}; {report.seconds:.0f} s; load_scales: {report.scales_loaded} of "
          f"{report.fake_quants} fake-quants")
    print(table(report))
    if args.json is not None:
        args.json.write_text(dumps(asdict(report)))  # SQNR inf (identical logits) as "inf"
    return report


if __name__ == "__main__":
    main()
