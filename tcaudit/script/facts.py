"""Facts about one training script, computed once and shared by every script rule.

One LibCST visitor pass records imports, assignments, calls, ``with`` blocks, functions and the
lexical context of each (enclosing defs, loops, branches, ``with`` items) as a persistent linked
list of frames, so that a snapshot costs nothing. Everything else (what is autocast, what is an
eval path, where the training steps are) is derived lazily from those records.

Names are resolved through the file's imports and simple assignments, not through LibCST's
QualifiedNameProvider: scope metadata costs several times the parse (benchmarks/cst_costs.py), while training
scripts rarely shadow the names that matter here. Positions come from LibCST's PositionProvider,
resolved only when a rule reports something.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import libcst as cst
from libcst.metadata import CodeRange

from tcaudit.script.callers import callers_of
from tcaudit.script.evidence import ACCELERATOR_NAMED, CUDA_NAMED
from tcaudit.script.optimizers import is_optimizer
from tcaudit.source.memo import active as active_memo
from tcaudit.source.memo import remembered
from tcaudit.source.parsing import SourceFile
from tcaudit.source.syntax import chain_root, code_matches, evaluated_value, full_name, keyword, names_in, parent_map
from tcaudit.source.walk import code_positions, walk

_T = TypeVar("_T")

# Names that star imports from these modules may bring in and that the rules care about.
_STAR_EXPORTS = {
    "torch.cuda.amp": {"autocast", "GradScaler", "custom_fwd", "custom_bwd"},
    "torch.amp": {"autocast", "GradScaler", "custom_fwd", "custom_bwd"},
    "torch.nn": {"BCELoss", "DataParallel", "Module", "Linear", "Conv2d", "Sequential", "functional"},
    "torch.nn.functional": {"binary_cross_entropy"},
    "torch.optim": {"SGD", "Adam", "AdamW", "LBFGS", "RMSprop", "Adagrad", "Optimizer"},
    "torch.utils.data": {"DataLoader", "DistributedSampler", "Dataset"},
    "torch.nn.utils": {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"},
}

AUTOCAST_QUALNAMES = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.autocast_mode.autocast",
        "torch.cpu.amp.autocast",
        "torch.xpu.amp.autocast",
    }
)
GRADSCALER_SUFFIXES = ("GradScaler", "ShardedGradScaler")
NO_GRAD_QUALNAMES = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad"})
CLIP_FUNCTIONS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grads_with_norm_"})

_OPTIMIZER_NAME = re.compile(r"(^|[._])(optim\w*|opt(_\w+)?|optimi[sz]er\w*|opt[A-Z]\w*|optimizer[A-Z]\w*)$")
_SCHEDULER_NAME = re.compile(r"sched|scheduler|lr_", re.IGNORECASE)
_MODEL_NAME = re.compile(r"(^|[._])(model\w*|\w*_model|net\w*|\w*Net|generator|discriminator|encoder|decoder)$")
# Model-like names that hold what describes a model, not the model (``model_config = GPT.get_default_config()``).
_MODEL_DESCRIPTION = re.compile(r"_(config|cfg|conf|args|kwargs|path|dir|name|file|opts|options|kind|type)$")
_EVAL_FUNCTION = re.compile(r"^_*(eval\w*|valid\w*|test\w*|infer\w*|predict\w*|sample\w*|generate\w*)$")
_ACCELERATOR_TEXT = re.compile(ACCELERATOR_NAMED)
_CUDA_TEXT = re.compile(CUDA_NAMED)
# Calls that set where tensors are made, whatever ``.to()`` says; packages whose model builders build on the CPU.
_DEFAULT_DEVICE_SETTERS = frozenset(
    {"torch.set_default_device", "torch.set_default_tensor_type", "torch.cuda.set_device"})
_CPU_BUILDERS = ("torch.nn.", "torchvision.models.", "timm.")
_OTHER_ACCELERATORS = re.compile(r"\b(mps|xpu|HalfTensor)\b")
# torch's wrappers that put the model they are handed on a GPU where there is one (DataParallel on
# ``device_ids[0]``) or shard it onto the process's device (FSDP).
_DEVICE_WRAPPERS = re.compile(r"DataParallel$|FullyShardedDataParallel$|fully_shard$")
_DEVICE_NAME = re.compile(r"(device|^dev$|^gpu$|_gpu$|^gpu_|gpus?_?id|local_rank|^rank$|^cuda)", re.IGNORECASE)

# Frameworks that own the loop and/or precision when these names are referenced.
_FRAMEWORK_ROOTS = {
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "deepspeed": "deepspeed",
    "apex": "apex",
    "colossalai": "colossalai",
    "composer": "composer",
}


@dataclass(frozen=True)
class Frame:
    """One level of lexical context: ``def``, ``class``, ``with``, ``loop``, ``if``, ``else``, ``try``,
    ``except``, ``lambda`` or ``module``. Frames link to their parent, so a snapshot is one pointer."""

    kind: str
    node: cst.CSTNode
    parent: "Frame | None"
    # Answers about this frame and the ones around it that the analysis keeps (``distributed.in_test_code``):
    # the records of a file share their frames, and rules ask the same of every call.
    answers: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def chain(self) -> Iterator["Frame"]:
        frame: Frame | None = self
        while frame is not None:
            yield frame
            frame = frame.parent

    def nearest(self, kind: str) -> "Frame | None":
        for frame in self.chain():
            if frame.kind == kind:
                return frame
        return None

    @property
    def function(self) -> cst.FunctionDef | None:
        for frame in self.chain():
            if frame.kind == "def":
                return frame.node  # type: ignore[return-value]
        return None

    @property
    def class_def(self) -> cst.ClassDef | None:
        for frame in self.chain():
            if frame.kind == "class":
                return frame.node  # type: ignore[return-value]
        return None

    def inside(self, node: cst.CSTNode) -> bool:
        return any(frame.node is node for frame in self.chain())


def outermost_loop(ctx: Frame, function) -> cst.CSTNode | None:
    """The outermost loop around ``ctx`` inside ``function`` (None where there is none)."""
    loop = None
    for frame in ctx.chain():
        if frame.kind == "def" and frame.node is function:
            break
        if frame.kind == "loop":
            loop = frame.node
    return loop


@dataclass(frozen=True)
class Statement:
    """A statement and the block that holds it, so rules can look at its neighbours."""

    node: cst.CSTNode
    block: tuple[cst.CSTNode, ...]
    index: int


@dataclass(frozen=True)
class CallSite:
    node: cst.Call
    name: str | None  # dotted text of the callee as written (``self.model``, ``torch.autocast``)
    qualname: str | None  # resolved through imports (``torch.amp.autocast``)
    ctx: Frame
    statement: Statement | None

    @functools.cached_property
    def method(self) -> str | None:
        """The attribute called (``step`` of ``opt.step()``), None for a plain name: asked of every call
        of a file by many rules, so kept. (``type() is``: Attribute has no subclasses, and ``isinstance``
        of LibCST's ABCs costs a Python call for every other node.)"""
        func = self.node.func
        return func.attr.value if type(func) is cst.Attribute else None

    @property
    def receiver(self) -> cst.BaseExpression | None:
        func = self.node.func
        return func.value if type(func) is cst.Attribute else None

    @property
    def receiver_name(self) -> str | None:
        receiver = self.receiver
        return full_name(receiver) if receiver is not None else None

    def arg(self, key: str, position: int | None = None) -> cst.BaseExpression | None:
        """The value the call passes at ``position`` (``*args`` not counted), else as ``key=``; None when
        it passes neither."""
        found = keyword(self.node, None, position)
        if found is None:
            found = keyword(self.node, key)
        return found.value if found is not None else None

    @property
    def has_star_kwargs(self) -> bool:
        return any(arg.star == "**" for arg in self.node.args)


@dataclass(frozen=True)
class Binding:
    target: str
    value: cst.BaseExpression
    ctx: Frame
    statement: Statement | None

    @property
    def is_item_write(self) -> bool:
        """``X[i] = v``: recorded as a binding of ``X``, but it writes into the object ``X`` holds."""
        statement = self.statement.node if self.statement is not None else None
        smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
        return any(
            isinstance(small, cst.Assign) and small.value is self.value
            and any(isinstance(t.target, cst.Subscript) for t in small.targets)
            for small in smalls
        )


@dataclass(frozen=True)
class ImportSite:
    node: cst.Import | cst.ImportFrom
    local: str
    qualname: str
    ctx: Frame
    in_import_error_fallback: bool


@dataclass(frozen=True)
class Reference:
    """A dotted name (``torch.cuda.amp.GradScaler``) used anywhere, resolved through imports."""

    node: cst.BaseExpression
    dotted: str
    qualname: str | None
    ctx: Frame


@dataclass
class TrainingStep:
    backward: CallSite
    loss: cst.BaseExpression
    scaler: str | None  # dotted name of the GradScaler when the backward is ``scaler.scale(loss).backward()``

    @property
    def function(self) -> cst.FunctionDef | None:
        return self.backward.ctx.function

    @property
    def ctx(self) -> Frame:
        return self.backward.ctx


# Top-level definitions ``tcaudit fix`` inserts (``tcaudit_dali_loader`` and its classes): tcaudit's own
# code, not the user's training code. Their bodies are not collected, so no rule looks inside them.
GENERATED_PREFIXES = ("tcaudit_", "Tcaudit")

_NOT_LOOKED_UP = object()
_OTHER, _COMPOUND, _SMALL = 0, 1, 2
_STATEMENT_KINDS: dict[type, int] = {}


def _statement_kind(cls: type) -> int:
    kind = _STATEMENT_KINDS.get(cls)
    if kind is None:
        if issubclass(cls, cst.BaseCompoundStatement):
            kind = _COMPOUND
        elif issubclass(cls, cst.BaseSmallStatement):
            kind = _SMALL
        else:
            kind = _OTHER
        _STATEMENT_KINDS[cls] = kind
    return kind


class _Collector(cst.CSTVisitor):
    # CSTVisitor looks its callbacks up by name (``visit_Call``) on every node; this class's
    # callbacks are fixed, so each is looked up once per node class. A subclass gets its own tables.
    # (Attribute callbacks such as ``visit_With_body`` are looked up once by ``walk``.)
    _visit_hooks: dict[type, object] = {}
    _leave_hooks: dict[type, object] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._visit_hooks, cls._leave_hooks = {}, {}

    def __init__(self, module: cst.Module, module_frame: Frame | None = None) -> None:
        super().__init__()
        self.module_frame = module_frame if module_frame is not None else Frame("module", module, None)
        self.ctx = self.module_frame
        self.blocks: list[tuple[cst.CSTNode, ...]] = []
        self.block_index: list[dict[int, int]] = []
        self.statements: list[Statement | None] = [None]
        self.calls: list[CallSite] = []
        self.withs: list[tuple[cst.With, Frame]] = []
        self.functions: list[tuple[cst.FunctionDef, Frame]] = []
        self.classes: list[tuple[cst.ClassDef, Frame]] = []
        self.bindings: list[Binding] = []
        self.imports: list[ImportSite] = []
        self.star_imports: list[str] = []
        self.references: list[tuple[cst.BaseExpression, str, Frame]] = []
        self._inner_attrs: set[int] = set()
        self._try_stack: list[cst.Try] = []
        # Kept for the next text of an editor's document (``keep``: :func:`_collect`): each frame made, by
        # (its node's id, kind), in the order made; each statement of a block inside the walked statement,
        # in the order its walk ended (by id: its place in that list), as (the statement, the frame it was
        # in, where its records begin and end in the lists above, where the statements and the frames inside
        # it begin in those lists, where its frames end).
        self.keep = False
        self.frames_made: dict[tuple[int, str], Frame] = {}
        self.frame_list: list[tuple[tuple[int, str], Frame]] = []
        self.inner: dict[int, int] = {}
        self.inner_list: list[tuple] = []
        self._open: list[tuple] = []
        # Reused from the last text's records of the statement this one was remade from (around an edit
        # inside it): its frames and its statements' records (:meth:`reusing`).
        self._remade: dict[int, cst.CSTNode] = {}
        self._old: _Collector | None = None
        self._skipped: cst.CSTNode | None = None

    # -- frames ---------------------------------------------------------------------------------
    def _push(self, kind: str, node: cst.CSTNode) -> None:
        old = self._old
        frame = None
        if old is not None:
            was = self._remade.get(id(node), node)
            frame = old.frames_made.get((id(was), kind))
            if frame is not None and frame.node is was and frame.parent is self.ctx:
                if was is not node:  # the frame of the node this one was remade from, made this one's
                    object.__setattr__(frame, "node", node)
            else:
                frame = None
        if frame is None:
            frame = Frame(kind, node, self.ctx)
        if self.keep:
            key = (id(node), kind)
            self.frames_made[key] = frame
            self.frame_list.append((key, frame))
        self.ctx = frame

    def reusing(self, old: _Collector, remade: dict[int, cst.CSTNode]) -> None:
        """Walk a top-level statement remade from the one ``old`` recorded (``remade``: each remade node's
        id and the node it stands for) reusing what ``old`` made: the frames of the nodes on the way down
        to the edit (those nodes remade with new blocks, their headers the same objects) become the new
        nodes' frames, and a statement of a block that is the very object it was, in the very frame it
        was in, takes its records from ``old`` instead of being walked again. Records are what a walk of
        the statement makes, with the same frames (tests/test_incremental.py compares them)."""
        self._old, self._remade = old, remade

    def _pop(self) -> None:
        assert self.ctx.parent is not None
        self.ctx = self.ctx.parent

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        generated = self.ctx is self.module_frame and node.name.value.startswith(GENERATED_PREFIXES)
        self.functions.append((node, self.ctx))
        self._push("def", node)
        return not generated

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._push("lambda", node)

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        generated = self.ctx is self.module_frame and node.name.value.startswith(GENERATED_PREFIXES)
        self.classes.append((node, self.ctx))
        self._push("class", node)
        return not generated

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._pop()

    def visit_With(self, node: cst.With) -> None:
        self.withs.append((node, self.ctx))

    def visit_With_body(self, node: cst.With) -> None:
        self._push("with", node)

    def leave_With_body(self, node: cst.With) -> None:
        self._pop()

    def visit_For_body(self, node: cst.For) -> None:
        self._push("loop", node)

    def leave_For_body(self, node: cst.For) -> None:
        self._pop()

    def visit_While_body(self, node: cst.While) -> None:
        self._push("loop", node)

    def leave_While_body(self, node: cst.While) -> None:
        self._pop()

    def visit_If_body(self, node: cst.If) -> None:
        self._push("if", node)

    def leave_If_body(self, node: cst.If) -> None:
        self._pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        self._push("else", node)

    def leave_If_orelse(self, node: cst.If) -> None:
        self._pop()

    def visit_Try(self, node: cst.Try) -> None:
        self._try_stack.append(node)

    def leave_Try(self, original_node: cst.Try) -> None:
        self._try_stack.pop()

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._push("except", node)

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler) -> None:
        self._pop()

    # -- blocks and statements --------------------------------------------------------------------
    def _push_block(self, body: Sequence[cst.CSTNode]) -> None:
        block = tuple(body)
        self.blocks.append(block)
        self.block_index.append({id(item): i for i, item in enumerate(block)})

    def _pop_block(self) -> None:
        self.blocks.pop()
        self.block_index.pop()

    def visit_Module(self, node: cst.Module) -> None:
        self._push_block(node.body)

    def leave_Module(self, original_node: cst.Module) -> None:
        self._pop_block()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._push_block(node.body)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._pop_block()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._push_block(node.body)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self._pop_block()

    def _in_current_block(self, node: cst.CSTNode) -> bool:
        return bool(self.block_index) and id(node) in self.block_index[-1]

    def _enter_statement(self, node: cst.CSTNode) -> None:
        block = self.blocks[-1] if self.blocks else (node,)
        index = self.block_index[-1].get(id(node), 0) if self.block_index else 0
        self.statements.append(Statement(node, block, index))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._enter_statement(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self.statements.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        cls = type(node)
        if self.keep and len(self.blocks) > 1 and id(node) in self.block_index[-1]:  # a block's statement
            if self._old is not None and self._reused(node):
                return False
            self._open.append((node, self.ctx, self._counts(), len(self.inner_list), len(self.frame_list)))
        kind = _statement_kind(cls)
        if kind == _COMPOUND:
            self._enter_statement(node)
        elif kind == _SMALL and self._in_current_block(node):
            # A small statement of a one-line suite (``if x: a; b``) is its own statement.
            self._enter_statement(node)
        visit = self._visit_hooks.get(cls, _NOT_LOOKED_UP)
        if visit is _NOT_LOOKED_UP:
            visit = self._visit_hooks[cls] = getattr(type(self), f"visit_{cls.__name__}", None)
        return visit is None or visit(self, node) is not False  # type: ignore[operator]

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self._skipped is original_node:  # its records reused: nothing of it was visited
            self._skipped = None
            return
        cls = type(original_node)
        leave = self._leave_hooks.get(cls, _NOT_LOOKED_UP)
        if leave is _NOT_LOOKED_UP:
            leave = self._leave_hooks[cls] = getattr(type(self), f"leave_{cls.__name__}", None)
        if leave is not None:
            leave(self, original_node)  # type: ignore[operator]
        kind = _statement_kind(cls)
        if kind == _COMPOUND:
            self.statements.pop()
        elif (
            kind == _SMALL
            and len(self.statements) > 1
            and self.statements[-1] is not None
            and self.statements[-1].node is original_node
        ):
            self.statements.pop()
        if self._open and self._open[-1][0] is original_node:
            node, ctx, starts, inner_from, frames_from = self._open.pop()
            self.inner[id(node)] = len(self.inner_list)
            self.inner_list.append((node, ctx, starts, self._counts(), inner_from, frames_from, len(self.frame_list)))

    def _counts(self) -> tuple[int, ...]:
        return (len(self.calls), len(self.withs), len(self.functions), len(self.classes), len(self.bindings),
                len(self.imports), len(self.star_imports), len(self.references))

    def _reused(self, node: cst.CSTNode) -> bool:
        """Take the records of ``node``, a statement of the block being walked, from the last text's walk
        where it is the very statement it was, in the very frame; it is then not walked. What was kept of
        it for the next text (its frames, its statements' places) is kept again, at its new places."""
        old = self._old
        assert old is not None
        place = old.inner.get(id(node))
        if place is None:
            return False
        was, ctx, starts, ends, inner_from, frames_from, frames_to = old.inner_list[place]
        if was is not node or ctx is not self.ctx:
            return False
        here = self._counts()
        statement = Statement(node, self.blocks[-1], self.block_index[-1].get(id(node), 0))
        self.calls.extend(c if c.statement is None or c.statement.node is not node
                          else CallSite(c.node, c.name, c.qualname, c.ctx, statement)
                          for c in old.calls[starts[0]:ends[0]])
        self.withs.extend(old.withs[starts[1]:ends[1]])
        self.functions.extend(old.functions[starts[2]:ends[2]])
        self.classes.extend(old.classes[starts[3]:ends[3]])
        self.bindings.extend(b if b.statement is None or b.statement.node is not node
                             else Binding(b.target, b.value, b.ctx, statement)
                             for b in old.bindings[starts[4]:ends[4]])
        self.imports.extend(old.imports[starts[5]:ends[5]])
        self.star_imports.extend(old.star_imports[starts[6]:ends[6]])
        self.references.extend(old.references[starts[7]:ends[7]])
        shift = [now - then for now, then in zip(here, starts)]
        inner_shift, frame_shift = len(self.inner_list) - inner_from, len(self.frame_list) - frames_from
        frames = old.frame_list[frames_from:frames_to]
        self.frame_list.extend(frames)
        self.frames_made.update(frames)
        for inside, its_ctx, its_starts, its_ends, its_inner, its_from, its_to in old.inner_list[inner_from:place]:
            self.inner[id(inside)] = len(self.inner_list)
            self.inner_list.append((inside, its_ctx, tuple(map(sum, zip(its_starts, shift))),
                                    tuple(map(sum, zip(its_ends, shift))), its_inner + inner_shift,
                                    its_from + frame_shift, its_to + frame_shift))
        self.inner[id(node)] = len(self.inner_list)
        self.inner_list.append((node, self.ctx, here, self._counts(), inner_from + inner_shift,
                                frames_from + frame_shift, frames_to + frame_shift))
        self._skipped = node
        return True

    # -- records ----------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        name = full_name(node.func)
        self.calls.append(CallSite(node, name, None, self.ctx, self.statements[-1]))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(chain_root(node, self._inner_attrs), cst.Name):
            dotted = full_name(node)
            if dotted:
                self.references.append((node, dotted, self.ctx))

    def visit_Name(self, node: cst.Name) -> None:
        self.references.append((node, node.value, self.ctx))

    def _record_binding(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                for t, v in zip(target.elements, value.elements):
                    self._record_binding(t.value, v.value)
            return
        name = full_name(target)
        if name:
            self.bindings.append(Binding(name, value, self.ctx, self.statements[-1]))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._record_binding(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._record_binding(node.target, node.value)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._record_binding(node.asname.name, node.item)

    def _in_import_fallback(self) -> bool:
        frame = self.ctx.nearest("except")
        if frame is None or not self._try_stack:
            return False
        handler = frame.node
        assert isinstance(handler, cst.ExceptHandler)
        caught = full_name(handler.type) if handler.type is not None else "BaseException"
        return bool(caught) and caught.split(".")[-1] in (
            "ImportError",
            "ModuleNotFoundError",
            "AttributeError",
            "Exception",
            "BaseException",
        )

    def visit_Import(self, node: cst.Import) -> None:
        fallback = self._in_import_fallback()
        for alias in node.names:
            full = full_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local, qual = alias.asname.name.value, full
            else:
                local = qual = full.split(".")[0]
            self.imports.append(ImportSite(node, local, qual, self.ctx, fallback))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        fallback = self._in_import_fallback()
        module = full_name(node.module) if node.module is not None else ""
        dots = "." * len(node.relative)
        base = f"{dots}{module or ''}"
        if isinstance(node.names, cst.ImportStar):
            self.star_imports.append(base)
            return
        for alias in node.names:
            name = full_name(alias.name) or ""
            local = (
                alias.asname.name.value
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                else name
            )
            qual = f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}"
            self.imports.append(ImportSite(node, local, qual, self.ctx, fallback))


def _collect(module: cst.Module, document: bool = False) -> _Collector:
    """What the collector records of ``module``: the callbacks of ``module.visit(collector)``, without LibCST
    rebuilding the tree, made one top-level statement at a time. While an analysis keeps a memo
    (tcaudit/source/memo.py), each statement's records are remembered; in an editor the next analysis
    takes those of every statement an edit left as it was, moved onto its module (:func:`_moved_records`),
    and walks only the statements that changed. The facts of the document an editor analyses
    (``document``: the memo's ``document``) share one module frame from one text to the next, made the
    module's at each: a kept statement's records keep their frames, and only the records of the statement
    itself move to its new place among the module's statements. (Another file read meanwhile, a project
    module or this file on disk, gets frames of its own.)"""
    memo = active_memo()
    if memo is None:
        whole = _Collector(module)
        whole.visit_Module(module)
        for statement in module.body:
            walk(statement, whole)
        return whole
    if document:
        # One module frame for the document's texts, made this module's: the records of the statements
        # an edit left as they were keep their frames, which end at it.
        root = memo.answer(memo, "document's module frame", lambda: Frame("module", module, None))
        if root.node is not module:
            object.__setattr__(root, "node", module)
            root.answers.clear()
    else:
        root = Frame("module", module, None)
    whole = _Collector(module, root)
    whole.visit_Module(module)
    body, index = whole.blocks[-1], whole.block_index[-1]
    for statement in module.body:
        def records(statement: cst.CSTNode = statement) -> _Collector:
            one = _Collector(module, whole.module_frame)
            one.blocks, one.block_index = [body], [index]
            if document:  # kept for the next text; reusing the last text's where the edit was inside it
                one.keep = True
                was = memo.remade.get(id(statement))
                old = memo.peek(was, "facts-records") if was is not None else None
                if old is not None and old.module_frame is whole.module_frame and old.keep:
                    one.reusing(old, memo.remade)
            walk(statement, one)
            one._old = None
            return one

        piece = memo.answer(statement, "facts-records", records)
        if piece.module_frame is not whole.module_frame or piece.blocks[0] is not body:
            piece = _moved_records(piece, statement, whole.module_frame, body, index)
            memo.replace(statement, "facts-records", piece)
        for name in _RECORDS:
            getattr(whole, name).extend(getattr(piece, name))
    return whole


# The expressions ScriptFacts.binding_values follows to others (any other stands for itself alone).
_FOLLOWED = (cst.IfExp, cst.BooleanOperation, cst.Name, cst.Attribute)


# What a collector records, in the order of the statements walked.
_RECORDS = ("calls", "withs", "functions", "classes", "bindings", "imports", "star_imports", "references")


def _moved_records(piece: _Collector, statement: cst.CSTNode, root: Frame, body: tuple[cst.CSTNode, ...],
                   index: dict[int, int]) -> _Collector:
    """The records ``piece`` made of ``statement`` for another module, made for the one whose frame is
    ``root`` and whose statements are ``body``: the same nodes, in contexts that end at ``root``, and the
    top-level statement at its place in ``body``."""
    top = Statement(statement, body, index.get(id(statement), 0))

    def placed(found: Statement | None) -> Statement | None:
        return top if found is not None and found.node is statement else found

    out = _Collector(root.node, root)  # type: ignore[arg-type]
    out.blocks, out.block_index = [body], [index]
    if piece.module_frame is root:  # the same frames: only the records of the statement itself move
        for name in _RECORDS:
            setattr(out, name, getattr(piece, name))
        # What it kept for the next text stays right: the calls and bindings moved keep their places.
        out.keep, out.frames_made, out.frame_list = piece.keep, piece.frames_made, piece.frame_list
        out.inner, out.inner_list = piece.inner, piece.inner_list
        out.calls = [c if placed(c.statement) is c.statement else CallSite(c.node, c.name, c.qualname, c.ctx, top)
                     for c in piece.calls]
        out.bindings = [b if placed(b.statement) is b.statement else Binding(b.target, b.value, b.ctx, top)
                        for b in piece.bindings]
        return out
    frames: dict[int, Frame] = {id(piece.module_frame): root}

    def moved(frame: Frame) -> Frame:
        new = frames.get(id(frame))
        if new is None:
            assert frame.parent is not None
            new = frames[id(frame)] = Frame(frame.kind, frame.node, moved(frame.parent))
        return new

    out.calls = [CallSite(c.node, c.name, c.qualname, moved(c.ctx), placed(c.statement)) for c in piece.calls]
    out.withs = [(node, moved(frame)) for node, frame in piece.withs]
    out.functions = [(node, moved(frame)) for node, frame in piece.functions]
    out.classes = [(node, moved(frame)) for node, frame in piece.classes]
    out.bindings = [Binding(b.target, b.value, moved(b.ctx), placed(b.statement)) for b in piece.bindings]
    out.imports = [ImportSite(i.node, i.local, i.qualname, moved(i.ctx), i.in_import_error_fallback)
                   for i in piece.imports]
    out.star_imports = list(piece.star_imports)
    out.references = [(node, dotted, moved(frame)) for node, dotted, frame in piece.references]
    return out


class ScriptFacts:
    """Everything the script rules know about one file."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self.module = source.module
        memo = active_memo()
        document = memo is not None and memo.document is source
        collector = _collect(self.module, document)
        # The document's analysis these facts are of (its memo and number): the next one shares their
        # frames, made its own nodes' (:func:`_collect`), so what is asked of these after it began may be
        # of the next text (:attr:`outdated`).
        self._analysis = (memo, memo.analyses) if document else None
        self.module_frame = collector.module_frame
        self.imports = collector.imports
        self.star_imports = collector.star_imports
        self.bindings = collector.bindings
        self.withs = collector.withs
        self.functions = collector.functions
        self.classes = collector.classes
        self._raw_references = collector.references
        self._resolved: dict[str, str | None] = {}
        self._import_map: dict[str, list[str]] = {}
        for site in self.imports:
            self._import_map.setdefault(site.local, []).append(site.qualname)
        self.calls = [
            CallSite(c.node, c.name, self.resolve(c.name), c.ctx, c.statement) for c in collector.calls
        ]
        self._bindings_by_target: dict[str, list[Binding]] = {}
        self._binding_values: dict[int, tuple[cst.BaseExpression, tuple[cst.BaseExpression, ...]]] = {}
        for binding in self.bindings:
            self._bindings_by_target.setdefault(binding.target, []).append(binding)
        self._positions = None
        self._with_kinds: dict[int, frozenset[str]] = {}
        self._function_is_eval: dict[int, bool] = {}
        self._derived: dict[object, object] = {}

    def derived(self, key: object, build: "Callable[[ScriptFacts], _T]") -> "_T":
        """What ``build(self)`` makes of these facts (a layer of facts above them, a file's project), made once
        and kept on them, so that it lives exactly as long as they do. (Kept in a module-level weak map
        instead, a value that refers back to its facts keeps them alive for good: an editor's every
        analysis stayed in memory.)"""
        found = self._derived.get(key, _NOT_LOOKED_UP)
        if found is _NOT_LOOKED_UP:
            found = self._derived[key] = build(self)
        return found  # type: ignore[return-value]

    # -- names --------------------------------------------------------------------------------------
    def resolve(self, dotted: str | None) -> str | None:
        """``ac`` → ``torch.cuda.amp.autocast``; ``O.SGD`` → ``torch.optim.SGD``; None when not imported.
        Kept per name (a file's references repeat the same few names thousands of times)."""
        if not dotted:
            return None
        try:
            return self._resolved[dotted]
        except KeyError:
            found = self._resolved[dotted] = self._resolve(dotted)
            return found

    def _resolve(self, dotted: str) -> str | None:
        head, _, rest = dotted.partition(".")
        quals = self._import_map.get(head)
        if quals:
            qual = quals[0]
            return f"{qual}.{rest}" if rest else qual
        for module in self.star_imports:
            if head in _STAR_EXPORTS.get(module, ()):
                return f"{module}.{dotted}"
        return None

    def code(self, node: cst.CSTNode) -> str:
        """``module.code_for_node(node)``, remembered per node while an analysis keeps a memo: the rules
        read the code of the same receivers and statements at every edit of a long file."""
        module = self.module
        return remembered(node, ("code", module.default_indent, module.default_newline),
                          lambda: module.code_for_node(node))

    def qualname(self, expr: cst.BaseExpression | None) -> str | None:
        if expr is None:
            return None
        return self.resolve(full_name(expr))

    @functools.cached_property
    def references(self) -> list[Reference]:
        out = []
        for node, dotted, ctx in self._raw_references:
            qual = self.resolve(dotted)
            if qual is not None:
                out.append(Reference(node, dotted, qual, ctx))
        return out

    @functools.cached_property
    def referenced_qualnames(self) -> frozenset[str]:
        """The qualified names :attr:`references` has, from the few hundred names a file writes (not its
        ten thousand references one by one)."""
        resolved = map(self.resolve, {dotted for _, dotted, _ in self._raw_references})
        return frozenset(qual for qual in resolved if qual)

    def references_to(self, *prefixes: str) -> list[Reference]:
        if not any(qual.startswith(prefixes) for qual in self.referenced_qualnames):
            return []
        return [r for r in self.references if r.qualname and r.qualname.startswith(prefixes)]

    def imported_roots(self) -> set[str]:
        return {site.qualname.split(".")[0] for site in self.imports} | {
            m.split(".")[0] for m in self.star_imports
        }

    def bindings_of(self, target: str) -> list[Binding]:
        return self._bindings_by_target.get(target, [])

    def mentions(self, dotted: str) -> int:
        """How often ``dotted`` is written: each Name node of a plain name; for a dotted name
        (``self.scaler``), each attribute chain that is it or starts with it (``self.scaler.step``)."""
        if "." in dotted:
            return sum(1 for _, r, _ in self._raw_references if r == dotted or r.startswith(dotted + "."))
        return sum(1 for _, r, _ in self._raw_references if r == dotted)

    def binding_values(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        """The expressions a name may stand for (itself included), following simple assignments
        and both branches of conditional expressions (``a if c else b``, ``a or b``). A new list (the
        answer is kept per expression: the rules ask it of the same names many times)."""
        found = self._binding_values.get(id(expr))
        if found is None or found[0] is not expr:
            found = self._binding_values[id(expr)] = (expr, tuple(self._following(expr)))
        return list(found[1])

    def following(self, expr: cst.BaseExpression) -> Iterable[cst.BaseExpression]:
        """:meth:`binding_values` one by one, in its order, for a caller that may stop at the first few
        (a callee with an unknown value among many: ``self.relu(x)`` of thirty blocks' ``self.relu = ...``)."""
        found = self._binding_values.get(id(expr))
        if found is not None and found[0] is expr:
            return found[1]
        return self._following(expr)

    def _following(self, expr: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
        stack = [(expr, 0)]
        seen: set[int] = set()
        while stack:
            node, level = stack.pop()
            if id(node) in seen or level > 6:
                continue
            seen.add(id(node))
            yield node
            # ``type() is``: these classes have no subclasses, and ``isinstance`` of LibCST's classes runs
            # ABCMeta's check in Python (asked for every call of a file).
            kind = type(node)
            if kind is cst.IfExp:
                stack += [(node.body, level + 1), (node.orelse, level + 1)]
            elif kind is cst.BooleanOperation:
                stack += [(node.left, level + 1), (node.right, level + 1)]
            elif kind is cst.Name or kind is cst.Attribute:
                dotted = full_name(node)
                if dotted:
                    for binding in self.bindings_of(dotted):
                        stack.append((binding.value, level + 1))

    # -- positions ----------------------------------------------------------------------------------
    def position(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:
            self._positions = code_positions(self.module)
        return self._positions[node]

    def line_of(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    @property
    def outdated(self) -> bool:
        """Whether these are the facts of an editor document's text whose next analysis has begun: that
        analysis makes the frames of the statements an edit remade its own nodes', so a fix planned from
        these now could be planned from the next text's (tcaudit/planned_edits.py makes none then)."""
        return self._analysis is not None and self._analysis[0].analyses != self._analysis[1]

    def scope_name(self, node: cst.CSTNode) -> str:
        """The names of the functions whose lines hold ``node``'s first line, outermost first,
        dotted (``Trainer.fit.step`` without the class: ``fit.step``). Those are the functions around
        ``node`` (and ``node`` itself) that the facts record, whose ``def`` line is not below it (a
        decorator's line is above its function's)."""
        line = self.line_of(node)
        parents = parent_map(self.module)
        recorded = self._recorded_functions
        chain = []
        current: cst.CSTNode | None = node
        while current is not None:
            if (type(current) is cst.FunctionDef and id(current) in recorded
                    and self.position(current).start.line <= line):
                chain.append(current.name.value)
            current = parents.get(id(current))
        return ".".join(reversed(chain))

    @functools.cached_property
    def _recorded_functions(self) -> frozenset[int]:
        """The functions the facts record (not those inside generated code), by ``id``."""
        return frozenset(id(fn) for fn, _ in self.functions)

    # -- calls --------------------------------------------------------------------------------------
    def calls_to(self, *qualnames: str) -> list[CallSite]:
        wanted = set(qualnames)
        return [c for c in self.calls if c.qualname in wanted]

    def method_calls(self, *methods: str) -> list[CallSite]:
        if len(methods) == 1:
            return list(self._calls_by_method.get(methods[0], ()))
        wanted = set(methods)
        return [c for c in self.calls if c.method in wanted]

    @functools.cached_property
    def _calls_by_method(self) -> dict[str | None, list[CallSite]]:
        table: dict[str | None, list[CallSite]] = {}
        for call in self.calls:
            table.setdefault(call.method, []).append(call)
        return table

    def calls_within(self, node: cst.CSTNode) -> list[CallSite]:
        """The calls whose context is inside ``node`` (a frame's node: a function, a loop, a ``with``, a
        branch), in source order: ``[c for c in calls if c.ctx.inside(node)]`` from an index."""
        return list(self._calls_by_frame_node.get(id(node), ()))

    @functools.cached_property
    def _calls_by_frame_node(self) -> dict[int, list[CallSite]]:
        # Indexed once: rules asked ``ctx.inside`` of every call for each loop and function (quadratic).
        table: dict[int, list[CallSite]] = {}
        for call in self.calls:
            for frame in call.ctx.chain():
                calls = table.setdefault(id(frame.node), [])
                if not calls or calls[-1] is not call:  # an ``if`` and its ``else`` frame share a node
                    calls.append(call)
        return table

    def calls_in(self, function: cst.FunctionDef | None) -> list[CallSite]:
        return self._calls_by_function.get(id(function), [])

    @functools.cached_property
    def _calls_by_function(self) -> dict[int, list[CallSite]]:
        # Indexed once: rules ask for the calls of every training step's function, and a scan over
        # all calls each time made files of many steps quadratic.
        table: dict[int, list[CallSite]] = {}
        for call in self.calls:
            table.setdefault(id(call.ctx.function), []).append(call)
        return table

    def call_of(self, func: cst.CSTNode) -> CallSite | None:
        """The call whose callee is the node ``func`` (``torch.cuda.amp.autocast`` in ``...autocast()``)."""
        return self._call_by_callee.get(id(func))

    @functools.cached_property
    def _call_by_callee(self) -> dict[int, CallSite]:
        # Indexed once: a rule asking this for each reference of a name scanned every call each time.
        table: dict[int, CallSite] = {}
        for call in self.calls:
            table.setdefault(id(call.node.func), call)
        return table

    def training_steps_in(self, function: cst.FunctionDef | None) -> list[TrainingStep]:
        """The training steps whose backward is in ``function`` (None: at the module level)."""
        return self._steps_by_function.get(id(function), [])

    @functools.cached_property
    def _steps_by_function(self) -> dict[int, list[TrainingStep]]:
        table: dict[int, list[TrainingStep]] = {}
        for step in self.training_steps:
            table.setdefault(id(step.function), []).append(step)
        return table

    @functools.cached_property
    def functions_by_name(self) -> dict[str, list[cst.FunctionDef]]:
        table: dict[str, list[cst.FunctionDef]] = {}
        for node, _ in self.functions:
            table.setdefault(node.name.value, []).append(node)
        return table

    @functools.cached_property
    def classes_by_name(self) -> dict[str, cst.ClassDef]:
        """The classes of this file by name (of two with one name, the later); read it, do not change it."""
        return {node.name.value: node for node, _ in self.classes}

    # -- classification -----------------------------------------------------------------------------
    def is_autocast_expr(self, expr: cst.BaseExpression) -> bool:
        """True when ``expr`` may be (or make) an autocast context: a direct call, an alias,
        ``partial(torch.autocast, ...)``, ``nullcontext() if x else autocast(...)``, a helper whose
        return or ``yield`` sits under autocast, or a name that says so."""
        return self._autocast_expr(expr, 0)

    def _autocast_expr(self, expr: cst.BaseExpression, depth: int) -> bool:
        if depth > 4:
            return False
        for value in self.binding_values(expr):
            target = value.func if isinstance(value, cst.Call) else value
            dotted = full_name(target)
            qual = self.resolve(dotted)
            if qual in AUTOCAST_QUALNAMES or (qual and qual.endswith(".autocast")):
                return True
            if dotted and "autocast" in dotted.split(".")[-1].lower():
                return True
            if isinstance(value, cst.Call):
                if qual in ("functools.partial",) or dotted == "partial":
                    if value.args and self._autocast_expr(value.args[0].value, depth + 1):
                        return True
                if target is not value and self._autocast_expr(target, depth + 1):
                    return True
                short = (dotted or "").removeprefix("self.")
                if short and "." not in short:
                    for fn in self.functions_by_name.get(short, []):
                        if self._function_makes_autocast(fn, depth + 1):
                            return True
        return False

    def _function_makes_autocast(self, fn: cst.FunctionDef, depth: int) -> bool:
        for node, ctx in self.withs:
            if ctx.function is fn or ctx.inside(fn):
                if any(self._autocast_expr(item.item, depth) for item in node.items):
                    return True
        for call in self.calls:
            if call.ctx.function is fn and self._autocast_expr(call.node, depth + 1) and call.qualname:
                return True
        return False

    def with_kinds(self, node: cst.With) -> frozenset[str]:
        # A per-instance cache: an lru_cache on the method would keep every file's facts (and CST)
        # alive for the life of the process.
        cached = self._with_kinds.get(id(node))
        if cached is None:
            cached = self._with_kinds[id(node)] = self._compute_with_kinds(node)
        return cached

    def _compute_with_kinds(self, node: cst.With) -> frozenset[str]:
        kinds = set()
        for item in node.items:
            expr = item.item
            qual = self.qualname(expr.func if isinstance(expr, cst.Call) else expr)
            if qual in NO_GRAD_QUALNAMES:
                kinds.add("eval")
            elif qual == "torch.set_grad_enabled" and isinstance(expr, cst.Call):
                arg = expr.args[0].value if expr.args else None
                if isinstance(arg, cst.Name) and arg.value == "False":
                    kinds.add("eval")
            if self.is_autocast_expr(expr):
                disabled = isinstance(expr, cst.Call) and any(
                    arg.keyword is not None and arg.keyword.value == "enabled"
                    and isinstance(arg.value, cst.Name) and arg.value.value == "False"
                    for arg in expr.args
                )
                kinds.add("autocast-off" if disabled else "autocast")
        return frozenset(kinds)

    def function_is_eval(self, fn: cst.FunctionDef) -> bool:
        cached = self._function_is_eval.get(id(fn))
        if cached is None:
            cached = self._function_is_eval[id(fn)] = self._compute_function_is_eval(fn)
        return cached

    def _compute_function_is_eval(self, fn: cst.FunctionDef) -> bool:
        for decorator in fn.decorators:
            dec = decorator.decorator
            qual = self.qualname(dec.func if isinstance(dec, cst.Call) else dec)
            if qual in NO_GRAD_QUALNAMES:
                return True
        if _EVAL_FUNCTION.match(fn.name.value):
            return not any(c.method == "backward" for c in self.calls_within(fn))
        return False

    def function_has_autocast_decorator(self, fn: cst.FunctionDef) -> bool:
        return any(self.is_autocast_expr(d.decorator) for d in fn.decorators)

    def in_eval(self, ctx: Frame) -> bool:
        for frame in ctx.chain():
            if frame.kind == "with" and "eval" in self.with_kinds(frame.node):  # type: ignore[arg-type]
                return True
            if frame.kind == "def" and self.function_is_eval(frame.node):  # type: ignore[arg-type]
                return True
        return False

    def autocast_frame(self, ctx: Frame) -> Frame | None:
        """The innermost ``with`` (or decorated def) that turns autocast on around ``ctx``; None when
        there is none or a nearer ``autocast(..., enabled=False)`` turns it off."""
        nearest = self._nearest_autocast(ctx)
        return nearest[1] if nearest is not None and nearest[0] else None

    def in_autocast(self, ctx: Frame) -> bool:
        return self.autocast_frame(ctx) is not None

    def autocast_turned_off(self, ctx: Frame) -> bool:
        """Whether the nearest autocast around ``ctx`` is ``autocast(..., enabled=False)``."""
        nearest = self._nearest_autocast(ctx)
        return nearest is not None and not nearest[0]

    def _nearest_autocast(self, ctx: Frame) -> tuple[bool, Frame] | None:
        """(whether it turns autocast on, the frame) for the innermost autocast ``with`` or decorated def
        around ``ctx``; None where there is none."""
        for frame in ctx.chain():
            if frame.kind == "with":
                kinds = self.with_kinds(frame.node)  # type: ignore[arg-type]
                if "autocast-off" in kinds:
                    return False, frame
                if "autocast" in kinds:
                    return True, frame
            if frame.kind == "def" and self.function_has_autocast_decorator(frame.node):  # type: ignore[arg-type]
                return True, frame
        return None

    @functools.cached_property
    def autocast_withs(self) -> list[tuple[cst.With, Frame]]:
        return [(node, ctx) for node, ctx in self.withs if "autocast" in self.with_kinds(node)]

    # -- training -----------------------------------------------------------------------------------
    @functools.cached_property
    def frameworks(self) -> dict[str, str]:
        """Frameworks that own the loop or the precision in this file: name → why."""
        found: dict[str, str] = {}
        for site in self.imports:
            root = site.qualname.lstrip(".").split(".")[0]
            if root in _FRAMEWORK_ROOTS:
                found.setdefault(_FRAMEWORK_ROOTS[root], f"imports {site.qualname}")
        quals = self.referenced_qualnames
        if any(q.startswith("torch.distributed.fsdp") and "MixedPrecision" in q for q in quals):
            found.setdefault("fsdp", "FSDP MixedPrecision policy")
        if any(q.startswith("transformers") and q.split(".")[-1] in ("Trainer", "Seq2SeqTrainer") for q in quals):
            found.setdefault("transformers", "transformers Trainer")
        # apex imported but only for FusedAdam/LayerNorm does not own precision.
        if "apex" in found and not any(q.startswith("apex.amp") for q in quals):
            del found["apex"]
        if "accelerate" in found and not any(q.startswith("accelerate.Accelerator") for q in quals):
            del found["accelerate"]
        return found

    @functools.cached_property
    def uses_accelerator(self) -> bool:
        """Whether the script can run on a GPU at all; a CPU-only script gets no AMP advice, nor one
        whose trained models it keeps on the CPU itself (:attr:`trains_on_cpu_on_purpose`)."""
        if self.trains_on_cpu_on_purpose:
            return False
        return code_matches(_ACCELERATOR_TEXT, self.source.text)

    @functools.cached_property
    def optimized_models(self) -> frozenset[str] | None:
        """The names whose parameters the script's optimizers train (``SGD(model_0.parameters())``);
        None where an optimizer's parameters come from anything else (a list built elsewhere)."""
        owners: set[str] = set()
        for call in self.calls:
            qual = call.qualname or ""
            if not qual.startswith("torch.optim.") or "lr_scheduler" in qual or "swa_utils" in qual:
                continue
            params = call.arg("params", 0)
            found = _parameters_owners(params) if params is not None else set()
            if not found:
                return None
            owners |= found
        return frozenset(owners)

    @functools.cached_property
    def models_kept_on_cpu(self) -> frozenset[str]:
        """Of :attr:`optimized_models`, those the script itself puts on the CPU and moves nowhere else
        (``model_0 = Net().to("cpu")``)."""
        kept = set()
        for owner in self.optimized_models or ():
            moves = [site.node for site in self.calls
                     if site.method in ("to", "cuda", "cpu") and site.receiver_name == owner]
            for binding in self.bindings_of(owner):
                value = binding.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                    if value.func.attr.value in ("to", "cuda", "cpu"):
                        moves.append(value)
                    value = value.func.value
            verdicts = [self._host_move(move) for move in moves]
            if True in verdicts and False not in verdicts:
                kept.add(owner)
        return frozenset(kept)

    @functools.cached_property
    def trains_on_cpu_on_purpose(self) -> bool:
        """Every model the script's optimizers train (``SGD(model_0.parameters())``) is put on the CPU by the
        script itself and moved nowhere else: ``model_0 = Net().to("cpu")``, ``model_0.cpu()``,
        ``.to(torch.device("cpu"))``. A teaching notebook's baseline trained on the CPU beside a
        ``device = "cuda" if ... else "cpu"`` it does not use for that model: GPU advice (autocast, DDP,
        pinned memory, fused optimizers) would change what the user chose. Also a script whose trained
        models never leave the CPU (:attr:`models_never_leave_cpu`): on a GPU machine its CUDA autocast
        would not touch its CPU tensors and a compile would build CPU code. False where an optimizer's
        parameters come from anything else, or a model may be moved somewhere."""
        owners = self.optimized_models
        return bool(owners) and (owners == self.models_kept_on_cpu or self.models_never_leave_cpu)

    @functools.cached_property
    def models_never_leave_cpu(self) -> bool:
        """The script's trained models stay where torch builds them, on the CPU, on any machine (issue 53:
        graykode/nlp-tutorial's module-level Transformer): each is built by a class or function of this
        file or of torch/torchvision/timm (no ``device=``), is never moved (``.to``, ``.cuda``) nor handed
        to a call other than one of this file or torch's, and nothing in the file may put anything on an
        accelerator: no CUDA, MPS or XPU named (``torch.cuda.is_available()`` included: a script that
        asks has a GPU branch), no ``.to(x)`` or ``.cuda()`` to anything but the CPU or a dtype, no
        ``device=`` but ``"cpu"``, no default device set. Reads only this file: a model built by another
        module's factory is not judged (False)."""
        owners = self.optimized_models
        text = self.source.text
        if not owners or code_matches(_CUDA_TEXT, text) or code_matches(_OTHER_ACCELERATORS, text):
            return False
        for call in self.calls:
            qual = call.qualname or ""
            if call.method == "cuda" or qual in _DEFAULT_DEVICE_SETTERS:
                return False
            if call.method == "to" and self._host_move(call.node) is False:
                return False
            device = keyword(call.node, "device")
            if device is not None and not _names_cpu(self, device.value):
                return False
            if qual == "torch.device" and call.node.args and not _names_cpu(self, call.node.args[0].value):
                return False
        return all(self._stays_where_built(owner) for owner in owners)

    def _stays_where_built(self, owner: str) -> bool:
        """``owner`` (a trained model's name) is built here by a call of this file or of a package that
        builds on the CPU, and no call but one of this file's or torch's receives it."""
        bindings = self.bindings_of(owner)
        if not bindings or owner.startswith("self."):
            return False
        for binding in bindings:
            value = binding.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in (
                    "train", "float", "requires_grad_", "apply"):
                value = value.func.value
            if not isinstance(value, cst.Call):
                return False
            callee = full_name(value.func) or ""
            qual = self.resolve(callee) or ""
            if not (self._defined_here(callee) or qual.startswith(_CPU_BUILDERS) and not _DEVICE_WRAPPERS.search(qual)):
                return False
        for call in self.calls:
            passed = [arg.value for arg in call.node.args]
            if not any(isinstance(v, (cst.Name, cst.Attribute)) and full_name(v) == owner for v in passed):
                continue
            qual = call.qualname or ""
            torch_call = qual.startswith("torch.") and not _DEVICE_WRAPPERS.search(qual)
            if not (self._defined_here(call.name or "") or torch_call):
                return False
        return True

    def _defined_here(self, callee: str) -> bool:
        """``callee`` (a dotted name as written) is a class or a function of this file."""
        return callee in self.classes_by_name or callee in self.functions_by_name

    def _host_move(self, call: cst.Call) -> bool | None:
        """True: ``call`` (``x.to(...)``, ``x.cuda()``, ``x.cpu()``) moves to the CPU; False: somewhere
        else or unknown; None: it moves to no device (``.to(torch.float64)``)."""
        assert isinstance(call.func, cst.Attribute)
        method = call.func.attr.value
        if method != "to":
            return method == "cpu"
        found = keyword(call, "device") or keyword(call, None, 0)
        if found is None:
            return None
        value = found.value
        if isinstance(value, cst.SimpleString):
            return str(evaluated_value(value)) == "cpu"
        if isinstance(value, cst.Call) and self.qualname(value.func) == "torch.device" and value.args:
            first = value.args[0].value
            return isinstance(first, cst.SimpleString) and str(evaluated_value(first)) == "cpu"
        qual = self.qualname(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        if qual and qual.startswith("torch.") and qual != "torch.device" and not self.bindings_of(qual):
            return None  # a dtype: torch.float16, torch.bfloat16
        return False

    @functools.cached_property
    def uses_cuda(self) -> bool:
        """Whether the script may put its work on a CUDA GPU: CUDA named in the code (``"cuda:0"``,
        ``torch.device("cuda", 0)``, ``.cuda()``), or a device that can only be a GPU or is chosen
        outside this file: ``device = 0`` / ``.to(1)`` (an integer device is a CUDA ordinal), ``.to(device)``
        with ``device`` a parameter (``def train(model, device, loader)``, ``Trainer(gpu_id)``) or a
        command-line setting (``args.gpu``). A script whose every device is visibly ``"cpu"`` (or that
        has none) is CPU-only and gets no GPU advice, as is one whose trained models it keeps on the CPU
        itself (:attr:`trains_on_cpu_on_purpose`)."""
        if self.trains_on_cpu_on_purpose:
            return False
        if code_matches(_CUDA_TEXT, self.source.text):
            return True
        for call in self.calls:
            if call.method in ("to", "cuda") or call.qualname == "torch.device":
                device = call.arg("device", 0)
                if device is not None and self.device_may_be_cuda(device, call.ctx.function):
                    return True
        return False

    def device_may_be_cuda(self, expr: cst.BaseExpression, fn: cst.FunctionDef | None = None, depth: int = 0) -> bool:
        """Whether a device expression may name a CUDA device: an integer, a ``cuda`` string, or a
        device-named value this file does not fix (a parameter whose callers are not all known, an
        ``args.*`` setting). ``"cpu"``, dtypes and other tensors are not."""
        if depth > 3:
            return False
        for value in self.binding_values(expr):
            if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                continue
            if isinstance(value, cst.Integer):
                return True
            if isinstance(value, cst.SimpleString):
                text = str(evaluated_value(value))
                if text.split(":")[0] == "cuda" or text.isdigit():
                    return True
                continue
            if isinstance(value, cst.Call):
                if self.qualname(value.func) == "torch.device" and value.args:
                    if self.device_may_be_cuda(value.args[0].value, fn, depth + 1):
                        return True
                continue
            if not isinstance(value, (cst.Name, cst.Attribute)):
                continue
            dotted = full_name(value)
            if not dotted or self.bindings_of(dotted):
                continue  # followed by binding_values
            last = dotted.split(".")[-1]
            if not _DEVICE_NAME.search(last):
                continue  # a dtype, a tensor, a module: not a device
            if "." in dotted and not dotted.startswith("self."):
                return True  # ``args.gpu``, ``cfg.device``: chosen on the command line or in a config
            if self._parameter_may_be_cuda(last, depth):
                return True
        return False

    def _parameter_may_be_cuda(self, name: str, depth: int) -> bool:
        """A device-named parameter: CUDA-capable unless every caller in this file passes a host device."""
        functions = [
            fn for fn, _ in self.functions
            if name in {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
        ]
        if not functions:
            return True  # a global set outside this file (``exec``, a star import)
        for fn in functions:
            positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
            index = positional.index(name) if name in positional else None
            callers = callers_of(self, fn, outside=True)
            if not callers and fn.name.value == "__init__":
                cls = next((c for c, _ in self.classes if _defines(c, fn)), None)
                if cls is not None:
                    callers = callers_of(self, cls, how="bare")
                    index = index - 1 if index is not None and positional[:1] == ["self"] else index
            elif index is not None and positional[:1] in (["self"], ["cls"]):
                index -= 1
            if not callers:
                return True
            for caller in callers:
                arg = caller.arg(name, index)
                if arg is None or self.device_may_be_cuda(arg, caller.ctx.function, depth + 1):
                    return True
        return False

    @functools.cached_property
    def autograd_function_classes(self) -> set[cst.ClassDef]:
        out = set()
        for node, _ in self.classes:
            for base in node.bases:
                qual = self.qualname(base.value) or full_name(base.value) or ""
                if qual.endswith(("autograd.Function", "Function")):
                    out.add(node)
        return out

    @functools.cached_property
    def scalers(self) -> set[str]:
        """Dotted names bound to a GradScaler (conditionally or not)."""
        out: set[str] = set()
        if "GradScaler" not in self.source.text:  # a qualified name ends in a name the text holds
            return out
        for binding in self.bindings:
            for value in self.binding_values(binding.value):
                if isinstance(value, cst.Call):
                    qual = self.qualname(value.func) or full_name(value.func) or ""
                    if qual.endswith(GRADSCALER_SUFFIXES):
                        out.add(binding.target)
        return out

    @functools.cached_property
    def mentions_gradscaler(self) -> bool:
        """Any GradScaler in the file, however it is named or wrapped (``loss_scaler = NativeScaler()``
        counts too): a scaler object whose ``scale``/``step``/``update`` are called."""
        # (A written name is in the text: no "Scaler" there, none among the names.)
        if "Scaler" in self.source.text and any(
            "GradScaler" in dotted or "Scaler" in dotted.split(".")[-1] for _, dotted, _ in self._raw_references
        ):
            return True
        return any(c.method in ("scale", "unscale_") and c.receiver_name for c in self.calls)

    @functools.cached_property
    def optimizers(self) -> set[str]:
        out = set()
        for binding in self.bindings:
            value = binding.value
            kind = type(value)
            # A call or a literal stands for itself alone (:meth:`binding_values`): only names and
            # conditional expressions are followed (asked of every binding of a file).
            if kind is cst.Call:
                values: Iterable[cst.BaseExpression] = (value,)
            elif kind in _FOLLOWED:
                values = self.binding_values(value)
            else:
                continue
            for value in values:
                if type(value) is cst.Call:
                    qual = self.qualname(value.func) or ""
                    if is_optimizer(qual):
                        out.add(binding.target)
        return out

    def is_optimizer_name(self, dotted: str | None) -> bool:
        if not dotted:
            return False
        if dotted in self.optimizers:
            return True
        if dotted in self.scalers or _SCHEDULER_NAME.search(dotted.split(".")[-1]):
            return False
        return bool(_OPTIMIZER_NAME.search(dotted))

    @functools.cached_property
    def optimizer_steps(self) -> list[CallSite]:
        """``opt.step()`` and ``scaler.step(opt)`` calls in training code (not ``env.step(a)``)."""
        out = []
        for call in self.method_calls("step"):
            receiver = call.receiver_name
            if receiver in self.scalers:
                out.append(call)
            elif self.is_optimizer_name(receiver) and not self.in_eval(call.ctx):
                positional = [a for a in call.node.args if a.keyword is None]
                if len(positional) <= 1:  # step() or step(closure)
                    out.append(call)
        return out

    @functools.cached_property
    def training_steps(self) -> list[TrainingStep]:
        steps = []
        for call in self.method_calls("backward"):
            receiver = call.receiver
            if receiver is None or self.in_eval(call.ctx):
                continue
            cls = call.ctx.class_def
            if cls is not None and cls in self.autograd_function_classes:
                continue
            receiver_name = full_name(receiver)
            positional = [a for a in call.node.args if a.keyword is None]
            if receiver_name and positional and re.search(r"accelerator|engine|fabric|deepspeed", receiver_name):
                continue  # a framework's backward(loss)
            if receiver_name and self.resolve(receiver_name) is not None:
                continue  # ``torch.autograd.backward(t)``, ``dist_autograd.backward(ctx, [l])``: a module, not a loss
            scaler = None
            if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
                if receiver.func.attr.value == "scale":
                    scaler = full_name(receiver.func.value)
            steps.append(TrainingStep(call, receiver, scaler))
        return steps

    @functools.cached_property
    def updates_parameters(self) -> bool:
        """Whether the file updates weights: an optimizer step, or a manual update from ``.grad``
        (``p.data.add_(-lr * p.grad)``, ``p -= lr * p.grad``). Backward alone (gradient checks,
        autograd tests) is not training."""
        if self.optimizer_steps:
            return True
        return bool(re.search(r"\.grad\b", self.source.text)) and bool(
            re.search(r"\.(add_|sub_|copy_|addcmul_|addcdiv_)\(|-=", self.source.text)
        )

    def step_functions(self) -> list[cst.FunctionDef | None]:
        seen: list[cst.FunctionDef | None] = []
        for step in self.training_steps:
            if step.function not in seen:
                seen.append(step.function)
        return seen

    @functools.cached_property
    def model_names(self) -> set[str]:
        """Dotted names that hold the trained model: passed to an optimizer as ``X.parameters()``,
        or bound to a module construction with a model-like name."""
        out = set()
        for call in self.calls:
            qual = call.qualname or ""
            if is_optimizer(qual) or call.method == "parameters":
                for arg in call.node.args:
                    value = arg.value
                    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                        if value.func.attr.value in ("parameters", "named_parameters"):
                            name = full_name(value.func.value)
                            if name:
                                out.add(name)
        for binding in self.bindings:
            if (_MODEL_NAME.search(binding.target) and not _MODEL_DESCRIPTION.search(binding.target)
                    and isinstance(binding.value, cst.Call)):
                out.add(binding.target)
        return out


def loss_statements(facts: ScriptFacts, step: TrainingStep) -> list[Statement]:
    """The statements of the step's block that compute its loss: the statement assigning the
    backward's receiver and, going up, the assignments it reads from (forward and loss), stopping at
    device moves, loader reads and ``zero_grad``. Empty when the loss comes from elsewhere."""
    statement = step.backward.statement
    if statement is None:
        return []
    loss = step.loss
    if isinstance(loss, cst.Call) and loss.args:  # scaler.scale(loss)
        loss = loss.args[0].value
    wanted = names_in(loss)
    chosen: list[Statement] = []
    for index in range(statement.index - 1, -1, -1):
        node = statement.block[index]
        targets = assigned_names(node)
        if not targets or not (targets & wanted):
            continue
        if _is_data_movement(node):
            break
        chosen.append(Statement(node, statement.block, index))
        wanted |= names_in(node)
    if isinstance(step.loss, cst.Call) and not chosen:
        return []
    chosen.reverse()
    return chosen


_DATA_METHODS = frozenset({"to", "cuda", "cpu", "pin_memory", "step", "reset", "item", "numpy"})


def _is_data_movement(statement: cst.CSTNode) -> bool:
    """An assignment whose every value is a device move, a loader read or an environment step
    (``x, y = x.cuda(), y.cuda()``, ``batch = next(it)``, ``s, r, d, _ = env.step(a)``): the forward
    starts after it."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    values: list[cst.BaseExpression] = []
    for small in statement.body:
        if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
            value = small.value
            values.extend(e.value for e in value.elements) if isinstance(value, cst.Tuple) else values.append(value)
    if not values:
        return False
    for value in values:
        if not isinstance(value, cst.Call):
            return False
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value in _DATA_METHODS:
            continue
        if isinstance(func, cst.Name) and func.value == "next":
            continue
        return False
    return True


def assigned_names(node: cst.CSTNode) -> set[str]:
    """The dotted names a simple statement assigns (tuple targets unpacked); empty for anything else."""
    out: set[str] = set()
    if isinstance(node, cst.SimpleStatementLine):
        for small in node.body:
            targets: Iterable[cst.BaseExpression] = ()
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets = [small.target]
            for target in targets:
                for element in target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]:
                    value = element.value if isinstance(element, cst.Element) else element
                    dotted = full_name(value)
                    if dotted:
                        out.add(dotted)
    return out


def _defines(cls: cst.ClassDef, fn: cst.FunctionDef) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(statement is fn for statement in body)


def _parameters_owners(params: cst.BaseExpression) -> set[str]:
    """The names whose ``.parameters()`` (``model.fc.parameters()`` counts as ``model``) an optimizer's
    ``params`` argument is made of, in a list of groups too; empty where any part is something else."""
    owners: set[str] = set()
    parts: list[cst.BaseExpression] = [params]
    while parts:
        part = parts.pop()
        if isinstance(part, (cst.List, cst.Tuple)):
            parts.extend(element.value for element in part.elements)
        elif isinstance(part, cst.Dict):
            for element in part.elements:
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                    if evaluated_value(element.key) == "params":
                        parts.append(element.value)
        elif (isinstance(part, cst.Call) and isinstance(part.func, cst.Attribute)
              and part.func.attr.value == "parameters"):
            dotted = full_name(part.func.value)
            if not dotted:
                return set()
            owners.add(dotted.split(".")[0] if not dotted.startswith("self.") else ".".join(dotted.split(".")[:2]))
        else:
            return set()
    return owners


def _names_cpu(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    """``expr`` names the CPU in every value it may take: ``"cpu"``, ``torch.device("cpu")``."""
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue
        if isinstance(value, cst.SimpleString) and evaluated_value(value) == "cpu":
            continue
        if isinstance(value, cst.Call) and facts.qualname(value.func) == "torch.device" and value.args:
            first = value.args[0].value
            if isinstance(first, cst.SimpleString) and evaluated_value(first) == "cpu":
                continue
        if isinstance(value, (cst.Name, cst.Attribute)) and facts.bindings_of(full_name(value) or ""):
            continue  # a name with bindings: its values are read above
        return False
    return True
