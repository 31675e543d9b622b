"""TC108 fp8-candidate: on Hopper and newer, a bf16/fp16 model whose GEMMs are large enough that FP8
training pays (information, from the model audit).

Fix (structural, ``fix --fp8`` only): the script half converts each trained model's large linear layers
with torchao's float8 training (``convert_to_float8_training`` with a ``module_filter_fn`` naming the
layers the model audit found with N and K of at least ``MIN_DIM`` and multiples of 16; the layers that
read the model's input or give its output stay in bf16), right after the statements that build the model
and move it to its device, so that the autocast and the compile the script has (or TC201's and TC305's
fixes add) run on the converted layers; on CUDA with FP8 Tensor Cores only (the script still runs on a
CPU and on older GPUs). Declined, with the reason, for a target GPU without FP8, where torchao is not
installed, for a model the audit did not measure or with no such layer, and for fp32 training.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit import gpus
from tcaudit.costs import measured
from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.model.channel import read_project_file
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.model_profile import LinearGemm, ModelProfile
from tcaudit.rewrite.codemod import FixContext, StatementEditor, ensure_import, parse_statement, torch_import_name
from tcaudit.rules.base import Codemod, ModelContext, ModelRule, RuleContext, ScriptRule
from tcaudit.rules.graph.model_reports import percent
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.script.trained_models import ModelSite, is_prep
from tcaudit.source.syntax import call_nodes, strip_comments
from tcaudit.source.triggers import all_of
from tcaudit.structural import FP8 as FP8_CONVERSION

HALF = {"bfloat16", "float16"}
FP8 = {"float8_e4m3fn", "float8_e5m2"}
# Measured on one NVIDIA H200, torch 2.11.0+cu130 (benchmarks/results/h200/small_layers.json, "fp8"): an
# e4m3 torch._scaled_mm against a bf16 GEMM ran 0.73× at 1024³, 0.97× at 2048³ and 1.69× at 4096³.
MIN_DIM = 4096
MIN_SHARE = 0.5  # of the model's GEMM FLOPs: below it the rest of the step keeps most of the time
MIN_ARCH = 90  # Hopper: the GPU the figures were measured on, and what TransformerEngine's FP8 targets
# The file already trains in FP8, or casts to it by hand.
USES_FP8 = re.compile(r"transformer_engine|torchao|_scaled_mm|float8_e4m3|float8_e5m2|Float8|fp8_autocast")
# The script trains in half precision (autocast, a half model, a trainer's precision flag); without any of
# these the GEMMs run in fp32 and TC201 comes first.
USES_HALF = re.compile(r"autocast|bfloat16|float16|\.half\(|\bbf16|\bfp16|\bamp\b")


def large(op: OpFact) -> bool:
    info = op.info
    return min(info["m"], info["n"], info["k"]) >= MIN_DIM


def target_arch(context: ModelContext) -> int | None:
    """The target GPU's architecture number (90 for ``sm_90``); with ``gpu = "auto"`` and none
    detected, that of the GPU the cost table was measured on, as the rest of the model audit assumes."""
    arch = context.settings.target.arch
    if arch == gpus.AUTO:
        arch = context.cost_model.gpu_key
    try:
        return gpus.arch_number(arch)
    except ValueError:
        return None


def read_text(context: ModelContext, path: str) -> str:
    source = context.sources.get(os.path.realpath(path))
    if source is not None:
        return source.text
    raw = read_project_file(path)  # never a FIFO or a device a result could name
    return raw.decode("utf-8", "replace") if raw is not None else ""


class Fp8Candidate(ModelRule):
    id = "TC108"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        arch = target_arch(context)
        if arch is None or arch < MIN_ARCH:
            return
        if facts.input.get("assumed", True):
            return  # M is batch × tokens: with a guessed batch or sequence the sizes are the audit's, not the script's
        cost = context.cost_model
        gemms = [op for op in facts.ops_of("gemm") if op.flops > 0]
        total = sum(op.flops for op in gemms)
        if not total or any(op.dtype in FP8 for op in facts.ops):
            return
        big = [op for op in gemms if large(op) and cost.dtype(op) in HALF]
        share = sum(op.flops for op in big) / total
        if share < MIN_SHARE:
            return
        files = [facts.target.get("path", ""), *facts.depends_on]
        texts = [read_text(context, path) for path in files if path]
        if any(USES_FP8.search(text) for text in texts):
            return
        if facts.target.get("kind") == "script" and not any(USES_HALF.search(text) for text in texts):
            return  # the script trains in fp32: autocast first (TC201)
        yield self._report(context, facts, big, share)

    def _report(self, context: ModelContext, facts: ModelFacts, big: list[OpFact], share: float) -> Finding:
        largest = max(big, key=lambda op: op.flops)
        dtype = short_dtype(context.cost_model.dtype(largest))
        gpu = context.settings.gpu
        info = largest.info
        entry = measured(self.spec, context.settings.target)
        if entry and "speedup" in entry:
            figure = f"FP8 ran them {entry['speedup']} faster ({entry.get('gpu', gpu)})"
        else:
            target = context.settings.target.gpu
            figure = f"FP8 may run them faster (not measured on {target.name if target else gpu})"
        message = (f"≥{MIN_DIM}³ {dtype} GEMMs do {percent(share)} of GEMM FLOPs: {figure}; "
                   "needs TE/torchao.float8 fused casts")
        faster = context.cost(self.spec, "gemm")
        naive = context.cost(self.spec, "naive")
        explanation = (
            f"FP8 Tensor Cores run GEMMs this large faster than {dtype}{faster}, but quantizing both operands in "
            f"separate kernels every step eats most of the gain{naive}: train with TransformerEngine (`te.Linear` "
            "under `te.fp8_autocast`) or torchao.float8 (`convert_to_float8_training`), whose casts are fused, "
            f"and compare the loss curve with {dtype}'s"
        )
        site = context.op_site(largest)
        details = {
            "flop_share_large_gemms": round(share, 4),
            "gemms": len(big),
            "dtype": context.cost_model.dtype(largest),
            "largest": {"module": largest.module or "", "m": info["m"], "n": info["n"], "k": info["k"],
                        "line": site.line},
            "min_dim": MIN_DIM,
        }
        if facts.total_flops:
            details["flop_share"] = round(sum(op.flops for op in big) / facts.total_flops, 4)
        return self.finding(context, context.target_site(), message, details=details, explanation=explanation + ".")


# -- fix --fp8: the script half ---------------------------------------------------------------------------

# The float8 recipe the conversion uses: torchao's default, tensorwise scaling. benchmarks/fp8_recipe.py
# measures it against rowwise on the GPT of benchmarks/fp8/gpt.py; not run on a GPU yet (BENCHMARKS.md).
RECIPE = "tensorwise"
# FP8 GEMMs take K and N in multiples of 16 (torch._scaled_mm).
FP8_ALIGNMENT = 16
INSTALL = "`pip install torchao` (or `pip install 'tcaudit[fp8]'`)"


def fp8_layers(profile: ModelProfile) -> list[LinearGemm]:
    """The linear layers FP8 training pays for: N and K at least ``MIN_DIM`` and multiples of 16, M too
    where the script gives the batch; not the layer that reads the model's input nor the one that gives its
    output (the first and last layers stay in bf16, as FP8 recipes keep them)."""
    return [layer for layer in profile.linears
            if not layer.reads_input and not layer.gives_output
            and min(layer.n, layer.k) >= MIN_DIM and layer.n % FP8_ALIGNMENT == 0 and layer.k % FP8_ALIGNMENT == 0
            and (profile.input_assumed or layer.m >= MIN_DIM)]


def layer_pattern(chosen: Sequence[LinearGemm], every: Sequence[LinearGemm]) -> list[str]:
    """Regular expressions that match exactly the ``chosen`` module paths among ``every`` linear layer:
    ``h\\.\\d+\\.mlp\\.c_fc`` where every layer of that shape (its indices left out) is chosen, the paths
    themselves where only some are."""
    def shape(path: str) -> str:
        return r"\.".join(r"\d+" if part.isdigit() else re.escape(part) for part in path.split("."))

    wanted = {layer.path for layer in chosen}
    by_shape: dict[str, list[str]] = {}
    for layer in every:
        by_shape.setdefault(shape(layer.path), []).append(layer.path)
    out: list[str] = []
    for pattern, paths in by_shape.items():
        if all(path in wanted for path in paths):
            out.append(pattern)
        else:
            out.extend(re.escape(path) for path in paths if path in wanted)
    return out


@dataclass(frozen=True, eq=False)
class Fp8Conversion(FixPlan):
    kind = "insert-after"
    after: cst.CSTNode  # the statement that builds the model, or the last that moves it to its device
    statement: str  # the guarded conversion


class Fp8Training(ScriptRule):
    """``fix --fp8``: the conversion of each trained model's large linear layers to torchao float8 training,
    or why not. Reports only when the conversion is asked for; the model half reports the candidate."""

    id = "TC108"
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE),)
    # The conversion goes on top of the autocast TC201's fix adds and before the compile TC305's adds.
    after = ("TC201", "TC305")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if FP8_CONVERSION.name not in context.settings.structural_fixes:
            return
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training or USES_FP8.search(strip_comments(facts.source.text)):
            return
        seen: set[str] = set()
        for site in pipeline.trained_models:
            if site.name in seen:
                continue
            seen.add(site.name)
            profile = pipeline.profile_of(site, context.models)
            chosen = fp8_layers(profile) if profile is not None else []
            what = (f"{len(chosen)} linear layer{'s' if len(chosen) != 1 else ''} of `{site.name}`" if chosen
                    else f"`{site.name}`")
            yield self.finding(
                facts,
                site.construction,
                f"FP8 training for {what} (torchao float8, {RECIPE} scaling): `fix --fp8`",
                explanation=(
                    f"FP8 Tensor Cores run large GEMMs faster than bf16{context.cost(self.spec, 'gemm')}; torchao's "
                    "float8 training fuses the casts and scales that would otherwise eat the gain"
                    f"{context.cost(self.spec, 'training')}. The conversion keeps the first and last layers and "
                    f"layers under {MIN_DIM} wide in bf16; compare the loss curve with bf16's."
                ),
                fix=self.planned_fix(
                    FixClass.STRUCTURAL, f"convert the large linear layers of `{site.name}` to torchao float8 training",
                    lambda site=site, profile=profile, chosen=chosen: self._plan(
                        facts, context, pipeline, site, profile, chosen),
                    option=FP8_CONVERSION.name),
                details={"fp8_layers": [layer.path for layer in chosen], "recipe": RECIPE},
            )

    def _plan(self, facts: ScriptFacts, context: RuleContext, pipeline, site: ModelSite,
              profile: ModelProfile | None, chosen: list[LinearGemm]) -> Fp8Conversion:
        target = context.settings.target
        if target.gpu is None:
            raise DeclineFix("no target GPU is known, and FP8 needs one with FP8 Tensor Cores (sm_89 and newer): "
                             "name it with `--gpu` (h100, h200, l4, rtx4090...)")
        if not target.gpu.has_fp8:
            raise DeclineFix(f"the target GPU, {target.gpu.label}, has no FP8 Tensor Cores (Ada and Hopper, "
                             "sm_89, and newer)")
        if profile is None:
            raise DeclineFix(f"the model audit did not measure `{site.name}`, and it picks the layers: let it "
                             "build the model (no `--no-exec`; a `[[tool.tcaudit.models]]` entry where it cannot)")
        if not chosen:
            raise DeclineFix(
                f"no linear layer of `{profile.model_class}` has N and K of at least {MIN_DIM} and multiples of "
                f"{FP8_ALIGNMENT} (the first and last layers aside): FP8 GEMMs smaller than that ran no faster "
                "than bf16 (0.97× at 2048³ on an H200)")
        if not pipeline.trains_under_autocast and not context.fixable("TC201", facts):
            raise DeclineFix(f"`{site.name}` trains in fp32: FP8 training goes on top of bf16 autocast, which "
                             "the script does not use (TC201's fix adds it)")
        # Last: installing torchao helps only where nothing above stands in the way.
        if importlib.util.find_spec("torchao") is None:
            raise DeclineFix(f"torchao, whose float8 training the conversion calls, is not installed: {INSTALL}")
        after = _after_model_is_placed(facts, site)
        torch_name = torch_import_name(facts) or "torch"
        patterns = layer_pattern(chosen, profile.linears)
        lines = "\n".join(f'        r"{"|" if index else ""}{pattern}"' for index, pattern in enumerate(patterns))
        statement = (
            f"if next({site.name}.parameters()).is_cuda and {torch_name}.cuda.get_device_capability() >= (8, 9):\n"
            "    import re\n\n"
            "    from torchao.float8 import Float8LinearConfig, convert_to_float8_training\n\n"
            "    fp8_layers = re.compile(\n"
            '        r"(?:_orig_mod\\.|module\\.)*(?:"\n'
            f"{lines}\n"
            '        r")"\n'
            "    )\n"
            f"    convert_to_float8_training({site.name}, config=Float8LinearConfig.from_recipe_name(\"{RECIPE}\"),\n"
            "                               module_filter_fn=lambda module, fqn: fp8_layers.fullmatch(fqn) is not None)"
            "\n"
        )
        return Fp8Conversion(after=after, statement=statement)

    @classmethod
    def merge_model_findings(cls, script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
        """Under ``fix --fp8`` the script's finding (the conversion, or why not) stands for the audit's
        candidate finding of the same file."""
        files = {finding.location.path for finding in script}
        return script, [finding for finding in model if finding.location.path not in files]


def _after_model_is_placed(facts: ScriptFacts, site: ModelSite) -> cst.CSTNode:
    """The statement that builds ``site``'s model, or the last one after it in the same block that moves it
    to its device (``model.to(device)``, ``if args.cuda: model.cuda()``): the conversion goes after it, so
    that it sees the parameters on the GPU, and before any compile or wrap of the model."""
    for binding in facts.bindings_of(site.name):
        statement = binding.statement
        if statement is None or not any(call is site.construction for call in call_nodes(binding.value)):
            continue
        block, index = statement.block, statement.index
        after = statement.node
        for node in block[index + 1:]:
            if not is_prep(node, site.name):
                break
            after = node
        return after
    raise DeclineFix(f"could not find the statement that builds `{site.name}`; convert it by hand")


class Fp8TrainingFix(Codemod):
    rule = "TC108"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        for finding in findings:
            plan: Fp8Conversion = finding.fix.plan
            editor.insert_after(plan.after, [parse_statement(plan.statement, module)])
        new = editor.apply(module)
        if torch_import_name(context.facts) is None:
            new = ensure_import(new, "import torch")
        return new
