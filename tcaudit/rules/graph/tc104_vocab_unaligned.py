"""TC104 vocab-unaligned: a token embedding (and the LM head that shares its size) whose vocabulary
is not a multiple of 64. Only where a softmax ranges over the embedding's rows: a GEMM producing that
many outputs from vectors of the embedding's width, or a linear layer tied to it.

Two halves, one rule. The model half reads what the model audit measured of the built model and
reports every unaligned vocabulary a softmax ranges over, with no fix. The script half reports a
vocabulary size the script sets as a literal that is not a multiple of 64: a vocabulary size written as a
literal the script controls (a config dataclass field ``vocab_size: int = 50257``,
``GPTConfig(vocab_size=50257)``, ``dict(vocab_size=...)``, an argparse default, a constant or a
parameter default used by ``nn.Embedding``, or the literal in ``nn.Embedding``/``nn.Linear`` itself)
in a file that trains and where a softmax ranges over the vocabulary (an ``nn.Linear(d, V)`` head in
the class that builds the embedding, tied or not, or ``F.linear(h, emb.weight)``; a size passed as
``vocab_size=`` to a model built elsewhere counts as one). Fix (numerics): the
literal becomes the next multiple of 64. Declined where a checkpoint or pretrained weights are loaded,
where the size is also set from a tokenizer at run time, and where the size feeds anything but the
model's layers (``torch.randint(0, vocab_size, ...)`` would then draw the padded ids as data). In that
last case the padding moves to the trained model's
construction instead: ``GPT(config)`` becomes ``GPT(dataclasses.replace(config, vocab_size=<padded>))``
and ``GPT(vocab_size=v)`` (or ``RNNModel(kind, v)``, by position to a class of this file) becomes
``GPT(vocab_size=<v padded>)``, so the model's embedding and head grow while the data keeps drawing ids
below the real vocabulary; the model's output flattened by the size (``model(x).view(-1, v)``) is
flattened by the padded size (declined when the training code outside the model shapes anything else
by the size, e.g. ``F.one_hot(y, vocab_size)``).

Where the file samples or decodes from the logits (``torch.multinomial``, ``argmax``, ``topk``, also in a
nanoGPT-style ``generate`` method of the model), each sampler's input is followed back to the padded
model's output (``tcaudit/rules/graph/logits_reads.py``) and that read gets ``[..., :<real size>]`` appended
(``logits[:, -1, :][..., :50257] / temperature``): a slice, not a -inf mask, so argmax, top-k and
multinomial see exactly the unpadded model's logits and return the same indices, in any dtype. The
bound is a name that still holds the real size where the read is (outside the model, the construction's
own argument: ``vocab``, ``config.vocab_size``); inside the model, or after the literal itself is padded,
every name holds the padded size and the bound is the literal, used only where no other literal or
command-line option may set the size. A read the script already bounds by the real size is left alone
(one bounded by a name that the fix pads gets the real size as its bound). Declined, naming the line,
where the padded ids could still be read as tokens: a ``generate`` this file does not define (Hugging
Face's), a sampler's input that cannot be followed to the model (a parameter, a helper's result other
than the whole output, a view that may merge the vocabulary with another dimension, as in beam search),
``np.random.choice``/``random.choices`` weighted by the logits, the logits' width (``logits.size(-1)``
of an unbounded read) taken as a size by a sampler or a token draw, or no name or safe literal for the
real size at the read. The loss keeps the padded logits (targets stay below the real size).

One finding per vocabulary size (``VocabSizeLiteral.merge_model_findings``): a
fixable literal stands for the model audit's finding; a declined one gives its reason to the model
audit's finding, which keeps its location and measured cost.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.model.cost import round_up
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.rewrite.codemod import FixContext, ensure_import, parse_expression
from tcaudit.rules.base import Codemod, ModelContext, ModelRule, RuleContext, ScriptRule
from tcaudit.rules.graph.logits_reads import (
    LogitsRead,
    Untraceable,
    binds,
    is_parameter,
    sampler_calls,
    sampler_input,
    size_reads,
    trace_logits,
)
from tcaudit.rules.graph.model_reports import impact_text
from tcaudit.script.callers import callers_of, parameter_receiving
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.expressions import CHECKPOINT_LOAD, REPORTING_CALL, flag_dest, literal
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.model_classes import callee_class, class_of, classes_building, holds_config
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import enclosing_function, full_name, keyword, parent_map
from tcaudit.source.triggers import all_of
from tcaudit.source.walk import walk

# The one padding policy of a vocabulary, for both halves: the next multiple of 64.
VOCAB_MULTIPLE = 64
MIN_VOCAB = 512  # smaller tables are class or label lookups with no GEMM behind them
# A vocabulary that is a multiple of 8 is 16-byte aligned already: the LM head misses only the last
# percent (rules/TC104.toml: 50264 ran 1.01x the time of 50304 on an H200), so the advice is info.
ALIGNED_VOCAB = 8


class VocabUnaligned(ModelRule):
    id = "TC104"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        embeddings: dict[int, list[str]] = {}
        widths: dict[int, set[int]] = {}  # rows → the embedding dims of the tables of that many rows
        for op in facts.ops_of("embedding"):
            rows = op.info["rows"]
            if rows >= MIN_VOCAB and rows % VOCAB_MULTIPLE and op.module is not None:
                embeddings.setdefault(rows, [])
                widths.setdefault(rows, set()).add(op.info["dim"])
                if op.module not in embeddings[rows]:
                    embeddings[rows].append(op.module)
        reached = {op.module for op in facts.ops}
        for module in facts.modules.values():
            rows = module.attrs.get("num_embeddings", 0)
            if module.attrs.get("role") == "embedding" and rows >= MIN_VOCAB and rows % VOCAB_MULTIPLE:
                if module.path not in reached or facts.capture.method == "parameters":
                    embeddings.setdefault(rows, [])
                    widths.setdefault(rows, set()).add(module.attrs.get("embedding_dim"))
                    if module.path not in embeddings[rows]:
                        embeddings[rows].append(module.path)
        for rows, paths in sorted(embeddings.items()):
            # Only a table whose rows a softmax ranges over: a GEMM that produces `rows` logits from
            # vectors of the embedding's width (an LM head, tied or not, or F.linear(h, emb.weight)).
            # A user, position or class table has no GEMM over its rows and nothing to pad.
            heads = [op for op in facts.ops_of("gemm") if op.info["n"] == rows and op.info["k"] in widths[rows]]
            tied = [m.path for m in facts.modules.values() if m.attrs.get("tied_to") in paths]
            untraced = [
                m.path for m in facts.modules.values()
                if m.attrs.get("role") == "linear" and m.attrs.get("out_features") == rows
                and m.attrs.get("in_features") in widths[rows]
            ] if facts.capture.method == "parameters" or not facts.ops_of("gemm") else []
            if heads or tied or untraced:
                yield self._report(context, rows, paths, heads)

    def _report(self, context: ModelContext, rows: int, embedding_paths: list[str], heads: list[OpFact]) -> Finding:
        cost = context.cost_model
        facts = context.facts
        dtype = cost.dtype(heads[0]) if heads else facts.compute_dtype
        padded = padded_size(rows)
        head_paths = []
        for op in heads:
            if op.module is not None and op.module not in head_paths:
                head_paths.append(op.module)
        if not heads:
            head_paths = [m.path for m in facts.modules.values()
                          if m.attrs.get("role") == "linear" and m.attrs["out_features"] == rows]
        tied = any(facts.modules.get(path) and facts.modules[path].attrs.get("tied_to") for path in head_paths)
        if heads:
            first = heads[0]
            penalty = cost.gemm_kn_penalty(first.info["k"], first.info["n"], dtype)
            if penalty == 1.0:
                penalty = cost.not_64_penalty()
            estimate = cost.compute_cost(heads, penalty)
            site = context.op_site(first)
        else:
            head_module = facts.modules.get(head_paths[0]) if head_paths else None
            if head_module is not None and head_module.site is not None:
                penalty = cost.gemm_kn_penalty(head_module.attrs["in_features"], head_module.attrs["out_features"], dtype)
                estimate = cost.parameter_cost(head_module.attrs, penalty if penalty > 1 else cost.not_64_penalty())
                site = head_module.site
            else:
                estimate = None
                site = context.module_site(embedding_paths[0]) or context.target_site()
        parts = [f"embedding `{embedding_paths[0]}`"]
        if head_paths:
            parts.append(f"LM head `{head_paths[0]}`" + (" (tied)" if tied else ""))
        message = (
            f"vocabulary size {rows} ({', '.join(parts)}) is not a multiple of {VOCAB_MULTIPLE}: "
            f"pad it to {padded}"
        )
        explanation = ""
        if estimate is not None and heads:
            explanation = (
                f"The {short_dtype(dtype)} LM-head GEMM with N={rows} runs ~{estimate.penalty:.1f}× slower "
                f"on {cost.device_name} [{impact_text(estimate)}]."
            )
        elif estimate is None:
            explanation = "The lookup itself is cheap, but any GEMM over this vocabulary will be unaligned."
        details = {
            "module": embedding_paths[0],
            "embeddings": embedding_paths,
            "heads": head_paths,
            "tied": tied,
            "vocab_size": rows,
            "suggested": padded,
            "dtype": dtype,
        }
        if heads:
            details["shapes"] = heads[0].shapes
        severity = None
        if rows % ALIGNED_VOCAB == 0:
            message += " (already a multiple of 8: ~1% to gain)"
            severity = Severity.INFO
        return self.finding(context, site, message, severity=severity, cost=estimate, details=details,
                            explanation=explanation)


# -- the script half -------------------------------------------------------------------------------


ALIGNED_NOTE = " (already a multiple of 8: ~1% to gain)"
ALIGNED_WHY = ("The size is a multiple of 8, so the LM head's GEMM is 16-byte aligned already: a multiple of "
               "64 gains about 1% more (50264 ran 1.01x the time of 50304 on an H200).")
_VOCAB_NAME = re.compile(r"vocab|^n_?tokens$|^num_tokens$", re.IGNORECASE)
_EMBEDDING = ("torch.nn.Embedding", "torch.nn.modules.sparse.Embedding")
_LINEAR = ("torch.nn.Linear", "torch.nn.modules.linear.Linear")
# Calls a vocabulary size may feed without its padding reaching the data or the output.
_SHAPE_METHODS = frozenset({"view", "reshape", "expand", "new_zeros", "new_empty", "new_full", "unflatten"})
# Synthetic token draws: below the real vocabulary they stay valid ids of the padded model.
_TOKEN_DRAWS = re.compile(r"(^|\.)randint$")


def is_vocab_name(name: str | None) -> bool:
    return bool(name) and bool(_VOCAB_NAME.search(name.split(".")[-1]))


def padded_size(size: int) -> int:
    """A vocabulary's padded size: the next multiple of :data:`VOCAB_MULTIPLE`."""
    return round_up(size, VOCAB_MULTIPLE)


