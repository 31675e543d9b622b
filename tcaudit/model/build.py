"""Child side: build the user's model on fake tensors and remember where each module was constructed.

A script target arrives as a *slice plan* (see :mod:`tcaudit.model.slicing`): the statements the
model needs, each with its original line and column. They are parsed at those positions and compiled
into one module whose file name is the user's script, so tracebacks, stack traces and the construction
sites recorded here all point at the user's own lines. A factory target (``pkg.mod:build``) is imported
and called. Either way every tensor is created under the FakeTensorMode it is given: no parameter
memory, no real kernels.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import linecache
import os
import sys
import sysconfig
import traceback
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from tcaudit.model.facts import Site

MODEL_VAR = "__tcaudit_model__"
FROM_CONFIG = "__tcaudit_from_config__"
MODULE_METHOD = "__tcaudit_module_method__"
SLICE_MODULE = "__tcaudit_slice__"


class NotSelected(Exception):
    """A guard of the slice was false with the script's defaults: this construction is not reached."""


class BuildError(Exception):
    """The model could not be built; the message says why in the user's terms."""


# -- which files are the user's ------------------------------------------------------------------


class UserFiles:
    """Decides whether a file belongs to the user (as opposed to Python, torch or tcaudit)."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = [os.path.realpath(r) for r in roots if r]
        excluded = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                excluded.add(path)
        excluded.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the tcaudit package
        self.excluded = sorted({os.path.realpath(p) for p in excluded if p}, key=len, reverse=True)
        self._cache: dict[str, bool] = {}

    def __call__(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is not None:
            return hit
        result = self._decide(filename)
        self._cache[filename] = result
        return result

    def _decide(self, filename: str) -> bool:
        if not filename or filename.startswith("<") or not os.path.isabs(filename):
            return False
        real = os.path.realpath(filename)
        if "site-packages" in real or "dist-packages" in real:
            return False
        for prefix in self.excluded:
            if real == prefix or real.startswith(prefix + os.sep):
                # A project inside a virtual environment's prefix is unusual; roots win.
                return any(real.startswith(root + os.sep) for root in self.roots if len(root) > len(prefix))
        return True


def _char_column(filename: str, line: int, byte_offset: int | None) -> int:
    """1-based character column for a 0-based UTF-8 byte offset on a line."""
    if byte_offset is None:
        return 1
    text = linecache.getline(filename, line)
    if not text:
        return byte_offset + 1
    return len(text.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore")) + 1


_POSITIONS: dict[types.CodeType, list] = {}


def frame_site(frame: types.FrameType) -> Site:
    """The exact expression a frame is executing, from the code object's position table."""
    code = frame.f_code
    line, column, end_line, end_column = frame.f_lineno, None, None, None
    if hasattr(code, "co_positions"):
        positions = _POSITIONS.get(code)
        if positions is None:
            positions = list(code.co_positions())
            _POSITIONS[code] = positions
        index = frame.f_lasti // 2
        if 0 <= index < len(positions):
            p_line, p_end_line, p_col, p_end_col = positions[index]
            if p_line:
                line, end_line, column, end_column = p_line, p_end_line, p_col, p_end_col
    filename = code.co_filename
    col = _char_column(filename, line, column)
    end_col = _char_column(filename, end_line or line, end_column) if end_column is not None else 0
    return Site(filename, line or 1, col, end_line or line or 1, end_col)


# -- construction sites --------------------------------------------------------------------------


