"""JUnit XML report for CI test widgets (GitLab `artifacts:reports:junit`, Jenkins, Azure).

One test suite per model. Each finding is a test case named after its rule and node, failing
when it is at or above `--fail-on` (the finding below it is kept in the case's `<system-out>`);
a checked rule without findings is one passing case, so a clean model still shows its tests.
A model that could not be read is a suite with one errored case.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter

from qdq.engine.lint import LintReport, LintResult, Unreadable
from qdq.engine.registry import all_rules
from qdq.reports.text import finding_line
from qdq.rewrite.rule import Finding, Severity

# Characters XML 1.0 cannot hold even escaped; ONNX names are arbitrary strings.
_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    classname = _clean(f"qdq.{report.ruleset.name}")
    suites = ET.Element("testsuites", name="qdq lint")
    totals: Counter[str] = Counter()
    for model in report.models:
        suite = ET.SubElement(suites, "testsuite", name=_clean(f"qdq lint {model.model_path}"))
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="ruleset", value=_clean(report.ruleset.name))
        ET.SubElement(properties, "property", name="fail_on", value=str(fail_on))
        if isinstance(model, Unreadable):
            case = ET.SubElement(suite, "testcase", classname=classname, name="read the model")
            ET.SubElement(case, "error", message=_clean(model.error), type="ModelLoadError")
            counts = Counter(tests=1, errors=1)
        else:
            counts = _cases(suite, model, classname, fail_on)
        suite.attrib.update({key: str(counts[key]) for key in ("tests", "failures", "errors", "skipped")})
        totals.update(counts)
    suites.attrib.update({key: str(totals[key]) for key in ("tests", "failures", "errors")})
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _cases(suite: ET.Element, result: LintResult, classname: str, fail_on: Severity) -> Counter[str]:
    """One case per finding, or one passing case for a checked rule that found nothing."""
    registry = all_rules()
    model = str(result.model_path)
    counts: Counter[str] = Counter()
    for code in dict.fromkeys([*result.rules_run, *(f.code for f in result.findings)]):
        rule = registry.get(code)
        title = f"{code} {rule.name}" if rule else code
        findings = [f for f in result.findings if f.code == code]
        if not findings:
            ET.SubElement(suite, "testcase", classname=classname, name=_clean(title))
            counts["tests"] += 1
        for finding in findings:
            name = f"{title}: {finding.node}" if finding.node else title
            case = ET.SubElement(suite, "testcase", classname=classname, name=_clean(name))
            counts["tests"] += 1
            if finding.severity >= fail_on:
                failure = ET.SubElement(case, "failure", message=_clean(finding.message), type=code)
                failure.text = _clean(_details(model, finding))
                counts["failures"] += 1
            else:
                ET.SubElement(case, "system-out").text = _clean(finding_line(model, finding))
    if result.notes:
        ET.SubElement(suite, "system-out").text = _clean("\n".join(f"note: {n}" for n in result.notes))
    return counts


def _details(model: str, finding: Finding) -> str:
    lines = [finding_line(model, finding)]
    if finding.tensors:
        lines.append(f"tensors: {', '.join(finding.tensors)}")
    lines += [f"{key}: {value}" for key, value in finding.values.items()]
    return "\n".join(lines)


def _clean(text: str) -> str:
    return _INVALID_XML.sub("\ufffd", text)
