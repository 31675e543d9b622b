"""Facts the backend (TC3) and input-pipeline (TC4) rules share, built from ScriptFacts, in layers
that each build on the one before:

* :mod:`tcaudit.script.training_code`: is this CUDA training the user owns, which code reaches a
  training step, which settings sit behind a flag;
* :mod:`tcaudit.script.trained_models`: the trained models and which of them are convnets;
* :mod:`tcaudit.script.loader_construction`: the DataLoaders, their keywords and datasets;
* :mod:`tcaudit.script.batch_loops`: the loops that receive their batches, and the copies to the device.

:class:`PipelineFacts` is all of them at once, computed once per file and cached beside the facts (a
weak reference, so a corpus scan does not keep every file alive). This module also holds the plan
for inserting a global setting after the imports (TC301, TC302).
"""

from __future__ import annotations


import libcst as cst

from tcaudit.script.batch_loops import BatchLoopFacts
from tcaudit.script.facts import ScriptFacts


class PipelineFacts(BatchLoopFacts):
    """A file's training code, trained models, DataLoaders and batch loops (the layers above)."""


def pipeline_facts(facts: ScriptFacts) -> PipelineFacts:
    return facts.derived(PipelineFacts, PipelineFacts)


def import_block_end(facts: ScriptFacts) -> cst.CSTNode | None:
    """The last statement of the file's leading import block (docstring, ``__future__``, imports and
    ``try: import`` shims): where a global backend setting is inserted."""
    last: cst.CSTNode | None = None
    for index, statement in enumerate(facts.module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            smalls = statement.body
            if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in smalls):
                last = statement
                continue
            if index == 0 and len(smalls) == 1 and isinstance(smalls[0], cst.Expr) and isinstance(smalls[0].value, cst.SimpleString):
                continue  # the module docstring
        if isinstance(statement, cst.Try) and all(
            isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
            for s in statement.body.body
        ):
            last = statement
            continue
        break
    return last


