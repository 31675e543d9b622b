"""ResNet50 training fed by each input pipeline of ``tcaudit fix --dali``, on generated JPEGs.

    python benchmarks/input/bench.py all --out OUT [--images 24000] [--steps 60] [--warmup 20]
    python benchmarks/input/bench.py train --pipeline nvjpeg --data DIR ...   (one row, as JSON)

``all`` writes the JPEGs (ImageNet-like sizes, several per batch, a few greyscale), then trains one
fresh process per pipeline: ``synthetic`` (a batch made once on the GPU: what the model alone
allows), ``cpu`` (the DataLoader as ``tcaudit fix`` leaves it: 16 workers, pinned memory, persistent
workers), ``nvjpeg`` and ``dali`` (forced with TCAUDIT_INPUT), and ``auto`` (what ``fix --dali``
does unforced: the start-up probe picks; its probe runs before the first step, outside the timing). The loaders come from the very function ``fix --dali``
inserts (tcaudit/rewrite/dali_runtime.py). Training: bf16 autocast, channels_last, SGD; the
timed steps follow the warm-up steps inside the first epoch. Then each of ``--loader-pipelines``
alone (``"mode": "loader"``): batches delivered on the GPU in the training layout, no model, which is
the decode rate each pipeline can sustain. Rows go to OUT/results.json.

The JPEGs are ``--texture photo`` by default: photo-like entropy (about 120 KB at 500x375; ImageNet's
training JPEGs average about 110 KB), so that decoding costs what it costs on real data;
``--texture smooth`` writes the cheap-to-decode images of the first measurement.
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

    root, start, stop, classes, sizes, seed, texture = job
    rng = np.random.default_rng((seed, start))
    for index in range(start, stop):
        width, height = sizes[index % len(sizes)]
        image = _image(rng, width, height, texture)
        if index % 97 == 0:
            image = image.convert("L")  # ImageNet has greyscale JPEGs too
        image.save(root / f"class_{index % classes:03d}" / f"img_{index:06d}.jpg", quality=90)


def _image(rng, width: int, height: int, texture: str):
    """One synthetic picture. ``smooth``: upsampled coarse noise, which compresses far better than a
    photo (about 55 KB at 500x375, quality 90) and so decodes cheaply. ``photo``: the same coarse
    layout plus mid-scale structure and pixel-level grain, about 120 KB at 500x375 (ImageNet's training
    JPEGs average about 110 KB): what a decoder meets in real data, entropy decoding included."""
    import numpy as np
    from PIL import Image

    def noise(h: int, w: int, resample):
        small = rng.integers(0, 256, size=(max(1, h), max(1, w), 3), dtype=np.uint8)
        return Image.fromarray(small).resize((width, height), resample)

    if texture == "smooth":
        return noise(height // 8, width // 8, Image.BILINEAR)
    base = np.asarray(noise(height // 16, width // 16, Image.BICUBIC), dtype=np.float32)
    mid = np.asarray(noise(height // 3, width // 3, Image.BILINEAR), dtype=np.float32) - 128.0
    grain = rng.normal(0.0, 1.0, size=(height, width, 1)).astype(np.float32)
    pixels = base * 0.7 + mid * (40.0 / 128.0) + grain * 24.0
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_jpegs(out: Path, images: int, classes: int, small: bool, jobs: int, texture: str = "photo") -> float:
    start = time.perf_counter()
    root = out / "train"
    for label in range(classes):
        (root / f"class_{label:03d}").mkdir(parents=True, exist_ok=True)
    sizes = SMALL_SIZES if small else SIZES
    chunks = [(root, s, min(s + 250, images), classes, sizes, 0, texture) for s in range(0, images, 250)]
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
    if not args.loader_only:
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
        if args.loader_only:  # the batch delivered on the device in the training layout is the whole job
            if step + 1 == steps:
                break
            continue
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
        "mode": "loader" if args.loader_only else "train",
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
        took = make_jpegs(data, args.images, args.classes, args.small_images, args.jobs, args.texture)
        print(f"wrote {args.images} JPEGs ({args.texture}) under {data} in {took:.1f} s", flush=True)
    sizes = [f.stat().st_size for f in (data / "train").rglob("*.jpg")]
    jpeg_set = {"files": len(sizes), "texture": args.texture, "mean_kib": round(sum(sizes) / max(1, len(sizes)) / 1024, 1)}
    print("jpeg set", json.dumps(jpeg_set), flush=True)
    rows = []
    runs = [(p, False) for p in args.pipelines.split(",") if p] + [(p, True) for p in args.loader_pipelines.split(",") if p]
    for pipeline, loader_only in runs:
        command = [sys.executable, str(Path(__file__).resolve()), "train", "--pipeline", pipeline, "--data", str(data),
                   "--images", str(args.images), "--classes", str(args.classes), "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--crop", str(args.crop),
                   "--workers", str(args.workers), "--device", args.device, "--json-row",
                   *(["--loader-only"] if loader_only else [])]
        print(f"== {pipeline}{' (loader only)' if loader_only else ''}", flush=True)
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
            row = {"pipeline": pipeline, "mode": "loader" if loader_only else "train", "img_per_s": None, "gpu": None, "cpu_cores": os.cpu_count(), "images": args.images,
                   "steps": args.steps, "command": " ".join(command[1:]), "error": error}
        row["wall_s"] = round(time.perf_counter() - start, 1)
        row["mode"] = "loader" if loader_only else "train"
        row["jpeg_set"] = jpeg_set
        print(json.dumps(row), flush=True)
        rows.append(row)
        (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    rates = {row["pipeline"]: row["img_per_s"] for row in rows if row["mode"] == "train"}
    loader_rates = {row["pipeline"]: row["img_per_s"] for row in rows if row["mode"] == "loader"}
    summary = {"jpeg_set": jpeg_set}
    if loader_rates.get("nvjpeg") and loader_rates.get("cpu"):
        summary["loader_nvjpeg_vs_cpu"] = round(loader_rates["nvjpeg"] / loader_rates["cpu"], 3)
    if loader_rates.get("dali") and loader_rates.get("cpu"):
        summary["loader_dali_vs_cpu"] = round(loader_rates["dali"] / loader_rates["cpu"], 3)
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
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help="pipelines timed while training ResNet50")
    parser.add_argument("--loader-pipelines", default="cpu,nvjpeg,dali",
                        help="pipelines timed alone: batches delivered to the GPU, no model (empty: none)")
    parser.add_argument("--loader-only", action="store_true", help="(train mode) time the input pipeline alone")
    parser.add_argument("--texture", choices=("photo", "smooth"), default="photo",
                        help="photo: photo-like entropy (~120 KB at 500x375); smooth: cheap-to-decode images")
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
