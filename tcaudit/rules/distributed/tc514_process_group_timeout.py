"""TC514 process-group-timeout: ``init_process_group(...)`` without ``timeout=`` in a script where one
rank does long work (a download, an extraction, a cache build) in a rank-dependent branch and the ranks
then meet at a collective (``dist.barrier()``, a broadcast, the DDP wrap's parameter broadcast).

The other ranks wait in that collective while the one rank works, and the job fails when the wait passes
the process group's default timeout (10 minutes for NCCL in current torch).

Fix (safe): ``timeout=datetime.timedelta(minutes=60)`` on the call (``import datetime`` where the file has
no such import). Declined where ``**kwargs`` may already hold a timeout, or ``datetime`` names something
else in the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression
from tcaudit.rewrite.edits import CallEditor, add_keyword, add_stdlib_import
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import (
    distributed_facts,
    in_test_code,
    is_meeting_point,
    literal_value,
    passes_keyword,
)
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.guards import exclusive, last_name, names_rank, process_count_of

TIMEOUT_MINUTES = 60

# Names true on the main process by themselves (``if is_main_process():``, ``if master_process:``).
_MAIN = re.compile(r"^(is_)?(main|master)(_process|_proc|_rank)?$|^is_rank_?(zero|0)$|^rank_?zero$", re.IGNORECASE)

# Calls that cost little on the main process: printing, logging, saving, making a folder, naming a path.
_CHEAP = re.compile(
    r"^_*(print|pprint|log|info|warning|warn|error|debug|exception|critical|save\w*|dump|dumps|write|writelines|"
    r"flush|close|open|makedirs|mkdir|exists|isdir|isfile|join|format|str|repr|int|float|bool|len|dict|list|"
    r"tuple|set|sorted|range|enumerate|zip|add_scalar|add_scalars|add_text|set_description|set_postfix|"
    r"SummaryWriter|init|watch|config|get_rank|get_world_size|time|perf_counter|now|strftime|getenv|get|state_dict|"
    r"cpu|item|numpy|tolist|detach)$"
)


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.value == "0"


def is_main_process_test(test: cst.BaseExpression) -> bool:
    """``rank == 0``, ``dist.get_rank() == 0``, ``args.local_rank in [-1, 0]``, ``is_main_process()``,
    ``master_process``, ``and`` of one of them with anything, ``or`` of one with a single-process test
    (``not dist.is_initialized() or rank == 0``): true on one rank only when there are several."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return is_main_process_test(test.left) or is_main_process_test(test.right)
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        # ``not dist.is_initialized() or dist.get_rank() == 0``: rank 0 alone whenever there are several
        left, right = test.left, test.right
        return (is_main_process_test(left) and process_count_of(right) == "single") or (
            is_main_process_test(right) and process_count_of(left) == "single"
        )
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call)):
        name = last_name(test)
        return bool(name and _MAIN.match(name))
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        left, right, op = test.left, target.comparator, target.operator
        if isinstance(op, cst.Equal):
            side = left if _is_zero(right) else right if _is_zero(left) else None
            return side is not None and names_rank(side)
        if isinstance(op, cst.In) and isinstance(right, (cst.List, cst.Tuple, cst.Set)):
            values = [e.value for e in right.elements]
            return names_rank(left) and any(_is_zero(v) for v in values) and all(
                _is_zero(v) or (isinstance(v, cst.UnaryOperation) and isinstance(v.expression, cst.Integer))
                for v in values
            )
    return False


def _long_work(facts: ScriptFacts, branch: cst.If) -> cst.Call | None:
    """The first call in ``branch``'s body that is more than printing, logging or saving (the calls in the
    arguments of a cheap one, ``torch.save(model.state_dict(), f"{os.getpid()}.pt")``, are part of it)."""
    for call in _outer_calls(branch.body):
        name = last_name(call)
        if name is None or _CHEAP.match(name) or is_meeting_point(facts.qualname(call.func)):
            continue
        return call
    return None


