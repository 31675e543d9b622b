"""TC208 fix: run the binary cross-entropy with autocast disabled, on float32 inputs."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, parse_expression, torch_import_name
from tcaudit.script.amp import amp_facts


def _float_args(call: cst.Call) -> cst.Call:
    args = []
    for index, arg in enumerate(call.args):
        if arg.keyword is None and not arg.star and index < 2:
            arg = arg.with_changes(value=cst.Call(func=cst.Attribute(value=arg.value, attr=cst.Name("float"))))
        args.append(arg)
    return call.with_changes(args=args)


class AutocastUnsafeOpFix(Codemod):
    rule = "TC208"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        torch_name = torch_import_name(facts) or "torch"
        lines = {f.location.line for f in findings}
        sites = {id(s.call.node): s for s in amp_facts(facts).autocast_sites}
        targets = []
        for call in facts.calls:
            if facts.line_of(call.node) not in lines or call.statement is None:
                continue
            frame = facts.autocast_frame(call.ctx)
            if frame is None or frame.kind != "with":
                raise DeclineFix("the loss is computed in a helper called under autocast; move it out by hand")
            with_node = frame.node
            site = next((sites[id(item.item)] for item in with_node.items if id(item.item) in sites), None)
            if site is None:
                raise DeclineFix("the autocast context is a variable; its device type is not known here")
            device_expr = site.call.arg("device_type", 0)
            if (site.call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) or device_expr is None:
                device_code = f'"{site.device or "cuda"}"'
            else:
                device_code = facts.module.code_for_node(device_expr)
            targets.append((call, device_code))
        for call, _ in targets:
            if not isinstance(call.statement.node, cst.SimpleStatementLine):
                raise DeclineFix("the loss is part of a compound statement")
        return module.visit(_Wrap(module, targets, torch_name))


class _Wrap(cst.CSTTransformer):
    """Cast the BCE inputs to float32 and put their statement under ``autocast(enabled=False)``."""

    def __init__(self, module: cst.Module, targets, torch_name: str) -> None:
        super().__init__()
        self.module = module
        self.calls = {id(call.node) for call, _ in targets}
        self.wrap = {id(call.statement.node): device for call, device in targets}
        self.torch_name = torch_name

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return _float_args(updated_node) if id(original_node) in self.calls else updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        device = self.wrap.get(id(original_node))
        if device is None:
            return updated_node
        context_expr = parse_expression(f"{self.torch_name}.autocast(device_type={device}, enabled=False)", self.module)
        return cst.With(
            items=[cst.WithItem(context_expr)],
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=updated_node.leading_lines,
        )
