"""``tcaudit fix``: show the unified diff of every applicable fix; ``--apply`` writes them."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from tcaudit.findings import Severity, parse_classes
from tcaudit.terminal import terminal_safe

DEFAULT_CLASSES = "safe,numerics"
# How ``FileFix.error`` begins for a file tcaudit cannot read as code (reported, not an internal error).
INPUT_PROBLEMS = ("not fixed: cannot analyse: nesting too deep", "not fixed: cannot analyse: out of memory",
                  "not fixed: cannot parse", "not fixed: cannot decode", "not fixed: not a Jupyter notebook",
                  "not fixed: CPython cannot compile it", "not fixed: too large to analyse",
                  "not fixed: cannot read file")  # a FIFO, a symlink to nothing: a note, not a failure


def add_fix_parser(sub, add_selection) -> None:
    fix = sub.add_parser(
        "fix",
        help="show (or --apply) the fixes for files and folders",
        description="Show the unified diff of all applicable fixes (exit 1 if there is one); --apply writes them. "
        "Files that cannot be parsed or fixed safely are left byte-for-byte as they were.",
    )
    fix.add_argument(
        "paths", nargs="*", default=["."], metavar="PATH",
        help="files and folders; - reads one script from stdin and writes the fixed script to stdout",
    )
    fix.add_argument(
        "--stdin-filename", metavar="PATH",
        help="the name of the script read from stdin (-): for messages, per-file-ignores and finding the config",
    )
    fix.add_argument(
        "--apply", action="store_true",
        help="write the fixes (atomically) instead of showing a diff; exit 1 while findings remain, as ruff's "
             "check --fix",
    )
    fix.add_argument("--fail-on", choices=("info", "warning", "error"),
                     help="with --apply or -: exit 1 while findings at or above this remain (default warning)")
    fix.add_argument(
        "--exit-zero", action="store_true",
        help="with --apply or -: exit 0 even where findings remain (usage, config and internal errors still exit 2)",
    )
    fix.add_argument(
        "--follow-external-symlinks", action="store_true",
        help="also fix files that symlinks inside the project point to outside the project root "
        "(by default those are left alone, with a message)",
    )
    fix.add_argument(
        "--classes",
        default=DEFAULT_CLASSES,
        metavar="CLASSES",
        help="fix classes to apply, comma-separated: safe, numerics (default: safe,numerics)",
    )
    fix.add_argument(
        "--no-exec", action="store_true",
        help="never build the user's models (the fixes then judge the model from the script's text alone)",
    )
    add_structural_flags(fix)
    add_quiet(fix)
    fix.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    fix.add_argument(
        "--cache-dir", metavar="DIR",
        help="the result cache scan keeps (default: .tcaudit_cache beside the config file; config key cache-dir)",
    )
    fix.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    add_selection(fix)


def add_quiet(parser: argparse.ArgumentParser) -> None:
    """ruff's ``-q/--quiet`` (the findings, diffs and declines only: no notes, summaries or "fixed" lines)
    and ``-s/--silent`` (nothing but errors; the exit code still says whether there are findings)."""
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", "-q", action="store_true",
                          help="print findings (scan) or diffs and declines (fix) only: no notes or summaries")
    loudness.add_argument(
        "--silent", "-s", action="store_true",
        help="print nothing but errors (fix - still writes the script); the exit code still says what was found",
    )


def add_structural_flags(parser) -> None:
    """``--ddp``, ``--dali``, ``--compile``: the structural conversions, each only on request; and
    ``--pad-dims``, the numerics fix that changes the model's shape (also only on request)."""
    from tcaudit.structural import CONVERSIONS

    group = parser.add_argument_group("structural conversions (only on request; always shown as a diff first)")
    for conversion in CONVERSIONS:
        group.add_argument(conversion.flag, dest=conversion.name, action="store_true", help=conversion.help)
    parser.add_argument(
        "--pad-dims", action="store_true",
        help="also pad unaligned layer widths the script sets as literals (TC101/TC102; numerics: the model's "
        "shape changes, so its checkpoints no longer load; or pad-dims = true in the config)",
    )


