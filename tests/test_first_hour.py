"""What a new user types in their first hour, and what they must read back (issue 37)."""

from __future__ import annotations

from pathlib import Path

from cli_run import qdq

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"


def test_trt_reports_the_uint8_activations_asymmetric_zero_points_once_with_what_it_needs():
    """onnxruntime's uint8 PTQ for TensorRT: QDQ505 lists each uint8 activation; QDQ503 says once
    that they stay asymmetric as int8, and what TensorRT needs (not "zero-point 0; needs 0")."""
    run = qdq("lint", CORPUS / "ort" / "resnet_u8_per_tensor.onnx", "--target", "trt", "--format", "json")
    findings = run.json()["findings"]
    asymmetric = [f for f in findings if f["code"] == "QDQ503"]
    retyped = [f for f in findings if f["code"] == "QDQ505"]
    assert len(retyped) == 16 and len(asymmetric) == 1
    assert sorted(asymmetric[0]["tensors"]) == sorted(t for f in retyped for t in f["tensors"])
    message = asymmetric[0]["message"]
    assert "16 uint8 activations" in message and message.endswith("the target needs int8 with zero-point 0")
