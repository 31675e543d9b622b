"""Facts the distributed (TC5) and host-overhead (TC6) rules share, built from ScriptFacts.

Two groups:

* **What a call constructs, by type.** ``from torch.nn import DataParallel as DDP`` makes ``DDP(m)`` a
  DataParallel, and ``nn.parallel.DistributedDataParallel`` a DDP: names are resolved through the
  file's imports and simple aliases (``Wrapper = nn.DataParallel``), never judged by how they read.
  A conditional alias (``W = DDP if a else DataParallel``) has no single type and matches nothing.
* **Where the training steps repeat.** A *step loop* is the innermost loop around a training step
  (``loss.backward()``) or an optimizer step, or around a call of a function whose body holds one
  outside any loop of its own (``for batch in loader: train_step(batch)``). What runs in a step
  loop's body runs once per step.

Everything is computed once per file and cached beside the facts.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.source.syntax import code_text, evaluated_value, full_name, keyword, nodes_of, strip_comments
from tcaudit.source.triggers import text_matches

DATALOADER_SUFFIXES = (".DataLoader",)
DISTRIBUTED_SAMPLER = "DistributedSampler"

# Names of loaders, samplers and batch sizes that belong to evaluation, not training.
EVAL_NAME = re.compile(r"(^|[._])(val|valid|validation|test|testing|eval|evaluation|dev|holdout|calib\w*|infer\w*|pred\w*)(\b|_|$)|(val|test|eval)_?(loader|set|data|sampler|dl|ds)", re.IGNORECASE)
TRAIN_NAME = re.compile(r"train", re.IGNORECASE)
_SCHEDULER = re.compile(r"sched|scheduler|lr_", re.IGNORECASE)

# Code (not comments or docstrings) that shows a script is already launched as several processes, or hands
# that to a framework. Each whole word's left edge is checked after its letters (``hvd(?<!\whvd)`` is
# ``\bhvd``): a pattern whose branches all start with a letter is searched for by those letters, about ten
# times faster over a whole file (``\b`` first: 18 ms on a 2,000-line file).
_MULTI_PROCESS_TEXT = re.compile(
    r"torchrun|torch\.distributed\.(run|launch)|LOCAL_RANK(?<!\wLOCAL_RANK)\b|WORLD_SIZE(?<!\wWORLD_SIZE)\b"
    r"|local_rank(?<!\wlocal_rank)\b|world_size(?<!\wworld_size)\b|horovod(?<!\whorovod)\b|hvd(?<!\whvd)\b"
    r"|deepspeed(?<!\wdeepspeed)\b|torch_xla(?<!\wtorch_xla)\b|xla(?<!\wxla)\b|ray(?<!\wray)\b"
    r"|Fabric(?<!\wFabric)\b|accelerate(?<!\waccelerate)\b|lightning(?<!\wlightning)\b"
    r"|colossalai(?<!\wcolossalai)\b|mpi4py(?<!\wmpi4py)\b"
)

# A switch that decides the device (``--no-cuda``, ``--device``, pytorch/examples' opt-in ``--accel``):
# the model may train on the CPU on a GPU machine.
DEVICE_SWITCH = re.compile(
    r"""["']--?(?:no[-_]?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
    r"""|args(?<!\wargs)\.(?:no_?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
    r"""|(?:opt(?<!\wopt)|cfg(?<!\wcfg)|config(?<!\wconfig)|hparams(?<!\whparams)|flags(?<!\wflags)"""
    r"""|FLAGS(?<!\wFLAGS))\.(?:no_?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
)


# -- types of constructions -----------------------------------------------------------------------


# The last names of the wrappers' qualified names (is_ddp, is_dataparallel, is_fsdp).
_WRAPPER_NAMES = re.compile(r"DataParallel|fully_shard")


def is_ddp(qualname: str | None) -> bool:
    return bool(qualname) and qualname.startswith("torch.") and qualname.endswith(".DistributedDataParallel")


def is_dataparallel(qualname: str | None) -> bool:
    return bool(qualname) and qualname.startswith("torch.") and qualname.endswith(".DataParallel")


def is_fsdp(qualname: str | None) -> bool:
    return bool(qualname) and qualname.startswith("torch.distributed") and qualname.split(".")[-1] in (
        "FullyShardedDataParallel",
        "fully_shard",
    )


def is_dataloader(qualname: str | None) -> bool:
    return bool(qualname) and qualname.startswith("torch.utils.data") and qualname.endswith(DATALOADER_SUFFIXES)


def is_distributed_sampler(qualname: str | None) -> bool:
    return bool(qualname) and qualname.startswith("torch.utils.data") and qualname.endswith("." + DISTRIBUTED_SAMPLER)


def _star_qualname(facts: ScriptFacts, dotted: str | None) -> str | None:
    """``DataParallel`` after ``from torch.nn.parallel import *``: star imports of torch modules only."""
    if not dotted or "." in dotted:
        return None
    for module in facts.star_imports:
        if module.startswith("torch"):
            return f"{module}.{dotted}"
    return None


def callee_type(facts: ScriptFacts, call: CallSite) -> str | None:
    """The one qualified name a call's callee stands for, through imports and simple aliases; None
    when it is unknown or ambiguous (a conditional alias with two different types)."""
    if call.qualname:
        return call.qualname
    func = call.node.func
    if not isinstance(func, (cst.Name, cst.Attribute)):
        return None
    if not call.name or not (facts.bindings_of(call.name) or facts.star_imports):
        return None  # not imported, never assigned, no star import: nothing to follow (most calls of a file)
    found: set[str] = set()
    for value in facts.following(func):  # the first unknown value, or a second type, answers None
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue
        if not isinstance(value, (cst.Name, cst.Attribute)):
            return None
        qual = facts.qualname(value)
        if not qual:
            dotted = full_name(value)
            if dotted and facts.bindings_of(dotted):
                continue  # an intermediate alias; its values are in the list too
            qual = _star_qualname(facts, dotted) if value is func else None
            if not qual:
                return None
        found.add(qual)
        if len(found) > 1:
            return None
    return found.pop() if found else None


# -- small syntax helpers ---------------------------------------------------------------------------


def literal_value(expr: cst.BaseExpression | None) -> object:
    """The value of an int, string, True/False/None literal; ``...`` (Ellipsis) when not a literal."""
    if isinstance(expr, cst.Integer):
        try:
            return int(expr.value.replace("_", ""), 0)
        except ValueError:
            return ...
    if isinstance(expr, cst.SimpleString):
        return evaluated_value(expr)
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    return ...


RL_LIBRARIES = frozenset({"gym", "gymnasium", "dm_control", "pettingzoo"})  # imported: an RL script

# torch.distributed's collectives that take tensors: every rank of the group must call them.
COLLECTIVES = frozenset(
    {
        "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
        "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv",
        "isend", "irecv",
    }
)
# Every call of torch.distributed at which the ranks wait for each other: the collectives above, the
# barriers and the object collectives.
MEETING_POINTS = COLLECTIVES | frozenset(
    {
        "barrier", "monitored_barrier", "broadcast_object_list", "all_gather_object", "gather_object",
        "scatter_object_list", "all_reduce_coalesced", "all_gather_coalesced", "batch_isend_irecv",
    }
)


def is_meeting_point(qualname: str | None) -> bool:
    """A call of torch.distributed that every rank of the group must reach (``dist.barrier()``)."""
    return bool(qualname) and qualname.startswith("torch.distributed.") and qualname.split(".")[-1] in MEETING_POINTS


def has_modulo(node: cst.CSTNode) -> bool:
    """Whether ``node`` computes a remainder (``i % k``; not ``"%d" % i``, which formats)."""
    return any(isinstance(n.operator, cst.Modulo) and not isinstance(n.left, _STRINGS)
               for n in nodes_of(node, cst.BinaryOperation))


_STRINGS = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)


