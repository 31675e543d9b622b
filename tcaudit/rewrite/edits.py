"""Small edits shared by the backend (TC3) and input-pipeline (TC4) fixes: find the call a finding
points at (for the fixes that do not hold their nodes yet), add or replace a keyword argument without disturbing the call's layout (with the typed plans of the keyword fixes), insert a
global setting after the imports, add an import where isort would put it."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Iterable

import libcst as cst

from tcaudit.findings import DeclineFix, FixPlan
from tcaudit.rewrite.codemod import StatementEditor, ensure_import, parse_expression, parse_statement, torch_import_name
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import import_block_end
from tcaudit.source.syntax import (
    contains,  # noqa: F401 - its home is source.syntax; fixes import it here too
    keyword,
)


@dataclass(frozen=True, eq=False)
class InsertSetting(FixPlan):
    """A global setting inserted after the leading imports (:func:`insert_setting` picks
    the exact statement: after a later ``import torch`` too, beside settings already inserted)."""

    kind = "insert-statement"
    after_line: int  # the last line of the leading import block (0: none)
    code: str
    imports: tuple[str, ...] = ("torch",)


def setting_plan(facts: ScriptFacts, code: str) -> InsertSetting:
    """The plan for inserting ``code`` as a module-level statement after the leading imports."""
    last = import_block_end(facts)
    return InsertSetting(facts.position(last).end.line if last is not None else 0, code)


def add_keyword(call: cst.Call, key: str, value: cst.BaseExpression) -> cst.Call:
    """``f(a, b)`` → ``f(a, b, key=value)``, keeping the call's layout: a one-line call stays on one
    line; in a call with one argument per line the new one gets its own line, and a trailing comma
    stays trailing. Comments stay on the lines they describe: ``shuffle=True  # every epoch?`` keeps its
    comment when it gets a comma, and the new argument's line has none (never the comment of the argument
    whose comma it copies)."""
    new_arg = cst.Arg(
        value=value,
        keyword=cst.Name(key),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new_arg])
    last = args[-1]
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        separator = args[-2].comma
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        separator = cst.Comma(whitespace_after=call.whitespace_before_args)
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    between = separator.whitespace_after
    if isinstance(between, cst.ParenthesizedWhitespace):
        # One argument per line: the line break and indentation between arguments, without the comment
        # (and blank lines) of the argument the separator belongs to.
        between = _bare_line_break(between)
        separator = separator.with_changes(whitespace_after=between)
    if isinstance(last.comma, cst.Comma):
        # A trailing comma (often before a newline and the closing parenthesis) moves to the new argument;
        # a comment after it stays on the last argument's line.
        after = last.comma.whitespace_after
        if isinstance(between, cst.ParenthesizedWhitespace) and isinstance(after, cst.ParenthesizedWhitespace):
            kept = last.comma.with_changes(whitespace_after=between.with_changes(first_line=after.first_line,
                                                                                  empty_lines=after.empty_lines))
            new_arg = new_arg.with_changes(comma=last.comma.with_changes(whitespace_after=_bare_line_break(after)),
                                           whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=kept)
        else:
            new_arg = new_arg.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    else:
        after = last.whitespace_after_arg
        if isinstance(between, cst.ParenthesizedWhitespace) and isinstance(after, cst.ParenthesizedWhitespace):
            # ``shuffle=True  # comment`` then ``)`` on its own line: the comment stays after the comma.
            kept = separator.with_changes(whitespace_after=between.with_changes(first_line=after.first_line,
                                                                                empty_lines=after.empty_lines))
            new_arg = new_arg.with_changes(whitespace_after_arg=_bare_line_break(after))
            args[-1] = last.with_changes(comma=kept, whitespace_after_arg=cst.SimpleWhitespace(""))
        else:
            new_arg = new_arg.with_changes(whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new_arg])


def _bare_line_break(whitespace: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    """``whitespace`` (a line break inside brackets) without the comment at the end of its first line and
    the blank or comment lines after it: only the newline and the next line's indentation."""
    return whitespace.with_changes(
        first_line=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace(""), comment=None,
                                          newline=whitespace.first_line.newline),
        empty_lines=(),
    )