@dataclass(frozen=True)
class VocabLiteral:
    """An integer literal that sets a vocabulary size, and the name it sets (``vocab_size``)."""

    node: cst.Integer
    name: str
    where: str  # "default", "assignment", "keyword", "argparse", "layer"


@dataclass(frozen=True)
class LogitsSlice:
    """A read of the padded model's logits by a sampler or decoder: ``node`` gets ``[..., :bound]``
    appended (the real vocabulary), or, with ``replace``, ``node`` is the upper bound of the script's
    own slice, which would hold the padded size after the fix, and becomes ``bound``."""

    node: cst.BaseExpression
    bound: str
    replace: bool = False


@dataclass(frozen=True, eq=False)
class PadVocab(FixPlan):
    kind = "replace-literal"
    literals: tuple[cst.Integer, ...]
    vocab_size: int
    padded: int
    lines: tuple[int, ...]
    slices: tuple[LogitsSlice, ...] = ()


@dataclass(frozen=True)
class PaddedArgument:
    """An argument of the trained model's construction that becomes ``code`` (the size padded);
    ``real`` is the expression that still holds the real size after the edit (``vocab``,
    ``config.vocab_size``), empty for the model's output flattened by the size."""

    node: cst.BaseExpression
    code: str
    real: str = ""


@dataclass(frozen=True, eq=False)
class PadAtConstruction(FixPlan):
    """The size stays as the script sets it (its data draws ids below it); the model is built padded."""

    kind = "replace-argument"
    arguments: tuple[PaddedArgument, ...]
    vocab_size: int
    padded: int
    needs_dataclasses: bool
    slices: tuple[LogitsSlice, ...] = ()


