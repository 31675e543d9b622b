"""The oracle's cases: every fix fixture with a ``# run:`` line, the ResNet50 fixture and the generated
corpus, each as (original text, patched text, argv), patched by ``tcaudit.fix.engine.fix_file``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from helpers import audited_fixture_models
from oracle.corpus import build_corpus
from oracle.harness import REPO
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

FIX_FIXTURES = REPO / "fixtures" / "fix"
RESNET50 = REPO / "fixtures" / "resnet50" / "train.py"
# Tiny and calm: at batch 2 BatchNorm on the last stage's 1x1 maps turns rounding into chaos.
RESNET50_ARGV = ("--synthetic", "--steps", "3", "--batch-size", "4", "--image-size", "64", "--num-classes", "10", "--lr", "0.01")
STRUCTURAL_PREFIXES = {"DDP": ("TC5",), "DALI": ("TC405",), "COMPILE": ("TC305",)}


@dataclass(frozen=True)
class OracleCase:
    id: str
    path: Path | None  # the file patched (None: generated text)
    text: str
    argv: tuple[str, ...]
    settings: Settings


def settings_for_fixture(path: Path) -> Settings:
    """The settings tests/test_fix.py fixes the fixture with: the file-name prefix picks the rules."""
    prefix = path.name.split("_")[0].upper()
    if prefix == "PAD":  # ``pad_x.in.py``: the width padding of TC101/TC102, with ``--pad-dims``
        return Settings(select=("TC101", "TC102"), pad_dims=True)
    if prefix in STRUCTURAL_PREFIXES:
        return Settings(select=STRUCTURAL_PREFIXES[prefix], structural_fixes=(prefix.lower(),))
    return Settings(select=("ALL",) if prefix == "ALL" else (prefix,))


def run_argv(path: Path) -> tuple[str, ...] | None:
    match = re.search(r"#\s*run:\s*python\s+\{path\}(.*)", path.read_bytes().decode("utf-8", "replace"))
    return tuple(match.group(1).split()) if match else None


def fixture_cases() -> list[OracleCase]:
    cases = []
    for path in sorted(FIX_FIXTURES.glob("*.in.py")):
        argv = RESNET50_ARGV if path.name == "all_resnet50.in.py" else run_argv(path)
        if argv is not None:
            text = path.read_bytes().decode("utf-8-sig")
            cases.append(OracleCase(path.name.removesuffix(".in.py"), path, text, argv, settings_for_fixture(path)))
    cases.append(OracleCase("resnet50", RESNET50, RESNET50.read_text(), RESNET50_ARGV, Settings(select=("ALL",))))
    return cases


# The structural conversions too (F4, F5): every corpus script once more with ``--ddp --compile``.
STRUCTURAL = Settings(select=("ALL",), structural_fixes=("ddp", "compile"))
DDP_CONVERSIONS = ("TC501", "TC505")  # the rules whose fix turns a script into a DDP script


def corpus_cases() -> list[OracleCase]:
    plain = [OracleCase(s.name, None, s.text, s.argv, Settings(select=("ALL",))) for s in build_corpus()]
    structural = [OracleCase(f"{s.name}+ddp", None, s.text, s.argv, STRUCTURAL) for s in build_corpus()]
    return plain + structural


def all_cases() -> list[OracleCase]:
    return fixture_cases() + corpus_cases()


# Issue 30: every real-world-shaped fixture (``all_*``, the whole rule set) once more with ``--compile`` and
# with ``--ddp``, for the GPU suite (tests/test_gpu_fixtures.py); the CPU oracle covers these conversions
# through the corpus's ``+ddp`` variant and the ddp_/compile_ fixtures.
VARIANTS = {
    "compile": Settings(select=("ALL",), structural_fixes=("compile",)),
    "ddp": Settings(select=("ALL",), structural_fixes=("ddp",)),
}


def variant_cases() -> list[OracleCase]:
    return [
        OracleCase(f"{case.id}+{variant}", case.path, case.text, case.argv, settings)
        for case in fixture_cases()
        if case.id.startswith("all_") or case.id == "resnet50"
        for variant, settings in VARIANTS.items()
    ]


@dataclass(frozen=True)
class Patched:
    case: OracleCase
    fixed: str
    applied: tuple[str, ...]
    declined: tuple[str, ...]


def patch(case: OracleCase, workdir: Path) -> Patched:
    path = case.path
    if path is None:
        path = workdir / f"{case.id.replace('+', '_')}.py"
        path.write_text(case.text, encoding="utf-8")
    result = fix_file(path, case.settings, models=audited_fixture_models(path))
    assert result.error is None, result.error
    declined = tuple(f"{finding.rule}: {reason}" for finding, reason in result.declined)
    fixed = result.fixed.removeprefix("\ufeff")
    return Patched(case, fixed, tuple(result.applied), declined)


def amp_case(p: Patched) -> bool:
    """The fixtures whose patched script autocasts: run once more with real CPU autocast (AMP mode)."""
    return p.case.path is not None and "autocast" in p.fixed


def run_cases(patched: list[Patched], workdir: Path, modes: tuple[str, ...] = ("cpu", "cuda"), parallel: int = 2,
              ranks_only: frozenset[str] = frozenset()):
    """Run original and patched of every case in every mode, from one fork server:
    {(mode, case id, "original" | "patched"): RunResult}. Cases in ``ranks_only`` run only as two
    ranks (when converted to DDP)."""
    from oracle.harness import ScriptRun, run_scripts

    runs = []
    for mode in modes:
        for p in patched:
            if p.case.id in ranks_only:
                continue
            for side, text in (("original", p.case.text), ("patched", p.fixed)):
                # Under CUDA semantics the original is the reference: its scalers stay off, so it
                # computes what the script means; the patched script gets real scalers.
                scaler = "off" if side == "original" else "real"
                env = (("TCAUDIT_ORACLE_MODE", mode), ("TCAUDIT_ORACLE_SCALER", scaler))
                runs.append(ScriptRun(f"{mode}--{p.case.id}--{side}", text, p.case.argv, env))
    for p in patched:
        if amp_case(p) and p.case.id not in ranks_only:
            # Real CPU autocast where CUDA's would be on (fp16 unless the script says bf16): only the
            # patched script, against the CUDA-semantics original as the fp32 reference.
            env = (("TCAUDIT_ORACLE_MODE", "amp"), ("TCAUDIT_ORACLE_SCALER", "real"))
            runs.append(ScriptRun(f"amp--{p.case.id}--patched", p.fixed, p.case.argv, env))
    for p in patched:
        if any(rule in p.applied for rule in DDP_CONVERSIONS):
            # The converted script as torchrun would start it on two GPUs (here: two CPU ranks, gloo).
            env = (("TCAUDIT_ORACLE_MODE", "cpu"),)
            runs.append(ScriptRun(f"ranks2--{p.case.id}--patched", p.fixed, p.case.argv, env, world_size=2))
    results = run_scripts(runs, workdir, parallel=parallel)
    return {tuple(key.split("--")): value for key, value in results.items()}