class ConstructionRecorder:
    """Patches ``nn.Module.__init__`` to remember the user's line that constructed each module.

    The site of a module is the first user frame outside its own ``__init__`` chain: for
    ``self.fc = nn.Linear(...)`` in the user's class that is that line; for a torchvision model it is
    the user's factory call, because every frame in between is torchvision's.
    """

    ATTR = "_tcaudit_site"

    def __init__(self, user_files: UserFiles) -> None:
        self.user_files = user_files

    @contextmanager
    def active(self) -> Iterator[None]:
        import torch.nn as nn

        original = nn.Module.__init__
        recorder = self

        def __init__(module, *args, **kwargs):  # noqa: N807 - replaces nn.Module.__init__
            original(module, *args, **kwargs)
            try:
                site = recorder.site_of(module, sys._getframe(1))
            except Exception:  # noqa: BLE001 - a missing site must never break the user's constructor
                site = None
            object.__setattr__(module, ConstructionRecorder.ATTR, site)

        nn.Module.__init__ = __init__
        try:
            yield
        finally:
            nn.Module.__init__ = original

    def site_of(self, module: Any, frame: types.FrameType | None) -> Site | None:
        import torch.nn as nn

        # Skip the module's own constructor chain (subclass __init__ calling super().__init__()).
        while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is module:
            frame = frame.f_back
        first = None
        while frame is not None:
            if self.user_files(frame.f_code.co_filename):
                if first is None:
                    first = frame
                    if frame.f_code.co_name == "__init__":
                        break
                elif frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), nn.Module):
                    # Built by a helper (conv_block(64, 30)) called from a model's constructor: the
                    # constructor's line names the layer; the helper's line is the same for all of them.
                    return frame_site(frame)
            frame = frame.f_back
        return frame_site(first) if first is not None else None


def site_of_module(module: Any) -> Site | None:
    return getattr(module, ConstructionRecorder.ATTR, None)


# -- patches that keep a build on fake CPU tensors -----------------------------------------------


@contextmanager
def cpu_only_patches() -> Iterator[None]:
    """``.cuda()`` becomes a no-op, ``autocast("cuda")`` acts on the CPU, and dtype casts of modules
    work on fake parameters.

    The audit runs without a GPU on fake CPU tensors; a model that moves a buffer to CUDA in its
    constructor, disables CUDA autocast around a block, or is cast with ``.half()`` must behave here
    as it would on the GPU.
    """
    import torch
    import torch.nn as nn
    from torch.amp import autocast_mode

    saved = [
        (torch.Tensor, "cuda", torch.Tensor.cuda),
        (nn.Module, "cuda", nn.Module.cuda),
        (autocast_mode.autocast, "__init__", autocast_mode.autocast.__init__),
    ]
    original_autocast_init = autocast_mode.autocast.__init__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            device_type = "cpu"
            if dtype is None:
                dtype = torch.float16  # CUDA autocast's default
        original_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self
    autocast_mode.autocast.__init__ = autocast_init
    saved.append((nn.Module, "_apply", nn.Module._apply))
    nn.Module._apply = _fake_aware_apply(nn.Module._apply)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        # The script runs on a GPU; without one here the call answers None and `.type` would fail.
        saved.append((accelerator, "current_accelerator", accelerator.current_accelerator))
        accelerator.current_accelerator = lambda *args, **kwargs: torch.device("cuda")
    try:
        with fake_device():
            yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def audit_device(device: Any) -> Any:
    """The device the audit puts everything on for a device the script names: every accelerator
    (``torch.device("cuda")``, ``"cuda:0"``, ``0``, ``torch.device("cuda", 0)``, ``"mps"``) is the
    CPU, so the parameters, the buffers and the inputs of a fake build all meet on one device."""
    import torch

    if isinstance(device, bool):
        return device
    if isinstance(device, int):
        return torch.device("cpu")
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            return device  # not a device: a memory format or a dtype name travels on unchanged
        return torch.device("cpu") if parsed.type not in {"cpu", "meta"} else device
    if isinstance(device, torch.device) and device.type not in {"cpu", "meta"}:
        return torch.device("cpu")
    return device