def replace_argument(call: cst.Call, index: int, value: cst.BaseExpression) -> cst.Call:
    """Give the argument at ``index`` a new value, keeping its keyword, comma and spacing."""
    return call.with_changes(args=[a.with_changes(value=value) if i == index else a for i, a in enumerate(call.args)])


def with_torch_name(code: str, facts: ScriptFacts) -> str:
    """Code written with ``torch.`` for a file that imports torch under another name (``import torch as T``)."""
    local = torch_import_name(facts)
    if local is None or local == "torch":
        return code
    return re.sub(r"\btorch\.", f"{local}.", code)


class CallEditor(StatementEditor):
    """A StatementEditor that also rewrites calls, found by identity."""

    targeted_visit = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[int, object] = {}

    def targets(self) -> set[int]:
        return {*super().targets(), *self.calls}

    def rewrite_call(self, call: cst.Call, change) -> None:
        """``change(updated_call) -> expression``; several changes to one call compose in order."""
        previous = self.calls.get(id(call))
        if previous is None:
            self.calls[id(call)] = change
        else:
            self.calls[id(call)] = lambda node, first=previous, second=change: second(first(node))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        change = self.calls.get(id(original_node))
        return change(updated_node) if change is not None else updated_node  # type: ignore[operator]


# -- global settings after the imports ----------------------------------------------------------------

_SETTING = re.compile(r"^\s*\w+\.(backends\.\S+\s*=|set_float32_matmul_precision\()")


def insert_setting(module: cst.Module, facts: ScriptFacts, code: str) -> cst.Module:
    """Insert a module-level setting (``torch.backends.cudnn.benchmark = True``) after the leading imports,
    and after ``import torch`` when that comes later (imports in the middle of the file); beside the
    settings already inserted there, so they stay one group. Adds ``import torch`` when the file does not
    bind the name at module level."""
    body = list(module.body)
    index = _index_of(body, import_block_end(facts))
    torch_local = torch_import_name(facts)
    statements = []
    if torch_local is None:
        statements.append(parse_statement("import torch", module))
    else:
        code = with_torch_name(code, facts)
        for site in facts.imports:
            if site.qualname == "torch" and site.local == torch_local and site.ctx is facts.module_frame:
                torch_index = _top_level_index(facts, body, site.node)
                if torch_index > index:
                    # ``import torch`` after other code (``os.environ[...] = ...`` first): after its import run.
                    index = torch_index
                    while index + 1 < len(body) and _is_import_line(body[index + 1]):
                        index += 1
                break
    while index + 1 < len(body) and _SETTING.match(module.code_for_node(body[index + 1]).strip()):
        index += 1
    statements.append(parse_statement(code, module))
    previous = body[index] if index >= 0 else None
    if previous is not None and not _SETTING.match(module.code_for_node(previous).strip()):
        # A blank line between the imports and the settings block (``import torch`` joins the imports).
        statements[-1] = statements[-1].with_changes(leading_lines=[cst.EmptyLine()])
    if previous is None:
        return module.with_changes(body=[*statements, *body])
    editor = StatementEditor()
    editor.insert_after(previous, statements)
    return editor.apply(module)


def index_after_imports(facts: ScriptFacts) -> int:
    """The index in the module body right after the leading imports (or the docstring and
    ``__future__`` lines when the file starts with code): where module-level code is inserted."""
    return _index_of(list(facts.module.body), import_block_end(facts)) + 1


def insert_block(module: cst.Module, code: str, index: int) -> cst.Module:
    """Module-level ``code`` (a helper function, a comment-headed block) as the module's statement
    ``index``, two blank lines on either side; a leading comment of ``code`` stays at its head."""
    parsed = cst.parse_module(code)
    block = list(parsed.body)
    body = list(module.body)
    spacing = [cst.EmptyLine(), cst.EmptyLine()] if index > 0 else []
    # The block's opening comment is the parsed module's header.
    block[0] = block[0].with_changes(leading_lines=[*spacing, *parsed.header, *block[0].leading_lines])
    if index < len(body):
        following = body[index]
        blank = 0
        while blank < len(following.leading_lines) and following.leading_lines[blank].comment is None:
            blank += 1
        if blank < 2:
            body[index] = following.with_changes(
                leading_lines=[*(cst.EmptyLine() for _ in range(2 - blank)), *following.leading_lines]
            )
    return module.with_changes(body=[*body[:index], *block, *body[index:]])


