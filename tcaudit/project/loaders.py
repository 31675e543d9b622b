"""Training DataLoaders a script gets from a helper of another project module (``train_loader =
utils.get_data(args)``, ``train_dl, val_dl = build_loaders(cfg)``): TC401 and TC402 judge them as they
judge the script's own, by what the helper's module writes, and report them at the script's call
with the DataLoader's line as a related place; TC505's ``--ddp`` decline names them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from tcaudit.project.importers import training_importers
from tcaudit.project.modules import load_module
from tcaudit.project.symbols import Project, Symbol, project_of
from tcaudit.project.values import Value, Values
from tcaudit.script.distributed import in_test_code
from tcaudit.script.expressions import assigned_targets, function_returns
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.loader_construction import LoaderSite, is_eval_name
from tcaudit.script.loader_sharding import feeds_only_other_loops
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, param_names


@dataclass(frozen=True)
class HelperLoader:
    """A DataLoader built in another project module, reaching the script through ``call``."""

    call: CallSite  # the script's call of the helper (where findings are reported)
    site: LoaderSite  # the DataLoader call in the helper's module
    pipeline: PipelineFacts  # the helper module's
    helper: Symbol  # the helper function
    received: str | None = None  # the name the script gives the loader (``train_dl`` of ``train_dl, val_dl = f()``)

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
    return facts.derived(loaders_built_elsewhere, lambda made: _find(made, project))


def _find(facts: ScriptFacts, project: Project) -> list[HelperLoader]:
    pipeline = pipeline_facts(facts)
    if not pipeline.trains or not (facts.uses_accelerator or pipeline.uses_cuda):
        return []
    if not project.may_reach(facts):
        return []  # no import leads into the project: every call's helper is this module's own
    here = facts.source.path.resolve()
    out: list[HelperLoader] = []
    seen: set[int] = set()
    for call in facts.calls:
        if call.name is None or in_test_code(call.ctx) or facts.in_eval(call.ctx):
            continue
        helper = project.callee(facts, call)
        fn = helper.function if helper is not None else None
        if helper is None or fn is None or helper.module.path == here or helper.kind not in ("function", "method"):
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
            out.append(HelperLoader(call, site, theirs, helper, name))
    return out


def _returned_at(fn: cst.FunctionDef, site: LoaderSite) -> int | None:
    """Where the helper returns the DataLoader: -1 alone, its index in a returned tuple, None when it
    does not return it."""
    names = {site.target} if site.target else set()
    for returned in function_returns(fn):
        if returned is site.call.node or (names and full_name(returned) in names):
            return -1
        if isinstance(returned, (cst.Tuple, cst.List)):
            for index, element in enumerate(returned.elements):
                value = element.value
                if value is site.call.node or (names and full_name(value) in names):
                    return index
    return None


def _received_as(call: CallSite, position: int) -> str | None:
    """The name the script gives the returned loader (``train_dl`` of ``train_dl, val_dl = f()``)."""
    for target in assigned_targets(call):
        if position == -1:
            return full_name(target)
        if isinstance(target, (cst.Tuple, cst.List)) and position < len(target.elements):
            return full_name(target.elements[position].value)
    return None


def dataset_built_there(site: LoaderSite, pipeline: PipelineFacts) -> bool:
    """Whether the DataLoader's own module builds its dataset (not handed one by its function's caller,
    whose kind that module cannot tell) and it is one that gains from workers and pinning."""
    dataset = site.call.arg("dataset", 0)
    fn = site.call.ctx.function
    if dataset is None:
        return False
    root = (full_name(dataset) or "").split(".")[0]
    if fn is not None and root in param_names(fn):
        return False
    return pipeline.dataset_kind(site) == "other"


def by_site(uses: list[TrainingUse]) -> list[tuple[LoaderSite, list[TrainingUse]]]:
    """The training uses grouped by DataLoader, in line order."""
    groups: dict[int, tuple[LoaderSite, list[TrainingUse]]] = {}
    for use in uses:
        groups.setdefault(id(use.site.call.node), (use.site, []))[1].append(use)
    return list(groups.values())


def zero_workers(values: Values, facts: ScriptFacts, site: LoaderSite) -> Value | None:
    """How a DataLoader (of ``facts``' module) comes to have no worker processes: a Value (``how`` empty
    for no ``num_workers`` or a written 0), None when it has workers or a value the user chooses."""
    if not site.has("num_workers"):
        return Value(0) if site.complete else None
    found: list[Value] = []
    for expr in site.values("num_workers"):
        held = values.of(facts, expr, site.call.ctx.function)
        if not held or any(v.value != 0 or isinstance(v.value, bool) for v in held):
            return None
        found += held
    return next((v for v in found if v.how), found[0] if found else None)


# -- the other direction: a helper module's DataLoaders that scripts of the project train with --------

@dataclass(frozen=True)
class TrainingUse:
    """A script of the project that trains with a DataLoader this module's function builds."""

    site: LoaderSite  # in the module asked about (its own facts' node)
    script: ScriptFacts  # the script's facts
    call: CallSite  # the script's call of the helper
    helper: str  # the helper function's name
    guarded: bool  # the script's training code runs under ``if __name__ == "__main__":``


def training_uses(facts: ScriptFacts, root: Path | None) -> list[TrainingUse]:
    """The DataLoaders built in ``facts``' module (which trains nothing itself) that scripts of the
    project get from its functions and train with on CUDA (what :func:`loaders_built_elsewhere` finds
    from each script), found by looking for the project's training scripts that import this module."""
    return facts.derived(training_uses, lambda made: _training_uses(made, root))


def _training_uses(facts: ScriptFacts, root: Path | None) -> list[TrainingUse]:
    pipeline = pipeline_facts(facts)
    if pipeline.trains or not any(site.call.ctx.function is not None for site in pipeline.loaders):
        return []
    try:
        here = facts.source.path.resolve()
    except (OSError, RuntimeError):
        return []
    # Matched by function and order, not line: the module asked about may be a fix's in-memory text.
    by_key = {key: site for key, site in _keyed(facts, pipeline.loaders)}
    out: list[TrainingUse] = []
    for script_path in training_importers(here, root):
        module = load_module(script_path)
        if module is None:
            continue
        script = module.facts
        for loader in loaders_built_elsewhere(script, project_of(script, root)):
            if loader.helper.module.path != here:
                continue
            theirs_keys = dict((id(site.call.node), key) for key, site in _keyed(loader.pipeline.facts, loader.pipeline.loaders))
            site = by_key.get(theirs_keys.get(id(loader.site.call.node)))
            if site is None:
                continue
            theirs = pipeline_facts(script)
            guard = theirs.main_guard
            ctx = loader.call.ctx
            guarded = guard is not None and (ctx.function is not None or ctx.inside(guard))
            out.append(TrainingUse(site, script, loader.call, loader.helper.name, guarded))
    return out


def _keyed(facts: ScriptFacts, sites: list[LoaderSite]) -> list[tuple[tuple[str, int], LoaderSite]]:
    """Each DataLoader with (its function's dotted name, its place among that function's DataLoaders)."""
    counts: dict[str, int] = {}
    out = []
    for site in sites:
        scope = facts.scope_name(site.call.node)
        counts[scope] = counts.get(scope, 0) + 1
        out.append(((scope, counts[scope]), site))
    return out
