"""Scan every .py file of the installed torch, torchvision and libcst packages with all rules.

Library code is the harshest precision test there is: thousands of files with backward calls,
`.item()`, DistributedDataParallel and DataLoaders that are not training scripts. No rule may crash
or raise an internal error on any of them, and the TC5/TC6 findings are pinned per rule and file:
each one below was reviewed by hand, so a change in these rules' precision (a new false alarm, or a
finding lost) shows up here, in review. Counts of the other families are not pinned.

The torch scan parses about 900 of its 2,400 files and takes several minutes on a 2-core machine
(most of it LibCST parsing), hence the ``slow`` mark; it still runs in the default suite.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import scan

# The versions the pins below were reviewed against.
REVIEWED_VERSIONS = {"torch": "2.14.1", "torchvision": "0.29.1", "libcst": "1.9.0"}

# (rule, file relative to the package) → number of findings, for TC5 and TC6 only.
EXPECTED: dict[str, dict[tuple[str, str], int]] = {
    "torch": {
        # ddp_setup() initialises gloo while run_ddp() trains a .cuda() model under DDP with
        # device_ids=[rank]: a real gloo-on-CUDA case.
        ("TC506", "testing/_internal/common_quantization.py"): 1,
        # run_ddp()'s DistributedDataParallel(prepared, device_ids=[rank]), and the DDP-wrapped
        # layers of the HybridModel used by the DDP-under-RPC trainers: DDP built without
        # gradient_as_bucket_view=True, which is what the rule reports. (The ~90 DDP constructions
        # inside DistributedTest / TestCase classes are unit tests exercising DDP on purpose and
        # are not reported.)
        ("TC502", "testing/_internal/common_quantization.py"): 1,
        ("TC502", "testing/_internal/distributed/ddp_under_dist_autograd_test.py"): 2,
    },
    # torchvision ships models and transforms, not training loops; libcst has no torch at all.
    "torchvision": {},
    "libcst": {},
}


def _package_dir(name: str) -> Path:
    # find_spec of a top-level package locates it without importing it.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.mark.slow
@pytest.mark.parametrize("package", ["libcst", "torchvision", "torch"])
def test_corpus_scan_is_clean_and_tc5_tc6_findings_are_pinned(package):
    root = _package_dir(package)
    result = scan([str(root)], Settings(select=("ALL",), root=root), model_audit=False)

    assert result.files_scanned > 100, f"found only {result.files_scanned} files under {root}"
    assert not result.errors, "\n\n".join(result.errors[:5])

    found = Counter(
        (f.rule, Path(f.location.path).resolve().relative_to(root.resolve()).as_posix())
        for f in result.findings
        if f.rule.startswith(("TC5", "TC6"))
    )
    version = importlib.metadata.version(package)
    assert dict(found) == EXPECTED[package], (
        f"TC5/TC6 findings on {package} {version} changed (pins reviewed on "
        f"{REVIEWED_VERSIONS[package]}): review each new or lost finding and update EXPECTED.\n"
        + "\n".join(
            f"{f.rule} {f.location.path}:{f.location.line}: {f.source_line.strip()}"
            for f in result.findings
            if f.rule.startswith(("TC5", "TC6"))
        )
    )