def padded_code(expr: str) -> str:
    """``expr`` rounded up to the next multiple of VOCAB_MULTIPLE, as Python code."""
    return f"({expr} + {VOCAB_MULTIPLE - 1}) // {VOCAB_MULTIPLE} * {VOCAB_MULTIPLE}"


_PADDED_CODE = re.compile(rf"//\s*{VOCAB_MULTIPLE}\s*\*\s*{VOCAB_MULTIPLE}\b")


class VocabSizeLiteral(ScriptRule):
    id = "TC104"
    triggers = (all_of(BACKWARD_CALL, r"vocab|tokens|Embedding"),)

    @classmethod
    def merge_model_findings(cls, script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
        """One TC104 per unaligned vocabulary size: where the script's literal can be padded, its
        finding (at the literal, with the fix) stands for the model audit's; where that fix is declined,
        the model audit's (at the head, with its measured cost) stays and carries the script's reason."""
        literals = {f.details.get("vocab_size"): f for f in script}
        kept_script, kept_model = list(script), []
        for finding in model:
            twin = literals.get(finding.details.get("vocab_size"))
            if twin is None:
                kept_model.append(finding)
            elif twin.fix is not None and not twin.fix.available:
                kept_script.remove(twin)
                finding.fix = twin.fix
                kept_model.append(finding)
        return kept_script, kept_model

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.training_steps:
            return
        literals = _vocab_literals(facts)
        if not literals:
            return
        builds_vocab = any(
            (c.qualname or "") in _EMBEDDING
            or keyword(c.node, "vocab_size") is not None
            for c in facts.calls
        )
        if not builds_vocab:
            return
        aligned = {lit.name for lit in literals if _value(lit) % VOCAB_MULTIPLE == 0}
        padded_where_built = _padded_at_construction(facts)
        by_size: dict[int, list[VocabLiteral]] = {}
        for lit in literals:
            size = _value(lit)
            if size < MIN_VOCAB or size % VOCAB_MULTIPLE == 0:
                continue
            if lit.where == "default" and lit.name in aligned:
                continue  # ``GPTConfig(vocab_size=50304)`` overrides the dataclass default of 50257
            if lit.name in padded_where_built:
                continue  # the model is built with the size padded (this fix's construction edit)
            by_size.setdefault(size, []).append(lit)
        cost = context.cost(self.spec, "gpt2_head")
        for size, sites in sorted(by_size.items()):
            if not _feeds_a_softmax_over_rows(facts, size, _size_names(facts, {lit.name for lit in sites})):
                continue
            first = min(sites, key=lambda lit: facts.line_of(lit.node))
            target = padded_size(size)
            names = sorted({lit.name for lit in sites})
            aligned8 = size % ALIGNED_VOCAB == 0
            yield self.finding(
                facts,
                first.node,
                f"vocabulary size {size} (`{names[0]}`) is not a multiple of {VOCAB_MULTIPLE}; pad it to {target}"
                + (ALIGNED_NOTE if aligned8 else ""),
                severity=Severity.INFO if aligned8 else None,
                explanation=(ALIGNED_WHY if aligned8 else f"The LM head's GEMM has N={size}{cost}.")
                + f" Padded to {target}, the embedding and the output layer get {target - size} rows no token id reaches.",
                fix=self.planned_fix(
                    FixClass.NUMERICS,
                    f"pad the vocabulary size to {target}",
                    lambda sites=sites, size=size, target=target: _plan(facts, sites, size, target),
                ),
                details={"vocab_size": size, "suggested": target},
            )


def _value(lit: VocabLiteral) -> int:
    return _literal_int(lit.node)  # type: ignore[return-value]  # an Integer, by construction


def _padded_at_construction(facts: ScriptFacts) -> set[str]:
    """The names a vocabulary argument already pads (``vocab_size=(vocab + 63) // 64 * 64`` or the same
    expression by position, this fix's own edit at the model's construction): ``vocab`` keeps its literal
    and is not reported again."""
    out: set[str] = set()
    for call in facts.calls:
        for arg in call.node.args:
            # By keyword (``vocab_size=...``) or by position (``LM((vocab + 63) // 64 * 64)``, the edit for a
            # size passed positionally): the padding expression itself says what it is.
            if arg.keyword is None or is_vocab_name(arg.keyword.value):
                if _PADDED_CODE.search(facts.code(arg.value)):
                    out |= _names_in(arg.value)
    return out


def _names_in(expr: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> None:
            found.add(node.attr.value)

    expr.visit(_V())
    return found


# -- detection --------------------------------------------------------------------------------------------


def _integer(expr: cst.BaseExpression | None) -> cst.Integer | None:
    return expr if isinstance(expr, cst.Integer) else None


def _vocab_literals(facts: ScriptFacts) -> list[VocabLiteral]:
    found: list[VocabLiteral] = []

    class _V(cst.CSTVisitor):
        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            name = full_name(node.target)
            value = _integer(node.value)
            if value is not None and is_vocab_name(name):
                found.append(VocabLiteral(value, name.split(".")[-1], "default"))

        def visit_Assign(self, node: cst.Assign) -> None:
            value = _integer(node.value)
            for target in node.targets:
                name = full_name(target.target)
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
                out = keyword(node, "out_features", 1)
                if out is not None and _integer(out.value) is not None:
                    found.append(VocabLiteral(out.value, "out_features", "layer"))
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
                dest = flag_dest(node)
                default = keyword(node, "default")
                if default is not None and _integer(default.value) is not None and is_vocab_name(dest):
                    found.append(VocabLiteral(default.value, dest, "argparse"))

    walk(facts.module, _V())
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


def _feeds_a_softmax_over_rows(facts: ScriptFacts, size: int, names: _SizeNames) -> bool:
    """Whether the vocabulary is a softmax's: an ``nn.Linear(d, V)`` head (tied or not),
    ``F.linear(h, emb.weight)`` or ``h @ emb.weight.T`` over an embedding of V rows. A table of V rows
    with no such head (a recommender's users, positions, a GAN's class conditioning, a text classifier's
    tokens before an LSTM) is a lookup with no GEMM over its rows. With no embedding of V rows in the
    file, the size passed as ``vocab_size=`` configures a language model built elsewhere."""
    embeddings = [c for c in facts.calls if (c.qualname or "") in _EMBEDDING and _sizes(c.arg("num_embeddings", 0), size, names, _owner(c))]
    if not embeddings:
        settings = names.own - {"num_embeddings", "out_features"}  # the layers' own arguments are not a config
        return any(a.keyword is not None and a.keyword.value in settings for c in facts.calls for a in c.node.args)
    dims = {_literal_int(c.arg("embedding_dim", 1)) for c in embeddings}
    # A head counts beside an embedding of this size in the same model class (or the same function or
    # module level): another class's ``vocab_size`` parameter may be another vocabulary.
    owners = {_owner(c) for c in embeddings}
    for call in facts.calls:
        qual = call.qualname or ""
        if _owner(call) not in owners:
            continue
        if qual in _LINEAR and _sizes(call.arg("out_features", 1), size, names, _owner(call)):
            width = _literal_int(call.arg("in_features", 0))
            if width is None or None in dims or width in dims:
                return True  # ``nn.Linear(512, 1000)`` after ``nn.Embedding(1000, 100)`` is another table's size
        if qual in ("torch.nn.functional.linear", "torch.matmul", "torch.mm") and len(call.node.args) > 1:
            if _embedding_weight(facts, call.node.args[1].value, size, names):
                return True
    return any(
        _embedding_weight(facts, node.right, size, names) for node in _matmuls(facts.module)
    )


def _owner(call: CallSite) -> cst.CSTNode | None:
    return call.ctx.class_def or call.ctx.function


@dataclass(frozen=True)
class _SizeNames:
    """The names one vocabulary size is set under."""

    own: set[str]
    # Parameters whose default is one of ``own`` (``vocab_size=BPE_VOCAB``), with the class (or
    # function) that declares them: the same parameter name elsewhere may be another vocabulary.
    defaults_to_own: set[tuple[cst.CSTNode | None, str]]


def _size_names(facts: ScriptFacts, own: set[str]) -> _SizeNames:
    defaults = set()
    classes: dict[str, cst.ClassDef] = {}
    for fn, ctx in facts.functions:
        if ctx.class_def is not None and fn.name.value == "__init__":
            classes[ctx.class_def.name.value] = ctx.class_def
        for param in (*fn.params.params, *fn.params.kwonly_params):
            default = full_name(param.default) if param.default is not None else None
            if default is not None and default.split(".")[-1] in own:
                defaults.add((ctx.class_def or fn, param.name.value))
    # ``LM(vocab_size=vocab)``, ``RNNModel(kind, ntokens, ...)``: the class's parameter (by keyword, or the
    # one at that position of its ``__init__``) carries this size too.
    for call in facts.calls:
        cls = classes.get(call.name or "")
        if cls is None:
            continue
        for arg in call.node.args:
            value = full_name(arg.value) if isinstance(arg.value, (cst.Name, cst.Attribute)) else None
            if value is None or value.split(".")[-1] not in own:
                continue
            parameter = arg.keyword.value if arg.keyword is not None else _positional_parameter(facts, call.node, arg)
            if parameter is not None:
                defaults.add((cls, parameter))
    return _SizeNames(own, defaults)


def _positional_parameter(facts: ScriptFacts, call: cst.Call, arg: cst.Arg) -> str | None:
    """The ``__init__`` parameter of this file's class that a positional argument of its construction
    binds (``RNNModel("LSTM", ntokens)`` → ``ntoken``); None for a ``*args``, a star before it, or a class
    whose ``__init__`` this file does not define once."""
    if arg.keyword is not None or arg.star:
        return None
    positional = []
    for a in call.args:
        if a.star:
            return None
        if a.keyword is None:
            positional.append(a)
    index = next(i for i, a in enumerate(positional) if a is arg)
    name = (full_name(call.func) or "").split(".")[-1]
    inits = [
        fn for fn, ctx in facts.functions
        if fn.name.value == "__init__" and ctx.class_def is not None and ctx.class_def.name.value == name
    ]
    if len(inits) != 1 or len([c for c, _ in facts.classes if c.name.value == name]) != 1:
        return None
    parameters = [*inits[0].params.posonly_params, *inits[0].params.params][1:]  # after ``self``
    return parameters[index].name.value if index < len(parameters) else None


def _sizes(expr: cst.BaseExpression | None, size: int, names: _SizeNames, owner: cst.CSTNode | None) -> bool:
    """Whether a layer's size argument is this vocabulary: the literal, a name it sets (``vocab_size``,
    ``config.vocab_size``), or a parameter of the same class whose default is that name."""
    if expr is None:
        return False
    if isinstance(expr, cst.Integer):
        return _literal_int(expr) == size
    dotted = full_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if dotted is None:
        return False
    last = dotted.split(".")[-1]
    return last in names.own or (owner, last) in names.defaults_to_own


def _literal_int(expr: cst.BaseExpression | None) -> int | None:
    return int(expr.value.replace("_", ""), 0) if isinstance(expr, cst.Integer) else None


def _embedding_weight(facts: ScriptFacts, expr: cst.BaseExpression, size: int, names: _SizeNames) -> bool:
    """``emb.weight`` (``.T``, ``.t()``, ``.transpose(0, 1)``) of a name bound to an embedding of this size."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("t", "transpose"):
            expr = expr.func.value
        elif isinstance(expr, cst.Attribute) and expr.attr.value in ("T", "mT"):
            expr = expr.value
        else:
            break
    if not (isinstance(expr, cst.Attribute) and expr.attr.value == "weight"):
        return False
    table = full_name(expr.value)
    for binding in facts.bindings_of(table or ""):
        value = binding.value
        if isinstance(value, cst.Call) and (facts.qualname(value.func) or "") in _EMBEDDING:
            first = next((a.value for a in value.args if a.keyword is None or a.keyword.value == "num_embeddings"), None)
            if _sizes(first, size, names, binding.ctx.class_def or binding.ctx.function):
                return True
    return False


def _matmuls(module: cst.Module) -> list[cst.BinaryOperation]:
    found: list[cst.BinaryOperation] = []

    class _V(cst.CSTVisitor):
        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            if isinstance(node.operator, cst.MatrixMultiply):
                found.append(node)

    module.visit(_V())
    return found


# -- the plan ---------------------------------------------------------------------------------------------


def _plan(facts: ScriptFacts, sites: list[VocabLiteral], size: int, target: int) -> PadVocab | PadAtConstruction:
    for call in facts.calls:
        name = call.name or ""
        qual = call.qualname or ""
        where = f"`{facts.code(call.node.func)}(...)` at line {facts.line_of(call.node)}"
        if CHECKPOINT_LOAD.search(name) or qual == "torch.load":
            raise DeclineFix(
                f"the file loads weights ({where}) whose embedding has {size} rows; pad the vocabulary by hand "
                "(and the checkpoint's embedding and head) or not at all"
            )
    names = {lit.name for lit in sites}
    reads = _sampled_reads(facts, sites, size, target)
    bounds = {id(read.bound) for read in reads if read.bound is not None}
    _check_runtime_sizes(facts, names)
    try:
        _check_uses(facts, names, bounds)
    except DeclineFix as feeds_data:
        plan = _construction_plan(facts, sites, names, size, target, feeds_data, bounds)
        return dataclasses.replace(plan, slices=_slices(facts, reads, sites, size, plan.arguments))
    literals = tuple(lit.node for lit in sites)
    slices = _slices(facts, reads, sites, size, ())
    return PadVocab(literals, size, target, tuple(sorted(facts.line_of(n) for n in literals)), slices)


# -- sampling from the padded logits -----------------------------------------------------------------------


def _sampled_reads(facts: ScriptFacts, sites: list[VocabLiteral], size: int, target: int) -> list[LogitsRead]:
    """Every read of the padded model's logits that a sampler or decoder takes (``torch.multinomial``,
    ``argmax``, ``topk``, also inside a ``generate`` method of the model), followed back to the model's
    output. Declined where the padded ids could still be read as tokens: a ``generate`` this file does not
    define (Hugging Face's), a sampler whose input cannot be followed, a weighted ``choice`` over the
    logits, or the logits' last dimension (``logits.size(-1)``) of an unsliced read taken as a size by a
    sampler or a token draw."""
    names = _size_names(facts, {lit.name for lit in sites})
    classes = _model_classes(facts, size, names)
    models = _padded_models(facts, size, names, classes)
    defined = {fn.name.value for fn, ctx in facts.functions if ctx.class_def is None or ctx.class_def.name.value in classes}
    for call in facts.calls:
        if (call.method or call.name) == "generate" and "generate" not in defined:
            raise DeclineFix(
                f"`{facts.code(call.node.func)}(...)` (line {facts.line_of(call.node)}) samples from the "
                f"logits in code outside this file, which could emit the {target - size} padded ids; pad by hand"
            )

    def model_output(call: cst.Call, scope: cst.FunctionDef | None) -> bool:
        dotted = full_name(call.func) or ""
        owner = class_of(facts, scope)
        if dotted in ("self", "self.forward"):
            return owner is not None and owner.name.value in classes
        if scope is not None and is_parameter(scope, dotted.split(".")[0]):
            return _receives_a_model(facts, scope, dotted, models)
        return dotted in models

    def is_size(expr: cst.BaseExpression) -> bool:
        return _literal_int(expr) == size or _names_the_size(expr, names.own)

    def trace(expr: cst.BaseExpression) -> list[LogitsRead]:
        return trace_logits(facts, expr, model_output, is_size)

    reads: dict[int, LogitsRead] = {}
    samplers = sampler_calls(facts)
    for call in samplers:
        expr = sampler_input(call)
        try:
            for read in trace(expr) if expr is not None else ():
                reads.setdefault(id(read.node), read)
        except Untraceable as stop:
            raise DeclineFix(
                f"the file samples from the logits at line {facts.line_of(call.node)}, but {stop}, "
                f"so the {target - size} padded ids could be emitted; pad by hand"
            ) from None
    _check_weighted_choices(facts, trace, target - size)
    _check_width_reads(facts, trace, samplers, reads)
    return list(reads.values())


_Trace = Callable[[cst.BaseExpression], "list[LogitsRead]"]  # a sampler's input -> the logits reads it takes


def _check_weighted_choices(facts: ScriptFacts, trace: _Trace, extra: int) -> None:
    """``np.random.choice(len(p), p=p)``, ``random.choices(ids, weights=p)`` over the logits: the population
    is sized apart from the probabilities, so bounding the read would not cover it; declined."""
    for call in facts.calls:
        if not (call.name or "").endswith(("choice", "choices")):
            continue
        weights = call.arg("p") or call.arg("weights")
        if weights is None:
            continue
        try:
            covered = not trace(weights)
        except Untraceable:
            covered = False
        if not covered:
            raise DeclineFix(
                f"`{facts.code(call.node.func)}(...)` (line {facts.line_of(call.node)}) may sample from "
                f"the padded logits, which could emit the {extra} padded ids; pad by hand"
            )


def _check_width_reads(facts: ScriptFacts, trace: _Trace, samplers: list[CallSite], reads: dict[int, LogitsRead]) -> None:
    """``logits.size(-1)`` taken as a size by a sampler or a token draw must read bounded logits (nanoGPT's
    ``torch.topk(logits, min(top_k, logits.size(-1)))`` does, after the bound); unbounded it is the padded
    width: ``torch.randint(0, logits.size(-1), ...)`` would draw padded ids. Declined then."""
    draws = [c for c in facts.calls if _TOKEN_DRAWS.search(c.qualname or c.name or "")]
    for call in [*samplers, *draws]:
        for arg in call.node.args:
            for tensor in size_reads(arg.value):
                try:
                    found = trace(tensor)
                except Untraceable:
                    continue  # not followed to the model: not the padded logits as far as the file shows
                if any(id(r.node) not in reads and r.bound is None for r in found):
                    raise DeclineFix(
                        f"`{facts.code(call.node).strip()[:60]}` (line {facts.line_of(call.node)}) takes "
                        "the padded logits' last dimension as a size; pad by hand"
                    )


def _model_classes(facts: ScriptFacts, size: int, names: _SizeNames) -> set[str]:
    """This file's classes that build the embedding of this size (the model whose logits are padded)."""
    # Only the classes whose own code builds it (``self(...)`` in their ``generate`` is the padded model).
    # A class that builds such a class is not followed: it may hold the model without being it (a trainer's
    # ``self.model = GPT(config)``), and its methods read the logits from outside.
    return classes_building(
        facts,
        lambda c: (c.qualname or "") in _EMBEDDING and _sizes(c.arg("num_embeddings", 0), size, names, _owner(c)),
        through_classes=False,
    )


def _padded_models(facts: ScriptFacts, size: int, names: _SizeNames, classes: set[str]) -> set[str]:
    """The names that hold a trained model built with the padded embedding: one of ``classes``, or a
    construction that holds the embedding itself (``nn.Sequential(nn.Embedding(V, d), ...)``)."""
    embeddings = {
        id(c.node) for c in facts.calls
        if (c.qualname or "") in _EMBEDDING and _sizes(c.arg("num_embeddings", 0), size, names, _owner(c))
    }
    out = set()
    for site in pipeline_facts(facts).trained_models:
        if callee_class(site.construction) in classes or _contains(site.construction, embeddings):
            out.add(site.name)
    return out


def _contains(node: cst.CSTNode, ids: set[int]) -> bool:
    found = False

    class _V(cst.CSTVisitor):
        def on_visit(self, inner: cst.CSTNode) -> bool:
            nonlocal found
            found |= id(inner) in ids
            return not found

    node.visit(_V())
    return found


def _receives_a_model(facts: ScriptFacts, fn: cst.FunctionDef, dotted: str, models: set[str]) -> bool:
    """``model`` is a parameter of ``fn`` and every call of ``fn`` in the file passes it a padded model
    (``def sample(model, idx)`` called as ``sample(model, x)``)."""
    callers = callers_of(facts, fn, how="exact", outside=True)
    if not callers:
        return False
    return all(any(parameter_receiving(fn, c.node, m) == dotted for m in models) for c in callers)


def _slices(
    facts: ScriptFacts, reads: list[LogitsRead], sites: list[VocabLiteral], size: int,
    arguments: tuple[PaddedArgument, ...],
) -> tuple[LogitsSlice, ...]:
    """Each read bounded to the real vocabulary, by a name that holds it where the read is (the
    script's own: outside the model the construction's argument, ``vocab`` or ``config.vocab_size``, keeps
    the real size) or else the literal; a read the script already slices there is left alone."""
    classes = _model_classes(facts, size, _size_names(facts, {lit.name for lit in sites}))
    out: list[LogitsSlice] = []
    for read in reads:
        bound = _real_size_at(facts, read.node, sites, size, arguments, classes)
        if read.bound is None:
            out.append(LogitsSlice(read.node, bound))
        elif _literal_int(read.bound) != size and facts.code(read.bound).strip() != bound:
            out.append(LogitsSlice(read.bound, bound, replace=True))  # its name holds the padded size after the fix
    return tuple(out)


def _real_size_at(
    facts: ScriptFacts, node: cst.CSTNode, sites: list[VocabLiteral], size: int, arguments: tuple[PaddedArgument, ...],
    classes: set[str],
) -> str:
    scope = enclosing_function(node, parent_map(facts.module))
    owner = class_of(facts, scope)
    # Inside the model the script's names are its padded config; a global there (``config``) would tie the
    # class to one instance, so only the literal bounds a read in the model's own methods.
    outside = owner is None or owner.name.value not in classes
    for argument in arguments if outside else ():
        if not argument.real:
            continue
        root = argument.real.split(".")[0]
        built_in = enclosing_function(argument.node, parent_map(facts.module))
        if built_in is scope or (built_in is None and binds(facts, None, root) and not binds(facts, scope, root)):
            return argument.real
    others = {_value(lit) for lit in _vocab_literals(facts) if lit.name in {s.name for s in sites}}
    if others == {size} and not any(lit.where == "argparse" for lit in sites):
        return str(size)
    raise DeclineFix(
        f"the file samples from the logits at line {facts.line_of(node)}, where no name holds the real vocabulary "
        f"and the literal {size} may not be it (set elsewhere or on the command line); pad by hand"
    )


def _construction_plan(
    facts: ScriptFacts, sites: list[VocabLiteral], names: set[str], size: int, target: int, feeds_data: DeclineFix,
    bounds: set[int],
) -> PadAtConstruction:
    """Pad where the trained model is built, when the size reaches it as a keyword (``GPT(vocab_size=v)``)
    or through a config dataclass instance of this file (``GPT(config)``); otherwise decline with
    ``feeds_data``, the reason the literal itself cannot change."""
    config_classes = _config_classes(facts, sites)
    arguments: list[PaddedArgument] = []
    needs_dataclasses = False
    for site in pipeline_facts(facts).trained_models:
        call = site.construction
        if callee_class(call) in config_classes:
            continue
        for arg in call.args:
            value = arg.value
            code = facts.code(value).strip()
            plain = code if isinstance(value, (cst.Name, cst.Attribute)) else ""
            if arg.keyword is not None and is_vocab_name(arg.keyword.value) and _mentions(value, names):
                arguments.append(PaddedArgument(value, padded_code(code), plain))
            elif _names_the_size(value, names) and _positional_parameter(facts, call, arg) is not None:
                arguments.append(PaddedArgument(value, padded_code(code), plain))
            elif not arg.star and isinstance(value, cst.Name) and holds_config(facts, value, config_classes):
                field = next(lit.name for lit in sites if lit.where == "default")
                replaced = f"dataclasses.replace({code}, {field}={padded_code(f'{code}.{field}')})"
                arguments.append(PaddedArgument(value, replaced, f"{code}.{field}"))
                needs_dataclasses = True
    unique = {id(a.node): a for a in arguments}
    if not unique:
        raise feeds_data
    for view in _check_uses_beside_model(facts, names, set(unique), bounds):
        unique[id(view.node)] = view
    return PadAtConstruction(tuple(unique.values()), size, target, needs_dataclasses)


def _names_the_size(expr: cst.BaseExpression, names: set[str]) -> bool:
    """``ntokens``, ``args.ntokens``: the size itself, not an expression of it."""
    dotted = full_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    return dotted is not None and dotted.split(".")[-1] in names


def _config_classes(facts: ScriptFacts, sites: list[VocabLiteral]) -> set[str]:
    """This file's classes whose body sets the size as a field default (``vocab_size: int = 50257``)."""
    out: set[str] = set()
    for node, _ in facts.classes:
        if not isinstance(node.body, cst.IndentedBlock):
            continue
        for statement in node.body.body:
            if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, cst.AnnAssign) and small.value is lit.node
                for small in statement.body for lit in sites
            ):
                out.add(node.name.value)
    return out


