"""The static slice: the statements a model construction needs, and nothing of the training run.

Starting from the construction expression, the slicer walks backwards through its scope and keeps
the statements that bind the names it uses (assignments, imports, defs, config dataclasses, mutations
such as ``model_args['vocab_size'] = ...``), transitively. ``if`` statements on the way become
*guards*: the construction is only audited when the script's defaults reach it (an ``if/elif`` on
``args.arch`` picks one model). When the construction sits in a function whose parameters it needs
(``def train(cfg): model = TinyGPT(cfg)``), the slicer finds a call of that function
(``train(GPTConfig())``) and binds the parameters exactly as Python would, then goes on in the
caller's scope. ``parser.parse_args()`` (and local ``get_args()`` helpers) become a namespace of the
argparse defaults. Loops never run; the ``if __name__ == "__main__":`` body contributes only the
statements on the path to the construction; statements that read data or checkpoints, download,
spawn processes or start a distributed job are dropped, with a note that explains a later failure.

The result is a list of items (see :func:`tcaudit.model.build.compile_items`) that keep every
statement's original line and column, so tracebacks and construction sites point at the user's code.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst

from tcaudit.model.build import MODEL_VAR, MODULE_METHOD
from tcaudit.model.discovery import Candidate, ScriptIndex, dotted, function_effect
from tcaudit.source.syntax import evaluated_value, is_main_guard, param_names

MUTATING_METHODS = {
    "update", "append", "extend", "insert", "setdefault", "pop", "add", "remove", "clear", "__setitem__",
    "discard", "sort",
}
DENIED_CALLS = {
    "torch.load": "loads a checkpoint",
    "torch.hub.load": "downloads a model",
    "torch.hub.load_state_dict_from_url": "downloads weights",
    "pickle.load": "unpickles data",
    "pickle.loads": "unpickles data",
    "numpy.load": "reads data",
    "numpy.memmap": "maps a data file",
    "numpy.fromfile": "reads data",
    "datasets.load_dataset": "loads a dataset",
    "torch.distributed.init_process_group": "starts a distributed job",
    "torch.multiprocessing.spawn": "spawns processes",
    "os.system": "runs a shell command",
    "input": "waits for keyboard input",
    "torch.utils.data.DataLoader": "builds a data loader",
}
DENIED_PREFIXES = {
    "subprocess.": "runs a process",
    "requests.": "uses the network",
    "urllib.": "uses the network",
    "shutil.": "changes files",
    "wandb.": "talks to an experiment tracker",
    "mlflow.": "talks to an experiment tracker",
    "torchvision.datasets.": "reads a dataset",
    "torch.distributed.": "uses torch.distributed",
}
DENIED_METHODS = {
    "load_state_dict": "loads weights",
    "from_pretrained": "downloads pretrained weights",
    "fit": "trains",
    "download": "downloads",
    "save_pretrained": "writes files",
    "init_process_group": "starts a distributed job",
}
# Keyword arguments dropped from factory calls: they fetch weights, not architecture.
WEIGHT_KEYWORDS = {"weights", "pretrained", "weights_backbone", "pretrained_backbone", "progress"}
MAX_CALL_DEPTH = 6


class SliceError(Exception):
    """The construction cannot be sliced out of the script; the message says why."""


@dataclass
class Plan:
    program: list[dict]
    construction: dict
    skipped: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)  # top-level packages the slice imports outside try:


# -- names ---------------------------------------------------------------------------------------


class _Uses(cst.CSTVisitor):
    """Names an expression or statement reads; ``self.x`` is recorded as ``self.x`` and ``self``."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if isinstance(node.value, cst.Name) and node.value.value == "self":
            self.names.add("self")
            self.names.add(f"self.{node.attr.value}")
            return False
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        if node.annotation is not None:
            node.annotation.visit(self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for decorator in node.decorators:
            decorator.visit(self)
        node.params.visit(self)
        node.body.visit(self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        for decorator in node.decorators:
            decorator.visit(self)
        for base in node.bases:
            base.visit(self)
        node.body.visit(self)
        return False

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return False


def used_names(node: cst.CSTNode) -> set[str]:
    visitor = _Uses()
    node.visit(visitor)
    return visitor.names


def _target_names(target: cst.BaseExpression, full: set[str], mutated: set[str], uses: set[str]) -> None:
    if isinstance(target, cst.Name):
        full.add(target.value)
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _target_names(element.value, full, mutated, uses)
    elif isinstance(target, cst.StarredElement):
        _target_names(target.value, full, mutated, uses)
    elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
        full.add(f"self.{target.attr.value}")
        uses.add("self")
    elif isinstance(target, (cst.Attribute, cst.Subscript)):
        root: cst.BaseExpression = target
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            if isinstance(root, cst.Subscript):
                uses.update(used_names(root.slice[0]) if root.slice else set())
            root = root.value
        if isinstance(root, cst.Name):
            mutated.add(root.value)
            uses.add(root.value)


def statement_effects(small: cst.CSTNode) -> tuple[set[str], set[str], set[str]]:
    """(names fully bound, names mutated, names read) of one small statement or def/class."""
    full: set[str] = set()
    mutated: set[str] = set()
    uses: set[str] = set()
    if isinstance(small, cst.Assign):
        for target in small.targets:
            _target_names(target.target, full, mutated, uses)
        uses |= used_names(small.value)
    elif isinstance(small, cst.AnnAssign):
        if small.value is not None:
            _target_names(small.target, full, mutated, uses)
            uses |= used_names(small.value)
    elif isinstance(small, cst.AugAssign):
        _target_names(small.target, full, mutated, uses)
        mutated |= full
        uses |= full | used_names(small.value)
        full = set()
    elif isinstance(small, cst.Import):
        for alias in small.names:
            name = dotted(alias.name) or ""
            full.add(dotted(alias.asname.name) if alias.asname is not None else name.split(".")[0])
    elif isinstance(small, cst.ImportFrom):
        if isinstance(small.names, cst.ImportStar):
            full.add("*")
        else:
            for alias in small.names:
                full.add(dotted(alias.asname.name) if alias.asname is not None else dotted(alias.name) or "")
    elif isinstance(small, (cst.FunctionDef, cst.ClassDef)):
        full.add(small.name.value)
        uses |= used_names(small)
    elif isinstance(small, cst.Expr):
        value = small.value
        uses |= used_names(value)
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            if value.func.attr.value in MUTATING_METHODS:
                root: cst.BaseExpression = value.func.value
                while isinstance(root, (cst.Attribute, cst.Subscript)):
                    root = root.value
                if isinstance(root, cst.Name):
                    mutated.add(root.value)
    elif isinstance(small, cst.Return) and small.value is not None:
        uses |= used_names(small.value)
    return full, mutated, uses


def _bound_anywhere(node: cst.CSTNode) -> set[str]:
    """Every name a (compound) statement may bind or mutate somewhere inside."""
    names: set[str] = set()

    class Binder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> bool:
            for small in line.body:
                full, mutated, _ = statement_effects(small)
                names.update(full | mutated)
            return False

        def visit_FunctionDef(self, fn: cst.FunctionDef) -> bool:
            names.add(fn.name.value)
            return False

        def visit_ClassDef(self, cls: cst.ClassDef) -> bool:
            names.add(cls.name.value)
            return False

        def visit_AsName(self, node: cst.AsName) -> None:
            target = dotted(node.name)
            if target:
                names.add(target)

    node.visit(Binder())
    return names


def _mutated_globals(function: cst.FunctionDef) -> set[str]:
    """Names a function mutates in place (``REGISTRY[key] = fn``, ``REGISTRY.update(...)``)."""
    names: set[str] = set()

    class Finder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> None:
            for small in line.body:
                _, mutated, _ = statement_effects(small)
                names.update(mutated)

    function.body.visit(Finder())
    return names


def _block(node: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return node.body if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)) else []


# -- the slicer ----------------------------------------------------------------------------------


class Slicer:
    def __init__(self, index: ScriptIndex) -> None:
        self.index = index
        self.skipped: list[str] = []
        self.imports: set[str] = set()
        self.counter = 0
        self._effects: dict[str, str | None] = {}

    # denylist
    def effect_of(self, name: str) -> str | None:
        """What a function of the script that a statement calls does beyond building
        (:func:`~tcaudit.model.discovery.function_effect`): such a statement is left out of the slice."""
        if name not in self._effects:
            infos = [i for i in self.index.functions.get(name, []) if i.owner is None] if "." not in name else []
            self._effects[name] = next(filter(None, (function_effect(self.index, i.node) for i in infos)), None)
        return self._effects[name]

    def denied(self, node: cst.CSTNode) -> str | None:
        index = self.index
        slicer = self
        reason: str | None = None

        class Finder(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                nonlocal reason
                if reason is not None:
                    return
                name = dotted(call.func) or ""
                qualified = index.resolve(name) or name
                if qualified in DENIED_CALLS:
                    reason = f"{DENIED_CALLS[qualified]} (`{name}`)"
                    return
                for prefix, why in DENIED_PREFIXES.items():
                    if qualified.startswith(prefix):
                        reason = f"{why} (`{name}`)"
                        return
                if isinstance(call.func, cst.Attribute) and call.func.attr.value in DENIED_METHODS:
                    reason = f"{DENIED_METHODS[call.func.attr.value]} (`.{call.func.attr.value}()`)"
                    return
                if name == "open":
                    mode = next((a.value for a in call.args[1:2] if a.keyword is None), None)
                    mode = mode or next((a.value for a in call.args if a.keyword and a.keyword.value == "mode"), None)
                    text = evaluated_value(mode) if isinstance(mode, cst.SimpleString) else ""
                    if isinstance(text, str) and any(ch in text for ch in "wax+"):
                        reason = "writes a file (`open(..., 'w')`)"
                        return
                effect = slicer.effect_of(name)
                if effect is not None:
                    reason = f"calls {name}(), which {effect}"

        node.visit(Finder())
        return reason

    def _skip(self, node: cst.CSTNode, why: str, names: set[str]) -> None:
        line = self.index.line_of(node)
        code = " ".join(self.index.source(node).split())
        if len(code) > 60:
            code = code[:57] + "..."
        self.skipped.append(f"line {line} (`{code}`) {why}, so the audit did not run it; it binds {', '.join(sorted(names))}")

    def _record_imports(self, small: cst.CSTNode) -> None:
        inside_try = any(isinstance(a, cst.Try) for a in self.index.ancestors(small))
        if inside_try:
            return
        if isinstance(small, cst.Import):
            for alias in small.names:
                self.imports.add((dotted(alias.name) or "").split(".")[0])
        elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
            self.imports.add((dotted(small.module) or "").split(".")[0])

    # argparse
    def _args_replacement(self, small: cst.CSTNode) -> dict | None:
        if not isinstance(small, cst.Assign) or not isinstance(small.value, cst.Call):
            return None
        kind = self.index.is_args_call(small.value)
        if kind is None:
            return None
        entries = []
        for dest, option in sorted(self.index.options.items()):
            code = option.default_code
            if option.type_code:
                code = f"({option.type_code})({code})"
            entries.append(f"{dest!r}: (lambda: {code})")
        namespace = "__tcaudit_namespace__({" + ", ".join(entries) + "})"
        value = f"({namespace}, [])" if kind == "known" else namespace
        targets = " = ".join(self.index.source(t.target) for t in small.targets)
        return {"t": "synthetic", "code": f"{targets} = {value}", "line": self.index.line_of(small)}

    # statements
    def slice_smalls(self, smalls: Sequence[cst.CSTNode], needed: set[str], scope_is_module: bool,
                     late: set[str]) -> tuple[list[dict], set[str]]:
        items: list[dict] = []
        for small in reversed(list(smalls)):
            full, mutated, uses = statement_effects(small)
            hit = (full | mutated) & needed
            if "*" in full:
                hit = {"*"}
            if not hit:
                continue
            replacement = self._args_replacement(small)
            if replacement is not None:
                items.insert(0, replacement)
                needed = needed - full
                continue
            why = self.denied(small)
            if why is not None:
                self._skip(small, why, hit)
                continue
            self._record_imports(small)
            items.insert(0, self.index.chunk(small))
            needed = (needed - full) | uses
        return items, needed

    def with_dynamic_lookups(self, uses: set[str]) -> set[str]:
        """Code that looks a class up by name in its own module (``getattr(sys.modules[__name__],
        name)``, ``globals()[name]``) may reach any of the file's model classes: keep them all."""
        if "globals" in uses or "vars" in uses or {"sys", "__name__"} <= uses:
            uses = uses | {name for name in self.index.classes if self.index.is_module_class(name)}
        return uses

    def consider(self, statement: cst.CSTNode, needed: set[str], scope_is_module: bool,
                 late: set[str]) -> tuple[list[dict], set[str]]:
        """Items for a statement before the construction, and what is still needed before it."""
        if isinstance(statement, cst.SimpleStatementLine):
            return self.slice_smalls(statement.body, needed, scope_is_module, late)
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            if statement.name.value not in needed and not self._registers(statement, needed):
                return [], needed
            uses = self.with_dynamic_lookups(used_names(statement))
            if scope_is_module:
                late |= uses  # a function body may use globals bound after it
            return [self.index.chunk(statement)], (needed - {statement.name.value}) | uses
        bound = _bound_anywhere(statement)
        if not bound & needed:
            return [], needed
        if isinstance(statement, cst.If):
            if is_main_guard(statement):
                return [], needed
            body, body_needed = self.slice_prior(_block(statement.body), set(needed), scope_is_module, late)
            orelse_items: list[dict] = []
            orelse_needed = set(needed)
            if isinstance(statement.orelse, cst.If):
                orelse_items, orelse_needed = self.consider(statement.orelse, set(needed), scope_is_module, late)
            elif isinstance(statement.orelse, cst.Else):
                orelse_items, orelse_needed = self.slice_prior(_block(statement.orelse.body), set(needed), scope_is_module, late)
            if not body and not orelse_items:
                return [], needed
            item = {"t": "if", "test": self.index.chunk(statement.test), "body": body, "orelse": orelse_items}
            return [item], body_needed | orelse_needed | used_names(statement.test)
        if isinstance(statement, cst.Try):
            body, total = self.slice_prior(_block(statement.body), set(needed), scope_is_module, late)
            handlers = []
            for handler in statement.handlers:
                handler_items, handler_needed = self.slice_prior(_block(handler.body), set(needed), scope_is_module, late)
                total |= handler_needed
                handlers.append({
                    "type": self.index.chunk(handler.type) if handler.type is not None else None,
                    "name": dotted(handler.name.name) if handler.name is not None else None,
                    "body": handler_items,
                })
                if handler.type is not None:
                    total |= used_names(handler.type)
            if not body and not any(h["body"] for h in handlers):
                return [], needed
            return [{"t": "try", "body": body, "handlers": handlers}], total
        if isinstance(statement, cst.With):
            why = self.denied(statement)
            if why is not None:
                self._skip(statement, why, bound & needed)
                return [], needed
            return [self.index.chunk(statement)], (needed - bound) | used_names(statement)
        if isinstance(statement, (cst.For, cst.While)):
            self._skip(statement, "is a loop", bound & needed)
        return [], needed

    def _registers(self, definition: cst.FunctionDef | cst.ClassDef, needed: set[str]) -> bool:
        """A decorator that adds the definition to a needed registry (``@register_model`` filling the
        ``_MODELS`` dict that ``create_model`` reads)."""
        for decorator in definition.decorators:
            expr = decorator.decorator
            name = dotted(expr.func if isinstance(expr, cst.Call) else expr)
            for info in self.index.functions.get(name or "", []):
                if info.owner is None and _mutated_globals(info.node) & needed:
                    return True
        return False

    def slice_prior(self, statements: Sequence[cst.CSTNode], needed: set[str], scope_is_module: bool,
                    late: set[str]) -> tuple[list[dict], set[str]]:
        items: list[dict] = []
        for statement in reversed(list(statements)):
            new_items, needed = self.consider(statement, needed, scope_is_module, late)
            items = new_items + items
        return items, needed

    def slice_block(self, statements: Sequence[cst.CSTNode], path: list[cst.CSTNode], needed: set[str],
                    scope_is_module: bool, late: set[str]) -> tuple[list[dict], set[str]]:
        """Items for a block up to the statement on ``path`` (the construction or the call leading to it)."""
        if not path:
            return self.slice_prior(statements, needed, scope_is_module, late)
        head = path[0]
        position = list(statements).index(head)
        if isinstance(head, cst.SimpleStatementLine):
            target = path[1]
            smalls = list(head.body)
            tail, needed = self.slice_smalls(smalls[: smalls.index(target)], needed, scope_is_module, late)
        else:
            tail, needed = self.slice_on_path(head, path[1:], needed, scope_is_module, late)
        prior, needed = self.slice_prior(statements[:position], needed, scope_is_module, late)
        return prior + tail, needed

    def slice_on_path(self, statement: cst.CSTNode, rest: list[cst.CSTNode], needed: set[str],
                      scope_is_module: bool, late: set[str]) -> tuple[list[dict], set[str]]:
        nxt = rest[0]
        if isinstance(statement, cst.If):
            in_body = nxt in _block(statement.body)
            if in_body:
                block = _block(statement.body)
            elif isinstance(statement.orelse, cst.If):
                block = [statement.orelse]
            else:
                block = _block(statement.orelse.body) if statement.orelse is not None else []
            items, needed = self.slice_block(block, rest, needed, scope_is_module, late)
            if is_main_guard(statement):
                return items, needed
            guard = {"t": "guard", "test": self.index.chunk(statement.test), "expect": in_body,
                     "line": self.index.line_of(statement.test)}
            return [guard] + items, needed | used_names(statement.test)
        blocks: list[Sequence[cst.CSTNode]] = []
        if isinstance(statement, (cst.With, cst.For, cst.While)):
            blocks.append(_block(statement.body))
            if getattr(statement, "orelse", None) is not None:
                blocks.append(_block(statement.orelse.body))
        elif isinstance(statement, cst.Try):
            blocks.append(_block(statement.body))
            blocks.extend(_block(h.body) for h in statement.handlers)
            if statement.orelse is not None:
                blocks.append(_block(statement.orelse.body))
            if statement.finalbody is not None:
                blocks.append(_block(statement.finalbody.body))
        for block in blocks:
            if nxt in block:
                return self.slice_block(block, rest, needed, scope_is_module, late)
        raise SliceError(f"the model is built inside a `{type(statement).__name__.lower()}` header the audit cannot follow")

    # scopes
    def path_to(self, node: cst.CSTNode, scope: cst.CSTNode) -> list[cst.CSTNode]:
        """Statements from the scope's body down to ``node`` (a small statement), outermost first."""
        chain: list[cst.CSTNode] = [node]
        for parent in self.index.ancestors(node):
            if parent is scope:
                break
            if isinstance(parent, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                if isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
                    raise SliceError(f"the model is built inside `{parent.name.value}`, which the audit cannot follow")
                chain.append(parent)
        return list(reversed(chain))

    def slice_scope(self, scope: cst.CSTNode, target: cst.CSTNode | None, needed: set[str],
                    late: set[str]) -> tuple[list[dict], set[str]]:
        is_module = isinstance(scope, cst.Module)
        body = scope.body if is_module else _block(scope.body)
        path = self.path_to(target, scope) if target is not None else []
        return self.slice_block(body, path, needed, is_module, late)

    def slice_module(self, target: cst.CSTNode | None, needed: set[str]) -> list[dict]:
        """Module level, iterated until the globals used by the kept defs are all bound."""
        module = self.index.module
        wanted = set(needed)
        scope_skipped, scope_imports = list(self.skipped), set(self.imports)
        for _ in range(6):
            late: set[str] = set()
            self.skipped, self.imports = list(scope_skipped), set(scope_imports)
            items, _ = self.slice_scope(module, target, set(wanted), late)
            if late <= wanted:
                return items
            wanted |= late
        return items

    # call sites
    def call_sites(self, function: cst.FunctionDef) -> list[tuple[cst.Call, str]]:
        """Calls of ``function`` in this file, with how ``self`` is passed ("" for plain functions)."""
        owner = self.index.owner_class(function)
        name = function.name.value
        sites = []
        for call in self.index.calls:
            if any(a is function for a in self.index.ancestors(call)):
                continue
            callee = dotted(call.func)
            if owner is None and callee == name:
                sites.append((call, ""))
            elif owner is not None and name == "__init__" and callee == owner.name.value:
                sites.append((call, "__tcaudit_self__()"))
            elif owner is not None and callee == f"self.{name}" and any(a is owner for a in self.index.ancestors(call)):
                sites.append((call, "self"))
        sites.sort(key=lambda cs: self.index.line_of(cs[0]))
        return sites

    def binding(self, function: cst.FunctionDef, call: cst.Call | None, self_arg: str) -> list[dict]:
        self.counter += 1
        name = f"__tcaudit_bind_{self.counter}"
        params = self.index.source(function.params).strip()
        definition = f"def {name}({params}):\n    return dict(locals())"
        args = [self.index.source(arg).strip().rstrip(",") for arg in (call.args if call is not None else [])]
        if self_arg:
            args.insert(0, self_arg)
        line = self.index.line_of(call) if call is not None else self.index.line_of(function)
        return [
            {"t": "synthetic", "code": definition, "line": self.index.line_of(function)},
            {"t": "synthetic", "code": f"globals().update({name}({', '.join(args)}))", "line": line},
        ]

    def plan(self, candidate: Candidate) -> Plan:
        index = self.index
        call = candidate.call
        target = index.statement_of(call)
        if isinstance(target, cst.BaseCompoundStatement):
            raise SliceError("the model is built in a compound statement's header, which the audit cannot follow")
        model_item = index.chunk(call, "model")
        if candidate.kind in {"torchvision", "create_model", "imported", "factory", "external"}:
            model_item["drop_keywords"] = sorted(WEIGHT_KEYWORDS)
        if candidate.kind == "hf_pretrained":
            model_item["from_config"] = True
        needed = self.with_dynamic_lookups(used_names(call))
        cast_items = []
        for cast in candidate.casts:
            code = module_method_cast(cast)
            cast_items.append({"t": "synthetic", "code": f"{MODEL_VAR} = {code}", "line": index.line_of(call)})
            needed |= used_names(cst.parse_expression(code)) - {MODEL_VAR, MODULE_METHOD}

        scopes: list[list[dict]] = []  # innermost first
        global_needs: set[str] = set()
        scope: cst.CSTNode = index.enclosing_function(call) or index.module
        depth = 0
        module_target: cst.CSTNode | None = None
        while True:
            if isinstance(scope, cst.Module):
                module_target = target
                break
            late: set[str] = set()
            items, residual = self.slice_scope(scope, target, needed, late)
            params = set(param_names(scope))
            defaults = _params_with_defaults(scope)
            to_bind = {n.split(".")[0] for n in residual} & params
            global_needs |= {n for n in residual | late if n.split(".")[0] not in params}
            global_needs |= used_names(scope.params)
            if not to_bind:
                scopes.append(items)
                break
            sites = self.call_sites(scope)
            if not sites or depth >= MAX_CALL_DEPTH:
                missing = sorted(to_bind - defaults)
                if missing:
                    where = f"{scope.name.value}()"
                    raise SliceError(
                        f"the model is built inside {where} from its parameter{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing)}, and no call of {where} in this file says what "
                        f"{'they are' if len(missing) > 1 else 'it is'}"
                    )
                scopes.append(self.binding(scope, None, "") + items)
                break
            site, self_arg = sites[0]
            uncovered = _uncovered_params(scope, site, to_bind, bool(self_arg))
            if uncovered:
                raise SliceError(
                    f"the model is built inside {scope.name.value}() from "
                    f"{', '.join(uncovered)}, which the call at line {index.line_of(site)} does not pass "
                    f"(a framework that calls {scope.name.value}() supplies it; give the model with "
                    f"[[tool.tcaudit.models]] instead)"
                )
            scopes.append(self.binding(scope, site, self_arg) + items)
            needed = set()
            for arg in site.args:
                needed |= used_names(arg.value)
            if self_arg == "self":
                # self.method(): the caller's `self` is the callee's, with the attributes it reads
                needed.add("self")
                needed |= {name for name in residual if name.startswith("self.")}
            target = index.statement_of(site)
            if isinstance(target, cst.BaseCompoundStatement):
                raise SliceError(f"{scope.name.value}() is called in a compound statement's header")
            scope = index.enclosing_function(site) or index.module
            depth += 1

        module_needed = global_needs | (needed if module_target is not None else set())
        module_items = self.slice_module(module_target, module_needed)
        program = list(module_items)
        for items in reversed(scopes):
            program.extend(items)
        program.append(model_item)
        program.extend(cast_items)
        (line, column), (end_line, end_column) = index.span(call)
        construction = {"line": line, "column": column + 1, "end_line": end_line, "end_column": end_column + 1}
        return Plan(program, construction, list(self.skipped), set(self.imports))


def module_method_cast(cast: str) -> str:
    """A cast the script applies to the model (``.to(torch.bfloat16)``) as a call of nn.Module's own
    method (``__tcaudit_module_method__(__tcaudit_model__, "to", torch.bfloat16)``): the slice never
    calls a method the user's class may have overridden."""
    call = cst.parse_expression(f"{MODEL_VAR}{cast}")
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
        raise SliceError(f"the model's cast `{cast}` is not a method call")
    module = cst.Module([])
    args = [f'"{call.func.attr.value}"', *(module.code_for_node(arg).strip().rstrip(",") for arg in call.args)]
    return f"{MODULE_METHOD}({MODEL_VAR}, {', '.join(args)})"


def _uncovered_params(function: cst.FunctionDef, call: cst.Call, wanted: set[str], self_passed: bool) -> list[str]:
    """Needed parameters without a default that the call visibly does not pass."""
    if any(arg.star for arg in call.args):
        return []  # *args / **kwargs may pass anything
    params = function.params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    given = len([a for a in call.args if a.keyword is None]) + (1 if self_passed else 0)
    passed = set(positional[:given]) | {a.keyword.value for a in call.args if a.keyword is not None}
    defaults = _params_with_defaults(function)
    return sorted(name for name in wanted if name not in passed and name not in defaults)


def _params_with_defaults(function: cst.FunctionDef) -> set[str]:
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.default is not None}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names


def missing_packages(imports: set[str], index: ScriptIndex) -> list[str]:
    """Top-level packages the slice imports that are not installed (and are not the user's own)."""
    missing = []
    for name in sorted(imports):
        if not name or name == "__future__":
            continue
        if index.local_module_file(name) is not None:
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing
