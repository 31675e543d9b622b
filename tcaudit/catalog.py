"""The rule catalog: one TOML file per rule in ``rules/`` (shipped as ``tcaudit/_rules`` in a wheel)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tcaudit.findings import FixClass, Severity

FAMILIES = {
    "TC0": "internal",
    "TC1": "model graph",
    "TC2": "mixed precision",
    "TC3": "backend and compilation",
    "TC4": "input pipeline",
    "TC5": "distributed",
    "TC6": "host overhead",
}

REQUIRED_KEYS = ("id", "name", "family", "severity", "summary", "why")


class CatalogError(Exception):
    pass


@dataclass(frozen=True)
class Example:
    code: str
    # For a bad example: how many findings of this rule it must produce (at least one).
    expect: int | None = None
    # For a fixable bad example: the exact fixed form (used once the rule has a fix).
    fixed: str | None = None
    description: str = ""


@dataclass(frozen=True)
class RuleSpec:
    id: str
    name: str
    family: str
    severity: Severity
    fix_class: FixClass | None
    summary: str
    why: str
    fix_safety: str = ""
    needs: str = "script"  # "script" or "model"
    bad: tuple[Example, ...] = field(default_factory=tuple)
    good: tuple[Example, ...] = field(default_factory=tuple)
    path: str = ""
    # ``[impact]``: how much faster a training step ran with this rule's fix, end to end, where that
    # was measured (``speedup``, on ``speedup_gpu``); None where no whole-step figure exists (a
    # component's rate, a bug, a deprecation). Only orders the report (tcaudit/report/order.py).
    speedup: float | None = None
    speedup_gpu: str = ""

    @property
    def family_name(self) -> str:
        return FAMILIES.get(self.id[:3], self.family)


def rules_dir() -> Path:
    """The folder holding the rule files: beside the package in a wheel, at the repo root otherwise."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):
        if candidate.is_dir():
            return candidate
    raise CatalogError(f"rule catalog not found (looked in {here / '_rules'} and {here.parent / 'rules'})")


def _examples(raw: object, where: str) -> tuple[Example, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CatalogError(f"{where}: expected a list of examples")
    out = []
    for item in raw:
        if not isinstance(item, dict) or "code" not in item:
            raise CatalogError(f"{where}: each example needs a 'code' string")
        out.append(
            Example(
                code=item["code"],
                expect=item.get("expect"),
                fixed=item.get("fixed"),
                description=item.get("description", ""),
            )
        )
    return tuple(out)


def load_rule_file(path: Path) -> RuleSpec:
    # Imported only when a rule file is read: a scan without findings reads none.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"{path.name}: {exc}") from None
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise CatalogError(f"{path.name}: missing keys {', '.join(missing)}")
    if data["id"] != path.stem:
        raise CatalogError(f"{path.name}: id {data['id']!r} does not match the file name")
    fix = data.get("fix_class")
    impact = data.get("impact", {})
    speedup = impact.get("speedup") if isinstance(impact, dict) else None
    if speedup is not None and (isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or speedup <= 0):
        raise CatalogError(f"{path.name}: [impact] speedup must be a positive number (got {speedup!r})")
    return RuleSpec(
        id=data["id"],
        name=data["name"],
        family=data["family"],
        severity=Severity.parse(data["severity"]),
        fix_class=FixClass(fix) if fix else None,
        summary=data["summary"].strip(),
        why=data["why"].strip(),
        fix_safety=data.get("fix_safety", "").strip(),
        needs=data.get("needs", "script"),
        bad=_examples(data.get("bad"), f"{path.name} bad"),
        good=_examples(data.get("good"), f"{path.name} good"),
        path=str(path),
        speedup=float(speedup) if speedup is not None else None,
        speedup_gpu=str(impact.get("gpu", "")) if isinstance(impact, dict) else "",
    )


class Catalog(Mapping[str, RuleSpec]):
    """The rule files by rule id, each read and checked the first time it is asked for.

    A scan needs a rule's documentation only for the rules whose findings it reports (the name and
    severity a finding carries): the ids come from the file names alone, so a scan of files without
    findings reads no rule file. ``rules``, ``explain`` and SARIF's rule list read them all.
    """

    def __init__(self, folder: Path) -> None:
        self._paths = {path.stem: path for path in sorted(folder.glob("TC*.toml"))}
        self._specs: dict[str, RuleSpec] = {}

    def __getitem__(self, rule_id: str) -> RuleSpec:
        spec = self._specs.get(rule_id)
        if spec is None:
            spec = self._specs[rule_id] = load_rule_file(self._paths[rule_id])
        return spec

    def __contains__(self, rule_id: object) -> bool:
        return rule_id in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


@functools.lru_cache(maxsize=None)
def load_catalog() -> Catalog:
    return Catalog(rules_dir())


def rule_ids() -> list[str]:
    return sorted(load_catalog())


def matches_selector(rule_id: str, selector: str) -> bool:
    """ruff-style prefix selection: ``TC2`` matches TC201..TC208, ``ALL`` matches everything."""
    selector = selector.strip().upper()
    return selector == "ALL" or rule_id.startswith(selector)


def is_known_selector(selector: str) -> bool:
    selector = selector.strip().upper()
    return selector == "ALL" or any(rule.startswith(selector) for rule in load_catalog())
