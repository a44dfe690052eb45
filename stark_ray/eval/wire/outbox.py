"""What one message carries beside its JSON: the shared buffers (eval/wire/exchange.py) the sender allocates for it. An
:class:`Outbox` places each tensor on a buffer of its own (layout kept), makes empty output slots (0xFF bytes
until written), or packs many tensors on one buffer per device kind at aligned offsets (a confirmation batch's
hundreds of sets), and hands out their descriptors to send.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from stark_ray.eval.wire.exchange import ExchangeError, SharedBuffer, TensorSpec, dtype_name

PACK_ALIGN = 256  # bytes: every packed tensor starts at such an offset (any dtype's alignment)


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from the start of ``t``'s first element to the end of its last (its storage offset excluded)."""
    return _span(tuple(t.shape), tuple(t.stride()), t.element_size())


def _span(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    if math.prod(shape) == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
    return (last + 1) * itemsize


class Outbox:
    """Buffers to send with one message: each tensor placed on a buffer of its own (layout kept)."""

    def __init__(self) -> None:
        self.buffers: list[SharedBuffer] = []
        self.slot_buffers: list[SharedBuffer] = []

    def poison_slots(self) -> None:
        """Every slot back to 0xFF bytes (before another call writes into them)."""
        for buf in self.slot_buffers:
            buf.data.fill_(255)

    def place(self, t: torch.Tensor, fill: bool = True) -> tuple[TensorSpec, torch.Tensor]:
        """A shared buffer holding ``t``'s layout (and, with ``fill``, its values); its spec and view here."""
        if any(s < 0 for s in t.stride()):
            raise ExchangeError("a tensor with negative strides cannot be shared")
        device = "cpu" if t.device.type == "cpu" else "cuda"
        buf = SharedBuffer.allocate(span_bytes(t), device)
        self.buffers.append(buf)
        spec = TensorSpec(len(self.buffers) - 1, tuple(t.shape), tuple(t.stride()), 0, dtype_name(t.dtype),
                          buf.nbytes, device)
        view = buf.view(spec)
        if fill:
            view.copy_(t)
        return spec, view

    def slot(self, shape: Sequence[int], dtype: torch.dtype, device: str) -> tuple[TensorSpec, torch.Tensor]:
        """A contiguous output slot, filled with 0xFF bytes (NaN in every float format) until written."""
        t = torch.empty(tuple(shape), dtype=dtype, device="meta")
        nbytes = t.numel() * t.element_size()
        buf = SharedBuffer.allocate(nbytes, device)
        self.buffers.append(buf)
        self.slot_buffers.append(buf)
        buf.data.fill_(255)
        spec = TensorSpec(len(self.buffers) - 1, tuple(t.shape), tuple(t.stride()), 0, dtype_name(dtype), nbytes,
                          device)
        return spec, buf.view(spec)

    def pack(self, tensors: Sequence[torch.Tensor], slots: bool = False) -> list[tuple[TensorSpec, torch.Tensor]]:
        """Many tensors on few buffers (one per device kind), one after another at aligned offsets: with
        ``slots``, contiguous output slots of their shapes and dtypes filled with 0xFF bytes; else copies of the
        tensors (layouts kept). A spec and a view here for each, in order. A confirmation batch of hundreds of
        sets shares two buffers, not hundreds of descriptors and driver allocations of 2 MB each."""
        placed: list[tuple[TensorSpec, torch.Tensor] | None] = [None] * len(tensors)
        for device in ("cpu", "cuda"):
            mine = [i for i, t in enumerate(tensors) if ("cpu" if t.device.type == "cpu" else "cuda") == device]
            if not mine:
                continue
            layouts = [(tuple(tensors[i].shape), tuple(tensors[i].stride()) if not slots
                        else tuple(torch.empty(tensors[i].shape, device="meta").stride()), tensors[i].dtype)
                       for i in mine]
            if any(st < 0 for _, stride, _ in layouts for st in stride):
                raise ExchangeError("a tensor with negative strides cannot be shared")
            offsets, total = [], 0
            for shape, stride, dtype in layouts:
                total = -(-total // PACK_ALIGN) * PACK_ALIGN
                offsets.append(total)
                total += _span(shape, stride, dtype.itemsize)
            buf = SharedBuffer.allocate(-(-max(total, 1) // PACK_ALIGN) * PACK_ALIGN, device)
            self.buffers.append(buf)
            if slots:
                self.slot_buffers.append(buf)
                buf.data.fill_(255)
            for i, at, (shape, stride, dtype) in zip(mine, offsets, layouts, strict=True):
                spec = TensorSpec(len(self.buffers) - 1, shape, stride, at // dtype.itemsize, dtype_name(dtype),
                                  buf.nbytes, device)
                view = buf.view(spec)
                if not slots:
                    view.copy_(tensors[i])
                placed[i] = (spec, view)
        return [p for p in placed if p is not None]

    def fds(self) -> list[int]:
        return [b.export_fd() for b in self.buffers]

    def release(self) -> None:
        for b in self.buffers:
            b.release()
        self.buffers, self.slot_buffers = [], []
