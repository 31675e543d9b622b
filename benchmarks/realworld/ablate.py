"""Variants of the hand-tuned ceilings, one change each, to name what a patch still misses.

    python3 benchmarks/realworld/ablate.py OUT_DIR

writes, for the ImageNet-style, U-Net and ViT ceilings:

- ``<name>_ceiling_sync.py``: the loss read on the host every step (the log guard made always true),
  as the naive scripts and their patches do;
- ``<name>_ceiling_fp16.py`` (the two convnets): fp16 autocast with a GradScaler instead of bf16, as
  `tcaudit fix` chooses for convnets; the ImageNet one with the unfused SGD the patch keeps under a
  scaler;
- ``<name>_ceiling_fp16_sync.py``: both;
- ``imagenet_style_ceiling_float32.py``: the naive script's input pipeline (each worker normalizes its
  images to float32 on the CPU; the batches the GPU receives are float32, 4x the bytes of uint8);
- ``imagenet_style_ceiling_dp.py``: the compiled model wrapped in ``nn.DataParallel``, as the patched
  ImageNet-style script keeps it on one GPU.

Each is measured against its ceiling with ``tcaudit verify CEILING --patched VARIANT --out
DIR/<name>_<variant>`` (see BENCHMARKS.md, "Real-world scripts"): a speedup below 1 is what the change
costs. ``python3 benchmarks/realworld/ablate.py --summarize DIR`` collects those verify.json files
(``DIR/<name>_<variant>/verify.json`` or ``DIR/<name>_<variant>_verify.json``) into DIR/summary.json and
prints them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (name, the log guard's text)
LOG_GUARDS = {
    "imagenet_style": "if i % args.print_freq == 0:",
    "unet_seg": "if global_step % args.log_interval == 0:",
    "vit_classifier": "if step % args.log_interval == 0:",
}
CONVNETS = ("imagenet_style", "unet_seg")


def _replace(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"ablate.py: expected one {old!r}, found {text.count(old)}")
    return text.replace(old, new)


def sync_every_step(name: str, text: str) -> str:
    guard = LOG_GUARDS[name]
    return _replace(text, guard, guard[: -len(":")] + " or True:")


def fp16_with_scaler(name: str, text: str) -> str:
    text = _replace(text, "dtype=torch.bfloat16", "dtype=torch.float16")
    indent = "            "
    text = _replace(text, f"{indent}loss.backward()\n{indent}optimizer.step()\n",
                    f"{indent}scaler.scale(loss).backward()\n{indent}scaler.step(optimizer)\n{indent}scaler.update()\n")
    anchor = "    criterion = nn.CrossEntropyLoss()\n"
    text = _replace(text, anchor, anchor + "    scaler = torch.amp.GradScaler(device.type, enabled=cuda)\n")
    if name == "imagenet_style":
        text = _replace(text, "weight_decay=args.weight_decay, fused=cuda)", "weight_decay=args.weight_decay)")
    return text


def float32_batches(text: str) -> str:
    """The naive script's pipeline: ToTensor + Normalize in the workers, float32 batches to the GPU."""
    text = _replace(text, "transforms.Compose([transforms.RandomHorizontalFlip(), transforms.PILToTensor()])",
                    "transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize("
                    "mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])")
    return _replace(text, "images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)",
                    "images = images.contiguous(memory_format=torch.channels_last)")


def data_parallel(text: str) -> str:
    line = "    train_model = torch.compile(model) if (cuda if args.compile is None else args.compile) else model\n"
    return _replace(text, line, line + "    train_model = torch.nn.DataParallel(train_model) if cuda else train_model\n")


def summarize(folder: Path) -> int:
    rows = []
    for path in sorted([*folder.glob("*/verify.json"), *folder.glob("*_verify.json")]):
        label = path.parent.name if path.name == "verify.json" else path.name[: -len("_verify.json")]
        run = json.loads(path.read_text())
        rows.append({
            "variant": label,
            "ceiling": run["original"]["samples_per_s"],
            "variant_samples_per_s": run["patched"]["samples_per_s"],
            "speedup": run["speedup"],
            "speedup_ci": run["speedup_ci"],
            "significant": run["significant"],
            "rounds": run["rounds"],
            "input_wait": run["input_wait"],
            "gpu": run["gpu"],
            "torch": run["torch"],
            "command": run["command"],
        })
    (folder / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        ci = r["speedup_ci"]
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and all(ci) else ""
        print(f"{r['variant']:28s} ceiling {r['ceiling']:8.1f}  variant {r['variant_samples_per_s']:8.1f}  "
              f"{r['speedup']:.2f}x{interval}{'  significant' if r['significant'] else ''}  ({r['gpu']}, torch {r['torch']})")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--summarize":
        return summarize(Path(argv[1]))
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in LOG_GUARDS:
        ceiling = (HERE / f"{name}_ceiling.py").read_text()
        variants = {"sync": sync_every_step(name, ceiling)}
        if name in CONVNETS:
            variants["fp16"] = fp16_with_scaler(name, ceiling)
            variants["fp16_sync"] = sync_every_step(name, variants["fp16"])
        if name == "imagenet_style":
            variants["float32"] = float32_batches(ceiling)
            variants["dp"] = data_parallel(ceiling)
        for label, text in variants.items():
            compile(text, f"{name}_ceiling_{label}.py", "exec")
            (out / f"{name}_ceiling_{label}.py").write_text(text)
            print(out / f"{name}_ceiling_{label}.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