def _check_uses_beside_model(
    facts: ScriptFacts, names: set[str], padded_arguments: set[int], bounds: set[int]
) -> list[PaddedArgument]:
    """With the model built padded, its own classes see the padded size and the rest of the script the
    real one: the rest may draw tokens below it, log it and pass it on. The model's output flattened by
    the size (``model(data).view(-1, ntokens)``, ``logits.view(-1, vocab_size)``) is flattened by the padded
    size instead (returned, to edit): the loss then sees the padded logits with targets below the real
    vocabulary, as inside a padded model. Any other shape made from it (``F.one_hot(y, vocab_size)``,
    ``x.view(-1, vocab_size)`` of something not the model's output) would not match: declined."""
    output_views = _output_views(facts, names)
    for call in facts.calls:
        if id(call.node) in output_views:
            continue
        if call.ctx.class_def is not None:
            continue
        qual = call.qualname or ""
        name = call.name or ""
        reporting = REPORTING_CALL.search(name) and not qual.startswith(("math.", "torch.", "numpy."))
        if reporting or _TOKEN_DRAWS.search(qual or name):
            continue
        if isinstance(call.node.func, cst.Attribute) and call.node.func.attr.value == "add_argument":
            continue
        for arg in call.node.args:
            if (arg.keyword is not None and arg.keyword.value in names) or id(arg.value) in padded_arguments:
                continue
            if _mentions(arg.value, names, bounds):
                raise DeclineFix(
                    f"the vocabulary size feeds the data, so only the model could be built padded, but it "
                    f"also feeds `{facts.code(call.node).strip()}` (line {facts.line_of(call.node)}) "
                    "outside the model, which would not match the padded logits; pad by hand"
                )
    return list(output_views.values())


