"""``[tool.tcaudit]`` in the nearest pyproject.toml plus command-line flags → one Settings object."""

from __future__ import annotations

import fnmatch
import functools
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from tcaudit import gpus, structural
from tcaudit.catalog import is_known_selector, matches_selector, rule_ids
from tcaudit.findings import Severity
from tcaudit.source.discovery import DEFAULT_INCLUDE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRECISIONS = ("auto", "bf16", "fp16")
# ``auto``, an architecture (sm_70 ... sm_120) or a GPU by name (``t4``, ``a100``): tcaudit/data/gpus.toml.
GPUS = gpus.choices()
SORTS = ("impact", "line")  # tcaudit/report/order.py
KNOWN_KEYS = {
    "select",
    "extend-select",
    "ignore",
    "extend-ignore",
    "respect-gitignore",
    "per-file-ignores",
    "extend-per-file-ignores",
    "extend",
    "exclude",
    "include",
    "extend-include",
    "fail-on",
    "precision",
    "gpu",
    "exec-models",
    "models",
    "structural-fixes",
    "cache-dir",
    "model-budget",
    "pad-dims",
    "sort",
}
# The option name of the opt-in fix that pads layer widths (TC101/TC102): ``Fix.option`` of its findings.
PAD_DIMS = "pad-dims"
# The structural conversions ``tcaudit fix`` makes only on request (tcaudit/structural.py).
STRUCTURAL_OPTIONS = structural.NAMES


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class ModelSpec:
    factory: str
    input: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] = ("ALL",)
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()
    # The files folders expand to (``include``, ``extend-include``: ruff's keys), as glob patterns.
    include: tuple[str, ...] = DEFAULT_INCLUDE
    extend_include: tuple[str, ...] = ()
    fail_on: Severity = Severity.WARNING
    precision: str = "auto"
    gpu: str = "auto"
    # What ``gpu = "auto"`` found in this machine (tcaudit/gpus.py); None: not looked, or nothing found.
    detected_gpu: gpus.Detected | None = None
    exec_models: bool = True
    models: tuple[ModelSpec, ...] = ()
    # Skip what ``.gitignore`` and ``.ignore`` files name when expanding folders (``respect-gitignore``).
    respect_gitignore: bool = True
    # Apply ``exclude`` to files named on the command line too (pre-commit passes every changed file).
    force_exclude: bool = False
    # Structural conversions ``fix`` may make, by name (tcaudit/structural.py).
    structural_fixes: tuple[str, ...] = ()
    # Where ``scan`` keeps its result cache (``cache-dir``, relative to the config file's folder);
    # None: ``.tcaudit_cache`` beside the config file, or in the working folder without one.
    cache_dir: Path | None = None
    # Seconds the model audit may spend building and tracing models in one scan (``model-budget``,
    # ``--model-budget``); a model left over gets a TC100 info that names the budget.
    model_budget: float = 300.0
    # ``pad-dims``, ``fix --pad-dims``: pad unaligned layer widths the script sets as literals (TC101/TC102).
    pad_dims: bool = False
    # ``sort``, ``--sort``: the order of the text and concise reports, by impact or by line
    # (tcaudit/report/order.py); machine formats keep line order.
    sort: str = "impact"
    # ``--verbose``: TC100 messages carry the full chain of what was tried.
    verbose: bool = False
    # Give each available fix its text edits (tcaudit/planned_edits.py): what machine output (JSON,
    # SARIF), the Python API and the editor need; a codemod run per finding, so the text report skips it.
    # "lazy": each finding's edits are made the first time they are read (the API's and the editor's default).
    fix_edits: "bool | str" = False
    # Plan the fixes asked for by name (``Fix.option``: the structural conversions) that the settings do
    # not ask for, so that each such finding says why its fix would be declined: ``scan``'s reports.
    # False: leave them unplanned (``unasked_options``), as ``tcaudit fix`` without the flag does: the
    # editor, whose quick fixes are what ``tcaudit fix`` makes with these settings.
    plan_unasked: bool = True
    config_path: Path | None = None
    root: Path = field(default_factory=Path.cwd)

    @property
    def target(self) -> gpus.Target:
        """The target GPU, resolved once (``gpu``: ``auto`` made concrete where detected, a GPU's key or
        an architecture): what the rules quote figures for and fit their fixes to."""
        return gpus.target(self.gpu)

    @property
    def included(self) -> tuple[str, ...]:
        """The patterns of the files a folder expands to: ``include`` plus ``extend-include``."""
        return self.include + self.extend_include

    @property
    def fix_options(self) -> tuple[str, ...]:
        """The fixes asked for by name (``Fix.option``): the structural conversions, and ``pad-dims``."""
        return self.structural_fixes + ((PAD_DIMS,) if self.pad_dims else ())

    @property
    def unasked_options(self) -> frozenset[str]:
        """The structural conversions these settings do not ask for: ``tcaudit fix`` plans none of them."""
        return frozenset(STRUCTURAL_OPTIONS) - frozenset(self.fix_options)

    def names_rule(self, rule: str) -> bool:
        """Whether ``select`` or ``extend-select`` names ``rule`` by its id (``--select TC201``), not only
        through ``ALL`` or a prefix: ``fix`` then applies what it leaves out by default (advice a
        launch-bound model cannot use, tcaudit/fix/engine.py)."""
        return rule in self.select or rule in self.extend_select

    def enabled_rules(self) -> list[str]:
        return list(_enabled_rules(self.select + self.extend_select, self.ignore))

    def ignored_for(self, path: str) -> tuple[str, ...]:
        """Selectors that per-file-ignores turns off for this path (relative to the config's folder)."""
        if not self.per_file_ignores:
            return ()
        try:
            rel = Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            rel = Path(path).as_posix()
        out: list[str] = []
        for pattern, selectors in self.per_file_ignores:
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(Path(rel).name, pattern):
                out.extend(selectors)
        return tuple(out)


