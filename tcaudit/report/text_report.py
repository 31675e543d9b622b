"""The default human format: grouped by file, in impact order (or line order with ``--sort line``:
tcaudit/report/order.py), each finding with a code frame, then a summary line that names the top
finding."""

from __future__ import annotations

import codecs
import io
import re
import tokenize
from itertools import groupby
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from tcaudit.report.order import estimated_gain, ordered, top_finding
from tcaudit.terminal import terminal_safe

_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
_CONTEXT = 1  # lines of context around the flagged line
_LINE_END = re.compile(r"\r\n|\r|\n")


def _frame(lines: list[str], line: int, column: int, end_line: int, end_column: int) -> Text:
    text = Text()
    first = max(1, line - _CONTEXT)
    last = min(len(lines), line + _CONTEXT)
    width = len(str(last))
    for number in range(first, last + 1):
        source = terminal_safe(lines[number - 1].expandtabs(4), one_line=True) if number <= len(lines) else ""
        marker = ">" if number == line else " "
        text.append(f"  {marker} {number:>{width}} | ", style="dim" if number != line else "bold")
        text.append(source + "\n")
        if number == line:
            caret_end = end_column if end_line == line and end_column > column else len(source) + 1
            text.append(" " * (width + 7) + " " * (column - 1))
            text.append("^" * max(1, caret_end - column), style="bold red")
            text.append("\n")
    return text


def _source_lines(path: str, raw: bytes | None = None, cell: int | None = None) -> list[str]:
    """The file's lines for code frames (``raw``: its bytes, where they are not on disk at ``path``:
    a script read from stdin); none for a file that is not text (a frame would be noise). ``cell``: in
    a notebook, the lines of that code cell."""
    if raw is None:
        from tcaudit.source.parsing import SourceError, read_file_bytes

        try:
            raw = read_file_bytes(Path(path))  # never blocks on a FIFO, never reads a device
        except SourceError:
            return []
    if cell is not None:
        from tcaudit.source.notebook import Notebook
        from tcaudit.source.parsing import SourceError

        try:
            found = Notebook.parse(raw).cell(cell)
        except SourceError:
            return []
        return found.lines if found is not None else []
    if b"\x00" in raw:
        return []
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        codecs.lookup(encoding)
    except (SyntaxError, LookupError):
        encoding = "utf-8"
    lines = _LINE_END.split(raw.decode(encoding, errors="replace"))  # Python's line ends, not str.splitlines's
    return lines[:-1] if lines and not lines[-1] else lines


def top_line(finding, rules, gpu: dict | None = None) -> str:
    """`` Top: TC201 missing-autocast (path:90), est. 2.57× measured on H200.``: the rule's measured figure
    only where it was measured on the target GPU (``gpu``: ``ScanResult.gpu``), never for a finding that
    says its advice cannot pay here (a launch-bound model), and none where no target GPU is known."""
    loc = finding.location
    where = f"cell {loc.cell}:{loc.line}" if loc.cell is not None else f"{loc.line}"
    text = f" Top: {finding.rule} {finding.name} ({loc.path}:{where})"
    lost = finding.details.get("est_time_lost") if finding.details else None
    spec = rules.get(finding.rule) if finding.rule in rules else None
    if isinstance(lost, (int, float)) and not isinstance(lost, bool) and lost > 0:
        text += f", est. {lost:.0%} of the model's step time"
    elif estimated_gain(finding, rules) is not None and spec is not None and _measured_on_target(spec, gpu):
        text += f", est. {spec.speedup:.2f}× measured on {spec.speedup_gpu}"
    return text + "."


def _measured_on_target(spec, gpu: dict | None) -> bool:
    """Whether the rule's ``[impact]`` figure was measured on the target GPU (by gpus.toml's key: an H200
    figure is not an H100's)."""
    from tcaudit import gpus

    if not spec.speedup_gpu or not gpu or not gpu.get("setting"):
        return False
    measured, target = gpus.resolve(gpus.canonical(spec.speedup_gpu) or ""), gpus.resolve(gpu["setting"])
    return measured is not None and target is not None and measured.key == target.key


