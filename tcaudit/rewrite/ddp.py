"""The DDP conversion shared by TC505 (a single-process CUDA script) and TC501 (DataParallel).

``tcaudit fix --ddp`` makes a script torchrun-ready in one round:

* the process group comes from the torchrun environment (``RANK``/``LOCAL_RANK``/``WORLD_SIZE``), NCCL on
  CUDA and gloo without it; each process first selects its own GPU (``torch.cuda.set_device(LOCAL_RANK)``),
  so every plain ``"cuda"``/``.cuda()`` in the script means that process's GPU; a plain ``python
  train.py`` still runs, as a group of one (an in-process ``HashStore``, no port to pick);
* the trained model is wrapped in ``DistributedDataParallel(model, gradient_as_bucket_view=True)`` right
  before the first statement that trains it (after it is built, moved, loaded from a checkpoint and any
  parameters frozen), or the ``DataParallel(...)`` call is replaced by it;
* what only one process should do runs on rank 0: ``print``/``logging``/``logger``/TensorBoard/wandb
  calls, and ``torch.save``, which saves ``model.module.state_dict()`` (TRAPS 22: the keys keep their
  names, without the ``module.`` prefix);
* ``destroy_process_group()`` at the end.

The next fix round then adds what any DDP script needs and these rules already know how to add:
the DistributedSampler (TC503), ``set_epoch`` (TC504) and ``no_sync`` during accumulation (TC507).

It works across the file's functions and classes (the Trainer shape: ``self.model`` built in
``__init__`` and trained in methods) because it never threads a new variable through the code: the
rank is ``dist.get_rank()`` wherever it is needed. Declined, with the reason, where a rewrite could
change what the script means: several trained models, a model built in a loop, a GPU picked by number
(``torch.cuda.set_device(0)``, ``CUDA_VISIBLE_DEVICES``), DataParallel behind a condition other than a
GPU count.

The conversion is planned when the finding is made (:func:`plan_conversion`, from TC505's and TC501's
detection): every decline above is raised there, so ``scan`` says ``no fix: <reason>``, and the plan
(:class:`DdpLayout`) holds the nodes the rewrite edits. :func:`apply_conversion` performs it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from tcaudit.findings import DeclineFix
from tcaudit.project import importers
from tcaudit.project.loaders import HelperLoader, training_uses
from tcaudit.project.modules import ProjectModule
from tcaudit.project.symbols import Project
from tcaudit.rewrite.codemod import parse_expression, parse_statement, torch_import_name
from tcaudit.rewrite.edits import CallEditor, add_stdlib_import, add_torch_import, contains
from tcaudit.rewrite.region import mentions
from tcaudit.rewrite.sampler import plan_sampler
from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import DEVICE_SWITCH, Wrap, distributed_facts, in_test_code, literal_value
from tcaudit.script.expressions import attribute_chain, function_returns
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_sharding import (
    BATCH_SAMPLER_POSITION,
    SAMPLER_POSITION,
    SELF_SHARDING_LIBRARIES,
    made_by,
    plain_sampler,
    step_loop_sources,
    unsharded_training_loaders,
)
from tcaudit.script.pipeline import import_block_end, pipeline_facts
from tcaudit.source.syntax import (
    call_nodes, enclosing_function, is_main_guard, names_in, nodes_of, param_names, parent_map,
)
from tcaudit.source.syntax import full_name
from tcaudit.source.walk import walk

DDP_NAME = "DistributedDataParallel"
RANK_ZERO = "{dist}.get_rank() == 0"

# nn.Module's own API, which DistributedDataParallel answers itself; any other attribute of the
# wrapped model (``model.fc``, ``model.config``) lives on ``model.module``.
MODULE_API = frozenset(
    {
        "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
        "named_modules", "train", "eval", "training", "zero_grad", "to", "cuda", "cpu", "half", "float",
        "double", "bfloat16", "type", "requires_grad_", "apply", "forward", "register_forward_hook",
        "register_forward_pre_hook", "register_full_backward_hook", "register_buffer", "register_parameter",
        "add_module", "get_submodule", "get_parameter", "state_dict", "load_state_dict", "no_sync", "module",
        "join", "compile", "to_empty",
    }
)
# Calls that only one process should make.
_LOG_METHODS = frozenset({"info", "debug", "warning", "warn", "log", "print"})
_WRITER_METHODS = re.compile(r"^(add_\w+|flush)$")


def _rank_zero_call(facts: ScriptFacts, call: cst.Call) -> bool:
    """A call only rank 0 should make (a print, a log line, a checkpoint save), unless its arguments
    compute with the script's own functions (``print(f"{evaluate(model, loader)}")``): those run
    forwards, and every rank must run them alike."""
    if _computes_in_arguments(facts, call):
        return False
    func = call.func
    dotted = full_name(func) or ""
    qual = facts.resolve(dotted) or ""
    if dotted == "print" or qual in ("torch.save", "wandb.log") or qual.startswith("logging."):
        return qual != "logging.getLogger" and not qual.startswith("logging.basicConfig")
    if isinstance(func, cst.Attribute):
        receiver = (full_name(func.value) or "").split(".")[-1].lower()
        method = func.attr.value
        if receiver in ("logger", "log", "logging", "_logger", "console") and method in _LOG_METHODS:
            return True
        if "writer" in receiver and _WRITER_METHODS.match(method):
            return True
        if receiver in ("tqdm", "pbar") and method == "write":
            return True
    return False


def _computes_in_arguments(facts: ScriptFacts, call: cst.Call) -> bool:
    defined = facts.functions_by_name
    for inner in call_nodes(call)[1:]:
        name = (full_name(inner.func) or "").removeprefix("self.")
        if name in defined or name in facts.model_names:
            return True
    return False


def _single_call(statement: cst.CSTNode) -> cst.Call | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            return small.value
    return None


def convertible_loop(facts: ScriptFacts):
    """The first training loop of a single-process CUDA training script (TC505's finding, what ``fix
    --ddp`` converts), or None: already distributed, Hogwild, a framework's job, RL, test code."""
    info = distributed_facts(facts)
    if not info.uses_cuda or not facts.training_steps or not facts.optimizer_steps or not info.is_script:
        return None
    if info.multi_process_reasons or info.is_rl_script:
        return None
    loop = info.first_training_loop()
    return None if loop is None or in_test_code(loop) else loop


def check_helper_loaders(facts: ScriptFacts, elsewhere: list[HelperLoader], root: Path | None) -> None:
    """Every training DataLoader a helper of another module builds for this script must get its guarded
    DistributedSampler there (TC503's fix in that module, which ``fix`` of the script makes with it), or
    the conversion declines: a rank reading the whole dataset trains N GPUs on the same batches. That fix
    finds the scripts from the module's side, so the module must see this script among its importers
    (the search stops after a number of files in a large repository)."""
    trained = {id(other.call.node) for other in elsewhere}
    for loader in elsewhere:
        others = [c for c in facts.calls if c.name == loader.call.name and id(c.node) not in trained]
        if others:
            raise DeclineFix(
                f"the training DataLoader is built by {loader.described}, which line {facts.line_of(others[0].node)} "
                "calls for another loader too: a DistributedSampler there would split that one across ranks as "
                "well; shard the training loader by hand"
            )
        helper = loader.pipeline.facts
        samplers = [leaf for v in loader.site.values("sampler") for leaf in helper.binding_values(v)]
        if samplers and any("DistributedSampler" in helper.module.code_for_node(v) for v in samplers):
            continue  # already sharded there (TC503's guarded sampler, written by this run's fix of that module)
        if not _seen_from(helper, facts, root):
            raise DeclineFix(
                f"the training DataLoader is built by {loader.described}, and that module's fix cannot find this "
                f"script among the project's files that import it (the search stops after "
                f"{importers.MAX_IMPORTERS_LOOKED_AT} files), so its DistributedSampler would not be added: shard it by hand"
            )
        try:
            plan_sampler(loader.pipeline.facts, loader.site.call, guarded=True)
        except DeclineFix as decline:
            raise DeclineFix(
                f"the training DataLoader is built by {loader.described}, where it cannot get a DistributedSampler "
                f"({decline}); without one every rank would read the whole dataset: shard it by hand"
            ) from None


