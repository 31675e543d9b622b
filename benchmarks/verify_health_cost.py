"""What ``verify --health`` costs: the same training script under the harness with health off and on.

    python benchmarks/verify_health_cost.py [--rounds 5 --steps 30 --warmup 5] [--model resnet18|mlp|resnet50_cuda]
                                            [--out FILE]

Each round runs the harness twice (off, on; the order alternating per round), each a fresh process, on
a small CPU training script written to a temporary folder (torchvision's resnet18 on 16 random
64x64 images, or a 4-layer MLP; ``resnet50_cuda`` is the patched ResNet50 step at batch 256 on a GPU).
Prints the median step time of each side and the on/off ratio with the same t-interval verify uses,
as JSON (also to ``--out``); CPU numbers go to BENCHMARKS.md labelled CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tcaudit.verify.stats import ratio_interval  # noqa: E402

SCRIPTS = {
    "resnet18": """
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()
x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
for step in range(10_000):
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    # The GPU case: the patched ResNet50 step (bf16 autocast, channels_last) on a batch kept on the GPU.
    "resnet50_cuda": """
import torch, torchvision
torch.manual_seed(0)
torch.backends.cudnn.benchmark = True
model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()
x = torch.randn(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (256,), device="cuda")
for step in range(10_000):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
""",
    "mlp": """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024)
for step in range(10_000):
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
}


def run(script: Path, out: Path, steps: int, warmup: int, health: bool) -> float:
    command = [sys.executable, "-m", "tcaudit.verify.harness", "--steps", str(steps), "--warmup", str(warmup),
               "--out", str(out), *(["--health"] if health else []), str(script)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    data = json.loads(out.read_text())
    return statistics.median(data["step_times"][warmup:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", choices=sorted(SCRIPTS), default="resnet18")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPTS[args.model])
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for health in ((False, True) if r % 2 == 0 else (True, False)):
                times[health].append(run(script, Path(tmp) / f"{health}.{r}.json", args.steps, args.warmup, health))
    # Step time on over step time off, paired by round: above 1.0 is the cost of health.
    interval = ratio_interval(times[True], times[False])
    device = "CPU"
    if args.model.endswith("_cuda"):
        device = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0), torch.__version__)"],
                                capture_output=True, text=True).stdout.strip()
    text = json.dumps({
        "model": args.model, "device": device, "rounds": args.rounds, "steps": args.steps, "cpu_count": os.cpu_count(),
        "command": " ".join(["python", *sys.argv]),
        "step_ms_off": statistics.median(times[False]) * 1000, "step_ms_on": statistics.median(times[True]) * 1000,
        "on_over_off": interval.median, "on_over_off_ci95": interval.interval,
        "rounds_off_ms": [t * 1000 for t in times[False]], "rounds_on_ms": [t * 1000 for t in times[True]],
    }, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
