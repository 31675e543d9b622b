"""Every rule's ``[cost]`` table: well formed, sourced from files that exist, quoted by the messages for
the target GPU only, and shown by ``tcaudit explain``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tcaudit.catalog import load_catalog
from tcaudit import gpus
from tcaudit.rules.registry import discover_model_rules, discover_script_rules
from tcaudit.costs import (
    ENTRY_LABELS,
    PUBLISHED_PATHS,
    cost_note,
    figures,
    measured_entries,
    published_ratios,
    rule_cost,
)

from conftest import REPO, run_cli
from helpers import scan_code

CATALOG = load_catalog()
# Documents that live outside the repository and the package: a user cannot open them.
OUTSIDE_DOCS = re.compile(r"\b(PERF|REALWORLD|TRAPS|SPEC|STYLE)\.md\b")
REPO_PATH = re.compile(r"\b(?:benchmarks|fixtures|tcaudit|tests)/[\w./-]*\w")
QUOTE_CALL = re.compile(r"context\.cost\((?:self\.)?spec, \"(\w+)\"\)")


def _user_text(spec) -> str:
    table = rule_cost(spec)
    quoted = [str(table.get("source", ""))] + [f for e in measured_entries(spec).values() for f in figures(e).values()]
    return "\n".join([spec.summary, spec.why, spec.fix_safety, *quoted])


@pytest.mark.parametrize("rule", sorted(CATALOG))
def test_every_rule_has_a_well_formed_cost_table(rule):
    spec = CATALOG[rule]
    table = rule_cost(spec)
    assert isinstance(table.get("source"), str) and table["source"].strip(), f"{rule}: [cost] needs a source"
    unknown = sorted(k for k in table if k not in ("source", "published") and not k.startswith("sm_"))
    assert not unknown, f"{rule}: unknown [cost] keys {unknown}"
    measured_keys = {k for e in measured_entries(spec).values() for k in figures(e)}
    for key, ratio in published_ratios(spec).items():
        assert ratio in PUBLISHED_PATHS, f"{rule}: [cost.published] {key} = {ratio!r} (known: {sorted(PUBLISHED_PATHS)})"
        assert key in measured_keys, f"{rule}: [cost.published] {key} names no measured figure"
    for arch, entry in measured_entries(spec).items():
        assert arch in gpus.archs(), f"{rule}: [cost.{arch}] is not an architecture ({', '.join(gpus.archs())})"
        for label in ENTRY_LABELS:
            assert isinstance(entry.get(label), str) and entry[label], f"{rule}: [cost.{arch}] needs {label}"
        assert figures(entry), f"{rule}: [cost.{arch}] has no figure"
        assert all(figure.strip() for figure in figures(entry).values())


@pytest.mark.parametrize("rule", sorted(CATALOG))
def test_user_text_cites_no_document_outside_the_repo(rule):
    cited = OUTSIDE_DOCS.findall(_user_text(CATALOG[rule]))
    assert not cited, f"{rule} cites {cited}: say the measurement in place or point at a file in the repo"


@pytest.mark.parametrize("rule", sorted(CATALOG))
def test_files_a_cost_source_names_exist(rule):
    for path in REPO_PATH.findall(str(rule_cost(CATALOG[rule]).get("source", ""))):
        assert (REPO / path).exists(), f"{rule}: its [cost] source names {path}, which is not in the repo"


def _quoted_keys() -> dict[str, set[str]]:
    """rule id -> the [cost] keys its module quotes (``context.cost``), script and model rules alike."""
    out: dict[str, set[str]] = {}
    for rule, cls in [*discover_script_rules().items(), *discover_model_rules().items()]:
        source = Path(__import__(cls.__module__, fromlist=["_"]).__file__).read_text(encoding="utf-8")
        keys = set(QUOTE_CALL.findall(source))
        if keys:
            out.setdefault(rule, set()).update(keys)
    return out


QUOTED = _quoted_keys()


def test_the_rules_that_quote_measured_figures():
    assert set(QUOTED) >= {"TC104", "TC201", "TC301", "TC303", "TC305", "TC401", "TC405", "TC601", "TC604"}


# Keys a message quotes that no [cost] entry records yet (the message then quotes nothing). TC305's CUDA-graph
# figure was measured (BENCHMARKS.md: DCGAN with CUDA graphs) but never written into TC305.toml; recording it
# changes TC305's message, which the layout change that found this (its guard now reads `spec` too) must not.
UNRECORDED = {("TC305", "graphs")}


@pytest.mark.parametrize("rule", sorted(QUOTED))
def test_every_quoted_key_is_measured_or_declared_unmeasured(rule):
    spec = CATALOG[rule]
    h200 = measured_entries(spec).get("sm_90")
    for key in sorted(QUOTED[rule]):
        if (rule, key) in UNRECORDED:
            assert cost_note(spec, gpus.target("sm_90"), key) == "", f"{rule} records {key!r} now: drop it from UNRECORDED"
            continue
        if h200 is None:  # nothing measured yet: the source must say so, and no message quotes a number
            assert "not measured" in rule_cost(spec)["source"], rule
            assert cost_note(spec, gpus.target("sm_90"), key) == ""
        else:
            assert key in figures(h200), f"{rule} quotes [cost.sm_90] {key!r}, which its TOML does not have"


def test_no_rule_module_hard_codes_a_throughput():
    rules_dir = REPO / "tcaudit" / "rules"
    assert len(list(rules_dir.rglob("tc*.py"))) > 60
    offenders = [p.name for p in rules_dir.rglob("tc*.py") if re.search(r"\d\s*img/s|\d\s*seq/s", p.read_text("utf-8"))]
    assert not offenders, f"throughput figures belong in the rule's [cost] table: {offenders}"


def _first_finding(tmp_path, rule: str, gpu: str):
    for index, example in enumerate(CATALOG[rule].bad):
        found = [f for f in scan_code(tmp_path, example.code, select=(rule,), name=f"t{index}.py", gpu=gpu).findings
                 if f.rule == rule]
        if found:
            return found[0]
    raise AssertionError(f"no bad example of {rule} fires without the model audit")


@pytest.mark.parametrize("rule", ["TC104", "TC201", "TC303", "TC305", "TC401", "TC405"])
def test_messages_quote_the_target_gpus_figure_only(rule, tmp_path):
    spec = CATALOG[rule]
    [key] = QUOTED[rule] - {k for r, k in UNRECORDED if r == rule}

    def text(finding):  # the figures are in the explanation where the rule's message is short
        return f"{finding.message}\n{finding.explanation}"

    h200 = text(_first_finding(tmp_path, rule, "sm_90"))
    assert f"(H200, torch 2.11: {figures(measured_entries(spec)['sm_90'])[key]})" in h200
    assert text(_first_finding(tmp_path, rule, "auto")) == h200  # auto: the one GPU measured
    # Another GPU: its published figure where [cost.published] names one, else "not measured", and
    # never the H200's number.
    ampere = text(_first_finding(tmp_path, rule, "sm_80"))
    assert "H200" not in ampere and "torch 2.11" not in ampere
    assert ampere == h200.replace(cost_note(spec, gpus.target("sm_90"), key), cost_note(spec, gpus.target("sm_80"), key))
    if key in published_ratios(spec):
        assert "(A100, published, not measured: NVIDIA A100 datasheet" in ampere
    else:
        assert "(A100: not measured on this GPU)" in ampere


# -- explain -----------------------------------------------------------------------------------------------


def test_explain_shows_the_measured_figures_as_plain_text_when_piped():
    code, out, _ = run_cli("explain", "TC303")
    assert code == 0
    section = out.split("## Measured cost\n", 1)[1].split("\n## ", 1)[0]
    assert "Source: tcaudit verify --attribute on one NVIDIA H200" in section
    assert "benchmarks/results/h200/verify_rounds/attribute.json" in section
    assert "- H200 (sm_90), torch 2.11, resnet50: ResNet50 under autocast ran 1.90× faster with channels_last" in section
    assert "┃" not in out and "\x1b[" not in out


def test_explain_of_a_correctness_rule_has_no_figure():
    code, out, _ = run_cli("explain", "TC205")
    section = out.split("## Measured cost\n", 1)[1].split("\n## ", 1)[0]
    assert "Source: correctness, not speed:" in section
    assert "No figure measured on a GPU: messages quote none." in section


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_explain_in_a_terminal_shows_the_cost_table(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    monkeypatch.setenv("COLUMNS", "160")
    from tcaudit.cli.main import main

    assert main(["explain", "TC604"]) == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    assert "Measured cost (TC604)" in out
    header = next(line for line in out.splitlines() if "GPU" in line and "figure" in line)
    assert header.startswith("┃")
    assert "H200 (sm_90)" in out and "an M of 8191 ran 1.00–1.13× the time of 8192" in out
    assert "Source: tcaudit calibrate on one NVIDIA H200" in out
    # The rest of the page is the piped text: headings and code examples keep their lines.
    assert "## Why is this bad?" in out and "## Fix safety" in out
    assert 'parser.add_argument("--batch-size", type=int, default=100)' in out.splitlines()
    assert "## Measured cost" not in out  # the table replaces the text section


def test_explain_keeps_brackets_in_a_figure(monkeypatch):
    """A figure is text, not rich markup: an interval such as [2.56, 2.58] must survive."""
    from tcaudit import explain

    spec = CATALOG["TC604"]
    entries = {"sm_90": {"gpu": "H200", "torch": "2.11", "batch": "1.90× [1.86, 1.95]"}}
    monkeypatch.setattr(explain, "measured_entries", lambda s: entries)
    stream = _Terminal()
    explain.print_explanation(spec, stream)
    assert "1.90× [1.86, 1.95]" in stream.getvalue()
    assert "- H200 (sm_90), torch 2.11, batch: 1.90× [1.86, 1.95]" in explain.render_explanation(spec)


def test_model_rules_figures_agree_with_the_calibrated_table():
    """The TC1 tables repeat `tcaudit calibrate`'s H200 numbers: they must not drift from the file."""
    import json

    entry = json.loads((REPO / "benchmarks/results/h200/calibrate.json").read_text("utf-8"))["gpus"]["sm_90"]
    gemm = entry["gemm"]
    expected = {
        ("TC101", "odd_k"): gemm["k_unaligned"]["2"],
        ("TC101", "odd_n"): gemm["n_unaligned"]["2"],
        ("TC101", "n_multiple_of_4"): gemm["n_unaligned"]["8"],
        ("TC104", "gpt2_head"): gemm["n_unaligned"]["2"],
        ("TC104", "multiple_of_8"): gemm["not_multiple_of_64"],
        ("TC105", "odd_m"): gemm["m_unaligned"],
        ("TC102", "channels"): entry["conv"]["channels_unaligned"],
        ("TC106", "head_dim"): entry["sdpa"]["head_dim_unsupported"],
    }
    for (rule, key), ratio in expected.items():
        figure = figures(measured_entries(CATALOG[rule])["sm_90"])[key]
        assert f"{ratio:.2f}×" in figure, (rule, key, figure, ratio)


def test_explain_of_a_model_rule_says_its_messages_read_the_audits_cost_table():
    _, out, _ = run_cli("explain", "TC106")
    section = out.split("## Measured cost\n", 1)[1].split("\n## ", 1)[0]
    assert "- H200 (sm_90), torch 2.11, head_dim: head dim 60 ran 2.63× slower per FLOP than 64" in section
    assert "The model audit's messages quote its cost table for the target GPU" in section
