"""Find the models a script builds, statically, with LibCST.

:class:`ScriptIndex` records what the slicer and the hint finder need from one file: imports and
their aliases, classes and which of them are ``nn.Module`` subclasses, functions and their call
sites, argparse options, parent links and positions. :func:`find_candidates` then lists the model
constructions: a local ``nn.Module`` subclass instantiated outside model code, a torchvision factory
(``models.resnet50(...)``, ``get_model``, ``models.__dict__[args.arch]()``), a ``create_model(...)``
call (timm or a local registry), an ``nn.Sequential`` or a lone ``torch.nn`` layer that is the model,
or a class imported from the user's own modules (``from model import GPT``). What the optimizers train
(:func:`trained_models`) decides which functions are called to build a model: only one whose return
value an optimizer trains, and whose body neither trains, evaluates nor writes files
(:func:`function_effect`); a variable's name never makes a call a construction (issue 46).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from tcaudit.project.frameworks import hf_trainer_calls
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.trained_models import TrainedModelFacts
from tcaudit.source.parsing import SourceFile
from tcaudit.source.syntax import evaluated_value, full_name

MODULE_BASES = {
    "torch.nn.Module",
    "torch.nn.modules.module.Module",
    "torch.nn.Sequential",
    "torch.nn.ModuleList",
    "torch.nn.ModuleDict",
    "pytorch_lightning.LightningModule",
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.LightningModule",
}
# torch.nn layers that a script may train on their own as its whole model.
BUILTIN_LAYERS = {
    f"torch.nn.{name}"
    for name in ("Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                 "ConvTranspose3d", "LSTM", "GRU", "RNN", "MultiheadAttention", "Transformer",
                 "TransformerEncoder", "TransformerDecoder")
}
MODEL_NAME = re.compile(
    r"^(self\.)?(model|net|network|module|generator|discriminator|encoder|decoder|backbone|classifier|"
    r"\w*_model|model_\w*|\w*_net|net_\w*|\w*Net|[a-z]*net|g|d|netG|netD|gen|disc|G|D|student|teacher|actor|critic)$"
)
FACTORY_FUNCTION = re.compile(r"^(get|build|create|make|init|load|setup)_?(model|network|net|arch)\w*$", re.IGNORECASE)


_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


_LIBRARY_ROOTS = {
    "__future__", "abc", "collections", "contextlib", "dataclasses", "enum", "functools", "importlib", "inspect",
    "itertools", "logging", "math", "operator", "os", "pathlib", "re", "sys", "types", "typing", "warnings",
    "weakref",
}


_ENTRY_FRAMEWORKS = {"hydra", "click", "typer", "fire", "absl", "jsonargparse", "tyro"}


def runs_code_of_its_own(text: str) -> bool:
    """A cheap gate with Python's ``ast`` (a fraction of a LibCST parse): does the file do anything
    when it runs, beyond defining things? A library or model-zoo module that only defines classes and
    functions builds no model by itself, so LibCST discovery is skipped for it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    local: set[str] = set()
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local.add(node.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                # a relative import is a package's own machinery, not a script's doing
                imported[alias.asname or alias.name] = "." if node.level else (node.module or "").split(".")[0]

    def root(expr: ast.AST) -> str | None:
        while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
            expr = expr.value if not isinstance(expr, ast.Call) else expr.func
        return expr.id if isinstance(expr, ast.Name) else None

    def active(name: str | None) -> bool:
        if name in local:
            return True
        return name in imported and imported[name] not in _LIBRARY_ROOTS and imported[name] != "."

    def runs(statements: list[ast.stmt]) -> bool:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef)):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # @hydra.main, @click.command: the framework runs it
                if any(imported.get(root(d) or "") in _ENTRY_FRAMEWORKS for d in node.decorator_list):
                    return True
                continue
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                return True
            if isinstance(node, (ast.If, ast.Try)):
                handlers = [h.body for h in getattr(node, "handlers", [])]
                if any(runs(block) for block in (node.body, node.orelse, *handlers)):
                    return True
                continue
            if any(isinstance(call, ast.Call) and active(root(call.func)) for call in ast.walk(node)):
                return True
        return False

    return runs(tree.body)


def dotted(node: cst.CSTNode | None) -> str | None:
    if node is None:
        return None
    try:
        return full_name(node)
    except Exception:  # noqa: BLE001 - exotic expressions have no dotted name
        return None


class _Parents(cst.CSTVisitor):
    def __init__(self) -> None:
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parent[node] = self.stack[-1]
        self.stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.stack.pop()


@dataclass
class ArgOption:
    dest: str
    default: cst.BaseExpression | None  # None: argparse's own default for the action
    default_code: str  # Python source for the default value
    type_code: str | None
    line: int


@dataclass
class ClassInfo:
    node: cst.ClassDef
    name: str
    bases: list[str]
    parent_class: cst.ClassDef | None


@dataclass
class FunctionInfo:
    node: cst.FunctionDef
    name: str
    owner: cst.ClassDef | None  # a method's class