@functools.lru_cache(maxsize=64)
def _enabled_rules(selectors: tuple[str, ...], ignore: tuple[str, ...]) -> tuple[str, ...]:
    """The rules these selectors choose and ``ignore`` does not turn off (asked at every scan: an editor's
    keystroke asks with the same settings)."""
    return tuple(
        rule
        for rule in rule_ids()
        if any(matches_selector(rule, s) for s in selectors) and not any(matches_selector(rule, s) for s in ignore)
    )


# The config files of one folder, in the order ruff reads ``.ruff.toml``, ``ruff.toml`` and
# ``pyproject.toml``: the first that exists wins. The first two hold the ``[tool.tcaudit]`` keys at
# their top level and count even when empty; a pyproject.toml counts only with a ``[tool.tcaudit]`` table.
CONFIG_NAMES = (".tcaudit.toml", "tcaudit.toml", "pyproject.toml")


def find_config(start: Path) -> Path | None:
    """The nearest config file upward from ``start``: ``.tcaudit.toml``, ``tcaudit.toml``, or a
    pyproject.toml that has a ``[tool.tcaudit]`` table, in that order within one folder."""
    here = start.resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        for name in CONFIG_NAMES:
            candidate = folder / name
            if not candidate.is_file():
                continue
            if name != "pyproject.toml":
                return candidate
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{candidate}: invalid TOML: {exc}") from None
            tool = data.get("tool")
            if isinstance(tool, dict) and "tcaudit" in tool:
                return candidate
    return None


COMMAND_LINE = "command line"
# Settings given to the Python API as keyword arguments (``tcaudit.api.scan(text, fail_on="error")``):
# errors name the keyword, not a command-line flag.
API_ARGUMENTS = "keyword arguments"


