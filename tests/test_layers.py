"""The package's layout holds (issue 45, "family wings over one semantic floor"): every module sits on a
floor and imports only from its own floor or below; no import cycle; ``script/`` knows what the code is
and nothing of findings' fixes, rules or rewriting; ``model/`` measures and knows no rule; each rule
lives in the wing of its TOML family, and a wing's helper serves only that wing.

Every import counts: at the top of a module, inside a function, under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE = REPO / "tcaudit"
RULE_MODULE = re.compile(r"tc\d{3}_\w+")

# Bottom to top: a module imports only from its own floor or a lower one. Same-floor imports are free
# as long as they make no cycle (test_no_import_cycle).
FLOORS: list[tuple[str, ...]] = [
    ("tcaudit",),  # the package itself: its version and addresses
    ("tcaudit.findings", "tcaudit.gpus", "tcaudit.structural", "tcaudit.model_profile", "tcaudit.runtime_facts",
     "tcaudit.progress", "tcaudit.atomic", "tcaudit.terminal"),
    ("tcaudit.catalog", "tcaudit.baseline"),
    ("tcaudit.source", "tcaudit.costs"),
    ("tcaudit.script", "tcaudit.config", "tcaudit.explain"),
    ("tcaudit.project",),
    ("tcaudit.rewrite", "tcaudit.cache", "tcaudit.rule_docs"),
    ("tcaudit.model", "tcaudit.unused_suppressions"),
    ("tcaudit.rules",),
    ("tcaudit.planned_edits",),
    ("tcaudit.engine",),
    ("tcaudit.fix", "tcaudit.report"),
    ("tcaudit.api", "tcaudit.verify"),
    ("tcaudit.lsp",),
    ("tcaudit.cli", "tcaudit.__main__"),
]
WINGS = {"graph": "model graph", "amp": "mixed precision", "compile": "backend", "pipeline": "input pipeline",
         "distributed": "distributed", "loop": "host"}
KERNEL = {"__init__", "base", "registry", "trigger_table", "text_table", "situations", "advice"}
# The fix vocabulary of findings.py, which script/ (what the code is) must not know.
FIX_TYPES = {"Fix", "FixPlan", "DeclineFix", "FollowsFix", "RenderedPlan", "FixClass", "parse_classes"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in path.parts}


def _resolve(dotted: str) -> str | None:
    """The package module ``dotted`` names (``tcaudit.rules.base.ScriptRule`` -> ``tcaudit.rules.base``)."""
    known = modules()
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imports_of(path: Path, tree: ast.AST | None = None) -> set[tuple[str, str]]:
    """(module imported, name imported from it or "") for every import of a package module in ``path``."""
    tree = tree or ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    found.add((target, ""))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if not base.startswith("tcaudit"):
                continue
            for alias in node.names:
                target = _resolve(f"{base}.{alias.name}")
                if target == f"{base}.{alias.name}":  # a submodule
                    found.add((target, ""))
                elif _resolve(base):
                    found.add((_resolve(base), alias.name))
    found.discard((here, ""))
    return {(m, n) for m, n in found if m != here}


@lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    return {name: {m for m, _ in imports_of(path)} for name, path in modules().items()}


def floor_of(name: str) -> int:
    best = (-1, -1)
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best[1]:
                best = (level, len(prefix))
    return best[0]


def test_the_walk_finds_the_package():
    assert len(modules()) > 150
    assert "tcaudit.rules.amp.tc201_missing_autocast" in graph()
    assert "tcaudit.rules.base" in graph()["tcaudit.rules.amp.tc201_missing_autocast"]


def test_every_module_has_a_floor():
    assert [name for name in modules() if floor_of(name) < 0] == []


def test_no_import_runs_up_a_floor():
    up = sorted(
        f"{name} (floor {floor_of(name)}) imports {target} (floor {floor_of(target)})"
        for name, targets in graph().items() for target in targets if floor_of(target) > floor_of(name)
    )
    assert up == [], "move the shared part down, or hand the higher layer's object in as an argument"


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    edges = graph()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_cycle_check_sees_a_cycle_through_a_function_level_import(tmp_path, monkeypatch):
    """The guard itself: an import inside a function still counts."""
    fake = tmp_path / "tcaudit"
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "sub" / "__init__.py").write_text("")
    (fake / "sub" / "a.py").write_text("def f():\n    from tcaudit.sub.b import g\n")
    (fake / "sub" / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    modules.cache_clear()
    graph.cache_clear()
    try:
        assert graph()["tcaudit.sub.a"] == {"tcaudit.sub.b"}
        assert graph()["tcaudit.sub.b"] == {"tcaudit.sub.a"}
    finally:
        modules.cache_clear()
        graph.cache_clear()


def test_script_knows_only_what_the_code_is():
    bad = []
    for name, path in modules().items():
        if not name.startswith(("tcaudit.script", "tcaudit.project")):
            continue
        for target, imported in imports_of(path):
            if target.startswith(("tcaudit.rules", "tcaudit.rewrite", "tcaudit.fix", "tcaudit.model.")):
                bad.append(f"{name} imports {target}")
            if target == "tcaudit.findings" and imported in FIX_TYPES:
                bad.append(f"{name} imports {imported} (a fix type)")
    assert bad == [], "script/ answers what the code is; plans, fixes and findings belong to the rules"


def test_model_measures_and_imports_no_rule():
    bad = [f"{name} imports {target}" for name, targets in graph().items() if name.startswith("tcaudit.model")
           and not name.startswith("tcaudit.model_profile") for target in targets if target.startswith("tcaudit.rules")]
    assert bad == [], "the engine runs the model rules on the facts the audit returns"


def test_rules_holds_the_kernel_and_the_wings_only():
    here = {p.stem for p in (PACKAGE / "rules").glob("*.py")}
    folders = {p.name for p in (PACKAGE / "rules").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert here == KERNEL
    assert folders == set(WINGS)


def _wing_modules() -> list[tuple[str, str, Path]]:
    """(wing, module stem, path) for every module in a wing."""
    return [(path.parent.name, path.stem, path) for path in sorted((PACKAGE / "rules").glob("*/*.py"))
            if path.stem != "__init__"]


@pytest.mark.parametrize("wing, stem, path", _wing_modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_wing_module_is_a_rule_of_its_family_or_that_wings_helper(wing, stem, path):
    if RULE_MODULE.fullmatch(stem):
        rule_id = stem[:5].upper()
        family = tomllib.loads((REPO / "rules" / f"{rule_id}.toml").read_text(encoding="utf-8"))["family"]
        assert family.startswith(WINGS[wing]), f"{rule_id} is of the family {family!r}, not the {wing} wing's"
        return
    users = sorted(name for name, targets in graph().items() if f"tcaudit.rules.{wing}.{stem}" in targets)
    assert users, f"tcaudit/rules/{wing}/{stem}.py is imported by nothing: a helper serves its wing's rules"
    strangers = [u for u in users if not u.startswith(f"tcaudit.rules.{wing}.")]
    assert strangers == [], f"a {wing} helper is imported outside its wing; move what they share below the rules"


def test_no_module_imports_another_modules_private_name():
    bad = sorted(
        f"{name} imports {imported} from {target}"
        for name, path in modules().items() for target, imported in imports_of(path)
        if imported.startswith("_") and not imported.startswith("__") and target != name
    )
    assert bad == [], "make it public where it lives, or move it to the module that uses it"


# A path a comment or docstring of the package cites: it must be a file the repository has. Templates
# (``rules/TCNNN.toml``, ``docs/rules/TCxxx.md``) stand for many files and are left out.
CITED = re.compile(r"(?<![\w/.-])((?:tcaudit|tests|benchmarks|fixtures|docs|rules|action)/[\w./-]*\w\."
                   r"(?:py|md|toml|json|sh|txt|ipynb|yaml|yml))")
CITED_IN_PACKAGE = re.compile(r"(?<![\w/.-])((?:script|rewrite|rules|model|source|fix|verify|report|lsp|cli|data)/"
                              r"[\w./-]*\w\.(?:py|toml|json))")
TEMPLATE = re.compile(r"NNN|xxx|\*|\{|<")


def test_the_package_cites_only_files_the_repository_has():
    missing = []
    for name, path in modules().items():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in CITED.findall(line):
                if not TEMPLATE.search(cited) and not (REPO / cited).exists():
                    missing.append(f"{name}:{number}: {cited}")
            for cited in CITED_IN_PACKAGE.findall(line):
                if not TEMPLATE.search(cited) and not (PACKAGE / cited).exists() and not (REPO / cited).exists():
                    missing.append(f"{name}:{number}: {cited}")
    assert missing == []
