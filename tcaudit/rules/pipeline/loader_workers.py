"""Which training DataLoaders load in the main process where worker processes would help: TC401
reports them, TC404 (persistent workers) counts on TC401's fix for them."""

from __future__ import annotations

from tcaudit.script.expressions import literal
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.loader_sharding import feeds_only_other_loops
from tcaudit.script.pipeline import PipelineFacts


def loaders_without_workers(pipeline: PipelineFacts) -> list[LoaderSite]:
    """The training DataLoaders this rule reports: no worker processes, on a dataset that gains from them."""
    facts = pipeline.facts
    if not (facts.uses_accelerator or pipeline.uses_cuda):
        return []
    out = []
    for site in pipeline.training_loaders:
        if site.has("num_workers"):
            if not all(literal(v) == 0 for v in site.values("num_workers")):
                continue  # workers, or a value the user controls (num_workers=args.workers)
        elif not site.complete:
            continue  # an untraceable **kwargs may set it
        if feeds_only_other_loops(facts, site.call):
            continue  # its batches only reach evaluation
        if pipeline.dataset_kind(site) != "other":
            # Tensors already on the GPU cannot go through workers; an in-memory TensorDataset
            # gains nothing from them; an IterableDataset that does not shard by worker would
            # yield every sample once per worker.
            continue
        out.append(site)
    return out