def check_training_sources(facts: ScriptFacts, elsewhere: list[HelperLoader]) -> None:
    """Each training loop must iterate a loader the conversion can follow to its DataLoader: one of this
    file (directly or from a function that returns it) or one a helper of another module builds
    (``elsewhere``). A method of an object the file made (``for x, y in dm.train_dataloader():`` where
    ``dm = make_datamodule(cfg)`` comes from a factory) hides its DataLoader: declined, naming it, since
    the conversion would wrap the model and leave every rank reading the whole dataset."""
    info = distributed_facts(facts)
    known = {id(call.node) for call in info.dataloaders}
    known |= {id(made) for call in info.dataloaders for made in made_by(facts, call)}
    known |= {id(loader.call.node) for loader in elsewhere}
    for source in step_loop_sources(facts, info):
        if id(source) in known or not isinstance(source, cst.Call) or not isinstance(source.func, cst.Attribute):
            continue
        receiver = source.func.value
        if not isinstance(receiver, cst.Name) or receiver.value == "self" or not facts.bindings_of(receiver.value):
            continue  # a module's function, a parameter, the object's own method: not this shape
        raise DeclineFix(
            f"the training loop iterates `{facts.code(source)}` (line {facts.line_of(source)}), whose "
            "DataLoader tcaudit cannot follow to give it a DistributedSampler; DDP without one trains every rank on "
            "the same batches: shard that loader by hand"
        )


def _seen_from(helper: ScriptFacts, script: ScriptFacts, root: Path | None) -> bool:
    """Whether the helper module's own view of the project (TC503's, which places the sampler) finds ``script``
    among the scripts that train with its DataLoaders."""
    try:
        here = script.source.path.resolve()
    except (OSError, RuntimeError):
        return False
    return any(use.script.source.path.resolve() == here for use in training_uses(helper, root))


@dataclass
class DdpLayout:
    """Where the conversion edits one parse of the file: its nodes, found when the finding was made."""

    model: str  # ``model`` or ``self.model``
    dist: str = "dist"  # the name ``torch.distributed`` is imported as
    torch: str = "torch"
    wrap_before: cst.CSTNode | None = None
    wrap_after: cst.CSTNode | None = None
    wrap_function: cst.FunctionDef | None = None
    wrap_line: int = 0
    guard: cst.If | None = None  # init at the top of the main guard, destroy at its end
    init_after: cst.CSTNode | None = None  # without a guard: the init goes after the imports (None: first)
    last: cst.CSTNode | None = None  # without a guard: the destroy goes after this module statement
    backend: str = '"nccl"'  # the CUDA backend
    dataparallel: Wrap | None = None  # the DataParallel call that becomes the DDP wrap (TC501)
    dataparallel_outer: cst.Call | None = None  # ``DataParallel(net).cuda()``: the call whose result is bound
    rank_zero_statements: set[int] = field(default_factory=set)
    # Rank-0 checkpoint saves in a file that also loads a checkpoint: every rank waits at a barrier
    # after the save, so no rank reads the file while rank 0 is still writing it.
    saves_then_barrier: set[int] = field(default_factory=set)
    rank_zero_ifs: set[int] = field(default_factory=set)
    module_calls: set[int] = field(default_factory=set)  # ``model.state_dict()`` → ``model.module.state_dict()``
    module_attributes: set[int] = field(default_factory=set)  # ``model.fc`` → ``model.module.fc``
    module_values: set[int] = field(default_factory=set)  # ``torch.save(model, p)`` → ``torch.save(model.module, p)``
    device_strings: set[int] = field(default_factory=set)  # "cuda:0" → "cuda"
    device_calls: set[int] = field(default_factory=set)  # .cuda(0) → .cuda()
    device_ints: set[int] = field(default_factory=set)  # ``device = 0``, ``.to(0)`` → "cuda"
    device_ordinals: set[int] = field(default_factory=set)  # torch.device("cuda", 0) → torch.device("cuda")


def plan_conversion(facts: ScriptFacts, dataparallel: list[Wrap] | None = None, project: Project | None = None) -> DdpLayout:
    """Plan the conversion of this parse of the file (replacing ``dataparallel``'s one call, if given),
    or raise :class:`DeclineFix` with the reason it would change what the script means. With the
    ``project``, the functions of other modules the wrapped model is handed to are read too."""
    return DdpConversion(facts, project).plan(dataparallel)


def apply_conversion(module: cst.Module, facts: ScriptFacts, layout: DdpLayout) -> cst.Module:
    """Rewrite ``module`` (the parse ``layout`` was planned on) as planned."""
    return DdpConversion(facts).rewrite(module, layout)