def _label(key: str, where: str) -> str:
    """How an error names a setting: ``--select`` for a flag, ``pyproject.toml: 'select'`` for a key."""
    if where == COMMAND_LINE:
        return f"--{key}"
    if where == API_ARGUMENTS:
        return f"{key.split('.')[0].replace('-', '_')}="
    return f"{where}: '{key}'"


def _selectors(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{_label(key, where)} must be a list of rule codes or prefixes")
    for selector in value:
        if not is_known_selector(selector):
            raise ConfigError(
                f"{_label(key, where)} names unknown rule or prefix {selector!r} (`tcaudit rules` lists them)"
            )
    return tuple(v.strip().upper() for v in value)


def _globs(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{_label(key, where)} must be a list of glob patterns")
    return tuple(value)


def _choice(value: Any, key: str, choices: tuple[str, ...], where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{_label(key, where)} must be one of {', '.join(choices)} (got {value!r})")
    return value


def _models(raw: Any, where: str) -> tuple[ModelSpec, ...]:
    label = ("--model" if where == COMMAND_LINE else "models=" if where == API_ARGUMENTS
             else f"{where}: [[tool.tcaudit.models]]")
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise ConfigError(f"{label} must be a list of tables with factory = \"pkg.mod:build\"")
    models = []
    for entry in raw:
        extra = sorted(set(entry) - {"factory", "input", "dtype"})
        if extra:
            raise ConfigError(f"{label}: unknown key {extra[0]!r} (known: dtype, factory, input)")
        factory = entry.get("factory")
        if not isinstance(factory, str) or ":" not in factory:
            raise ConfigError(f"{label}: factory must be a string like \"pkg.mod:build\" (got {factory!r})")
        for key in ("input", "dtype"):
            if key in entry and not isinstance(entry[key], str):
                raise ConfigError(f"{label}: {key} must be a string (got {entry[key]!r})")
        models.append(ModelSpec(factory, entry.get("input"), entry.get("dtype")))
    return tuple(models)


def settings_from_table(table: dict[str, Any], where: str, base: Settings) -> Settings:
    """Apply one layer of settings: a config table (``where`` is its file) or the command line's flags."""
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)} "
            f"(known: {', '.join(sorted(KNOWN_KEYS))})"
        )
    updates: dict[str, Any] = {}
    if "select" in table:
        updates["select"] = _selectors(table["select"], "select", where)
    if "extend-select" in table:
        updates["extend_select"] = _selectors(table["extend-select"], "extend-select", where)
    if "ignore" in table:
        updates["ignore"] = _selectors(table["ignore"], "ignore", where)
    if "extend-ignore" in table:
        ignore = updates.get("ignore", base.ignore)
        updates["ignore"] = ignore + _selectors(table["extend-ignore"], "extend-ignore", where)
    if "respect-gitignore" in table:
        if not isinstance(table["respect-gitignore"], bool):
            raise ConfigError(f"{_label('respect-gitignore', where)} must be true or false")
        updates["respect_gitignore"] = table["respect-gitignore"]
    for key in ("per-file-ignores", "extend-per-file-ignores"):  # the second adds to the layers before
        if key not in table:
            continue
        raw = table[key]
        if not isinstance(raw, dict):
            raise ConfigError(f"{_label(key, where)} must be a table of \"glob\" = [codes]")
        layer = tuple((pattern, _selectors(codes, f"{key}.{pattern}", where)) for pattern, codes in raw.items())
        if key == "per-file-ignores":
            updates["per_file_ignores"] = layer
        else:
            updates["per_file_ignores"] = updates.get("per_file_ignores", base.per_file_ignores) + layer
    if "extend" in table and where in (COMMAND_LINE, INLINE):
        raise ConfigError("extend is a config file's key (the file it extends), not a command-line setting")
    for key in ("exclude", "include"):
        if key in table:
            updates[key] = _globs(table[key], key, where)
    if "extend-include" in table:  # adds to what the layers before (the config file) extended it with
        updates["extend_include"] = base.extend_include + _globs(table["extend-include"], "extend-include", where)
    if "fail-on" in table:
        updates["fail_on"] = Severity.parse(_choice(table["fail-on"], "fail-on", ("info", "warning", "error"), where))
    if "precision" in table:
        updates["precision"] = _choice(table["precision"], "precision", PRECISIONS, where)
    if "gpu" in table:
        raw = table["gpu"]
        known = gpus.canonical(raw) if isinstance(raw, str) else None  # "3090", "RTX 3090" as well as "rtx3090"
        updates["gpu"] = _choice(known or raw, "gpu", GPUS, where)
    if "sort" in table:
        updates["sort"] = _choice(table["sort"], "sort", SORTS, where)
    if "exec-models" in table:
        if not isinstance(table["exec-models"], bool):
            raise ConfigError(f"{_label('exec-models', where)} must be true or false")
        updates["exec_models"] = table["exec-models"]
    if "models" in table:
        updates["models"] = _models(table["models"], where)
    if "structural-fixes" in table:
        raw = table["structural-fixes"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(v, str) and v in STRUCTURAL_OPTIONS for v in raw):
            raise ConfigError(
                f"{_label('structural-fixes', where)} must be a list of {', '.join(STRUCTURAL_OPTIONS)} (got {raw!r})"
            )
        updates["structural_fixes"] = tuple(dict.fromkeys(raw))
    if "pad-dims" in table:
        if not isinstance(table["pad-dims"], bool):
            raise ConfigError(f"{_label('pad-dims', where)} must be true or false")
        updates["pad_dims"] = table["pad-dims"]
    if "model-budget" in table:
        raw = table["model-budget"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
            raise ConfigError(f"{_label('model-budget', where)} must be a number of seconds, 0 or more (got {raw!r})")
        updates["model_budget"] = float(raw)
    if "cache-dir" in table:
        raw = table["cache-dir"]
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"{_label('cache-dir', where)} must be a folder path (got {raw!r})")
        updates["cache_dir"] = Path(raw).expanduser()
    return replace(base, **updates)


