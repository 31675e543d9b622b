"""The worker-process edit of a training DataLoader (``num_workers=...``, importing ``os`` where
needed): TC401 makes it, TC404 asks whether it can be made. It is never made over a dataset whose own
random generator every worker would copy (TC410, :mod:`tcaudit.script.dataset_rng`)."""

from __future__ import annotations

import libcst as cst

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
    in_notebook = unguarded_scripts is None and facts.source.notebook is not None
    if in_notebook:
        # A notebook has no ``__main__`` guard to add, and a spawned worker does not re-run it (the kernel's
        # ``__main__`` has no file): what breaks is unpickling what its cells define, which lives there.
        defined = _notebook_definition_reached(facts, site.call.node)
        if defined is not None:
            raise DeclineFix(
                f"in a notebook, worker processes started with spawn/forkserver (Windows, macOS, Linux from "
                f"Python 3.14) cannot load {defined}, defined in its cells: move it into a .py module, import "
                "it, then set num_workers"
            )
    if not in_notebook and unguarded_scripts is None and (
            guard is None or (ctx.function is None and not ctx.inside(guard))):
        raise DeclineFix(
            "the script has no `if __name__ == \"__main__\":` guard around its training code: worker "
            "processes started with spawn/forkserver (Windows, macOS, Linux from Python 3.14) would "
            "re-run the whole script"
        )
    os_name = os_local_name(facts)
    value = WORKERS.replace("os.", f"{os_name}.")
    imports = ("os",) if os_name == "os" and not imports_os(facts) else ()
    return plan_loader_keyword(site, "num_workers", value, imports)


def _notebook_definition_reached(facts: ScriptFacts, call: cst.Call) -> str | None:
    """What the DataLoader ``call`` hands its workers that the notebook's cells define (`` `FaceDataset` ``, a
    lambda), read through the names its arguments hold (two assignments deep); None where nothing is."""
    defined = {statement.name.value for statement in facts.module.body
               if isinstance(statement, (cst.ClassDef, cst.FunctionDef))}
    # What a function of the notebook returns is handed over, not the function (an instance of its class is
    # pickled by the class's name, so a class counts wherever it is written).
    functions = {statement.name.value for statement in facts.module.body if isinstance(statement, cst.FunctionDef)}
    seen: set[int] = set()
    pending: list[tuple[cst.CSTNode, int]] = [(arg.value, 0) for arg in call.args]
    while pending:
        node, depth = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, cst.Lambda):
            return "a lambda"
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in functions:
            pending.extend((arg.value, depth) for arg in node.args)
            continue
        if isinstance(node, cst.Name):
            if node.value in defined:
                return f"`{node.value}`"
            if depth < 2:
                pending.extend((binding.value, depth + 1) for binding in facts.bindings_of(node.value))
        pending.extend((child, depth) for child in node.children)
    return None


def os_local_name(facts: ScriptFacts) -> str:
    """The name this file gives the ``os`` module (``os`` where it does not import it yet); DeclineFix where
    ``os`` names something else."""
    for site in facts.imports:
        if site.qualname == "os" and site.ctx is facts.module_frame:
            return site.local
    if facts.bindings_of("os"):
        raise DeclineFix("the name `os` is bound to something else in this file")
    return "os"


def imports_os(facts: ScriptFacts) -> bool:
    """Whether the file imports ``os`` under its own name at module level."""
    return any(site.qualname == "os" and site.local == "os" and site.ctx is facts.module_frame for site in facts.imports)