def star_kwargs_keys(facts: ScriptFacts, call: CallSite) -> set[str] | None:
    """The keywords that ``**kwargs`` arguments of a call pass, when every such dict is visible: a
    dict literal or ``dict(...)`` never mutated (``kw.update``, ``kw[k] = v``) afterwards. None when
    any of them is unknown (a parameter, a mutated dict, ``{**other}``)."""
    keys: set[str] = set()
    for arg in call.node.args:
        if arg.star != "**":
            continue
        name = full_name(arg.value)
        if not name or not facts.bindings_of(name):
            return None
        if any(c.receiver_name == name and c.method in ("update", "setdefault", "__setitem__") for c in facts.calls):
            return None
        for value in facts.binding_values(arg.value):
            if value is arg.value or isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                continue
            if isinstance(value, (cst.Name, cst.Attribute)):
                dotted = full_name(value)
                if dotted and facts.bindings_of(dotted):
                    continue  # an alias of another dict; its values are in the list too
                return None
            if isinstance(value, cst.Dict):
                for element in value.elements:
                    if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                        return None
                    keys.add(str(evaluated_value(element.key)))
            elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
                for dict_arg in value.args:
                    if dict_arg.keyword is None:
                        return None
                    keys.add(dict_arg.keyword.value)
            else:
                return None
    return keys


