"""Report writers: each format must carry the same findings in the shape its consumer expects."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from qdq.engine.lint import LintReport, LintResult, Unreadable
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import RuleConfig, RuleSet
from qdq.reports import FORMATS, render, sarif
from qdq.reports.text import finding_line
from qdq.rewrite.rule import RULES, Finding, FixSafety, Rule, Severity

MODEL = Path("models/model.onnx")
OTHER = Path("models/more/other model.onnx")


class _DummyScale(Rule):
    """Dummy rule for report tests.

    Only used when no real rules are registered yet.
    """

    code = "TST001"
    name = "dummy-scale"
    message = "{node} has a dummy problem: {why}"
    severity = Severity.ERROR


class _DummyConcat(Rule):
    """Second dummy rule, so reports have more than one rule to group by."""

    code = "TST002"
    name = "dummy-concat"
    message = "{node} is dummy"


@pytest.fixture
def codes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two rule codes: real ones when rules are registered, else dummies registered for this test only."""
    real = list(all_rules())
    if len(real) >= 2:
        return real[:2]
    for rule in (_DummyScale, _DummyConcat):
        monkeypatch.setitem(RULES, rule.code, rule)
    return [_DummyScale.code, _DummyConcat.code]


def make_result(
    codes: list[str], findings: list[Finding], notes: list[str] | None = None, model: Path = MODEL
) -> LintResult:
    rules = {code: RuleConfig(code, True, Severity.WARNING, {}) for code in codes}
    return LintResult(model, RuleSet("npu", "test set", rules), findings, list(codes), notes or [])


@pytest.fixture
def several(result: LintResult, codes: list[str]) -> LintReport:
    """Three models: `result`'s, one with one finding of each rule (one name with `,` and `:`), and one unreadable."""
    a, b = codes
    other = make_result(codes, [
        Finding(a, "conv1 scale is zero", Severity.ERROR, "conv1", ("conv1_scale",)),
        Finding(b, "weird, node: name\nsecond line 100%", Severity.INFO, "odd,na:me"),
    ], notes=["no opset import for ai.onnx.ml"], model=OTHER)
    return LintReport(result.ruleset, [result, Unreadable(Path("broken.onnx"), "broken.onnx: file is empty"), other])


@pytest.fixture
def result(codes: list[str]) -> LintResult:
    a, b = codes
    return make_result(
        codes,
        [
            Finding(a, "conv1 scale is zero", Severity.ERROR, "conv1", ("conv1_scale",),
                    {"scale": np.float32(0.0), "shape": np.array([1, 2])}, FixSafety.EXACT),
            Finding(a, "conv2 scale is NaN", Severity.WARNING, "conv2", ("conv2_scale",),
                    {"scale": float("nan")}),
            Finding(b, 'add <&"1"> scales differ', Severity.WARNING, 'add <&"1">', ("t1", "t2"),
                    {"ratio": 2.0}, FixSafety.APPROXIMATE),
            Finding(b, "graph-level remark", Severity.INFO, None),
        ],
        notes=["opset 13 model"],
    )


def test_render_dispatches_every_format(result: LintResult) -> None:
    for fmt in FORMATS:
        out = render(result, fmt, fail_on=Severity.ERROR)
        assert out.endswith("\n") and "conv1" in out
        # One model's result renders as a run over that one model.
        assert out == render(LintReport(result.ruleset, [result]), fmt, fail_on=Severity.ERROR)
    with pytest.raises(ValueError, match="unknown report format"):
        render(result, "yaml", fail_on=Severity.ERROR)


# --- text ---------------------------------------------------------------------------------------


def test_text_lines_and_summary(result: LintResult, codes: list[str]) -> None:
    lines = render(result, "text", fail_on=Severity.WARNING).splitlines()
    a, b = codes
    # The message names its node already, so the node is not repeated in front of it.
    assert lines[0] == f"models/model.onnx: {a} [error] conv1 scale is zero (fix: exact)"
    assert f"models/model.onnx: {b} [info] graph-level remark" in lines
    # Most severe first: the info finding comes after every warning.
    assert lines.index(f"models/model.onnx: {b} [info] graph-level remark") == 3
    assert "note: opset 13 model" in lines
    assert lines[-2] == f"By rule: {', '.join(sorted(f'{c} x2' for c in (a, b)))}"
    assert lines[-1] == (
        "Found 4 findings (1 error, 2 warnings, 1 info) in models/model.onnx with rule set 'npu'; "
        "2 with an automatic fix (1 approximate)"
    )


