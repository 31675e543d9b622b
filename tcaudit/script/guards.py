"""Which branches a place in the file runs under, for fixes that must land on the right path.

A training script's AMP path and its plain path are often two arms of one ``if`` (``if args.amp:``,
``if self.scaler is not None:``, ``if use_amp: ... else: ...``). A fix anchored in one arm must not
put code in the other, and code after both arms runs on either: an edit there that names an object
of one arm (the GradScaler) needs that arm's condition around it. This module answers those
questions from the frames ScriptFacts records (``if`` for a body, ``else`` for an orelse, both
holding the ``If`` node), within one function; and where a statement runs relative to its function's
training loop (a model rebuilt after the loop is an evaluation copy, not the model that trains).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from tcaudit.script.facts import Frame, ScriptFacts
from tcaudit.source.syntax import evaluated_value, full_name, target_names


@dataclass(frozen=True)
class Branch:
    test: cst.If  # the ``if`` statement
    taken: bool  # True: its body; False: its else (or elif chain)


def branches(ctx: Frame) -> list[Branch]:
    """The arms enclosing ``ctx``, outermost first, up to its function."""
    out: list[Branch] = []
    for frame in ctx.chain():
        if frame.kind in ("def", "class", "lambda"):
            break
        if frame.kind == "if":
            out.append(Branch(frame.node, True))  # type: ignore[arg-type]
        elif frame.kind == "else":
            out.append(Branch(frame.node, False))  # type: ignore[arg-type]
    return out[::-1]


def exclusive(a: Frame, b: Frame) -> bool:
    """Whether two places never run in the same pass: they sit on opposite arms of one ``if``."""
    arms = {id(branch.test): branch.taken for branch in branches(a)}
    return any(id(branch.test) in arms and arms[id(branch.test)] != branch.taken for branch in branches(b))


def extra_conditions(inner: Frame, outer: Frame) -> list[Branch]:
    """The arms ``inner`` runs under that ``outer`` does not: what code placed at ``outer`` must
    test to run only where ``inner`` runs."""
    shared = {(id(b.test), b.taken) for b in branches(outer)}
    return [b for b in branches(inner) if (id(b.test), b.taken) not in shared]


def binding_conditions(module: cst.Module, bound_at: list[Frame], used_at: Frame) -> list[Branch] | None:
    """What must hold where ``used_at`` runs for a name bound at ``bound_at`` (its assignments) to
    exist there: ``[]`` when one binding runs wherever ``used_at`` does (or two sit on opposite arms of
    one ``if``, so one of them ran), the arms of the only binding's branch that ``used_at`` does not
    share, or None when there are several bindings under different conditions. An arm of another
    ``if`` on the same side-effect-free test (``if args.amp:`` written twice) counts as shared."""
    around = {
        (module.code_for_node(b.test.test), b.taken) for b in branches(used_at) if is_pure_test(b.test.test)
    }
    conditional: list[list[Branch]] = []
    for frame in bound_at:
        extra = [
            b for b in extra_conditions(frame, used_at)
            if not (is_pure_test(b.test.test) and (module.code_for_node(b.test.test), b.taken) in around)
        ]
        if not extra:
            return []
        conditional.append(extra)
    arms = {(id(extra[-1].test), extra[-1].taken) for extra in conditional if len(extra) == 1}
    if any((test, not taken) in arms for test, taken in arms):
        return []  # ``if amp: scaler = GradScaler() else: scaler = None``
    if len(conditional) == 1:
        return conditional[0]
    return None


_PURE = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString)


def is_pure_test(node: cst.BaseExpression) -> bool:
    """A condition that can be evaluated a second time with the same result and no side effect:
    names, attributes, literals, comparisons and boolean operators over them (no calls)."""
    if isinstance(node, _PURE):
        return not isinstance(node, cst.Attribute) or is_pure_test(node.value)
    if isinstance(node, cst.UnaryOperation):
        return is_pure_test(node.expression)
    if isinstance(node, cst.BooleanOperation):
        return is_pure_test(node.left) and is_pure_test(node.right)
    if isinstance(node, cst.Comparison):
        return is_pure_test(node.left) and all(is_pure_test(c.comparator) for c in node.comparisons)
    return False


def condition_code(module: cst.Module, conditions: list[Branch]) -> str | None:
    """One expression true exactly where all ``conditions`` hold, or None when one of them cannot be
    re-evaluated safely (it calls something) or is an ``elif`` arm whose earlier tests matter."""
    parts: list[tuple[str, bool]] = []
    for branch in conditions:
        if not is_pure_test(branch.test.test):
            return None
        parts.append((module.code_for_node(branch.test.test), branch.taken))
    if len(parts) == 1:
        code, taken = parts[0]
        return code if taken else f"not ({code})"
    return " and ".join(
        (f"({code})" if " " in code else code) if taken else f"not ({code})" for code, taken in parts
    )


# -- before, inside or after the training loop ------------------------------------------------------------


def training_loops(facts: ScriptFacts, function: cst.FunctionDef | None) -> list[cst.CSTNode]:
    """The outermost loops of ``function`` (None: the module level) that hold a training step's
    backward, in the order they appear."""
    loops: dict[int, cst.CSTNode] = {}
    for step in facts.training_steps_in(function):  # indexed: asked once per step of a file of many
        outermost = None
        for frame in step.ctx.chain():
            if frame.kind in ("def", "class", "lambda"):
                break
            if frame.kind == "loop":
                outermost = frame.node
        if outermost is not None:
            loops.setdefault(id(outermost), outermost)
    return sorted(loops.values(), key=facts.line_of)


def training_phase(facts: ScriptFacts, ctx: Frame, node: cst.CSTNode) -> str | None:
    """Whether ``node`` (at ``ctx``) runs ``"before"``, ``"inside"`` or ``"after"`` its function's
    training loop, or None when that function has no training loop. Between two training loops is
    ``"inside"``: the statement still runs before some training. A model rebuilt ``"after"`` is the
    evaluation model reloaded from a checkpoint, not the one that trains."""
    loops = training_loops(facts, ctx.function)
    if not loops:
        return None
    for loop in loops:
        if ctx.inside(loop):
            return "inside"
    line = facts.line_of(node)
    if line < facts.line_of(loops[0]):
        return "before"
    if line > facts.position(loops[-1]).end.line:
        return "after"
    return "inside"


# -- reachability ----------------------------------------------------------------------------------------

_TERMINATORS = (cst.Return, cst.Raise, cst.Continue, cst.Break)


def unreachable_statements(module: cst.Module) -> int:
    """How many statements follow a ``return``, ``raise``, ``continue`` or ``break`` in their own
    block and so never run. A fix whose edit raises this count put code where it does nothing (a
    wrap or a sampler after the function's ``return``). Walks statements only, not expressions."""
    return _unreachable_in(module.body)


def _unreachable_in(body) -> int:
    count = 0
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine):
            if any(isinstance(small, _TERMINATORS) for small in statement.body):
                return count + len(body) - index - 1
            continue
        for block in _blocks_of(statement):
            count += _unreachable_in(block.body)
    return count