class DdpConversion:
    def __init__(self, facts: ScriptFacts, project: Project | None = None) -> None:
        self.module = facts.module
        self.facts = facts
        self.project = project
        self.info = distributed_facts(facts)
        self.pipeline = pipeline_facts(facts)
        self.dist = "dist"
        self.backend = "ddp_backend"
        self.ddp = DDP_NAME
        self.torch = torch_import_name(facts) or "torch"

    # -- checks ---------------------------------------------------------------------------------------
    def _declines(self) -> None:
        facts = self.facts
        if self.info.init_process_group_calls:
            raise DeclineFix("the script already initialises a process group")
        for call in facts.calls:
            qual = call.qualname or ""
            if qual == "torch.cuda.set_device":
                raise DeclineFix(
                    "the script picks its GPU with torch.cuda.set_device(...); under torchrun each process uses "
                    "the GPU of its LOCAL_RANK, so that call must go first"
                )
        if re.search(r"CUDA_VISIBLE_DEVICES", self.info.text):
            raise DeclineFix("the script sets CUDA_VISIBLE_DEVICES; under torchrun each process must see every GPU")
        taken = {b.target for b in facts.bindings} | {site.local for site in facts.imports} | {
            fn.name.value for fn, _ in facts.functions
        }
        for site in facts.imports:
            if site.local == "dist" and site.qualname != "torch.distributed":
                taken.add("dist")
        if "dist" in taken:
            self.dist = "torch_dist" if "torch_dist" not in taken else None  # type: ignore[assignment]
            if self.dist is None:
                raise DeclineFix("the names `dist` and `torch_dist` are both taken in this file")
        if self.backend in taken:
            raise DeclineFix(f"the name `{self.backend}` is taken in this file")
        if DDP_NAME in taken and not any(s.local == DDP_NAME and s.qualname.endswith(DDP_NAME) for s in facts.imports):
            raise DeclineFix(f"the name `{DDP_NAME}` means something else in this file")

    def _check_loaders(self, plan: DdpLayout) -> None:
        """All or nothing: every training loader must come out of the next round with its own share of
        the data, or DDP trains every rank on the same batches. A loader that brings its own sampler
        (``RandomSampler(replacement=True)`` in a custom infinite loader), whose keywords cannot be
        seen, that would be built before the process group exists, or whose DistributedSampler edit
        (TC503's, planned here as it will be then) declines, declines the whole conversion, naming it."""
        facts = self.facts
        if self.info.iterable_dataset_defined:
            raise DeclineFix("the script defines an IterableDataset, which cannot take a DistributedSampler; each "
                             "rank must read its own part of the stream: shard it by hand")
        if facts.imported_roots() & SELF_SHARDING_LIBRARIES:
            return  # the input library splits the data across ranks itself
        for call in self.info.dataloaders:
            self._check_own_sampler(call)
        for loader in unsharded_training_loaders(facts, self.info):
            call = loader.call
            label = f"the training loader `{loader.name}`" if loader.name else "the training DataLoader"
            label += f" (line {facts.line_of(call.node)})"
            if loader.unseen is not None:
                raise DeclineFix(f"{label}: {loader.unseen}, so whether it has a sampler is unknown, and DDP "
                                 "without a DistributedSampler trains every rank on the same batches")
            if self._before_init(call.ctx.function, call.node, plan):
                raise DeclineFix(f"{label} is built before the process group the conversion starts in the main "
                                 "guard, and its DistributedSampler needs that group: convert by hand")
            try:
                plan_sampler(facts, call)
            except DeclineFix as decline:
                raise DeclineFix(f"{label} cannot get a DistributedSampler ({decline}), and DDP without one trains "
                                 "every rank on the same batches") from None

    def _check_own_sampler(self, call) -> None:
        """A loader outside evaluation and test code with a sampler of its own that is not distributed:
        declined, naming it. (Not only where data flow proves it trains: a custom loader class's inner
        DataLoader is read through ``next(self.data_iter)``, which the flow does not follow.)"""
        facts = self.facts
        if facts.in_eval(call.ctx) or in_test_code(call.ctx):
            return
        name = self.info.dataloader_name(call)
        site = self.pipeline.loader_for(call.node)
        for key, position in (("sampler", SAMPLER_POSITION), ("batch_sampler", BATCH_SAMPLER_POSITION)):
            value = call.arg(key, position)
            # Also a sampler held by a visible ``**`` dict (``DataLoader(ds, **kwargs)``).
            held = [kv.value for kv in (site.keys.get(key, []) if site is not None else []) if kv.source != "keyword"]
            for value in [v for v in (value, *held) if v is not None]:
                self._check_sampler_value(call, name, key, value)

    def _check_sampler_value(self, call, name: str | None, key: str, value: cst.BaseExpression) -> None:
        facts = self.facts
        if literal_value(value) is None:
            return
        if key == "sampler" and call.arg("sampler") is value and plain_sampler(facts, value) is not None:
            return  # RandomSampler(ds) / SequentialSampler(ds): the next round makes it distributed
        text = facts.code(value)
        if "Distributed" in text:
            return
        where = f" in `{call.ctx.class_def.name.value}`" if call.ctx.class_def is not None else ""
        raise DeclineFix(
            f"the training loader `{name or 'DataLoader'}`{where} brings its own {key} (`{text[:60]}`); each "
            "rank needs its own share of it, which DistributedSampler cannot give: shard it by hand"
        )

    def _model(self) -> str:
        names = list(dict.fromkeys(site.name for site in self.pipeline.trained_models))
        if not names:
            names = list(self.pipeline.trained_model_names)
        if not names:
            raise DeclineFix("no trained model found to wrap in DistributedDataParallel")
        if len(names) > 1:
            raise DeclineFix(
                f"several trained models ({', '.join(names)}): each needs its own DDP wrap and its own "
                "checkpoint handling; convert by hand"
            )
        name = self._held_by_trainer(names[0]) or names[0]
        if "." in name and not (name.startswith("self.") and name.count(".") == 1):
            raise DeclineFix(f"the model lives in `{name}`; only a plain name or `self.<name>` is rewrapped")
        return name

    def _held_by_trainer(self, name: str) -> str | None:
        """The DDP tutorial's single-GPU shape: a factory builds the model beside its optimizer and returns
        both (``load_train_objs()``), and a class keeps the model it is handed (``self.model =
        model.to(gpu_id)`` in ``__init__``) and trains that attribute. The wrap goes on the attribute, in
        ``__init__`` (as the tutorial's ``multigpu_torchrun.py`` does); None where the shape differs."""
        facts = self.facts
        bindings = [b for b in facts.bindings_of(name) if b.statement is not None]
        if not bindings or "." in name:
            return None
        for binding in bindings:
            function = binding.ctx.function
            if function is None or not any(name in names_in(value) for value in function_returns(function)):
                return None  # trained where it is built: the plain conversion
        found = []
        for attr in sorted(n for n in facts.model_names if n.startswith("self.") and n.count(".") == 1):
            inits = [b for b in facts.bindings_of(attr)
                     if b.ctx.function is not None and b.ctx.function.name.value == "__init__"]
            if len(inits) != 1:
                continue
            root = inits[0].value
            while isinstance(root, cst.Call) and isinstance(root.func, cst.Attribute) and root.func.attr.value in (
                    "to", "cuda"):
                root = root.func.value
            if not (isinstance(root, cst.Name) and root.value in param_names(inits[0].ctx.function)):
                continue
            if any(attribute_chain(call.node.func) == attr for call in facts.calls):
                found.append(attr)
        return found[0] if len(found) == 1 else None

    # -- placing the wrap -------------------------------------------------------------------------------
    def _body_of(self, function: cst.FunctionDef | None, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements of the function (or module, or main guard) that hold ``statement``."""
        if function is not None:
            body = function.body
            return list(body.body) if isinstance(body, cst.IndentedBlock) else []
        guard = self.pipeline.main_guard
        if guard is not None and contains(guard, statement):
            return list(guard.body.body) if isinstance(guard.body, cst.IndentedBlock) else []
        return list(self.module.body)

    def _place_wrap(self, plan: DdpLayout) -> None:
        facts = self.facts
        bindings = [b for b in facts.bindings_of(plan.model) if b.statement is not None]
        if not bindings:
            raise DeclineFix(f"`{plan.model}` is never assigned in this file")
        first = bindings[0]
        for frame in first.ctx.chain():
            if frame.kind in ("def", "class", "module"):
                break
            if frame.kind == "loop":
                raise DeclineFix(f"`{plan.model}` is built inside a loop")
        function = first.ctx.function
        if plan.model.startswith("self.") and function is not None and function.name.value != "__init__":
            inits = [b for b in bindings if b.ctx.function is not None and b.ctx.function.name.value == "__init__"]
            if inits:
                first, function = inits[0], inits[0].ctx.function
        body = self._body_of(function, first.statement.node)
        start = next((i for i, s in enumerate(body) if s is first.statement.node or contains(s, first.statement.node)), None)
        if start is None:
            raise DeclineFix(f"could not find where `{plan.model}` is built")
        plan.wrap_function = function
        for statement in body[start + 1:]:
            if self._trains(statement):
                plan.wrap_before = statement
                plan.wrap_line = facts.line_of(statement)
                return
        last = body[-1]
        if isinstance(last, cst.SimpleStatementLine) and any(isinstance(s, (cst.Return, cst.Raise)) for s in last.body):
            where = f"`{function.name.value}()`" if function is not None else "the module"
            raise DeclineFix(
                f"`{plan.model}` is built in {where} and handed on by its `return`; the DDP wrap belongs where "
                "the caller moves it to its GPU and trains it: convert by hand"
            )
        plan.wrap_after = last
        plan.wrap_line = facts.position(last).end.line + 1

    def _trains(self, statement: cst.CSTNode) -> bool:
        """Whether a statement trains, wherever in it the training sits: a backward in it, a loop the
        pipeline counts as training, or a call (on a plain line, in a ``try`` body or handler, a
        ``with``) of a function that reaches a step. The wrap goes before the first such statement."""
        facts = self.facts
        if self.pipeline.body_trains(statement):
            return True
        if any(contains(statement, step.backward.node) for step in facts.training_steps):
            return True
        span = facts.position(statement)
        reaching = self.pipeline.functions_reaching_step
        return any(
            span.start.line <= facts.line_of(call.node) <= span.end.line
            and any(fn in reaching for fn in self.pipeline.called_functions(call))
            for call in facts.calls
        )

    # -- what runs on rank 0 and what reads the wrapped module --------------------------------------------
    def _before_init(self, ctx_function: cst.FunctionDef | None, node: cst.CSTNode, plan: DdpLayout) -> bool:
        """Code that may run before the process group exists: module level outside the main guard (or
        before the inserted init), and functions called from there."""
        if plan.guard is not None:
            if ctx_function is None:
                return not contains(plan.guard, node)
            return any(
                c.ctx.function is None and not contains(plan.guard, c.node)
                for c in callers_of(self.facts, ctx_function, how="self")
            )
        if ctx_function is None:
            imports_end = import_block_end(self.facts)
            return imports_end is not None and self.facts.line_of(node) <= self.facts.position(imports_end).end.line
        return False

    def _collect_rank_zero(self, plan: DdpLayout) -> None:
        facts = self.facts
        for call in facts.calls:
            statement = call.statement
            if statement is None or _single_call(statement.node) is not call.node:
                continue
            if not _rank_zero_call(facts, call.node):
                continue
            ctx = call.ctx
            if any(frame.kind == "except" for frame in ctx.chain()):
                continue  # an error message belongs to every process
            cls = ctx.class_def
            if cls is not None and {s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)} & {
                "__getitem__", "__iter__", "__len__"
            }:
                continue  # a Dataset's methods run in loader workers
            if self._before_init(ctx.function, call.node, plan):
                continue
            if call.qualname == "torch.save" and self._loads_checkpoints and self._per_process_path(call):
                continue  # each rank writes (and later reads) its own file: rank 0 alone would leave the others none
            plan.rank_zero_statements.add(id(statement.node))
            if call.qualname == "torch.save" and self._loads_checkpoints:
                plan.saves_then_barrier.add(id(statement.node))
        # ``if i % 10 == 0: print(...)``: when everything in an ``if`` (without ``else``) is rank-0 work,
        # the rank joins its test instead of nesting a second ``if``.
        for frame_node in self._ifs():
            body = frame_node.body
            statements = list(body.body) if isinstance(body, cst.IndentedBlock) else [frame_node.body]
            if frame_node.orelse is not None or not statements:
                continue
            if isinstance(body, cst.SimpleStatementSuite):
                calls = [s.value for s in body.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)]
                if len(calls) != len(body.body) or not all(_rank_zero_call(facts, c) for c in calls):
                    continue
                if not any(c.node is calls[0] for c in facts.calls):
                    continue
                site = next(c for c in facts.calls if c.node is calls[0])
                if self._before_init(site.ctx.function, calls[0], plan):
                    continue
                plan.rank_zero_ifs.add(id(frame_node))
            elif all(id(s) in plan.rank_zero_statements for s in statements):
                plan.rank_zero_ifs.add(id(frame_node))
                for s in statements:
                    plan.rank_zero_statements.discard(id(s))

    def _per_process_path(self, call) -> bool:
        """A ``torch.save`` whose path is made per process (``tempfile.mkdtemp()``, the pid, a uuid), as
        far as its bindings show, and which the script loads back from the same path: under torchrun
        every rank has its own file and reads it."""
        path = call.arg("f", 1)
        if path is None:
            return False
        if self.facts.code(path) not in self._loaded_paths:
            return False  # not read back by the script: one copy from rank 0 is what it needs
        text = " ".join(self.facts.code(v) for v in [path, *self._path_values(path)])
        return bool(_PER_PROCESS_PATH.search(text))

    @functools.cached_property
    def _loaded_paths(self) -> set[str]:
        """The code of every ``torch.load`` path in the file."""
        return {self.facts.code(c.arg("f", 0)) for c in self.facts.calls
                if (c.qualname or "") == "torch.load" and c.arg("f", 0) is not None}

    def _path_values(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        out: list[cst.BaseExpression] = []
        for name in sorted(n for n in names_in(expr) if "." not in n) if depth < 3 else ():
            for value in self.facts.binding_values(cst.Name(name)):
                out += [value, *self._path_values(value, depth + 1)]
        return out

    @functools.cached_property
    def _loads_checkpoints(self) -> bool:
        return any(call.qualname == "torch.load" for call in self.facts.calls)

    def _ifs(self) -> list[cst.If]:
        return [node for node in nodes_of(self.module, cst.If) if not is_main_guard(node)]

    def _collect_module_reads(self, plan: DdpLayout) -> None:
        """``model.state_dict()`` and custom attributes of the wrapped model → ``model.module...``: after the
        wrap in its own function (a resume before the wrap loads into the bare model), anywhere else in the
        file for ``state_dict()`` and, for ``self.model``, in the class's other methods."""
        facts = self.facts
        model = plan.model

        readers: list[tuple[cst.Attribute, cst.FunctionDef | None]] = []
        rebound = self._rebound(plan)
        parents = parent_map(self.module)
        for node in nodes_of(self.module, cst.Attribute):
            if attribute_chain(node.value) != model:
                continue
            attr = node.attr.value
            function = enclosing_function(node, parents)
            same_function = function is plan.wrap_function
            if same_function and facts.line_of(node) < plan.wrap_line:
                continue
            if same_function and any(plan.wrap_line < line < facts.line_of(node) for line in rebound):
                continue  # ``net = Net(); net.load_state_dict(...)`` after training: a new, bare model
            handed = not same_function and function is not None and self._receives_wrapped(function, plan)
            if (not same_function and not handed and plan.wrap_function is not None
                    and not model.startswith("self.") and attr != "state_dict"):
                continue  # a helper's parameter that happens to share the name: only its checkpoint save
            if attr == "state_dict" or (same_function or handed or model.startswith("self.")) and attr == "load_state_dict":
                readers.append((node, function))
                plan.module_calls.add(id(node))
            elif attr not in MODULE_API:
                readers.append((node, function))
                plan.module_attributes.add(id(node))
        self._check_helpers_before_wrap(plan, readers)
        self._collect_whole_model_saves(plan)
        if mentions(self.info.text, [f"{model}.module"]):
            # The script already unwraps the model itself (a DataParallel script's ``model.module``,
            # often behind ``isinstance``): leave its reads alone.
            plan.module_calls.clear()
            plan.module_attributes.clear()

    def _collect_bare_arguments(self, plan: DdpLayout) -> None:
        """The wrapped model handed to a function of another project module (``evaluate(model, loader)``
        in evaluate.py, ``compute_loss(out, targets, model)`` in utils/loss.py) that reads what only the
        bare model has (``net.n_classes``, ``model.yolo_layers``, through the functions it hands it on
        to): that call gets ``model.module``, as the function expects. Declined, naming the read, where
        that function also trains the model (the bare model there would bypass DDP's gradient sync) or
        keeps it in an object whose methods read it."""
        if self.project is None or mentions(self.info.text, [f"{plan.model}.module"]):
            return
        facts = self.facts
        for call in facts.calls:
            for arg in call.node.args:
                if arg.star or attribute_chain(arg.value) != plan.model or not self._sees_wrapped(call, plan):
                    continue
                callee = self.project.callee(facts, call)
                if callee is None or callee.function is None or callee.module.facts is facts:
                    continue  # a library's function takes any module; this file's own are read above
                param = _receiving_param(callee.function, call.node, arg, constructor=callee.name == "__init__")
                if param is None:
                    continue
                reads = bare_reads(self.project, callee.module, callee.function, param, depth=0)
                if not reads:
                    continue
                where, line, read, trains = reads[0]
                name = call.name or callee.name
                if trains:
                    raise DeclineFix(
                        f"`{name}()` ({where}) reads `{read}` (line {line}) of the model it is handed and also "
                        "trains it: the bare model there would train without DDP's gradient sync, the wrapped one "
                        "has no such attribute; pass it both by hand"
                    )
                if callee.name == "__init__":
                    raise DeclineFix(
                        f"`{name}(...)` ({where}) keeps the model it is handed and reads `{read}` (line {line}) of "
                        "it: whether that object also trains it cannot be followed; pass the bare model "
                        f"(`{plan.model}.module`) or the wrapped one by hand"
                    )
                plan.module_values.add(id(arg.value))

    def _check_holder_handed_out(self, plan: DdpLayout) -> None:
        """``self.model`` wrapped, and ``self`` handed to other code (``callback.on_epoch_end(self, epoch)``):
        what that code reads of ``trainer.model`` (``trainer.model.head``, its ``state_dict()``) now meets the
        DDP wrapper. Where the callee is a function tcaudit can read (in this or another project module) and
        reads nothing of the model beyond what DDP answers itself, the conversion goes on; otherwise it
        declines, naming the call or the read."""
        if not plan.model.startswith("self.") or plan.wrap_function is None:
            return
        facts = self.facts
        attr = plan.model.split(".", 1)[1]
        cls = next((c for c, _ in facts.classes if contains(c, plan.wrap_function)), None)
        if cls is None:
            return
        for call in facts.calls:
            if call.ctx.class_def is not cls or call.ctx.function is None:
                continue
            for arg in call.node.args:
                if arg.star or not isinstance(arg.value, cst.Name) or arg.value.value != "self":
                    continue
                if call.receiver_name == "self":
                    continue  # the class's own methods see the wrapped attribute as the conversion edits them
                shown = facts.code(call.node.func)
                symbol = self.project.callee(facts, call) if self.project is not None else None
                if symbol is None and (call.qualname is not None or call.name in _BUILTINS_TAKING_ANY):
                    continue  # a library's function or a builtin (``logging.info("%s", self)``, ``print(self)``)
                local = facts.functions_by_name.get(call.name or "", []) if symbol is None else []
                target = symbol.function if symbol is not None else (local[0] if len(local) == 1 else None)
                if target is None:
                    raise DeclineFix(
                        f"`self`, which holds the wrapped `{plan.model}`, is handed to `{shown}(...)` (line "
                        f"{facts.line_of(call.node)}), which tcaudit cannot follow: code there that reads "
                        f"`.{attr}`'s attributes or its state_dict() would meet DistributedDataParallel; unwrap it "
                        f"there (`.{attr}.module`) or convert by hand"
                    )
                param = _receiving_param(target, call.node, arg, constructor=target.name.value == "__init__")
                where = symbol.module.display_path if symbol is not None else facts.source.display_path
                into = symbol.module.facts if symbol is not None else facts
                read = _holder_read(into, target, param, attr) if param is not None else None
                if read is not None:
                    raise DeclineFix(
                        f"`{shown}()` ({where}) reads `{read[0]}` (line {read[1]}) of the object holding the "
                        f"wrapped `{plan.model}`, which DistributedDataParallel does not answer; unwrap it there "
                        f"(`.{attr}.module`) or convert by hand"
                    )

    def _sees_wrapped(self, call, plan: DdpLayout) -> bool:
        """Whether the model's name at ``call`` holds the DDP wrapper: after the wrap in its own scope (not
        rebound since), in a helper handed the wrapped model, or, for ``self.model``, in the class's
        methods other than ``__init__`` before the wrap."""
        facts = self.facts
        function = call.ctx.function
        line = facts.line_of(call.node)
        if plan.model.startswith("self."):
            owner = plan.wrap_function
            cls = call.ctx.class_def
            return cls is not None and owner is not None and contains(cls, owner) and not (
                function is owner and line < plan.wrap_line)
        if function is plan.wrap_function:
            return line > plan.wrap_line and not any(plan.wrap_line < r < line for r in self._rebound(plan))
        return function is not None and self._receives_wrapped(function, plan)

    def _receives_wrapped(self, function: cst.FunctionDef, plan: DdpLayout) -> bool:
        """Whether a helper's parameter of the model's name is the wrapped model on every call: each
        direct caller is in the wrap's scope after the wrap and passes the model itself (``fit(model,
        loader)``). Its ``load_state_dict`` and attribute reads then go through ``.module`` too."""
        facts = self.facts
        names = param_names(function)
        if plan.model.startswith("self.") or plan.model not in names:
            return False
        index = names.index(plan.model) - (1 if names[:1] in (["self"], ["cls"]) else 0)
        callers = callers_of(facts, function, how="self")
        return bool(callers) and all(
            caller.ctx.function is plan.wrap_function
            and facts.line_of(caller.node) >= plan.wrap_line
            and (arg := caller.arg(plan.model, index)) is not None
            and attribute_chain(arg) == plan.model
            for caller in callers
        )

    def _rebound(self, plan: DdpLayout) -> list[int]:
        """Lines where the model's name is bound in the wrap's scope (after the wrap: a reload into a
        fresh, bare model, ``net = Net(); net.load_state_dict(torch.load(PATH))``)."""
        facts = self.facts
        return [facts.line_of(b.statement.node) for b in facts.bindings_of(plan.model)
                if b.statement is not None and b.ctx.function is plan.wrap_function]

    def _check_helpers_before_wrap(self, plan: DdpLayout, readers: list) -> None:
        """``model.module`` only after the wrap: a helper that reads ``model.vocab`` (or saves its state)
        and is also called before the wrap (a ``--sample-only`` path that returns early) would meet the
        bare model there. Declined, naming the helper and the call."""
        if plan.model.startswith("self."):
            return  # the class's methods run on the wrapped attribute once __init__ wraps it
        facts = self.facts
        for node, function in readers:
            if function is None or function is plan.wrap_function:
                continue
            early = self._call_before_wrap(function, plan, depth=0)
            if early is not None:
                attr = facts.code(node)
                raise DeclineFix(
                    f"`{function.name.value}()` reads `{attr}` and is called before the DDP wrap too (line "
                    f"{facts.line_of(early.node)}), where the model is not wrapped yet: `{plan.model}.module` "
                    "would fail there and the bare attribute after it; convert by hand"
                )

    def _call_before_wrap(self, function: cst.FunctionDef, plan: DdpLayout, depth: int):
        """A call of ``function`` that may run before the wrap: in the wrap's scope above it, or in a
        function (other than the wrap's) that has such a call itself, two calls deep."""
        facts = self.facts
        for caller in callers_of(facts, function, how="self"):
            scope = caller.ctx.function
            if scope is plan.wrap_function:
                if facts.line_of(caller.node) < plan.wrap_line:
                    return caller
            elif scope is not None and scope is not function and depth < 2:
                if self._call_before_wrap(scope, plan, depth + 1) is not None:
                    return caller
        return None

    def _collect_whole_model_saves(self, plan: DdpLayout) -> None:
        """``torch.save(model, path)`` (or the model inside the saved dict, list or tuple) after the wrap
        would pickle the DDP object, which cannot be loaded outside a process group: ``model.module``."""
        facts = self.facts
        rebound = self._rebound(plan)
        for call in facts.calls:
            if (call.qualname or "") != "torch.save":
                continue
            function = call.ctx.function
            if function is plan.wrap_function:
                line = facts.line_of(call.node)
                if line < plan.wrap_line or any(plan.wrap_line < b < line for b in rebound):
                    continue  # before the wrap, or of a fresh model bound after it
            elif plan.wrap_function is not None and not plan.model.startswith("self."):
                continue  # a helper's own parameter: its state_dict() reads are handled above
            obj = call.arg("obj", 0)
            if obj is None:
                continue
            values = [obj]
            if isinstance(obj, cst.Dict):
                values = [e.value for e in obj.elements if isinstance(e, cst.DictElement)]
            elif isinstance(obj, (cst.Tuple, cst.List)):
                values = [e.value for e in obj.elements]
            for value in values:
                if isinstance(value, (cst.Name, cst.Attribute)) and attribute_chain(value) == plan.model:
                    plan.module_values.add(id(value))

    def _collect_devices(self, plan: DdpLayout) -> None:
        facts = self.facts

        for node in nodes_of(self.module, cst.SimpleString):
            value = literal_value(node)
            if isinstance(value, str) and re.fullmatch(r"cuda:\d+", value):
                if value != "cuda:0":
                    raise DeclineFix(f'the script names GPU {value[5:]} ("{value}"); under torchrun each '
                                     "process uses the GPU of its LOCAL_RANK")
                plan.device_strings.add(id(node))
        for call in facts.method_calls("cuda"):
            args = call.node.args
            if len(args) == 1 and args[0].keyword is None and isinstance(args[0].value, cst.Integer):
                if literal_value(args[0].value) != 0:
                    raise DeclineFix(f"the script names GPU {literal_value(args[0].value)} (`.cuda(N)`)")
                plan.device_calls.add(id(call.node))
        # GPU 0 by number: ``device = 0``, ``.to(0)``, ``torch.device("cuda", 0)``. Under torchrun each
        # process's current device (set from LOCAL_RANK) is what "cuda" means.
        for node in _integer_devices(facts):
            if literal_value(node) != 0:
                raise DeclineFix(f"the script names GPU {literal_value(node)} by number; under torchrun each "
                                 "process uses the GPU of its LOCAL_RANK")
            plan.device_ints.add(id(node))
        for call in facts.calls:
            if call.qualname == "torch.device" and len(call.node.args) == 2 and literal_value(call.node.args[0].value) == "cuda":
                ordinal = literal_value(call.node.args[1].value)
                if ordinal != 0:
                    raise DeclineFix(f"the script names GPU {ordinal} (`torch.device(\"cuda\", {ordinal})`)")
                plan.device_ordinals.add(id(call.node))

    # -- the rewrite -------------------------------------------------------------------------------------
    def plan(self, dataparallel: list[Wrap] | None = None) -> DdpLayout:
        self._declines()
        facts = self.facts
        plan = DdpLayout(self._model(), dist=self.dist, torch=self.torch)
        guard = self.pipeline.main_guard
        if guard is not None and isinstance(guard.body, cst.IndentedBlock):
            bindings = facts.bindings_of(plan.model)
            at_module_level = any(
                b.ctx.function is None and b.ctx.class_def is None and not contains(guard, b.value) for b in bindings
            )
            if not at_module_level:
                plan.guard = guard
        if plan.guard is None:
            plan.init_after = import_block_end(facts)
            plan.last = self.module.body[-1]
        if DEVICE_SWITCH.search(self.info.text) or _cpu_device(facts):
            # A --no-cuda switch, or a device set to "cpu" outright: on a GPU machine the model may stay on
            # the CPU, and NCCL has no CPU backend, so gloo serves the CPU tensors.
            plan.backend = '"cpu:gloo,cuda:nccl"'
        self._check_loaders(plan)
        if dataparallel:
            self._plan_dataparallel(plan, dataparallel)
        else:
            self._place_wrap(plan)
        self._collect_rank_zero(plan)
        self._collect_module_reads(plan)
        self._collect_bare_arguments(plan)
        self._check_holder_handed_out(plan)
        self._collect_devices(plan)
        return plan

    def _plan_dataparallel(self, plan: DdpLayout, wraps: list[Wrap]) -> None:
        facts = self.facts
        if len(wraps) > 1:
            raise DeclineFix("DataParallel is used more than once; convert by hand")
        wrap = wraps[0]
        if wrap.target != plan.model:
            raise DeclineFix(f"DataParallel wraps `{wrap.target or 'an unnamed value'}`, not the trained model `{plan.model}`")
        call = wrap.call
        if not call.node.args or call.node.args[0].keyword is not None:
            raise DeclineFix("the DataParallel call has no positional module argument")
        plan.dataparallel = wrap
        plan.dataparallel_outer = self._chain_outer(call.node)
        plan.wrap_function = call.ctx.function
        plan.wrap_line = facts.line_of(call.node)
        for frame in call.ctx.chain():
            if frame.kind in ("def", "class", "module"):
                break
            if frame.kind == "loop":
                raise DeclineFix("DataParallel is applied inside a loop")
            if frame.kind in ("if", "else"):
                node = frame.node
                test = facts.code(node.test) if isinstance(node, cst.If) else ""
                if frame.kind == "else" or "device_count" not in test or node.orelse is not None:
                    raise DeclineFix(
                        "DataParallel is applied behind a condition; under torchrun every process must wrap "
                        "its model in DDP, so the condition has to go by hand"
                    )
                body = node.body
                if not isinstance(body, cst.IndentedBlock) or len(body.body) != 1:
                    raise DeclineFix("the `if ... device_count()` block around DataParallel holds more than the wrap")
                plan.wrap_before = node  # the ``if`` is replaced by its one statement

    def _ddp_call(self, module_expr: cst.BaseExpression) -> cst.Call:
        call = parse_expression(f"{self.ddp}(MODEL, gradient_as_bucket_view=True)", self.module)
        assert isinstance(call, cst.Call)
        return call.with_changes(args=[call.args[0].with_changes(value=module_expr), *call.args[1:]])

    def rewrite(self, module: cst.Module, plan: DdpLayout) -> cst.Module:
        facts = self.facts
        dist = plan.dist
        rank_zero = RANK_ZERO.format(dist=dist)
        editor = _DdpEditor(plan, rank_zero, parse_expression(rank_zero, module))
        editor.barrier = parse_statement(f"{dist}.barrier()", module)

        if plan.dataparallel is not None:
            call = plan.dataparallel.call.node
            outer = plan.dataparallel_outer or call
            editor.rewrite_call(outer, lambda node, c=call, o=outer: self._replace_dataparallel(node, c, o))
            editor.isinstance_names = self._dataparallel_names(plan.dataparallel)
            if plan.wrap_before is not None and isinstance(plan.wrap_before, cst.If):
                editor.unwrap_if = id(plan.wrap_before)
        else:
            wrap = parse_statement(f"{plan.model} = {self.ddp}({plan.model}, gradient_as_bucket_view=True)", module)
            if plan.wrap_before is not None:
                editor.insert_before(plan.wrap_before, [wrap])
            else:
                editor.insert_after(plan.wrap_after, [wrap])

        init = self._init_statements(module, plan)
        destroy = parse_statement(f"{dist}.destroy_process_group()", module)
        if plan.guard is not None:
            body = list(plan.guard.body.body)  # type: ignore[union-attr]
            editor.insert_before(body[0], init)
            self._insert_destroy(editor, body[-1], destroy)
        else:
            init[0] = init[0].with_changes(leading_lines=[cst.EmptyLine(), *init[0].leading_lines])
            if plan.init_after is None:
                editor.prepend = init
            else:
                editor.insert_after(plan.init_after, init)
            self._insert_destroy(editor, plan.last, destroy)
        new = module.visit(editor)

        if torch_import_name(facts) is None:
            new = add_torch_import(new, "import torch")
        new = add_torch_import(new, f"import torch.distributed as {dist}")
        new = add_torch_import(new, f"from torch.nn.parallel import {DDP_NAME}")
        if not any(site.qualname == "os" and site.local == "os" and site.ctx is facts.module_frame for site in facts.imports):
            new = add_stdlib_import(new, "os")
        return new

    def _insert_destroy(self, editor: "_DdpEditor", last: cst.CSTNode, destroy: cst.BaseStatement) -> None:
        call = _single_call(last)
        dotted = full_name(call.func) if call is not None else None
        if dotted in ("sys.exit", "exit", "quit") and call is not None and len(call.args) == 1:
            # ``sys.exit(main())``: run main, destroy the group, then exit with its status.
            status = parse_statement("exit_status = 0", self.module)
            value = call.args[0].value
            status = status.with_changes(body=[status.body[0].with_changes(value=value)])
            exit_call = parse_statement(f"{dotted}(exit_status)", self.module)
            editor.replace_with(last, [status.with_changes(leading_lines=last.leading_lines), destroy, exit_call])
            return
        editor.insert_after(last, [destroy])

    def _chain_outer(self, call: cst.Call) -> cst.Call:
        """``DataParallel(net).cuda()``: the call whose result is bound, so the move can go inside."""
        for site in self.facts.calls:
            if site.method in ("cuda", "to") and site.receiver is call:
                return site.node
        return call

    def _replace_dataparallel(self, node: cst.Call, original: cst.Call, outer: cst.Call) -> cst.BaseExpression:
        if outer is original:
            return self._ddp_call(node.args[0].value)
        # ``DataParallel(net).cuda()`` → ``DistributedDataParallel(net.cuda(), ...)``: DDP wraps a moved model.
        inner = node.func.value  # type: ignore[attr-defined]
        moved = node.with_changes(func=node.func.with_changes(value=inner.args[0].value))  # type: ignore[attr-defined]
        return self._ddp_call(moved)

    def _dataparallel_names(self, wrap: Wrap) -> set[str]:
        name = wrap.call.name
        return {name} if name else set()

    def _init_statements(self, module: cst.Module, plan: DdpLayout) -> list[cst.BaseStatement]:
        torch, dist, backend = plan.torch, plan.dist, plan.backend
        cuda = f"{torch}.cuda.is_available()"
        code = (
            "pass\n"
            "# DDP (tcaudit fix --ddp): `torchrun --nproc_per_node=N` starts one process per GPU, each training\n"
            "# on batches of the script's batch size; a plain `python` run is a group of one.\n"
            f"if {cuda}:\n"
            f"    {torch}.cuda.set_device(int(os.environ.get(\"LOCAL_RANK\", 0)))\n"
            f"{self.backend} = {backend} if {cuda} else \"gloo\"\n"
            f"if \"RANK\" in os.environ:\n"
            f"    {dist}.init_process_group({self.backend})\n"
            "else:\n"
            f"    {dist}.init_process_group({self.backend}, store={dist}.HashStore(), rank=0, world_size=1)\n"
        )
        parsed = cst.parse_module(code, config=module.config_for_parsing)
        return list(parsed.body[1:])  # after the ``pass`` that keeps the comment with the first statement


class _DdpEditor(CallEditor):
    def __init__(self, plan: DdpLayout, rank_zero_code: str, rank_zero: cst.BaseExpression) -> None:
        super().__init__()
        self.plan = plan
        self.rank_zero = rank_zero
        self.isinstance_names: set[str] = set()
        self.unwrap_if: int | None = None
        self.prepend: list[cst.BaseStatement] = []
        self.barrier: cst.BaseStatement | None = None  # ``dist.barrier()``, after rank-0 checkpoint saves

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if id(original_node) in self.plan.module_calls or id(original_node) in self.plan.module_attributes:
            return updated_node.with_changes(value=cst.Attribute(value=updated_node.value, attr=cst.Name("module")))
        if id(original_node) in self.plan.module_values:
            return cst.Attribute(value=updated_node, attr=cst.Name("module"))
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if id(original_node) in self.plan.module_values:
            return cst.Attribute(value=updated_node, attr=cst.Name("module"))
        return updated_node

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.BaseExpression:
        if id(original_node) in self.plan.device_strings:
            quote = updated_node.quote
            return updated_node.with_changes(value=f"{updated_node.prefix}{quote}cuda{quote}")
        return updated_node

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.BaseExpression:
        if id(original_node) in self.plan.device_ints:
            return cst.SimpleString('"cuda"')
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.plan.device_calls:
            updated_node = updated_node.with_changes(args=[])
        if id(original_node) in self.plan.device_ordinals:
            first = updated_node.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            updated_node = updated_node.with_changes(args=[first])
        if self.isinstance_names and full_name(updated_node.func) == "isinstance" and len(updated_node.args) == 2:
            second = updated_node.args[1]
            if full_name(second.value) in self.isinstance_names:
                updated_node = updated_node.with_changes(
                    args=[updated_node.args[0], second.with_changes(value=cst.Name(DDP_NAME))]
                )
        return super().leave_Call(original_node, updated_node)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if id(original_node) in self.plan.rank_zero_ifs:
            test = updated_node.test
            if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)) and not test.lpar:
                test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated_node.with_changes(
                test=cst.BooleanOperation(left=test, operator=cst.And(), right=self.rank_zero)
            )
        if id(original_node) == self.unwrap_if:
            inner = updated_node.body.body[0]  # type: ignore[union-attr]
            return inner.with_changes(leading_lines=[*updated_node.leading_lines, *inner.leading_lines])
        return updated_node

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        if id(original_node) in self.plan.rank_zero_statements:
            guarded = cst.If(
                test=self.rank_zero,
                body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
                leading_lines=updated_node.leading_lines,
            )
            if id(original_node) in self.plan.saves_then_barrier:
                # Through ``after`` (not a FlattenSentinel): the block rebuild pairs each original
                # statement with its updated one.
                self.insert_after(original_node, [self.barrier])
            return guarded
        return updated_node

    def _merge(self, body: list) -> list:
        """Consecutive rank-0 blocks made here become one ``if``."""
        out: list = []
        for statement in body:
            previous = out[-1] if out else None
            if (
                isinstance(statement, cst.If)
                and isinstance(previous, cst.If)
                and statement.test is self.rank_zero
                and previous.test is self.rank_zero
                and not statement.leading_lines
                and statement.orelse is None
                and previous.orelse is None
            ):
                out[-1] = previous.with_changes(
                    body=previous.body.with_changes(body=[*previous.body.body, *statement.body.body])
                )
                continue
            out.append(statement)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        updated_node = super().leave_IndentedBlock(original_node, updated_node)
        return updated_node.with_changes(body=self._merge(list(updated_node.body)))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        updated_node = super().leave_Module(original_node, updated_node)
        body = self._merge(list(updated_node.body))
        if self.prepend:
            body = [*self.prepend, *body]
        return updated_node.with_changes(body=body)


