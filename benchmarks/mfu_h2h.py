"""MFU of every head-to-head row in BENCHMARKS.md (issue 52, item 3), derived on the CPU: the model audit's
training FLOPs per sample of each realworld script (3x its forward, as ``tcaudit verify`` now reports them)
times the samples/s each side measured in the committed verify.json, over the H200's published dense
BF16/FP16 peak (tcaudit/data/gpus.toml; both sides of a head-to-head train in half precision).

    python benchmarks/mfu_h2h.py > benchmarks/results/h200/mfu_h2h.json

The audit builds each script's model from its own defaults; a run whose arguments change the model
(imagenet_style's ``-a resnet50`` over its default resnet18) is audited through the fixture that builds the
same model (fixtures/resnet50/train.py: ResNet50 at 224x224), named in the row. DCGAN's head-to-head has
no row: the audit builds its discriminator on an assumed 224x224 input (the script feeds it 64x64), so its
FLOPs per sample would be some 8x too many.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tcaudit import gpus
from tcaudit.config import Settings
from tcaudit.verify.copies import audited_models
from tcaudit.verify.runner import training_flops_per_sample

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "h200"
ROWS = [  # (verify.json of the head-to-head, the script the audit builds the model from)
    ("realworld_2026-12-01/vit_classifier_h2h_verify.json", "benchmarks/realworld/vit_classifier.py"),
    ("realworld_2026-12-01/unet_seg_h2h_verify.json", "benchmarks/realworld/unet_seg.py"),
    ("realworld_2026-12-01/imagenet_style_h2h_verify.json", "fixtures/resnet50/train.py"),
    ("realworld_2026-12-04/imagenet_style_h2h_verify.json", "fixtures/resnet50/train.py"),
    ("realworld_2026-12-04/gpt_manual_attention_h2h_3rounds_verify.json",
     "benchmarks/realworld/gpt_manual_attention.py"),
    ("realworld_2026-12-04/resnet50_fixture_h2h_verify.json", "fixtures/resnet50/train.py"),
]


def main() -> None:
    peak = gpus.gpus()["h200"].half
    rows = []
    for result, script in ROWS:
        data = json.loads((RESULTS / result).read_text())
        flops = training_flops_per_sample(audited_models(REPO / script, Settings(root=REPO)))
        row = {"verify": f"benchmarks/results/h200/{result}", "model_from": script, "gpu": data["gpu"],
               "training_gflop_per_sample": None if flops is None else flops / 1e9, "peak_tflops": peak}
        for side, label in (("original", "patch"), ("patched", "ceiling")):
            samples = data[side]["samples_per_s"]
            row[label] = {"samples_per_s": samples}
            if flops is not None:
                row[label]["tflops"] = flops * samples / 1e12
                row[label]["mfu"] = flops * samples / 1e12 / peak
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"method": __doc__.split("\n\n")[0], "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