def load_settings(
    paths: list[str],
    config_file: str | None = None,
    overrides: dict[str, Any] | None = None,
    isolated: bool = False,
    overrides_from: str = COMMAND_LINE,
) -> Settings:
    """Settings from the config file (explicit, or the nearest one upward from the first path),
    then the command line's overrides, which win."""
    settings = Settings()
    config_path: Path | None = None
    config_file, inline = split_config_arguments(config_file)
    if config_file:
        config_path = Path(config_file)
        if not config_path.is_file():
            raise ConfigError(f"config file not found: {config_file}")
    elif not isolated:
        start = Path(paths[0]) if paths else Path.cwd()
        # A path that does not exist (``--stdin-filename src/new.py``) is looked for from the
        # nearest folder of it that does.
        start = next((p for p in (start, *start.parents) if p.exists()), Path.cwd())
        config_path = find_config(start)
    if config_path is not None:
        settings = _apply_config_file(config_path, settings, ())
        settings = replace(settings, config_path=config_path, root=config_path.parent)
        if settings.cache_dir is not None and not settings.cache_dir.is_absolute():
            settings = replace(settings, cache_dir=config_path.parent / settings.cache_dir)
    if inline:  # ``--config "key = value"``: over every config file, under the other flags (as in ruff)
        settings = settings_from_table(inline, INLINE, settings)
    if overrides:
        overrides = {k: v for k, v in overrides.items() if v is not None}
        selection = {k: overrides.pop(k) for k in SELECTION_KEYS if k in overrides}
        settings = settings_from_table(overrides, overrides_from, settings)
        settings = command_line_selection(settings, selection, overrides_from)
    return settings


SELECTION_KEYS = ("select", "extend-select", "ignore", "extend-ignore")
INLINE = "--config"  # where an inline ``--config "key = value"`` setting comes from, for messages
# How many files an ``extend`` chain may hold before it is taken for a mistake.
MAX_EXTENDS = 16


