"""The model audit reaches the models real scripts build (issue 19): every device maps to the fake
device, registries / classmethods / sibling packages / wrappers build, no model is dropped (a
per-scan budget instead of a cap), warm scans come from the model cache, TC100 is one line.

The end-to-end audit runs once per module (one scan of a few benchmark scripts, then a warm one);
the cap, budget and message tests need no torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import REPO
from tcaudit.cache import ScanCache
from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.engine import report, run_model_audit
from tcaudit.model import ModelAuditResult, collect_jobs, discover_file
from tcaudit.model.facts import CaptureInfo, ModelFacts
from tcaudit.rules.registry import discover_model_rules
from tcaudit.model.sandbox import Limits
from tcaudit.source.parsing import read_source

BENCH = REPO / "benchmarks" / "model_coverage" / "scripts"
DEVICE_SCRIPTS = [
    "d01_torch_device_cuda.py",  # torch.device("cuda")
    "d03_device_cuda0.py",  # "cuda:0" and a buffer made on it
    "d04_device_index.py",  # .to(0)
    "d05_device_type_index.py",  # torch.device("cuda", local_rank)
    "d06_args_device.py",  # args.device
    "d07_current_accelerator.py",  # torch.accelerator.current_accelerator()
    "m03_seq_model_device_attr.py",  # a mask made on self.device in forward
]
FORM_SCRIPTS = [
    "f01_dict_registry.py",  # MODELS[args.model](...)
    "f05_getattr_module_name.py",  # make(name) -> getattr(sys.modules[__name__], name)()
    "f07_from_config_classmethod.py",  # Net.from_config(CONFIG)
    "w02_ddp_main.py",  # DDP after init_process_group
    "w04_compile_inline.py",  # torch.compile(Net().to(device))
    "w06_factory_returns_wrapped.py",  # a factory returns torch.compile(DataParallel(Net()))
]
PACKAGE = "s01_pkg_relative"  # models/ package with relative imports


@pytest.fixture(scope="module", autouse=True)
def packaged_cost_table(tmp_path_factory):
    """No user cost table, and one user cache folder for the whole module (set before the module's
    shared scans run), so that the key sealing the model cache's entries is the same user's in every
    test, as it is from one scan to the next."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TCAUDIT_COST_TABLE", raising=False)
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        yield


def sources_of(paths: list[Path]):
    return [read_source(p, p.name) for p in paths]


def tc100(result: ModelAuditResult) -> list[str]:
    return [f"{f.location.path}: {f.message}" for f in result.findings if f.rule == "TC100"]


# -- without torch: discovery, the cap, the budget, the message --------------------------------


@pytest.mark.parametrize(("script", "label"), [
    ("f01_dict_registry.py", "MODELS[args.model](num_classes=10)"),
    ("f05_getattr_module_name.py", "make(MODEL_NAME)"),
    ("f06_lambda_registry.py", "ARCHS[arch]()"),  # not the lambdas' bodies: the lookup runs one
    ("f07_from_config_classmethod.py", "BagOfEmbeddings.from_config(CONFIG)"),
])
def test_registries_and_alternate_constructors_are_found(script, label):
    found = discover_file(read_source(BENCH / script, script))
    assert [(target["label"], failure) for target, failure, _ in found] == [(label, None)]


