"""TC410 dataset-rng-shared-by-workers: a dataset's own random generator, copied into every worker.

A dataset class of this file creates a generator in ``__init__`` (``self.rng =
np.random.default_rng(seed)``, ``RandomState``, ``random.Random``, ``torch.Generator().manual_seed``)
and draws from it in ``__getitem__``; a training DataLoader over it has workers (``num_workers`` other
than a literal 0) and no ``worker_init_fn``. Each worker receives a pickled copy of the dataset with
the same generator state, so the workers repeat each other's augmentations (and, without persistent
workers, every epoch repeats the first). The detection lives in :mod:`tcaudit.script.dataset_rng`;
TC401's fix declines to add workers over such a dataset.

Fix (numerics: the augmentation draws change): a module-level ``_tcaudit_seed_worker`` after the
dataset class that gives ``get_worker_info().dataset`` a new generator of the same kind seeded with
the worker's seed, passed as ``worker_init_fn=``. Declined when the DataLoader takes ``**kwargs``,
gets a wrapper of the dataset (Subset, random_split, ConcatDataset) or possibly another dataset, the
generator's kind or constructor is unclear, two generators of one kind would get one seed, the class
is not defined at module level (spawn could not unpickle the helper), or a framework builds the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression, parse_statement, torch_import_name, unique_name
from tcaudit.rewrite.edits import (
    CallEditor,
    KeywordPlan,
    ReplaceArgument,
    add_keyword,
    add_torch_import,
    plan_loader_keyword,
    replace_argument,
    with_torch_name,
)
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.dataset_rng import OwnGenerator, SharedGenerators, workers_repeat_generators
from tcaudit.script.evidence import TRAINS
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.triggers import all_of

HELPER = "_tcaudit_seed_worker"
# The new generator each worker gets, by kind: ``{ctor}`` is the constructor as the file writes it.
_RESEEDED = {
    "numpy": "{ctor}(info.seed)",
    "numpy-legacy": "{ctor}(info.seed % 2**32)",  # RandomState takes seeds below 2**32
    "random": "{ctor}(info.seed)",
    "torch": "{ctor}().manual_seed(info.seed)",
}


@dataclass(frozen=True, eq=False)
class SeedWorkers(FixPlan):
    """``worker_init_fn=<helper>`` on the DataLoader, and the helper after the dataset class."""

    kind = "seed-workers"
    keyword: KeywordPlan
    dataset: cst.ClassDef  # the helper goes right after it
    helper: str
    code: str  # the helper's definition
    import_torch: bool


class DatasetRngSharedByWorkers(ScriptRule):
    id = "TC410"
    triggers = (all_of(r"DataLoader", r"__getitem__", r"default_rng|RandomState|Random|Generator", TRAINS),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        helpers: dict[int, str] = {}  # dataset class → its helper's name, one per class
        for site in pipeline.training_loaders:
            if not site.complete or not _has_workers(site):
                continue  # an untraceable **kwargs may pass worker_init_fn; no workers: nothing is copied
            shared = workers_repeat_generators(pipeline, site)
            if shared is None:
                continue
            shared = _not_the_samplers(site, shared)
            if shared is None:
                continue
            first, more = shared.generators[0], len(shared.generators) - 1
            subject = f"`{shared.dataset.name.value}.{first.attribute}`"
            subject += f" and {more} other generator{'s' if more > 1 else ''} are" if more else " is"
            yield self.finding(
                facts,
                site.call.node,
                f"{subject} copied into every DataLoader worker: the workers repeat the same draws",
                explanation=f"Each worker process gets a pickled copy of the dataset ({shared.attributes}) with the "
                "same generator state, "
                "so worker k's i-th sample gets the same draws as worker 0's i-th sample (and, without persistent "
                "workers, every epoch starts from the same state again). Reseed it per worker in a `worker_init_fn` "
                "from `torch.utils.data.get_worker_info().seed` (PyTorch docs, torch.utils.data, \"Randomness in "
                "multi-process data loading\").",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "reseed the dataset's generator in each worker (worker_init_fn)",
                    lambda site=site, shared=shared: _plan(pipeline, site, shared, helpers),
                ),
            )


def _has_workers(site: LoaderSite) -> bool:
    values = site.values("num_workers")
    return bool(values) and not all(literal(v) == 0 for v in values)


def _not_the_samplers(site: LoaderSite, shared: SharedGenerators) -> SharedGenerators | None:
    """Without the generators the DataLoader also gets as ``generator=`` (the sampler's, in the main process)."""
    module = cst.Module([])
    passed = " ".join(module.code_for_node(v) for v in site.values("generator"))
    kept = tuple(g for g in shared.generators if f".{g.attribute}" not in passed)
    if not kept:
        return None
    return SharedGenerators(shared.dataset, kept, shared.wrapped, shared.alternatives)


def _plan(pipeline: PipelineFacts, site: LoaderSite, shared: SharedGenerators, helpers: dict[int, str]) -> SeedWorkers:
    facts = pipeline.facts
    if pipeline.framework_owned:
        raise DeclineFix(
            "a framework builds this training loop and may pass its own worker_init_fn; reseed the "
            "generator from torch.utils.data.get_worker_info() inside the dataset instead"
        )
    if site.call.has_star_kwargs:
        raise DeclineFix("the DataLoader takes **kwargs: add worker_init_fn to that dict instead")
    if shared.wrapped or shared.alternatives:
        raise DeclineFix(
            "the DataLoader may get a wrapper of the dataset (Subset, random_split, ConcatDataset) or another "
            "dataset, so get_worker_info().dataset is not known to be the one that holds the generator"
        )
    cls = shared.dataset
    if not any(statement is cls for statement in facts.module.body):
        raise DeclineFix(
            f"`{cls.name.value}` is not defined at module level: a worker_init_fn beside it could not be "
            "pickled for spawned workers"
        )
    kinds = [g.kind for g in shared.generators]
    if None in kinds:
        raise DeclineFix(f"{shared.attributes} is written in more than one way in __init__: its kind is unclear")
    if len(set(kinds)) != len(kinds):
        raise DeclineFix("the dataset holds several generators of one kind, which would get one seed per worker")
    lines = [_reseed_line(facts, g) for g in shared.generators]
    import_torch = torch_import_name(facts) is None
    if import_torch and (facts.bindings_of("torch") or any(s.local == "torch" for s in facts.imports)):
        raise DeclineFix("the name `torch` is bound to something else in this file")
    name = helpers.get(id(cls))
    if name is None:
        name = helpers[id(cls)] = _helper_name(facts, taken=helpers.values())
    keyword = plan_loader_keyword(site, "worker_init_fn", name)
    code = "\n".join([
        f"def {name}(worker_id):",
        f"    # Each worker gets a copy of {cls.name.value} with the same generator state: reseed it (TC410).",
        "    info = torch.utils.data.get_worker_info()",
        *(f"    {line}" for line in lines),
    ])
    return SeedWorkers(keyword, cls, name, with_torch_name(code, facts) + "\n", import_torch)


def _reseed_line(facts: ScriptFacts, generator: OwnGenerator) -> str:
    constructor = generator.constructor
    ctor = cst.Module([]).code_for_node(constructor.func)
    root = ctor.split(".")[0]
    if not any(s.local == root and s.ctx is facts.module_frame for s in facts.imports):
        raise DeclineFix(f"`{ctor}` is not imported at module level, where the worker_init_fn would need it")
    if generator.kind == "torch" and constructor.args:
        raise DeclineFix(f"`{ctor}(...)` takes arguments (a device?): its kind is unclear")
    return f"info.dataset.{generator.attribute} = {_RESEEDED[generator.kind].format(ctor=ctor)}"  # type: ignore[index]


def _helper_name(facts: ScriptFacts, taken) -> str:
    """The first free ``_tcaudit_seed_worker``, ``_tcaudit_seed_worker2``...: not a binding, import, function
    or class of the file, nor a helper this fix names for another dataset class."""
    defined = [fn.name.value for fn, _ in facts.functions] + [cls.name.value for cls, _ in facts.classes]
    return unique_name(facts, HELPER, taken=[*taken, *defined])


# -- the fix ------------------------------------------------------------------------------------


class DatasetRngSharedByWorkersFix(Codemod):
    rule = "TC410"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[SeedWorkers] = [finding.fix.plan for finding in findings]
        editor = CallEditor()
        inserted: set[int] = set()
        for plan in plans:
            keyword = plan.keyword
            value = parse_expression(keyword.value, module)
            if isinstance(keyword, ReplaceArgument):
                index = next(i for i, arg in enumerate(keyword.call.args) if arg is keyword.argument)
                editor.rewrite_call(keyword.call, lambda node, i=index, v=value: replace_argument(node, i, v))
            else:
                editor.rewrite_call(keyword.call, lambda node, k=keyword.key, v=value: add_keyword(node, k, v))
            if id(plan.dataset) not in inserted:
                inserted.add(id(plan.dataset))
                helper = parse_statement(plan.code, module)
                editor.insert_after(plan.dataset, [helper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])])
        new = editor.apply(module)
        if any(plan.import_torch for plan in plans):
            new = add_torch_import(new, "import torch")
        return new
