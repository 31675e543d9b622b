"""Why advice cannot pay in a file, for the rules of several families to quote: a model the audit
measured as launch-bound, or a reinforcement-learning loop whose models it did not measure; and why a
framework option cannot be set from the file that reports it (the arguments are built elsewhere)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, NoReturn

from tcaudit.findings import LITTLE_TO_GAIN, DeclineFix

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.findings import Fix
    from tcaudit.rules.base import RuleContext
    from tcaudit.script.facts import ScriptFacts

LAUNCH_BOUND = " (a launch-bound model: little to gain)"
LAUNCH_BOUND_WHY = (
    " The model audit found the trained model's GEMMs and convolutions, on average, within the time an "
    "eager step takes to launch one at this batch: on an H200 such models (an MNIST Net at batch 64, "
    "LeNet, a DQN, a PPO agent) ran 0.69-0.91x under bf16 autocast, 0.66-0.84x with channels_last and "
    "0.90-1.13x with TF32 (benchmarks/results/h200/launch_bound*.json): expect no gain until the model "
    "or the batch grows (the same Net at batch 1024 gained 1.40x)."
)


RL_LOOP = " (an RL loop: little to gain)"
RL_LOOP_WHY = (
    " The model was not measured (the audit did not build it), and the loop steps an environment on the "
    "host between updates: the policies of such scripts are small MLPs or Atari-sized convnets, launch-bound "
    "(on an H200 a 4-128-128-2 DQN and a PPO agent at batch 128 ran 0.72-0.85x under bf16 autocast and "
    "0.90-1.09x with TF32: benchmarks/results/h200/launch_bound*.json)."
)


class Discount(NamedTuple):
    """Why advice cannot pay: the message's and the explanation's suffixes, and the reason's key."""

    message: str
    explanation: str
    reason: str

    @property
    def details(self) -> dict[str, str]:
        """For the finding's ``details``: what the report reads to leave the rule's figure out."""
        return {LITTLE_TO_GAIN: self.reason}


def launch_bound(facts: "ScriptFacts", context: "RuleContext") -> bool:
    """Every trained model of the file is one the model audit measured as launch-bound at its batch."""
    from tcaudit.script.pipeline import pipeline_facts

    return pipeline_facts(facts).audited_launch_bound(context.models)


def little_to_gain(facts: "ScriptFacts", context: "RuleContext") -> Discount | None:
    """Why precision, TF32 or memory-format advice cannot pay in this file, as the (message, explanation)
    suffixes of an info finding: a model the audit measured as launch-bound, or a reinforcement-learning
    loop whose models the audit did not measure. None: the advice stands."""
    from tcaudit.script.distributed import distributed_facts
    from tcaudit.script.pipeline import pipeline_facts

    if launch_bound(facts, context):
        return Discount(LAUNCH_BOUND, LAUNCH_BOUND_WHY, "launch-bound")
    pipeline = pipeline_facts(facts)
    if distributed_facts(facts).steps_an_environment and not any(
        pipeline.profile_of(site, context.models) is not None for site in pipeline.trained_models
    ):
        return Discount(RL_LOOP, RL_LOOP_WHY, "rl-loop")
    return None


# Why a discounted finding's fix is left out unless its rule is named, by ``Discount.reason``.
HELD_BACK = {
    "launch-bound": "the model audit measured the trained model as launch-bound at this batch",
    "rl-loop": "an RL loop steps its small policy between environment steps",
}


def held_back(fix: "Fix | None", discount: Discount | None, rule: str, settings: "Settings") -> "Fix | None":
    """``fix``, declined where the advice cannot pay (``discount``) unless the selection names ``rule`` by its
    id: a numerics change with nothing measured to gain is risk without reward, so the default ``fix``
    leaves it out and says how to ask for it (``--select TC201``). Scan says the same, and the rules that
    follow it (``context.fixable``) see it declined too."""
    if fix is None or discount is None or not fix.available or settings.names_rule(rule):
        return fix
    why = HELD_BACK.get(discount.reason, f"its advice cannot pay here ({discount.reason})")
    return fix.declined(f"not applied by default: {why}, so it has little to gain; `--select {rule}` applies it")


def set_where_built(where: str, option: str) -> NoReturn:
    """Decline a framework option's fix reported at a trainer whose arguments another module builds
    (``where``: that module's path and line): the edit belongs there."""
    path = where.rpartition(":")[0]
    raise DeclineFix(f"the training arguments are built in {where}, another module: set `{option}` there "
                     f"(`tcaudit fix {path}` makes it)")
