"""Which calls build an optimizer: torch.optim's and those of the packages real projects train with
(bitsandbytes' 8-bit Adam, apex's fused optimizers, timm's, DeepSpeed's...). What an optimizer receives
decides which models a script trains (:mod:`tcaudit.script.trained_models`) and which calls are its
steps (:attr:`tcaudit.script.facts.ScriptFacts.optimizers`)."""

from __future__ import annotations

import functools
import re

# Packages of optimizers that take parameters as torch.optim's do (``bnb.optim.AdamW8bit(model.parameters())``).
OPTIMIZER_PACKAGES = (
    "torch.optim.", "torch.distributed.optim.", "bitsandbytes.optim.", "apex.optimizers.", "timm.optim.",
    "torch_optimizer.", "transformers.optimization.", "deepspeed.ops.adam.", "deepspeed.ops.lamb.", "lion_pytorch.",
    "came_pytorch.", "schedulefree.", "heavyball.", "muon.",
)
# Optimizer classes exported at a package's top level (``transformers.AdamW``, ``lion_pytorch.Lion``).
_OPTIMIZER_CLASS = re.compile(r"\.(\w*(Optim\w*|Adam\w*|SGD\w*|Lion|Lamb|LAMB|Adafactor\w*|LARS|Muon|RMSprop|Adagrad|"
                              r"Adadelta|Adamax|NAdam|RAdam|Shampoo|Sophia\w*|Prodigy|DAdapt\w*))$")
# Factories that build the optimizer from the model itself, not its parameters.
MODEL_OPTIMIZER_FACTORIES = ("timm.optim.create_optimizer", "timm.optim.optim_factory.create_optimizer",
                             "timm.optim._optim_factory.create_optimizer")


@functools.lru_cache(maxsize=8192)
def is_optimizer(qualname: str) -> bool:
    """Whether a call of ``qualname`` builds an optimizer: torch.optim's, those of the optimizer packages
    real projects use (bitsandbytes, apex, timm, DeepSpeed...) and timm's factories, not a learning-rate
    scheduler or an averaged model. (Kept per name: the facts ask it of every call of a file.)"""
    if qualname.startswith(MODEL_OPTIMIZER_FACTORIES):
        return True
    if "lr_scheduler" in qualname or "swa_utils" in qualname or "scheduler" in qualname.lower():
        return False
    if qualname.startswith(OPTIMIZER_PACKAGES):
        return qualname.rsplit(".", 1)[-1][:1].isupper() or qualname.startswith("torch.optim.")
    return bool(_OPTIMIZER_CLASS.search(qualname)) and "." in qualname