def _output_views(facts: ScriptFacts, names: set[str]) -> dict[int, PaddedArgument]:
    """``out.view(-1, ntokens)`` / ``.reshape(...)`` outside the model's classes whose last argument is the
    size itself and whose receiver is the trained model's output (``model(x)``, or a name every assignment
    of which is ``model(...)``), by the view's node: the size argument becomes the padded size (not
    ``out.size(-1)``: the receiver may be the model call itself, which must not run twice)."""
    models = {site.name for site in pipeline_facts(facts).trained_models}

    def model_output(expr: cst.BaseExpression | None) -> bool:
        if isinstance(expr, cst.Call):
            return full_name(expr.func) in models
        if isinstance(expr, cst.Name):
            values = [b.value for b in facts.bindings_of(expr.value)]
            return bool(values) and all(model_output(v) for v in values if v is not expr)
        return False

    out: dict[int, PaddedArgument] = {}
    for call in facts.calls:
        if call.ctx.class_def is not None or call.method not in ("view", "reshape"):
            continue
        args = call.node.args
        if not args or any(a.star or a.keyword is not None for a in args) or not model_output(call.receiver):
            continue
        last = args[-1].value
        if _names_the_size(last, names) and not any(_mentions(a.value, names) for a in args[:-1]):
            code = facts.code(last).strip()
            out[id(call.node)] = PaddedArgument(last, padded_code(code))
    return out


