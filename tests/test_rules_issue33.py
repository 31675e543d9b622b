"""Issue 33: TC315 checkpoint-use-reentrant, TC316 requires-grad-typo, TC317 torch-load-weights-only.

Positive and near-miss cases on small scripts, the exact fixed text (compiled, and run where cheap on
CPU), and the declined fixes with their reasons."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.fix.engine import fix_file

FIX_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"


def _hits(tmp_path, code, rule):
    return [f for f in scan_code(tmp_path, code, select=(rule,)).findings if f.rule == rule]


def _fixed(tmp_path, code, rule) -> str:
    path = tmp_path / "fixme.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    result = fix_file(path, Settings(select=(rule,)))
    assert result.error is None
    compile(result.fixed, str(path), "exec")
    return result.fixed


# -- TC315 checkpoint-use-reentrant ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [
    "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x)\n",
    "from torch.utils.checkpoint import checkpoint as ckpt\ny = ckpt(f, x)\n",
    "import torch.utils.checkpoint as cp\ny = cp.checkpoint(f, x)\n",
    "import torch\ny = torch.utils.checkpoint.checkpoint(f, x, preserve_rng_state=False)\n",
    "from torch.utils import checkpoint\ny = checkpoint.checkpoint(f, x)\n",
    "from torch.utils.checkpoint import checkpoint_sequential\ny = checkpoint_sequential(layers, 2, x)\n",
])
def test_tc315_flags_torch_checkpoint_without_use_reentrant(tmp_path, code):
    [hit] = _hits(tmp_path, code, "TC315")
    assert hit.severity is Severity.WARNING
    assert hit.fix.fix_class is FixClass.NUMERICS and hit.fix.available
    assert len(hit.message) <= 120 and "use_reentrant" in hit.explanation


@pytest.mark.parametrize("code", [
    "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x, use_reentrant=False)\n",
    "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x, use_reentrant=True)\n",
    "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x, use_reentrant=args.reentrant)\n",
    "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x, **kw)\n",
    # the user's own function, never imported from torch
    "import torch\ndef checkpoint(model, path):\n    torch.save(model.state_dict(), path)\ncheckpoint(m, 'a.pt')\n",
    # torch's imported, then shadowed by a function of the file
    "from torch.utils.checkpoint import checkpoint\ndef checkpoint(m, p):\n    pass\ncheckpoint(m, 'a.pt')\n",
    # a parameter of the calling function
    "from torch.utils.checkpoint import checkpoint\ndef run(checkpoint, m):\n    checkpoint(m, 'a.pt')\n",
    # torch.utils.checkpoint the module, called (a bug of its own, not this rule's)
    "import torch\nm = torch.utils.checkpoint(block)\n",
    # a trainer's method called checkpoint
    "import torch\ntrainer.checkpoint(model, 'a.pt')\n",
])
def test_tc315_near_misses_stay_silent(tmp_path, code):
    assert _hits(tmp_path, code, "TC315") == []


def test_tc315_method_of_the_same_name_does_not_shadow(tmp_path):
    code = """
    from torch.utils.checkpoint import checkpoint


    class Trainer:
        def checkpoint(self, path):
            pass


    def forward(block, x):
        return checkpoint(block, x)
    """
    assert len(_hits(tmp_path, code, "TC315")) == 1


def test_tc315_fix_output_exactly(tmp_path):
    code = """
    import torch.utils.checkpoint as cp
    from torch.utils.checkpoint import checkpoint

    a = cp.checkpoint(block, x)
    b = checkpoint(
        block,
        a,
    )
    """
    assert _fixed(tmp_path, code, "TC315") == textwrap.dedent("""
    import torch.utils.checkpoint as cp
    from torch.utils.checkpoint import checkpoint

    a = cp.checkpoint(block, x, use_reentrant=False)
    b = checkpoint(
        block,
        a,
        use_reentrant=False,
    )
    """).lstrip("\n")


# -- TC316 requires-grad-typo ---------------------------------------------------------------------------


@pytest.mark.parametrize("typo", ["require_grad", "requires_grads", "require_grads", "requires_gard",
                                  "requieres_grad", "reqires_grad"])
def test_tc316_flags_each_misspelling(tmp_path, typo):
    code = f"import torch\nfor p in model.parameters():\n    p.{typo} = False\n"
    [hit] = _hits(tmp_path, code, "TC316")
    assert hit.severity is Severity.WARNING and hit.fix.fix_class is FixClass.NUMERICS
    assert len(hit.message) <= 120
    assert _fixed(tmp_path, code, "TC316") == "import torch\nfor p in model.parameters():\n    p.requires_grad = False\n"


def test_tc316_method_form_and_tuple_targets(tmp_path):
    code = "import torch\nmodel.encoder.require_grad_(False)\na.require_grad, b.require_grad = False, False\n"
    hits = _hits(tmp_path, code, "TC316")
    assert sorted(f.location.line for f in hits) == [2, 3, 3]
    assert _fixed(tmp_path, code, "TC316") == (
        "import torch\nmodel.encoder.requires_grad_(False)\na.requires_grad, b.requires_grad = False, False\n"
    )


@pytest.mark.parametrize("code", [
    # spelt right
    "import torch\nfor p in m.parameters():\n    p.requires_grad = False\nm.requires_grad_(False)\n",
    # no torch in the file
    "for p in m.parameters():\n    p.require_grad = False\n",
    # a dataclass field of that name
    "import torch\nfrom dataclasses import dataclass\n@dataclass\nclass C:\n    require_grad: bool = True\n"
    "c = C()\nc.require_grad = False\n",
    # a class attribute
    "import torch\nclass C:\n    requires_grads = True\nc = C()\nc.requires_grads = False\n",
    # set on self inside a class
    "import torch\nclass A:\n    def __init__(self):\n        self.require_grad = True\na = A()\na.require_grad = False\n",
    # a keyword argument of that name
    "import torch\ncfg = make_config(require_grad=True)\ncfg.require_grad = False\n",
    # a parameter of that name
    "import torch\ndef build(require_grad=False):\n    pass\nopts.require_grad = True\n",
    # read somewhere: the user's own object
    "import torch\nopts.require_grad = True\nif opts.require_grad:\n    pass\n",
    # spelt in a string
    "import torch\nopts.require_grad = True\nflag = getattr(opts, 'require_grad')\n",
    # the user's own method
    "import torch\nclass M:\n    def require_grad_(self, flag):\n        pass\nM().require_grad_(False)\n",
])
def test_tc316_near_misses_stay_silent(tmp_path, code):
    assert _hits(tmp_path, code, "TC316") == []


# -- TC317 torch-load-weights-only ----------------------------------------------------------------------


def test_tc317_is_info_and_fixes_plain_state_dicts(tmp_path):
    code = """
    import torch
    from torch import load

    model.load_state_dict(torch.load(path))
    model.load_state_dict(state_dict=torch.serialization.load(path))
    sd = load(path, map_location="cpu")
    model.load_state_dict(sd)
    ema.load_state_dict(sd)
    """
    hits = _hits(tmp_path, code, "TC317")
    assert len(hits) == 3
    assert all(h.severity is Severity.INFO and h.fix.fix_class is FixClass.SAFE and h.fix.available for h in hits)
    assert all(len(h.message) <= 120 and "2.6" in h.explanation for h in hits)
    assert _fixed(tmp_path, code, "TC317") == textwrap.dedent("""
    import torch
    from torch import load

    model.load_state_dict(torch.load(path, weights_only=True))
    model.load_state_dict(state_dict=torch.serialization.load(path, weights_only=True))
    sd = load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(sd)
    ema.load_state_dict(sd)
    """).lstrip("\n")


@pytest.mark.parametrize("code,reason", [
    ("import torch\nckpt = torch.load(p)\nmodel.load_state_dict(ckpt['model'])\n", "indexed for its entries"),
    ("import torch\nmodel.load_state_dict(torch.load(p)['model'])\n", "not known to be a state dict"),
    ("import torch\ndata = torch.load(p)\nx, y = data\n", "not known to be a state dict"),
    ("import torch\nsd = torch.load(p)\nmodel.load_state_dict(sd)\nprint(sd.keys())\n", "not known to be a state dict"),
    ("import torch\nx, y = torch.load(p)\n", "not known to be a state dict"),
])
def test_tc317_declines_where_the_object_is_not_known_to_be_a_state_dict(tmp_path, code, reason):
    [hit] = _hits(tmp_path, code, "TC317")
    assert not hit.fix.available and reason in hit.fix.reason
    assert _fixed(tmp_path, code, "TC317") == code


@pytest.mark.parametrize("code", [
    "import torch\nsd = torch.load(p, weights_only=True)\n",
    "import torch\nsd = torch.load(p, map_location='cpu', weights_only=False)\n",
    "import torch\nsd = torch.load(p, weights_only=args.safe)\n",
    "import torch\nsd = torch.load(p, **load_kwargs)\n",
    "import json, pickle\ncfg = json.load(f)\nvocab = pickle.load(g)\n",
    "import numpy as np\na = np.load('x.npy')\n",
    "import torch\ndef load(p):\n    return open(p).read()\ntext = load('notes.txt')\n",
])
def test_tc317_near_misses_stay_silent(tmp_path, code):
    assert _hits(tmp_path, code, "TC317") == []


# -- the fix fixtures: the patched scripts run on CPU ----------------------------------------------------


@pytest.mark.parametrize("name", ["tc315_checkpointed_gpt", "tc316_freeze_backbone", "tc317_resume_and_finetune"])
def test_patched_fixture_runs_on_cpu(tmp_path, name):
    pytest.importorskip("torch")
    script = tmp_path / "patched.py"
    script.write_bytes((FIX_FIXTURES / f"{name}.out.py").read_bytes())
    proc = subprocess.run(
        [sys.executable, "-W", "error:torch.utils.checkpoint:UserWarning", str(script), "--steps", "2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 1 loss" in proc.stdout
    if name == "tc316_freeze_backbone":
        assert "trainable 0" in proc.stdout  # the backbone is frozen now


def test_tc315_rebinding_in_another_function_does_not_shadow(tmp_path):
    code = """
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint


    class Net(nn.Module):
        def forward(self, x):
            return checkpoint(self.block, x)


    def resume(model, path):
        checkpoint = torch.load(path, weights_only=True)
        model.load_state_dict(checkpoint["model"])


    class Trainer:
        def step(self, x):
            checkpoint = self.make_checkpoint_fn()
            return checkpoint(x)
    """
    assert [f.location.line for f in _hits(tmp_path, code, "TC315")] == [8]