def _is_import_line(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in node.body)


def _is_future_import(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and getattr(s.module, "value", None) == "__future__" for s in node.body
    )


def _index_of(body: list, node: cst.CSTNode | None) -> int:
    """The index of ``node`` in the module body, or the last docstring/``__future__`` line before code."""
    if node is not None:
        return next(i for i, item in enumerate(body) if item is node)
    index = -1
    for i, item in enumerate(body):
        if isinstance(item, cst.SimpleStatementLine) and len(item.body) == 1 and (
            (isinstance(item.body[0], cst.Expr) and isinstance(item.body[0].value, cst.SimpleString) and i == 0)
            or (isinstance(item.body[0], cst.ImportFrom) and getattr(item.body[0].module, "value", None) == "__future__")
        ):
            index = i
            continue
        break
    return index


def _top_level_index(facts: ScriptFacts, body: list, node: cst.CSTNode) -> int:
    line = facts.line_of(node)
    for i, item in enumerate(body):
        pos = facts.position(item)
        if pos.start.line <= line <= pos.end.line:
            return i
    return -1


# -- keyword arguments of one call (the DataLoader fixes, TC401/TC402/TC404, and TC403) ---------------


@dataclass(frozen=True, eq=False)
class AddKeyword(FixPlan):
    """Pass ``key=value`` to ``call``, which does not pass ``key`` yet."""

    kind = "add-kwarg"
    call: cst.Call
    key: str
    value: str  # the code written, aliases already applied (``min(16, _os.cpu_count() or 1)``)
    imports: tuple[str, ...] = ()  # standard-library modules the fix imports for the value


@dataclass(frozen=True, eq=False)
class ReplaceArgument(FixPlan):
    """Give the argument ``call`` writes for ``key`` (by keyword or position) a new value."""

    kind = "replace-arg"
    call: cst.Call
    argument: cst.Arg
    key: str
    value: str
    imports: tuple[str, ...] = ()


KeywordPlan = AddKeyword | ReplaceArgument


def decline_key_in_dict(site: LoaderSite, key: str) -> None:
    """DeclineFix when the DataLoader gets ``key`` from a ``**kwargs`` dict: a keyword beside it is a TypeError."""
    in_dict = site.in_dict(key)
    if in_dict is not None:
        raise DeclineFix(
            f"{key} comes from the `{in_dict.source}` dict passed as **{in_dict.source}; a second {key}= "
            "beside it would raise TypeError (edit the dict instead)"
        )


def plan_loader_keyword(site: LoaderSite, key: str, value: str, imports: tuple[str, ...] = ()) -> KeywordPlan:
    """How ``key=value`` gets onto a DataLoader call: replace the argument it writes, or add a keyword
    when nothing (not even a followed ``**kwargs`` dict) passes the key. DeclineFix when the key comes
    from a dict or may come from somewhere the analysis cannot see."""
    decline_key_in_dict(site, key)
    call = site.call.node
    written = [kv for kv in site.keys.get(key, []) if kv.source in ("keyword", "positional")]
    if written:
        if len(written) != 1 or not isinstance(written[0].node, cst.Arg):
            raise DeclineFix(f"could not find the {key} argument to replace")
        return ReplaceArgument(call, written[0].node, key, value, imports)
    if keyword(call, key) is not None or not site.complete or site.has(key):
        raise DeclineFix(f"the call may already pass {key}=; a second one would be a TypeError")
    return AddKeyword(call, key, value, imports)


def apply_keyword_edits(module: cst.Module, plans: Iterable[KeywordPlan]) -> cst.Module:
    """Make the keyword edits the plans describe, each on the call node its plan holds."""
    editor = CallEditor()
    for plan in plans:
        value = parse_expression(plan.value, module)
        if isinstance(plan, ReplaceArgument):
            index = next(i for i, arg in enumerate(plan.call.args) if arg is plan.argument)
            editor.rewrite_call(plan.call, lambda node, i=index, v=value: replace_argument(node, i, v))
        else:
            editor.rewrite_call(plan.call, lambda node, k=plan.key, v=value: add_keyword(node, k, v))
    return editor.apply(module)


