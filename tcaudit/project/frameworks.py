"""Frameworks that own the training loop, and the settings they train with: a Lightning ``Trainer``, a
Hugging Face ``TrainingArguments`` (``Seq2SeqTrainingArguments``, TRL's ``SFTConfig``: the same
arguments) or one built by ``HfArgumentParser`` from the command line, an ``accelerate.Accelerator``,
and a ``LightningCLI`` whose trainer settings come from a config file and the command line.

Each :class:`LoopOwner` is the call that builds the framework's settings, in the module where it is
written; :meth:`LoopOwner.setting` reads one of the framework's own options there through the project
model (a literal, a name bound to one, a constant of another module, an argparse default): a
:class:`Setting` says what it holds, whether the framework's default applies, and whether the user
chooses it on the command line or in a config file (then a fix writes nothing into the script).

:func:`owners_reached` finds the settings a script trains with when they are built in another module
of the project (``Trainer(args=make_args())`` with ``make_args`` in ``config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import libcst as cst

from tcaudit.project.imports import read_small
from tcaudit.project.symbols import Project
from tcaudit.project.values import Value, Values, class_default
from tcaudit.script.expressions import literal
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.inert import note_read
from tcaudit.source.syntax import full_name, keyword

Framework = Literal["lightning", "transformers", "accelerate"]

# The calls that build a framework's training settings, by the qualified name's last part and root.
_LIGHTNING_ROOTS = ("lightning", "pytorch_lightning")
_HF_ARGUMENTS = {
    "transformers": ("TrainingArguments", "Seq2SeqTrainingArguments"),
    "trl": ("SFTConfig",),
}
_HF_TRAINERS = {"transformers": ("Trainer", "Seq2SeqTrainer"), "trl": ("SFTTrainer",)}
# What each framework trains in when the option is not written (lightning 2.6, transformers 5, accelerate 1).
DEFAULTS: dict[str, dict[str, object]] = {
    "lightning": {"precision": "32-true", "accelerator": "auto", "devices": "auto", "log_every_n_steps": 50,
                  "logger": None},
    "transformers": {"bf16": False, "fp16": False, "use_cpu": False, "no_cuda": False, "dataloader_num_workers": 0,
                     "optim": "adamw_torch_fused", "torch_compile": False, "tf32": None,
                     "train_sampling_strategy": "random", "group_by_length": False},
    "accelerate": {"mixed_precision": None, "cpu": False},
}
# The text a file must hold for :func:`loop_owners` to find anything (a rule's trigger).
# ``\bTrainer``: each word's left edge checked after its letters (``Trainer(?<!\wTrainer)``), so the search
# goes by first letters (four times faster over a whole file).
OWNER_NAMED = (r"Trainer(?<!\wTrainer)\b|TrainingArguments|SFTConfig|HfArgumentParser|Accelerator(?<!\wAccelerator)\b"
               r"|LightningCLI")
Source = Literal["written", "default", "command line", "config"]
# Lightning's ``precision`` values that train in fp32 (None: not written).
LIGHTNING_FP32 = (None, 32, "32", "32-true")


@dataclass(frozen=True)
class Setting:
    """One framework option at its owner: ``arg`` the argument written for it (None: not written);
    ``values`` what it may hold (None: unknown, e.g. a value computed at run time); ``source``: written in
    the script, the framework's default, or chosen on the command line / in a config file (``flag``
    names how the user sets it there)."""

    key: str
    arg: cst.Arg | None
    values: list[Value] | None
    source: Source
    flag: str = ""

    @property
    def how(self) -> str:
        """The finding's words for where the value comes from."""
        held = [v for v in self.values or []]
        if self.source == "default":
            return f"`{self.key}` is not set (default {held[0].value!r})" if held else f"`{self.key}` is not set"
        said = next((v.how for v in held if v.how), "")
        if said:
            return said  # where it is set goes into the finding's related place or its fix's reason
        return f"`{self.key}={held[0].value!r}`" if held else f"`{self.key}`"


