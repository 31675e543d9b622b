"""The oracle's shim: imported by every Python process started with this folder on PYTHONPATH and
TCAUDIT_ORACLE_OUT set (the script, its DataLoader/spawn children, torchrun workers). Nothing in the
script is edited; the shim only watches and, in CUDA-semantics mode, makes CPU fail where CUDA fails.

Always (``TCAUDIT_ORACLE_MODE=cpu``):
- seeds ``random``, numpy and torch with TCAUDIT_ORACLE_SEED, so original and patched draw alike;
- records every scalar passed to ``torch.autograd.backward`` (``loss.backward()`` goes through it)
  and writes them to ``$TCAUDIT_ORACLE_OUT/losses-<pid>.json`` at exit.

CUDA-semantics mode (``TCAUDIT_ORACLE_MODE=cuda``), for the F1/F2/F7 failure classes of REALWORLD.md:
(a) ``F.binary_cross_entropy`` / ``nn.BCELoss`` raise CUDA's "unsafe to autocast" RuntimeError when
    autocast is active, where "active" counts an autocast whose ``enabled=`` tests for CUDA
    (``enabled=device == "cuda"``) as on: it would be on the GPU. Such an autocast stays *virtual*
    (the CPU computes in fp32), so values remain comparable.
(b) every GradScaler is an enabled CPU scaler with its real scale (65536 unless the script sets
    ``init_scale``), unless its ``enabled=`` is false for a reason other than the device (a flag).
    A correct script computes the same values under any power-of-two scale; unscaling twice or
    clipping scaled gradients diverges. Recorded losses are divided by the scale they were
    multiplied with, so they stay comparable with the original's. ``TCAUDIT_ORACLE_SCALER=off`` keeps
    every scaler disabled: the reference run, what a correct script computes under any scale.
(c) a random factory given ``device=`` (``torch.randn(n, device=device)``) draws from a second
    generator, as CUDA tensors draw from the CUDA generator and not the CPU one (F7).
AMP mode (``TCAUDIT_ORACLE_MODE=amp``): CUDA semantics as above, except that an autocast that would
be on under CUDA is a real CPU autocast in its dtype (fp16 when none is given, as on CUDA): CPU
autocast runs GEMMs and convolutions in fp16/bf16 like CUDA's, so ``masked_fill(mask, -1e9)`` on half
scores raises "value cannot be converted to type c10::Half without overflow", and a half tensor fed to
a region under ``autocast(enabled=False)`` raises "Input type and bias type" as on the GPU. Values
follow the lower precision, so losses are compared with a loose tolerance.
Steps (``TCAUDIT_ORACLE_STEPS=1``, any mode; the GPU suite tests/test_gpu_fp16.py): every optimizer step
attempt is recorded as [sum of the optimizer's parameters before it, after it (float64), skipped], where a
GradScaler's step that found infs or NaNs counts as an attempt it skipped. ``TCAUDIT_ORACLE_SKIP=3,4``
leaves those attempts (0-based, in the order the script makes them) out: their gradients are dropped
before the optimizer runs, so it changes nothing, as a scaler that found infs does. The original run
with the patched run's skipped steps left out is the reference that tells a scaler finding its scale
from a mis-train.
Not done: ``torch.cuda.is_available()`` stays False. Making it True while tensors stay on the CPU
would send the scripts down their CUDA branches (``.cuda()``, NCCL, pinned memory, ``compile``),
each of which then needs its own fake; the ``enabled=`` rule above covers what F1/F2 need.
"""

from __future__ import annotations

import os

_OUT = "TCAUDIT_ORACLE_OUT"
_state = {"losses": [], "steps": [], "record_steps": False, "skip": set(), "rank": None, "mode": "cpu",
          "installed": False, "owner": None}


