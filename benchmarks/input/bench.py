"""ResNet50 training fed by each input pipeline of ``tcaudit fix --dali``, on generated JPEGs.

    python benchmarks/input/bench.py all --out OUT [--images 24000] [--steps 60] [--warmup 20]
    python benchmarks/input/bench.py train --pipeline nvjpeg --data DIR ...   (one row, as JSON)

``all`` writes the JPEGs (ImageNet-like sizes, several per batch, a few greyscale), then trains one
fresh process per pipeline: ``synthetic`` (a batch made once on the GPU: what the model alone
allows), ``cpu`` (the DataLoader as ``tcaudit fix`` leaves it: 16 workers, pinned memory, persistent
workers), ``nvjpeg`` and ``dali`` (forced with TCAUDIT_INPUT), and ``auto`` (what ``fix --dali``
does unforced: the start-up probe picks; its probe runs before the first step, outside the timing). The loaders come from the very function ``fix --dali``
inserts (tcaudit/rewrite/dali_runtime.py). Training: bf16 autocast, channels_last, SGD; the
timed steps follow the warm-up steps inside the first epoch. Rows go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ("synthetic", "cpu", "nvjpeg", "dali", "auto")
# Width x height of common ImageNet training images (most are at most 500 pixels a side).
SIZES = ((500, 375), (500, 333), (375, 500), (500, 500), (333, 500), (500, 400), (640, 480), (400, 300))
SMALL_SIZES = ((64, 48), (48, 64), (56, 56))


def _write_chunk(job):
    import numpy as np
    from PIL import Image

    root, start, stop, classes, sizes, seed = job
    rng = np.random.default_rng((seed, start))
    for index in range(start, stop):
        width, height = sizes[index % len(sizes)]
        # Smooth noise compresses like a photo (white noise makes unrealistically large JPEGs).
        small = rng.integers(0, 256, size=(max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.BILINEAR)
        if index % 97 == 0:
            image = image.convert("L")  # ImageNet has greyscale JPEGs too
        image.save(root / f"class_{index % classes:03d}" / f"img_{index:06d}.jpg", quality=90)


def make_jpegs(out: Path, images: int, classes: int, small: bool, jobs: int) -> float:
    start = time.perf_counter()
    root = out / "train"
    for label in range(classes):
        (root / f"class_{label:03d}").mkdir(parents=True, exist_ok=True)
    sizes = SMALL_SIZES if small else SIZES
    chunks = [(root, s, min(s + 250, images), classes, sizes, 0) for s in range(0, images, 250)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_write_chunk, chunks))
    return time.perf_counter() - start


def train(args) -> dict:
    """One pipeline: warm-up steps, then timed steps; the row as a dict."""
    import torch
    import torchvision
    import torchvision.datasets as datasets
    import torchvision.models as models
    import torchvision.transforms as transforms

    sys.path.insert(0, str(ROOT))
    from tcaudit.rewrite.dali_runtime import tcaudit_dali_loader

    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    model = models.resnet50(num_classes=args.classes).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    steps = args.warmup + args.steps
    note, images_found = "", None
    if args.pipeline == "synthetic":
        batch = (torch.randn(args.batch_size, 3, args.crop, args.crop, device=device).contiguous(memory_format=torch.channels_last),
                 torch.randint(0, args.classes, (args.batch_size,), device=device))
        batches = (batch for _ in range(steps))
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        dataset = datasets.ImageFolder(str(Path(args.data) / "train"), transforms.Compose([
            transforms.RandomResizedCrop(args.crop), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize,
        ]))
        images_found = len(dataset)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                             pin_memory=cuda, persistent_workers=args.workers > 0)
        if args.pipeline != "auto":
            os.environ["TCAUDIT_INPUT"] = args.pipeline
        else:
            os.environ.pop("TCAUDIT_INPUT", None)
        started = time.perf_counter()
        loader = tcaudit_dali_loader(loader, nhwc=True, device=None if cuda else device, probe=cuda or None)
        note = getattr(loader, "kind", "the DataLoader as written") + f"; set up in {time.perf_counter() - started:.1f} s"
        if len(loader) < steps:
            raise SystemExit(f"{len(loader)} batches per epoch, fewer than the {steps} steps asked: more --images")
        batches = iter(loader)
    dali_version = None
    if args.pipeline in ("dali", "auto"):
        try:
            import nvidia.dali

            dali_version = nvidia.dali.__version__
        except ImportError:
            pass
    losses, start = [], None
    for step, (images, target) in enumerate(batches):
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        target = target.to(device, non_blocking=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):  # bf16 on CPU is emulated, slow
            loss = criterion(model(images), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
        if step + 1 == steps:
            break
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {
        "pipeline": args.pipeline,
        "img_per_s": round(args.steps * args.batch_size / elapsed, 1),
        "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU)",
        "cpu_cores": os.cpu_count(),
        "images": images_found,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "batch_size": args.batch_size,
        "command": " ".join([Path(sys.executable).name, *sys.argv[:1], *[a for a in sys.argv[1:] if a != "--json-row"]]),
        "dali_version": dali_version,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "chosen": note,
        "losses": losses,
    }


def run_all(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data or out / "jpegs")
    if not (data / "train").is_dir():
        took = make_jpegs(data, args.images, args.classes, args.small_images, args.jobs)
        print(f"wrote {args.images} JPEGs under {data} in {took:.1f} s", flush=True)
    rows = []
    for pipeline in args.pipelines.split(","):
        command = [sys.executable, str(Path(__file__).resolve()), "train", "--pipeline", pipeline, "--data", str(data),
                   "--images", str(args.images), "--classes", str(args.classes), "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--crop", str(args.crop),
                   "--workers", str(args.workers), "--device", args.device, "--json-row"]
        print(f"== {pipeline}", flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            (out / f"{pipeline}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
            error = None if row else (proc.stderr.strip().splitlines() or ["no output"])[-1]
        except subprocess.TimeoutExpired:
            row, error = None, f"timed out after {args.timeout} s"
        if row is None:
            row = {"pipeline": pipeline, "img_per_s": None, "gpu": None, "cpu_cores": os.cpu_count(), "images": args.images,
                   "steps": args.steps, "command": " ".join(command[1:]), "error": error}
        row["wall_s"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    rates = {row["pipeline"]: row["img_per_s"] for row in rows}
    summary = {}
    if rates.get("dali") and rates.get("synthetic"):
        summary["dali_vs_synthetic"] = round(rates["dali"] / rates["synthetic"], 3)
    if rates.get("nvjpeg") and rates.get("cpu"):
        summary["nvjpeg_vs_cpu"] = round(rates["nvjpeg"] / rates["cpu"], 3)
    if rates.get("auto") and rates.get("cpu"):
        summary["auto_vs_cpu"] = round(rates["auto"] / rates["cpu"], 3)
    print("summary", json.dumps(summary), flush=True)
    return 0 if all(row["img_per_s"] for row in rows if row["pipeline"] != "dali") else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("all", "train"))
    parser.add_argument("--out", default="benchmarks/input/out")
    parser.add_argument("--data", default="")
    parser.add_argument("--pipeline", choices=PIPELINES, default="cpu")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--images", type=int, default=24000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60, help="timed steps")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing JPEGs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small-images", action="store_true", help="64x48-ish images, for a CPU smoke run")
    parser.add_argument("--timeout", type=int, default=90, help="seconds per pipeline")
    parser.add_argument("--json-row", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "all":
        return run_all(args)
    print(json.dumps(train(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
