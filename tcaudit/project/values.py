"""The value a name holds where it is used, judged by what it holds: a literal written there, a name
bound to one (an earlier notebook cell, a module constant, a constant of another project module), an
argparse option's default when the flag is not passed (``--workers`` defaults to 0), a dataclass
field's default (``cfg.num_workers`` of ``cfg = TrainConfig()``), and the arms of ``a if c else b``
whose test can be decided.

Each answer says how the value was reached (:attr:`Value.how`), so a finding can say "`--workers`
defaults to 0" rather than "num_workers=0", and whether the user chooses it on the command line
(:attr:`Value.on_command_line`): a default of an option the project's launch scripts pass is the
user's choice, not a default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from tcaudit.project.imports import read_small
from tcaudit.project.modules import load_module
from tcaudit.project.symbols import Project
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.inert import note_read
from tcaudit.source.syntax import full_name, keyword, param_names

MAX_DEPTH = 8
# Names scripts give the namespace parse_args() returns (or a config object passed around).
_ARGS_NAMES = frozenset({"args", "opt", "opts", "options", "cfg", "config", "hparams", "hp", "flags", "FLAGS", "params"})
_PARSE_ARGS = re.compile(r"(^|\.)parse(_known)?_args$")
# Calls that build a config object from a dataclass and the command line (its defaults otherwise).
_CONFIG_PARSERS = frozenset({"tyro.cli", "simple_parsing.parse", "jsonargparse.CLI"})
_LAUNCH_SUFFIXES = (".sh", ".bash", ".zsh", ".slurm", ".sbatch", ".cmd", ".bat", ".ps1")
_LAUNCH_NAMES = frozenset({"Makefile", "makefile", "justfile", "Justfile", "Procfile"})


@dataclass(frozen=True)
class Value:
    """One value an expression may hold. ``how``: what makes it that value, in a finding's words ("" for
    a literal written at the use); ``where``: (display path, line) of the place that sets it;
    ``on_command_line``: a default of a command-line option (the user may pass another)."""

    value: object
    how: str = ""
    where: tuple[str, int] | None = None
    on_command_line: bool = False

    @property
    def said(self) -> str:
        """``how`` with its place: "`--workers` defaults to 0 (train.py:7)"."""
        return f"{self.how} ({self.where[0]}:{self.where[1]})" if self.how and self.where else self.how


class Values:
    """Values of expressions in the modules of one project (seen from its entry file)."""

    def __init__(self, project: Project, assume: dict[str, object] | None = None) -> None:
        self.project = project
        self.assume = dict(assume or {})
        self._launch_text: str | None = None
        self._option_sources: list[ScriptFacts] | None = None

    def of(self, facts: ScriptFacts, expr: cst.BaseExpression | None, fn: cst.FunctionDef | None = None,
           depth: int = 0) -> list[Value] | None:
        """Every value ``expr`` (written in ``facts``' module, inside ``fn``) may hold, or None when one
        of them cannot be known."""
        if expr is None or depth > MAX_DEPTH:
            return None
        value = literal(expr)
        if value is not ...:
            return [Value(value)]
        if isinstance(expr, cst.IfExp):
            test = self.of(facts, expr.test, fn, depth + 1)
            arms = []
            if test is None or any(bool(v.value) for v in test):
                arms.append(expr.body)
            if test is None or any(not v.value for v in test):
                arms.append(expr.orelse)
            return self._all(facts, arms, fn, depth)
        if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
            return self._compare(facts, expr, fn, depth)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            inner = self.of(facts, expr.expression, fn, depth + 1)
            return None if inner is None else [Value(not v.value, v.how, v.where, v.on_command_line) for v in inner]
        if isinstance(expr, cst.BooleanOperation):
            left = self.of(facts, expr.left, fn, depth + 1)
            right = self.of(facts, expr.right, fn, depth + 1)
            if left is None or right is None:
                return None
            is_and = isinstance(expr.operator, cst.And)
            return [Value((a.value and b.value) if is_and else (a.value or b.value), a.how or b.how, a.where or b.where,
                          a.on_command_line or b.on_command_line) for a in left for b in right]
        if isinstance(expr, cst.Call):
            qual = facts.qualname(expr.func)
            if qual in self.assume:
                return [Value(self.assume[qual])]
            return None
        dotted = full_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if dotted is None:
            return None
        return self._name(facts, expr, dotted, fn, depth)

    def _all(self, facts: ScriptFacts, exprs: list[cst.BaseExpression], fn, depth: int) -> list[Value] | None:
        out: list[Value] = []
        for expr in exprs:
            found = self.of(facts, expr, fn, depth + 1)
            if found is None:
                return None
            out += found
        return out

    def _compare(self, facts: ScriptFacts, expr: cst.Comparison, fn, depth: int) -> list[Value] | None:
        target = expr.comparisons[0]
        if not isinstance(target.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)):
            return None
        left = self.of(facts, expr.left, fn, depth + 1)
        right = self.of(facts, target.comparator, fn, depth + 1)
        if left is None or right is None:
            return None
        equal = isinstance(target.operator, (cst.Equal, cst.Is))
        return [Value((a.value == b.value) == equal, a.how or b.how, a.where or b.where,
                      a.on_command_line or b.on_command_line) for a in left for b in right]

    # -- names ---------------------------------------------------------------------------------------
    def _name(self, facts: ScriptFacts, expr: cst.BaseExpression, dotted: str, fn, depth: int) -> list[Value] | None:
        root, _, attr = dotted.partition(".")
        if fn is not None and root in param_names(fn) and root not in ("self", "cls"):
            if attr and _hydra_main(facts, fn) is not None:
                return self._hydra(facts, fn, attr)  # ``@hydra.main(...) def main(cfg): cfg.data.workers``
            if attr and "." not in attr and _args_like(root):
                # ``def get_data(args): ... args.workers``; or a config the entry's Hydra main hands on
                return self._option(facts, attr) or self._entry_hydra(attr)
            if attr and _args_like(root):
                return self._entry_hydra(attr)  # ``def get_data(cfg): ... cfg.data.workers``
            if not attr:
                return self._click_option(facts, fn, root)  # ``@click.option("--workers", default=0)``
            return None
        bindings = [b for b in facts.bindings_of(dotted) if not b.is_item_write]
        local = [b for b in bindings if fn is not None and b.ctx.function is fn]
        if local:
            bindings = local
        elif fn is not None:
            bindings = [b for b in bindings if b.ctx.function is None]
        if bindings:
            out: list[Value] = []
            for binding in bindings:
                found = self.of(facts, binding.value, binding.ctx.function, depth + 1)
                if found is None:
                    return None
                line = facts.line_of(binding.statement.node if binding.statement is not None else binding.value)
                code = " ".join(facts.code(binding.value).split())
                out += [Value(v.value, v.how or f"`{dotted} = {code}`",
                              v.where or (facts.source.display_path, line), v.on_command_line) for v in found]
            return out
        symbol = self.project.symbol(facts, dotted)
        if symbol is not None and symbol.kind == "constant" and isinstance(symbol.node, cst.BaseExpression):
            found = self.of(symbol.facts, symbol.node, None, depth + 1)
            if found is None:
                return None
            return [Value(v.value, v.how or f"`{symbol.name}` is {v.value!r} in {symbol.module.path.name}",
                          v.where or (symbol.module.display_path, symbol.line), v.on_command_line) for v in found]
        if attr:
            holder = [b for b in facts.bindings_of(root) if not b.is_item_write]
            if holder and all(isinstance(b.value, cst.Call) and (facts.qualname(b.value.func) or "") in _OMEGACONF
                              for b in holder):
                return self._omegaconf(facts, holder, attr, depth)
        if attr and "." not in attr:
            holder = [b for b in facts.bindings_of(root) if not b.is_item_write]
            if holder and all(isinstance(b.value, cst.Call) and _PARSE_ARGS.search(full_name(b.value.func) or "")
                              for b in holder):
                return self._option(facts, attr)
            if not holder and _args_like(root):
                return self._option(facts, attr)
            field = self._field(facts, holder, attr, depth)
            if field is not None:
                return field
        return None

    # -- OmegaConf and Hydra configs ------------------------------------------------------------------
    def _omegaconf(self, facts: ScriptFacts, holder: list, attr: str, depth: int) -> list[Value] | None:
        """``cfg.data.workers`` where every value of ``cfg`` is ``OmegaConf.load("conf.yaml")`` (the key in
        that file), ``OmegaConf.create({...})`` (the dict written there) or ``OmegaConf.structured(Config)``
        (the dataclass's default)."""
        out: list[Value] = []
        for binding in holder:
            call = binding.value
            kind = (facts.qualname(call.func) or "").rsplit(".", 1)[-1]
            first = call.args[0].value if call.args and call.args[0].keyword is None else None
            if kind == "load":
                name = literal(first) if first is not None else None
                if not isinstance(name, str):
                    return None
                found = config_value(self._config_file(facts, name), attr)
                if found is None:
                    return None
                value, where = found
                out.append(Value(value, f"`{attr}` is {value!r} in the YAML config", where))
            elif kind == "create":
                found = self._dict_value(facts, first, attr.split("."), depth)
                if found is None:
                    return None
                out += found
            elif kind == "structured" and first is not None and "." not in attr:
                found = self._field(facts, [_Bound(cst.Call(func=first))], attr, depth)
                if found is None:
                    return None
                out += found
            else:
                return None
        return out

    def _dict_value(self, facts: ScriptFacts, node, keys: list[str], depth: int) -> list[Value] | None:
        """The value under ``keys`` in a dict display (``{"data": {"workers": 0}}``, ``dict(workers=0)``)."""
        for index, key in enumerate(keys):
            found = None
            if isinstance(node, cst.Dict):
                for element in node.elements:
                    if isinstance(element, cst.DictElement) and literal(element.key) == key:
                        found = element.value
            elif isinstance(node, cst.Call) and full_name(node.func) == "dict":
                argument = keyword(node, key)
                found = argument.value if argument is not None else None
            if found is None:
                return None
            node = found
        held = self.of(facts, node, None, depth + 1)
        if held is None:
            return None
        line = facts.line_of(node)
        where = (facts.source.display_path, line)
        return [Value(v.value, v.how or f"`{'.'.join(keys)}` is {v.value!r} in the config", where) for v in held]

    def _hydra(self, facts: ScriptFacts, fn: cst.FunctionDef, attr: str) -> list[Value] | None:
        """``cfg.data.workers`` in ``@hydra.main(config_path="conf", config_name="config") def main(cfg)``:
        the key in the composed config (the primary file and the groups its ``defaults`` list picks), a
        default the command line may override (``data.workers=8``), so none where a launch script does."""
        spec = _hydra_main(facts, fn)
        if spec is None:
            return None
        config_path, config_name = spec
        folder = facts.source.path.resolve().parent / config_path
        found = hydra_value(folder, config_name, attr)
        if found is None or self._launch_overrides(attr):
            return None
        value, where = found
        return [Value(value, f"`{attr}` is {value!r} in the Hydra config", where, True)]

    def _entry_hydra(self, attr: str) -> list[Value] | None:
        """``attr`` of the config the entry script's Hydra main receives (and hands to this helper)."""
        entry = self.project.entry
        for fn in entry.functions_by_name.values():
            for candidate in fn:
                if _hydra_main(entry, candidate) is not None:
                    return self._hydra(entry, candidate, attr)
        return None

    def _config_file(self, facts: ScriptFacts, name: str) -> Path | None:
        """A config file a script loads by a relative name: beside the script, or from the project root."""
        for folder in (facts.source.path.resolve().parent, self.project.root):
            if folder is not None and (Path(folder) / name).is_file():
                return Path(folder) / name
        return None

    def _launch_overrides(self, key: str) -> bool:
        """Whether a launch script passes the Hydra override ``key=...`` (or ``+key=``, ``++key=``)."""
        self._launch_passes([])
        return re.search(rf"(^|\s)\+{{0,2}}{re.escape(key)}=", self._launch_text or "", re.MULTILINE) is not None

    def _click_option(self, facts: ScriptFacts, fn: cst.FunctionDef, name: str) -> list[Value] | None:
        """The default of ``@click.option("--workers", default=0)`` (or typer's) for the parameter
        ``name`` of the command ``fn``, when no launch script of the project passes the flag."""
        for decorator in fn.decorators:
            call = decorator.decorator
            if not isinstance(call, cst.Call) or not (facts.qualname(call.func) or "").endswith((".option", ".Option")):
                continue
            flags = [v for v in (literal(a.value) for a in call.args if a.keyword is None) if isinstance(v, str)]
            names = {f.lstrip("-").replace("-", "_") for f in flags if not f.startswith("-") or f.startswith("--")}
            if name not in names and name not in flags:
                continue
            default = keyword(call, "default")
            if default is None or literal(keyword(call, "required").value if keyword(call, "required") else None) is True:
                return None
            found = self.of(facts, default.value, None, 0)
            if found is None or self._launch_passes(flags):
                return None
            flag = next((f for f in flags if f.startswith("--")), name)
            line = facts.line_of(call)
            return [Value(v.value, f"`{flag}` defaults to {v.value!r}",
                          (facts.source.display_path, line), True) for v in found]
        return None

    def _field(self, facts: ScriptFacts, holder: list, attr: str, depth: int) -> list[Value] | None:
        """``cfg.workers`` where every value of ``cfg`` is ``TrainConfig()`` with no argument for it: the
        class-level default of the field (a dataclass, or a plain class attribute)."""
        if not holder:
            return None
        out: list[Value] = []
        for binding in holder:
            value = binding.value
            command_line = False
            if isinstance(value, cst.Call) and (facts.qualname(value.func) or "") in _CONFIG_PARSERS and value.args:
                # ``cfg = tyro.cli(TrainConfig)``: the dataclass's defaults, unless the command line sets them.
                value, command_line = cst.Call(func=value.args[0].value), True
            if not isinstance(value, cst.Call) or keyword(value, attr) is not None or any(a.keyword is None for a in value.args):
                return None
            name = full_name(value.func)
            cls_facts, cls = facts, facts.classes_by_name.get(name or "")
            if cls is None:
                symbol = self.project.symbol(facts, name)
                if symbol is None or symbol.kind != "class":
                    return None
                cls_facts, cls = symbol.facts, symbol.node
            default = class_default(cls, attr)
            if default is None:
                return None
            found = self.of(cls_facts, default, None, depth + 1)
            if found is None:
                return None
            line = cls_facts.line_of(default)
            out += [Value(v.value, f"`{cls.name.value}.{attr}` defaults to {v.value!r}",
                          (cls_facts.source.display_path, line), command_line) for v in found]
        return out

    def _option(self, facts: ScriptFacts, dest: str) -> list[Value] | None:
        """The default of the command-line option whose destination is ``dest``, looked up in the entry
        script, then in the module asking, then in the project modules they import. None where no
        such option is found, it has no literal default or is required, or a launch script of the
        project passes the flag (then the user chooses it)."""
        seen: set[int] = set()
        for module in self._option_modules(facts):
            if id(module) in seen:
                continue
            seen.add(id(module))
            for call in module.method_calls("add_argument"):
                flags = [literal(a.value) for a in call.node.args if a.keyword is None]
                flags = [f for f in flags if isinstance(f, str)]
                explicit = literal(call.arg("dest"))
                longs = [f for f in flags if f.startswith("--")] or flags
                names = {f.lstrip("-").replace("-", "_") for f in flags}
                if explicit != dest and (explicit is not ... or dest not in names):
                    continue
                if literal(call.arg("required")) is True:
                    return None
                default = call.arg("default")
                if default is None:
                    return None
                found = self.of(module, default, call.ctx.function, 0)
                if found is None:
                    return None
                flag = longs[0] if longs else dest
                if self._launch_passes(flags):
                    return None
                line = module.line_of(call.node)
                return [Value(v.value, f"`{flag}` defaults to {v.value!r}",
                              (module.source.display_path, line), True) for v in found]
        return None

    def _option_modules(self, facts: ScriptFacts) -> list[ScriptFacts]:
        from tcaudit.project.imports import dependencies

        if self._option_sources is None:
            entry = self.project.entry.source
            self._option_sources = []
            for path in dependencies(entry.path, entry.text, self.project.root).files:
                module = load_module(path)
                if module is not None and "add_argument" in module.source.text:
                    self._option_sources.append(module.facts)
        return [self.project.entry, facts, *self._option_sources]

    def _launch_passes(self, flags: list[str]) -> bool:
        """Whether a launch script beside the entry script (``*.sh``, a Makefile...) names it with one
        of ``flags``: the user then sets the option on the command line."""
        if self._launch_text is None:
            entry = self.project.entry.source.path
            texts = []
            folders = {entry.parent.resolve()} | ({self.project.root.resolve()} if self.project.root else set())
            for folder in folders:
                note_read(folder)
                try:
                    children = sorted(folder.iterdir())[:500]
                except OSError:
                    continue
                for child in children:
                    if child.suffix in _LAUNCH_SUFFIXES or child.name in _LAUNCH_NAMES:
                        raw = read_small(child, 200_000)
                        text = raw.decode("utf-8", "replace") if raw is not None else ""
                        if entry.name in text or entry.stem in text:
                            texts.append(text)
            self._launch_text = "\n".join(texts)
        return any(re.search(rf"(^|\s){re.escape(f)}(=|\s|$)", self._launch_text, re.MULTILINE) for f in flags if f.startswith("-"))


def _args_like(name: str) -> bool:
    """A name scripts give the parsed command line (``args``, ``opt``, ``cfg``, ``hparams``...)."""
    return name in _ARGS_NAMES or name.lower().startswith(("arg", "opt", "cfg", "conf", "hparam", "flag"))


def class_default(cls: cst.ClassDef, attr: str) -> cst.BaseExpression | None:
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    for statement in cls.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == attr:
                return small.value
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name) \
                    and small.targets[0].target.value == attr:
                return small.value
    return None


@dataclass(frozen=True)
class _Bound:
    """A stand-in binding for :meth:`Values._field` (``OmegaConf.structured(Config)`` is ``Config()``)."""

    value: cst.BaseExpression


# OmegaConf's constructors of a config object.
_OMEGACONF = frozenset(f"omegaconf.{where}OmegaConf.{kind}" for where in ("", "omegaconf.")
                       for kind in ("load", "create", "structured"))
# How large a config file is read (a config, not data).
MAX_CONFIG_BYTES = 1_000_000


def _hydra_main(facts: ScriptFacts, fn: cst.FunctionDef) -> tuple[str, str] | None:
    """(config_path, config_name) of ``@hydra.main(config_path=..., config_name=...)`` on ``fn``."""
    for decorator in fn.decorators:
        call = decorator.decorator
        if not isinstance(call, cst.Call) or (facts.qualname(call.func) or "") != "hydra.main":
            continue
        path = literal(keyword(call, "config_path").value) if keyword(call, "config_path") is not None else "."
        name = literal(keyword(call, "config_name").value) if keyword(call, "config_name") is not None else None
        if isinstance(path, str) and isinstance(name, str):
            return path, name.removesuffix(".yaml")
    return None


def hydra_value(folder: Path, config_name: str, key: str) -> tuple[object, tuple[str, int]] | None:
    """``key`` (dotted) in the Hydra config ``config_name`` of ``folder`` as Hydra composes it: the
    primary file's own value, else the value in the group file its ``defaults`` list picks for the key's
    first part (``defaults: [{data: imagenet}]`` → ``data/imagenet.yaml``). None where it is not there,
    not a plain scalar, or an interpolation."""
    primary = folder / f"{config_name}.yaml"
    found = config_value(primary, key)
    if found is not None:
        return found
    head, _, rest = key.partition(".")
    if not rest:
        return None
    data = _yaml_data(primary)
    defaults = data.get("defaults") if isinstance(data, dict) else None
    for entry in defaults if isinstance(defaults, list) else ():
        if isinstance(entry, dict) and len(entry) == 1 and next(iter(entry)) == head and isinstance(entry[head], str):
            return config_value(folder / head / f"{entry[head]}.yaml", rest)
    return None


def config_value(path: Path | None, key: str) -> tuple[object, tuple[str, int]] | None:
    """(value, (display path, line)) of the dotted ``key`` in a YAML config file: a plain scalar only (an
    interpolation ``${...}`` or a missing ``???`` is not a value)."""
    import yaml

    from tcaudit.source.discovery import display_path

    node = _yaml_node(path)
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
    if not isinstance(node, yaml.ScalarNode) or "${" in node.value or node.value == "???":
        return None
    try:
        value = yaml.SafeLoader("").construct_object(node)
    except (yaml.YAMLError, ValueError):
        return None
    if not isinstance(value, (int, float, str, bool)) and value is not None:
        return None
    assert path is not None
    return value, (display_path(path), node.start_mark.line + 1)


def _yaml_node(path: Path | None):
    import yaml

    raw = read_small(path, MAX_CONFIG_BYTES) if path is not None else None
    if raw is None:
        return None
    try:
        return yaml.compose(raw.decode("utf-8", "replace"), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None


def _yaml_data(path: Path):
    import yaml

    node = _yaml_node(path)
    if node is None:
        return None
    try:
        return yaml.SafeLoader("").construct_document(node)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
