"""Model audit (TC1): find the models a script builds, build them on fake tensors in a subprocess and
measure them (the graph's shapes, dtypes, casts and costs). It judges nothing: the engine runs the
model rules (``tcaudit/rules/graph/``) on the facts it returns. This module imports no torch: the
audit runs in a child process so that the scanner stays fast and a crashing constructor cannot take
it down.

Flow: :mod:`discovery` finds model constructions in each scanned file (and ``[[tool.tcaudit.models]]``
/ ``--model`` factories), :mod:`slicing` cuts the statements each one needs out of the script,
:mod:`sandbox` runs them in the audit child (:mod:`worker`, :mod:`build`, :mod:`capture`), which returns
:class:`~tcaudit.model.facts.ModelFacts` (:func:`measure_models`); :func:`tcaudit.engine.run_model_audit`
turns those into findings.
"""

from __future__ import annotations

import importlib.util
import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tcaudit import progress
from tcaudit.findings import Finding

if TYPE_CHECKING:
    from tcaudit.config import ModelSpec, Settings
    from tcaudit.model.facts import ModelFacts
    from tcaudit.model_profile import AuditedModels, LinearGemm, ModelProfile
    from tcaudit.source.parsing import SourceFile

TORCH_MISSING_NOTE = (
    "model checks (TC1) skipped: torch is not installed here (pip install 'tcaudit[torch]')"
)
MAX_MODELS_PER_FILE = 4
# A file can only build a model if it mentions one of these.
_MODEL_HINT = re.compile(r"\btorch\b|\btimm\b|\bnn\.|create_model|\bModule\b|\btransformers\b|\blightning\b")
# A training step in a module that runs nothing itself (``def main(cfg): ... loss.backward()`` for a
# launcher to call): the models it trains are audited too, or named in a TC100.
_TRAINS = re.compile(r"\.backward\(")
# Libraries the audit process imports before the sandbox's audit hook is installed, when a script imports
# them: trusted site-packages whose import is slow (torchvision, timm) or does what a model build must not
# (Lightning imports torchmetrics, which imports matplotlib, whose font cache starts ``fc-list``).
PRELOADED = frozenset({"torchvision", "timm", "lightning", "pytorch_lightning", "transformers"})
_DTYPES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32", "fp64": "float64", "float64": "float64",
    "double": "float64",
}
_INPUT_DTYPES = {"int64": "int64", "long": "int64", "int32": "int32", "int": "int64"}
NOT_BUILDABLE = {
    "pretrained": (
        "it is loaded with from_pretrained(), which downloads a checkpoint the audit does not fetch; "
        "give an offline factory (e.g. from_config) with [[tool.tcaudit.models]]"
    ),
    "loaded": (
        "it is unpickled from a file with torch.load(), which the audit does not run; "
        "give the model's factory with [[tool.tcaudit.models]]"
    ),
}


@dataclass
class ModelAuditResult:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    facts: "list[ModelFacts]" = field(default_factory=list)  # one per model found, in discovery order
    cached: int = 0  # how many of them came from the model cache


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def measure_models(
    sources: "list[SourceFile]", settings: "Settings", result: ModelAuditResult, *, limits=None, scan_cache=None
) -> None:
    """Build and capture every model the sources build (and the configured factories), within
    ``settings.model_budget`` seconds of building and tracing, into ``result.facts`` (one per model, in
    discovery order), with what kept one from being measured in ``result.notes``; results come from
    and go to the model cache beside ``scan_cache`` (None: no cache). Judging the facts is the rules'
    (``tcaudit.engine.run_model_audit``)."""
    from tcaudit.model.sandbox import Limits, StartupError

    limits = limits or Limits.from_env()
    precision = _precision(settings)
    jobs, static, preload = collect_jobs(sources, settings, precision, limits, result)
    facts_list: list[ModelFacts] = list(static)
    if jobs:
        from tcaudit.model.model_cache import open_model_cache

        cache = open_model_cache(scan_cache.directory, scan_cache.namespace) if scan_cache is not None else None
        try:
            facts_list.extend(_run_within_budget(jobs, settings.model_budget, cache, limits, preload, result))
        except StartupError as exc:
            result.notes.append(f"model checks (TC1) skipped: {exc}")
            raise ModelsNotMeasured from None
        from tcaudit.model.sandbox import isolation_level, read_only_view

        if result.cached < len(jobs) and not read_only_view():
            result.notes.append(
                f"model audit: the models were built without the read-only file system view (sandbox: "
                f"{isolation_level()}); see \"Running on code you do not trust\" in the README")
    result.facts = facts_list


class ModelsNotMeasured(Exception):
    """The audit child could not start: no model was measured (``result.notes`` says why)."""


