"""Training DataLoaders a script gets from a helper of another project module (``train_loader =
utils.get_data(args)``, ``train_dl, val_dl = build_loaders(cfg)``): TC401 and TC402 judge them as they
judge the script's own, by what the helper's module writes, and report them at the script's call
with the DataLoader's line as a related place; TC505's ``--ddp`` decline names them."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.project.symbols import Project, Symbol
from tcaudit.project.values import Value, Values
from tcaudit.script.distributed import in_test_code
from tcaudit.script.expressions import assigned_targets, function_returns
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.loader_construction import LoaderSite, is_eval_name
from tcaudit.script.loader_sharding import feeds_only_other_loops
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import param_names


@dataclass(frozen=True)
class HelperLoader:
    """A DataLoader built in another project module, reaching the script through ``call``."""

    call: CallSite  # the script's call of the helper (where findings are reported)
    site: LoaderSite  # the DataLoader call in the helper's module
    pipeline: PipelineFacts  # the helper module's
    helper: Symbol  # the helper function

    @property
    def where(self) -> str:
        facts = self.pipeline.facts
        return f"{facts.source.display_path}:{facts.line_of(self.site.call.node)}"

    @property
    def described(self) -> str:
        return f"`{self.helper.name}` ({self.where})"


def loaders_built_elsewhere(facts: ScriptFacts, project: Project) -> list[HelperLoader]:
    """The training DataLoaders the script's calls get from helpers of other project modules, where the
    script trains on CUDA. Made once per file."""
    found = _FOUND.get(facts)
    if found is None:
        found = _find(facts, project)
        _FOUND[facts] = found
    return found


_FOUND: "weakref.WeakKeyDictionary[ScriptFacts, list[HelperLoader]]" = weakref.WeakKeyDictionary()


def _find(facts: ScriptFacts, project: Project) -> list[HelperLoader]:
    pipeline = pipeline_facts(facts)
    if not pipeline.trains or not (facts.uses_accelerator or pipeline.uses_cuda):
        return []
    here = facts.source.path.resolve()
    out: list[HelperLoader] = []
    seen: set[int] = set()
    for call in facts.calls:
        if call.name is None or in_test_code(call.ctx) or facts.in_eval(call.ctx):
            continue
        helper = project.callee(facts, call)
        fn = helper.function if helper is not None else None
        if helper is None or fn is None or helper.module.path == here or helper.kind != "function":
            continue
        if facts.function_is_eval(call.ctx.function) if call.ctx.function is not None else False:
            continue
        theirs = pipeline_facts(helper.facts)
        for site in theirs.loaders:
            if site.call.ctx.function is not fn or id(site.call.node) in seen:
                continue
            position = _returned_at(fn, site)
            if position is None or not site.training or feeds_only_other_loops(helper.facts, site.call):
                continue
            name = _received_as(call, position)
            if is_eval_name(name):
                continue
            seen.add(id(site.call.node))
            out.append(HelperLoader(call, site, theirs, helper))
    return out


def _returned_at(fn: cst.FunctionDef, site: LoaderSite) -> int | None:
    """Where the helper returns the DataLoader: -1 alone, its index in a returned tuple, None when it
    does not return it."""
    names = {site.target} if site.target else set()
    for returned in function_returns(fn):
        if returned is site.call.node or (names and get_full_name_for_node(returned) in names):
            return -1
        if isinstance(returned, (cst.Tuple, cst.List)):
            for index, element in enumerate(returned.elements):
                value = element.value
                if value is site.call.node or (names and get_full_name_for_node(value) in names):
                    return index
    return None


def _received_as(call: CallSite, position: int) -> str | None:
    """The name the script gives the returned loader (``train_dl`` of ``train_dl, val_dl = f()``)."""
    for target in assigned_targets(call):
        if position == -1:
            return get_full_name_for_node(target)
        if isinstance(target, (cst.Tuple, cst.List)) and position < len(target.elements):
            return get_full_name_for_node(target.elements[position].value)
    return None


def dataset_built_there(loader: HelperLoader) -> bool:
    """Whether the helper builds the dataset itself (not handed one by its caller, whose kind this
    module cannot tell) and it is one that gains from workers and pinning."""
    dataset = loader.site.call.arg("dataset", 0)
    fn = loader.helper.function
    if dataset is None or fn is None:
        return False
    root = (get_full_name_for_node(dataset) or "").split(".")[0]
    if root in param_names(fn):
        return False
    return loader.pipeline.dataset_kind(loader.site) == "other"


def zero_workers(values: Values, loader: HelperLoader) -> Value | None:
    """How the helper's DataLoader comes to have no worker processes: a Value (``how`` empty for no
    ``num_workers`` or a written 0), None when it has workers or a value the user chooses."""
    site = loader.site
    if not site.has("num_workers"):
        return Value(0) if site.complete else None
    found: list[Value] = []
    for expr in site.values("num_workers"):
        held = values.of(loader.pipeline.facts, expr, site.call.ctx.function)
        if not held or any(v.value != 0 or isinstance(v.value, bool) for v in held):
            return None
        found += held
    return next((v for v in found if v.how), found[0] if found else None)