def with_structural_flags(settings, args: argparse.Namespace):
    """Settings with the structural options and ``--pad-dims`` the command line asked for added to the
    config's."""
    import dataclasses

    from tcaudit.structural import NAMES

    asked = [name for name in NAMES if getattr(args, name, False)]
    if asked:
        settings = dataclasses.replace(
            settings, structural_fixes=tuple(dict.fromkeys((*settings.structural_fixes, *asked))))
    if getattr(args, "pad_dims", False):
        settings = dataclasses.replace(settings, pad_dims=True)
    return settings


def run_fix_stdin(script, settings, classes_text: str, exit_zero: bool = False, loudness: str = "") -> int:
    """``tcaudit fix -``: the fixed script (or, where nothing is fixed or it cannot be fixed, the
    input byte for byte) to stdout, messages to stderr; exit 2 on an internal error, 1 while findings at
    or above ``fail-on`` remain in the fixed script (ruff's ``check --fix -``), else 0. ``loudness``:
    ``"quiet"`` leaves out the "fixed" line and notices, ``"silent"`` every message but an error.
    ``script``: a :class:`tcaudit.cli.main.StdinScript`. The model audit does not run (no neighbours to
    import on stdin): the fixes judge the model from the script's text."""
    from tcaudit import api

    classes = parse_classes(classes_text)
    display = script.display
    result = api.fix(script.raw, filename=display, settings=settings, classes=classes)
    out = script.raw
    code = 0
    if result.error:
        print(terminal_safe(f"{display}: {result.error}"), file=sys.stderr)
        is_input_problem = result.error.startswith(INPUT_PROBLEMS + ("not fixed: cannot analyse",))
        # An input problem is scan's TC000, an error that remains (ruff's check --fix - exits 1 on one too).
        remains = "TC000" in settings.enabled_rules() and settings.fail_on <= Severity.ERROR and not exit_zero
        code = (1 if remains else 0) if is_input_problem else 2
    else:
        # Positions in the text read, as scan gives them (not in the partly fixed text).
        for line, where, rule, reason in sorted({(d.finding.location.line, d.where_original, d.finding.rule, d.reason)
                                                 for d in result.declined}):
            if loudness != "silent":
                print(terminal_safe(f"{display}:{where}: {rule} no fix: {reason}"), file=sys.stderr)
        if result.notice and not loudness:
            print(terminal_safe(f"{display}: {result.notice}"), file=sys.stderr)
        if result.changed:
            out = result.data
            if not loudness:
                print(terminal_safe(f"fixed {display} ({', '.join(result.applied)})"), file=sys.stderr)
        if not exit_zero and any(f.severity >= settings.fail_on for f in result.remaining):
            code = 1
    stream = getattr(sys.stdout, "buffer", None)
    if stream is not None:
        sys.stdout.flush()
        stream.write(out)
        stream.flush()
    else:  # a text stream (tests, embedders)
        sys.stdout.write(out.decode("utf-8", "surrogateescape"))
    return code


def run_fix(args: argparse.Namespace, settings, color: bool) -> int:
    from tcaudit.progress import showing

    with showing(None) as progress:  # on a terminal only: the models audited, the file being fixed
        return _run_fix(args, settings, color, progress)


class _Quiet:
    """Stands for the message console under ``--quiet``/``--silent``: prints only what ``keep`` lets by."""

    def __init__(self, console, keep) -> None:
        self.console, self.keep = console, keep

    def print(self, text, *more, **options) -> None:
        if self.keep(str(text)):
            self.console.print(text, *more, **options)