def test_a_static_method_returning_a_config_object_is_not_a_construction(tmp_path):
    """minGPT: ``GPT.get_default_config()`` returns a CfgNode; ``GPT(config)`` is the model."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\n\nclass CfgNode:\n    pass\n\n"
        "class GPT(nn.Module):\n"
        "    @staticmethod\n    def get_default_config():\n        C = CfgNode()\n        return CfgNode()\n\n"
        "    @classmethod\n    def defaults(cls):\n        return {'n_layer': 2}\n\n"
        "    @classmethod\n    def small(cls):\n        return cls(GPT.get_default_config())\n\n"
        "    def __init__(self, config):\n        super().__init__()\n        self.fc = nn.Linear(8, 8)\n\n"
        "config = GPT.get_default_config()\ndefaults = GPT.defaults()\nmodel = GPT(config)\nsmall = GPT.small()\n"
    )
    found = discover_file(read_source(script, "train.py"))
    assert sorted(target["label"] for target, _, _ in found) == ["GPT(config)", "GPT.small()"]


def test_a_model_that_is_passed_in_is_not_a_construction(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\n\ndef prepare(model):\n    return model\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 8)\n\n"
        "model = Net()\nmodel = prepare(model)\n",
        encoding="utf-8",
    )
    assert [target["label"] for target, _, _ in discover_file(read_source(script, "train.py"))] == ["Net()"]


@pytest.fixture(scope="module")
def twenty_scripts(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("twenty")
    paths = []
    for number in range(20):
        path = folder / f"train_{number:02d}.py"
        path.write_text(
            "import torch\nimport torch.nn as nn\n\n"
            f"model = nn.Sequential(nn.Linear({64 + number}, 128), nn.ReLU(), nn.Linear(128, 10)).to(torch.device('cuda'))\n",
            encoding="utf-8",
        )
        paths.append(path)
    return paths


def test_twenty_models_are_twenty_jobs(twenty_scripts):
    result = ModelAuditResult()
    jobs, static, _ = collect_jobs(sources_of(twenty_scripts), Settings(), "bfloat16", Limits(), result)
    assert (len(jobs), static, result.notes) == (20, [], [])


def test_models_past_the_budget_are_reported_not_dropped(twenty_scripts):
    result = run_model_audit(sources_of(twenty_scripts[:3]), Settings(select=("TC1",), model_budget=0))
    assert [(f.rule, f.severity, f.location.path) for f in result.findings] == [
        ("TC100", Severity.INFO, p.name) for p in twenty_scripts[:3]
    ]
    message = result.findings[0].message + " " + result.findings[0].explanation
    assert "model-audit budget of 0 s was spent" in message and "--model-budget" in message
    assert len(result.findings[0].message) <= 120
    assert "\n" not in message


def _report(facts: ModelFacts, **settings) -> list:
    result = ModelAuditResult()
    rules = [cls() for rule_id, cls in discover_model_rules().items() if rule_id == "TC100"]
    report([facts], rules, Settings(select=("TC100",), **settings), [], result)
    return result.findings


TARGET = {"kind": "script", "path": "/p/train.py", "label": "Net()", "construction": {"line": 3, "column": 9}}


@pytest.mark.parametrize("verbose", [False, True])
def test_tc100_is_one_line_and_names_what_helps(verbose):
    reason = "building the model failed at train.py:3 (`Net()`): RuntimeError: first line\n  second line\n  third"
    [built] = _report(ModelFacts.failed(TARGET, reason), verbose=verbose)
    traced = ModelFacts(target=TARGET, model_class="Net", capture=CaptureInfo(method="parameters", failures=[
        "export: RuntimeError: shape mismatch\nwhile tracing", "dynamo: Unsupported: y", "fx: TraceError: z"]))
    [trace] = _report(traced, verbose=verbose)
    for finding in (built, trace):
        assert "\n" not in finding.message
    assert "[[tool.tcaudit.models]] or --model pkg.mod:factory" in built.message + built.explanation
    assert "--input 8x3x224x224" in trace.message + trace.explanation
    assert ("second line" in built.message) is verbose
    assert ("dynamo" in trace.message) is verbose
    if not verbose:
        assert trace.message == "could not trace `Net()` (RuntimeError: shape mismatch); only parameter checks ran"
        assert len(built.message) <= 120 and len(trace.message) <= 120


# -- with torch: one cold scan and one warm scan, shared ---------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    for name in DEVICE_SCRIPTS + FORM_SCRIPTS:
        shutil.copy(BENCH / name, folder / name)
    shutil.copytree(BENCH / PACKAGE, folder / PACKAGE)
    return folder


def _entries(folder: Path) -> list[Path]:
    return [folder / n for n in DEVICE_SCRIPTS + FORM_SCRIPTS] + [folder / PACKAGE / "train.py"]


@pytest.fixture(scope="module")
def scans(project, tmp_path_factory):
    pytest.importorskip("torch")
    settings = Settings(select=("TC1",), root=project)
    cache = ScanCache.open(tmp_path_factory.mktemp("cache"), settings, settings.enabled_rules())
    cold = run_model_audit(sources_of(_entries(project)), settings, scan_cache=cache)
    warm = run_model_audit(sources_of(_entries(project)), settings, scan_cache=cache)
    return cold, warm, cache, settings


def test_every_device_form_and_package_is_audited(scans):
    cold, _, _, _ = scans
    assert not cold.errors and tc100(cold) == []
    audited = {Path(f.target["path"]).name if "s01" not in f.target["path"] else PACKAGE: f.capture.method
               for f in cold.facts}
    assert set(audited) == {*DEVICE_SCRIPTS, *FORM_SCRIPTS, PACKAGE}
    assert all(f.status == "ok" and f.capture.method != "parameters" for f in cold.facts), [
        (f.target["label"], f.status, f.reason, f.capture.failures) for f in cold.facts if f.status != "ok"
    ]


def test_the_package_layers_are_found_in_its_sibling_modules(scans):
    cold, _, _, _ = scans
    [facts] = [f for f in cold.facts if PACKAGE in f.target["path"]]
    assert facts.model_class == "PreActNet"
    assert any(path.endswith("models/blocks.py") for path in facts.depends_on)


def test_a_warm_scan_builds_nothing_and_finds_the_same(scans):
    cold, warm, _, _ = scans
    assert (cold.cached, warm.cached) == (0, len(cold.facts))
    assert [(f.rule, f.location.path, f.location.line, f.message) for f in warm.findings] == [
        (f.rule, f.location.path, f.location.line, f.message) for f in cold.findings
    ]


def test_editing_a_sibling_module_rebuilds_only_its_model(scans, project):
    cold, _, cache, settings = scans
    blocks = project / PACKAGE / "models" / "blocks.py"
    blocks.write_text(blocks.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    again = run_model_audit(sources_of(_entries(project)), settings, scan_cache=cache)
    assert again.cached == len(cold.facts) - 1
    assert tc100(again) == []


def test_transformers_from_pretrained_is_built_from_its_config():
    """A hub name maps to construction from a config (never a download); without transformers the
    TC100 reason says so in one line."""
    import importlib.util

    [(target, failure, _)] = discover_file(read_source(BENCH / "h01_hf_causal_lm.py", "h01_hf_causal_lm.py"))
    assert target["label"] == "AutoModelForCausalLM.from_pretrained(args.model_name)"
    if importlib.util.find_spec("transformers") is None:
        assert failure == ("it needs transformers, which is not installed here, so the model cannot be "
                           "resolved offline")
    else:
        assert failure is None
        [model_item] = [item for item in target["program"] if item["t"] == "model"]
        assert model_item["from_config"] is True