_DEVICE_TARGET = re.compile(r"(^|[._])(device|dev|gpu|gpu_id|cuda_device)$", re.IGNORECASE)


_PER_PROCESS_PATH = re.compile(r"\b(mkdtemp|mkstemp|NamedTemporaryFile|TemporaryDirectory|getpid|uuid\d?)\b")


def _cpu_device(facts: ScriptFacts) -> bool:
    """Whether a device name is bound to ``"cpu"`` outright (``device = "cpu"``), not as the fallback of
    a CUDA test."""
    return any(
        _DEVICE_TARGET.search(binding.target) and literal_value(binding.value) == "cpu"
        for binding in facts.bindings
    )


def _integer_devices(facts: ScriptFacts) -> list[cst.Integer]:
    """Integer literals used as a device: bound to a device name (``device = 0``, ``args.gpu = 0``) or
    passed to ``.to(0)`` / ``.to(device=0)``."""
    out: list[cst.Integer] = []
    for binding in facts.bindings:
        if not _DEVICE_TARGET.search(binding.target):
            continue
        # ``device = 0`` and ``device = 0 if torch.cuda.is_available() else "cpu"`` alike.
        values = [binding.value.body, binding.value.orelse] if isinstance(binding.value, cst.IfExp) else [binding.value]
        out.extend(value for value in values if isinstance(value, cst.Integer))
    for call in facts.method_calls("to"):
        device = call.arg("device", 0)
        if isinstance(device, cst.Integer):
            out.append(device)
    return out