def _outer_calls(node: cst.CSTNode) -> list[cst.Call]:
    """The calls in ``node`` that are not inside another call's arguments, in the order of the text."""
    found: list[cst.Call] = []

    class _Outer(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> bool:
            found.append(call)
            call.func.visit(self)  # ``tarfile.open(path).extractall(...)``: the receiver's call too
            return False

    node.visit(_Outer())
    return found


@dataclass(frozen=True, eq=False)
class AddTimeout(FixPlan):
    kind = "add-keyword"
    call: cst.Call  # the init_process_group(...) call
    line: int
    value: str  # the timedelta expression
    import_datetime: bool  # the file does not import datetime yet


class ProcessGroupTimeout(ScriptRule):
    id = "TC514"
    triggers = (r"init_process_group",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        calls = [
            c for c in info.init_process_group_calls
            if not in_test_code(c.ctx) and c.arg("timeout", 2) is None
            and passes_keyword(facts, c, "timeout") is not True and literal_value(c.arg("world_size", 3)) != 1
        ]
        if not calls:
            return
        wait = _main_process_work_then_meeting(facts, info)
        if wait is None:
            return
        work, meeting, where = wait
        for call in calls:

            def plan(call=call) -> AddTimeout:
                return _plan(facts, call)

            yield self.finding(
                facts,
                call.node,
                f"one rank runs `{_short(last_name(work))}()` (line {facts.line_of(work)}), the rest wait in {where} "
                f"(line {facts.line_of(meeting)}); no `timeout=`",
                explanation=(
                    f"`{facts.code(work)}` runs on one rank only. A collective waits for every rank "
                    "of the group; the ranks that reach it first wait until the process group's timeout (10 minutes "
                    "for NCCL) and then abort the job. Pass a timeout that covers the slow rank's work."
                ),
                fix=self.planned_fix(
                    FixClass.SAFE, f"pass timeout=datetime.timedelta(minutes={TIMEOUT_MINUTES})", plan
                ),
            )


def _short(name: str | None) -> str:
    """A callee's name for the one-line message: long ones cut (the explanation quotes the whole call)."""
    name = name or "?"
    return name if len(name) <= 24 else name[:23] + "…"


def _branches(facts: ScriptFacts) -> list[tuple[cst.If, Frame]]:
    """The ``if`` statements of the file whose body runs on the main process only, with their frames."""
    out = []
    seen: set[int] = set()
    for call in facts.calls:
        for frame in call.ctx.chain():
            if frame.kind == "if" and id(frame.node) not in seen and isinstance(frame.node, cst.If):
                seen.add(id(frame.node))
                if is_main_process_test(frame.node.test) and frame.parent is not None:
                    out.append((frame.node, frame.parent))
    return out


def _meeting_after(facts: ScriptFacts, info, branch: cst.If, where: Frame) -> tuple[cst.Call, str] | None:
    """The first collective after ``branch`` in the same function that every rank reaches (not on the
    main process's own arm): ``dist.barrier()``, a broadcast, the DDP wrap (which broadcasts rank 0's
    parameters)."""
    end = facts.position(branch).end.line
    function = where.function
    found: list[tuple[int, cst.Call, str]] = []
    for call in facts.calls:
        if call.ctx.function is not function or facts.line_of(call.node) <= end or exclusive(call.ctx, where):
            continue
        if call.ctx.inside(branch):
            continue
        if any(f.kind == "if" and is_main_process_test(f.node.test) for f in call.ctx.chain()
               if isinstance(f.node, cst.If)):
            continue  # the main process's own collective: the others do not wait in it
        if is_meeting_point(call.qualname):
            found.append((facts.line_of(call.node), call.node, f"`{_short(last_name(call.node))}()`"))
    for wrap in info.wraps_of("ddp"):
        call = wrap.call
        if call.ctx.function is function and facts.line_of(call.node) > end and not exclusive(call.ctx, where):
            found.append((facts.line_of(call.node), call.node, "the DDP wrap"))
    if not found:
        return None
    _, node, label = min(found, key=lambda f: f[0])
    return node, label


def _main_process_work_then_meeting(facts: ScriptFacts, info) -> tuple[cst.Call, cst.Call, str] | None:
    for branch, where in _branches(facts):
        if in_test_code(where):
            continue
        work = _long_work(facts, branch)
        if work is None:
            continue
        meeting = _meeting_after(facts, info, branch, where)
        if meeting is not None:
            return work, meeting[0], meeting[1]
    return None


def _plan(facts: ScriptFacts, call: CallSite) -> AddTimeout:
    if passes_keyword(facts, call, "timeout") is None:
        raise DeclineFix("the call passes **kwargs that may already hold `timeout`")
    if any(a.star == "*" for a in call.node.args):
        raise DeclineFix("the call passes *args, which may already reach `timeout`")
    value = f"timedelta(minutes={TIMEOUT_MINUTES})"
    top = [s for s in facts.imports if s.ctx is facts.module_frame]
    timedelta_names = [s.local for s in top if s.qualname == "datetime.timedelta"]
    if timedelta_names and not _rebound(facts, timedelta_names[0]):
        bare = f"{timedelta_names[0]}(minutes={TIMEOUT_MINUTES})"
        return AddTimeout(call.node, facts.line_of(call.node), bare, False)
    module_names = [s.local for s in top if s.qualname == "datetime"]
    if module_names and not _rebound(facts, module_names[0]):
        return AddTimeout(call.node, facts.line_of(call.node), f"{module_names[0]}.{value}", False)
    if facts.bindings_of("datetime") or any(s.local == "datetime" for s in facts.imports) or facts.mentions("datetime"):
        raise DeclineFix("`datetime` names something else in this file: pass `timeout=` by hand")
    return AddTimeout(call.node, facts.line_of(call.node), f"datetime.{value}", True)


def _rebound(facts: ScriptFacts, name: str) -> bool:
    """``name`` is also assigned or imported as something else in the file."""
    return bool(facts.bindings_of(name)) or sum(1 for s in facts.imports if s.local == name) > 1


class ProcessGroupTimeoutFix(Codemod):
    rule = "TC514"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        needs_import = False
        for finding in findings:
            plan: AddTimeout = finding.fix.plan
            value = parse_expression(plan.value, module)
            editor.rewrite_call(plan.call, lambda n, v=value: add_keyword(n, "timeout", v))
            needs_import = needs_import or plan.import_datetime
        new = editor.apply(module)
        return add_stdlib_import(new, "datetime") if needs_import else new
