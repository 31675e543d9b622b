"""JUnit XML, as ruff writes it: a ``testsuite`` per file with findings, a ``testcase`` with a
``failure`` per finding. CI systems (GitLab, Jenkins, Azure) show each finding as a failed test.

A clean run is still a valid report: an empty ``tcaudit`` suite with ``tests="0"``. Internal errors
become ``error`` test cases in a ``tcaudit`` suite so that the report does not look clean.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from itertools import groupby
from typing import TextIO

# Characters XML 1.0 cannot carry even escaped (a message may quote a line with control bytes).
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _suite(parent: ET.Element, name: str, tests: int, failures: int, errors: int = 0) -> ET.Element:
    return ET.SubElement(
        parent,
        "testsuite",
        name=name,
        tests=str(tests),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
    )


def build_tree(result) -> ET.ElementTree:
    findings = list(result.findings)
    errors = list(getattr(result, "errors", []))
    root = ET.Element(
        "testsuites",
        name="tcaudit",
        tests=str(len(findings) + len(errors)),
        failures=str(len(findings)),
        errors=str(len(errors)),
    )
    for path, group in groupby(findings, key=lambda f: f.location.path):
        cases = list(group)
        suite = _suite(root, path, len(cases), len(cases))
        for f in cases:
            loc = f.location
            case = ET.SubElement(
                suite,
                "testcase",
                name=f"{f.rule} {f.name} ({loc.position})",
                classname=path,
                file=path,
                line=str(loc.line),
            )
            failure = ET.SubElement(case, "failure", message=f.message, type=f"{f.rule} {f.severity}")
            failure.text = f"{path}:{loc.position}: {f.rule} {f.message}"
            if f.explanation:
                failure.text += f"\n{f.explanation}"
            if f.fix is not None:
                verb = "fix" if f.fix.available else "no fix"
                detail = f.fix.description if f.fix.available else (f.fix.reason or f.fix.description)
                failure.text += f"\n{verb} ({f.fix.fix_class}): {detail}"
    if errors or not findings:
        suite = _suite(root, "tcaudit", len(errors), 0, len(errors))
        for index, error in enumerate(errors, 1):
            case = ET.SubElement(suite, "testcase", name=f"internal error {index}", classname="tcaudit")
            head, _, rest = error.partition("\n")
            element = ET.SubElement(case, "error", message=head, type="internal error")
            element.text = error if rest else head
        if result.notes:
            ET.SubElement(suite, "system-out").text = "\n".join(result.notes)
    elif result.notes:
        ET.SubElement(root[0], "system-out").text = "\n".join(result.notes)
    ET.indent(root)
    return ET.ElementTree(root)


def render(result, out: TextIO, *, rules, color: bool) -> None:
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    root = build_tree(result).getroot()
    for element in root.iter():
        element.attrib = {key: _clean(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = _clean(element.text)
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")