def passes_keyword(facts: ScriptFacts, call: CallSite, key: str) -> bool | None:
    """True when the call passes ``key=`` (directly or through a visible ``**kwargs`` dict), False
    when it certainly does not, None when a ``**kwargs`` dict cannot be seen."""
    if keyword(call.node, key) is not None:
        return True
    keys = star_kwargs_keys(facts, call)
    if keys is None:
        return None
    return key in keys


_TEST_FUNCTION = re.compile(r"^_*test")
_TEST_CLASS = re.compile(r"^_*Test|Test(s|Case|Base|Mixin|Fixture)?$")


def in_test_code(ctx: Frame) -> bool:
    """Inside a unit test (``def test_*``, ``class FooTest``, a TestCase subclass): code that exercises
    an API on purpose, not a training job whose throughput matters. Kept on each frame asked about."""
    found = ctx.answers.get("test code")
    if found is None:
        found = ctx.answers["test code"] = _test_frame(ctx) or (ctx.parent is not None and in_test_code(ctx.parent))
    return found


def _test_frame(frame: Frame) -> bool:
    node = frame.node
    if frame.kind == "def" and _TEST_FUNCTION.match(node.name.value):  # type: ignore[attr-defined]
        return True
    if frame.kind == "class":
        assert isinstance(node, cst.ClassDef)
        if _TEST_CLASS.search(node.name.value):
            return True
        if any((full_name(b.value) or "").endswith(("TestCase", "TestBase")) for b in node.bases):
            return True
    return False


def innermost_loop(ctx: Frame) -> Frame | None:
    """The nearest enclosing loop within the same function (None at a def, class or lambda)."""
    for frame in ctx.chain():
        if frame.kind == "loop":
            return frame
        if frame.kind in ("def", "class", "lambda"):
            return None
    return None


def loops_of(ctx: Frame) -> list[Frame]:
    """Enclosing loops within the same function, innermost first."""
    out = []
    for frame in ctx.chain():
        if frame.kind == "loop":
            out.append(frame)
        elif frame.kind in ("def", "class", "lambda"):
            break
    return out


def loop_header_end(loop: cst.CSTNode) -> cst.CSTNode:
    """The last node of a loop's header, for a finding that should not span the whole body."""
    if isinstance(loop, cst.For):
        return loop.iter
    if isinstance(loop, cst.While):
        return loop.test
    return loop


# -- ranks ------------------------------------------------------------------------------------------