# -- imports ---------------------------------------------------------------------------------------------


def imported_module(module: cst.Module, item: cst.CSTNode) -> str | None:
    """The module a one-import line imports (``import a.b as c`` / ``from a.b import c`` → ``a.b``);
    None for anything else (a relative import, several statements on the line)."""
    if not isinstance(item, cst.SimpleStatementLine) or len(item.body) != 1:
        return None
    small = item.body[0]
    if isinstance(small, cst.Import):
        return module.code_for_node(small.names[0].name)
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return module.code_for_node(small.module)
    return None


def add_stdlib_import(module: cst.Module, name: str) -> cst.Module:
    """``import os`` where isort would put it: in alphabetical order within the file's first group of
    standard-library imports, or as a group of its own before the first import. The caller checks that
    the file does not import it yet."""
    body = list(module.body)
    new = parse_statement(f"import {name}", module)

    def stdlib_name(item: cst.CSTNode) -> str | None:
        dotted = imported_module(module, item)
        if dotted is None:
            return None
        return dotted if dotted.split(".")[0] in sys.stdlib_module_names and dotted != "__future__" else None

    imports = [i for i, item in enumerate(body) if _is_import_line(item) and not _is_future_import(item)]
    if not imports:
        return ensure_import(module, f"import {name}")
    run = [i for i in imports if stdlib_name(body[i]) is not None]
    if run:
        start = run[0]
        end = start
        while end + 1 < len(body) and stdlib_name(body[end + 1]) is not None and not body[end + 1].leading_lines:
            end += 1
        position = next((i for i in range(start, end + 1) if stdlib_name(body[i]) > name), end + 1)
        if position == start:
            new = new.with_changes(leading_lines=body[start].leading_lines)
            body[start] = body[start].with_changes(leading_lines=[])
        body.insert(position, new)
        return module.with_changes(body=body)
    first = imports[0]
    new = new.with_changes(leading_lines=body[first].leading_lines)
    body[first] = body[first].with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(first, new)
    return module.with_changes(body=body)


def _import_name(module: cst.Module, small: cst.BaseSmallStatement) -> str | None:
    if isinstance(small, cst.Import):
        return module.code_for_node(small.names[0].name)
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return module.code_for_node(small.module)
    return None


def add_torch_import(module: cst.Module, statement: str) -> cst.Module:
    """An import of a torch module where isort would put it among the file's torch imports (``import``
    lines in order, ``from`` lines after them); after the last import when the file has none."""
    new = parse_statement(statement, module)
    code = module.code_for_node(new).strip()
    small_new = new.body[0]  # type: ignore[attr-defined]
    key = _import_name(module, small_new) or ""
    is_from = isinstance(small_new, cst.ImportFrom)
    body = list(module.body)
    torch_lines: list[int] = []
    same_kind: list[tuple[int, str]] = []
    for index, item in enumerate(body):
        if not isinstance(item, cst.SimpleStatementLine) or len(item.body) != 1:
            continue
        small = item.body[0]
        if not isinstance(small, (cst.Import, cst.ImportFrom)):
            continue
        if module.code_for_node(item).strip() == code:
            return module
        name = _import_name(module, small)
        if name and name.split(".")[0] == "torch":
            torch_lines.append(index)
            if isinstance(small, cst.ImportFrom) == is_from:
                same_kind.append((index, name))
    if not torch_lines:
        return ensure_import(module, statement)
    if same_kind:
        before = [index for index, name in same_kind if name <= key]
        position = before[-1] + 1 if before else same_kind[0][0]
    else:
        position = torch_lines[-1] + 1 if is_from else torch_lines[0]
    if position < len(body) and position in torch_lines and body[position].leading_lines and not (
        position - 1 in torch_lines
    ):
        new = new.with_changes(leading_lines=body[position].leading_lines)
        body[position] = body[position].with_changes(leading_lines=[])
    body.insert(position, new)
    return module.with_changes(body=body)
