"""The worker's side of the exchange: the judge's shared buffers seen as tensors, outputs copied into its slots.

The judge shares its inputs and output slots as buffers (:mod:`stark_ray.eval.wire.exchange`) and describes them as
JSON trees (:mod:`stark_ray.eval.wire.trees`); here those become tensors that view the buffers, and a candidate's
outputs are copied into the slot for their path. Nothing here compares anything: the judge does.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from stark_ray.eval.wire.exchange import SharedBuffer, TensorSpec, dtype_name
from stark_ray.eval.wire.trees import decode_tree, encode_tree


def map_buffers(fds: list[int], specs: list[TensorSpec]) -> dict[int, SharedBuffer]:
    """Buffer index -> the buffer the descriptor ``fds[index]`` holds, as ``specs`` size it; RuntimeError (every
    descriptor closed) when they do not match."""
    by_buffer = {s.buffer: s for s in specs}
    if sorted(by_buffer) != list(range(len(fds))):
        for fd in fds:
            os.close(fd)
        raise RuntimeError("the descriptors do not match the message")
    return {i: SharedBuffer.attach(fd, by_buffer[i].nbytes, by_buffer[i].device) for i, fd in enumerate(fds)}


def specs_of(trees: list[Any]) -> list[TensorSpec]:
    """The specs of every shared tensor in the judge's JSON ``trees`` (inputs, sets), in order."""
    found: list[TensorSpec] = []

    def on_tensor(node: dict[str, Any]) -> None:
        found.append(TensorSpec.from_json(node["spec"]))

    for tree in trees:
        decode_tree(tree, on_tensor)
    return found


def inputs_on(tree: Any, bufs: dict[int, SharedBuffer]) -> list[Any]:
    """The inputs the judge shared: its tree with each tensor a view of its buffer (no copy)."""
    inputs = decode_tree(tree, lambda node: bufs[int(node["spec"]["buffer"])].view(TensorSpec.from_json(node["spec"])))
    return list(inputs)


def slots_on(slot_specs: list[dict[str, Any]], bufs: dict[int, SharedBuffer]) -> dict[str, torch.Tensor]:
    """Output path -> the judge's slot for it, a view of its buffer."""
    return {str(s["path"]): bufs[int(s["buffer"])].view(TensorSpec.from_json(s)) for s in slot_specs}


def fill_slots(out: Any, slots: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Copy each output tensor into the slot for its path where shape, dtype and device match; describe all."""

    def on_tensor(t: torch.Tensor, path: str) -> dict[str, Any]:
        device = t.device.type if t.device.type in ("cpu", "cuda", "meta") else "other"
        slot = slots.get(path)
        copied = (slot is not None and tuple(t.shape) == tuple(slot.shape) and t.dtype == slot.dtype
                  and t.device.type == slot.device.type)
        if copied:
            assert slot is not None
            slot.copy_(t.detach())
        return {"slot": path if copied else None, "shape": list(t.shape), "dtype": dtype_name(t.dtype),
                "device": device}

    return encode_tree(out, on_tensor)
