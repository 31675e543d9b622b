"""TC104 vocab-unaligned, script level: a vocabulary size the script sets as a literal is not a multiple of 64.

The model audit (``tcaudit/model/tc104_vocab_unaligned.py``) measures the built model and reports
every unaligned vocabulary, with no fix. This half reads the script: a vocabulary size written as a
literal the script controls (a config dataclass field ``vocab_size: int = 50257``,
``GPTConfig(vocab_size=50257)``, ``dict(vocab_size=...)``, an argparse default, a constant or a
parameter default used by ``nn.Embedding``, or the literal in ``nn.Embedding``/``nn.Linear`` itself)
in a file that builds the embedding (or passes ``vocab_size=``) and trains. Fix (numerics): the
literal becomes the next multiple of 64. Declined where a checkpoint or pretrained weights are loaded,
where the size is also set from a tokenizer at run time, where the file samples from the logits, and
where the size feeds anything but the model's layers (``torch.randint(0, vocab_size, ...)`` would
then draw the padded ids as data). One finding per vocabulary size (``engine.one_vocab_finding``): a
fixable literal stands for the model audit's finding; a declined one gives its reason to the model
audit's finding, which keeps its location and measured cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.expressions import flag_dest, literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.triggers import all_of

VOCAB_MULTIPLE = 64
MIN_VOCAB = 512  # smaller tables are class or label lookups with no GEMM behind them (as the model audit)
_VOCAB_NAME = re.compile(r"vocab|^n_?tokens$|^num_tokens$", re.IGNORECASE)
_EMBEDDING = ("torch.nn.Embedding", "torch.nn.modules.sparse.Embedding")
_LINEAR = ("torch.nn.Linear", "torch.nn.modules.linear.Linear")
# Calls a vocabulary size may feed without its padding reaching the data or the output.
_SHAPE_METHODS = frozenset({"view", "reshape", "expand", "new_zeros", "new_empty", "new_full", "unflatten"})
_REPORTING = re.compile(r"(^|\.)(print|info|debug|warning|log|add_scalar|write|format)$")
_CHECKPOINT = re.compile(r"(^|\.)(from_pretrained|load_state_dict|load_checkpoint)$")
_SAMPLING = re.compile(r"(^|\.)(multinomial|argmax|generate)$")


def is_vocab_name(name: str | None) -> bool:
    return bool(name) and bool(_VOCAB_NAME.search(name.split(".")[-1]))


def padded(size: int) -> int:
    return -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass(frozen=True)
class VocabLiteral:
    """An integer literal that sets a vocabulary size, and the name it sets (``vocab_size``)."""

    node: cst.Integer
    name: str
    where: str  # "default", "assignment", "keyword", "argparse", "layer"


@dataclass(frozen=True, eq=False)
class PadVocab(FixPlan):
    kind = "replace-literal"
    literals: tuple[cst.Integer, ...]
    vocab_size: int
    padded: int
    lines: tuple[int, ...]


class VocabSizeLiteral(ScriptRule):
    id = "TC104"
    triggers = (all_of(BACKWARD_CALL, r"vocab|tokens|Embedding"),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.training_steps:
            return
        literals = _vocab_literals(facts)
        if not literals:
            return
        builds_vocab = any(
            (c.qualname or "") in _EMBEDDING
            or any(a.keyword is not None and a.keyword.value == "vocab_size" for a in c.node.args)
            for c in facts.calls
        )
        if not builds_vocab:
            return
        aligned = {lit.name for lit in literals if _value(lit) % VOCAB_MULTIPLE == 0}
        by_size: dict[int, list[VocabLiteral]] = {}
        for lit in literals:
            size = _value(lit)
            if size < MIN_VOCAB or size % VOCAB_MULTIPLE == 0:
                continue
            if lit.where == "default" and lit.name in aligned:
                continue  # ``GPTConfig(vocab_size=50304)`` overrides the dataclass default of 50257
            by_size.setdefault(size, []).append(lit)
        for size, sites in sorted(by_size.items()):
            first = min(sites, key=lambda lit: facts.line_of(lit.node))
            target = padded(size)
            names = sorted({lit.name for lit in sites})
            yield self.finding(
                facts,
                first.node,
                f"vocabulary size {size} (`{names[0]}`) is not a multiple of {VOCAB_MULTIPLE}: the LM head's GEMM "
                f"has N={size} (GPT-2's 50257 runs 5.4× slower than 50304 on an H200); pad it to {target}: "
                f"the embedding and the output layer get {target - size} rows no token id reaches",
                fix=self.planned_fix(
                    FixClass.NUMERICS,
                    f"pad the vocabulary size to {target}",
                    lambda sites=sites, size=size, target=target: _plan(facts, sites, size, target),
                ),
                details={"vocab_size": size, "suggested": target},
            )


def _value(lit: VocabLiteral) -> int:
    return int(lit.node.value.replace("_", ""), 0)


# -- detection --------------------------------------------------------------------------------------------


def _integer(expr: cst.BaseExpression | None) -> cst.Integer | None:
    return expr if isinstance(expr, cst.Integer) else None


def _vocab_literals(facts: ScriptFacts) -> list[VocabLiteral]:
    found: list[VocabLiteral] = []

    class _V(cst.CSTVisitor):
        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            name = get_full_name_for_node(node.target)
            value = _integer(node.value)
            if value is not None and is_vocab_name(name):
                found.append(VocabLiteral(value, name.split(".")[-1], "default"))

        def visit_Assign(self, node: cst.Assign) -> None:
            value = _integer(node.value)
            for target in node.targets:
                name = get_full_name_for_node(target.target)
                if value is not None and is_vocab_name(name):
                    found.append(VocabLiteral(value, name.split(".")[-1], "assignment"))

        def visit_Param(self, node: cst.Param) -> None:
            value = _integer(node.default)
            if value is not None and is_vocab_name(node.name.value):
                found.append(VocabLiteral(value, node.name.value, "default"))

        def visit_DictElement(self, node: cst.DictElement) -> None:
            key = literal(node.key)
            value = _integer(node.value)
            if value is not None and isinstance(key, str) and is_vocab_name(key):
                found.append(VocabLiteral(value, key, "keyword"))

        def visit_Call(self, node: cst.Call) -> None:
            for arg in node.args:
                value = _integer(arg.value)
                if value is not None and arg.keyword is not None and is_vocab_name(arg.keyword.value):
                    found.append(VocabLiteral(value, arg.keyword.value, "keyword"))
            qual = facts.qualname(node.func) or ""
            positional = [a.value for a in node.args if a.keyword is None and not a.star]
            if qual in _EMBEDDING and positional and _integer(positional[0]) is not None:
                found.append(VocabLiteral(positional[0], "num_embeddings", "layer"))
            if qual in _LINEAR:
                out = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "out_features"),
                           positional[1] if len(positional) > 1 else None)
                if _integer(out) is not None:
                    found.append(VocabLiteral(out, "out_features", "layer"))
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
                dest = flag_dest(node)
                default = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "default"), None)
                if _integer(default) is not None and is_vocab_name(dest):
                    found.append(VocabLiteral(default, dest, "argparse"))

    facts.module.visit(_V())
    # Literals in the layers are a vocabulary only as a pair: an embedding and a head of the same size
    # (``nn.Embedding(10_000, 128)`` before an LSTM classifier is a lookup with no GEMM behind it).
    embedding_sizes = {_value(lit) for lit in found if lit.name == "num_embeddings"}
    head_sizes = {_value(lit) for lit in found if lit.name == "out_features"}
    named_sizes = {_value(lit) for lit in found if lit.where != "layer"}
    return [
        lit for lit in found
        if lit.where != "layer"
        or (lit.name == "num_embeddings" and _value(lit) in head_sizes)
        or (lit.name == "out_features" and _value(lit) in embedding_sizes | named_sizes)
    ]


# -- the plan ---------------------------------------------------------------------------------------------


def _plan(facts: ScriptFacts, sites: list[VocabLiteral], size: int, target: int) -> PadVocab:
    for call in facts.calls:
        name = call.name or ""
        qual = call.qualname or ""
        where = f"`{facts.module.code_for_node(call.node.func)}(...)` at line {facts.line_of(call.node)}"
        if _CHECKPOINT.search(name) or qual == "torch.load":
            raise DeclineFix(
                f"the file loads weights ({where}) whose embedding has {size} rows; pad the vocabulary by hand "
                "(and the checkpoint's embedding and head) or not at all"
            )
        if _SAMPLING.search(name) or _SAMPLING.search(qual):
            raise DeclineFix(
                f"the file samples from the logits ({where}), which could emit the {target - size} padded ids; "
                f"pad by hand and mask `logits[..., {size}:]` to -inf there"
            )
    names = {lit.name for lit in sites}
    _check_runtime_sizes(facts, names)
    _check_uses(facts, names)
    literals = tuple(lit.node for lit in sites)
    return PadVocab(literals, size, target, tuple(sorted(facts.line_of(n) for n in literals)))


def _check_runtime_sizes(facts: ScriptFacts, names: set[str]) -> None:
    """Another value of the same name set at run time (``config.vocab_size = len(tokenizer)``,
    ``GPTConfig(vocab_size=tokenizer.vocab_size)``): the literal may not be what trains."""

    def check(name: str | None, value: cst.BaseExpression | None, node: cst.CSTNode) -> None:
        if value is None or name is None or name.split(".")[-1] not in names:
            return
        if isinstance(value, cst.Integer):
            return
        dotted = get_full_name_for_node(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        if dotted is not None and dotted.split(".")[-1] in names and "token" not in dotted:
            return  # ``vocab_size=vocab_size``, ``vocab_size=config.vocab_size``: the same value passed on
        code = facts.module.code_for_node(node)
        raise DeclineFix(
            f"the vocabulary size is also set at run time (`{code.strip()}`, line {facts.line_of(node)}); "
            "a size derived from a tokenizer is padded in the model config by hand"
        )

    class _V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                check(get_full_name_for_node(target.target), node.value, node)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            check(get_full_name_for_node(node.target), node.value, node)

        def visit_Arg(self, node: cst.Arg) -> None:
            if node.keyword is not None:
                check(node.keyword.value, node.value, node)

        def visit_DictElement(self, node: cst.DictElement) -> None:
            key = literal(node.key)
            check(key if isinstance(key, str) else None, node.value, node)

        def visit_Param(self, node: cst.Param) -> None:
            check(node.name.value, node.default, node)

    facts.module.visit(_V())


def _check_uses(facts: ScriptFacts, names: set[str]) -> None:
    """The size may feed the model's layers, shapes of its outputs, configs and logging; anything else
    (``torch.randint(0, vocab_size, ...)``, ``F.one_hot(y, vocab_size)``) would see the padded ids."""
    for call in facts.calls:
        qual = call.qualname or ""
        name = call.name or ""
        reporting = _REPORTING.search(name) and not qual.startswith(("math.", "torch.", "numpy."))
        if qual in _EMBEDDING or qual in _LINEAR or call.method in _SHAPE_METHODS or reporting:
            continue
        if isinstance(call.node.func, cst.Attribute) and call.node.func.attr.value == "add_argument":
            continue
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value in names:
                continue  # passed on to a config or model under its own name
            if _mentions(arg.value, names):
                raise DeclineFix(
                    f"the vocabulary size also feeds `{facts.module.code_for_node(call.node).strip()}` "
                    f"(line {facts.line_of(call.node)}), which would then see the padded ids; pad by hand"
                )


def _mentions(expr: cst.CSTNode, names: set[str]) -> bool:
    """Whether ``expr`` itself names the size; a call inside it is judged as a call of its own."""
    found = False

    class _V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            return False

        def visit_Name(self, node: cst.Name) -> None:
            nonlocal found
            found |= node.value in names

        def visit_Attribute(self, node: cst.Attribute) -> None:
            nonlocal found
            found |= node.attr.value in names

    expr.visit(_V())
    return found


# -- the fix ----------------------------------------------------------------------------------------------


class PadVocabFix(Codemod):
    rule = "TC104"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        replace: dict[int, str] = {}
        for finding in findings:
            plan: PadVocab = finding.fix.plan
            for node in plan.literals:
                replace[id(node)] = str(plan.padded)

        class _T(cst.CSTTransformer):
            def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.Integer:
                new = replace.get(id(original_node))
                return updated_node.with_changes(value=new) if new is not None else updated_node

        return module.visit(_T())
