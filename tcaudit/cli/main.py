"""Commands and flags only; the analysis lives in the engine, the output in the reporters."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
from typing import Sequence

from tcaudit import __version__
from tcaudit.api import with_detected_gpu
from tcaudit.report import FORMATS

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class UsageError(Exception):
    pass


def _codes(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {value!r})") from None
    if seconds < 0 or seconds != seconds:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {value!r})")
    return seconds


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of processes (got {value!r})") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {jobs})")
    return jobs


def _gpu_names() -> tuple[str, ...]:
    from tcaudit import gpus

    return tuple(gpus.gpus())


def _gpu(value: str) -> str:
    from tcaudit import gpus

    setting = gpus.canonical(value)
    if setting is None:
        # Not argparse's error (a usage dump above it): one line, as for any other bad setting.
        raise UsageError(
            f"argument --gpu: unknown GPU {value!r} (one of auto, {', '.join(gpus.archs())}, {', '.join(gpus.gpus())})"
        )
    return setting


def _per_file_ignore(value: str) -> tuple[str, list[str]]:
    """``GLOB:CODES`` (``tests/*.py:TC2,TC601``) as (glob, codes); the last colon splits them."""
    glob, sep, codes = value.rpartition(":")
    if not sep or not glob.strip() or not codes.strip():
        raise argparse.ArgumentTypeError(f"must be GLOB:CODES, such as 'tests/*:TC2,TC601' (got {value!r})")
    return glob.strip(), [code.strip() for code in codes.split(",") if code.strip()]


def _add_selection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rule selection")
    group.add_argument(
        "--select", type=_codes, metavar="CODES",
        help="only these rules or prefixes (e.g. TC2,TC301); replaces the config's select and ignore, as in ruff",
    )
    group.add_argument("--extend-select", type=_codes, metavar="CODES", help="add rules to the selection")
    group.add_argument(
        "--ignore", type=_codes, metavar="CODES",
        help="turn rules or prefixes off (added to the config's ignore; config key ignore)",
    )
    group.add_argument(
        "--extend-ignore", type=_codes, metavar="CODES",
        help="turn these rules off as well (added to --ignore and the config's ignore; config key extend-ignore)",
    )
    group.add_argument("--exclude", type=_codes, metavar="GLOBS", help="skip files and folders matching these globs")
    group.add_argument(
        "--extend-include", type=_codes, metavar="GLOBS",
        help="also scan files matching these globs in folders (besides *.py, *.pyi and *.ipynb; config: extend-include)",
    )
    group.add_argument(
        "--force-exclude",
        action="store_true",
        help="apply exclude patterns to files named on the command line too (for pre-commit)",
    )
    group.add_argument(
        "--no-respect-gitignore", dest="respect_gitignore", action="store_false", default=None,
        help="also scan files that .gitignore and .ignore files exclude (config: respect-gitignore = false)",
    )
    group.add_argument("--precision", choices=("auto", "bf16", "fp16"), help="precision to recommend (default auto)")
    group.add_argument(
        "--gpu", type=_gpu, metavar="GPU",
        help="target GPU: auto (default: nvidia-smi's first GPU), sm_70 ... sm_120, or a name "
             f"({', '.join(_gpu_names())})",
    )
    group.add_argument(
        "--config", metavar="FILE_OR_SETTING", action="append",
        help="read settings from this pyproject.toml or tcaudit.toml, or set one: --config \"fail-on = 'error'\" "
             "(as in ruff; repeatable; a setting wins over every config file)",
    )
    group.add_argument(
        "--per-file-ignores", metavar="GLOB:CODES", action="append", type=_per_file_ignore,
        help="ignore rules in files matching a glob, e.g. 'tests/*:TC2,TC601' (repeatable; replaces the config's "
             "per-file-ignores)",
    )
    group.add_argument(
        "--extend-per-file-ignores", metavar="GLOB:CODES", action="append", type=_per_file_ignore,
        help="like --per-file-ignores, added to the config's (config key extend-per-file-ignores)",
    )
    group.add_argument("--isolated", action="store_true", help="ignore every configuration file")


# The output formats that carry each fix's text edits (JSON ``fix.edits``, SARIF ``fixes``).
MACHINE_FORMATS_WITH_EDITS = ("json", "sarif")


def build_parser() -> argparse.ArgumentParser:
    from tcaudit.cli.fix import add_quiet

    parser = argparse.ArgumentParser(
        prog="tcaudit",
        description="Find what keeps PyTorch training code off the GPU's Tensor Cores.",
    )
    parser.add_argument("--version", action="version", version=f"tcaudit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    scan = sub.add_parser("scan", help="report findings for files and folders", description="Report findings for "
                          "files and folders. Never runs the script's training code.")
    scan.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="files and folders; - reads one script from stdin")
    scan.add_argument(
        "--stdin-filename", metavar="PATH",
        help="the name of the script read from stdin (-): for reports, per-file-ignores and finding the config",
    )
    scan.add_argument(
        "--format", "--output-format", dest="format", default="text",
        choices=FORMATS,
        help="report format (default text); --output-format is ruff's name for it",
    )
    scan.add_argument(
        "--exit-zero", action="store_true",
        help="exit 0 even when there are findings (usage, config and internal errors still exit 2)",
    )
    scan.add_argument(
        "--statistics", action="store_true",
        help="instead of the findings, one line per rule: count, code, name and how many are fixable",
    )
    scan.add_argument(
        "--show-settings", action="store_true",
        help="print the settings the scan would use (and the config file they come from), then exit 0",
    )
    scan.add_argument(
        "--show-files", action="store_true",
        help="print the files the scan would read with these settings, one a line, then exit 0",
    )
    scan.add_argument(
        "--watch", "-w", action="store_true",
        help="scan again whenever a scanned file or the config changes (Ctrl-C stops)",
    )
    add_quiet(scan)
    scan.add_argument("--output-file", "-o", metavar="FILE", help="write the report here instead of stdout")
    scan.add_argument("--fail-on", choices=("info", "warning", "error"), help="exit 1 at or above this (default warning)")
    scan.add_argument(
        "--sort", choices=("impact", "line"),
        help="order of the text and concise reports: by impact (default) or by path and line (config: sort)",
    )
    scan.add_argument(
        "--show-fixes", action="store_true",
        help="text report: show each finding's explanation (why, measured figures, what the fix does)",
    )
    scan.add_argument("--no-exec", action="store_true", help="never build the user's models (no TC1 model audit)")
    scan.add_argument("--model", metavar="PKG.MOD:FACTORY", help="audit this model factory")
    scan.add_argument("--input", metavar="SHAPE", help="input shape for --model, e.g. 8x3x224x224")
    scan.add_argument("--baseline", metavar="FILE", help="report only findings not recorded in this baseline")
    scan.add_argument("--write-baseline", metavar="FILE", help="record today's findings and exit 0")
    scan.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    speed = scan.add_argument_group("speed")
    speed.add_argument(
        "--jobs", "-j", type=_jobs, metavar="N",
        help="worker processes (default: one per core; 1 scans in this process)",
    )
    speed.add_argument(
        "--cache-dir", metavar="DIR",
        help="keep the result cache here (default: .tcaudit_cache beside the config file, or in the "
             "working folder; config key cache-dir)",
    )
    speed.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    speed.add_argument(
        "--model-budget", type=_seconds, metavar="SECONDS",
        help="time the model audit may spend building models in one scan (default 300; config: model-budget)",
    )
    scan.add_argument("--verbose", "-v", action="store_true", help="say in full why a model could not be audited")
    _add_selection(scan)

    clean = sub.add_parser(
        "clean", help="remove tcaudit's result caches",
        description="Remove the .tcaudit_cache folders in these folders and below, and the configured cache-dir "
                    "(ruff's clean). Only folders holding tcaudit's CACHEDIR.TAG are removed.")
    clean.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="folders to clean (default: .)")
    clean.add_argument("--config", metavar="FILE_OR_SETTING", action="append",
                       help="the config whose cache-dir to remove too (default: the nearest one)")
    clean.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    add_quiet(clean)

    rules = sub.add_parser("rules", help="list the rule catalog")
    rules.add_argument("--format", default="text", choices=("text", "json"))

    explain = sub.add_parser("explain", help="show one rule's documentation")
    explain.add_argument("rule", metavar="CODE")

    from tcaudit.cli.fix import add_fix_parser

    add_fix_parser(sub, _add_selection)

    from tcaudit.cli.verify import add_calibrate_parser, add_verify_parser

    add_verify_parser(sub, _add_selection)
    add_calibrate_parser(sub)

    server = sub.add_parser(
        "server", help="run the language server (LSP over stdio) for editors",
        description="Speak the Language Server Protocol over stdin/stdout: diagnostics as you type, the "
                    "model audit on save, quick fixes. Settings come from the project's config files.")
    server.add_argument("--stdio", action="store_true", help="accepted for clients that pass it (stdio is the only transport)")
    return parser


def _color(choice: str, stream) -> bool:
    """``--color always|never`` first; then, as rich (and no-color.org, force-color.org) read them,
    a non-empty ``NO_COLOR`` turns colour off, a non-empty ``FORCE_COLOR`` turns it on even when the
    output is not a terminal (NO_COLOR wins when both are set); else colour only on a terminal."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def _overrides(args: argparse.Namespace) -> dict:
    overrides = {
        "select": args.select,
        "extend-select": args.extend_select,
        "ignore": args.ignore,
        "extend-ignore": args.extend_ignore,
        "respect-gitignore": args.respect_gitignore,
        "exclude": args.exclude,
        "extend-include": getattr(args, "extend_include", None),
        "precision": args.precision,
        "gpu": args.gpu,
    }
    for key in ("per_file_ignores", "extend_per_file_ignores"):
        pairs = getattr(args, key, None)
        if pairs:
            table: dict[str, list[str]] = {}
            for glob, codes in pairs:
                table.setdefault(glob, []).extend(codes)
            overrides[key.replace("_", "-")] = table
    if getattr(args, "fail_on", None):
        overrides["fail-on"] = args.fail_on
    if getattr(args, "sort", None):
        overrides["sort"] = args.sort
    if getattr(args, "no_exec", False):
        overrides["exec-models"] = False
    if getattr(args, "model_budget", None) is not None:
        overrides["model-budget"] = args.model_budget
    if getattr(args, "model", None):
        overrides["models"] = [{"factory": args.model, **({"input": args.input} if args.input else {})}]
    return overrides


def _debug() -> bool:
    return bool(os.environ.get("TCAUDIT_DEBUG"))


def _report_errors(errors: list[str]) -> None:
    """Internal errors: one line each; the traceback only with TCAUDIT_DEBUG=1."""
    for error in errors:
        head, _, rest = error.partition("\n")
        print(f"tcaudit: error: {head}", file=sys.stderr)
        if rest and _debug():
            print(rest.rstrip("\n"), file=sys.stderr)
    if errors and not _debug():
        print("tcaudit: this is a bug in tcaudit; set TCAUDIT_DEBUG=1 to see the traceback", file=sys.stderr)


def _open_cache(args: argparse.Namespace, settings):
    """The scan's result cache, or None with --no-cache or when the folder cannot be used (a
    warning then: the scan goes on without it)."""
    if args.no_cache:
        return None
    from tcaudit.cache import open_cache

    def warn(reason: str) -> None:
        print(f"tcaudit: warning: {reason}; scanning without the cache (--no-cache silences this)", file=sys.stderr)

    return open_cache(settings, args.cache_dir, warn=warn)


def _module_findable(module: str, roots: list[str]) -> bool:
    """Whether ``module`` can be imported from ``roots`` or the installed packages, found without
    importing anything: a package's ``__init__`` is the user's code and runs only in the sandbox."""
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    parts = module.split(".")
    for root in roots:
        base = Path(root, *parts)
        if base.with_suffix(".py").is_file() or base.is_dir():  # a module, a package or a namespace package
            return True
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level lookup runs no code
    except (ImportError, ValueError):
        return False
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), list(locations))
    return spec is not None


def _check_model_option(args: argparse.Namespace, root) -> None:
    """``--model`` names an importable ``pkg.mod:factory`` and ``--input`` parses, or a usage error."""
    if not args.model:
        return
    module, _, factory = args.model.partition(":")
    if not module or not factory or not all(part.isidentifier() for part in (*module.split("."), *factory.split("."))):
        raise UsageError(f"--model must look like PKG.MOD:FACTORY (got {args.model!r})")
    if not _module_findable(module, [str(root), os.getcwd()]):
        raise UsageError(f"--model {args.model}: cannot find module {module!r} (from {root} or the installed packages)")
    if args.input:
        from tcaudit.model import parse_input  # imports no torch

        try:
            parse_input(args.input)
        except ValueError as exc:
            raise UsageError(f"--input: {exc}") from None


STDIN = "-"


def _stdin_path(args: argparse.Namespace) -> str | None:
    """The name the script read from stdin goes by (``--stdin-filename``, or ``-``), or None when
    no path is ``-``. ``-`` must be the only path: one script comes through stdin."""
    paths = args.paths
    if STDIN not in paths:
        if getattr(args, "stdin_filename", None):
            raise UsageError("--stdin-filename names the script read from stdin: pass - as the path")
        return None
    if len(paths) != 1:
        raise UsageError("- (the script on stdin) must be the only path")
    return args.stdin_filename or STDIN


def read_stdin() -> bytes:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream (tests, some embedders): its text as UTF-8
        if sys.stdin is None:
            raise UsageError("no stdin to read the script from")
        return sys.stdin.read().encode("utf-8", "surrogateescape")
    return stream.read()


class StdinScript:
    """The script read from stdin, under the name ``--stdin-filename`` gives it (reports,
    per-file-ignores, config discovery); the engine scans and fixes it from memory."""

    def __init__(self, display: str) -> None:
        self.display = display
        self.raw = read_stdin()


def _config_paths(args: argparse.Namespace, stdin: str | None) -> list[str]:
    """Where config discovery starts: the stdin script's name stands for its path."""
    if stdin is None:
        return args.paths
    return [stdin] if stdin != STDIN else []


def show_settings(settings, out) -> None:
    """The resolved settings, one ``key = value`` a line, after the config file they come from."""
    out.write(f"config file: {settings.config_path or '(none: defaults and flags only)'}\n")
    out.write(f"project root: {settings.root}\n")
    for field in dataclasses.fields(settings):
        if field.name in ("config_path", "root"):
            continue
        value = getattr(settings, field.name)
        if isinstance(value, tuple):
            value = list(value)
        out.write(f"{field.name.replace('_', '-')} = {value}\n")
    out.write(f"enabled rules ({len(settings.enabled_rules())}) = {', '.join(settings.enabled_rules())}\n")


def render_statistics(result, out, fmt: str) -> None:
    """``--statistics``: one line per rule, most frequent first, like ``ruff check --statistics``."""
    rows: dict[str, list] = {}
    for f in result.findings:
        row = rows.setdefault(f.rule, [f.rule, f.name, 0, 0])
        row[2] += 1
        row[3] += f.fix is not None and f.fix.applies_by_default
    ordered = sorted(rows.values(), key=lambda r: (-r[2], r[0]))
    if fmt == "json":
        json.dump([{"code": c, "name": n, "count": k, "fixable": x} for c, n, k, x in ordered], out, indent=2)
        out.write("\n")
        return
    width = max((len(str(r[2])) for r in ordered), default=1)
    name_width = max((len(r[1]) for r in ordered), default=0)
    for code, name, count, fixable in ordered:
        out.write(f"{count:>{width}}  {code}  {name:<{name_width}}  {fixable} fixable\n".rstrip() + "\n")


def cmd_scan(args: argparse.Namespace) -> int:
    if not args.watch:
        return _scan_once(args)
    if "-" in args.paths:
        raise UsageError("--watch reads files and folders, not stdin (-)")
    from tcaudit.cli.watch import watch

    return watch(lambda: _scan_once(args), lambda: _watched_files(args), sys.stderr)


def _watched_files(args: argparse.Namespace) -> list[str]:
    """What ``--watch`` looks at: the files the scan reads and the config file(s) its settings come from."""
    from tcaudit.config import ConfigError, load_settings
    from tcaudit.source.discovery import discover

    try:
        settings = load_settings(_config_paths(args, None), args.config, _overrides(args), args.isolated)
    except ConfigError:
        return [path for path in args.paths if os.path.exists(path)]
    found = discover(args.paths, settings.exclude, settings.root, force_exclude=settings.force_exclude,
                     respect_gitignore=settings.respect_gitignore, include=settings.included)
    return [*found.files, *([str(settings.config_path)] if settings.config_path else [])]


def _scan_once(args: argparse.Namespace) -> int:
    from tcaudit.baseline import BaselineError, filter_baseline, load_baseline, write_baseline
    from tcaudit.catalog import load_catalog
    from tcaudit.config import load_settings
    from tcaudit.engine import default_jobs, scan
    from tcaudit.report import get_reporter

    if args.input and not args.model:
        raise UsageError("--input needs --model (the factory whose input it describes)")
    stdin = _stdin_path(args)
    settings = with_detected_gpu(load_settings(_config_paths(args, stdin), args.config, _overrides(args), args.isolated))
    _check_model_option(args, settings.root)
    if args.force_exclude:
        settings = dataclasses.replace(settings, force_exclude=True)
    if args.verbose or _debug():
        settings = dataclasses.replace(settings, verbose=True)
    if args.show_settings:
        show_settings(settings, sys.stdout)
        return EXIT_CLEAN
    if args.show_files:
        return show_files(args.paths, settings, stdin, sys.stdout)
    if args.baseline:
        try:
            known = load_baseline(args.baseline)
        except BaselineError as exc:
            raise UsageError(str(exc)) from None
    if args.format in MACHINE_FORMATS_WITH_EDITS:
        settings = dataclasses.replace(settings, fix_edits=True)
    jobs = args.jobs or default_jobs()
    from tcaudit.progress import showing

    if stdin is not None:
        # The model audit imports the script's neighbours from its folder: a script on stdin has none.
        settings = dataclasses.replace(settings, exec_models=False)
        from tcaudit import api

        script = StdinScript(stdin)
        result = api.scan(text=script.raw, filename=stdin, settings=settings, edits=None).result
    else:
        cache = _open_cache(args, settings)
        with showing(args.format):  # on a terminal only: files scanned, models audited
            result = scan(args.paths, settings, jobs=jobs, cache=cache)
    if result.missing:
        for path in result.missing:
            print(f"tcaudit: error: no such file or directory: {path}", file=sys.stderr)
        return EXIT_ERROR
    if args.write_baseline:
        try:
            write_baseline(args.write_baseline, result.findings)
        except OSError as exc:
            raise UsageError(f"cannot write baseline {args.write_baseline}: {exc.strerror or exc}") from None
        print(f"tcaudit: recorded {len(result.findings)} findings in {args.write_baseline}", file=sys.stderr)
        _report_errors(result.errors)
        return EXIT_ERROR if result.errors else EXIT_CLEAN
    if args.baseline:
        before = len(result.findings)
        result.findings = filter_baseline(known, result.findings)
        result.baselined = before - len(result.findings)
    result.quiet = args.quiet
    result.gpu = _gpu_metadata(settings)
    if settings.detected_gpu is not None:
        result.notes.append(f"target GPU: {settings.detected_gpu.describe()}; --gpu sets another")
    result.show_fixes = args.show_fixes
    catalog = load_catalog()
    if args.statistics:
        def render(result, out, *, rules, color):
            render_statistics(result, out, args.format)
    else:
        render = get_reporter(args.format)
    if args.silent and not args.output_file:
        pass  # nothing printed; the exit code says it
    elif args.output_file:
        buffer = io.StringIO()
        render(result, buffer, rules=catalog, color=False)
        try:
            with open(args.output_file, "w", encoding="utf-8", newline="\n") as out:
                out.write(buffer.getvalue())
        except OSError as exc:
            raise UsageError(f"cannot write {args.output_file}: {exc.strerror or exc}") from None
    else:
        render(result, sys.stdout, rules=catalog, color=_color(args.color, sys.stdout))
        sys.stdout.flush()
    if (args.format == "concise" or args.statistics) and not (args.quiet or args.silent):
        # The concise format is one finding per line; notes go where they cannot break a parser.
        for note in result.notes:
            print(f"tcaudit: note: {note}", file=sys.stderr)
    _report_errors(result.errors)
    if result.errors:
        return EXIT_ERROR
    if args.exit_zero:
        return EXIT_CLEAN
    if any(f.severity >= settings.fail_on for f in result.findings):
        return EXIT_FINDINGS
    return EXIT_CLEAN


def show_files(paths: list[str], settings, stdin: str | None, out) -> int:
    """``scan --show-files``: the files a scan of ``paths`` reads with ``settings``, one a line (ruff's
    ``--show-files``); exit 0, or 2 for a path that does not exist."""
    from tcaudit.source.discovery import discover, display_path

    if stdin is not None:
        out.write(f"{stdin}\n")
        return EXIT_CLEAN
    found = discover(paths, settings.exclude, settings.root, force_exclude=settings.force_exclude,
                     respect_gitignore=settings.respect_gitignore, include=settings.included)
    for path in found.missing:
        print(f"tcaudit: error: no such file or directory: {path}", file=sys.stderr)
    for path in sorted(display_path(path) for path in found.files):
        out.write(f"{path}\n")
    return EXIT_ERROR if found.missing else EXIT_CLEAN


def _gpu_metadata(settings) -> dict:
    """The target GPU as machine output reports it (JSON ``gpu``, SARIF run ``properties.gpu``)."""
    target = settings.target.gpu
    data: dict = {"setting": settings.gpu}
    if target is not None:
        data.update(name=target.name, sm=target.sm)
    if settings.detected_gpu is not None:
        data["detected"] = settings.detected_gpu.to_dict()
    return data


RULES_MIN_WIDTH = 80
RULES_WIDE = 120


def rules_width() -> int:
    """The width ``tcaudit rules`` lays its table out in: the terminal's, at least 80 columns."""
    import shutil

    return max(RULES_MIN_WIDTH, shutil.get_terminal_size(fallback=(RULES_MIN_WIDTH, 24)).columns)


def cmd_rules(args: argparse.Namespace) -> int:
    from tcaudit.catalog import load_catalog

    catalog = load_catalog()
    if args.format == "json":
        data = [
            {
                "id": spec.id,
                "name": spec.name,
                "family": spec.family_name,
                "severity": str(spec.severity),
                "fix_class": str(spec.fix_class) if spec.fix_class else None,
                "needs": spec.needs,
                "summary": spec.summary,
            }
            for spec in catalog.values()
        ]
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_CLEAN
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    width = rules_width()
    # Below RULES_WIDE columns the severity and fix class go under the name, so that the summaries
    # keep a width that reads as sentences on an 80-column terminal.
    wide = width >= RULES_WIDE
    table = Table(title=f"tcaudit rules ({len(catalog)})", show_lines=False, expand=False)
    table.add_column("Code", no_wrap=True)
    table.add_column("Name" if wide else "Name / severity, fix", no_wrap=True)
    if wide:
        for column in ("Severity", "Fix"):
            table.add_column(column, no_wrap=True)
    # The summary takes the rest of the width; its words wrap, and only a word longer than the
    # column (a code span) is folded.
    table.add_column("Summary", overflow="fold", ratio=1, min_width=20)
    blank = ("",) * (2 if wide else 0)
    # One section per family (TC2 mixed precision, ...) instead of a Family column: the summaries
    # get the width.
    family = None
    for spec in catalog.values():
        if spec.family_name != family:
            if family is not None:
                table.add_section()
            family = spec.family_name
            table.add_row("", Text(f"{spec.id[:3]} {family}", style="bold"), *blank, "")
        # Text, not markup: a summary may contain brackets (``ignore[TC101]``, ``x[0]``).
        severity, fix = str(spec.severity), str(spec.fix_class or "no fix")
        if wide:
            table.add_row(spec.id, Text(spec.name), severity, fix, Text(spec.summary))
        else:
            name = Text(spec.name)
            name.append(f"\n{severity}, {fix}", style="dim")
            table.add_row(spec.id, name, Text(spec.summary))
    # The terminal's width (COLUMNS where set), never below 80 columns; piped output gets 80 too.
    Console(width=width, soft_wrap=False, highlight=False, emoji=False).print(table)
    return EXIT_CLEAN


def cmd_explain(args: argparse.Namespace) -> int:
    from tcaudit.catalog import load_catalog
    from tcaudit.explain import print_explanation, render_explanation

    catalog = load_catalog()
    code = args.rule.strip().upper()
    if code not in catalog:
        raise UsageError(f"unknown rule {args.rule!r}; `tcaudit rules` lists them")
    if sys.stdout.isatty():
        print_explanation(catalog[code], sys.stdout)  # the measured costs as a table
    else:
        sys.stdout.write(render_explanation(catalog[code]))
    return EXIT_CLEAN


def cmd_fix(args: argparse.Namespace) -> int:
    from tcaudit.cli.fix import run_fix
    from tcaudit.config import load_settings

    stdin = _stdin_path(args)
    settings = with_detected_gpu(load_settings(_config_paths(args, stdin), args.config, _overrides(args), args.isolated))
    if args.force_exclude:
        settings = dataclasses.replace(settings, force_exclude=True)
    try:
        if stdin is not None:
            from tcaudit.cli.fix import run_fix_stdin, with_structural_flags

            return run_fix_stdin(StdinScript(stdin), with_structural_flags(settings, args), args.classes,
                                 args.exit_zero, "silent" if args.silent else "quiet" if args.quiet else "")
        return run_fix(args, settings, _color(args.color, sys.stdout))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_verify(args: argparse.Namespace) -> int:
    from tcaudit.cli.verify import run_verify
    from tcaudit.config import load_settings

    settings = with_detected_gpu(load_settings([args.script], args.config, _overrides(args), args.isolated))
    try:
        return run_verify(args, settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_server(args: argparse.Namespace) -> int:
    from tcaudit.lsp.server import serve

    return serve()


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tcaudit.cli.verify import run_calibrate

    return run_calibrate(args)


def cmd_clean(args: argparse.Namespace) -> int:
    """``tcaudit clean``: remove the caches; a folder that cannot be removed is an error (exit 2)."""
    import shutil
    from pathlib import Path

    from tcaudit.cache import cache_folders, default_cache_dir
    from tcaudit.config import load_settings

    missing = [path for path in args.paths if not os.path.isdir(path)]
    if missing:
        raise UsageError(f"not a folder: {missing[0]}")
    settings = load_settings(list(args.paths), args.config, None, args.isolated)
    failed = 0
    configured = settings.cache_dir or default_cache_dir(settings)  # the one scan uses from here
    for folder in cache_folders([Path(path) for path in args.paths], configured):
        if not (args.quiet or args.silent):
            print(f"Removing cache at: {folder}", file=sys.stderr)
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            print(f"tcaudit: error: cannot remove {folder}: {exc.strerror or exc}", file=sys.stderr)
            failed += 1
    return EXIT_ERROR if failed else EXIT_CLEAN


COMMANDS = {
    "clean": cmd_clean,
    "scan": cmd_scan,
    "rules": cmd_rules,
    "explain": cmd_explain,
    "fix": cmd_fix,
    "verify": cmd_verify,
    "calibrate": cmd_calibrate,
    "server": cmd_server,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if argv[:1] == ["verify"] and "--" in argv:
        # Everything after ``--`` belongs to the training script, not to tcaudit.
        split = argv.index("--")
        argv, script_args = argv[:split], argv[split + 1:]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    except UsageError as exc:  # an option's value (``--gpu``) judged while parsing: one line, no usage dump
        print(f"tcaudit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    args.script_args = script_args
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    from tcaudit.catalog import CatalogError
    from tcaudit.config import ConfigError

    try:
        return COMMANDS[args.command](args)
    except (UsageError, ConfigError, CatalogError) as exc:
        print(f"tcaudit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("tcaudit: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLEAN
    except Exception as exc:  # noqa: BLE001 - a bug must still end with exit code 2 and a readable message
        print(f"tcaudit: error: internal error: {exc!r}", file=sys.stderr)
        if _debug():
            import traceback

            traceback.print_exc()
        else:
            print("tcaudit: this is a bug in tcaudit; set TCAUDIT_DEBUG=1 to see the traceback", file=sys.stderr)
        return EXIT_ERROR