def _receiving_param(fn: cst.FunctionDef, call: cst.Call, arg: cst.Arg, constructor: bool = False) -> str | None:
    """The parameter of ``fn`` that ``arg`` of ``call`` binds (a method's or constructor's ``self`` skipped)."""
    params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
    if params[:1] in (["self"], ["cls"]) and (constructor or isinstance(call.func, cst.Attribute)):
        params = params[1:]
    if arg.keyword is not None:
        names = params + [p.name.value for p in fn.params.kwonly_params]
        return arg.keyword.value if arg.keyword.value in names else None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    index = next(i for i, a in enumerate(positional) if a is arg)
    return params[index] if index < len(params) else None


# Builtins that take any object and read nothing of a model inside it.
_BUILTINS_TAKING_ANY = frozenset({"print", "isinstance", "getattr", "hasattr", "setattr", "id", "repr", "str", "type",
                                  "vars", "len", "format"})


def _holder_read(facts: ScriptFacts, fn: cst.FunctionDef, param: str, attr: str) -> tuple[str, int] | None:
    """The first read in ``fn`` of ``<param>.<attr>.<name>`` that DDP does not answer itself (its own API but
    ``state_dict``, whose keys it prefixes with ``module.``), or of ``<param>.<attr>`` handed on whole."""
    holder = f"{param}.{attr}"
    for node in nodes_of(fn, cst.Attribute):
        read = node.attr.value
        if attribute_chain(node.value) == holder and (read not in MODULE_API or read == "state_dict"):
            return f"{holder}.{node.attr.value}", facts.line_of(node)
    for call in nodes_of(fn, cst.Call):
        if any(not a.star and attribute_chain(a.value) == holder for a in call.args):
            return f"{holder}", facts.line_of(call)
    return None