def test_text_says_when_nothing_reaches_the_threshold(codes: list[str]) -> None:
    only_info = make_result(codes, [Finding(codes[0], "fyi", Severity.INFO, "n")])
    summary = render(only_info, "text", fail_on=Severity.ERROR).splitlines()[-1]
    assert summary.startswith("Found 1 finding (1 info)")
    assert summary.endswith("none at or above --fail-on error")


def test_text_clean_model(codes: list[str]) -> None:
    out = render(make_result(codes, []), "text", fail_on=Severity.ERROR)
    assert out == "models/model.onnx: clean (2 rules checked, rule set 'npu')\n"


def test_text_several_models(several: LintReport, codes: list[str]) -> None:
    lines = render(several, "text", fail_on=Severity.ERROR).splitlines()
    a, b = codes
    # Each model's findings under its own path, in the order the models were given.
    prefixes = [line.split(": ", 1)[0] for line in lines if f" {a} [" in line or f" {b} [" in line]
    assert prefixes == ["models/model.onnx"] * 4 + ["models/more/other model.onnx"] * 2
    assert "note: models/model.onnx: opset 13 model" in lines
    assert lines[-2] == f"By rule: {a} x3, {b} x3"
    assert lines[-1] == (
        "Found 6 findings (2 errors, 2 warnings, 2 info) in 2 of 2 models with rule set 'npu'; "
        "2 with an automatic fix (1 approximate); 1 model could not be read"
    )


def test_text_several_clean_models_and_baseline(codes: list[str]) -> None:
    clean = [make_result(codes, [], model=Path(f"m{i}.onnx")) for i in range(3)]
    report = LintReport(clean[0].ruleset, clean, baselined=5)
    assert render(report, "text", fail_on=Severity.ERROR) == (
        "3 models clean (2 rules checked, rule set 'npu'); 5 findings suppressed by the baseline\n"
    )


# --- json ---------------------------------------------------------------------------------------


def _strict_loads(text: str) -> dict:
    def reject(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=reject)


def test_json_document(result: LintResult, codes: list[str]) -> None:
    doc = _strict_loads(render(result, "json", fail_on=Severity.WARNING))
    assert list(doc) == ["version", "tool", "ruleset", "rules_checked", "summary", "models", "notes", "findings"]
    assert doc["version"] == 2 and doc["tool"] == "qdq" and doc["ruleset"] == "npu"
    assert doc["rules_checked"] == codes
    assert doc["summary"] == {
        "error": 1, "warning": 2, "info": 1, "failing": 3, "models": 1, "unreadable": 0, "baselined": 0,
    }
    assert doc["models"] == [{
        "path": "models/model.onnx", "rules_checked": codes, "notes": ["opset 13 model"],
        "summary": {"error": 1, "warning": 2, "info": 1, "failing": 3},
    }]
    assert doc["notes"] == ["opset 13 model"]
    assert [f["node"] for f in doc["findings"]] == [f.node for f in result.findings]
    first = doc["findings"][0]
    assert first == {
        "model": "models/model.onnx", "code": codes[0], "severity": "error", "message": "conv1 scale is zero",
        "node": "conv1", "tensors": ["conv1_scale"], "values": {"scale": 0.0, "shape": [1, 2]}, "fix": "exact",
    }
    assert doc["findings"][1]["values"] == {"scale": "nan"}


def test_json_several_models(several: LintReport) -> None:
    doc = _strict_loads(render(several, "json", fail_on=Severity.ERROR))
    assert [m["path"] for m in doc["models"]] == ["models/model.onnx", "broken.onnx", "models/more/other model.onnx"]
    assert doc["models"][1] == {"path": "broken.onnx", "error": "broken.onnx: file is empty"}
    assert [m["summary"]["failing"] for m in (doc["models"][0], doc["models"][2])] == [1, 1]
    assert doc["summary"] == {
        "error": 2, "warning": 2, "info": 2, "failing": 2, "models": 3, "unreadable": 1, "baselined": 0,
    }
    assert [f["model"] for f in doc["findings"]] == ["models/model.onnx"] * 4 + ["models/more/other model.onnx"] * 2
    # Notes of several models say which model they are about.
    assert doc["notes"] == ["models/model.onnx: opset 13 model", "models/more/other model.onnx: no opset import for ai.onnx.ml"]


def test_json_failing_follows_threshold(result: LintResult) -> None:
    def failing(level: Severity) -> int:
        return _strict_loads(render(result, "json", fail_on=level))["summary"]["failing"]

    assert (failing(Severity.ERROR), failing(Severity.WARNING), failing(Severity.INFO)) == (1, 3, 4)