def render(result, out: TextIO, *, rules, color: bool) -> None:
    # On a terminal (``color``), text wraps at its width between words (rich's word wrap; only a token
    # longer than the width is folded); piped, a line stays one line. Code frames never wrap.
    console = Console(file=out, force_terminal=color, no_color=not color, highlight=False, soft_wrap=not color, emoji=False)
    show = getattr(result, "show_fixes", False)
    cache: dict[tuple[str, int | None], list[str]] = {}
    findings = ordered(result.findings, rules, getattr(result, "sort", "impact"))
    for path, group in groupby(findings, key=lambda f: f.location.path):
        shown = terminal_safe(path, one_line=True)
        console.print(Text(shown, style="bold underline"))
        for f in group:
            loc = f.location
            if (path, loc.cell) not in cache:
                cache[path, loc.cell] = _source_lines(path, getattr(result, "texts", {}).get(path), loc.cell)
            head = Text()
            head.append(f"{shown}:{loc.position}: ", style="bold")
            head.append(f"{f.rule} ", style=_STYLE.get(str(f.severity), ""))
            head.append(f"[{f.severity}] ", style=_STYLE.get(str(f.severity), ""))
            head.append(terminal_safe(f.message))
            console.print(head)
            if show and f.explanation:
                explanation = Text(terminal_safe(f.explanation), style="dim")
                if console.is_terminal:
                    console.print(Padding(explanation, (0, 0, 0, 4)))
                else:
                    console.print(Text("    ") + explanation)
            for place in f.related:
                see = f"  see {place.location.path}:{place.location.position}: {place.message}"
                console.print(Text(terminal_safe(see), style="dim"))
            if cache[path, loc.cell]:
                console.print(_frame(cache[path, loc.cell], loc.line, loc.column, loc.end_line, loc.end_column), end="", soft_wrap=True)
            if f.fix is not None:
                if f.fix.applies_by_default:
                    console.print(Text(terminal_safe(f"  fix ({f.fix.fix_class}): {f.fix.description}"), style="green"))
                elif f.fix.available:
                    only = f"  {f.fix.fix_class} fix, only with `tcaudit fix --{f.fix.option}`: {f.fix.description}"
                    console.print(Text(terminal_safe(only), style="cyan"))
                else:
                    console.print(Text(terminal_safe(f"  no fix: {f.fix.reason or f.fix.description}"), style="dim"))
            console.print()
    if getattr(result, "quiet", False):
        return
    for note in result.notes:
        console.print(Text(terminal_safe(f"note: {note}"), style="dim"))
    counts = {s: sum(1 for f in result.findings if str(f.severity) == s) for s in ("error", "warning", "info")}
    total = len(result.findings)
    fixable = sum(1 for f in result.findings if f.fix is not None and f.fix.applies_by_default)
    files = result.files_scanned
    baselined = getattr(result, "baselined", 0)
    if total == 0:
        if baselined:
            console.print(Text(f"All clear: no new findings in {_files(files)}; {baselined} "
                               f"{'finding is' if baselined == 1 else 'findings are'} in the baseline.",
                               style="bold green"))
        else:
            console.print(Text(f"All clear: no findings in {_files(files)}.", style="bold green"))
        return
    parts = ", ".join(f"{n} {s}{'s' if n != 1 and s != 'info' else ''}" for s, n in counts.items() if n)
    with_findings = len({f.location.path for f in result.findings})
    scanned = f" ({files} scanned)" if files != with_findings else ""
    line = Text(f"Found {total} finding{'s' if total != 1 else ''} ({parts}) in {_files(with_findings)}{scanned}.")
    if baselined:
        line.append(f" {baselined} more in the baseline.")
    if fixable:
        line.append(f" {fixable} fixable with `tcaudit fix`.", style="green")
    top = top_finding(result.findings, rules)
    if top is not None:
        line.append(terminal_safe(top_line(top, rules, getattr(result, "gpu", None))), style="bold")
    console.print(line)


def _files(count: int) -> str:
    return f"{count} file{'s' if count != 1 else ''}"