def _seed(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    _state["device_generator"] = torch.Generator().manual_seed(seed + 1)


def _record(tensors) -> None:
    import torch

    if isinstance(tensors, torch.Tensor):
        tensors = (tensors,)
    for tensor in tensors or ():
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            value = float(tensor.detach().float()) / getattr(tensor, "_tcaudit_oracle_scale", 1.0)
            _state["losses"].append(value)
            if _state["rank"] is None and torch.distributed.is_available() and torch.distributed.is_initialized():
                _state["rank"] = torch.distributed.get_rank()


def dump() -> None:
    import json

    out = os.environ.get(_OUT)
    if not out or not _state["losses"] or _state["owner"] != os.getpid():
        return
    os.makedirs(out, exist_ok=True)
    rank = _state["rank"] if _state["rank"] is not None else os.environ.get("RANK")
    with open(os.path.join(out, f"losses-{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "rank": rank, "losses": _state["losses"], "steps": _state["steps"]}, f)


def begin(seed: int | None = None) -> None:
    """Start a fresh record in this process (the runner calls it in each forked child)."""
    _state["losses"] = []
    _state["steps"] = []
    # Read here, not at install: the runner installs the shim once and sets each child's environment.
    _state["record_steps"] = os.environ.get("TCAUDIT_ORACLE_STEPS") == "1"
    _state["skip"] = {int(i) for i in os.environ.get("TCAUDIT_ORACLE_SKIP", "").split(",") if i.strip()}
    _state["rank"] = None
    _state["owner"] = os.getpid()
    _state["mode"] = os.environ.get("TCAUDIT_ORACLE_MODE", "cpu")
    _seed(int(os.environ.get("TCAUDIT_ORACLE_SEED", "0")) if seed is None else seed)


# --- CUDA semantics ---------------------------------------------------------------------------

_TORCH_DIR = None


def _caller_keyword(keyword: str):
    """(the ``keyword=`` expression, its frame) of the user-code call that is running now, or None."""
    import ast
    import inspect
    import linecache
    import sys

    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return None
    positions = inspect.getframeinfo(frame).positions
    if positions is None or positions.lineno is None:
        return None
    lines = linecache.getlines(frame.f_code.co_filename)[positions.lineno - 1 : positions.end_lineno]
    if not lines:
        return None
    if len(lines) == 1:
        text = lines[0][positions.col_offset : positions.end_col_offset]
    else:
        text = "".join([lines[0][positions.col_offset :], *lines[1:-1], lines[-1][: positions.end_col_offset]])
    try:
        call = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value, frame
    return None


def _on_gpu(enabled) -> bool:
    """Whether an ``enabled=`` argument would be true on a CUDA machine: the expression is evaluated
    again in the caller's frame with every test that mentions CUDA (``device == "cuda"``,
    ``torch.cuda.is_available()``, a name like ``cuda`` or ``args.use_cuda``) taken as true, so
    ``args.amp and device == "cuda"`` stays a flag."""
    import ast

    if enabled is None or bool(enabled):
        return True
    found = _caller_keyword("enabled")
    if found is None:
        return False
    expression, frame = found

    class CudaIsThere(ast.NodeTransformer):
        def visit_Compare(self, node):
            return ast.Constant(True) if "cuda" in ast.unparse(node) else self.generic_visit(node)

        def visit_Call(self, node):
            return ast.Constant(True) if "cuda" in ast.unparse(node) else self.generic_visit(node)

        def visit_Name(self, node):  # ``cuda = torch.cuda.is_available()``, ``use_cuda``
            return ast.Constant(True) if "cuda" in node.id.lower() else node

        def visit_Attribute(self, node):  # ``args.cuda``, ``self.use_cuda``
            return ast.Constant(True) if "cuda" in node.attr.lower() else self.generic_visit(node)

    tree = ast.fix_missing_locations(ast.Expression(CudaIsThere().visit(expression)))
    try:
        return bool(eval(compile(tree, "<tcaudit-oracle>", "eval"), frame.f_globals, frame.f_locals))
    except Exception:  # noqa: BLE001 - an expression we cannot replay: judge by its text
        return "cuda" in ast.unparse(expression)


_autocast_stack: list[bool] = []
_CUDA_MODES = ("cuda", "amp")

BCE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast. (tcaudit oracle: CUDA semantics on CPU)"
)


def _install_cuda_semantics(torch) -> None:
    import functools

    import torch.nn.functional as F

    autocast_cls = torch.amp.autocast_mode.autocast
    original_init, original_enter, original_exit = autocast_cls.__init__, autocast_cls.__enter__, autocast_cls.__exit__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self._tcaudit_virtual = False
        if _state["mode"] == "amp" and (device_type == "cuda" or not enabled):
            # CUDA's autocast as a real CPU one, in the dtype CUDA would use (fp16 unless given), on where
            # it would be on under CUDA and off where it is switched off (``enabled=False`` regions), so
            # fills beyond fp16's range and half inputs to fp32 regions fail as they do there.
            on = _on_gpu(enabled)
            original_init(self, "cpu", dtype=(dtype or torch.float16) if on else dtype, enabled=on, cache_enabled=cache_enabled)
            return
        if _state["mode"] == "cuda" and (device_type == "cuda" or not enabled) and _on_gpu(enabled):
            # Would be on under CUDA: counted as on, computed in fp32 (the CPU context stays off).
            self._tcaudit_virtual = True
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def autocast_enter(self):
        result = original_enter(self)
        _autocast_stack.append(bool(getattr(self, "_tcaudit_virtual", False) or self._enabled))
        return result

    def autocast_exit(self, *exc):
        if _autocast_stack:
            _autocast_stack.pop()
        return original_exit(self, *exc)

    autocast_cls.__init__, autocast_cls.__enter__, autocast_cls.__exit__ = autocast_init, autocast_enter, autocast_exit

    original_bce = F.binary_cross_entropy

    @functools.wraps(original_bce)
    def binary_cross_entropy(*args, **kwargs):
        if _state["mode"] in _CUDA_MODES and _autocast_stack and _autocast_stack[-1]:
            raise RuntimeError(BCE_MESSAGE)
        return original_bce(*args, **kwargs)

    F.binary_cross_entropy = binary_cross_entropy

    scaler_cls = torch.amp.GradScaler
    original_scaler_init, original_scale = scaler_cls.__init__, scaler_cls.scale

    def scaler_init(self, device="cuda", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        if _state["mode"] in _CUDA_MODES:
            # TCAUDIT_ORACLE_SCALER=off gives the reference run: the math a scaler must not change.
            enabled, device = _on_gpu(enabled) and os.environ.get("TCAUDIT_ORACLE_SCALER") != "off", "cpu"
        original_scaler_init(self, device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)

    def scale(self, outputs):
        scaled = original_scale(self, outputs)
        if self.is_enabled() and isinstance(scaled, torch.Tensor) and scaled is not outputs:
            scaled._tcaudit_oracle_scale = float(self._scale.double().item()) if self._scale is not None else 1.0
        return scaled

    scaler_cls.__init__, scaler_cls.scale = scaler_init, scale

    def on_device_generator(factory):
        @functools.wraps(factory)
        def wrapper(*args, **kwargs):
            if _state["mode"] in _CUDA_MODES and kwargs.get("device") is not None and kwargs.get("generator") is None:
                kwargs["generator"] = _state["device_generator"]
            return factory(*args, **kwargs)

        return wrapper

    for name in ("randn", "rand", "randint", "randperm", "normal"):
        setattr(torch, name, on_device_generator(getattr(torch, name)))


# --- optimizer steps ---------------------------------------------------------------------------


def _parameter_sum(optimizer) -> float:
    return sum(float(p.detach().double().sum()) for group in optimizer.param_groups for p in group["params"])


def _install_step_record(torch) -> None:
    """Record each optimizer step attempt as [parameter sum before, after, skipped] (the module's docstring)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    attempt: dict = {}

    def pre(optimizer, args, kwargs):
        if not _state["record_steps"]:
            return
        attempt.update(before=_parameter_sum(optimizer), left_out=len(_state["steps"]) in _state["skip"])
        if attempt["left_out"]:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None  # the optimizer passes over a parameter without a gradient

    def post(optimizer, args, kwargs):
        if not _state["record_steps"]:
            return
        _state["steps"].append([attempt.get("before"), _parameter_sum(optimizer), bool(attempt.get("left_out"))])

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
    scaler_cls = torch.amp.GradScaler
    original_step = scaler_cls.step

    def step(self, optimizer, *args, **kwargs):
        before = len(_state["steps"])
        result = original_step(self, optimizer, *args, **kwargs)
        if _state["record_steps"] and self.is_enabled():
            found = self._per_optimizer_states[id(optimizer)].get("found_inf_per_device") or {}
            if sum(float(v) for v in found.values()):
                if len(_state["steps"]) > before:  # a fused optimizer ran its step and skipped the update itself
                    _state["steps"][-1][2] = True
                else:
                    total = _parameter_sum(optimizer)
                    _state["steps"].append([total, total, True])
        return result

    scaler_cls.step = step


def install() -> None:
    global _TORCH_DIR
    if _state["installed"]:
        return
    import atexit

    import torch
    import torch.autograd

    _TORCH_DIR = os.path.dirname(torch.__file__)
    _state["installed"] = True
    torch.set_num_threads(1)  # the same reduction order in both runs, and kind to a shared machine
    original_backward = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        _record(tensors)
        return original_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    _install_cuda_semantics(torch)
    _install_step_record(torch)
    atexit.register(dump)
    begin()


if os.environ.get(_OUT):
    install()
