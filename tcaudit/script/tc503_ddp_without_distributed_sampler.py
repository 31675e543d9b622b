"""TC503 ddp-without-distributed-sampler: a DDP script whose training DataLoader has no sampler."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import (
    EVAL_NAME,
    TRAIN_NAME,
    DistributedFacts,
    code,
    distributed_facts,
    in_test_code,
    literal_value,
    passes_keyword,
)
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

# A dataset built per rank (``Subset(ds, indices[rank::world])``, ``split_dataset_by_node``, a
# ``shard(...)``) already gives each process its own data; a streaming dataset splits itself.
_SHARDED_TEXT = re.compile(
    r"rank|world_size|num_replicas|shard|split_dataset_by_node|num_shards|streaming|IterableDataset|nodesplitter",
    re.IGNORECASE,
)
# Input libraries that split the data across ranks themselves.
_SELF_SHARDING_LIBRARIES = {"webdataset", "ffcv", "torchdata", "streaming", "nvidia", "ray"}

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
_SAMPLER_POSITION = 3


def _dataset_expr(call: CallSite) -> cst.BaseExpression | None:
    return call.arg("dataset", 0)


def _is_sharded(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> bool:
    dataset = _dataset_expr(call)
    if dataset is None:
        return True  # cannot tell what it loads
    classes = {node.name.value: node for node, _ in facts.classes}
    for value in facts.binding_values(dataset):
        if _SHARDED_TEXT.search(code(facts, value)):
            return True
        # A Dataset class of this file that picks its rank's part itself.
        if isinstance(value, cst.Call):
            cls = classes.get((get_full_name_for_node(value.func) or "").split(".")[-1])
            if cls is not None and _SHARDED_TEXT.search(code(facts, cls)):
                return True
    return False


def _is_training_loader(facts: ScriptFacts, info: DistributedFacts, call: CallSite, name: str | None) -> bool:
    if facts.in_eval(call.ctx):
        return False
    dataset = _dataset_expr(call)
    dataset_text = code(facts, dataset) if dataset is not None else ""
    if name and EVAL_NAME.search(name) or EVAL_NAME.search(dataset_text):
        return False
    if name and TRAIN_NAME.search(name) or TRAIN_NAME.search(dataset_text):
        return True
    if not name:
        return False
    # An unnamed-purpose loader (``loader``) counts when a step loop iterates it.
    short = name.split(".")[-1]
    for loop in info.step_loops.values():
        node = loop.node
        header = node.iter if isinstance(node, cst.For) else node.test  # type: ignore[union-attr]
        if re.search(rf"\b{re.escape(short)}\b", code(facts, header)):
            return True
        if isinstance(node, cst.While) and re.search(rf"\b{re.escape(short)}\b", code(facts, node)):
            return True
    return False


class DdpWithoutDistributedSampler(ScriptRule):
    id = "TC503"
    triggers = (r"DistributedDataParallel|FullyShardedDataParallel|fully_shard",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.is_ddp_script or facts.frameworks or info.iterable_dataset_defined:
            return
        if facts.imported_roots() & _SELF_SHARDING_LIBRARIES:
            return
        for call in info.dataloaders:
            if in_test_code(call.ctx):
                continue
            positional = [a for a in call.node.args if a.keyword is None and not a.star]
            if len(positional) > _SAMPLER_POSITION:
                continue  # sampler passed by position
            sampler = passes_keyword(facts, call, "sampler")
            batch_sampler = passes_keyword(facts, call, "batch_sampler")
            if sampler is None or batch_sampler is None:
                continue  # a **kwargs dict we cannot see may hold one
            if sampler and literal_value(call.arg("sampler")) is not None:
                continue
            if batch_sampler and literal_value(call.arg("batch_sampler")) is not None:
                continue
            name = info.dataloader_name(call)
            if not _is_training_loader(facts, info, call, name):
                continue
            if _is_sharded(facts, info, call):
                continue
            dataset = _dataset_expr(call)
            shuffle = call.arg("shuffle", 2)
            yield self.finding(
                facts,
                call.node,
                f"the model is wrapped in DDP but the training DataLoader{f' `{name}`' if name else ''} has no "
                "DistributedSampler: every process iterates the whole dataset in the same order, so each "
                "epoch does the work of one GPU N times",
                fix=Fix(
                    FixClass.SAFE,
                    "pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle= "
                    "(shuffle with a sampler is a ValueError)",
                    anchor={
                        "kind": "add-distributed-sampler",
                        "line": facts.line_of(call.node),
                        "dataset": code(facts, dataset) if dataset is not None else None,
                        "shuffle": code(facts, shuffle) if shuffle is not None else None,
                        "loader": name,
                    },
                ),
            )