@dataclass(frozen=True, eq=False)
class LoopOwner:
    """The call that sets how a framework trains (``Trainer(...)``, ``TrainingArguments(...)``,
    ``Accelerator(...)``, ``HfArgumentParser(...)``, ``LightningCLI(...)``), in ``facts``' module."""

    framework: Framework
    label: str  # what the user wrote: "Trainer", "TrainingArguments", "SFTConfig", "Accelerator"...
    facts: ScriptFacts
    call: CallSite
    # "HfArgumentParser" / "LightningCLI": the settings are the command line's (and a config file's).
    parsed_by: str | None = None
    # HfArgumentParser: the dataclass that holds the training arguments (a project subclass or the library's).
    arguments_class: cst.ClassDef | None = None
    arguments_facts: ScriptFacts | None = None

    @property
    def node(self) -> cst.Call:
        return self.call.node

    @property
    def where(self) -> str:
        """The module and line where the settings are built: ``settings.py:9``."""
        return f"{self.facts.source.display_path}:{self.facts.line_of(self.node)}"

    def setting(self, values: Values, key: str) -> Setting:
        """The option ``key`` of this owner, as the framework will see it when the script runs."""
        default = DEFAULTS[self.framework].get(key)
        if self.parsed_by == "HfArgumentParser":
            return self._parsed_setting(values, key, default)
        if self.parsed_by == "LightningCLI":
            return self._cli_setting(values, key, default)
        arg = keyword(self.node, key)
        if arg is None:
            if self.call.has_star_kwargs:
                return Setting(key, None, None, "written")  # ``**kwargs`` may hold it
            if self.framework == "accelerate" and key == "mixed_precision":
                # Accelerator() reads ACCELERATE_MIXED_PRECISION, which `accelerate launch` sets from its
                # config file or --mixed_precision; "no" when neither says.
                return Setting(key, None, [Value("no")], "config", "--mixed_precision")
            return Setting(key, None, [Value(default)], "default")
        found = values.of(self.facts, arg.value, self.call.ctx.function)
        if found is not None and any(v.on_command_line for v in found):
            flag = next((v.how.split("`")[1] for v in found if v.on_command_line and v.how.count("`") >= 2), "")
            return Setting(key, arg, found, "command line", flag)
        return Setting(key, arg, found, "written")

    def _parsed_setting(self, values: Values, key: str, default: object) -> Setting:
        """``HfArgumentParser((ModelArguments, TrainingArguments))``: the command line sets each field;
        a project subclass may give it another default; an assignment after parsing
        (``training_args.bf16 = True``) or a JSON/YAML file read instead of the command line decides it
        where tcaudit does not follow."""
        flag = f"--{key}"
        if self._assigned_after_parsing(key) or self._reads_a_file():
            return Setting(key, None, None, "command line", flag)
        if self.arguments_class is not None and self.arguments_facts is not None:
            written = class_default(self.arguments_class, key)
            if written is not None:
                found = values.of(self.arguments_facts, written, None)
                return Setting(key, None, found, "command line", flag)
        return Setting(key, None, [Value(default, f"`{flag}` is not passed (default {default!r})")], "command line", flag)

    def _assigned_after_parsing(self, key: str) -> bool:
        return any(binding.target.endswith(f".{key}") for binding in _attribute_writes(self.facts))

    def _reads_a_file(self) -> bool:
        return any(call.method in ("parse_json_file", "parse_yaml_file", "parse_dict") for call in self.facts.calls)

    def _cli_setting(self, values: Values, key: str, default: object) -> Setting:
        """``LightningCLI(..., trainer_defaults={"precision": ...})``: the defaults the script writes, a
        config YAML beside it, or the command line (``--trainer.precision``)."""
        flag = f"--trainer.{key}"
        defaults = keyword(self.node, "trainer_defaults")
        if defaults is not None:
            if not isinstance(defaults.value, cst.Dict):
                return Setting(key, None, None, "config", flag)
            for element in defaults.value.elements:
                if isinstance(element, cst.DictElement) and literal(element.key) == key:
                    found = values.of(self.facts, element.value, self.call.ctx.function)
                    return Setting(key, None, found, "config", flag)
                if not isinstance(element, cst.DictElement):
                    return Setting(key, None, None, "config", flag)
        configured = _yaml_setting(self.facts.source.path.parent, key)
        if configured is not None:
            path, line, value = configured
            return Setting(key, None, [Value(value, f"`trainer.{key}: {value}` in {path.name}", (path.name, line))],
                           "config", flag)
        return Setting(key, None, [Value(default, f"`trainer.{key}` is set nowhere (default {default!r})")],
                       "config", flag)

    def trains_in_fp32(self, values: Values) -> bool:
        """Whether every value the owner's precision options may hold is fp32: Lightning's ``precision`` at 32,
        neither ``bf16`` nor ``fp16`` for Hugging Face, accelerate's ``mixed_precision`` "no" or left to the
        launch. False where a value cannot be read."""
        if self.framework == "lightning":
            held = self.setting(values, "precision").values
            return bool(held) and all(v.value in LIGHTNING_FP32 for v in held)
        if self.framework == "transformers":
            for key in ("bf16", "fp16"):
                held = self.setting(values, key).values
                if not held or any(v.value is not False for v in held):
                    return False
            return True
        held = self.setting(values, "mixed_precision").values
        return bool(held) and all(v.value in ("no", None) for v in held)

    def cpu_only(self, values: Values) -> bool:
        """Whether the owner visibly trains on the CPU (``accelerator="cpu"``, ``use_cpu=True``,
        ``Accelerator(cpu=True)``): then GPU advice does not apply."""
        if self.parsed_by is not None:
            return False
        if self.framework == "lightning":
            held = self.setting(values, "accelerator").values
            return bool(held) and all(v.value == "cpu" for v in held)
        keys = ("use_cpu", "no_cuda") if self.framework == "transformers" else ("cpu",)
        for key in keys:
            held = self.setting(values, key).values
            if held and all(v.value is True for v in held):
                return True
        return False


