"""Where the host waits for the device, and which tensors and devices are the host's: the syncs TC601
reports once per step, and what TC409 orders a non-blocking device-to-host copy against (a copy into
host memory that only a sync makes safe to read)."""

from __future__ import annotations

import re

import libcst as cst

from tcaudit.script.expressions import DEVICE_FACTORIES, attribute_chain, literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import keyword, param_names

# Tensor methods that bring a value to the host; on a CUDA tensor each waits for the stream.
SYNC_METHODS = ("item", "cpu", "numpy", "tolist")
# ``torch.cuda.synchronize()`` and its accelerator-generic spellings, by qualified name.
SYNCHRONIZE = re.compile(r"^torch\.(cuda|accelerator|xpu|mps)\.synchronize$")
# Methods of streams and events that make the host (or a stream) wait, or that a script polls
# (``while not event.query(): ...``): ``stream.synchronize()``, ``event.synchronize()``, ``event.wait()``.
WAIT_METHODS = frozenset({"synchronize", "wait", "query", "wait_event", "wait_stream", "barrier"})
# Tensor methods that make a new tensor in host memory (or return the host tensor itself).
_HOST_METHODS = frozenset({"pin_memory", "cpu", "share_memory_"})
_HOST_FUNCTIONS = frozenset({"torch.from_numpy", "torch.frombuffer", "torch.load"})


def _enclosing_parameters(facts: ScriptFacts, name: str, fn: cst.FunctionDef | None) -> bool:
    """Whether the root of ``name`` is a parameter of ``fn`` or of a function around it: its value
    comes from a caller, whatever the file binds to the same name elsewhere."""
    root = name.split(".")[0]
    if root in ("self", "cls"):
        return False
    while fn is not None:
        if root in param_names(fn):
            return True
        outer = next((frame for node, frame in facts.functions if node is fn), None)
        fn = outer.function if outer is not None else None
    return False


def _followed_leaves(facts: ScriptFacts, expr: cst.BaseExpression, fn: cst.FunctionDef | None) -> list[cst.BaseExpression] | None:
    """The values ``expr`` may stand for, through the file's assignments (``x[i] = v`` writes into
    ``x``, it does not rebind it) and both arms of ``a if c else b``; None where one of them is not
    visible (a parameter, a name the file never binds)."""
    leaves: list[cst.BaseExpression] = []
    stack = [(expr, 0)]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > 6:
            return None
        if isinstance(node, cst.IfExp):
            stack += [(node.body, depth + 1), (node.orelse, depth + 1)]
            continue
        if isinstance(node, cst.BooleanOperation):
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
            continue
        dotted = attribute_chain(node)
        if dotted is not None:
            if _enclosing_parameters(facts, dotted, fn):
                return None
            bindings = [b for b in facts.bindings_of(dotted) if not b.is_item_write]
            if bindings:
                stack += [(b.value, depth + 1) for b in bindings]
                continue
            if facts.resolve(dotted) is None:
                return None  # a name the file never binds
        leaves.append(node)
    return leaves or None


def names_host_device(facts: ScriptFacts, expr: cst.BaseExpression | None, fn: cst.FunctionDef | None = None) -> bool:
    """Whether a device argument certainly names the host: ``"cpu"``, ``torch.device("cpu")``, or a
    name every visible value of which is one of those. A name that may be a GPU is not."""
    if expr is None:
        return False
    leaves = _followed_leaves(facts, expr, fn)
    if leaves is None:
        return False
    for leaf in leaves:
        value = literal(leaf)
        if isinstance(value, str) and value.split(":")[0] == "cpu":
            continue
        if isinstance(leaf, cst.Call) and facts.qualname(leaf.func) == "torch.device":
            kind = keyword(leaf, "type")
            first = kind.value if kind is not None else (leaf.args[0].value if leaf.args else None)
            value = literal(first)
            if isinstance(value, str) and value.split(":")[0] == "cpu":
                continue
        return False
    return True


def is_host_tensor(facts: ScriptFacts, expr: cst.BaseExpression | None, fn: cst.FunctionDef | None = None) -> bool:
    """Whether a tensor expression certainly lives in host memory: every visible value of its name
    (through ``buf[:n]`` and ``buf.view(...)`` to ``buf``) is built there: ``torch.empty(n,
    pin_memory=True)``, a factory with ``device="cpu"`` (or with no device in a file that sets no
    default device; a ``*_like`` factory follows its input's device, so it needs ``device="cpu"``),
    ``x.pin_memory()``, ``x.cpu()``, ``x.to("cpu")`` (blocking), ``torch.from_numpy(a)``."""
    if expr is None:
        return False
    while isinstance(expr, cst.Subscript) or (
        isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("view", "reshape", "narrow", "flatten", "squeeze", "unsqueeze")
    ):
        expr = expr.value if isinstance(expr, cst.Subscript) else expr.func.value  # type: ignore[union-attr]
    leaves = _followed_leaves(facts, expr, fn)
    if leaves is None:
        return False
    default_device = "set_default_device" in facts.source.text or "set_default_tensor_type" in facts.source.text
    for leaf in leaves:
        if not isinstance(leaf, cst.Call):
            return False
        func = leaf.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        qual = facts.qualname(func) or ""
        pinned = keyword(leaf, "pin_memory")
        if pinned is not None and literal(pinned.value) is True:
            continue
        if method in _HOST_METHODS or qual in _HOST_FUNCTIONS:
            continue
        if method == "to":
            device = keyword(leaf, "device")
            first = device.value if device is not None else next((a.value for a in leaf.args if a.keyword is None), None)
            blocking = keyword(leaf, "non_blocking")
            if names_host_device(facts, first, fn) and (blocking is None or literal(blocking.value) is False):
                continue
            return False
        if qual in DEVICE_FACTORIES:
            device = keyword(leaf, "device")
            if device is not None:
                if names_host_device(facts, device.value, fn):
                    continue
                return False
            if qual.endswith("_like") or default_device:
                return False
            continue
        return False
    return True
