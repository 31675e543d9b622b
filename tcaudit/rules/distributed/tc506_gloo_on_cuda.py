"""TC506 gloo-on-cuda: ``init_process_group(backend="gloo")`` in a script that trains on CUDA.

Fix (safe): the backend becomes ``"nccl" if torch.cuda.is_available() else "gloo"`` (the literal or
the name that held ``"gloo"`` stays as the fallback). Declined when a device switch may keep a GPU
machine's run on the CPU, or a collective is handed a host tensor (NCCL cannot reduce those).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, ensure_import, parse_expression, parse_statement, torch_import_name
from tcaudit.rewrite.edits import imported_module
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import (
    COLLECTIVES,
    DEVICE_SWITCH,
    DistributedFacts,
    distributed_facts,
    in_test_code,
    literal_value,
)
from tcaudit.script.facts import Frame, ScriptFacts
from tcaudit.source.syntax import keyword

# The script puts its model or tensors on a GPU (not just mentions CUDA in a check).
_CUDA_TRAINING = re.compile(
    r"\.cuda\(|[\"']cuda|torch\.cuda\.set_device|\bdevice_ids\s*=|\bnccl\b|torch\.accelerator"
)


def _always_gloo(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    """Every value the backend expression may take is the string "gloo" (a conditional that can pick
    NCCL, or anything we cannot evaluate, is not)."""
    leaves = []
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue
        if isinstance(value, (cst.Name, cst.Attribute)) and facts.bindings_of(facts.code(value)):
            continue  # an assigned name: its values are in the list
        leaves.append(value)
    return bool(leaves) and all(literal_value(v) == "gloo" for v in leaves)


# ``platform.system() == "Windows"``, ``sys.platform == "win32"``, ``sys.platform.startswith("win")``,
# ``os.name == "nt"``, ``IS_WINDOWS``: a test that picks the Windows path.
_WINDOWS_TEST = re.compile(
    r"""platform\.system\(\)|sys\.platform|os\.name|platform\.platform\(\)|\bis_?windows\b|\bon_windows\b|\bwin32\b|IS_WINDOWS""",
    re.IGNORECASE,
)
_WINDOWS_VALUE = re.compile(r"""["'](?:windows|win32|win|nt|cygwin)["']|is_?windows|on_windows""", re.IGNORECASE)


def _is_windows_test(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    text = facts.code(test)
    return bool(_WINDOWS_TEST.search(text)) and bool(_WINDOWS_VALUE.search(text) or re.search(r"(?i)is_?windows|IS_WINDOWS", text))


def _negated(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    text = facts.code(test)
    return isinstance(test, cst.UnaryOperation) or "!=" in text or " not in " in text


def _windows_only(facts: ScriptFacts, ctx: Frame) -> bool:
    """Code that runs on Windows only: the body of ``if <windows test>:`` or the ``else`` of
    ``if <not windows>:``."""
    for frame in ctx.chain():
        if frame.kind == "if" and isinstance(frame.node, cst.If) and _is_windows_test(facts, frame.node.test):
            return not _negated(facts, frame.node.test)
        if frame.kind == "else" and isinstance(frame.node, cst.If) and _is_windows_test(facts, frame.node.test):
            return _negated(facts, frame.node.test)
    return False


def _gloo_only_on_windows(facts: ScriptFacts, backend: cst.BaseExpression) -> bool:
    """``backend = "gloo"`` bound only in a Windows branch, or ``"gloo" if <windows> else "nccl"``."""
    name = facts.code(backend)
    bindings = facts.bindings_of(name) if isinstance(backend, (cst.Name, cst.Attribute)) else []
    gloo = [b for b in bindings if literal_value(b.value) == "gloo"]
    return bool(gloo) and all(_windows_only(facts, b.ctx) for b in gloo)


@dataclass(frozen=True, eq=False)
class ReplaceBackend(FixPlan):
    kind = "replace-expression"
    backend: cst.BaseExpression  # the "gloo" literal, or the name bound only to it
    line: int
    old: str
    new: str
    quote: str  # the quote the new "nccl" literal is written with


_NEW_BACKEND = '"nccl" if torch.cuda.is_available() else "gloo"'


class GlooOnCuda(ScriptRule):
    id = "TC506"
    fixed_with = ("TC505",)  # the process group of the DDP conversion
    triggers = (r"gloo",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not _CUDA_TRAINING.search(info.text):
            return
        if not (facts.training_steps or facts.optimizer_steps or info.is_ddp_script):
            return
        for call in info.init_process_group_calls:
            if in_test_code(call.ctx):
                continue
            backend = call.arg("backend", 0)
            if backend is None or not _always_gloo(facts, backend):
                continue
            if _windows_only(facts, call.ctx) or _gloo_only_on_windows(facts, backend):
                continue  # Windows has no NCCL: gloo is the only backend there

            def plan(backend=backend) -> ReplaceBackend:
                return _plan(facts, info, backend)

            yield self.finding(
                facts,
                backend,
                'init_process_group(backend="gloo") in a CUDA script: gloo all-reduces GPU gradients '
                "through host memory",
                explanation="NCCL keeps the gradients on the GPUs and uses NVLink.",
                fix=self.planned_fix(FixClass.SAFE, 'backend="nccl" if torch.cuda.is_available() else "gloo"', plan),
            )


def _plan(facts: ScriptFacts, info: DistributedFacts, backend: cst.BaseExpression) -> ReplaceBackend:
    switch = DEVICE_SWITCH.search(info.text)
    if switch:
        raise DeclineFix(
            f"the device is chosen by a switch (`{switch.group(0).strip()}`): a CPU run on a machine "
            "with a GPU would hand CPU tensors to NCCL"
        )
    host = _host_collective(facts)
    if host:
        raise DeclineFix(f"`{host}` is handed a tensor on the host, which NCCL cannot reduce")
    if isinstance(backend, cst.SimpleString) and literal_value(backend) == "gloo":
        quote = backend.quote  # the literal stays as written, as the fallback
    elif isinstance(backend, (cst.Name, cst.Attribute)):
        quote = '"'  # a name bound to "gloo" only: keep using it
    else:
        raise DeclineFix("the backend is not a plain string or name")
    return ReplaceBackend(backend, facts.line_of(backend), facts.code(backend), _NEW_BACKEND, quote)


# -- what the fix checks and writes ------------------------------------------------------------

# torch factories that allocate on the CPU unless given device= (the *_like ones follow their input).
_FACTORIES = frozenset(
    {
        "tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange",
        "linspace", "Tensor", "FloatTensor", "LongTensor", "from_numpy",
    }
)


class _HostTensors(cst.CSTVisitor):
    """Finds, in an expression, a tensor that certainly lives on the host."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts
        self.moved: set[int] = set()  # factory calls that are the receiver of .to()/.cuda()
        self.found: str | None = None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            if func.attr.value in ("to", "cuda") and isinstance(func.value, cst.Call):
                self.moved.add(id(func.value))
            if func.attr.value == "cpu" and self.found is None:
                self.found = self.facts.code(node)
        if id(node) in self.moved or self.found is not None:
            return
        qual = self.facts.qualname(func) or ""
        if qual.startswith("torch.") and qual.split(".")[-1] in _FACTORIES and qual.count(".") == 1:
            if keyword(node, "device") is None:
                self.found = self.facts.code(node)


def _host_collective(facts: ScriptFacts) -> str | None:
    """The code of a collective that is handed a host tensor, if any."""
    for call in facts.calls:
        qual = call.qualname or ""
        if not qual.startswith("torch.distributed.") or qual.split(".")[-1] not in COLLECTIVES:
            continue
        for arg in call.node.args:
            for value in facts.binding_values(arg.value):
                finder = _HostTensors(facts)
                value.visit(finder)
                if finder.found is not None:
                    return facts.code(call.node)
    return None


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        return self.replacements.get(id(original_node), updated_node)


def _import_torch(module: cst.Module) -> cst.Module:
    """``import torch`` before the file's first top-level torch import (``import torch.distributed as
    dist``), where isort puts it, else after the last import."""
    body = list(module.body)
    for index, item in enumerate(body):
        dotted = imported_module(module, item)
        if dotted is not None and dotted.split(".")[0] == "torch":
            new = parse_statement("import torch", module).with_changes(leading_lines=item.leading_lines)
            body[index] = item.with_changes(leading_lines=[])
            body.insert(index, new)
            return module.with_changes(body=body)
    return ensure_import(module, "import torch")


class GlooOnCudaFix(Codemod):
    rule = "TC506"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        torch_name = torch_import_name(context.facts)
        test = f"{torch_name or 'torch'}.cuda.is_available()"
        replacements: dict[int, cst.BaseExpression] = {}
        for finding in findings:
            plan: ReplaceBackend = finding.fix.plan
            replacements[id(plan.backend)] = cst.IfExp(
                test=parse_expression(test, module),
                body=cst.SimpleString(f"{plan.quote}nccl{plan.quote}"),
                orelse=plan.backend,
            )
        new = module.visit(_Replace(replacements))
        if torch_name is None:
            new = _import_torch(new)
        return new
