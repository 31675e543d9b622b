"""TC402 dataloader-no-pin-memory: a CUDA training DataLoader that returns pageable host memory."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import all_of, CUDA_TEXT, literal, pipeline_facts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod
from tcaudit.rewrite.edits import loader_keyword_fix


class DataLoaderNoPinMemory(ScriptRule):
    id = "TC402"
    triggers = (all_of(r"DataLoader", CUDA_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.uses_cuda:
            return
        for site in pipeline.training_loaders:
            if site.has("pin_memory"):
                if not all(literal(v) is False for v in site.values("pin_memory")):
                    continue  # pinned on some path, or a flag the user controls
            elif not site.complete:
                continue
            if pipeline.dataset_kind(site) == "device":
                continue  # CUDA tensors cannot be pinned
            in_dict = site.in_dict("pin_memory")
            if in_dict is not None:
                fix = Fix(
                    FixClass.NUMERICS, "set pin_memory=True", available=False,
                    reason=f"pin_memory comes from the `{in_dict.source}` dict passed as **{in_dict.source}; a second "
                           "pin_memory= beside it would raise TypeError (edit the dict instead)",
                    anchor={"kind": "edit-dict", "dict": in_dict.source, "key": "pin_memory", "value": "True",
                            "line": facts.position(in_dict.node).start.line},
                )
            else:
                kind = "replace-arg" if site.has("pin_memory") else "add-kwarg"
                fix = Fix(FixClass.NUMERICS, "set pin_memory=True",
                          anchor={"kind": kind, "key": "pin_memory", "value": "True"})
            yield self.finding(
                facts,
                site.call.node,
                "this DataLoader feeds CUDA training from pageable memory: every host-to-device copy "
                "is staged through a bounce buffer and cannot overlap compute; pass `pin_memory=True` "
                "(and copy with `non_blocking=True`)",
                fix=fix,
            )


# -- the fix ------------------------------------------------------------------------------------

class DataLoaderNoPinMemoryFix(Codemod):
    rule = "TC402"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return loader_keyword_fix(module, context.facts, findings)
