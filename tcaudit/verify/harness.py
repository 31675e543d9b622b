"""Runs inside the user's training process and measures it without editing the script.

    python -m tcaudit.verify.harness --steps 50 --warmup 10 --out run.json -- train.py ARGS...

Global hooks, installed before the script runs:
- the optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) marks
  step boundaries; the first optimizer instance that steps is the one that counts (a GAN's second
  optimizer does not double the step count);
- module forward pre/post hooks (``register_module_forward_pre_hook``) count samples: the leading
  dimension of the first tensor given to the model's top-level calls (the first module with trainable
  parameters that is called with a tensor); for a call with keyword arguments only (``model(**batch)``,
  as Hugging Face's Trainer makes it), of ``input_ids`` (or ``pixel_values``..., else the first tensor),
  read by the post-hook, the pre-hook not seeing keyword arguments;
- ``Tensor.backward`` and ``GradScaler.scale`` are wrapped to keep each step's unscaled loss on the
  device (read back after timing, so no extra sync per step beyond the step boundary);
- the input wait of each step is the host time from the previous step's end (device synchronised)
  to the model's first forward call: fetching the batch, copying it, anything the loop does before
  the forward. The device is idle meanwhile, so a large share means the step is bound by its input.

With ``--health`` (off by default: then none of the following is installed), also per step: the
global gradient norm the optimizer sees (an optimizer step pre-hook; under a GradScaler the grads are
unscaled by then), which parameters had a gradient, GradScaler steps that were skipped (the scale
went down in ``update``), and the peak memory; at the end, the parameters that never had a gradient
and whether the model is DDP-wrapped with ``find_unused_parameters``.

CUDA graph replays (``model.compile(mode="reduce-overhead")``, or the script's own ``torch.cuda.graph``) are
counted by wrapping ``torch.cuda.CUDAGraph.replay`` (a Python increment per replay, none without graphs),
per step like the samples; Inductor's count of graphs it declined to capture
(``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``) is read once at the end.

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


def _total_norm(torch, grads):
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if get_total_norm is not None:
        return get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads]))


def _unwrapped(module):
    """The module a torch.compile wrapper (``_orig_mod``) holds, else the module itself."""
    return getattr(module, "_orig_mod", module)


class Recorder:
    def __init__(self, steps: int, warmup: int, out: Path, torch, health: bool = False) -> None:
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
        self.input_waits: list[float] = []
        self.graph_replays: list[int] = []  # CUDA graph replays per step
        self._replays = 0
        self._pending_wait: float | None = None
        self.health = health
        self.model_module = None
        # The precision the model's GEMMs run in, read at its first forward (verify's MFU divides by
        # the GPU's peak for it): fp8, bf16, fp16, tf32 or fp32.
        self.precision: str | None = None
        self.optimizer = None
        self.grad_norms: list = []  # device tensors, read back at the end
        self.skipped_steps: list[int] = []
        self.peak_memory_per_step: list[float] = []
        self._peak_so_far = 0.0
        self._had_grad: set[int] = set()
        self._pending_norm = None
        self._pending_samples = 0
        self._pending_loss = None
        self._depth = 0
        self._keyword_call: tuple[int, float] | None = None  # (module, time) of a top-level ``model(**batch)``
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
                self._count(module, tensor, time.perf_counter())
            elif not args and (id(module) == self.model_id or self.model_id is None):
                # ``model(**batch)``, as Hugging Face's Trainer and accelerate loops call it: the pre-hook
                # sees no keyword arguments, so the batch is read when the call returns (forward_post).
                self._keyword_call = (id(module), time.perf_counter())
        self._depth += 1

    def _count(self, module, tensor, called: float) -> None:
        if self.model_id is None and _has_trainable_parameters(module):
            # Parameter-free modules called first (torchvision transforms such as Normalize,
            # run in the main process when num_workers=0) are not the model.
            self.model_id = id(module)
            self.model_module = module
        if id(module) == self.model_id:
            if self.precision is None:
                self.precision = precision_in_use(self.torch, module, tensor.device.type)
            self._pending_samples += int(tensor.shape[0])
            if self._pending_wait is None and self._last is not None:
                self._pending_wait = called - self._last

    def forward_post(self, module, args, kwargs, output):
        self._depth = max(0, self._depth - 1)
        if self._depth != 0:
            return
        keyword_call, self._keyword_call = self._keyword_call, None
        if keyword_call is not None and keyword_call[0] == id(module) and kwargs:
            named = [kwargs[k] for k in _BATCH_KEYS if k in kwargs]
            tensor = next((v for v in (*named, *kwargs.values()) if isinstance(v, self.torch.Tensor) and v.dim() > 0),
                          None)
            if tensor is not None:
                self._count(module, tensor, keyword_call[1])

    def on_loss(self, tensor) -> None:
        if self._pending_loss is None and tensor.numel() == 1:
            self._pending_loss = tensor.detach().float().clone()

    def step_pre(self, optimizer, args, kwargs) -> None:
        """Health only: the gradients this step applies (unscaled by now under a GradScaler)."""
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) != self.optimizer_id:
            return
        self.optimizer = optimizer
        grads = []
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    grads.append(parameter.grad)
                    self._had_grad.add(id(parameter))
        self._pending_norm = _total_norm(self.torch, grads) if grads else None

    def on_scaler_update(self, scale_before: float, scale_after: float) -> None:
        if scale_after < scale_before:  # update() lowers the scale exactly when step() skipped
            self.skipped_steps.append(len(self.step_times))

    def _step_peak_memory(self) -> float:
        torch = self.torch
        if self.cuda:
            peak = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        self._peak_so_far = max(self._peak_so_far, peak)
        return peak

    def step_post(self, optimizer, args, kwargs) -> None:
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) != self.optimizer_id:
            return
        if self.cuda:
            self.torch.cuda.synchronize()
        now = time.perf_counter()
        if self.health:
            peak = self._step_peak_memory()
        if self._last is not None:
            self.step_times.append(now - self._last)
            self.samples.append(self._pending_samples)
            self.losses.append(self._pending_loss)
            self.input_waits.append(self._pending_wait or 0.0)
            self.graph_replays.append(self._replays)
            if self.health:
                self.grad_norms.append(self._pending_norm)
                self.peak_memory_per_step.append(peak)
        else:
            # The first step's time includes start-up; it only opens the clock.
            self.first_step_at = now - self.started
        self._last = now
        if self.progress is not None and self.rank == 0:
            self.progress.write_text(str(len(self.step_times)))
        self._pending_samples = 0
        self._pending_loss = None
        self._pending_wait = None
        self._pending_norm = None
        self._replays = 0
        if len(self.step_times) >= self.warmup + self.steps:
            self.finish()

    # results --------------------------------------------------------------------------------------
    def finish(self, reason: str = "completed") -> None:
        torch = self.torch
        losses = [float(l.item()) if l is not None else None for l in self.losses]
        if self.cuda:
            peak = max(self._peak_so_far, torch.cuda.max_memory_allocated() / 2**30)
            device = torch.cuda.get_device_name(torch.cuda.current_device())
            major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
            sm = f"sm_{major}{minor}"
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
            sm = None
        data = {
            "status": reason,
            "rank": self.rank,
            "world_size": self.world,
            "device": device,
            "sm": sm,
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
            "input_waits": self.input_waits,
            "graph_replays": self.graph_replays,
            "cudagraph_skips": _cudagraph_skips(),
            "precision": self.precision,
        }
        if self.health:
            data["health"] = self.health_facts()
        target = self.out if self.world == 1 else self.out.with_name(f"{self.out.stem}.rank{self.rank}.json")
        target.write_text(json.dumps(data))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


    def health_facts(self) -> dict:
        torch = self.torch
        norms = [float(n) for n in torch.stack(
            [n.detach().float().reshape(()) for n in self.grad_norms if n is not None]).tolist()
        ] if any(n is not None for n in self.grad_norms) else []
        it = iter(norms)
        grad_norms = [next(it) if n is not None else None for n in self.grad_norms]
        model = _unwrapped(self.model_module) if self.model_module is not None else None
        names: dict[int, str] = {}
        ddp_flag = None
        if model is not None:
            if type(model).__name__ == "DistributedDataParallel":
                ddp_flag = bool(getattr(model, "find_unused_parameters", False))
                model = _unwrapped(model.module)
            names = {id(p): name for name, p in model.named_parameters()}
        never: list[str] = []
        if self.optimizer is not None:
            for g, group in enumerate(self.optimizer.param_groups):
                for i, parameter in enumerate(group["params"]):
                    if parameter.requires_grad and id(parameter) not in self._had_grad:
                        never.append(names.get(id(parameter), f"param_groups[{g}][{i}]"))
        return {
            "grad_norms": grad_norms,
            "skipped_steps": self.skipped_steps,
            "unused_parameters": never,
            "ddp_find_unused_parameters": ddp_flag,
            "peak_memory_gib_per_step": self.peak_memory_per_step,
        }


def precision_in_use(torch, module, device_type: str) -> str:
    """What the model's GEMMs run in at this forward: ``fp8`` where torchao's float8 training converted
    a layer (``Float8Linear``), else autocast's dtype (``bf16``/``fp16``), else the parameters' (a model
    cast with ``.half()``), else ``tf32`` where fp32 matmuls may use TF32, else ``fp32``."""
    model = _unwrapped(module)
    if any(type(m).__name__ == "Float8Linear" for m in model.modules()):
        return "fp8"
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    try:
        if torch.is_autocast_enabled(device_type):
            return names.get(torch.get_autocast_dtype(device_type), "fp32")
    except (TypeError, AttributeError, RuntimeError):  # a torch before the device-type forms
        pass
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    if parameter is not None and parameter.dtype in names:
        return names[parameter.dtype]
    if device_type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def _cudagraph_skips() -> int:
    """Graphs Inductor declined to run as CUDA graphs (a CPU tensor, a mutated input, dynamic shapes...),
    where Dynamo was imported at all (importing it here would cost seconds for nothing)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["inductor"]["cudagraph_skips"])
    except Exception:  # a torch whose counters differ: no figure rather than a failed run
        return 0


