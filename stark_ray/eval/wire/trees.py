"""Structures of values (a task's inputs, a model's outputs) as JSON: nested lists, tuples and dicts of tensors and
plain values, each tensor described by the caller (:mod:`stark_ray.eval.wire.exchange` places it in a shared buffer),
and decoded on the other side with every field checked (the worker runs hostile code: what it says is data)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stark_ray.eval.wire.exchange import MAX_DIMS, ExchangeError

MAX_LEAVES = 4096  # tensors and values in one structure
_PLAIN = (bool, int, float, str, type(None))


def path_of(prefix: str, key: int | str) -> str:
    """The name of an item of a structure: ``output[0]``, ``output['logits']`` (as comparisons report it)."""
    return f"{prefix}[{key!r}]" if isinstance(key, str) else f"{prefix}[{key}]"


def encode_tree(value: Any, on_tensor: Callable[[torch.Tensor, str], dict[str, Any]],
                prefix: str = "output") -> dict[str, Any]:
    """A (nested) list/tuple/dict of tensors and plain values as JSON; ``on_tensor`` describes each tensor, given
    its path (:func:`path_of`). A plain recursive function, not a closure that calls itself: such a closure is a
    reference cycle, and it would keep ``on_tensor`` (and the gigabytes of a large trial it refers to) alive until
    the garbage collector happens to run."""
    return _encode(value, prefix, on_tensor, [0])


def _encode(v: Any, path: str, on_tensor: Callable[[torch.Tensor, str], dict[str, Any]],
            count: list[int]) -> dict[str, Any]:
    count[0] += 1
    if count[0] > MAX_LEAVES:
        raise ExchangeError(f"more than {MAX_LEAVES} values in one structure")
    if isinstance(v, torch.Tensor):
        return {"k": "tensor", **on_tensor(v, path)}
    if isinstance(v, list | tuple):
        return {"k": "tuple" if isinstance(v, tuple) else "list",
                "items": [_encode(x, path_of(path, i), on_tensor, count) for i, x in enumerate(v)]}
    if isinstance(v, dict):
        return {"k": "dict",
                "items": [[str(key), _encode(x, path_of(path, str(key)), on_tensor, count)] for key, x in v.items()]}
    if isinstance(v, _PLAIN) and not (isinstance(v, float) and not math.isfinite(v)):
        return {"k": "value", "v": v}
    if isinstance(v, float):
        return {"k": "float", "v": repr(v)}  # nan, inf: not JSON
    return {"k": "other", "type": type(v).__name__}


def decode_tree(node: Any, on_tensor: Callable[[dict[str, Any]], Any], depth: int = 0) -> Any:
    """The structure :func:`encode_tree` described; ``on_tensor`` turns each tensor entry into a value."""
    if depth > 64 or not isinstance(node, dict):
        raise ExchangeError("a malformed structure")
    kind = node.get("k")
    if kind == "tensor":
        return on_tensor(node)
    if kind in ("list", "tuple"):
        items = node.get("items")
        if not isinstance(items, list):
            raise ExchangeError("a malformed structure")
        seq = [decode_tree(x, on_tensor, depth + 1) for x in items]
        return tuple(seq) if kind == "tuple" else seq
    if kind == "dict":
        items = node.get("items")
        if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2 for p in items):
            raise ExchangeError("a malformed structure")
        return {str(k): decode_tree(v, on_tensor, depth + 1) for k, v in items}
    if kind == "value":
        v = node.get("v")
        if not isinstance(v, _PLAIN):
            raise ExchangeError("a malformed structure")
        return v
    if kind == "float":
        try:
            return float(str(node.get("v")))
        except ValueError:
            raise ExchangeError("a malformed structure") from None
    if kind == "other":
        return Unreadable(str(node.get("type"))[:60])
    raise ExchangeError("a malformed structure")


@dataclass(frozen=True)
class Unreadable:
    """An output value of a type that cannot cross as JSON (compared as unequal to anything)."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


@dataclass(frozen=True)
class LeafMeta:
    """What the worker says about one output tensor of a candidate."""

    slot: str | None  # the path of the slot it was copied into (None: not copied: shape, dtype or device differ)
    shape: tuple[int, ...]
    dtype: str
    device: str


def decode_leaf_meta(node: dict[str, Any], slot_paths: set[str]) -> LeafMeta:
    """A worker's description of an output tensor, checked field by field."""
    shape = node.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 48 for n in shape):
        raise ExchangeError("a malformed output shape")
    slot = node.get("slot")
    if slot is not None and (not isinstance(slot, str) or slot not in slot_paths):
        raise ExchangeError("a malformed output slot")
    dtype = node.get("dtype")
    if not isinstance(dtype, str) or not 0 < len(dtype) <= 40:
        raise ExchangeError("a malformed output dtype")
    device = node.get("device")
    if device not in ("cpu", "cuda", "meta", "other"):
        raise ExchangeError("a malformed output device")
    return LeafMeta(slot, tuple(shape), dtype, str(device))
