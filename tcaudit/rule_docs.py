"""docs/rules/: each rule's ``tcaudit explain`` page published in the repository, generated from rules/.

    python -m tcaudit.rule_docs           # write docs/rules/ (TCxxx.md per rule, README.md the index)
    python -m tcaudit.rule_docs --check   # exit 1, naming the files, when docs/rules/ is out of date

A page is exactly what ``tcaudit explain TCxxx`` prints when piped, so the published page, the
terminal and SARIF's ``help`` (tcaudit/report/sarif_report.py) say the same. Re-run after adding or
editing a rule file; pages of rules that no longer exist are deleted.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from tcaudit.catalog import Catalog, load_catalog
from tcaudit.explain import render_explanation

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs" / "rules"
# Where a wheel carries the pages (pyproject.toml's force-include), for links from an installed tcaudit.
PACKAGED_DOCS_DIR = Path(__file__).resolve().parent / "_docs" / "rules"
INDEX = "README.md"
REGENERATE = "python -m tcaudit.rule_docs"


def published_page_uri(rule_id: str) -> str | None:
    """The absolute address of the rule's published page, or None while tcaudit has no public one."""
    import tcaudit

    base = tcaudit.RULE_DOCS_URL
    return f"{base.rstrip('/')}/{rule_id}.md" if base else None


@functools.lru_cache(maxsize=512)
def rule_page_uri(rule_id: str) -> str | None:
    """The address of a rule's page for an editor's links: the published page once tcaudit has one,
    else the page on this machine as a ``file:`` URI (a source checkout's docs/rules/, or the copy a
    wheel carries); None where neither exists. Kept per rule (the editor asks it of every diagnostic
    it publishes, at every keystroke)."""
    published = published_page_uri(rule_id)
    if published:
        return published
    for folder in (DOCS_DIR, PACKAGED_DOCS_DIR):
        page = folder / f"{rule_id}.md"
        if page.is_file():
            return page.as_uri()
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def index_page(catalog: Catalog) -> str:
    lines = [
        "# tcaudit rules",
        "",
        f"One page per rule, the text of `tcaudit explain TCxxx`. Generated from `rules/` by `{REGENERATE}`;",
        "edit the rule's `rules/TCxxx.toml`, not these pages.",
        "",
        "| Code | Name | Severity | Fix | Summary |",
        "|---|---|---|---|---|",
    ]
    for rule_id in sorted(catalog):
        spec = catalog[rule_id]
        lines.append(
            f"| [{spec.id}]({spec.id}.md) | {spec.name} | {spec.severity} | {spec.fix_class or '-'} "
            f"| {_cell(spec.summary)} |"
        )
    return "\n".join(lines) + "\n"


def expected_pages(catalog: Catalog | None = None) -> dict[str, str]:
    """File name → content of every file docs/rules/ should hold."""
    catalog = load_catalog() if catalog is None else catalog
    pages = {f"{rule_id}.md": render_explanation(catalog[rule_id]) for rule_id in sorted(catalog)}
    pages[INDEX] = index_page(catalog)
    return pages


def _present(folder: Path) -> set[str]:
    return {path.name for path in folder.glob("*.md")} if folder.is_dir() else set()


def out_of_date(folder: Path = DOCS_DIR, catalog: Catalog | None = None) -> list[str]:
    """The files of ``folder`` that are missing, differ from their rule, or belong to no rule."""
    pages = expected_pages(catalog)
    problems = []
    for name, text in pages.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name} (differs from rules/)")
    problems += [f"{name} (no such rule)" for name in sorted(_present(folder) - set(pages))]
    return problems


def write_pages(folder: Path = DOCS_DIR, catalog: Catalog | None = None) -> list[str]:
    """Write the pages, delete the stale ones; returns the names written or deleted."""
    pages = expected_pages(catalog)
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in pages.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
            changed.append(name)
    for name in sorted(_present(folder) - set(pages)):
        (folder / name).unlink()
        changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tcaudit.rule_docs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when a page is out of date")
    parser.add_argument("--dir", type=Path, default=DOCS_DIR, help=f"the folder (default {DOCS_DIR})")
    args = parser.parse_args(argv)
    if args.check:
        problems = out_of_date(args.dir)
        for problem in problems:
            print(f"{args.dir}/{problem}", file=sys.stderr)
        if problems:
            print(f"docs/rules is out of date; run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    changed = write_pages(args.dir)
    print(f"{len(changed)} file(s) written or deleted in {args.dir}" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