def loop_owners(facts: ScriptFacts) -> list[LoopOwner]:
    """The framework settings built in this module, in source order."""
    out: list[LoopOwner] = []
    for call in facts.calls:
        qual = call.qualname or ""
        root, last = qual.partition(".")[0], qual.rpartition(".")[2]
        if root in _LIGHTNING_ROOTS and last == "Trainer":
            out.append(LoopOwner("lightning", "Trainer", facts, call))
        elif root in _LIGHTNING_ROOTS and last == "LightningCLI":
            out.append(LoopOwner("lightning", "LightningCLI", facts, call, parsed_by="LightningCLI"))
        elif last in _HF_ARGUMENTS.get(root, ()):
            out.append(LoopOwner("transformers", last, facts, call))
        elif root == "transformers" and last == "HfArgumentParser":
            parsed = _parsed_arguments(facts, call)
            if parsed is not None:
                cls, cls_facts = parsed
                out.append(LoopOwner("transformers", "HfArgumentParser", facts, call, parsed_by="HfArgumentParser",
                                     arguments_class=cls, arguments_facts=cls_facts))
        elif root == "accelerate" and last == "Accelerator":
            out.append(LoopOwner("accelerate", "Accelerator", facts, call))
    return out


def lightning_training_steps(facts: ScriptFacts) -> list[cst.FunctionDef]:
    """The ``training_step`` methods of this module's LightningModule subclasses (Lightning calls each once
    per batch)."""
    return lightning_hooks(facts, "training_step")