def _run_fix(args: argparse.Namespace, settings, color: bool, progress) -> int:
    from rich.console import Console

    from tcaudit.engine import audited_models_for
    from tcaudit.fix.engine import FileFix, WriteFailed, fix_file, fixed_elsewhere, write_fixes
    from tcaudit.fix.textio import real_path
    from tcaudit.source.deep import call_with_deep_stack
    from tcaudit.source.discovery import discover, display_path

    classes = parse_classes(args.classes)
    settings = with_structural_flags(settings, args)
    discovered = discover(args.paths, settings.exclude, settings.root, force_exclude=settings.force_exclude,
                          respect_gitignore=settings.respect_gitignore, include=settings.included)
    if discovered.missing:
        for path in discovered.missing:
            print(f"tcaudit: error: no such file or directory: {path}", file=sys.stderr)
        return 2
    console = Console(file=sys.stdout, force_terminal=color, no_color=not color, highlight=False, soft_wrap=True, emoji=False)
    # Messages go above the progress display where there is one: its console knows where it is drawn.
    err = progress.console or Console(file=sys.stderr, no_color=True, highlight=False, soft_wrap=True, emoji=False)
    failure = err  # what makes the exit code 2 is printed however quiet the run
    silent, quiet = getattr(args, "silent", False), getattr(args, "quiet", False)
    if silent:
        err = _Quiet(err, lambda text: False)
    elif quiet:  # the declines, not the progress of the run
        err = _Quiet(err, lambda text: " no fix: " in text or "not fixed:" in text or text.startswith("tcaudit: error"))

    def say(text: str) -> None:  # file names, reasons quoting the user's code: no markup, no escape sequences
        err.print(terminal_safe(text), markup=False)

    def fail(text: str) -> None:  # a reason for exit 2: printed however quiet the run
        failure.print(terminal_safe(text), markup=False)

    would_change = 0
    fixed_findings = 0
    remaining = 0  # findings at or above fail-on left in the fixed files
    # Files with findings left, with how many: counted again once the run has written the others (a loader
    # built in utils.py: train.py's finding goes once utils.py is fixed).
    recount: list[tuple[str, str, object, int]] = []
    written = 0
    errors = 0
    root = real_path(Path(settings.root))
    cache = None
    if not args.no_cache:
        from tcaudit.cache import open_cache

        cache = open_cache(settings, args.cache_dir, warn=lambda reason: err.print(
            f"tcaudit: warning: {reason}; fixing without the cache (--no-cache silences this)"))
    models_of = audited_models_for(discovered.files, settings, cache)
    stage = progress.stage("fixing", total=len(discovered.files), unit="files")
    asked = {os.path.realpath(path) for path in discovered.files}
    companions_done: set[str] = set()

    def fixed(path: Path, display: str, file_settings, models) -> "FileFix | None":
        """The file's fix, or None with the reason printed (``errors`` counted where it is tcaudit's, an
        input problem counted as the TC000 scan reports where that remains)."""
        nonlocal errors, remaining
        target = real_path(path)
        inside = Path(os.path.abspath(path)).is_relative_to(root)
        if inside and not target.is_relative_to(root) and not getattr(args, "follow_external_symlinks", False):
            say(f"{display}: not fixed: it is a symlink to {target}, outside the project root {root} "
                "(--follow-external-symlinks fixes such files too)")
            return None
        try:
            result = call_with_deep_stack(fix_file, path, file_settings, classes, display, models, cache)
        except (RecursionError, MemoryError) as exc:
            say(f"{display}: not fixed: cannot analyse ({type(exc).__name__}); left unchanged")
            return None
        if result.error:
            if result.error.startswith(INPUT_PROBLEMS):
                say(f"{display}: {result.error}")
                if "TC000" in settings.enabled_rules() and settings.fail_on <= Severity.ERROR:
                    remaining += 1  # scan reports it as TC000, an error
            else:
                fail(f"{display}: {result.error}")
                errors += 1
            return None
        return result

    for path in discovered.files:
        display = display_path(path)
        stage.show(display)
        stage.advance()  # counted as it starts: the line says which file is being fixed
        models = models_of.get(os.path.realpath(path))
        result = fixed(Path(path), display, settings, models)
        if result is None:
            continue
        left = sum(1 for f in result.remaining if f.severity >= settings.fail_on)
        if left:
            remaining += left
            recount.append((path, display, models, left))
        # The project modules where this file's declined fixes belong (a DataLoader its helper builds),
        # fixed with it when the command line did not name them: one diff each, written all or none.
        group = [(Path(path), display, result)]
        for module, rules in fixed_elsewhere(result, asked | companions_done, root).items():
            companions_done.add(module)
            module_display = display_path(Path(module))
            companion = fixed(Path(module), module_display,
                              dataclasses.replace(settings, select=tuple(sorted(rules)), extend_select=()), None)
            if companion is not None:
                group.append((Path(module), module_display, companion))
        made_elsewhere = {(rule, os.path.realpath(p)) for p, _, r in group[1:] for rule in r.applied}
        for file_path, file_display, file_result in group:
            # Lines of the file as scan reported them (the original text), with --apply too.
            shown = sorted({(file_result.original_line(f.location.line), f.rule, reason)
                            for f, reason in file_result.declined if not _made_in(f, made_elsewhere)})
            for line, rule, reason in shown:
                say(f"{file_display}:{file_result.place(line, False)}: {rule} no fix: {file_result.in_cells(reason)}")
            if file_result.notice:
                say(f"{file_display}: {file_result.notice}")
        for line in conversion_lines(settings, result):
            say(f"{display}: {line}")
        changed = [(p, d, r) for p, d, r in group if r.changed]
        if not changed:
            continue
        would_change += len(changed)
        fixed_findings += sum(len(r.applied) for _, _, r in changed)
        if args.apply:
            try:
                write_fixes([(r, p) for p, _, r in changed])
            except WriteFailed as exc:
                kept = f" (nor {', '.join(d for _, d, _ in changed if d != exc.display)}: all or none)" \
                    if len(changed) > 1 else ""
                fail(f"{exc.display}: not fixed{kept}: {exc.reason}")
                errors += 1
                continue
            written += len(changed)
            for _, file_display, file_result in changed:
                say(f"fixed {file_display} ({', '.join(file_result.applied)})")
        elif not silent:
            for _, _, file_result in changed:
                if color:
                    from rich.syntax import Syntax  # (pygments: only for a coloured diff)

                    with progress.paused():
                        shown = terminal_safe(file_result.diff())  # on a terminal: the file's escapes shown, not sent
                        console.print(Syntax(shown, "diff", theme="ansi_dark", background_color="default"))
                else:
                    diff = file_result.diff()
                    with progress.paused():
                        sys.stdout.write(diff if diff.endswith("\n") else diff + "\n")
                        sys.stdout.flush()
    if errors:
        return 2
    if args.apply and written and recount and (len(discovered.files) > 1 or companions_done):
        for path, display, models, left in recount:
            again = call_with_deep_stack(fix_file, Path(path), settings, classes, display, models, None)
            if again.error is None:
                remaining += sum(1 for f in again.remaining if f.severity >= settings.fail_on) - left
    if args.apply:
        # As ruff's ``check --fix``: 1 while findings remain (those fix declined or has no fix for).
        return 1 if remaining and not getattr(args, "exit_zero", False) else 0
    if would_change:
        say(f"{would_change} file{'s' if would_change != 1 else ''} would change; run with --apply to write.")
        return 1
    return 0


def _made_in(finding, made: set[tuple[str, str]]) -> bool:
    """Whether ``finding``'s declined fix was made in another file of the same run (the module where its
    DataLoader is built): then its "no fix" line would say the opposite of what happened."""
    return any(place.mirror and (finding.rule, os.path.realpath(place.location.path)) in made
               for place in finding.related)


def conversion_lines(settings, result) -> list[str]:
    """One line per structural conversion the run asks for (``--ddp``...), for a file where it was neither
    made nor declined (a declined one has its ``no fix`` line): what was converted, or why nothing was."""
    from tcaudit.structural import conversion

    out = []
    for name in settings.structural_fixes:
        conv = conversion(name)
        made = [rule for rule in result.applied if rule in conv.rules]
        completed = [rule for rule in result.applied if rule in conv.companions]
        if made:
            out.append(f"{conv.flag}: converted ({', '.join(made)})")
        elif completed:
            # A module the conversion of another file relies on (the DataLoader a helper builds).
            out.append(f"{conv.flag}: completed for the scripts that use it ({', '.join(completed)})")
        elif not any(finding.rule in conv.rules for finding, _ in result.declined):
            out.append(f"{conv.flag}: not converted: {conv.nothing}")
    return out
