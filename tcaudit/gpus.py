"""The target GPU: which ones ``--gpu`` names, what each supports, NVIDIA's published figures for it
(tcaudit/data/gpus.toml), and ``--gpu auto``'s detection of the GPU in this machine.

A ``gpu`` setting is ``auto``, an architecture (``sm_86``: the GPU gpus.toml's ``[arch]`` picks for
it, the RTX 3090) or a GPU's key (``a10``, ``h100``). Detection never imports torch: it asks
``nvidia-smi``, then torch only when this process has imported it already.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

AUTO = "auto"
DATA = Path(__file__).resolve().parent / "data" / "gpus.toml"
# Seconds nvidia-smi may take before ``--gpu auto`` gives up on it (a hung driver must not hang a scan).
NVIDIA_SMI_TIMEOUT = 5.0


@dataclass(frozen=True)
class Gpu:
    """One GPU: its name, its architecture and the published peak TFLOPS (None: no such path)."""

    key: str
    name: str
    sm: str
    fp32: float | None = None
    tf32: float | None = None
    half: float | None = None  # FP16/BF16 Tensor Core, FP32 accumulate, dense
    fp8: float | None = None  # FP8 Tensor Core, dense (sm_89 and newer, where the datasheet gives it)
    source: str = ""  # the document the figures are from
    detail: str = ""  # what it says
    fp8_detail: str = ""  # what it says of FP8

    def peak(self, precision: str) -> float | None:
        """The published dense peak TFLOPS for a run whose GEMMs use ``precision`` (``fp8``, ``bf16``,
        ``fp16``, ``tf32``, ``fp32``), or None where gpus.toml keeps no figure for that path."""
        if precision == "fp8":
            return self.fp8
        if precision in ("bf16", "fp16"):
            return self.half if precision == "fp16" or self.has_bf16 else None
        if precision == "tf32":
            return self.tf32 if self.has_tf32 else self.fp32
        return self.fp32 if precision == "fp32" else None

    @property
    def arch(self) -> int:
        return arch_number(self.sm)

    @property
    def has_bf16(self) -> bool:
        """bf16 Tensor Cores (and TF32): Ampere, sm_80, and newer."""
        return self.arch >= 80

    @property
    def has_tf32(self) -> bool:
        return self.arch >= 80

    @property
    def has_fp8(self) -> bool:
        """FP8 Tensor Cores: Ada and Hopper, sm_89, and newer."""
        return self.arch >= 89

    @property
    def label(self) -> str:
        return f"{self.name} ({self.sm})"


def arch_number(sm: str) -> int:
    """``sm_86`` -> 86."""
    return int(sm.removeprefix("sm_"))


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    return tomllib.loads(DATA.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def gpus() -> dict[str, Gpu]:
    """Every GPU of gpus.toml by key."""
    out = {}
    for key, entry in _data()["gpu"].items():
        fields = {k: entry[k] for k in ("fp32", "tf32", "half", "fp8") if k in entry}
        out[key] = Gpu(key, entry["name"], entry["sm"], source=entry.get("source", ""), detail=entry.get("detail", ""),
                       fp8_detail=entry.get("fp8_detail", ""), **fields)
    return out


def archs() -> dict[str, str]:
    """Architecture -> the key of the GPU that stands for it (``sm_86`` -> ``rtx3090``)."""
    return dict(_data()["arch"])


def choices() -> tuple[str, ...]:
    """What a ``gpu`` setting may be: auto, each architecture, each GPU's key."""
    return (AUTO, *archs(), *gpus())