def _check_runtime_sizes(facts: ScriptFacts, names: set[str]) -> None:
    """Another value of the same name set at run time (``config.vocab_size = len(tokenizer)``,
    ``GPTConfig(vocab_size=tokenizer.vocab_size)``): the literal may not be what trains."""

    def check(name: str | None, value: cst.BaseExpression | None, node: cst.CSTNode) -> None:
        if value is None or name is None or name.split(".")[-1] not in names:
            return
        if isinstance(value, cst.Integer):
            return
        dotted = full_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        owner = dotted.rpartition(".")[0] if dotted is not None else ""
        if dotted is not None and dotted.split(".")[-1] in names and "token" not in owner:
            # ``vocab_size=vocab_size``, ``vocab_size=config.vocab_size``, ``ntokens = args.ntokens``: the
            # same value passed on (``tokenizer.vocab_size`` is the tokenizer's)
            return
        code = facts.code(node)
        raise DeclineFix(
            f"the vocabulary size is also set at run time (`{code.strip()}`, line {facts.line_of(node)}); "
            "a size derived from a tokenizer is padded in the model config by hand"
        )

    class _V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                check(full_name(target.target), node.value, node)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            check(full_name(node.target), node.value, node)

        def visit_Arg(self, node: cst.Arg) -> None:
            if node.keyword is not None:
                check(node.keyword.value, node.value, node)

        def visit_DictElement(self, node: cst.DictElement) -> None:
            key = literal(node.key)
            check(key if isinstance(key, str) else None, node.value, node)

        def visit_Param(self, node: cst.Param) -> None:
            check(node.name.value, node.default, node)

    walk(facts.module, _V())


