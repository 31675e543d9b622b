"""Frameworks that own the loop (issue 47): Lightning, Hugging Face Trainer and accelerate scripts under
``fixtures/frameworks/`` report what keeps them in fp32 (and stay silent when tuned or on the CPU); ``fix``
edits the framework's own options, exactly as the ``*.out.py`` beside each script shows, and a second fix
changes nothing; the patched scripts train a few steps on the CPU with the losses of the original (the
oracle's shim records every loss given to backward, the frameworks' own steps included); a fix whose value
comes from the command line or a config file is declined, naming the flag or key.

The frameworks come from the ``frameworks`` extra (``pip install -e ".[torch,test]"`` brings it); a test
that runs one skips, saying which, where it is not installed. Nothing is downloaded: the models are built
from configs and ``HF_HUB_OFFLINE=1`` is set for every run.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli

FRAMEWORKS = FIXTURES / "frameworks"
PROJECTS = FRAMEWORKS / "projects"
RULES = ["TC215", "TC301", "TC307", "TC401", "TC412", "TC413", "TC505", "TC601"]

# fixture → (the frameworks it imports, the framework findings (rule, line) a scan reports)
SCRIPTS: dict[str, tuple[tuple[str, ...], list[tuple[str, int]]]] = {
    "lightning_datamodule": (("lightning",), [("TC215", 40), ("TC301", 40), ("TC307", 26), ("TC505", 40)]),
    "hf_trainer": (("transformers",), [("TC215", 22), ("TC301", 22), ("TC505", 37), ("TC601", 26)]),
    "hf_padding": (("transformers", "tokenizers"), [("TC412", 47), ("TC413", 43), ("TC505", 46)]),
    "accelerate_loop": (("accelerate",), [("TC215", 9)]),
    "accelerate_argparse": (("accelerate",), [("TC215", 17)]),
    "hf_argparser": (("transformers",), [("TC215", 15), ("TC301", 15), ("TC401", 15), ("TC505", 18)]),
    "lightning_named": (("lightning",), [("TC601", 41)]),
    "near_misses": ((), []),
}
FIXED = sorted(name for name in SCRIPTS if (FRAMEWORKS / f"{name}.out.py").is_file())
C_COMPILER = shutil.which("cc") or shutil.which("gcc")
OFFLINE = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
           ("TOKENIZERS_PARALLELISM", "false"))


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def scan(path: Path, *extra: str, cwd: Path | None = None) -> list[dict]:
    code, out, err = run_cli("scan", str(path), "--no-exec", "--no-cache", "--isolated", "--format", "json",
                             "--select", ",".join(RULES), *extra, cwd=cwd)
    assert code in (0, 1), err
    return json.loads(out)["findings"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_reports_its_fp32_framework_settings_and_nothing_else(name):
    found = sorted((f["rule"], f["line"]) for f in scan(FRAMEWORKS / f"{name}.in.py"))
    assert found == sorted(SCRIPTS[name][1])


# fixtures fixed with an opt-in structural fix: (fixture, the option, the file it turns into)
STRUCTURAL = [("lightning_named", "--compile", "lightning_named.compiled.py")]
# What is left has no fix: logging every step (TC601, info) is the user's choice, and so is how many GPUs train
# (TC505: Lightning's `devices`, or launching the Hugging Face Trainer under torchrun).
# (TC413: grouping batches by length changes which examples train together.)
LEFT_AFTER_FIX = {"hf_trainer": [("TC601", False), ("TC505", False)],
                  "hf_padding": [("TC413", False), ("TC505", False)],
                  "lightning_datamodule": [("TC505", False)]}


@pytest.mark.parametrize("name", FIXED)
def test_fix_edits_the_frameworks_own_option_exactly_and_once(name, tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(FRAMEWORKS / f"{name}.in.py", script)
    code, _, err = run_cli("fix", str(script), "--apply", "--no-exec", "--no-cache", "--isolated")
    assert code in (0, 1), err
    assert script.read_text(encoding="utf-8") == (FRAMEWORKS / f"{name}.out.py").read_text(encoding="utf-8")
    code, out, _ = run_cli("fix", str(script), "--no-exec", "--no-cache", "--isolated")
    assert code == 0 and out.strip() == "", out
    assert sorted((f["rule"], f["fix"]["available"]) for f in scan(script)) == sorted(LEFT_AFTER_FIX.get(name, []))


def test_a_value_the_command_line_or_a_config_sets_is_declined_with_the_flag_to_pass():
    reasons = {}
    for name in ("accelerate_argparse", "hf_argparser"):
        finding = next(f for f in scan(FRAMEWORKS / f"{name}.in.py") if f["rule"] == "TC215")
        assert finding["fix"]["available"] is False
        reasons[name] = finding["fix"]["reason"]
    assert "pass `--mixed_precision bf16`" in reasons["accelerate_argparse"]
    assert "`--mixed_precision` defaults to 'no'" in reasons["accelerate_argparse"]
    assert reasons["hf_argparser"] == "the training arguments come from the command line (`HfArgumentParser`): pass `--bf16`"
    precision, tf32, devices = sorted(scan(PROJECTS / "lightning_cli" / "main.py"), key=lambda f: f["rule"])
    assert "set `trainer.precision: bf16-mixed` in the config" in precision["fix"]["reason"]
    # TF32 is no trainer option: the script's own setting works whatever the config says.
    assert tf32["rule"] == "TC301" and tf32["fix"]["available"] is True
    # `devices: 1` in config.yaml pins one GPU: the flag to pass, and why it is not changed for the user.
    assert devices["rule"] == "TC505" and devices["message"].endswith("`trainer.devices: 1` in config.yaml")
    assert devices["fix"]["reason"].startswith("the value comes from the config (`trainer.devices: 1` in config.yaml): "
                                               "pass `--trainer.devices -1`")
    assert scan(PROJECTS / "lightning_cli_bf16" / "main.py") == []
    tf32 = next(f for f in scan(FRAMEWORKS / "hf_argparser.in.py") if f["rule"] == "TC301")
    assert tf32["message"].endswith("`--tf32` is not passed") and "pass `--tf32 True`" in tf32["fix"]["reason"]
    workers = next(f for f in scan(FRAMEWORKS / "hf_argparser.in.py") if f["rule"] == "TC401")
    assert workers["severity"] == "info"
    assert workers["fix"]["reason"].endswith("pass `--dataloader_num_workers 8` (or the machine's core count)")


@pytest.mark.parametrize("name, option, fixed", STRUCTURAL)
def test_an_opt_in_fix_edits_exactly_and_once(name, option, fixed, tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(FRAMEWORKS / f"{name}.in.py", script)
    code, _, err = run_cli("fix", str(script), option, "--apply", "--no-exec", "--no-cache", "--isolated")
    assert code in (0, 1), err
    assert script.read_text(encoding="utf-8") == (FRAMEWORKS / fixed).read_text(encoding="utf-8")
    code, out, _ = run_cli("fix", str(script), option, "--no-exec", "--no-cache", "--isolated")
    assert code == 0 and out.strip() == "", out


def test_a_lightning_module_fit_uncompiled_is_compiled_in_place_where_it_is_bound_to_a_name(tmp_path):
    (named,) = scan(FRAMEWORKS / "lightning_named.in.py", "--select", "TC305")
    assert (named["line"], named["severity"]) == (45, "info")
    assert named["message"] == "the LightningModule `model` given to `fit` is never compiled: `model.compile()`"
    assert named["fix"]["available"] is True
    # Built inside fit(...): no name to compile in place.
    (inline,) = scan(FRAMEWORKS / "lightning_datamodule.in.py", "--select", "TC305")
    assert inline["fix"]["reason"].startswith("the LightningModule is built inside the `fit(...)` call (`Regressor()`)")
    # No forward: compiling the module would compile nothing training_step runs.
    (no_forward,) = scan(FIXTURES / "scripts" / "tc3_lightning.py", "--select", "TC305")
    assert no_forward["fix"]["reason"].startswith("`LitConvNet` defines no `forward`")
    # Compiled already (in place, or torch.compile passed to fit), or on the CPU: silent.
    text = (FRAMEWORKS / "lightning_named.in.py").read_text(encoding="utf-8")
    for variant in (text.replace("    trainer = L.Trainer(\n", "    model.compile()\n    trainer = L.Trainer(\n"),
                    text.replace("trainer.fit(model, loader())", "trainer.fit(torch.compile(model), loader())"),
                    text.replace("        max_steps=3,\n", "        max_steps=3,\n        accelerator=\"cpu\",\n")):
        assert variant != text
        path = tmp_path / "train.py"
        path.write_text(variant, encoding="utf-8")
        assert scan(path, "--select", "TC305") == []


def test_ragged_batches_name_both_keywords_and_are_not_regrouped_for_the_user():
    (finding,) = [f for f in scan(FRAMEWORKS / "hf_padding.in.py") if f["rule"] == "TC413"]
    assert finding["message"] == ("`TrainingArguments` batches at random and `DataCollatorWithPadding` pads each "
                                  "to its longest")
    assert finding["severity"] == "info" and finding["fix"]["available"] is False
    assert finding["fix"]["reason"].endswith('set `train_sampling_strategy="group_by_length"` (`group_by_length=True` '
                                             "before transformers 5) by hand")
    assert (finding["related"][0]["line"], finding["related"][0]["path"]) == (47, finding["path"])
    # The arguments built in another module: reported at the trainer, which gets the collator.
    (elsewhere,) = scan(Path("."), "--select", "TC413", cwd=PROJECTS / "hf_collator_module")
    assert (elsewhere["path"], elsewhere["line"]) == ("train.py", 8)
    assert [(r["path"], r["line"]) for r in elsewhere["related"]] == [("train.py", 9), ("settings.py", 8)]
    assert "in settings.py:8, where the arguments are built, by hand" in elsewhere["fix"]["reason"]


def test_one_gpu_names_what_to_set_for_lightning_and_the_launch_for_the_hf_trainer():
    (lightning,) = [f for f in scan(FRAMEWORKS / "lightning_datamodule.in.py") if f["rule"] == "TC505"]
    assert lightning["message"] == "Lightning `Trainer` trains on one GPU: `devices=1`"
    assert lightning["severity"] == "info" and lightning["fix"]["available"] is False
    assert lightning["fix"]["reason"].startswith('set `devices="auto"` (or `-1`) with `strategy="ddp"` by hand: it '
                                                 "decides how many processes Lightning launches and the global batch")
    (hf,) = [f for f in scan(FRAMEWORKS / "hf_trainer.in.py") if f["rule"] == "TC505"]
    assert hf["message"] == "the Hugging Face Trainer trains in one process unless launched with `torchrun`"
    assert hf["fix"]["reason"].startswith("how the script is launched is outside it: run `torchrun --nproc_per_node=N "
                                          "hf_trainer.in.py`")


def test_a_gpu_without_bf16_gets_fp16():
    (finding,) = [f for f in scan(FRAMEWORKS / "hf_trainer.in.py", "--gpu", "v100") if f["rule"] == "TC215"]
    assert finding["fix"]["description"] == "set fp16=True"
    (finding,) = [f for f in scan(FRAMEWORKS / "lightning_datamodule.in.py", "--gpu", "T4") if f["rule"] == "TC215"]
    assert finding["fix"]["description"] == 'set precision="16-mixed"'


def test_training_arguments_built_in_another_module_are_reported_at_the_trainer_and_fixed_where_built():
    folder = PROJECTS / "hf_args_module"
    (entry,) = [f for f in scan(Path("train.py"), cwd=folder) if f["rule"] == "TC215"]
    assert (entry["path"], entry["line"]) == ("train.py", 22)
    assert entry["related"][0]["path"] == "settings.py" and entry["related"][0]["line"] == 9
    assert entry["fix"]["available"] is False
    assert "built in settings.py:9, another module" in entry["fix"]["reason"]
    found = sorted((f["rule"], f["path"], f["line"], f["fix"]["available"]) for f in scan(Path("."), cwd=folder))
    assert found == [("TC215", "settings.py", 9, True), ("TC215", "train.py", 22, False),
                     ("TC301", "settings.py", 9, True), ("TC301", "train.py", 22, False),
                     ("TC401", "settings.py", 9, False), ("TC401", "train.py", 22, False),
                     ("TC505", "train.py", 22, False),
                     ("TC601", "settings.py", 10, False)]
    # The Trainer's workers, from the same arguments: at the trainer too, declined to where they are built.
    (workers,) = [f for f in scan(Path("train.py"), cwd=folder) if f["rule"] == "TC401"]
    assert workers["severity"] == "info" and workers["line"] == 22
    assert workers["message"].endswith("`dataloader_num_workers` defaults to 0 where its arguments are built")
    assert workers["related"][0]["path"] == "settings.py" and workers["related"][0]["line"] == 9
    assert "built in settings.py:9, another module: set `dataloader_num_workers=" in workers["fix"]["reason"]
    # logging_steps=1: the Trainer reads the loss on the host every step.
    (logging,) = [f for f in scan(Path("settings.py"), cwd=folder) if f["rule"] == "TC601"]
    assert "logs every step (`logging_steps=1`)" in logging["message"] and not logging["fix"]["available"]


# -- the patched scripts train -------------------------------------------------------------------------


def _runnable(folder: Path, entry: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    text = (folder / entry).read_text(encoding="utf-8")
    files = tuple((p.name, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py")) if p.name != entry)
    return text, files


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each fixed fixture and the fixed project, original and patched, run a few steps on the CPU."""
    sys.path.insert(0, str(Path(__file__).parent))
    from oracle.harness import ScriptRun, run_scripts

    runs = []
    pairs = [(name, f"{name}.out.py") for name in FIXED] + [(name, fixed) for name, _, fixed in STRUCTURAL]
    for name, fixed in pairs:
        if missing(*SCRIPTS[name][0]):
            continue
        for label, file in (("original", f"{name}.in.py"), ("patched", fixed)):
            text = (FRAMEWORKS / file).read_text(encoding="utf-8")
            runs.append(ScriptRun(f"{name}-{label}", text, env=OFFLINE, timeout=300))
    if not missing("lightning") and C_COMPILER:
        # The compile the fix guards on CUDA, made on the CPU (Inductor builds C++): Lightning fits the module
        # compiled in place, through its compiled forward.
        text = (FRAMEWORKS / "lightning_named.compiled.py").read_text(encoding="utf-8")
        forced = text.replace("    if torch.cuda.is_available():\n        model.compile()\n",
                              "    model.compile()\n    import torch._dynamo\n")
        forced = forced.replace("    trainer.fit(model, loader())\n", "    trainer.fit(model, loader())\n"
                                "    print('graphs', torch._dynamo.utils.counters['stats']['unique_graphs'])\n"
                                "    print('keys', sorted(model.state_dict())[0])\n")
        assert forced.count("print('graphs'") == 1 and "cuda.is_available():\n        model" not in forced
        runs.append(ScriptRun("lightning_named-compiled-on-cpu", forced, env=OFFLINE, timeout=600))
    workdir = tmp_path_factory.mktemp("frameworks")
    if not missing("transformers"):
        folder = workdir / "hf_args_module"
        shutil.copytree(PROJECTS / "hf_args_module", folder)
        code, _, err = run_cli("fix", ".", "--apply", "--no-exec", "--no-cache", "--isolated", cwd=folder)
        assert code in (0, 1), err
        assert "bf16=torch.cuda.is_available()" in (folder / "settings.py").read_text(encoding="utf-8")
        for label, source in (("original", PROJECTS / "hf_args_module"), ("patched", folder)):
            text, files = _runnable(source, "train.py")
            runs.append(ScriptRun(f"hf_args_module-{label}", text, env=OFFLINE, files=files, timeout=300))
    return run_scripts(runs, workdir / "runs", mode="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", [*FIXED, *(name for name, _, _ in STRUCTURAL), "hf_args_module"])
