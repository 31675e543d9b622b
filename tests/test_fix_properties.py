"""Property test: training scripts composed from the TRAPS.md shapes, fixed with every rule.

For any composition the fix output parses and compiles, a second fix changes nothing, the file's
line endings survive, and regions no rule touches (marker comments, the header, the code after the
loop) stay byte-identical.
"""

from __future__ import annotations

import libcst as cst
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

IMPORTS = [
    "import torch\nimport torch.nn as nn\n",
    "import torch\nfrom torch import nn, optim\n",
    "import torch\nimport torch.nn as nn\nfrom torch.cuda.amp import autocast, GradScaler\n",
    "import torch\nimport torch.nn as nn\ntry:\n    from torch.amp import autocast\nexcept ImportError:\n    from torch.cuda.amp import autocast\n",
]
DEVICES = [
    'device = "cuda" if torch.cuda.is_available() else "cpu"\n',
    'device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")\n',
    "device = 0\n",
]
MODELS = [
    "model = nn.Linear(16, 16).to(device)\n",
    "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).to(device)\n",
    "model = Net().cuda()\n",
]
OPTIMIZERS = [
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n",
]
EXTRAS = [
    "",
    "torch._C._jit_set_profiling_executor(True)\n",
    "# r\u00e9glages sp\u00e9ciaux \u2014 non-ASCII comment\n",
    "torch.backends.cudnn.benchmark = True\n",
]


@st.composite
def loop_bodies(draw):
    amp = draw(st.sampled_from(["none", "autocast_bf16", "autocast_fp16_scaler", "deprecated"]))
    clip = draw(st.booleans())
    backward_inside = draw(st.booleans())
    semicolons = draw(st.booleans())
    accumulate = draw(st.booleans())
    lines = ["for i, (x, y) in enumerate(loader):", "    x, y = x.to(device), y.to(device)"]
    forward = ["out = model(x)", "loss = nn.functional.mse_loss(out, y)"]
    if semicolons:
        forward = ["; ".join(forward)]
    if amp == "none":
        lines += ["    " + f for f in forward]
        lines.append("    loss.backward()")
        backward = None
    else:
        ctx = {
            "autocast_bf16": 'torch.autocast("cuda", dtype=torch.bfloat16)',
            "autocast_fp16_scaler": 'torch.autocast("cuda", dtype=torch.float16)',
            "deprecated": "torch.cuda.amp.autocast()",
        }[amp]
        lines.append(f"    with {ctx}:")
        lines += ["        " + f for f in forward]
        backward = "scaler.scale(loss).backward()" if amp != "autocast_bf16" else "loss.backward()"
        lines.append(("        " if backward_inside else "    ") + backward)
    indent = "    "
    if accumulate:
        lines.append("    if (i + 1) % 2 == 0:")
        indent = "        "
    if clip:
        lines.append(indent + "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
    if backward is not None and "scaler" in backward:
        lines += [indent + "scaler.step(optimizer)", indent + "scaler.update()"]
    else:
        lines.append(indent + "optimizer.step()")
    lines.append(indent + "optimizer.zero_grad()")
    scaler_line = ""
    if backward is not None and "scaler" in backward:
        scaler_line = "scaler = torch.cuda.amp.GradScaler()\n" if amp == "deprecated" else 'scaler = torch.amp.GradScaler("cuda")\n'
    return scaler_line, "\n".join(lines) + "\n"


@st.composite
def scripts(draw):
    parts = ["# marker-head: keep me\n", draw(st.sampled_from(IMPORTS)), draw(st.sampled_from(EXTRAS)),
             draw(st.sampled_from(DEVICES)), draw(st.sampled_from(MODELS)), draw(st.sampled_from(OPTIMIZERS))]
    scaler_line, body = draw(loop_bodies())
    parts += [scaler_line, "# marker-before-loop: keep me\n", body,
              "# marker-tail: keep me\n", 'print("done")\n']
    text = "".join(parts)
    if draw(st.booleans()):
        text = text.replace("    ", "\t")
    crlf = draw(st.booleans())
    return text.replace("\n", "\r\n") if crlf else text, crlf


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scripts())
def test_fix_output_is_valid_idempotent_and_local(tmp_path_factory, script):
    text, crlf = script
    folder = tmp_path_factory.mktemp("prop")
    path = folder / "train.py"
    path.write_bytes(text.encode("utf-8"))
    result = fix_file(path, Settings())
    assert result.error is None
    fixed = result.fixed
    cst.parse_module(fixed)
    compile(fixed, "train.py", "exec")
    for marker in ("# marker-head: keep me", "# marker-before-loop: keep me", "# marker-tail: keep me",
                   'print("done")'):
        assert marker in fixed
    newline = "\r\n" if crlf else "\n"
    assert fixed.startswith("# marker-head: keep me" + newline)
    assert fixed.endswith("# marker-tail: keep me" + newline + 'print("done")' + newline)
    if crlf:
        assert "\n" not in fixed.replace("\r\n", "")
    again = folder / "again.py"
    again.write_bytes(result.source.encode(fixed))
    second = fix_file(again, Settings())
    assert second.error is None
    assert not second.changed, second.diff()