def _blocks_of(statement: cst.CSTNode):
    """The indented blocks directly inside a compound statement (bodies, else, except, finally)."""
    for name in ("body", "orelse", "finalbody"):
        part = getattr(statement, name, None)
        if isinstance(part, (cst.Else, cst.Finally)):
            part = part.body
        elif isinstance(part, cst.If):  # an ``elif``: its own body and else
            yield from _blocks_of(part)
            continue
        if isinstance(part, cst.IndentedBlock):
            yield part
    for handler in getattr(statement, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            yield handler.body
    for case in getattr(statement, "cases", ()):
        if isinstance(case.body, cst.IndentedBlock):
            yield case.body


# -- imports before first use ------------------------------------------------------------------------------


def used_before_import(module: cst.Module) -> set[str]:
    """Names that module-level code reads before the top-level statement that imports them (a
    NameError when the script starts). Names the module also binds otherwise (an assignment, a
    ``def``) are left out: which binding runs first is not told here. Function bodies run later and
    are not read."""
    first_import: dict[str, int] = {}
    bound_otherwise: set[str] = set()
    loads: list[set[str]] = []
    for index, statement in enumerate(module.body):
        collector = _TopLevelNames()
        statement.visit(collector)
        for name in collector.imported:
            first_import.setdefault(name, index)
        bound_otherwise |= collector.bound
        loads.append(collector.loaded)
    return {
        name
        for index, names in enumerate(loads)
        for name in names
        if name in first_import and first_import[name] > index and name not in bound_otherwise
    }


class _TopLevelNames(cst.CSTVisitor):
    """What one top-level statement imports, binds otherwise and reads when the module runs."""

    def __init__(self) -> None:
        self.imported: set[str] = set()
        self.bound: set[str] = set()
        self.loaded: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.bound.add(node.name.value)
        for decorator in node.decorators:
            decorator.visit(self)
        return False  # the body runs when called

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bound.add(node.name.value)

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            if alias.asname is not None:
                self.imported.add(full_name(alias.asname.name) or "")
            else:
                self.imported.add((full_name(alias.name) or "").split(".")[0])
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                target = alias.asname.name if alias.asname is not None else alias.name
                self.imported.add(full_name(target) or "")
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.bound.update(target_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.bound.update(target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bound.update(target_names(node.target))

    def visit_For(self, node: cst.For) -> None:
        self.bound.update(target_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.bound.update(target_names(node.name))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bound.update(target_names(node.target))

    def visit_Name(self, node: cst.Name) -> None:
        self.loaded.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # ``torch.cuda``: only the root is a name read here
        return False


def structural_refusal(before: cst.Module, after: cst.Module) -> str | None:
    """Why the safety net refuses the edit from ``before`` to ``after`` (both parsed): it adds code
    that never runs (after a ``return``, ``raise``, ``continue`` or ``break``) or uses a name before the
    line that imports it; None to keep it. ``tcaudit fix`` and scan's per-fix edits both ask."""
    if unreachable_statements(after) > unreachable_statements(before):
        return ("the edit would land after a `return` (or raise, continue, break), where it never runs; "
                "left unchanged")
    early = sorted(used_before_import(after) - used_before_import(before))
    if early:
        return f"the edit would use `{early[0]}` before the line that imports it; left unchanged"
    return None


# -- which process count a branch implies ----------------------------------------------------------
_RANK_NAMES = re.compile(r"^(local_?rank|rank|global_rank|gpu_?id|device_id)$", re.IGNORECASE)
_WORLD_NAMES = re.compile(r"^(world_?size|num_(?:processes|procs|gpus)|n_?procs|ngpus_per_node|nprocs)$", re.IGNORECASE)
_DISTRIBUTED_FLAGS = re.compile(r"^(distributed|is_distributed|use_ddp|ddp|multiprocessing_distributed|"
                                r"is_initialized|dist_on|use_distributed)$", re.IGNORECASE)


def last_name(node: cst.BaseExpression) -> str | None:
    """The last name of a name, attribute, call's callee or string-keyed item (``args.local_rank``:
    ``local_rank``)."""
    if isinstance(node, cst.Call):
        node = node.func
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return evaluated_value(index.value) if isinstance(evaluated_value(index.value), str) else None
    return None


# Calls that return this process's rank or the number of processes.
_RANK_CALLS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank"})
_WORLD_CALLS = frozenset({"get_world_size", "get_local_world_size"})


def names_rank(node: cst.BaseExpression) -> bool:
    """``rank``, ``args.local_rank``, ``dist.get_rank()``: an expression that is this process's rank."""
    name = last_name(node)
    if isinstance(node, cst.Call):
        return name in _RANK_CALLS
    return bool(name) and bool(_RANK_NAMES.match(name))


def names_world_size(node: cst.BaseExpression) -> bool:
    """``world_size``, ``args.world_size``, ``dist.get_world_size()``: the number of processes."""
    name = last_name(node)
    if isinstance(node, cst.Call):
        return name in _WORLD_CALLS
    return bool(name) and bool(_WORLD_NAMES.match(name) or name.lower() == "num_replicas")


def _number(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def process_count_of(test: cst.BaseExpression) -> str | None:
    """What a condition says about the job when it holds: ``"single"`` (``RANK == -1``,
    ``world_size == 1``, ``not args.distributed``, ``not dist.is_initialized()``), ``"multi"``
    (``RANK != -1``, ``world_size > 1``, ``args.distributed``), or None when it says neither."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = process_count_of(test.expression)
        return {"single": "multi", "multi": "single"}.get(inner or "")
    if isinstance(test, cst.BooleanOperation):
        left, right = process_count_of(test.left), process_count_of(test.right)
        if isinstance(test.operator, cst.And):  # both hold: either one decides
            return left or right if left == right or None in (left, right) else None
        return left if left == right else None  # ``or``: only when both arms agree
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call)):
        name = last_name(test)
        return "multi" if name and _DISTRIBUTED_FLAGS.match(name) else None
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        left, right, op = test.left, target.comparator, target.operator
        name, value = last_name(left), _number(right)
        if value is None:
            name, value = last_name(right), _number(left)
            op = {cst.LessThan: cst.GreaterThan(), cst.GreaterThan: cst.LessThan(), cst.LessThanEqual: cst.GreaterThanEqual(),
                  cst.GreaterThanEqual: cst.LessThanEqual()}.get(type(op), op)
        if name is None or value is None:
            return None
        if _RANK_NAMES.match(name) and value == -1:
            if isinstance(op, (cst.Equal, cst.Is)):
                return "single"
            if isinstance(op, (cst.NotEqual, cst.IsNot)):
                return "multi"
        if _WORLD_NAMES.match(name):
            single = ((isinstance(op, cst.Equal) and value == 1) or (isinstance(op, cst.LessThanEqual) and value == 1)
                      or (isinstance(op, cst.LessThan) and value == 2))
            multi = ((isinstance(op, cst.GreaterThan) and value == 1) or (isinstance(op, cst.GreaterThanEqual) and value == 2)
                     or (isinstance(op, cst.NotEqual) and value == 1))
            return "single" if single else "multi" if multi else None
    return None


def single_process_branch(ctx: Frame) -> bool:
    """Whether ``ctx`` runs only when the job is one process: inside ``if RANK == -1:`` (yolov5's
    DataParallel mode) or the ``else`` of ``if args.distributed:``."""
    for branch in branches(ctx):
        implied = process_count_of(branch.test.test)
        if (implied == "single" and branch.taken) or (implied == "multi" and not branch.taken):
            return True
    return False
