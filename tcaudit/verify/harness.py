"""Runs inside the user's training process and measures it without editing the script.

    python -m tcaudit.verify.harness --steps 50 --warmup 10 --out run.json -- train.py ARGS...

Global hooks, installed before the script runs:
- the optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) marks
  step boundaries; the first optimizer instance that steps is the one that counts (a GAN's second
  optimizer does not double the step count);
- module forward pre/post hooks (``register_module_forward_pre_hook``) count samples: the leading
  dimension of the first tensor given to the model's top-level calls (the first module with trainable
  parameters that is called with a tensor);
- ``Tensor.backward`` and ``GradScaler.scale`` are wrapped to keep each step's unscaled loss on the
  device (read back after timing, so no extra sync per step beyond the step boundary).

At each step boundary the device is synchronised and the wall clock read, so step times are real
device times for both runs alike. After ``warmup + steps`` steps the results are written and the
process exits at once (the rest of the user's loop does not run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import runpy
import sys
import time
from pathlib import Path


def _has_trainable_parameters(module) -> bool:
    return any(p.requires_grad for p in module.parameters())


class Recorder:
    def __init__(self, steps: int, warmup: int, out: Path, torch) -> None:
        self.torch = torch
        self.steps = steps
        self.warmup = warmup
        self.out = out
        self.cuda = torch.cuda.is_available()
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.optimizer_id: int | None = None
        self.model_id: int | None = None
        self.step_times: list[float] = []
        self.samples: list[int] = []
        self.losses: list = []
        self._pending_samples = 0
        self._pending_loss = None
        self._depth = 0
        self._scaled: set[int] = set()
        self._last = None
        self.started = time.perf_counter()
        self.progress: Path | None = out.with_suffix(".progress")

    # hooks ----------------------------------------------------------------------------------------
    def forward_pre(self, module, args):
        # Samples are counted on the model: the first top-level module called with a tensor. The
        # loss module (also an nn.Module) and a GAN's second network are not counted again.
        if self._depth == 0:
            tensor = next((a for a in args if isinstance(a, self.torch.Tensor) and a.dim() > 0), None)
            if tensor is not None:
                if self.model_id is None and _has_trainable_parameters(module):
                    # Parameter-free modules called first (torchvision transforms such as Normalize,
                    # run in the main process when num_workers=0) are not the model.
                    self.model_id = id(module)
                if id(module) == self.model_id:
                    self._pending_samples += int(tensor.shape[0])
        self._depth += 1

    def forward_post(self, module, args, output):
        self._depth = max(0, self._depth - 1)

    def on_loss(self, tensor) -> None:
        if self._pending_loss is None and tensor.numel() == 1:
            self._pending_loss = tensor.detach().float().clone()

    def step_post(self, optimizer, args, kwargs) -> None:
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) != self.optimizer_id:
            return
        if self.cuda:
            self.torch.cuda.synchronize()
        now = time.perf_counter()
        if self._last is not None:
            self.step_times.append(now - self._last)
            self.samples.append(self._pending_samples)
            self.losses.append(self._pending_loss)
        else:
            # The first step's time includes start-up; it only opens the clock.
            self.first_step_at = now - self.started
        self._last = now
        if self.progress is not None and self.rank == 0:
            self.progress.write_text(str(len(self.step_times)))
        self._pending_samples = 0
        self._pending_loss = None
        if len(self.step_times) >= self.warmup + self.steps:
            self.finish()

    # results --------------------------------------------------------------------------------------
    def finish(self, reason: str = "completed") -> None:
        torch = self.torch
        losses = [float(l.item()) if l is not None else None for l in self.losses]
        if self.cuda:
            peak = torch.cuda.max_memory_allocated() / 2**30
            device = torch.cuda.get_device_name(torch.cuda.current_device())
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        data = {
            "status": reason,
            "rank": self.rank,
            "world_size": self.world,
            "device": device,
            "cuda": self.cuda,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "warmup": self.warmup,
            "steps_requested": self.steps,
            "step_times": self.step_times,
            "samples": self.samples,
            "losses": losses,
            "peak_memory_gib": peak,
            "peak_memory_kind": "torch.cuda.max_memory_allocated" if self.cuda else "process max RSS",
        }
        target = self.out if self.world == 1 else self.out.with_name(f"{self.out.stem}.rank{self.rank}.json")
        target.write_text(json.dumps(data))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def install(recorder: Recorder, torch) -> None:
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_module_forward_pre_hook(recorder.forward_pre)
    register_module_forward_hook(recorder.forward_post)
    register_optimizer_step_post_hook(recorder.step_post)

    original_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        if id(self) not in recorder._scaled:
            recorder.on_loss(self)
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward

    scaler_classes = []
    for module_name in ("torch.amp", "torch.cuda.amp"):
        try:
            module = __import__(module_name, fromlist=["GradScaler"])
            scaler_classes.append(module.GradScaler)
        except (ImportError, AttributeError):
            continue
    for cls in {c for c in scaler_classes}:
        original_scale = cls.scale

        def scale(self, outputs, _original=original_scale):
            if isinstance(outputs, torch.Tensor):
                recorder.on_loss(outputs)
            result = _original(self, outputs)
            if isinstance(result, torch.Tensor):
                recorder._scaled.add(id(result))
            return result

        cls.scale = scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tcaudit.verify.harness")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    import torch

    random.seed(ns.seed)
    torch.manual_seed(ns.seed)
    try:
        import numpy

        numpy.random.seed(ns.seed)
    except ImportError:
        pass
    recorder = Recorder(ns.steps, ns.warmup, Path(ns.out), torch)
    install(recorder, torch)
    script = Path(ns.script).resolve()
    sys.argv = [str(script), *[a for a in ns.args if a != "--"]]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    recorder.finish("script ended before the requested steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