def bare_reads(project: Project, module: ProjectModule, fn: cst.FunctionDef, param: str, depth: int,
               ) -> list[tuple[str, int, str, bool]]:
    """What ``fn`` (in ``module``) reads of the model it receives as ``param`` that DistributedDataParallel
    does not answer itself (``net.n_classes``), followed into the functions it hands the model on to (three
    calls deep); each as ``(where, line, read, whether fn trains)``. A class's ``__init__`` counts the reads
    of the attribute it keeps the model in (``self.net = net``) in the class's methods."""
    facts = module.facts
    trains = any((call.method or "") in ("backward", "step") for call in facts.calls
                 if call.ctx.function is fn or (call.ctx.function is not None and contains(fn, call.ctx.function)))
    where = module.display_path
    out: list[tuple[str, int, str, bool]] = []
    kept = {f"self.{b.target.split('.', 1)[1]}" for b in facts.bindings
            if fn.name.value == "__init__" and b.ctx.function is fn and b.target.startswith("self.")
            and isinstance(b.value, cst.Name) and b.value.value == param}
    scope: cst.CSTNode = fn
    if kept:
        scope = next((cls for cls, _ in facts.classes if contains(cls, fn)), fn)
        trains = trains or any((call.method or "") in ("backward", "step") for call in facts.calls
                               if call.ctx.class_def is scope)
    names = {param} | kept

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if attribute_chain(node.value) in names and node.attr.value not in MODULE_API:
                chain = attribute_chain(node.value)
                if chain == param and kept and not contains(fn, node):
                    return  # a parameter of the same name in another method
                out.append((where, facts.line_of(node), f"{chain}.{node.attr.value}", trains))

    walk(scope, _Reads())
    if out or depth >= 2:
        return out
    for call in facts.calls:
        if not contains(scope, call.node):
            continue
        for arg in call.node.args:
            if arg.star or attribute_chain(arg.value) not in names:
                continue
            local = module.definitions.get(call.name or "")
            if isinstance(local, cst.FunctionDef):
                target, into = local, module
            else:
                symbol = project.callee(facts, call)
                if symbol is None or symbol.function is None:
                    continue
                target, into = symbol.function, symbol.module
            inner = _receiving_param(target, call.node, arg, constructor=target.name.value == "__init__")
            if inner is not None and target is not fn:
                found = bare_reads(project, into, target, inner, depth + 1)
                if found:
                    return [(w, line, read, trained or trains) for w, line, read, trained in found]
    return out