class ScriptIndex:
    """Facts about one file that model discovery and slicing share; built once per file."""

    def __init__(self, module: cst.Module, text: str, path: Path) -> None:
        self.module = module
        self.text = text
        self.lines = _LINES.findall(text)
        self.path = path
        self._positions = None  # resolved on first use: most files never need them
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self.imports: dict[str, str] = {}  # local name → qualified name
        self.import_nodes: list[cst.CSTNode] = []
        self.star_imports: list[str] = []
        self.classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, list[FunctionInfo]] = {}
        self.calls: list[cst.Call] = []
        self.options: dict[str, ArgOption] = {}
        self._trained: TrainedModels | None = None  # what the optimizers train (trained_models), on first use
        self._collect()

    @functools.cached_property
    def script_facts(self) -> ScriptFacts:
        """The script rules' facts of this very tree (their nodes are the index's): what the
        optimizers train, and the project model's values."""
        source = SourceFile(self.path, self.path.name, self.text.encode("utf-8", "replace"), self.text,
                            "utf-8").with_module(self.module)
        return ScriptFacts(source)

    # -- positions and source ------------------------------------------------------------
    def position(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:
            self._positions = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        return self._positions[node]

    def span(self, node: cst.CSTNode) -> tuple[tuple[int, int], tuple[int, int]]:
        """(line, column) of a node's start and end; a decorated def starts at its first decorator."""
        pos = self.position(node)
        start = (pos.start.line, pos.start.column)
        decorators = getattr(node, "decorators", None)
        if decorators:
            first = self.position(decorators[0]).start
            start = (first.line, first.column)
        return start, (pos.end.line, pos.end.column)

    def source(self, node: cst.CSTNode) -> str:
        """The exact source text of a node (from its start to its end position)."""
        (start_line, start_column), (end_line, end_column) = self.span(node)
        if start_line == end_line:
            return self.lines[start_line - 1][start_column:end_column]
        parts = [self.lines[start_line - 1][start_column:]]
        parts.extend(self.lines[start_line:end_line - 1])
        parts.append(self.lines[end_line - 1][:end_column])
        return "".join(parts)

    def prefix(self, node: cst.CSTNode) -> str:
        """What precedes the node on its first line, with everything but tabs turned into spaces."""
        (line, column), _ = self.span(node)
        head = self.lines[line - 1][:column]
        return "".join(ch if ch in " \t" else " " for ch in head)

    def chunk(self, node: cst.CSTNode, kind: str = "stmt") -> dict:
        """A piece of the user's code with its exact position, for the child to compile in place."""
        (line, column), _ = self.span(node)
        return {"t": kind, "code": self.source(node), "line": line, "column": column, "prefix": self.prefix(node)}

    def line_of(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    # -- structure -----------------------------------------------------------------------
    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent.get(node)
        while current is not None:
            yield current
            current = self.parent.get(current)

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for parent in self.ancestors(node):
            if isinstance(parent, cst.FunctionDef):
                return parent
        return None

    def owner_class(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        parent = self.parent.get(function)
        while parent is not None and not isinstance(parent, (cst.ClassDef, cst.FunctionDef, cst.Module)):
            parent = self.parent.get(parent)
        return parent if isinstance(parent, cst.ClassDef) else None

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost statement containing the node (a small statement inside a line)."""
        current: cst.CSTNode = node
        while True:
            if isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return current
            parent = self.parent.get(current)
            if parent is None:
                return current
            current = parent

    # -- names ---------------------------------------------------------------------------
    def resolve(self, name: str | None) -> str | None:
        """Qualified name of a dotted name through this file's imports (``nn.Linear`` → ``torch.nn.Linear``);
        None when its first part is not imported (a local definition, a builtin), as
        ``ScriptFacts.resolve`` answers."""
        if not name:
            return None
        head, _, rest = name.partition(".")
        if head in self.imports:
            base = self.imports[head]
            return f"{base}.{rest}" if rest else base
        return None

    def is_module_class(self, name: str) -> bool:
        return _is_module_class(self.classes, self.imports, self.path.parent, self.path, name, 0)

    def local_module_file(self, qualified: str) -> Path | None:
        """The user's file a qualified import points to (``model.GPT`` → ``<dir>/model.py``)."""
        return _local_file(self.path.parent, qualified)

    def is_local_import(self, name: str) -> bool:
        head = name.split(".")[0]
        qualified = self.imports.get(head)
        if qualified is None:
            return False
        root = qualified.split(".")[0]
        if root in {"torch", "torchvision", "timm", "numpy", "transformers"}:
            return False
        return self.local_module_file(qualified) is not None

    # -- collection ----------------------------------------------------------------------
    def _collect(self) -> None:
        index = self

        class Collector(_Parents):
            """One pass: parent links, classes, functions, imports and calls."""

            def __init__(self) -> None:
                super().__init__()
                self.class_stack: list[cst.ClassDef] = []

            def visit_ClassDef(self, node: cst.ClassDef) -> None:
                bases = [dotted(arg.value) or "" for arg in node.bases if arg.keyword is None]
                index.classes.setdefault(
                    node.name.value,
                    ClassInfo(node, node.name.value, bases, self.class_stack[-1] if self.class_stack else None),
                )
                self.class_stack.append(node)

            def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
                self.class_stack.pop()

            def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
                index.functions.setdefault(node.name.value, []).append(FunctionInfo(node, node.name.value, None))

            def visit_Import(self, node: cst.Import) -> None:
                index.import_nodes.append(node)
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    if alias.asname is not None:
                        index.imports[dotted(alias.asname.name) or name] = name
                    else:
                        index.imports.setdefault(name.split(".")[0], name.split(".")[0])

            def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
                index.import_nodes.append(node)
                base = dotted(node.module) if node.module is not None else ""
                if node.relative:
                    base = "." * len(node.relative) + (base or "")
                if isinstance(node.names, cst.ImportStar):
                    index.star_imports.append(base or "")
                    return
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    local = dotted(alias.asname.name) if alias.asname is not None else name
                    index.imports[local or name] = f"{base}.{name}" if base else name

            def visit_Call(self, node: cst.Call) -> None:
                index.calls.append(node)

        collector = Collector()
        self.module.visit(collector)
        self.parent = collector.parent
        for infos in self.functions.values():
            for info in infos:
                info.owner = self.owner_class(info.node)
        for base in self.star_imports:  # from models import *  (kuangliu's CIFAR layout)
            for name, qualified in star_exports(self.path.parent, self.path, base).items():
                if name not in self.classes and name not in self.functions:
                    self.imports.setdefault(name, qualified)
        self._collect_options()

    def _collect_options(self) -> None:
        for call in self.calls:
            name = dotted(call.func) or ""
            if name.endswith(".add_argument"):
                option = _argparse_option(self, call)
                if option is not None:
                    self.options.setdefault(option.dest, option)
            elif name.endswith(".set_defaults"):
                for arg in call.args:
                    if arg.keyword is not None:
                        self.options[arg.keyword.value] = ArgOption(
                            arg.keyword.value, arg.value, self.source(arg.value), None, self.line_of(call)
                        )

    def is_args_call(self, call: cst.Call) -> str | None:
        """``parser.parse_args()`` → "args"; ``parse_known_args()`` → "known"; a local function that
        returns the parsed namespace (``get_args()``) → "args"."""
        name = dotted(call.func) or ""
        if name.endswith(".parse_args"):
            return "args"
        if name.endswith(".parse_known_args"):
            return "known"
        if name in self.functions and "." not in name:
            for info in self.functions[name]:
                if info.owner is None and _returns_parsed_args(info.node):
                    return "args"
        return None


def _returns_parsed_args(function: cst.FunctionDef) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            if (dotted(node.func) or "").endswith((".parse_args", ".parse_known_args")):
                found = True

    function.visit(Finder())
    return found


def _string_value(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            return evaluated_value(node) if isinstance(evaluated_value(node), str) else None
        except Exception:  # noqa: BLE001
            return None
    return None


def _argparse_option(index: ScriptIndex, call: cst.Call) -> ArgOption | None:
    flags = [s for s in (_string_value(a.value) for a in call.args if a.keyword is None) if s]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    dest = _string_value(keywords.get("dest"))
    if dest is None:
        longs = [f for f in flags if f.startswith("--")]
        shorts = [f for f in flags if f.startswith("-") and not f.startswith("--")]
        positional = [f for f in flags if not f.startswith("-")]
        chosen = (longs or shorts or positional or [None])[0]
        if chosen is None:
            return None
        dest = chosen.lstrip("-").replace("-", "_")
    action = _string_value(keywords.get("action"))
    default = keywords.get("default")
    if default is not None:
        code = index.source(default)
    elif action == "store_true":
        code = "False"
    elif action == "store_false":
        code = "True"
    elif action == "count":
        code = "None"
    else:
        code = "None"
    type_node = keywords.get("type")
    type_code = index.source(type_node) if type_node is not None else None
    if type_code is not None and not isinstance(default, cst.SimpleString):
        type_code = None  # argparse applies `type` to string defaults only
    return ArgOption(dest, default, code, type_code, index.line_of(call))


@dataclass
class _Foreign:
    """Classes, imports, functions and star imports of one of the user's other modules."""

    classes: dict[str, ClassInfo]
    imports: dict[str, str]  # local name → qualified name; relative ones keep their leading dots
    functions: dict[str, cst.FunctionDef]
    stars: list[str]


@functools.lru_cache(maxsize=128)
def _foreign_module(path: str) -> _Foreign | None:
    try:
        tree = cst.parse_module(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError):
        return None
    found = _Foreign({}, {}, {}, [])
    for statement in tree.body:
        if isinstance(statement, cst.ClassDef):
            bases = [dotted(a.value) or "" for a in statement.bases if a.keyword is None]
            found.classes[statement.name.value] = ClassInfo(statement, statement.name.value, bases, None)
        elif isinstance(statement, cst.FunctionDef):
            found.functions[statement.name.value] = statement
        for small in _small_statements(statement):
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = dotted(alias.name) or ""
                    if alias.asname is not None:
                        found.imports[dotted(alias.asname.name) or full] = full
                    else:
                        found.imports.setdefault(full.split(".")[0], full.split(".")[0])
            elif isinstance(small, cst.ImportFrom):
                base = "." * len(small.relative) + (dotted(small.module) or "" if small.module is not None else "")
                if isinstance(small.names, cst.ImportStar):
                    found.stars.append(base)
                    continue
                for alias in small.names:
                    item = dotted(alias.name) or ""
                    local = dotted(alias.asname.name) if alias.asname is not None else item
                    found.imports[local or item] = f"{base}.{item}" if base and not base.endswith(".") else base + item
    return found


def _resolve(imports: dict[str, str], name: str) -> str:
    head, _, rest = name.partition(".")
    if head in imports:
        return f"{imports[head]}.{rest}" if rest else imports[head]
    return name


def _local_file(base: Path, qualified: str) -> Path | None:
    parts = [p for p in qualified.split(".") if p]
    for cut in range(len(parts), 0, -1):
        rel = Path(*parts[:cut])
        for candidate in (base / f"{rel}.py", base / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _module_file(root: Path, importer: Path, qualified: str) -> Path | None:
    """The user's file for an import in ``importer``: relative (``.resnet``) to the importer's package,
    absolute (``models.resnet``) to the script's folder ``root``."""
    level = len(qualified) - len(qualified.lstrip("."))
    if level == 0:
        return _local_file(root, qualified)
    base = importer.parent
    for _ in range(level - 1):
        base = base.parent
    rest = qualified[level:]
    if not rest:
        init = base / "__init__.py"
        return init if init.is_file() else None
    return _local_file(base, rest)


def _is_module_class(classes: dict[str, ClassInfo], imports: dict[str, str], root: Path, importer: Path,
                     name: str, depth: int) -> bool:
    """Whether a class (local, or imported from the user's own modules) derives from nn.Module."""
    if depth > 6:
        return False
    info = classes.get(name)
    if info is None:
        return False
    for base in info.bases:
        qualified = _resolve(imports, base)
        if qualified in MODULE_BASES or qualified.endswith(("LightningModule", "nn.Module")):
            return True
        if base in classes and base != name and _is_module_class(classes, imports, root, importer, base, depth + 1):
            return True
        if _symbol_kind(imports, root, importer, base, depth + 1) == "module":
            return True
    return False


def _kind_in_file(file: Path, root: Path, symbol: str, depth: int) -> str | None:
    """What ``symbol`` is in one of the user's files, following its star imports."""
    parsed = _foreign_module(str(file))
    if parsed is None or depth > 6:
        return None
    if symbol in parsed.classes:
        return "module" if _is_module_class(parsed.classes, parsed.imports, root, file, symbol, depth + 1) else "class"
    if symbol in parsed.functions:
        return "function"
    if symbol in parsed.imports:
        return _symbol_kind(parsed.imports, root, file, symbol, depth + 1)
    for star in parsed.stars:
        target = _module_file(root, file, star)
        if target is not None and target != file:
            kind = _kind_in_file(target, root, symbol, depth + 1)
            if kind is not None:
                return kind
    return None


def _symbol_kind(imports: dict[str, str], root: Path, importer: Path, name: str, depth: int) -> str | None:
    head = name.split(".")[0]
    qualified = imports.get(head)
    if qualified is None or depth > 6:
        return None
    if qualified.lstrip(".").split(".")[0] in {"torch", "torchvision", "timm", "numpy", "transformers"}:
        return None
    file = _module_file(root, importer, qualified)
    if file is None:
        return None
    symbol = name.split(".")[-1] if "." in name else qualified.split(".")[-1]
    return _kind_in_file(file, root, symbol, depth)


def star_exports(root: Path, importer: Path, base: str, depth: int = 0) -> dict[str, str]:
    """Names a ``from base import *`` of the user's own module brings in, with their qualified names."""
    file = _module_file(root, importer, base)
    parsed = _foreign_module(str(file)) if file is not None else None
    if parsed is None or depth > 4:
        return {}
    names = {name: f"{base}.{name}" for name in (*parsed.classes, *parsed.functions) if not name.startswith("_")}
    for star in parsed.stars:
        target = _module_file(root, file, star)
        if target is not None and target != file:
            for name in star_exports(root, file, star, depth + 1):
                names.setdefault(name, f"{base}.{name}")
    return names


def local_function_node(index: ScriptIndex, name: str) -> cst.FunctionDef | None:
    """The definition of a function imported from the user's own modules (``from models import
    build_model``, through the package's re-exports and star imports); None where it is not found."""
    return _function_in(index.imports, index.path.parent, index.path, name, 0)


def _function_in(imports: dict[str, str], root: Path, importer: Path, name: str, depth: int) -> cst.FunctionDef | None:
    qualified = imports.get(name.split(".")[0])
    file = _module_file(root, importer, qualified) if qualified is not None and depth <= 6 else None
    parsed = _foreign_module(str(file)) if file is not None else None
    if parsed is None:
        return None
    symbol = name.split(".")[-1] if "." in name else qualified.split(".")[-1]
    if symbol in parsed.functions:
        return parsed.functions[symbol]
    if symbol in parsed.imports:
        return _function_in(parsed.imports, root, file, symbol, depth + 1)
    for star in parsed.stars:
        target = _module_file(root, file, star)
        found = _foreign_module(str(target)) if target is not None and target != file else None
        if found is not None and symbol in found.functions:
            return found.functions[symbol]
    return None


def local_symbol_kind(index: ScriptIndex, name: str) -> str | None:
    """What an imported name is in the user's own module: "module" (an nn.Module subclass),
    "class", "function", or None when it is not the user's or cannot be read."""
    return _symbol_kind(index.imports, index.path.parent, index.path, name, 0)


# -- what a function of the script does ----------------------------------------------------------

# Calls that train, step, evaluate or write: a function that makes one is never called to build a model.
_EFFECT_METHODS = {
    "backward": "trains", "zero_grad": "trains", "step": "steps an optimizer", "fit": "trains",
    "eval": "evaluates a model", "save": "writes files", "save_pretrained": "writes files",
    "save_checkpoint": "writes files", "savefig": "writes files", "to_csv": "writes files",
    "write_text": "writes files", "write_bytes": "writes files", "mkdir": "writes files", "unlink": "deletes files",
}
_EFFECT_CALLS = {
    "torch.save": "writes files", "torch.jit.save": "writes files", "numpy.save": "writes files",
    "numpy.savez": "writes files", "numpy.savetxt": "writes files", "pickle.dump": "writes files",
    "json.dump": "writes files", "yaml.dump": "writes files", "os.makedirs": "writes files",
    "os.mkdir": "writes files", "os.remove": "deletes files", "os.unlink": "deletes files",
    "os.rename": "moves files", "os.replace": "moves files", "os.system": "runs a shell command",
}
_EFFECT_PREFIXES = {"shutil.": "changes files", "subprocess.": "runs a process", "requests.": "uses the network",
                    "urllib.": "uses the network", "wandb.": "talks to an experiment tracker"}
_LOADER = re.compile(r"loader", re.IGNORECASE)


def function_effect(index: ScriptIndex, function: cst.FunctionDef, depth: int = 0,
                    seen: frozenset = frozenset()) -> str | None:
    """What a function of the script does beyond building something, read statically: it trains
    (``.backward()``, ``optimizer.step()``, ``.zero_grad()``, ``.fit()``), evaluates (``.eval()``),
    loops over a data loader, writes files (``torch.save``, ``open(..., "w")``, ``.savefig``), runs
    processes or uses the network, itself or through a function of this file it calls. The first such
    thing, in words with its code (``trains (`loss.backward()`)``); None for a function that only builds."""
    found: list[str] = []
    local = function in {info.node for infos in index.functions.values() for info in infos}

    def say(effect: str, node: cst.CSTNode) -> None:
        if not found:
            code = " ".join(cst.Module([]).code_for_node(node).split())
            code = code if len(code) <= 50 else code[:47] + "..."
            where = f" at line {index.line_of(node)}" if local else ""
            found.append(f"{effect} (`{code}`{where})")

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            name = dotted(call.func) or ""
            qualified = index.resolve(name) or name
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in _EFFECT_METHODS:
                say(_EFFECT_METHODS[call.func.attr.value], call)
            elif qualified in _EFFECT_CALLS:
                say(_EFFECT_CALLS[qualified], call)
            elif any(qualified.startswith(prefix) for prefix in _EFFECT_PREFIXES):
                say(next(why for prefix, why in _EFFECT_PREFIXES.items() if qualified.startswith(prefix)), call)
            elif name == "open" and _writes(call):
                say("writes files", call)
            elif local and name in index.functions and depth < 3 and name not in seen:
                for info in index.functions[name]:
                    effect = function_effect(index, info.node, depth + 1, seen | {function.name.value}) \
                        if info.owner is None else None
                    if effect is not None:
                        say(f"calls {name}(), which {effect}", call)

        def visit_For(self, loop: cst.For) -> None:
            if _LOADER.search(cst.Module([]).code_for_node(loop.iter)):
                say("loops over a data loader", loop.iter)

    function.body.visit(Finder())
    return found[0] if found else None


def _writes(call: cst.Call) -> bool:
    """``open(path, "w")`` (or "a", "x", "+"; positional or ``mode=``)."""
    mode = next((a.value for a in call.args[1:2] if a.keyword is None), None)
    mode = mode or next((a.value for a in call.args if a.keyword and a.keyword.value == "mode"), None)
    text = _string_value(mode) or ""
    return any(ch in text for ch in "wax+")


@dataclass
class TrainedModels:
    """What the script's optimizers train (``SGD(model.parameters())``, a param-group list, a
    ``filter(...)`` of the parameters), followed back to the calls that build it
    (:meth:`tcaudit.script.trained_models.TrainedModelFacts.construction_paths`)."""

    optimizer_visible: bool  # a torch.optim optimizer receives some model's parameters
    paths: list[tuple[cst.Call, tuple[cst.Call, ...]]]  # (construction, calls of local functions it is returned by)

    @functools.cached_property
    def calls(self) -> set[int]:
        """Every call a trained model's value comes from: its constructions and the factory calls."""
        return {id(call) for construction, through in self.paths for call in (construction, *through)}

    @functools.cached_property
    def direct(self) -> set[int]:
        """The constructions a trained model is assigned from where it is trained, not through a
        function of the script (whose call is the construction then: :attr:`factories`)."""
        return {id(construction) for construction, through in self.paths if not through}

    @functools.cached_property
    def factories(self) -> set[int]:
        """Calls of this file's functions that return a trained model: the innermost of each chain."""
        return {id(through[-1]) for _, through in self.paths if through}


def trained_models(index: ScriptIndex) -> TrainedModels:
    """The models the script trains; the script facts read from this index's own tree, so that their
    nodes are the index's."""
    cached = index._trained
    if cached is None:
        models = TrainedModelFacts(index.script_facts)
        paths = []
        for name in models.optimized_model_names:
            for binding in models.facts.bindings_of(name):
                if _in_class_body(index, binding.value):
                    continue  # a config class's field of that name (``model: ModelConfig = field(...)``)
                paths.extend(models.construction_paths(binding.value))
        # A Hugging Face Trainer builds the optimizer itself: what it trains is its ``model=`` argument.
        for trainer in hf_trainer_calls(models.facts):
            given = trainer.arg("model", 0)
            if given is not None:
                paths.extend(models.construction_paths(given))
        cached = index._trained = TrainedModels(bool(models.optimized_model_names), paths)
    return cached


def _in_class_body(index: ScriptIndex, node: cst.CSTNode) -> bool:
    for parent in index.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.Lambda)):
            return False
        if isinstance(parent, cst.ClassDef):
            return True
    return False


# -- candidates ---------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One model construction in the script."""

    call: cst.Call  # the expression that builds the model
    kind: str  # class | torchvision | create_model | sequential | imported | factory | hf_pretrained
    label: str  # what to call it in messages: "GPT(gptconf)"
    target_name: str | None  # the variable it is assigned to, if any
    casts: list[str] = field(default_factory=list)  # dtype casts applied to it: ".half()", ".to(torch.bfloat16)"
    refused: str | None = None  # why the audit does not run it (a function that trains, one no optimizer's)


_DTYPE_METHODS = {"half", "bfloat16", "double", "float"}
_DTYPE_NAMES = re.compile(r"\b(float16|half|bfloat16|float64|double|float32)\b")


def _inside_model_code(index: ScriptIndex, node: cst.CSTNode) -> bool:
    """True inside an nn.Module subclass's body (submodules, forward): not a model construction."""
    for parent in index.ancestors(node):
        if isinstance(parent, cst.ClassDef) and index.is_module_class(parent.name.value):
            return True
    return False


def _assigned_name(index: ScriptIndex, node: cst.CSTNode) -> str | None:
    statement = index.statement_of(node)
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        return dotted(statement.targets[0].target)
    if isinstance(statement, cst.AnnAssign):
        return dotted(statement.target)
    return None


def _passes_name(call: cst.Call, name: str) -> bool:
    """Whether an argument mentions ``name``: ``model = prepare(model)`` transforms a model that
    exists already, it does not build one."""
    if not name:
        return False
    head = name.split(".")[0]
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            nonlocal found
            found = found or node.value == head

    for arg in call.args:
        arg.visit(Finder())
    return found


def _module_classmethod(index: ScriptIndex, call: cst.Call) -> bool:
    """``Net.from_config(cfg)``, ``Net.build(...)``: a classmethod of a local nn.Module subclass
    (``from_pretrained`` is reported as not buildable offline elsewhere)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
        return False
    owner, method = func.value.value, func.attr.value
    if method == "from_pretrained" or owner not in index.classes or not index.is_module_class(owner):
        return False
    info = index.classes[owner]
    for statement in info.node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == method:
            if not any(dotted(d.decorator) in {"classmethod", "staticmethod"} for d in statement.decorators):
                return False
            return not _returns_only_other_objects(index, statement)
    return False


def _returns_only_other_objects(index: ScriptIndex, function: cst.FunctionDef) -> bool:
    """A static or class method whose every ``return`` builds something that is not a model: a
    literal, or an instance of a class that is not an nn.Module (minGPT's ``GPT.get_default_config()``
    returns a ``CfgNode``). A return of ``cls(...)``, a model class or a plain name may be the model."""
    returns: list[cst.Return] = []

    class _Returns(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function  # a nested def's returns are not this method's

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            returns.append(node)

    function.visit(_Returns())
    if not returns:
        return False

    def other_object(value: cst.BaseExpression | None) -> bool:
        if isinstance(value, (cst.Dict, cst.List, cst.Tuple, cst.Set, cst.SimpleString, cst.Integer, cst.Float)):
            return True
        if isinstance(value, cst.Call):
            name = dotted(value.func)
            return bool(name) and name in index.classes and not index.is_module_class(name)
        return False

    return all(other_object(r.value) for r in returns)


def _registry_lookup(index: ScriptIndex, call: cst.Call) -> bool:
    """``MODELS[args.model](...)``: a call of an entry of a module-level dict literal whose values
    are this file's model classes, factories or lambdas that build them."""
    func = call.func
    if not (isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name)):
        return False
    registry = _module_dict(index, func.value.value)
    if registry is None:
        return False
    for element in registry.elements:
        value = getattr(element, "value", None)
        if isinstance(value, cst.Lambda):
            value = value.body.func if isinstance(value.body, cst.Call) else None
        name = dotted(value)
        if name and ((name in index.classes and index.is_module_class(name)) or name in index.functions
                     or index.is_local_import(name)):
            return True
    return False


def _module_dict(index: ScriptIndex, name: str) -> cst.Dict | None:
    for statement in index.module.body:
        for small in _small_statements(statement):
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.Dict):
                if any(isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets):
                    return small.value
    return None


def _torchvision_call(index: ScriptIndex, call: cst.Call) -> bool:
    func = call.func
    # models.__dict__[name](...) and getattr(models, name)(...)
    if isinstance(func, cst.Subscript):
        if isinstance(func.value, cst.Attribute) and func.value.attr.value == "__dict__":
            return (index.resolve(dotted(func.value.value)) or "").startswith("torchvision.models")
        return False
    if isinstance(func, cst.Call):
        if dotted(func.func) == "getattr" and func.args:
            return (index.resolve(dotted(func.args[0].value)) or "").startswith("torchvision.models")
        return False
    qualified = index.resolve(dotted(func)) or ""
    if qualified.startswith("torchvision.models."):
        last = qualified.rsplit(".", 1)[-1]
        return last == "get_model" or (
            last[:1].islower() and not last.startswith("_") and last not in {"list_models", "get_weight", "get_model_weights"}
        )
    return False


def _dtype_casts(index: ScriptIndex, call: cst.Call) -> list[str]:
    """Method calls chained on the construction that change its dtype (``Net().half().cuda()``)."""
    casts: list[str] = []
    node: cst.CSTNode = call
    while True:
        attribute = index.parent.get(node)
        outer = index.parent.get(attribute) if attribute is not None else None
        if not (isinstance(attribute, cst.Attribute) and attribute.value is node and isinstance(outer, cst.Call)):
            break
        method = attribute.attr.value
        if method in _DTYPE_METHODS:
            casts.append(f".{method}()")
        elif method == "to":
            dtype_args = [a for a in outer.args if _DTYPE_NAMES.search(index.source(a.value) or "")]
            if dtype_args:
                casts.append(f".to({index.source(dtype_args[0].value)})")
        node = outer
    return casts


def _later_casts(index: ScriptIndex, call: cst.Call, name: str | None) -> list[str]:
    """``model.half()`` or ``model = model.to(torch.bfloat16)`` after the construction, same block."""
    if not name:
        return []
    statement = index.statement_of(call)
    line = index.parent.get(statement)
    block = index.parent.get(line)
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or line not in body:
        return []
    casts: list[str] = []
    for later in body[body.index(line) + 1:]:
        if not isinstance(later, cst.SimpleStatementLine):
            continue
        for small in later.body:
            value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                method = value.func.attr.value
                if dotted(value.func.value) == name:
                    if method in _DTYPE_METHODS:
                        casts.append(f".{method}()")
                    elif method == "to":
                        dtype_args = [a for a in value.args if _DTYPE_NAMES.search(index.source(a.value))]
                        if dtype_args:
                            casts.append(f".to({index.source(dtype_args[0].value)})")
                    break
                value = value.func.value
    return casts


_NOT_MODELS = re.compile(r"(Config|Tokenizer|Processor|Dataset|DataLoader|Loader|Trainer|Optimizer|Scheduler|"
                         r"Scaler|Parallel|Writer|Logger|Accelerator|Namespace|Parser)$")


def _other_model_source(index: ScriptIndex, call: cst.Call, qualified: str, trained: bool) -> str | None:
    """A model variable filled some other way: ``X.from_pretrained(...)`` or ``torch.load(...)`` (both
    reported as not buildable offline), a class from a third-party package (``Mamba(...)``), or a
    function of one ("external_function": ``build_model(cfg)``, or any function an optimizer's model
    comes from)."""
    last = qualified.rsplit(".", 1)[-1]
    if last == "from_pretrained":
        # transformers' classes build from a config (a local one, or the architecture the name says)
        return "hf_pretrained" if qualified.split(".")[0] == "transformers" else "pretrained"
    if qualified in {"torch.load", "torch.jit.load", "torch.hub.load"}:
        return "loaded"
    root = qualified.split(".")[0]
    head = (dotted(call.func) or "").split(".")[0]
    if head in index.imports and root not in {"torch", "torchvision", "numpy", "builtins"}:
        if last[:1].isupper() and not _NOT_MODELS.search(last):
            return "external"
        if FACTORY_FUNCTION.match(last) or trained:
            return "external_function"  # built if it imports, else TC100 says why
    return None


def _local_functions_with_candidates(index: ScriptIndex, calls: list[cst.Call]) -> set[str]:
    names = set()
    for call in calls:
        function = index.enclosing_function(call)
        if function is not None:
            names.add(function.name.value)
    return names


def find_candidates(index: ScriptIndex, limit: int = 4) -> list[Candidate]:
    """The model constructions the script's own run reaches, the models its optimizers train first.

    Constructors of nn.Module classes (the file's, the user's modules', a package's), torchvision and
    timm builders and registry lookups are built as they are. A function of the script or of the
    user's modules is called only where an optimizer trains the model it returns and its body neither
    trains, evaluates nor writes files (:func:`function_effect`); otherwise the model is reported as
    not built, with the reason. A name that looks like a model's (``model``, ``net``) only ranks the
    constructions and picks which torch layer is the model: it never makes a function call one."""
    trained = trained_models(index)
    direct: list[tuple[cst.Call, str]] = []
    refused: dict[int, str] = {}  # constructions found but not to be run, with the reason

    def judge(call: cst.Call, functions: list[cst.FunctionDef] | None) -> bool:
        """Whether a call of the user's functions is a construction (a refusal is one, not built)."""
        verdict = _factory_verdict(index, call, functions, trained)
        if verdict is None:
            return False
        if verdict:
            refused[id(call)] = verdict
        return True

    for call in index.calls:
        if _inside_model_code(index, call) or any(isinstance(p, cst.Lambda) for p in index.ancestors(call)):
            continue  # a lambda's body runs when a registry lookup calls it: that lookup is the construction
        if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
            continue  # a method of what a call returns (``Net(...).to(device)``): that call is the construction
        name = dotted(call.func)
        qualified = index.resolve(name) or ""
        target = _assigned_name(index, call) or ""
        # the optimizer trains what this call returns (not a call that receives the model: ``wrap(model)``)
        is_trained = id(call) in trained.direct and not _passes_name(call, target)
        kind = None
        if name and name in index.classes and index.is_module_class(name):
            kind = "class"
        elif _torchvision_call(index, call):
            kind = "torchvision"
        elif qualified.rsplit(".", 1)[-1] == "create_model":
            kind = "create_model"
        elif qualified in BUILTIN_LAYERS | {"torch.nn.Sequential"} and (MODEL_NAME.match(target) or is_trained):
            kind = "sequential"  # or a lone layer trained as the model (``model = nn.Linear(4, 2).cuda()``)
        elif name and index.is_local_import(name):
            symbol = local_symbol_kind(index, name)
            if symbol == "module":
                kind = "imported"
            elif symbol in {"function", None} and (MODEL_NAME.match(target) or is_trained):
                function = local_function_node(index, name)
                kind = "imported" if judge(call, [function] if function is not None else None) else None
        elif _module_classmethod(index, call):
            kind = "class"  # Net.from_config(cfg): an alternate constructor of a local model class
            effect = function_effect(index, _classmethod_node(index, call))
            if effect is not None:
                refused[id(call)] = f"{name}() {effect}, so the audit does not call it"
        elif _registry_lookup(index, call):
            kind = "factory"  # MODELS[args.model](...), ARCHS[name]()
            effect = _registry_effect(index, call)
            if effect is not None:
                refused[id(call)] = f"an entry of the registry {effect}, so the audit does not call it"
        elif MODEL_NAME.match(target) or is_trained:
            kind = _other_model_source(index, call, qualified, is_trained)
            if kind == "external_function":  # a package's function: not the user's code, but a call all the same
                kind = None if trained.optimizer_visible and not is_trained else "external"
                if not trained.optimizer_visible:
                    refused[id(call)] = _untrained(name or "the function")
        if kind is not None:
            direct.append((call, kind))
    # A function of the script whose body builds nothing recognisable (get_network(args) returning
    # zoo[args.net]()): called where the trained model is what it returns, and its body only builds.
    owners = _local_functions_with_candidates(index, [call for call, _ in direct])
    for call in index.calls:
        name = dotted(call.func)
        if not name or "." in name or name in owners or name in index.classes or _inside_model_code(index, call):
            continue
        functions = [info.node for info in index.functions.get(name, []) if info.owner is None]
        if not functions:
            continue
        target = _assigned_name(index, call) or ""
        named_like_one = MODEL_NAME.match(target) and (FACTORY_FUNCTION.match(name) or not _passes_name(call, target))
        candidate = id(call) in trained.factories or (named_like_one and id(call) not in trained.calls)
        if candidate and judge(call, functions):
            direct.append((call, "factory"))
    # Drop constructions nested inside another construction's arguments (nn.Sequential(Net(), Head())).
    chosen = []
    calls = {call for call, _ in direct}
    for call, kind in direct:
        if any(parent in calls for parent in index.ancestors(call)):
            continue
        chosen.append((call, kind))
    candidates = []
    seen_labels: set[tuple[str, int]] = set()
    for call, kind in sorted(chosen, key=lambda ck: index.position(ck[0]).start.line):
        label = _label(index, call)
        scope = index.enclosing_function(call)
        key = (label, id(scope))
        if key in seen_labels:
            continue
        seen_labels.add(key)
        target_name = _assigned_name(index, call)
        casts = _dtype_casts(index, call) + _later_casts(index, call, target_name)
        candidates.append(Candidate(call, kind, label, target_name, casts, refused.get(id(call))))
    # Only what the file's own run builds: constructions in functions nothing calls (a registry's
    # alternatives, a model zoo's entries, a library's factories) are not what the script trains.
    candidates = [c for c in candidates if reachable(index, c.call)]
    candidates.sort(key=lambda c: (id(c.call) not in trained.calls, not MODEL_NAME.match(c.target_name or ""),
                                   index.position(c.call).start.line))
    return candidates[:limit]


def _factory_verdict(index: ScriptIndex, call: cst.Call, functions: list[cst.FunctionDef] | None,
                     trained: TrainedModels) -> str | None:
    """Whether a call of the user's function (``functions``: its definitions; None where they cannot be
    read) is a model construction: None when it is not (an optimizer trains something else, or no
    optimizer is visible and the function trains, evaluates or writes); "" to call it (an optimizer
    trains what it returns, and it only builds); else why it is a construction the audit does not call."""
    name = dotted(call.func) or "the function"
    effect = next(filter(None, (function_effect(index, fn) for fn in functions or [])), None)
    if id(call) in trained.direct or id(call) in trained.factories:
        if functions is None:
            return (f"{name}() returns the model the optimizer trains, but the audit cannot read what {name}() "
                    f"does, so it does not call it")
        if effect is not None:
            return f"{name}() returns the model the optimizer trains, but it {effect}, so the audit does not call it"
        return ""
    if trained.optimizer_visible or effect is not None:
        return None
    return _untrained(name)


def _untrained(name: str) -> str:
    return (f"no optimizer in this file trains what {name}() returns, and the audit calls a function only "
            f"to build a model an optimizer trains")


def _classmethod_node(index: ScriptIndex, call: cst.Call) -> cst.FunctionDef:
    """The classmethod ``Net.from_config`` of a call that :func:`_module_classmethod` accepted."""
    func = call.func
    assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
    info = index.classes[func.value.value]
    return next(s for s in info.node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value)


def _registry_effect(index: ScriptIndex, call: cst.Call) -> str | None:
    """What a registry lookup's function entries (this file's) do beyond building (:func:`function_effect`)."""
    registry = _module_dict(index, call.func.value.value)  # type: ignore[attr-defined] - _registry_lookup's shape
    for element in registry.elements if registry is not None else []:
        name = dotted(getattr(element, "value", None))
        for info in index.functions.get(name or "", []):
            effect = function_effect(index, info.node) if info.owner is None else None
            if effect is not None:
                return f"{name}() {effect}"
    return None


def reachable(index: ScriptIndex, node: cst.CSTNode, depth: int = 0, seen: frozenset = frozenset()) -> bool:
    """Whether the script's own run can reach this code: module level, or a function that some
    reachable code calls (a decorated function, e.g. ``@hydra.main``, counts as an entry point)."""
    function = index.enclosing_function(node)
    if function is None:
        return True
    if depth > 8 or function in seen:
        return False
    for decorator in function.decorators:
        expr = decorator.decorator
        name = dotted(expr.func if isinstance(expr, cst.Call) else expr) or ""
        if name.split(".")[0] in index.imports:
            return True  # @hydra.main, @click.command, @app.command: the framework calls it
    owner = index.owner_class(function)
    name = function.name.value
    if owner is None and _exported_training_function(index, function):
        return True
    for call in index.calls:
        callee = dotted(call.func)
        if owner is None and callee == name:
            pass
        elif owner is not None and name == "__init__" and callee == owner.name.value:
            pass
        elif owner is not None and callee is not None and callee.endswith(f".{name}"):
            pass
        else:
            continue
        if any(a is function for a in index.ancestors(call)):
            continue
        if reachable(index, call, depth + 1, seen | {function}):
            return True
    return False


def _exported_training_function(index: ScriptIndex, function: cst.FunctionDef) -> bool:
    """A module-level function that trains (``loss.backward()`` in its body) and that nothing in the
    file calls: an entry point for a launcher or another module (``def main(cfg): ...``)."""
    if any(isinstance(parent, (cst.FunctionDef, cst.ClassDef)) for parent in index.ancestors(function)):
        return False
    if ".backward(" not in index.source(function):
        return False
    name = function.name.value
    return not any(dotted(call.func) == name for call in index.calls)


def _label(index: ScriptIndex, call: cst.Call) -> str:
    text = " ".join(index.source(call).split())
    return text if len(text) <= 60 else text[:57] + "..."


# -- input hints --------------------------------------------------------------------------------

DATASET_SHAPES = {
    "MNIST": (1, 28), "FashionMNIST": (1, 28), "KMNIST": (1, 28), "EMNIST": (1, 28), "QMNIST": (1, 28),
    "CIFAR10": (3, 32), "CIFAR100": (3, 32), "SVHN": (3, 32), "STL10": (3, 96),
}
CROP_TRANSFORMS = ("RandomResizedCrop", "CenterCrop", "RandomCrop")
RESIZE_TRANSFORMS = ("Resize",)
BATCH_NAMES = ("batch_size", "bs", "train_batch_size", "per_device_train_batch_size", "micro_batch_size", "batch")
IMAGE_NAMES = ("image_size", "img_size", "input_size", "crop_size", "resolution", "train_crop_size", "image_res", "size")
SEQ_NAMES = ("block_size", "seq_len", "seq_length", "max_seq_len", "context_length", "max_len", "n_ctx", "sequence_length")


class ConstantEvaluator:
    """Evaluates small integer expressions statically: literals, module constants, argparse
    defaults (``args.batch_size``), config dataclass fields and dict literals."""

    def __init__(self, index: ScriptIndex) -> None:
        self.index = index
        self.constants: dict[str, cst.BaseExpression] = {}
        self.args_names: set[str] = set()
        for statement in index.module.body:
            for small in _small_statements(statement):
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target = small.targets[0].target
                    if isinstance(target, cst.Name):
                        self.constants.setdefault(target.value, small.value)
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                    self.constants.setdefault(small.target.value, small.value)
        for call in index.calls:
            if index.is_args_call(call):
                statement = index.statement_of(call)
                if isinstance(statement, cst.Assign):
                    for target in statement.targets:
                        element = target.target
                        if isinstance(element, cst.Tuple) and element.elements:
                            element = element.elements[0].value
                        if isinstance(element, cst.Name):
                            self.args_names.add(element.value)

    def value(self, node: cst.BaseExpression | None, depth: int = 0) -> int | tuple | None:
        if node is None or depth > 8:
            return None
        if isinstance(node, cst.Integer):
            try:
                return int(evaluated_value(node))
            except (TypeError, ValueError):
                return None
        if isinstance(node, (cst.Tuple, cst.List)):
            values = [self.value(e.value, depth + 1) for e in node.elements]
            return tuple(values) if all(isinstance(v, int) for v in values) else None
        if isinstance(node, cst.BinaryOperation):
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            if isinstance(left, int) and isinstance(right, int):
                op = type(node.operator).__name__
                return {"Multiply": left * right, "Add": left + right, "Subtract": left - right,
                        "FloorDivide": left // right if right else None, "Power": left ** right if right < 64 else None}.get(op)
            return None
        if isinstance(node, cst.Name):
            if node.value in self.constants:
                return self.value(self.constants[node.value], depth + 1)
            return self.project_value(node)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            owner, attr = node.value.value, node.attr.value
            if owner in self.args_names:
                option = self.index.options.get(attr)
                if option is not None and option.default is not None:
                    value = self.value(option.default, depth + 1)
                    if value is None and option.type_code in {"int"}:
                        text = _string_value(option.default)
                        return int(text) if text and text.isdigit() else None
                    return value
                return None
            found = self.field_value(owner, attr, depth)
            return found if found is not None else self.project_value(node)
        return None

    def project_value(self, node: cst.BaseExpression) -> int | None:
        """The value the project model gives a name this file does not bind itself: a constant of
        another module of the project, a dataclass default (``cfg = TrainConfig()`` from ``config.py``),
        an earlier notebook cell's assignment. An int only where every value it may hold is that int."""
        values = self._project_values
        if values is None:
            return None
        facts, evaluate = values
        function = self.index.enclosing_function(node)
        try:
            found = evaluate.of(facts, node, function)
        except Exception:  # noqa: BLE001 - a hint is optional; the audit assumes what it cannot tell
            return None
        held = {v.value for v in found or ()}
        value = held.pop() if len(held) == 1 else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @functools.cached_property
    def _project_values(self):
        """(this file's ScriptFacts, the project's Values), made on first use; None where they cannot be."""
        try:
            from tcaudit.project.symbols import project_of
            from tcaudit.project.values import Values

            facts = self.index.script_facts
            return facts, Values(project_of(facts, None))
        except Exception:  # noqa: BLE001 - no project values: the hints stay the file's own
            return None

    def field_value(self, owner: str, attr: str, depth: int) -> int | None:
        """``cfg.block_size`` where ``cfg = Config(...)`` at module level or Config is a dataclass."""
        expr = self.constants.get(owner)
        if isinstance(expr, cst.Call):
            for arg in expr.args:
                if arg.keyword is not None and arg.keyword.value == attr:
                    return self.value(arg.value, depth + 1)
            class_name = dotted(expr.func)
            if class_name in self.index.classes:
                return self.class_field(class_name, attr, depth)
        if owner in self.index.classes:
            return self.class_field(owner, attr, depth)
        # ``cfg.block_size`` where cfg is a parameter: a config class of this file that has the field.
        values = {self.class_field(name, attr, depth) for name in self.index.classes}
        values.discard(None)
        return values.pop() if len(values) == 1 else None

    def class_field(self, class_name: str, attr: str, depth: int) -> int | None:
        info = self.index.classes.get(class_name)
        if info is None:
            return None
        for statement in info.node.body.body:
            for small in _small_statements(statement):
                if isinstance(small, cst.AnnAssign) and dotted(small.target) == attr and small.value is not None:
                    return self.value(small.value, depth + 1)
                if isinstance(small, cst.Assign) and any(dotted(t.target) == attr for t in small.targets):
                    return self.value(small.value, depth + 1)
        return None


def _small_statements(statement: cst.CSTNode) -> list[cst.BaseSmallStatement]:
    if isinstance(statement, cst.SimpleStatementLine):
        return list(statement.body)
    return []


def _keyword(call: cst.Call, name: str, position: int | None = None) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position is not None and position < len(positional):
        return positional[position].value
    return None


def find_hints(index: ScriptIndex) -> dict:
    """Input-shape hints: batch size, image size and channels, sequence length, with where each came from."""
    evaluator = ConstantEvaluator(index)
    hints: dict = {}
    filename = index.path.name

    def note(key: str, value, origin_key: str, where: str) -> None:
        if key not in hints and isinstance(value, int) and value > 0:
            hints[key] = value
            hints[origin_key] = where

    crops, resizes = [], []
    for call in index.calls:
        name = dotted(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        line = index.line_of(call)
        if last == "DataLoader":
            note("batch_size", evaluator.value(_keyword(call, "batch_size", 1)), "batch_origin",
                 f"DataLoader batch_size, {filename}:{line}")
        elif last in CROP_TRANSFORMS or last in RESIZE_TRANSFORMS:
            size = evaluator.value(_keyword(call, "size", 0))
            if isinstance(size, tuple) and size:
                size = size[0]
            if isinstance(size, int):
                (crops if last in CROP_TRANSFORMS else resizes).append((size, f"{last}, {filename}:{line}"))
        elif last in DATASET_SHAPES and (index.resolve(name) or "").startswith("torchvision.datasets"):
            channels, size = DATASET_SHAPES[last]
            note("channels", channels, "channels_origin", f"{last}, {filename}:{line}")
            note("dataset_image_size", size, "dataset_origin", f"{last}, {filename}:{line}")
        elif name.endswith("randint") and (index.resolve(name) or "").startswith("torch"):
            size = _keyword(call, "size")
            if size is None:
                positional = [a.value for a in call.args if a.keyword is None]
                size = next((p for p in positional if isinstance(p, cst.Tuple)), None)
            if isinstance(size, cst.Tuple) and len(size.elements) == 2:
                batch = evaluator.value(size.elements[0].value)
                seq = evaluator.value(size.elements[1].value)
                note("batch_size", batch, "batch_origin", f"torch.randint, {filename}:{line}")
                note("seq_len", seq, "seq_origin", f"torch.randint, {filename}:{line}")
    for size, where in crops + resizes:
        note("image_size", size, "image_origin", where)
    for dest in BATCH_NAMES:
        option = index.options.get(dest)
        if option is not None:
            note("batch_size", evaluator.value(option.default) if option.default is not None else None,
                 "batch_origin", f"--{dest.replace('_', '-')} default, {filename}:{option.line}")
        note("batch_size", evaluator.value(cst.Name(dest)) if dest in evaluator.constants else None,
             "batch_origin", f"{dest} in {filename}")
    for dest in IMAGE_NAMES:
        option = index.options.get(dest)
        if option is not None and option.default is not None:
            value = evaluator.value(option.default)
            if value is None and option.type_code == "int":
                text = _string_value(option.default)
                value = int(text) if text and text.isdigit() else None
            note("image_size", value, "image_origin", f"--{dest.replace('_', '-')} default, {filename}:{option.line}")
    if "dataset_image_size" in hints:
        note("image_size", hints["dataset_image_size"], "image_origin", hints["dataset_origin"])
    for dest in SEQ_NAMES:
        option = index.options.get(dest)
        if option is not None and option.default is not None:
            note("seq_len", evaluator.value(option.default), "seq_origin", f"--{dest.replace('_', '-')} default")
        if dest in evaluator.constants:
            note("seq_len", evaluator.value(cst.Name(dest)), "seq_origin", f"{dest} in {filename}")
    hints.pop("dataset_image_size", None)
    hints.pop("dataset_origin", None)
    return hints