def budget_reason(budget: float, spent: float, audited: int) -> str:
    return (
        f"the scan's model-audit budget of {budget:g} s was spent ({spent:.0f} s on {audited} other "
        f"model{'s' if audited != 1 else ''}); raise it with --model-budget or model-budget in the config"
    )


def _run_within_budget(jobs, budget: float, cache, limits, preload, result: ModelAuditResult) -> "list[ModelFacts]":
    """Cached results first (they cost nothing), then each remaining model while the budget lasts;
    the models left over are not dropped: each becomes a ``budget`` result (a TC100 info)."""
    import time

    from tcaudit.model.facts import ModelFacts
    from tcaudit.model.sandbox import Cancelled, StartupError, shared_sandbox

    found: dict[int, ModelFacts] = {}
    for number, job in enumerate(jobs):
        hit = cache.load(job) if cache is not None else None
        if hit is not None:
            found[number] = hit
            result.cached += 1
    spent, audited = 0.0, 0
    with progress.current().stage("auditing", total=len(jobs) - len(found), unit="models") as stage:
        for number, job in enumerate(jobs):
            if number in found:
                continue
            if spent >= budget:
                found[number] = ModelFacts.failed(job["target"], budget_reason(budget, spent, audited), "budget")
                stage.advance()
                continue
            stage.show(_shown(job["target"]))
            started = time.perf_counter()
            try:
                facts = shared_sandbox().run([job], limits, preload)[0]
                if cache is not None:
                    cache.store(job, facts)
            except (StartupError, Cancelled):
                raise
            except Exception as exc:  # noqa: BLE001 - a bug about one model: TC100 for it, the others go on
                facts = ModelFacts.failed(job["target"], f"internal error while auditing the model: {exc!r}\n"
                                          f"{traceback.format_exc()}", "error")
            spent += time.perf_counter() - started
            audited += 1
            found[number] = facts
            stage.advance()
    return [found[number] for number in range(len(jobs))]


def _shown(target: dict[str, Any]) -> str:
    """The model being audited, for the progress display: ``train.py: resnet50``."""
    label = str(target.get("label") or "")
    if target.get("kind") == "script" and target.get("path"):
        return f"{Path(target['path']).name}: {label}"
    return label


def _precision(settings: "Settings") -> str:
    from tcaudit.model.cost import PRECISION_DTYPES, load_table

    if settings.precision == "auto" and not settings.target.has_bf16:
        return PRECISION_DTYPES["fp16"]  # no bf16 Tensor Cores before sm_80: autocast there is fp16
    return PRECISION_DTYPES.get(settings.precision, load_table().get("auto_precision", "bfloat16"))


def collect_jobs(sources, settings, precision: str, limits, result: ModelAuditResult):
    """The audit jobs for every model found, the models that failed before running, and the modules
    worth importing once in the audit child."""
    from tcaudit.model.facts import ModelFacts

    jobs: list[dict[str, Any]] = []
    static: list[ModelFacts] = []
    preload: set[str] = set()
    job_limits = {"time_limit": limits.time_limit, "memory_budget": limits.memory_budget}
    from tcaudit.model.discovery import runs_code_of_its_own

    for source in sources:
        if not _MODEL_HINT.search(source.text):
            continue
        if not runs_code_of_its_own(source.text) and not _TRAINS.search(source.text):
            continue  # a library module: builds nothing by itself and trains nothing
        try:
            found = discover_file(source)
        except Exception as exc:  # noqa: BLE001 - a discovery bug must not hide the other files
            # TC100 at the file's first line: its models were not audited, the other files' were
            static.append(ModelFacts.failed(
                _file_target(source), f"internal error in model discovery: {exc!r}\n{traceback.format_exc()}", "error"))
            continue
        for target, failure, imports in found:
            if failure is not None:
                status = "error" if isinstance(failure, InternalError) else "failed"
                static.append(ModelFacts.failed(target, failure, status))
                continue
            preload |= imports & PRELOADED
            jobs.append({"target": target, "precision": precision, "limits": job_limits})
    for spec in settings.models:
        target, failure = factory_target(spec, settings)
        if failure is not None:
            static.append(ModelFacts.failed(target, failure))
        else:
            jobs.append({"target": target, "precision": precision, "limits": job_limits})
    preload = {name for name in preload if importlib.util.find_spec(name) is not None}
    return jobs, static, sorted(preload)


class InternalError(str):
    """A discovery failure that is tcaudit's fault, not the script's: reported as an internal error
    (TC100 says so) rather than as a model the script builds in a way the audit cannot follow."""


def _file_target(source: "SourceFile") -> dict[str, Any]:
    path = source.path.resolve()
    return {"kind": "script", "label": source.path.name, "path": str(path), "roots": [str(path.parent)],
            "construction": {"line": 1, "column": 1, "end_line": 1, "end_column": 1}, "hints": {}}