def test_the_patched_script_trains_with_the_originals_losses(trained, name):
    needs = SCRIPTS[name][0] if name in SCRIPTS else ("transformers",)
    if missing(*needs):
        pytest.skip(f"{', '.join(missing(*needs))} not installed (pip install -e '.[frameworks]')")
    original, patched = trained[f"{name}-original"], trained[f"{name}-patched"]
    assert original.rc == 0, original.explain()
    assert patched.rc == 0, patched.explain()
    assert len(original.losses) >= 3, original.explain()
    assert patched.losses[0] == original.losses[0]
    assert patched.losses == original.losses


@pytest.mark.slow
def test_lightning_fits_a_module_compiled_in_place_with_the_originals_first_loss(trained):
    """What ``fix --compile`` writes for a LightningModule, with the compile made on the CPU: Lightning trains
    through the compiled forward (one graph captured) and the checkpoint keys stay the module's own."""
    if missing("lightning") or not C_COMPILER:
        pytest.skip("lightning or a C compiler (for Inductor's CPU code) is missing")
    original, compiled = trained["lightning_named-original"], trained["lightning_named-compiled-on-cpu"]
    assert compiled.rc == 0, compiled.explain()
    assert "graphs 1" in compiled.stdout and "keys net.0.bias" in compiled.stdout, compiled.explain()
    assert len(compiled.losses) == len(original.losses) >= 3
    assert compiled.losses[0] == pytest.approx(original.losses[0], rel=1e-5)


