"""The float models every quantizer in the corpus starts from, with their calibration samples.

Writes, next to this script, for each architecture ARCH in resnet, mobilenetv2, yolo, transformer:

- `ARCH.onnx`: the network trained briefly on scikit-learn's digits (32×32), exported by the
  TorchScript exporter (opset 17, BatchNorm folded, input "input", output "logits", dynamic batch);
- `ARCH.npz`: 16 training images, one array per graph input ("input": [16, C, 32, 32], float32),
  for calibration and for checking the quantized models;
- `manifest.json`.

resnet, mobilenetv2 and yolo are `examples/networks.py`'s CNNs; `ViTStyle` (below) is a tiny
vision transformer with explicit attention (MatMul, Softmax, MatMul), LayerNorm and GELU.

    python tests/corpus/float/make_float.py

Everything is seeded, so a re-run writes the same networks (bit-identical on the same torch build).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "examples"))
import networks  # noqa: E402  (examples/networks.py)

SEED = 0
SAMPLES = 16
# corpus architecture name → (input channels, network factory, training epochs); the transformer
# needs more epochs than the CNNs to pass 90% test accuracy on digits.
ARCHITECTURES = {
    "resnet": (networks.INPUT_CHANNELS["resnet"], networks.ResNetStyle, 4),
    "mobilenetv2": (networks.INPUT_CHANNELS["mobilenet"], networks.MobileNetV2Style, 4),
    "yolo": (networks.INPUT_CHANNELS["yolo"], networks.YoloStyle, 4),
    "transformer": (3, lambda channels: ViTStyle(channels), 10),
}


# --------------------------------------------------------------------------- the transformer


class Attention(nn.Module):
    """Multi-head self-attention written out: Q·Kᵀ (MatMul), scale, Softmax, ·V (MatMul), projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, tokens, dim] → [batch, heads, tokens, head_dim]."""
        batch, tokens, _ = x.shape
        return x.reshape(batch, tokens, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        weights = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim), dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(batch, tokens, dim)
        return self.proj(out)


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTStyle(nn.Module):
    """4×4 patch Conv (32×32 → 64 tokens), position embedding, two encoder blocks, LN, mean-pool, Linear."""

    def __init__(self, in_channels: int = 3, num_classes: int = networks.NUM_CLASSES, dim: int = 32,
                 depth: int = 2, heads: int = 2, patch: int = 4, size: int = 32) -> None:
        super().__init__()
        self.patch = nn.Conv2d(in_channels, dim, patch, patch)
        self.position = nn.Parameter(torch.randn(1, (size // patch) ** 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.blocks(tokens)).mean(dim=1))


# --------------------------------------------------------------------------- building and checking


def data_for(arch: str) -> networks.Data:
    """The digits split of `examples/networks.py` with this architecture's input channels."""
    return networks.load_data(ARCHITECTURES[arch][0], seed=SEED, source="digits")


def build(arch: str, data: networks.Data) -> nn.Module:
    """A freshly seeded network of `arch`, trained on `data`, in eval mode."""
    channels, factory, epochs = ARCHITECTURES[arch]
    torch.manual_seed(SEED)
    return networks.train(factory(channels), data, epochs, seed=SEED)


def samples(data: networks.Data) -> dict[str, np.ndarray]:
    """The first SAMPLES training images, keyed by the graph input name."""
    return {"input": data[0][:SAMPLES].numpy().astype(np.float32)}


def check(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """onnx's full check, then onnxruntime on every sample; returns the logits."""
    onnx.checker.check_model(str(path), full_check=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def main() -> None:
    torch.use_deterministic_algorithms(True)
    manifest = []
    for arch in ARCHITECTURES:
        data = data_for(arch)
        model = build(arch, data)
        path = HERE / f"{arch}.onnx"
        networks.export_float(model, path)
        inputs = samples(data)
        np.savez(HERE / f"{arch}.npz", **inputs)
        logits = check(path, inputs)
        with torch.no_grad():
            expected = model(torch.from_numpy(inputs["input"])).numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)
        print(f"{arch:<12} test accuracy {networks.accuracy(path, data):.3f}  "
              f"{path.stat().st_size / 1024:.0f} KiB", flush=True)
        manifest.append({
            "file": path.name,
            "architecture": arch,
            "tool": "torch.onnx.export",
            "version": torch.__version__,
            "settings": {"dynamo": False, "opset_version": networks.OPSET, "do_constant_folding": True,
                         "dynamic_axes": {"input": {"0": "batch"}, "logits": {"0": "batch"}},
                         "training_epochs": ARCHITECTURES[arch][2], "seed": SEED},
            "made_by": "make_float.py",
            "note": f"calibration samples: {arch}.npz (input [{SAMPLES}, C, 32, 32] float32, digits train split)",
        })
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def make_variants(manifest_dir: Path, variants: tuple[str, ...], quantize) -> None:
    """Makes the variants named on the command line (default: all); the manifest keeps the others.

    A quantizer's corpus folder (brevitas, modelopt_torch) calls this with its own `quantize(stem)`,
    which returns the variant's manifest entry."""
    torch.use_deterministic_algorithms(True)
    path = manifest_dir / "manifest.json"
    entries = {e["file"]: e for e in json.loads(path.read_text())} if path.exists() else {}
    for stem in sys.argv[1:] or variants:
        entries[f"{stem}.onnx"] = quantize(stem)
        manifest = [entries[f"{stem}.onnx"] for stem in variants if f"{stem}.onnx" in entries]
        path.write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