def _compact(name: str) -> str:
    """``"NVIDIA GeForce RTX-3090"`` -> ``"nvidiageforcertx3090"``: a name without case, spaces or marks."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def canonical(value: str) -> str | None:
    """The ``gpu`` setting ``value`` means, or None: ``auto``, an architecture or a GPU's key as written
    (any case), else a GPU as people name it: ``3090``, ``RTX 3090``, ``rtx-3090``, ``NVIDIA H100``,
    ``GeForce RTX 4090`` (its key or its name with ``nvidia``, ``geforce`` and ``rtx`` optional)."""
    setting = value.strip().lower()
    if setting in choices():
        return setting
    compact = _compact(setting)
    for prefix in ("nvidia", "geforce", "tesla", "rtx"):
        compact = compact.removeprefix(prefix)
    if not compact:
        return None
    for key, gpu in gpus().items():
        names = {_compact(key), _compact(gpu.name)}
        names |= {name.removeprefix("rtx") for name in names}
        if compact in names:
            return key
    return None


def resolve(setting: str) -> Gpu | None:
    """The GPU a ``gpu`` setting stands for; None for ``auto`` (no GPU known) and unknown values.
    An architecture gpus.toml does not list (a detected ``sm_87``) gets a GPU with no figures."""
    setting = setting.strip().lower()
    table = gpus()
    if setting in table:
        return table[setting]
    key = archs().get(setting)
    if key is not None:
        return table[key]
    if setting.startswith("sm_") and setting[3:].isdigit():
        return Gpu(setting, setting, setting)
    return None


@dataclass(frozen=True)
class Target:
    """A ``gpu`` setting resolved once (:func:`target`): the GPU it stands for, or None for ``auto`` when
    no GPU was detected (then today's GPUs are assumed: bf16 and TF32, no FP8 claim), and what it has."""

    setting: str
    gpu: Gpu | None

    @property
    def arch(self) -> str:
        """The ``sm_NN`` of the target (``a10`` -> ``sm_86``); ``auto`` stays ``auto``."""
        return self.gpu.sm if self.gpu is not None else self.setting

    @property
    def has_bf16(self) -> bool:
        """Whether the target has bf16 Tensor Cores; True for ``auto`` (no GPU known: today's GPUs do)."""
        return self.gpu is None or self.gpu.has_bf16

    @property
    def has_tf32(self) -> bool:
        return self.gpu is None or self.gpu.has_tf32


@functools.lru_cache(maxsize=None)
def target(setting: str) -> Target:
    """The :class:`Target` a ``gpu`` setting stands for, resolved once per setting in a process."""
    return Target(setting, resolve(setting))


# -- detection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detected:
    """What ``--gpu auto`` found: the device's own name, its architecture, the setting it maps to
    (a GPU key of gpus.toml when the name matches one, else the architecture) and how it was found."""

    name: str
    sm: str
    setting: str
    via: str  # "nvidia-smi" or "torch"

    def describe(self) -> str:
        return f"{self.name} ({self.sm}, from {self.via})"

    def to_dict(self) -> dict:
        return {"name": self.name, "sm": self.sm, "setting": self.setting, "detected_by": self.via}


# Words of a device name that say nothing about which GPU it is; and words that make it another one.
_VENDOR_WORDS = {"NVIDIA", "GEFORCE", "TESLA"}
_VARIANT_WORDS = {"TI", "SUPER", "S", "D", "M", "MAX-Q", "LAPTOP", "MOBILE"}


def _words(name: str) -> list[str]:
    return [w for w in name.upper().replace("-", " ").replace("_", " ").split() if w not in _VENDOR_WORDS]


def _setting_for(name: str, sm: str) -> str:
    """The gpus.toml key of the device's name (``NVIDIA A100-SXM4-80GB`` -> ``a100``; ``NVIDIA A10`` ->
    ``a10``; not ``l4`` for an ``L40S`` nor ``rtx3090`` for an ``RTX 3090 Ti``), else the architecture."""
    device = _words(name)
    for key, gpu in gpus().items():
        wanted = _words(gpu.name)
        if gpu.sm != sm or device[: len(wanted)] != wanted:
            continue
        rest = device[len(wanted):]
        if rest and rest[0] in _VARIANT_WORDS:
            continue
        return key
    return sm


def device_gpu(name: str, sm: str) -> Gpu | None:
    """The gpus.toml entry of a device as torch or nvidia-smi names it (``NVIDIA H100 80GB HBM3``,
    ``sm_90``), or None where gpus.toml has no entry for that exact GPU (its architecture alone does not
    say which peak it has)."""
    return gpus().get(_setting_for(name, sm))


def _from_nvidia_smi() -> Detected | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    for line in done.stdout.splitlines():  # one line per GPU: the first one is the target
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if name.strip() and major.isdigit() and minor.isdigit():
            sm = f"sm_{int(major)}{int(minor)}"
            return Detected(name.strip(), sm, _setting_for(name.strip(), sm), "nvidia-smi")
    return None


def _from_loaded_torch() -> Detected | None:
    torch = sys.modules.get("torch")  # only a torch this process imported already: importing it costs seconds
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        name = str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken CUDA set-up means "unknown", not a failed scan
        return None
    sm = f"sm_{major}{minor}"
    return Detected(name, sm, _setting_for(name, sm), "torch")


def detect() -> Detected | None:
    """The GPU of this machine, or None ("unknown"). Asks anew each time: :func:`detected` is the cached
    answer the scan, the API and the editor use."""
    return _from_nvidia_smi() or _from_loaded_torch()


def detected() -> Detected | None:
    """:func:`detect`, asked once per process for each ``PATH`` (which nvidia-smi runs) and each state of
    torch (imported or not): an editor's settings are made anew per folder, a keystroke must not start
    nvidia-smi."""
    key = (os.environ.get("PATH", ""), "torch" in sys.modules)
    if key not in _DETECTED:
        _DETECTED[key] = detect()
    return _DETECTED[key]


_DETECTED: dict[tuple[str, bool], Detected | None] = {}
