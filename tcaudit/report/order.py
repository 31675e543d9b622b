"""The order the human formats (text, concise) list findings in: by impact, or by line.

Impact order (the default, ``sort = "impact"``), by :func:`impact_key`:

1. errors (what breaks training), the largest estimated gain first;
2. findings with an estimated gain, the largest first: a model finding's ``details["est_time_lost"]``
   (the share of the model's step time the layer adds, from the cost model), a script finding's rule's
   ``[impact] speedup`` (a training step measured with the fix against without: share ``1 - 1/speedup``);
3. the rest: warnings before info;

each tier then by path, line and column. A finding that presumes another rule's fix (``Finding.follows``:
TC303's channels_last for TC201's autocast, TC404 after TC401) comes right after its leader's finding
in the same file, the nearest one by line where there are several; with no leader finding in the report
it takes its own place. Files come in the order of their first finding.

Line order (``sort = "line"``, ``--sort line``) is (path, line, column), the engine's order. Machine
formats (JSON, SARIF, GitHub, JUnit) always keep line order: stable across scans, as ruff's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tcaudit.findings import LITTLE_TO_GAIN, Finding, Severity

if TYPE_CHECKING:
    from tcaudit.catalog import RuleSpec

SORTS = ("impact", "line")


def estimated_gain(finding: Finding, rules: "Mapping[str, RuleSpec]") -> float | None:
    """The estimated share of step time fixing ``finding`` saves (0..1), or None where nothing was
    measured or estimated for it, and where the finding itself says its advice cannot pay here (a
    launch-bound model: ``details["little_to_gain"]``), so no figure ranks it above a warning."""
    if finding.details and finding.details.get(LITTLE_TO_GAIN):
        return None
    lost = finding.details.get("est_time_lost") if finding.details else None
    if isinstance(lost, (int, float)) and not isinstance(lost, bool):
        return float(lost) if lost > 0 else None
    spec = rules.get(finding.rule) if finding.rule in rules else None
    speedup = getattr(spec, "speedup", None)
    if speedup is None or speedup <= 1.0:
        return None
    return 1.0 - 1.0 / speedup


def impact_key(finding: Finding, rules: "Mapping[str, RuleSpec]") -> tuple:
    """The one ordering key of impact order (see the module's docstring); smaller comes first."""
    gain = estimated_gain(finding, rules)
    if finding.severity >= Severity.ERROR:
        tier = 0
    elif gain is not None:
        tier = 1
    else:
        tier = 2
    return (tier, -(gain or 0.0), -int(finding.severity), *finding.sort_key)


def ordered(findings: Sequence[Finding], rules: "Mapping[str, RuleSpec]", sort: str = "impact") -> list[Finding]:
    """``findings`` in ``sort`` order (``impact`` or ``line``), grouped by file."""
    if sort == "line":
        return sorted(findings, key=lambda f: f.sort_key)
    by_path: dict[str, list[Finding]] = {}
    for finding in findings:
        by_path.setdefault(finding.location.path, []).append(finding)
    files = [_file_order(group, rules) for group in by_path.values()]
    files.sort(key=lambda group: (impact_key(group[0], rules), group[0].location.path))
    return [finding for group in files for finding in group]


def top_finding(findings: Sequence[Finding], rules: "Mapping[str, RuleSpec]") -> Finding | None:
    """The finding impact order lists first."""
    ranked = ordered(findings, rules)
    return ranked[0] if ranked else None


def _file_order(findings: list[Finding], rules: "Mapping[str, RuleSpec]") -> list[Finding]:
    """One file's findings by impact, each follower after its leader's finding."""
    leader_of: dict[int, Finding] = {}
    for finding in findings:
        if finding.follows:
            leaders = [f for f in findings if f.rule == finding.follows and f is not finding]
            if leaders:
                line = finding.location.line
                leader_of[id(finding)] = min(leaders, key=lambda f: (abs(f.location.line - line), f.sort_key))
    followers: dict[int, list[Finding]] = {}
    for finding in findings:
        leader = leader_of.get(id(finding))
        if leader is not None:
            followers.setdefault(id(leader), []).append(finding)
    out: list[Finding] = []
    placed: set[int] = set()

    def place(finding: Finding) -> None:
        if id(finding) in placed:
            return
        placed.add(id(finding))
        out.append(finding)
        for follower in sorted(followers.get(id(finding), []), key=lambda f: impact_key(f, rules)):
            place(follower)

    for finding in sorted(findings, key=lambda f: impact_key(f, rules)):
        if id(finding) not in leader_of:
            place(finding)
    for finding in findings:  # a cycle of followers (none today) still gets listed
        place(finding)
    return out