def count_graph_replays(recorder: Recorder, torch) -> None:
    """Wraps ``torch.cuda.CUDAGraph.replay`` (Inductor's CUDA graph trees and ``torch.cuda.graph`` both
    replay through it) to count replays per step."""
    graph = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    original = getattr(graph, "replay", None)
    if original is None:
        return

    def replay(self, *args, **kwargs):
        recorder._replays += 1
        return original(self, *args, **kwargs)

    graph.replay = replay


# The keyword a model called as ``model(**batch)`` gets its batch under (transformers' names), first.
_BATCH_KEYS = ("input_ids", "pixel_values", "input_values", "input_features", "inputs_embeds")


def install(recorder: Recorder, torch) -> None:
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_module_forward_pre_hook(recorder.forward_pre)
    register_module_forward_hook(recorder.forward_post, with_kwargs=True)
    register_optimizer_step_post_hook(recorder.step_post)
    count_graph_replays(recorder, torch)
    if recorder.health:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(recorder.step_pre)

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

        if recorder.health and "update" in vars(cls):  # a subclass inheriting update is wrapped once
            original_update = cls.update

            def update(self, *args, _original=original_update, **kwargs):
                before = self.get_scale() if self.is_enabled() else None
                result = _original(self, *args, **kwargs)
                if before is not None:
                    recorder.on_scaler_update(before, self.get_scale())
                return result

            cls.update = update


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tcaudit.verify.harness")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--health", action="store_true", help="record training health (grad norms, skipped steps, ...)")
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
    recorder = Recorder(ns.steps, ns.warmup, Path(ns.out), torch, health=ns.health)
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