# --- sarif --------------------------------------------------------------------------------------


def _sarif(run: LintResult | LintReport) -> dict:
    return _strict_loads(render(run, "sarif", fail_on=Severity.ERROR))


def test_sarif_structure_for_github(result: LintResult, codes: list[str]) -> None:
    doc = _sarif(result)
    assert doc["version"] == "2.1.0"
    assert doc["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert len(doc["runs"]) == 1
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "qdq" and driver["version"]
    rule_ids = [r["id"] for r in driver["rules"]]
    assert rule_ids == codes
    registry = all_rules()
    for rule in driver["rules"]:
        assert rule["name"] == registry[rule["id"]].name
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] == registry[rule["id"]].doc()
        assert rule["defaultConfiguration"]["level"] == "warning"  # from the rule set, not the class

    assert len(run["results"]) == len(result.findings)
    for res, finding in zip(run["results"], result.findings):
        assert res["ruleId"] == finding.code
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in {"error", "warning", "note"}
        assert res["message"]["text"] == finding.message
        (location,) = res["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == "models/model.onnx"
        assert physical["region"]["startLine"] == 1
        if finding.node:
            assert location["logicalLocations"] == [{"fullyQualifiedName": finding.node, "kind": "member"}]
        else:
            assert "logicalLocations" not in location
        assert res["properties"]["tensors"] == list(finding.tensors)
    assert [r["level"] for r in run["results"]] == ["error", "warning", "warning", "note"]
    assert run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"] == "opset 13 model"


def test_sarif_fingerprints_stable_and_distinct(result: LintResult) -> None:
    def prints(doc: dict) -> list[str]:
        return [r["partialFingerprints"]["qdqFinding/v1"] for r in doc["runs"][0]["results"]]

    first, second = prints(_sarif(result)), prints(_sarif(result))
    assert first == second
    assert len(set(first)) == len(first)  # conv1 and conv2 differ although their rule is the same
    code = result.findings[0].code
    assert first[0] == hashlib.sha256(f"{code}:conv1:conv1_scale".encode()).hexdigest()


def test_sarif_tolerates_codes_missing_from_registry(codes: list[str]) -> None:
    stray = make_result(codes, [Finding("ZZZ999", "from a plugin", Severity.WARNING, "n1")])
    run = _sarif(stray)["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert ids == [*codes, "ZZZ999"]
    assert run["results"][0]["ruleIndex"] == 2
    assert run["tool"]["driver"]["rules"][2]["name"] == "ZZZ999"


def test_sarif_truncates_at_github_limit(
    result: LintResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sarif.MAX_RESULTS == 25_000
    monkeypatch.setattr(sarif, "MAX_RESULTS", 2)
    result.findings.reverse()  # least severe first: the writer must still keep the worst ones
    run = _sarif(result)["runs"][0]
    assert [r["level"] for r in run["results"]] == ["error", "warning"]
    assert run["properties"]["droppedResults"] == 2
    warning = run["invocations"][0]["toolExecutionNotifications"][-1]
    assert warning["level"] == "warning" and "2 of 4 results dropped" in warning["message"]["text"]


def test_sarif_uris() -> None:
    assert sarif.artifact_uri(Path("my models/m.onnx")) == "my%20models/m.onnx"
    assert sarif.artifact_uri(Path("/data/m.onnx")) == "file:///data/m.onnx"


# The parts of the SARIF 2.1.0 schema GitHub code scanning relies on.
_SARIF_SUBSET = {
    "type": "object",
    "required": ["version", "runs"],
    "properties": {
        "version": {"const": "2.1.0"},
        "runs": {
            "type": "array",
            "minItems": 1,
            "maxItems": 20,
            "items": {
                "type": "object",
                "required": ["tool", "results"],
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {
                            "driver": {
                                "type": "object",
                                "required": ["name", "rules"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "version": {"type": "string"},
                                    "rules": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["id", "shortDescription"],
                                            "properties": {
                                                "id": {"type": "string"},
                                                "shortDescription": {
                                                    "type": "object",
                                                    "required": ["text"],
                                                },
                                                "defaultConfiguration": {
                                                    "properties": {
                                                        "level": {"enum": ["none", "note", "warning", "error"]}
                                                    }
                                                },
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    },
                    "results": {
                        "type": "array",
                        "maxItems": 25000,
                        "items": {
                            "type": "object",
                            "required": ["ruleId", "message", "locations"],
                            "properties": {
                                "ruleId": {"type": "string"},
                                "ruleIndex": {"type": "integer", "minimum": 0},
                                "level": {"enum": ["none", "note", "warning", "error"]},
                                "message": {"type": "object", "required": ["text"]},
                                "locations": {
                                    "type": "array",
                                    "minItems": 1,
                                    "maxItems": 1000,
                                    "items": {
                                        "type": "object",
                                        "required": ["physicalLocation"],
                                        "properties": {
                                            "physicalLocation": {
                                                "type": "object",
                                                "required": ["artifactLocation", "region"],
                                                "properties": {
                                                    "artifactLocation": {
                                                        "type": "object",
                                                        "required": ["uri"],
                                                        "properties": {"uri": {"type": "string"}},
                                                    },
                                                    "region": {
                                                        "type": "object",
                                                        "required": ["startLine"],
                                                        "properties": {"startLine": {"type": "integer", "minimum": 1}},
                                                    },
                                                },
                                            }
                                        },
                                    },
                                },
                                "partialFingerprints": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_sarif_matches_schema_subset(result: LintResult) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(_sarif(result), _SARIF_SUBSET)


SARIF_SCHEMA = Path(__file__).parent / "fixtures" / "sarif-2.1.0.schema.json"


def validate_sarif(document: dict) -> None:
    """Validate against the full OASIS SARIF 2.1.0 schema (tests/fixtures, see its README)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SARIF_SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(document)


def test_sarif_several_models(several: LintReport) -> None:
    doc = _sarif(several)
    validate_sarif(doc)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, _SARIF_SUBSET)
    (run,) = doc["runs"]
    uris = [a["location"]["uri"] for a in run["artifacts"]]
    assert uris == ["models/model.onnx", "broken.onnx", "models/more/other%20model.onnx"]
    # Each result points at its own model's artifact, by index and by URI.
    located = []
    for res in run["results"]:
        artifact = res["locations"][0]["physicalLocation"]["artifactLocation"]
        assert uris[artifact["index"]] == artifact["uri"]
        located.append(artifact["uri"])
    assert sorted(located) == ["models/model.onnx"] * 4 + ["models/more/other%20model.onnx"] * 2
    # The model that could not be read: an error notification on its artifact, and the run did not succeed.
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    errors = [n for n in invocation["toolExecutionNotifications"] if n["level"] == "error"]
    assert [n["message"]["text"] for n in errors] == ["broken.onnx: file is empty"]
    assert errors[0]["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "broken.onnx", "index": 1}


def test_sarif_of_one_model_matches_the_full_schema(result: LintResult) -> None:
    validate_sarif(_sarif(result))


# --- junit --------------------------------------------------------------------------------------


def _junit(run: LintResult | LintReport, fail_on: Severity) -> ET.Element:
    return ET.fromstring(render(run, "junit", fail_on=fail_on).encode())


@pytest.mark.parametrize("fail_on", list(Severity))
def test_junit_failures_follow_threshold(result: LintResult, codes: list[str], fail_on: Severity) -> None:
    root = _junit(result, fail_on)
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "qdq lint models/model.onnx"
    cases = suite.findall("testcase")
    registry = all_rules()
    # One case per finding, named after its rule and node.
    a, b = (f"{code} {registry[code].name}" for code in codes)
    assert [c.get("name") for c in cases] == [f"{a}: conv1", f"{a}: conv2", f'{b}: add <&"1">', b]
    assert {c.get("classname") for c in cases} == {"qdq.npu"}

    failures = suite.findall("testcase/failure")
    assert len(failures) == len(result.failing(fail_on))
    assert [f.get("type") for f in failures] == [f.code for f in result.failing(fail_on)]
    assert suite.attrib == {
        "name": suite.get("name"), "tests": "4", "failures": str(len(failures)), "errors": "0", "skipped": "0",
    }
    assert (root.get("tests"), root.get("failures")) == ("4", str(len(failures)))
    below = [f for f in result.findings if f.severity < fail_on]
    passing = [c for c in cases if c.find("failure") is None]
    assert len(passing) == len(below)
    assert [c.findtext("system-out") for c in passing] == [finding_line(str(MODEL), f) for f in below]


def test_junit_messages_do_not_repeat_the_node(result: LintResult, codes: list[str]) -> None:
    result.findings.append(Finding(codes[0], "bad \x00 byte", Severity.ERROR, "n\x1bode"))
    suite = _junit(result, Severity.WARNING).find("testsuite")
    messages = {c.get("name"): c.find("failure").get("message") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert messages[f'{codes[1]} {all_rules()[codes[1]].name}: add <&"1">'] == 'add <&"1"> scales differ'
    assert messages[f"{codes[0]} {all_rules()[codes[0]].name}: n\ufffdode"] == "bad \ufffd byte"
    conv1 = next(f for f in suite.iter("failure") if f.get("message").startswith("conv1"))
    assert "tensors: conv1_scale" in conv1.text and "scale: 0.0" in conv1.text
    assert suite.findtext("system-out") == "note: opset 13 model"


def test_junit_clean_model(codes: list[str]) -> None:
    suite = _junit(make_result(codes, []), Severity.INFO).find("testsuite")
    registry = all_rules()
    # A checked rule without findings is one passing case.
    assert [c.get("name") for c in suite.iter("testcase")] == [f"{c} {registry[c].name}" for c in codes]
    assert suite.get("tests") == "2" and suite.get("failures") == "0"
    assert suite.find("testcase/failure") is None


def test_junit_one_suite_per_model(several: LintReport) -> None:
    root = _junit(several, Severity.ERROR)
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [
        "qdq lint models/model.onnx", "qdq lint broken.onnx", "qdq lint models/more/other model.onnx",
    ]
    assert [(s.get("tests"), s.get("failures"), s.get("errors")) for s in suites] == [
        ("4", "1", "0"), ("1", "0", "1"), ("2", "1", "0"),
    ]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("7", "2", "1")
    assert suites[1].find("testcase/error").get("message") == "broken.onnx: file is empty"


# --- github -------------------------------------------------------------------------------------


def test_github_workflow_commands(several: LintReport, codes: list[str]) -> None:
    lines = render(several, "github", fail_on=Severity.ERROR).splitlines()
    registry = all_rules()
    a, b = codes
    assert lines[0] == f"::error file=models/model.onnx,title={a} {registry[a].name}::conv1 scale is zero (fix: exact)"
    kinds = [line[2:].split(" ", 1)[0] for line in lines]
    # error / warning / notice by severity, one per finding; notes are notices; the unreadable model an error.
    assert kinds == ["error", "warning", "warning", "notice", "notice", "error", "error", "notice", "notice"]
    assert lines[5] == "::error file=broken.onnx,title=qdq%3A cannot read the model::broken.onnx: file is empty"
    # `,` and `:` end a property and `%`, CR, LF a command: escaped as GitHub's toolkit does.
    assert lines[7] == (
        f"::notice file=models/more/other model.onnx,title={b} {registry[b].name}::"
        "odd,na:me: weird, node: name%0Asecond line 100%25"
    )


def test_github_property_escaping(codes: list[str]) -> None:
    odd = make_result(codes, [Finding(codes[0], "m", Severity.WARNING, "n")], model=Path("a,b:c%d.onnx"))
    (line,) = render(odd, "github", fail_on=Severity.ERROR).splitlines()
    assert line.startswith("::warning file=a%2Cb%3Ac%25d.onnx,title=")


# --- gitlab -------------------------------------------------------------------------------------


def test_gitlab_code_quality(several: LintReport, codes: list[str]) -> None:
    issues = _strict_loads(render(several, "gitlab", fail_on=Severity.ERROR))
    assert len(issues) == 6  # the findings; the unreadable model is on stderr and in the exit code
    for issue in issues:
        assert set(issue) == {"description", "check_name", "fingerprint", "severity", "location"}
        assert issue["location"]["lines"] == {"begin": 1}
        assert issue["severity"] in {"info", "minor", "major", "critical", "blocker"}
    assert [i["severity"] for i in issues] == ["major", "minor", "minor", "info", "major", "info"]
    assert [i["location"]["path"] for i in issues] == ["models/model.onnx"] * 4 + ["models/more/other model.onnx"] * 2
    assert issues[0]["check_name"] == codes[0] and issues[0]["description"] == "conv1 scale is zero (fix: exact)"
    prints = [i["fingerprint"] for i in issues]
    # The same finding in two models is two issues.
    assert len(set(prints)) == len(prints)


def test_gitlab_fingerprints_ignore_wording_and_count_repeats(codes: list[str]) -> None:
    def prints(*messages: str) -> list[str]:
        findings = [Finding(codes[0], m, Severity.WARNING, "n", ("t",), {"v": i}) for i, m in enumerate(messages)]
        return [i["fingerprint"] for i in json.loads(render(make_result(codes, findings), "gitlab", fail_on=Severity.ERROR))]

    first, reworded = prints("old words", "twice"), prints("new words", "again")
    assert first == reworded and first[0] != first[1]
