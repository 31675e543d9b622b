"""The worker-process edit of a training DataLoader (``num_workers=...``, importing ``os`` where
needed): TC401 makes it, TC404 asks whether it can be made. It is never made over a dataset whose own
random generator every worker would copy (TC410, :mod:`tcaudit.script.dataset_rng`)."""

from __future__ import annotations

from tcaudit.findings import DeclineFix
from tcaudit.rewrite.edits import KeywordPlan, decline_key_in_dict, plan_loader_keyword
from tcaudit.script.dataset_rng import workers_repeat_generators
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import PipelineFacts

WORKERS = "min(16, os.cpu_count() or 1)"


def plan_workers(pipeline: PipelineFacts, site: LoaderSite, unguarded_scripts: tuple[str, ...] | None = None) -> KeywordPlan:
    """The edit that gives this DataLoader workers; DeclineFix when it cannot be made safely.
    ``unguarded_scripts``: for a DataLoader of a helper module that scripts of the project train with,
    those of the scripts without a ``__main__`` guard (the module itself needs none)."""
    facts = pipeline.facts
    decline_key_in_dict(site, "num_workers")
    if workers_repeat_generators(pipeline, site) is not None:
        raise DeclineFix(
            "the dataset's own random generator would repeat in every worker: reseed it in worker_init_fn "
            "first (TC410)"
        )
    ctx = site.call.ctx
    guard = pipeline.main_guard
    if unguarded_scripts:
        raise DeclineFix(
            f"{', '.join(unguarded_scripts)} train{'s' if len(unguarded_scripts) == 1 else ''} with this DataLoader "
            "without an `if __name__ == \"__main__\":` guard: worker processes started with spawn would re-run it"
        )
    if unguarded_scripts is None and facts.source.notebook is not None:
        # A notebook has no ``__main__`` guard to add: what breaks is the workers' unpickling of what its
        # cells define (they live in the kernel's ``__main__``, which a spawned worker does not have).
        raise DeclineFix(
            "in a notebook, worker processes started with spawn/forkserver (Windows, macOS, Linux from Python "
            "3.14) cannot load a dataset, transform or collate_fn defined in its cells: move them into a .py "
            "module, import it, then set num_workers"
        )
    if unguarded_scripts is None and (guard is None or (ctx.function is None and not ctx.inside(guard))):
        raise DeclineFix(
            "the script has no `if __name__ == \"__main__\":` guard around its training code: worker "
            "processes started with spawn/forkserver (Windows, macOS, Linux from Python 3.14) would "
            "re-run the whole script"
        )
    os_name = _os_name(facts)
    value = WORKERS.replace("os.", f"{os_name}.")
    imports = ("os",) if os_name == "os" and not _imports_os(facts) else ()
    return plan_loader_keyword(site, "num_workers", value, imports)


def _os_name(facts: ScriptFacts) -> str:
    for site in facts.imports:
        if site.qualname == "os" and site.ctx is facts.module_frame:
            return site.local
    if facts.bindings_of("os"):
        raise DeclineFix("the name `os` is bound to something else in this file")
    return "os"


def _imports_os(facts: ScriptFacts) -> bool:
    return any(site.qualname == "os" and site.local == "os" and site.ctx is facts.module_frame for site in facts.imports)
