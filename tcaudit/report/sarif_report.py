"""SARIF 2.1.0 for code-scanning services (GitHub code scanning, Azure DevOps, IDE viewers).

One run; ``tool.driver.rules`` describes the rules that fired (not the whole catalog: the pages would
make a log of three results hundreds of kilobytes), each with its ``tcaudit explain`` page as ``help``
(the text of ``docs/rules/TCxxx.md``) and, once tcaudit has a public address (``RULE_DOCS_URL``), a
``helpUri`` to that page; ``informationUri`` likewise only with ``REPOSITORY_URL``.
A result whose fix is available carries it as SARIF ``fixes`` (one ``artifactChange`` of the result's
file, a ``replacement`` per text edit); the fix's class, plan and any decline reason stay in the
result's ``properties``.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, TextIO
from urllib.parse import quote

import tcaudit
from tcaudit import __version__
from tcaudit.explain import render_explanation
from tcaudit.rule_docs import published_page_uri

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# Where a rule's page lives in the repository (docs/rules/, written by ``python -m tcaudit.rule_docs``).
RULE_DOCS_PATH = "docs/rules"
FINGERPRINT_KEY = "tcaudit/v1"
SRCROOT = "%SRCROOT%"

LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def level(severity: object) -> str:
    return LEVELS[str(severity)]


def artifact_uri(path: str) -> tuple[str, bool]:
    """(URI, relative?) for a display path: relative paths stay relative with forward slashes."""
    posix = path.replace("\\", "/")
    if PurePosixPath(posix).is_absolute() or Path(path).is_absolute():
        return Path(path).resolve().as_uri(), False
    if posix.startswith("./"):
        posix = posix[2:]
    return quote(posix, safe="/"), True


def help_text(spec) -> str:
    return (f"{spec.summary}\n\nThe rule's page: `tcaudit explain {spec.id}`, or {RULE_DOCS_PATH}/{spec.id}.md "
            "in tcaudit's repository.")


def _rule_descriptor(spec) -> dict[str, Any]:
    page = render_explanation(spec)
    properties: dict[str, Any] = {
        "tags": ["tcaudit", spec.family_name],
        "family": spec.family_name,
        "needs": spec.needs,
        # The page in the repository, for viewers that open files of the checkout.
        "docs": f"{RULE_DOCS_PATH}/{spec.id}.md",
    }
    if spec.fix_class is not None:
        properties["fix_class"] = str(spec.fix_class)
    descriptor: dict[str, Any] = {
        "id": spec.id,
        "name": spec.name,
        "shortDescription": {"text": spec.summary},
        "fullDescription": {"text": spec.why},
        # The page once, as Markdown (what code scanning shows); the plain text points to it rather
        # than doubling every rule's size.
        "help": {"text": help_text(spec), "markdown": page},
        "defaultConfiguration": {"level": level(spec.severity)},
        "properties": properties,
    }
    uri = published_page_uri(spec.id)
    if uri:
        descriptor["helpUri"] = uri
    return descriptor


def _fallback_descriptor(finding) -> dict[str, Any]:
    """A rule the catalog does not know (a plugin or a stale catalog) still gets a valid descriptor."""
    return {
        "id": finding.rule,
        "name": finding.name,
        "shortDescription": {"text": finding.name},
        "defaultConfiguration": {"level": level(finding.severity)},
    }


def _region(loc) -> dict[str, int]:
    line = max(1, loc.line)
    column = max(1, loc.column)
    region = {"startLine": line, "startColumn": column}
    end_line, end_column = loc.end_line, loc.end_column
    # SARIF's endColumn is exclusive, like ours; an end before the start would be invalid, so drop it.
    if end_line > line or (end_line == line and end_column >= column):
        region["endLine"] = end_line
        region["endColumn"] = max(1, end_column)
    return region


def _related(index: int, related) -> dict[str, Any]:
    """A :class:`~tcaudit.findings.Related` place as a SARIF related location."""
    uri, relative = artifact_uri(related.location.path)
    artifact: dict[str, Any] = {"uri": uri}
    if relative:
        artifact["uriBaseId"] = SRCROOT
    out: dict[str, Any] = {
        "id": index,
        "physicalLocation": {"artifactLocation": artifact, "region": _region(related.location)},
        "message": {"text": related.message},
    }
    if related.location.cell is not None:
        out["properties"] = {"cell": related.location.cell}
    return out


def _result(finding, rule_index: int) -> dict[str, Any]:
    uri, relative = artifact_uri(finding.location.path)
    artifact: dict[str, Any] = {"uri": uri}
    if relative:
        artifact["uriBaseId"] = SRCROOT
    data: dict[str, Any] = {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": level(finding.severity),
        "message": _message(finding),
        "locations": [
            {"physicalLocation": {"artifactLocation": artifact, "region": _region(finding.location)}}
        ],
    }
    if finding.related:
        data["relatedLocations"] = [_related(index, related) for index, related in enumerate(finding.related)]
    if finding.fingerprint:
        data["partialFingerprints"] = {FINGERPRINT_KEY: finding.fingerprint}
    fix = finding.fix
    # A notebook's edits count lines within a cell, not within the artifact (the JSON file): no SARIF fix.
    if fix is not None and fix.available and fix.edits and finding.location.cell is None:
        data["fixes"] = [{
            "description": {"text": f"{fix.fix_class} fix: {fix.description}"},
            "artifactChanges": [{
                "artifactLocation": dict(artifact),
                "replacements": [_replacement(edit) for edit in fix.edits],
            }],
        }]
    properties: dict[str, Any] = {"severity": str(finding.severity)}
    if finding.location.cell is not None:
        properties["cell"] = finding.location.cell  # the region's lines are the notebook cell's
    if fix is not None:
        properties["fix"] = {key: value for key, value in fix.to_dict().items() if key != "edits"}
    if finding.details:
        properties["details"] = finding.details
    if finding.explanation:
        properties["explanation"] = finding.explanation
    if finding.follows:
        properties["follows"] = finding.follows
    data["properties"] = properties
    return data


def _message(finding) -> dict[str, Any]:
    """The short message as text; with an explanation, also as markdown followed by it."""
    message: dict[str, Any] = {"text": finding.message}
    if finding.explanation:
        message["markdown"] = f"{finding.message}\n\n{finding.explanation}"
    return message


def _replacement(edit) -> dict[str, Any]:
    """A text edit as SARIF replaces: the deleted region (empty for an insertion) and the new text."""
    replacement: dict[str, Any] = {
        "deletedRegion": {
            "startLine": edit.line,
            "startColumn": edit.column,
            "endLine": edit.end_line,
            "endColumn": edit.end_column,
        }
    }
    if edit.content:
        replacement["insertedContent"] = {"text": edit.content}
    return replacement


def _folder_uri(folder: Path) -> str:
    uri = folder.resolve().as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _notification(text: str, level_name: str) -> dict[str, Any]:
    return {"level": level_name, "message": {"text": text}}


def build_log(result, rules) -> dict[str, Any]:
    # Only the rules that fired, by id: ``ruleIndex`` points into this list of the one log.
    fired = {finding.rule: finding for finding in result.findings}
    descriptors = [
        _rule_descriptor(rules[rule_id]) if rule_id in rules else _fallback_descriptor(fired[rule_id])
        for rule_id in sorted(fired)
    ]
    index = {d["id"]: i for i, d in enumerate(descriptors)}
    results = [_result(finding, index[finding.rule]) for finding in result.findings]
    errors = list(getattr(result, "errors", []))
    notifications = [_notification(note, "note") for note in result.notes]
    notifications += [_notification(error.partition("\n")[0], "error") for error in errors]
    invocation: dict[str, Any] = {"executionSuccessful": not errors}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    driver: dict[str, Any] = {"name": "tcaudit", "version": __version__, "semanticVersion": __version__}
    if tcaudit.REPOSITORY_URL:
        driver["informationUri"] = tcaudit.REPOSITORY_URL
    driver["rules"] = descriptors
    run: dict[str, Any] = {
        "tool": {"driver": driver},
        "invocations": [invocation],
        "columnKind": "unicodeCodePoints",
        "originalUriBaseIds": {SRCROOT: {"uri": _folder_uri(Path.cwd())}},
        "results": results,
    }
    if getattr(result, "gpu", None):
        run["properties"] = {"gpu": result.gpu}
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def render(result, out: TextIO, *, rules, color: bool) -> None:
    json.dump(build_log(result, rules), out, indent=2)
    out.write("\n")
