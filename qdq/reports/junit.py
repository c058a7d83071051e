"""JUnit XML report for CI test widgets (GitLab `artifacts:reports:junit`, Jenkins, Azure).

Each checked rule is a test case, so a clean rule shows as a passing test; each finding at or
above `--fail-on` is a failure of its rule, and findings below it are kept in `<system-out>`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from qdq.lint import LintResult
from qdq.reports.text import finding_line
from qdq.rule import Finding, Severity, all_rules

# Characters XML 1.0 cannot hold even escaped; ONNX names are arbitrary strings.
_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def render(result: LintResult, *, fail_on: Severity) -> str:
    registry = all_rules()
    model = str(result.model_path)
    codes = list(dict.fromkeys([*result.rules_run, *(f.code for f in result.findings)]))

    suites = ET.Element("testsuites", name="qdq lint")
    suite = ET.SubElement(suites, "testsuite", name=_clean(f"qdq lint {model}"))
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="ruleset", value=_clean(result.ruleset.name))
    ET.SubElement(properties, "property", name="fail_on", value=str(fail_on))

    failed_cases = 0
    for code in codes:
        rule = registry.get(code)
        case = ET.SubElement(
            suite,
            "testcase",
            classname=_clean(f"qdq.{result.ruleset.name}"),
            name=_clean(f"{code} {rule.name}" if rule else code),
        )
        findings = [f for f in result.findings if f.code == code]
        failing = [f for f in findings if f.severity >= fail_on]
        for finding in failing:
            failure = ET.SubElement(case, "failure", message=_clean(_headline(finding)), type=code)
            failure.text = _clean(_details(model, finding))
        passing = [finding_line(model, f) for f in findings if f.severity < fail_on]
        if passing:
            ET.SubElement(case, "system-out").text = _clean("\n".join(passing))
        failed_cases += bool(failing)
    if result.notes:
        ET.SubElement(suite, "system-out").text = _clean("\n".join(f"note: {n}" for n in result.notes))

    # `failures` counts failed test cases (rules), as the JUnit schema defines it, not findings.
    counts = {"tests": str(len(codes)), "failures": str(failed_cases), "errors": "0", "skipped": "0"}
    suite.attrib.update(counts)
    suites.attrib.update({k: counts[k] for k in ("tests", "failures", "errors")})
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _headline(finding: Finding) -> str:
    return f"{finding.node}: {finding.message}" if finding.node else finding.message


def _details(model: str, finding: Finding) -> str:
    lines = [finding_line(model, finding)]
    if finding.tensors:
        lines.append(f"tensors: {', '.join(finding.tensors)}")
    lines += [f"{key}: {value}" for key, value in finding.values.items()]
    return "\n".join(lines)


def _clean(text: str) -> str:
    return _INVALID_XML.sub("\ufffd", text)