def discover_file(source: "SourceFile") -> list[tuple[dict[str, Any], str | None, set[str]]]:
    """(target, failure reason or None, imported packages) for each model the file builds."""
    from tcaudit.model.discovery import ScriptIndex, find_candidates, find_hints
    from tcaudit.model.slicing import SliceError, Slicer, missing_packages
    from tcaudit.model_profile import construction_key
    from tcaudit.source.parsing import SourceError

    try:
        module = source.module
    except SourceError:
        return []  # the engine reports TC000
    path = source.path.resolve()
    index = ScriptIndex(module, source.text, path)
    candidates = find_candidates(index, MAX_MODELS_PER_FILE)
    if not candidates:
        return []
    hints = find_hints(index)
    out = []
    for candidate in candidates:

        start = index.position(candidate.call).start
        end = index.position(candidate.call).end
        target: dict[str, Any] = {
            "kind": "script",
            "label": candidate.label,
            # For the script rules (tcaudit/model_profile.py): which construction this model is.
            "source": construction_key(index.source(candidate.call)),
            "assigned": candidate.target_name,
            "path": str(path),
            "roots": [str(path.parent)],
            "construction": {"line": start.line, "column": start.column + 1, "end_line": end.line,
                             "end_column": end.column + 1},
            "hints": hints,
        }
        if candidate.kind in NOT_BUILDABLE:
            out.append((target, NOT_BUILDABLE[candidate.kind], set()))
            continue
        if candidate.refused is not None:
            out.append((target, candidate.refused, set()))
            continue
        try:
            plan = Slicer(index).plan(candidate)
        except SliceError as exc:
            out.append((target, str(exc), set()))
            continue
        except Exception as exc:  # noqa: BLE001 - a slicer bug costs this model, not the file's others
            out.append((target, InternalError(f"internal error while slicing the script: {exc!r}\n"
                                              f"{traceback.format_exc()}"), set()))
            continue
        target.update(program=plan.program, construction=plan.construction, skipped=plan.skipped)
        missing = missing_packages(plan.imports, index)
        if missing:
            names = ", ".join(missing)
            out.append((
                target,
                f"it needs {names}, which {'is' if len(missing) == 1 else 'are'} not installed here, so the "
                f"model cannot be resolved offline",
                set(),
            ))
            continue
        out.append((target, None, plan.imports))
    return out


def _launch_bound(facts: "ModelFacts") -> bool:
    """The step's GEMM, conv, attention and RNN work averages within a launch per op, at the script's
    own batch, or at a large one where the audit assumed it (a 4-128-2 policy is launch-bound at any
    batch a script uses; an MNIST Net only at the script's own 64)."""
    from tcaudit.model.cost import CostModel

    ops = facts.ops_of("gemm") + facts.ops_of("conv") + facts.ops_of("sdpa") + facts.ops_of("rnn")
    return CostModel(facts).step_within_launch(ops)


def _forward_ms(facts: "ModelFacts") -> float:
    """The forward's modelled device time, in ms, at the script's batch or the large one assumed."""
    from tcaudit.model.cost import CostModel

    cost = CostModel(facts)
    return round(cost.current_time * 1e3 * (cost.assumed_scale() or 1.0), 4)


def _linears(facts: "ModelFacts") -> "tuple[LinearGemm, ...]":
    """Each ``nn.Linear`` the forward ran, once (its first call), with its GEMM's sizes."""
    from tcaudit.model_profile import LinearGemm

    inputs = [list(shape) for shape in facts.input.get("shapes") or []]
    out: dict[str, LinearGemm] = {}
    for op in facts.ops_of("gemm"):
        if op.module_type != "Linear" or not op.module or op.module in out:
            continue
        info = op.info
        out[op.module] = LinearGemm(op.module, int(info["m"]), int(info["n"]), int(info["k"]),
                                    reads_input=bool(op.shapes) and list(op.shapes[0]) in inputs,
                                    gives_output=bool(info.get("model_output")))
    return tuple(out.values())


def _small_mlp_profile(facts: "ModelFacts") -> "ModelProfile | None":
    """A model the audit could only read from its parameters (its forward has another name, takes
    several inputs) whose layers are all Linear, each within a launch at any batch a script uses (a
    PPO agent's 4-64-64-2 actor and critic): all GEMM, and launch-bound whatever its forward does."""
    from tcaudit.model.cost import CostModel
    from tcaudit.model_profile import ModelProfile

    layers = [m for m in facts.modules.values() if m.attrs.get("role")]
    if facts.status != "ok" or not layers or any(m.attrs["role"] not in ("linear", "norm") for m in layers):
        return None
    cost = CostModel(facts)
    if not all(cost.layer_within_launch(m.attrs) for m in layers if m.attrs["role"] == "linear"):
        return None
    target = facts.target
    return ModelProfile(
        construction=target["source"], assigned=target.get("assigned"), model_class=facts.model_class,
        conv_share=0.0, gemm_share=1.0, attention_share=0.0, conv3d=False, image_input=False, launch_bound=True,
    )


