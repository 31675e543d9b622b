"""The text a file must contain for a fact about it to hold: what rule triggers are built from.

A rule's trigger is a regular expression checked on the raw text before anything is parsed; a file
no enabled trigger matches is never parsed. So a trigger must be a *necessary* condition of the
rule firing: each pattern here names the fact of :class:`tcaudit.script.facts.ScriptFacts` (or of
the facts built on it) it is necessary for, and a rule combines the facts its check requires with
:func:`tcaudit.source.triggers.all_of`. A pattern may match more than the fact needs (comments, strings); it must never
miss a file where the fact holds.

This module imports nothing of the package, so the facts modules can share its patterns.
"""

from __future__ import annotations

# ``ScriptFacts.uses_accelerator`` searches (comments stripped) exactly this.
ACCELERATOR_NAMED = r"\bcuda\b|torch\.accelerator|\bmps\b|\bxpu\b|FloatTensor|HalfTensor"
# The first half of ``ScriptFacts.uses_cuda``: CUDA named in the code.
CUDA_NAMED = r"\bcuda\b|torch\.accelerator\b|[\"']gpu[\"']"
# Necessary for ``ScriptFacts.uses_cuda``: CUDA named, or a device that is an integer, a parameter or
# a setting (``device = 0``, ``.to(gpu_id)``, ``.to(args.local_rank)``).
CUDA_EVIDENCE = CUDA_NAMED + r"|device|gpu|rank|\.to\(\s*\d"
# Necessary for ``uses_accelerator or uses_cuda`` (advice that any device gains from).
ACCELERATOR_OR_CUDA = r"mps\b|\bxpu\b|FloatTensor|HalfTensor|" + CUDA_EVIDENCE

# Necessary for ``ScriptFacts.training_steps``: a ``.backward`` method call (``loss.backward()``,
# ``scaler.scale(loss).backward()``). ``def backward`` and ``grad_backward`` are not.
BACKWARD_CALL = r"\.\s*backward\b"
# Necessary for ``ScriptFacts.optimizer_steps``: a ``.step`` method call.
STEP_CALL = r"\.\s*step\b"
# Necessary for ``DistributedFacts.step_calls``: a training step or an optimizer step.
STEP_OR_BACKWARD_CALL = r"\.\s*(?:backward|step)\b"
# Necessary for ``ScriptFacts.frameworks``: an import of a framework that owns the loop, FSDP's
# ``MixedPrecision`` policy, or a transformers ``Trainer``.
FRAMEWORK_NAMED = r"lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"
# Necessary for ``PipelineFacts.trains``: a training step, an optimizer step, or a framework's loop.
TRAINS = STEP_OR_BACKWARD_CALL + "|" + FRAMEWORK_NAMED