# A test that picks some ranks: ``rank == 0``, ``dist.get_rank() != 0``, ``args.local_rank in [-1, 0]``,
# ``is_main_process()``, ``self.is_master``, ``trainer.is_global_zero``.
RANK_TEST = re.compile(
    r"(?<![\w])(?:(?:(?:local_|global_|node_|world_|self_)?rank|is_main_process|is_master(?:_process)?|"
    r"master_process|main_process|is_rank_zero|is_global_zero|is_primary|is_main)\b|get_(?:local_|global_)?rank\()"
)
# Point-to-point calls: one rank sends, another receives, each in its own branch.
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})


def is_collective(call: CallSite) -> bool:
    """A call every rank of the group must make, in the same order (not a send or receive)."""
    qual = call.qualname or ""
    return is_meeting_point(qual) and qual.rsplit(".", 1)[-1] not in POINT_TO_POINT


def rank_branch(facts: ScriptFacts, ctx: Frame) -> tuple[cst.If, bool] | None:
    """The innermost ``if`` of the function (or module) around ``ctx`` whose test picks ranks, and whether
    ``ctx`` is in its ``else`` (an ``elif`` is in the ``else`` of the ``if`` before it); None outside one."""
    for frame in ctx.chain():
        if frame.kind in ("def", "class", "lambda"):
            return None
        if frame.kind in ("if", "else") and isinstance(frame.node, cst.If):
            if RANK_TEST.search(facts.code(frame.node.test)):
                return frame.node, frame.kind == "else"
    return None


# -- the per-file summary ---------------------------------------------------------------------------


@dataclass
class Wrap:
    call: CallSite
    kind: str  # "ddp", "dataparallel" or "fsdp"
    target: str | None  # the name the wrapped model is bound to