def audited_models(facts_list: "list[ModelFacts]") -> "dict[str, AuditedModels]":
    """The profiles the script rules read, by the real path of the script that builds each model: only
    models audited from a script's own construction (not ``--model`` factories), built and captured."""
    from tcaudit.model_profile import AuditedModels, ModelProfile

    by_path: dict[str, list[ModelProfile]] = {}
    for facts in facts_list:
        target = facts.target
        if facts.status != "ok" or target.get("kind") != "script" or not target.get("source"):
            continue
        if facts.capture.method == "parameters" or facts.total_flops <= 0:
            profile = _small_mlp_profile(facts)  # nothing ran: no FLOPs to share out, unless a toy MLP's
            if profile is not None:
                by_path.setdefault(os.path.realpath(target["path"]), []).append(profile)
            continue
        conv2d = sum(op.flops for op in facts.ops_of("conv") if len(op.info.get("kernel") or []) == 2)
        gemm = sum(op.flops for op in facts.ops_of("gemm"))
        attention = sum(op.flops for op in facts.ops_of("sdpa"))
        shapes = facts.input.get("shapes") or []
        dtypes = facts.input.get("dtypes") or []
        image_input = bool(shapes) and len(shapes[0]) == 4 and not str(dtypes[0] if dtypes else "").startswith("int")
        profile = ModelProfile(
            construction=target["source"],
            assigned=target.get("assigned"),
            model_class=facts.model_class,
            conv_share=conv2d / facts.total_flops,
            gemm_share=gemm / facts.total_flops,
            attention_share=attention / facts.total_flops,
            conv3d=any(len(op.info.get("kernel") or []) == 3 for op in facts.ops_of("conv")),
            image_input=image_input,
            launch_bound=_launch_bound(facts),
            forward_ms=_forward_ms(facts),
            flops_per_sample=facts.total_flops / shapes[0][0] if shapes and shapes[0] and shapes[0][0] else 0.0,
            linears=_linears(facts),
            input_assumed=bool(facts.input.get("assumed", True)),
        )
        by_path.setdefault(os.path.realpath(target["path"]), []).append(profile)
    return {path: AuditedModels(tuple(profiles)) for path, profiles in by_path.items()}


def parse_input(text: str) -> list[list[int]]:
    """``8x3x224x224`` → [[8, 3, 224, 224]]; several inputs are separated by commas."""
    shapes = []
    for part in re.split(r"[,;]\s*", text.strip()):
        dims = [d for d in re.split(r"[x×*]", part.strip().lower()) if d]
        if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"input shape {text!r} must look like 8x3x224x224")
        shapes.append([int(d) for d in dims])
    return shapes


def factory_target(spec: "ModelSpec", settings: "Settings") -> tuple[dict[str, Any], str | None]:
    """An audit job for ``[[tool.tcaudit.models]]`` / ``--model pkg.mod:factory``."""
    root = Path(settings.root).resolve()
    path, line = _factory_location(spec, settings)
    target: dict[str, Any] = {
        "kind": "factory",
        "label": spec.factory,
        "factory": spec.factory,
        "path": path,
        "roots": [str(root)],
        "construction": {"line": line, "column": 1, "end_line": line, "end_column": 0},
        "hints": {},
    }
    try:
        if spec.input:
            target["hints"]["input_shapes"] = parse_input(spec.input)
    except ValueError as exc:
        return target, str(exc)
    if spec.dtype:
        key = spec.dtype.strip().lower()
        if key in _DTYPES:
            target["hints"]["model_dtype"] = _DTYPES[key]
        elif key in _INPUT_DTYPES:
            target["hints"]["input_dtype"] = _INPUT_DTYPES[key]
        else:
            return target, f"unknown dtype {spec.dtype!r} (use bf16, fp16, fp32, fp64 or int64)"
    return target, None


def _factory_location(spec: "ModelSpec", settings: "Settings") -> tuple[str, int]:
    """The config line that names the factory; else the factory module's file when it is the user's."""
    config = settings.config_path
    if config is not None and Path(config).is_file():
        text = Path(config).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if spec.factory in line:
                return str(Path(config).resolve()), number
    module = spec.factory.partition(":")[0]
    candidate = Path(settings.root) / Path(*module.split("."))
    for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
        if file.is_file():
            return str(file.resolve()), 1
    return spec.factory, 1