def lightning_hooks(facts: ScriptFacts, name: str) -> list[cst.FunctionDef]:
    """The methods called ``name`` of this module's LightningModule subclasses (the hooks Lightning calls:
    ``training_step``, ``configure_optimizers``, ``train_dataloader``)."""
    out = []
    for cls in facts.classes_by_name.values():
        if not any(_is_lightning_module(facts, base.value) for base in cls.bases):
            continue
        if isinstance(cls.body, cst.IndentedBlock):
            out += [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    return out


def lightning_module_class(facts: ScriptFacts, value: cst.BaseExpression) -> cst.ClassDef | None:
    """The LightningModule subclass of this module that ``value`` builds (``Regressor(width=64)``), if it is one."""
    if not isinstance(value, cst.Call):
        return None
    cls = facts.classes_by_name.get((full_name(value.func) or "").rpartition(".")[2])
    if cls is None or not _derives_lightning_module(facts, cls, 0):
        return None
    return cls


def lightning_forward(facts: ScriptFacts, cls: cst.ClassDef, depth: int = 0) -> bool:
    """Whether ``cls`` (or a class of this module it derives from) defines ``forward``: what ``torch.compile``
    of a LightningModule compiles (``training_step`` calling ``self(x)`` runs it; one calling ``self.net(x)``
    does not)."""
    if depth > 4 or not isinstance(cls.body, cst.IndentedBlock):
        return False
    if any(isinstance(item, cst.FunctionDef) and item.name.value == "forward" for item in cls.body.body):
        return True
    for base in cls.bases:
        parent = facts.classes_by_name.get((full_name(base.value) or "").rpartition(".")[2])
        if parent is not None and parent is not cls and lightning_forward(facts, parent, depth + 1):
            return True
    return False


def _derives_lightning_module(facts: ScriptFacts, cls: cst.ClassDef, depth: int) -> bool:
    for base in cls.bases:
        if _is_lightning_module(facts, base.value):
            return True
        parent = facts.classes_by_name.get((full_name(base.value) or "").rpartition(".")[2])
        if depth < 4 and parent is not None and parent is not cls:
            if _derives_lightning_module(facts, parent, depth + 1):
                return True
    return False


def _is_lightning_module(facts: ScriptFacts, base: cst.BaseExpression) -> bool:
    qual = facts.qualname(base) or ""
    return qual.partition(".")[0] in _LIGHTNING_ROOTS and qual.rpartition(".")[2] == "LightningModule"


def hf_trainer_calls(facts: ScriptFacts) -> list[CallSite]:
    """``Trainer(...)`` / ``Seq2SeqTrainer(...)`` / ``SFTTrainer(...)`` calls of transformers or TRL."""
    out = []
    for call in facts.calls:
        qual = call.qualname or ""
        if qual.rpartition(".")[2] in _HF_TRAINERS.get(qual.partition(".")[0], ()):
            out.append(call)
    return out


def owners_reached(facts: ScriptFacts, project: Project) -> list[tuple[CallSite, LoopOwner]]:
    """Training arguments a Hugging Face trainer of this module gets from a function of another project
    module (``Trainer(args=make_args(...))``, ``args = config.training_args()``): (the trainer call, the
    owner in that module)."""
    out: list[tuple[CallSite, LoopOwner]] = []
    for trainer in hf_trainer_calls(facts):
        given = trainer.arg("args", 1)
        if given is None:
            continue
        candidates = [given] if isinstance(given, cst.Call) else [
            v for v in facts.binding_values(given) if isinstance(v, cst.Call)]
        for value in candidates:
            symbol = project.symbol(facts, full_name(value.func))
            if symbol is None or symbol.kind != "function" or symbol.facts is facts:
                continue
            for owner in loop_owners(symbol.facts):
                if owner.framework == "transformers" and owner.call.ctx.function is symbol.function:
                    out.append((trainer, owner))
    return out


def _parsed_arguments(facts: ScriptFacts, call: CallSite) -> tuple[cst.ClassDef | None, ScriptFacts | None] | None:
    """The training-arguments dataclass ``HfArgumentParser`` parses: the library's class (None, None) or a
    subclass this module defines (with its facts); None when the parser gets no training arguments."""
    given = call.arg("dataclass_types", 0)
    if given is None:
        return None
    items = given.elements if isinstance(given, (cst.Tuple, cst.List)) else [cst.Element(given)]
    for item in items:
        qual = facts.qualname(item.value) or ""
        if qual.rpartition(".")[2] in _HF_ARGUMENTS.get(qual.partition(".")[0], ()):
            return None, None
        name = full_name(item.value) or ""
        cls = facts.classes_by_name.get(name)
        if cls is not None and _subclasses_training_arguments(facts, cls):
            return cls, facts
    return None


def _subclasses_training_arguments(facts: ScriptFacts, cls: cst.ClassDef) -> bool:
    for base in cls.bases:
        qual = facts.qualname(base.value) or ""
        if qual.rpartition(".")[2] in _HF_ARGUMENTS.get(qual.partition(".")[0], ()):
            return True
    return False


def _attribute_writes(facts: ScriptFacts):
    """Bindings of attributes (``training_args.bf16 = True``)."""
    return [binding for binding in facts.bindings if "." in binding.target]


def _yaml_setting(folder: Path, key: str) -> tuple[Path, int, str] | None:
    """``precision: bf16-mixed`` under ``trainer:`` in a YAML file of the script's folder (a LightningCLI
    config): (the file, the line, the value)."""
    note_read(folder)
    try:
        children = sorted(folder.iterdir())[:200]
    except OSError:
        return None
    for child in children:
        if child.suffix not in (".yaml", ".yml"):
            continue
        raw = read_small(child, 200_000)
        if raw is None:
            continue
        in_trainer = False
        for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            stripped = line.strip()
            if not line.startswith((" ", "\t")) and stripped:
                in_trainer = stripped.startswith("trainer:")
                continue
            if in_trainer and stripped.startswith(f"{key}:"):
                return child, number, stripped.partition(":")[2].strip().strip("'\"")
    return None
