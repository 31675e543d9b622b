"""The structural conversions: fixes that change how a script is launched or what it depends on.

``tcaudit fix`` makes one only when asked for it by name, on the command line (``--ddp``) or in the
config (``structural-fixes = ["ddp"]``). Each conversion is one object: the rules whose findings
offer it, the companion rules whose fixes complete it in the next fix round (whatever ``--classes``
says), its flag, config value and help. Config, CLI, the fix engine, findings and verify all read
them from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conversion:
    name: str  # the config value and the flag without its dashes; ``Fix.option`` of its findings
    rules: tuple[str, ...]  # rules whose findings carry this conversion as their structural fix
    help: str
    # Rules whose fixes the conversion relies on to finish the job: the fix engine applies them in
    # the rounds after the conversion, whatever fix classes were asked for.
    companions: tuple[str, ...] = ()
    # What a file without any of ``rules``' findings lacks, for the line ``fix`` prints about it.
    nothing: str = "nothing here to convert"

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def covers(self, rule: str) -> bool:
        """Whether ``rule``'s fix belongs to this conversion (as its own rule or a companion)."""
        return rule in self.rules or rule in self.companions


DDP = Conversion(
    name="ddp",
    rules=("TC505", "TC501"),
    companions=("TC502", "TC503", "TC504", "TC507"),
    help="make a single-process script torchrun-ready: process group, DistributedSampler, DDP, rank-0 "
    "logging and checkpoints (TC505, TC501)",
    nothing="no single-process CUDA training loop found here (TC505 and TC501 report none)",
)
DALI = Conversion(
    name="dali",
    rules=("TC405",),
    help="replace an ImageFolder/PIL training pipeline by a DALI pipeline, with a GPU-decode fallback when "
    "DALI is not installed (TC405)",
    nothing="no image pipeline decoding on the CPU for CUDA training found here (TC405 reports none)",
)
COMPILE = Conversion(
    name="compile",
    rules=("TC305",),
    help="compile the trained model in place with torch.compile (TC305)",
    nothing="no trained model left uncompiled found here (TC305 reports none)",
)

FP8 = Conversion(
    name="fp8",
    rules=("TC108",),
    help="train the large linear layers the model audit picks in FP8 with torchao's float8 training, on GPUs "
    "with FP8 (sm_89 and newer; TC108)",
    nothing="no trained model with linear layers large enough for FP8 found here (TC108 reports none)",
)

CONVERSIONS: tuple[Conversion, ...] = (DDP, DALI, COMPILE, FP8)
NAMES: tuple[str, ...] = tuple(c.name for c in CONVERSIONS)


def conversion(name: str) -> Conversion:
    for item in CONVERSIONS:
        if item.name == name:
            return item
    raise KeyError(f"unknown structural conversion {name!r} (expected {', '.join(NAMES)})")


def companion_enabled(rule: str, asked: "tuple[str, ...] | frozenset[str]") -> bool:
    """Whether ``rule`` is a companion of a conversion in ``asked``: its fix then runs regardless of
    the fix classes chosen (``asked`` may name other opt-ins too, such as ``pad-dims``)."""
    return any(rule in item.companions for item in CONVERSIONS if item.name in asked)
