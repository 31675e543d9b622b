"""Which training DataLoaders load in the main process where worker processes would help: TC401
reports them, TC404 (persistent workers) counts on TC401's fix for them."""

from __future__ import annotations

from tcaudit.project.loaders import zero_workers
from tcaudit.project.values import Value, Values
from tcaudit.script.expressions import literal
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.loader_sharding import feeds_only_other_loops
from tcaudit.script.pipeline import PipelineFacts


def loaders_without_workers(pipeline: PipelineFacts) -> list[LoaderSite]:
    """The training DataLoaders this rule reports: no worker processes (no ``num_workers``, or a
    written 0), on a dataset that gains from them."""
    if not (pipeline.facts.uses_accelerator or pipeline.uses_cuda):
        return []
    out = []
    for site in pipeline.training_loaders:
        if site.has("num_workers"):
            if not all(literal(v) == 0 for v in site.values("num_workers")):
                continue  # workers, or a value given by name (loaders_with_named_zero)
        elif not site.complete:
            continue  # an untraceable **kwargs may set it
        if gains_from_workers(pipeline, site):
            out.append(site)
    return out


def loaders_with_named_zero(pipeline: PipelineFacts, values: Values) -> list[tuple[LoaderSite, Value]]:
    """The training DataLoaders whose ``num_workers`` is given by a name that holds 0 wherever it is
    read (``num_workers = 0`` in an earlier notebook cell, a module constant, ``--workers`` defaulting
    to 0): each with the value that says how."""
    if not (pipeline.facts.uses_accelerator or pipeline.uses_cuda):
        return []
    out = []
    for site in pipeline.training_loaders:
        zero = zero_workers(values, pipeline.facts, site)
        # A written 0 or no num_workers at all (``how`` empty) is loaders_without_workers'.
        if zero is not None and zero.how and gains_from_workers(pipeline, site):
            out.append((site, zero))
    return out


def gains_from_workers(pipeline: PipelineFacts, site: LoaderSite) -> bool:
    """Whether worker processes would help this training DataLoader: its batches reach training, and
    its dataset is not GPU tensors (which cannot go through workers), an in-memory TensorDataset (which
    gains nothing) or an IterableDataset that does not shard by worker (which would yield every sample
    once per worker)."""
    if feeds_only_other_loops(pipeline.facts, site.call):
        return False  # its batches only reach evaluation
    return pipeline.dataset_kind(site) == "other"