def _check_uses(facts: ScriptFacts, names: set[str], bounds: set[int]) -> None:
    """The size may feed the model's layers, shapes of its outputs, configs, logging and the bounds of
    the logits' slices before sampling (``bounds``, this fix's to keep at the real size); anything else
    (``torch.randint(0, vocab_size, ...)``, ``F.one_hot(y, vocab_size)``) would see the padded ids."""
    for call in facts.calls:
        qual = call.qualname or ""
        name = call.name or ""
        reporting = REPORTING_CALL.search(name) and not qual.startswith(("math.", "torch.", "numpy."))
        if qual in _EMBEDDING or qual in _LINEAR or call.method in _SHAPE_METHODS or reporting:
            continue
        if isinstance(call.node.func, cst.Attribute) and call.node.func.attr.value == "add_argument":
            continue
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value in names:
                continue  # passed on to a config or model under its own name
            if _mentions(arg.value, names, bounds):
                raise DeclineFix(
                    f"the vocabulary size also feeds `{facts.code(call.node).strip()}` "
                    f"(line {facts.line_of(call.node)}), which would then see the padded ids; pad by hand"
                )


def _mentions(expr: cst.CSTNode, names: set[str], skip: set[int] = frozenset()) -> bool:
    """Whether ``expr`` itself names the size; a call inside it is judged as a call of its own, and the
    nodes in ``skip`` (by id) are not looked at."""
    found = False

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            return id(node) not in skip and super().on_visit(node)

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
        arguments: dict[int, cst.BaseExpression] = {}
        slices: dict[int, cst.Subscript] = {}
        needs_dataclasses = False
        for finding in findings:
            plan = finding.fix.plan
            for cut in plan.slices:
                if cut.replace:
                    arguments[id(cut.node)] = parse_expression(cut.bound, module)
                else:
                    slices[id(cut.node)] = parse_expression(f"_[..., :{cut.bound}]", module)
            if isinstance(plan, PadAtConstruction):
                for argument in plan.arguments:
                    arguments[id(argument.node)] = parse_expression(argument.code, module)
                needs_dataclasses |= plan.needs_dataclasses
                continue
            for node in plan.literals:
                replace[id(node)] = str(plan.padded)

        class _T(cst.CSTTransformer):
            def on_leave(self, original_node, updated_node):
                if id(original_node) in arguments:
                    updated_node = arguments[id(original_node)]
                elif isinstance(original_node, cst.Integer) and id(original_node) in replace:
                    updated_node = updated_node.with_changes(value=replace[id(original_node)])
                if id(original_node) in slices:
                    # the read as it is now (a view in it may have its size padded), then the real vocabulary
                    return slices[id(original_node)].with_changes(value=updated_node)
                return updated_node

        new = module.visit(_T())
        return ensure_import(new, "import dataclasses") if needs_dataclasses else new