def _config_table(path: Path) -> dict[str, Any]:
    """The ``[tool.tcaudit]`` table of a pyproject.toml, or a tcaudit.toml's top level."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    tool = data.get("tool")
    if isinstance(tool, dict) and "tcaudit" in tool:
        table = tool["tcaudit"]
    else:  # a tcaudit.toml holds the keys at its top level
        table = {} if path.name == "pyproject.toml" else data
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.tcaudit] must be a table")
    return table


def _apply_config_file(path: Path, settings: "Settings", chain: tuple[Path, ...]) -> "Settings":
    """``path``'s settings over ``settings``, after those of the file its ``extend`` names (relative to
    ``path``'s folder, as ruff resolves it): a nested config keeps its parent's ignores by extending it."""
    table = _config_table(path)
    if "extend" in table:
        raw = table["extend"]
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"{path}: extend must be the path of a config file (got {raw!r})")
        base = (path.parent / Path(raw).expanduser()).resolve()
        resolved_chain = (*chain, path.resolve())
        if base in resolved_chain:
            raise ConfigError(f"{path}: extend makes a cycle: {' -> '.join(str(p) for p in (*resolved_chain, base))}")
        if len(resolved_chain) >= MAX_EXTENDS:
            raise ConfigError(f"{path}: extend chains more than {MAX_EXTENDS} config files")
        if not base.is_file():
            raise ConfigError(f"{path}: extend names a config file that does not exist: {raw}")
        settings = _apply_config_file(base, settings, resolved_chain)
        table = {key: value for key, value in table.items() if key != "extend"}
    return settings_from_table(table, str(path), settings)


def split_config_arguments(values: "str | Sequence[str] | None") -> "tuple[str | None, dict[str, Any]]":
    """``--config`` as ruff takes it, once or more: a config file's path, or an inline TOML ``key = value``
    setting. (the file, or None; the inline settings as one table). ConfigError for two files, or a value
    that is neither."""
    if values is None:
        return None, {}
    if isinstance(values, str):
        values = [values]
    config_file: str | None = None
    inline: dict[str, Any] = {}
    for value in values:
        if Path(value).expanduser().is_file() or "=" not in value:
            if config_file is not None:
                raise ConfigError(f"--config: one config file at most (got {config_file} and {value})")
            config_file = value
            continue
        try:
            table = tomllib.loads(value)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config: {value!r} is neither a config file nor a TOML `key = value` setting "
                              f"({exc})") from None
        inline.update(table)
    return config_file, inline


def command_line_selection(settings: Settings, flags: dict[str, Any], where: str = COMMAND_LINE) -> Settings:
    """The command line's rule selection on top of the config's, as ruff layers them: the command
    line is applied after the config, so ``--select`` replaces the config's ``select`` and its
    ``ignore`` (the config's ignore no longer hides what the command line selected), ``--extend-select``
    turns rules on even where the config ignores them, and ``--ignore``/``--extend-ignore`` add to the
    config's ignore. per-file-ignores and suppression comments still apply afterwards."""
    if not flags:
        return settings
    layer = {key: _selectors(value, key, where) for key, value in flags.items()}
    ignore = layer.get("ignore", ()) + layer.get("extend-ignore", ())
    extend = layer.get("extend-select", ())
    if "select" in layer:
        return replace(settings, select=layer["select"], extend_select=extend, ignore=ignore)
    kept = settings.ignore
    if extend and kept:
        # What the config ignores, less what the command line selects: as rule ids, since a prefix
        # the config ignores (TC2) may hold a rule the command line selects (TC202).
        kept = tuple(
            rule for rule in rule_ids()
            if any(matches_selector(rule, s) for s in kept) and not any(matches_selector(rule, s) for s in extend)
        )
    return replace(settings, extend_select=settings.extend_select + extend, ignore=kept + ignore)