@contextmanager
def fake_device() -> Iterator[None]:
    """Every ``device=`` argument and every ``tensor.to(device)`` goes to :func:`audit_device`.

    A model moved with ``model.to(torch.device("cuda"))`` would otherwise hold fake CUDA parameters
    while its inputs are fake CPU tensors ("Expected all tensors to be on the same device"); the same
    holds for a buffer made with ``torch.zeros(n, device=args.device)`` or a mask built in ``forward``
    on ``self.device``. ``.cuda()`` is a no-op already (see :func:`cpu_only_patches`).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_to = torch.Tensor.to

    class FakeDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "device" in kwargs:
                kwargs = {**kwargs, "device": audit_device(kwargs["device"])}
            if func is tensor_to and len(args) > 1:
                # tensor.to(device[, dtype]) / tensor.to(0); .to(dtype) and .to(other) pass unchanged
                args = (args[0], audit_device(args[1]), *args[2:])
            return func(*args, **kwargs)

    with FakeDevice():
        yield


@contextmanager
def skip_fake_initialisation() -> Iterator[None]:
    """Skip the in-place fills and random draws that initialise parameters, on fake tensors only.

    A fake tensor has no data: ``fill_``, ``zero_``, ``uniform_``, ``normal_`` and the like return
    their input with its metadata unchanged, and their cost is all in the fake dispatch (a
    decomposition per new shape): about a third of building ResNet50 on fake tensors. Everything
    around them still runs: ``nn.init``'s argument checks, the Python code of the user's
    constructor, the version counter bump (done above the Python dispatch), and every other op.
    ``nn.init.trunc_normal_`` returns at once for fake tensors, as torch's own code does for meta ones.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    skipped = {
        aten.fill_.Scalar, aten.zero_.default, aten.uniform_.default, aten.normal_.default,
        aten.bernoulli_.float, aten.exponential_.default, aten.geometric_.default, aten.log_normal_.default,
        aten.cauchy_.default, aten.random_.default, getattr(aten.random_, "from"), aten.random_.to,
    }

    class SkipInit(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in skipped and args and type(args[0]) is FakeTensor:
                return args[0]
            return func(*args, **(kwargs or {}))

    # nn.init.trunc_normal_ (ViT, Swin, ConvNeXt, MaxViT...) samples by rejection, asking
    # `mask.any()` of the data, which a fake tensor cannot answer; torch returns at once for meta
    # tensors, and so does this for fake ones.
    from torch.nn import init

    original_trunc = getattr(init, "_no_grad_trunc_normal_", None)

    def trunc_normal(tensor, *args, **kwargs):
        if type(tensor) is FakeTensor:
            return tensor
        return original_trunc(tensor, *args, **kwargs)

    if original_trunc is not None:
        init._no_grad_trunc_normal_ = trunc_normal
    try:
        with SkipInit():
            yield
    finally:
        if original_trunc is not None:
            init._no_grad_trunc_normal_ = original_trunc


def _fake_aware_apply(original):
    """``model.half()`` / ``.to(dtype)`` on fake parameters.

    ``nn.Module._apply`` swaps a FakeTensor parameter in place with ``torch.utils.swap_tensors``, which
    refuses tensors that FakeTensorMode holds weak references to. Replacing the Parameter objects
    instead is equivalent for an audit (nothing else holds them yet); tied parameters stay tied.
    """
    import torch
    import torch.nn as nn
    from torch._subclasses.fake_tensor import FakeTensor

    state = {"depth": 0, "memo": {}}

    def _apply(self, fn, recurse=True):
        # nn.Module's own parameters, buffers and children: a user's module may override them
        if not any(isinstance(t, FakeTensor)
                   for t in itertools.chain(nn.Module.parameters(self), nn.Module.buffers(self))):
            return original(self, fn, recurse)
        state["depth"] += 1
        memo = state["memo"]
        try:
            if recurse:
                for child in nn.Module.children(self):
                    child._apply(fn)
            for key, param in list(self._parameters.items()):
                if param is None:
                    continue
                if id(param) not in memo:
                    with torch.no_grad():
                        applied = fn(param)
                    memo[id(param)] = (param, nn.Parameter(applied, requires_grad=param.requires_grad))
                self._parameters[key] = memo[id(param)][1]
            for key, buffer in list(self._buffers.items()):
                if buffer is not None:
                    self._buffers[key] = fn(buffer)
            return self
        finally:
            state["depth"] -= 1
            if state["depth"] == 0:
                memo.clear()

    return _apply


# -- compiling a slice plan ----------------------------------------------------------------------


def _shift(tree: ast.AST, line_delta: int) -> None:
    ast.increment_lineno(tree, line_delta)


def _parse_statements(item: dict[str, Any], filename: str) -> list[ast.stmt]:
    """Parse a statement chunk so that every node keeps the line and column it has in the file."""
    code, line, column, prefix = item["code"], item["line"], item["column"], item.get("prefix", "")
    if column == 0:
        tree = ast.parse(code, filename=filename)
        _shift(tree, line - 1)
        return tree.body
    tree = ast.parse("if 1:\n" + prefix + code, filename=filename)
    _shift(tree, line - 2)
    return tree.body[0].body  # type: ignore[attr-defined]


def _parse_expression(item: dict[str, Any], filename: str) -> ast.expr:
    statements = _parse_statements(item, filename)
    if len(statements) != 1 or not isinstance(statements[0], ast.Expr):
        raise BuildError(f"internal: expected one expression at line {item['line']}")
    return statements[0].value


def _synthetic(code: str, line: int, filename: str) -> list[ast.stmt]:
    tree = ast.parse(code, filename=filename)
    for node in ast.walk(tree):
        if hasattr(node, "lineno"):
            node.lineno = line
            node.end_lineno = line
            node.col_offset = 0
            node.end_col_offset = 0
    return tree.body


def compile_items(items: list[dict[str, Any]], filename: str) -> list[ast.stmt]:
    body: list[ast.stmt] = []
    for item in items:
        kind = item["t"]
        if kind == "stmt":
            body.extend(_parse_statements(item, filename))
        elif kind == "synthetic":
            body.extend(_synthetic(item["code"], item["line"], filename))
        elif kind == "if":
            test = _parse_expression(item["test"], filename)
            node = ast.If(
                test=test,
                body=compile_items(item["body"], filename) or [ast.Pass()],
                orelse=compile_items(item.get("orelse", []), filename),
            )
            ast.copy_location(node, test)
            body.append(node)
        elif kind == "guard":
            test = _parse_expression(item["test"], filename)
            if item.get("expect", True):
                test = ast.UnaryOp(op=ast.Not(), operand=test)
                ast.copy_location(test, test.operand)
            raise_node = ast.Raise(
                exc=ast.Call(
                    func=ast.Name(id="__tcaudit_not_selected__", ctx=ast.Load()),
                    args=[ast.Constant(value=item["line"])],
                    keywords=[],
                ),
                cause=None,
            )
            node = ast.If(test=test, body=[raise_node], orelse=[])
            ast.copy_location(node, test)
            ast.fix_missing_locations(node)
            for sub in ast.walk(raise_node):
                sub.lineno = sub.end_lineno = item["line"]
                sub.col_offset = sub.end_col_offset = 0
            body.append(node)
        elif kind == "try":
            handlers = []
            for handler in item["handlers"]:
                handler_type = _parse_expression(handler["type"], filename) if handler.get("type") else None
                node = ast.ExceptHandler(
                    type=handler_type,
                    name=handler.get("name"),
                    body=compile_items(handler["body"], filename) or [ast.Pass()],
                )
                if handler_type is not None:
                    ast.copy_location(node, handler_type)
                handlers.append(node)
            body_items = compile_items(item["body"], filename) or [ast.Pass()]
            node = ast.Try(body=body_items, handlers=handlers or [], orelse=[], finalbody=[])
            if not handlers:
                node.finalbody = [ast.Pass()]
            ast.copy_location(node, body_items[0])
            ast.fix_missing_locations(node)
            body.append(node)
        elif kind == "model":
            value = _parse_expression(item, filename)
            if item.get("from_config") and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                # X.from_pretrained(name, ...) → the offline builder with X first (see from_config_offline)
                value.args = [value.func.value, *value.args]
                value.func = ast.copy_location(ast.Name(id=FROM_CONFIG, ctx=ast.Load()), value.func)
            dropped = set(item.get("drop_keywords", ()))
            if dropped and isinstance(value, ast.Call):
                # Weights are not architecture: never download them (weights=, pretrained=).
                value.keywords = [k for k in value.keywords if k.arg not in dropped]
            node = ast.Assign(targets=[ast.Name(id=MODEL_VAR, ctx=ast.Store())], value=value)
            ast.copy_location(node, value)
            node.targets[0].lineno = node.targets[0].end_lineno = value.lineno
            node.targets[0].col_offset = node.targets[0].end_col_offset = value.col_offset
            body.append(node)
        else:
            raise BuildError(f"internal: unknown slice item {kind!r}")
    return body


def _not_selected(line: int) -> NotSelected:
    return NotSelected(line)


class _Namespace:
    """``argparse.Namespace`` for the script's defaults, evaluating each default only when read."""

    __slots__ = ("_defaults", "_values")

    def __init__(self, defaults: dict[str, Any]) -> None:
        object.__setattr__(self, "_defaults", defaults)
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        defaults = object.__getattribute__(self, "_defaults")
        if name not in defaults:
            raise AttributeError(f"the script's argparse options define no '{name}'")
        thunk = defaults[name]
        try:
            value = thunk()
        except Exception as exc:  # noqa: BLE001
            raise BuildError(f"the argparse default of --{name.replace('_', '-')} could not be evaluated: {exc!r}") from exc
        values[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_values")[name] = value

    def __contains__(self, name: str) -> bool:
        return name in object.__getattribute__(self, "_defaults") or name in object.__getattribute__(self, "_values")

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __repr__(self) -> str:
        return "Namespace(<the script's argparse defaults>)"

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]  # vars(args) works as with argparse
        defaults = object.__getattribute__(self, "_defaults")
        return {name: getattr(self, name) for name in defaults} | object.__getattribute__(self, "_values")


def _hf_config(name: Any):
    """The config for ``from_pretrained(name)`` without the network: a local folder's config.json,
    the Hugging Face cache, or the default config of the architecture the name says (``gpt2``,
    ``bert-base-uncased`` → bert, ``meta-llama/Llama-3.2-1B`` → llama; the longest match wins)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if isinstance(name, PretrainedConfig):
        return name
    text = os.fspath(name) if isinstance(name, (str, os.PathLike)) else None
    if text is None:
        raise BuildError(f"from_pretrained() got {type(name).__name__}, not a model name or folder")
    try:
        return AutoConfig.from_pretrained(text, local_files_only=True)
    except Exception:  # noqa: BLE001 - neither a local folder nor cached: guess from the name below
        pass
    key = text.lower().rstrip("/").rsplit("/", 1)[-1].replace("_", "-")
    matches = [kind for kind in CONFIG_MAPPING.keys() if kind.replace("_", "-") in key]
    if not matches:
        raise BuildError(
            f"from_pretrained({text!r}) needs the model's config.json, which is not in a local folder or the "
            "Hugging Face cache (a scan downloads nothing), and the name names no architecture transformers knows"
        )
    return AutoConfig.for_model(max(matches, key=len))


def from_config_offline(model_class: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``X.from_pretrained(name, ...)`` built from its config with random weights, offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be fetched while scanning
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch

    config = _hf_config(kwargs.pop("config", None) or name)
    for key, value in kwargs.items():  # from_pretrained passes the config's own keys on to it (num_labels=3)
        if hasattr(config, key) and not key.startswith("_"):
            setattr(config, key, value)
    if hasattr(model_class, "from_config"):  # AutoModel* classes
        model = model_class.from_config(config)
    else:
        model = model_class._from_config(config)
    dtype = kwargs.get("torch_dtype", kwargs.get("dtype"))
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return model


def module_method(model: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module``'s own ``method`` on the built model, for the casts the slice applies to it
    (``.half()``, ``.to(torch.bfloat16)``): the user's class may define a method of that name that does
    something else. Anything that is not an nn.Module is left as it is (the audit then says so)."""
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        return model
    return getattr(nn.Module, method)(model, *args, **kwargs)


@dataclass
class BuiltModel:
    model: Any
    construction: Site | None = None


def _innermost_user_frame(tb, user_files: UserFiles) -> traceback.FrameSummary | None:
    frames = [f for f in traceback.extract_tb(tb) if user_files(f.filename)]
    return frames[-1] if frames else None


def describe_failure(exc: BaseException, user_files: UserFiles, what: str) -> str:
    """One sentence: what failed, where in the user's code, and the exception."""
    if isinstance(exc, BuildError):
        return str(exc)
    frame = _innermost_user_frame(exc.__traceback__, user_files)
    message = f"{type(exc).__name__}: {exc}".strip()
    if len(message) > 300:
        message = message[:297] + "..."
    if isinstance(exc, MemoryError):
        message = "MemoryError (the constructor tried to allocate more memory than the audit allows)"
    if frame is not None:
        code = (frame.line or "").strip()
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        return f"{what} failed at {where} (`{code}`): {message}"
    return f"{what} failed: {message}"


def build_from_plan(target: dict[str, Any], fake_mode, user_files: UserFiles) -> BuiltModel:
    filename = target["path"]
    module = types.ModuleType(SLICE_MODULE)
    module.__file__ = filename
    namespace = module.__dict__
    namespace["__tcaudit_not_selected__"] = _not_selected
    namespace["__tcaudit_namespace__"] = _Namespace
    namespace["__tcaudit_self__"] = types.SimpleNamespace  # `self` of a trainer class's __init__
    namespace[FROM_CONFIG] = from_config_offline
    namespace[MODULE_METHOD] = module_method
    body = compile_items(target["program"], filename)
    tree = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(tree)
    code = compile(tree, filename, "exec")
    sys.modules[SLICE_MODULE] = module
    recorder = ConstructionRecorder(user_files)
    try:
        with fake_mode, skip_fake_initialisation(), recorder.active(), cpu_only_patches():
            exec(code, namespace)  # noqa: S102 - the slice of the user's own script, in the sandboxed child
    except NotSelected:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from argparse, KeyboardInterrupt from user code
        if isinstance(exc, (KeyboardInterrupt,)):
            raise
        raise BuildError(describe_failure(exc, user_files, "building the model")) from None
    if MODEL_VAR not in namespace:
        raise BuildError("the model construction was not reached")
    model = namespace[MODEL_VAR]
    construction = None
    if target.get("construction"):
        c = target["construction"]
        construction = Site(filename, c["line"], c["column"], c["end_line"], c["end_column"])
    return BuiltModel(model=model, construction=construction)


def build_from_factory(target: dict[str, Any], fake_mode, user_files: UserFiles) -> BuiltModel:
    import inspect

    spec = target["factory"]
    module_name, _, attr = spec.partition(":")
    recorder = ConstructionRecorder(user_files)
    try:
        with fake_mode, skip_fake_initialisation(), recorder.active(), cpu_only_patches():
            module = importlib.import_module(module_name)
            factory: Any = module
            for part in attr.split("."):
                factory = getattr(factory, part)
            model = factory()
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, (ModuleNotFoundError, AttributeError)) and not _innermost_user_frame(exc.__traceback__, user_files):
            raise BuildError(f"cannot load the model factory {spec!r}: {type(exc).__name__}: {exc}") from None
        raise BuildError(describe_failure(exc, user_files, f"calling the model factory {spec}")) from None
    construction = None
    try:
        source = inspect.getsourcefile(inspect.unwrap(factory))
        _, line = inspect.getsourcelines(inspect.unwrap(factory))
        if source and user_files(os.path.abspath(source)):
            construction = Site(os.path.abspath(source), line, 1, line, 0)
    except (OSError, TypeError):
        construction = None
    return BuiltModel(model=model, construction=construction)