# -- the model audit reaches the frameworks' models ------------------------------------------------------


@pytest.mark.slow
def test_the_model_audit_builds_a_lightning_module_and_hf_models_from_configs(tmp_path, monkeypatch):
    if missing("lightning", "transformers"):
        pytest.skip(f"{', '.join(missing('lightning', 'transformers'))} not installed (pip install -e '.[frameworks]')")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lightning = (FRAMEWORKS / "lightning_datamodule.in.py").read_text(encoding="utf-8")
    (tmp_path / "lit.py").write_text(lightning.replace("width: int = 64", "width: int = 1001"), encoding="utf-8")
    project = tmp_path / "hf"
    shutil.copytree(PROJECTS / "hf_args_module", project)
    train = (project / "train.py").read_text(encoding="utf-8")
    (project / "train.py").write_text(train.replace("vocab_size=128", "vocab_size=30001"), encoding="utf-8")
    from transformers import GPT2Config

    GPT2Config(vocab_size=50001, n_embd=64, n_layer=1, n_head=2).save_pretrained(str(tmp_path / "ckpt"))
    (tmp_path / "hub.py").write_text(
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
        "if __name__ == '__main__':\n"
        "    model = AutoModelForCausalLM.from_pretrained('my-org/some-private-llm')\n"
        "    local = AutoModelForCausalLM.from_pretrained('./ckpt')\n"
        "    args = TrainingArguments(output_dir='o', bf16=True, dataloader_num_workers=4)\n"
        "    Trainer(model=model, args=args, train_dataset=ds).train()\n"
        "    Trainer(model=local, args=args, train_dataset=ds).train()\n", encoding="utf-8")
    code, out, err = run_cli("scan", "lit.py", "hub.py", "hf/train.py", "--no-cache", "--isolated", "--format", "json",
                             "--select", "TC100,TC101,TC104", cwd=tmp_path)
    assert code in (0, 1), err
    found: dict[tuple, str] = {}
    for f in json.loads(out)["findings"]:
        key = (f["rule"], f["path"], f["line"])
        found[key] = found.get(key, "") + f["message"] + "\n"
    # The LightningModule's own layers, built in the sandbox: 32 → 1001 → 1.
    assert "N=1001 K=32" in found[("TC101", "lit.py", 13)] and "K=1001" in found[("TC101", "lit.py", 13)]
    # A model built inline as the Trainer's model=, from a config of the script.
    assert "vocabulary size 30001" in found[("TC104", "hf/train.py", 22)]
    # A local config.json, and a hub name that would need a download.
    assert "vocabulary size 50001" in found[("TC104", "hub.py", 5)]
    assert ("TC100", "hub.py", 4) in found
    assert not any(rule == "TC100" and path != "hub.py" for rule, path, _ in found)


# -- verify counts the frameworks' own steps -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name, batch", [("lightning_datamodule", 32), ("hf_trainer", 8), ("accelerate_loop", 16)])
def test_the_verify_harness_counts_the_frameworks_own_steps_and_samples(name, batch, tmp_path):
    """Lightning steps its optimizer through a closure, the HF Trainer calls ``model(**batch)`` and steps
    accelerate's wrapped optimizer: the harness sees each optimizer step, each batch and each loss."""
    needs = SCRIPTS[name][0]
    if missing(*needs):
        pytest.skip(f"{', '.join(missing(*needs))} not installed (pip install -e '.[frameworks]')")
    import os
    import subprocess

    text = (FRAMEWORKS / f"{name}.in.py").read_text(encoding="utf-8").replace("max_steps=3", "max_steps=8")
    (tmp_path / "train.py").write_text(text, encoding="utf-8")
    env = {**os.environ, **dict(OFFLINE), "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "tcaudit.verify.harness", "--steps", "3", "--warmup", "1", "--out",
                           str(tmp_path / "run.json"), "train.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["samples"] == [batch] * 4
    assert len(run["step_times"]) == 4
    assert len(run["losses"]) == 4 and all(isinstance(x, float) for x in run["losses"])