class DistributedFacts:
    """What the TC5/TC6 rules need beyond ScriptFacts, derived lazily from its public records."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts
        self.text = strip_comments(facts.source.text)
        self._target_by_value = {id(b.value): b.target for b in facts.bindings}

    # -- bindings --------------------------------------------------------------------------------
    def target_of(self, node: cst.CSTNode) -> str | None:
        """The name an expression is assigned to (``loader = DataLoader(...)`` → ``loader``)."""
        return self._target_by_value.get(id(node))

    # -- wraps and launch ----------------------------------------------------------------------------
    @functools.cached_property
    def callee_types(self) -> dict[int, str | None]:
        """:func:`callee_type` of every call, by the id of its node (asked of every call twice). Its quick
        answers (a name resolved through the imports; one never assigned) are given here, without a call
        per call of the file."""
        facts = self.facts
        star = bool(facts.star_imports)
        out: dict[int, str | None] = {}
        for call in facts.calls:
            qual = call.qualname
            if not qual:
                kind = type(call.node.func)  # (Name and Attribute have no subclasses)
                if (kind is cst.Name or kind is cst.Attribute) and call.name and (star or facts.bindings_of(call.name)):
                    qual = callee_type(facts, call)
                else:
                    qual = None
            out[id(call.node)] = qual
        return out

    @functools.cached_property
    def wraps(self) -> list[Wrap]:
        out: list[Wrap] = []
        if not text_matches(_WRAPPER_NAMES, self.facts.source.text):
            # A qualified name ends in a name the text holds (an import's, or the dotted name written), so
            # a text without the wrappers' names wraps nothing: no need to follow every call's callee.
            return out
        for call in self.facts.calls:
            qual = self.callee_types[id(call.node)]
            kind = "ddp" if is_ddp(qual) else "dataparallel" if is_dataparallel(qual) else "fsdp" if is_fsdp(qual) else None
            if kind:
                out.append(Wrap(call, kind, self.target_of(call.node)))
        return out

    def wraps_of(self, kind: str) -> list[Wrap]:
        return [w for w in self.wraps if w.kind == kind]

    @functools.cached_property
    def is_ddp_script(self) -> bool:
        return any(w.kind in ("ddp", "fsdp") for w in self.wraps)

    @functools.cached_property
    def init_process_group_calls(self) -> list[CallSite]:
        return [
            c
            for c in self.facts.calls
            if (c.qualname or "").startswith("torch.distributed") and (c.qualname or "").endswith(".init_process_group")
        ]

    @functools.cached_property
    def multi_process_reasons(self) -> list[str]:
        """Why this script already runs as several processes (or hands that to someone else)."""
        facts = self.facts
        reasons = []
        if self.is_ddp_script:
            reasons.append("wraps the model in DDP/FSDP")
        if any(w.kind == "dataparallel" for w in self.wraps):
            reasons.append("uses DataParallel (TC501)")
        if facts.frameworks:
            reasons.append("a framework owns the loop: " + ", ".join(sorted(facts.frameworks)))
        for site in facts.imports:
            qual = site.qualname.lstrip(".")
            if qual.startswith(("torch.distributed", "torch.multiprocessing", "multiprocessing")) or qual in (
                "torch.nn.parallel",
            ):
                reasons.append(f"imports {qual}")
                break
        if facts.references_to("torch.distributed", "torch.multiprocessing"):
            reasons.append("uses torch.distributed / torch.multiprocessing")
        # A docstring's "torchrun" launches nothing: code only (tokenized where the cheap search finds one).
        text = facts.source.text
        match = text_matches(_MULTI_PROCESS_TEXT, text) and _MULTI_PROCESS_TEXT.search(code_text(text))
        if match:
            reasons.append(f"mentions {match.group(0)}")
        return reasons

    @functools.cached_property
    def is_script(self) -> bool:
        """Run as a program (a main guard, argparse or sys.argv, or top-level training code), not a
        library module whose functions someone else calls."""
        if re.search(r"__name__\s*==\s*[\"']__main__[\"']|\bargparse\b|\bsys\.argv\b|\bfire\.Fire\b|\bhydra\b|\bclick\b", self.text):
            return True
        return any(call.ctx.function is None and call.ctx.class_def is None for call in self.step_calls)

    @functools.cached_property
    def module_names(self) -> set[str]:
        """Names used as nn.Modules: the trained models and anything whose ``.parameters()``,
        ``.state_dict()``, ``.train()`` or ``.eval()`` is called."""
        out = set(self.facts.model_names)
        for call in self.facts.method_calls("parameters", "named_parameters", "state_dict", "train", "eval", "modules"):
            receiver = call.receiver
            if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
                receiver = receiver.func.value  # m.cpu().parameters()
            name = full_name(receiver) if receiver is not None else None
            if name:
                out.add(name)
        return out

    @functools.cached_property
    def uses_cuda(self) -> bool:
        """``ScriptFacts.uses_cuda``: ``device = 0``, ``torch.device("cuda", 0)`` and a device handed in
        as a parameter are CUDA too."""
        return self.facts.uses_cuda

    # -- loaders -----------------------------------------------------------------------------------
    @functools.cached_property
    def dataloaders(self) -> list[CallSite]:
        out = []
        for call in self.facts.calls:
            qual = self.callee_types[id(call.node)]
            if is_dataloader(qual) or (qual is None and call.name == "DataLoader" and self.facts.star_imports):
                out.append(call)
        return out

    def dataloader_name(self, call: CallSite) -> str | None:
        """The loader's name: its assignment target, else ``train`` from an enclosing
        ``def build_train_loader():`` when the call is returned from it."""
        target = self.target_of(call.node)
        if target:
            return target
        fn = call.ctx.function
        statement = call.statement
        if fn is not None and statement is not None and isinstance(statement.node, cst.SimpleStatementLine):
            if any(isinstance(s, cst.Return) and s.value is call.node for s in statement.node.body):
                return fn.name.value
        return None

    @functools.cached_property
    def iterable_dataset_defined(self) -> bool:
        for node, _ in self.facts.classes:
            for base in node.bases:
                dotted = full_name(base.value) or ""
                if dotted.split(".")[-1] == "IterableDataset":
                    return True
        return False

    # -- steps and loops ---------------------------------------------------------------------------
    @functools.cached_property
    def step_calls(self) -> list[CallSite]:
        """Training steps (backward) and optimizer steps outside eval paths."""
        out = [s.backward for s in self.facts.training_steps]
        seen = {id(c.node) for c in out}
        out += [c for c in self.facts.optimizer_steps if id(c.node) not in seen and not self.facts.in_eval(c.ctx)]
        return out

    def call_contexts(self, ctx: Frame, depth: int = 2) -> Iterator[Frame]:
        """``ctx`` itself, or, when it is in no loop of its function, the contexts of that function's
        callers (not on eval paths), ``depth`` levels up."""
        if innermost_loop(ctx) is not None or depth < 0:
            yield ctx
            return
        fn = ctx.function
        if fn is None or self.facts.function_is_eval(fn):
            yield ctx
            return
        callers = [c for c in callers_of(self.facts, fn, outside=True) if not self.facts.in_eval(c.ctx)]
        if not callers:
            yield ctx
            return
        for caller in callers:
            yield from self.call_contexts(caller.ctx, depth - 1)

    @functools.cached_property
    def step_loops(self) -> dict[int, Frame]:
        """id(loop node) → its frame, for every loop whose body runs once per training step."""
        out: dict[int, Frame] = {}
        for call in self.step_calls:
            for ctx in self.call_contexts(call.ctx):
                loop = innermost_loop(ctx)
                if loop is not None:
                    out.setdefault(id(loop.node), loop)
        return out

    def is_step_loop(self, frame: Frame) -> bool:
        return id(frame.node) in self.step_loops

    @functools.cached_property
    def env_step_loops(self) -> set[int]:
        """Loops that step an environment (``env.step(action)``): RL interaction, not an optimizer."""
        optimizer_steps = {id(c.node) for c in self.facts.optimizer_steps}
        out: set[int] = set()
        for call in self.facts.method_calls("step"):
            if id(call.node) in optimizer_steps:
                continue
            receiver = call.receiver_name or ""
            if self.facts.is_optimizer_name(receiver) or receiver in self.facts.scalers or _SCHEDULER.search(receiver.split(".")[-1]):
                continue
            if not any(a.keyword is None and not a.star for a in call.node.args):
                continue
            for ctx in self.call_contexts(call.ctx, depth=1):
                for loop in loops_of(ctx)[:1]:
                    out.add(id(loop.node))
        return out

    @functools.cached_property
    def is_rl_script(self) -> bool:
        roots = self.facts.imported_roots()
        return bool(self.env_step_loops) or bool(roots & RL_LIBRARIES)

    @functools.cached_property
    def steps_an_environment(self) -> bool:
        """A reinforcement-learning script for sure: it imports an environment library, or steps an
        object named like one (``env.step(action)``, ``self.envs.step(actions)``); a trainer's own
        ``self.step(batch)`` is not one."""
        if self.facts.imported_roots() & RL_LIBRARIES:
            return True
        return any(
            "env" in (call.receiver_name or "").split(".")[-1].lower()
            and any(a.keyword is None and not a.star for a in call.node.args)
            for call in self.facts.method_calls("step")
        )

    def first_training_loop(self) -> Frame | None:
        """The step loop of the first training step in the file, for a once-per-file finding."""
        for call in sorted(self.step_calls, key=lambda c: self.facts.line_of(c.node)):
            for ctx in self.call_contexts(call.ctx):
                loop = innermost_loop(ctx)
                if loop is not None:
                    return loop
        return None




def distributed_facts(facts: ScriptFacts) -> DistributedFacts:
    return facts.derived(DistributedFacts, DistributedFacts)
