"""Tensors exchanged between the judge and the worker through memory both processes map, never through pickles.

The judge allocates every buffer the two share: a copy of the inputs a candidate runs on, and one slot per output
tensor the candidate must fill. A buffer is sent as a file descriptor over a Unix socket (``SCM_RIGHTS``), which
works across PID namespaces (an isolated worker), with its layout in the JSON message beside it (the tensors of one
message are placed on their buffers by :mod:`stark_ray.eval.wire.outbox`):

- on the CPU, a ``memfd`` mapped with ``mmap`` in both processes;
- on a CUDA device, an allocation of the driver's virtual memory management (``cuMemCreate`` with a POSIX file
  descriptor handle, mapped with ``cuMemMap``): legacy CUDA IPC handles do not cross PID namespaces.

What the worker sends back is plain JSON (:mod:`stark_ray.eval.wire.trees`): the structure of a candidate's outputs and,
for each output tensor, its shape and dtype and whether it was copied into its slot. Nothing the worker says is
unpickled or executed; every field is checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# dtypes that may cross: by the name torch prints without its "torch." prefix
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
              torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
}
MAX_DIMS = 16


class ExchangeError(RuntimeError):
    """Shared memory could not be made or mapped, or a peer sent a structure that cannot be read."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: Any) -> torch.dtype:
    if not isinstance(name, str) or name not in DTYPES:
        raise ExchangeError(f"unsupported dtype {name!r}")
    return DTYPES[name]


# -- the CUDA driver's virtual memory management, through ctypes ------------------------------------------------
class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _POSIX_FD, _ON_DEVICE, _READ_WRITE, _GRANULARITY_RECOMMENDED = 1, 1, 1, 3, 1


class _Driver:
    """The few driver calls the exchange needs (libcuda is loaded once, on first use)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise ExchangeError(f"the CUDA driver library is not available: {e}") from None
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, what: str, status: int) -> None:
        if status != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(name))
            raise ExchangeError(f"{what} failed: {(name.value or b'?').decode()} ({status})")

    def prop(self, device: int) -> _AllocationProp:
        prop = _AllocationProp()
        prop.type = _PINNED
        prop.requestedHandleTypes = _POSIX_FD
        prop.location.type = _ON_DEVICE
        prop.location.id = device
        return prop

    def granularity(self, device: int) -> int:
        gran = ctypes.c_size_t()
        prop = self.prop(device)
        self.check("cuMemGetAllocationGranularity", self.lib.cuMemGetAllocationGranularity(
            ctypes.byref(gran), ctypes.byref(prop), _GRANULARITY_RECOMMENDED))
        return int(gran.value)

    def create(self, size: int, device: int) -> int:
        handle = ctypes.c_ulonglong()
        prop = self.prop(device)
        self.check("cuMemCreate", self.lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size),
                                                       ctypes.byref(prop), ctypes.c_ulonglong(0)))
        return int(handle.value)

    def export_fd(self, handle: int) -> int:
        fd = ctypes.c_int(-1)
        self.check("cuMemExportToShareableHandle", self.lib.cuMemExportToShareableHandle(
            ctypes.byref(fd), ctypes.c_ulonglong(handle), _POSIX_FD, ctypes.c_ulonglong(0)))
        return int(fd.value)

    def import_fd(self, fd: int) -> int:
        handle = ctypes.c_ulonglong()
        self.check("cuMemImportFromShareableHandle", self.lib.cuMemImportFromShareableHandle(
            ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD))
        return int(handle.value)

    def map(self, handle: int, size: int, device: int) -> int:
        ptr = ctypes.c_ulonglong()
        self.check("cuMemAddressReserve", self.lib.cuMemAddressReserve(
            ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(0),
            ctypes.c_ulonglong(0)))
        try:
            self.check("cuMemMap", self.lib.cuMemMap(ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size),
                                                     ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                                                     ctypes.c_ulonglong(0)))
            access = _AccessDesc()
            access.location.type = _ON_DEVICE
            access.location.id = device
            access.flags = _READ_WRITE
            self.check("cuMemSetAccess", self.lib.cuMemSetAccess(ctypes.c_ulonglong(ptr.value),
                                                                 ctypes.c_size_t(size), ctypes.byref(access),
                                                                 ctypes.c_size_t(1)))
        except ExchangeError:
            self.lib.cuMemUnmap(ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size))
            self.lib.cuMemAddressFree(ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size))
            raise
        return int(ptr.value)

    def unmap(self, ptr: int, size: int, handle: int) -> None:
        self.lib.cuMemUnmap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
        self.lib.cuMemAddressFree(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
        self.lib.cuMemRelease(ctypes.c_ulonglong(handle))


_DRIVER: list[_Driver] = []


def _driver() -> _Driver:
    if not _DRIVER:
        _DRIVER.append(_Driver())
    return _DRIVER[0]


class _DeviceArray:
    """A device pointer as the CUDA array interface describes it: torch wraps it without a copy."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


# -- one shared buffer -------------------------------------------------------------------------------------------
class SharedBuffer:
    """``nbytes`` of memory shared with another process: ``data`` is its uint8 view here."""

    def __init__(self, nbytes: int, device: str, data: torch.Tensor, release: Callable[[], None],
                 export: Callable[[], int]) -> None:
        self.nbytes = nbytes
        self.device = device
        self.data = data
        self._release = release
        self._export = export
        self.released = False

    @staticmethod
    def allocate(nbytes: int, device: str) -> SharedBuffer:
        """New shared memory on ``device`` ("cpu" or "cuda")."""
        if device == "cpu":
            fd = os.memfd_create("stark-exchange", os.MFD_CLOEXEC)
            try:
                return _host_buffer(fd, nbytes, owner=True)
            finally:
                os.close(fd)
        return _device_buffer(None, nbytes)

    @staticmethod
    def attach(fd: int, nbytes: int, device: str) -> SharedBuffer:
        """Map a buffer another process shared (``fd`` is closed here)."""
        try:
            if device == "cpu":
                return _host_buffer(fd, nbytes, owner=False)
            return _device_buffer(fd, nbytes)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def export_fd(self) -> int:
        """A new descriptor for another process (the caller closes it once sent)."""
        return self._export()

    def view(self, spec: TensorSpec) -> torch.Tensor:
        """The tensor ``spec`` describes, on this buffer (no copy)."""
        dtype = dtype_of(spec.dtype)
        if self.nbytes % dtype.itemsize:
            raise ExchangeError("buffer size is not a multiple of the element size")
        typed = self.data.view(dtype) if self.nbytes else torch.empty(0, dtype=dtype, device=self.data.device)
        return typed.as_strided(spec.shape, spec.stride, spec.offset)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.data = torch.empty(0, dtype=torch.uint8)
            self._release()


def _host_buffer(fd: int, nbytes: int, owner: bool) -> SharedBuffer:
    size = max(nbytes, 1)
    if owner:
        os.ftruncate(fd, size)
    elif os.fstat(fd).st_size < size:
        raise ExchangeError("a shared buffer is smaller than its description")
    mm = mmap.mmap(fd, size)
    saved = os.dup(fd)
    data = torch.frombuffer(mm, dtype=torch.uint8)[:nbytes]

    def release() -> None:
        with contextlib.suppress(OSError):
            os.close(saved)

    def export() -> int:
        return os.dup(saved)

    buf = SharedBuffer(nbytes, "cpu", data, release, export)
    buf._mmap = mm  # type: ignore[attr-defined]  # kept alive with the buffer
    return buf


class _Owned:
    """The device memory of the shared buffers this process allocated (outside torch's allocator): now and at its
    peak since :func:`reset_shared_peak`."""

    live = 0
    peak = 0


def shared_bytes() -> int:
    """Device memory held now by the shared buffers this process allocated."""
    return _Owned.live


def shared_peak() -> int:
    return _Owned.peak


def reset_shared_peak() -> None:
    _Owned.peak = _Owned.live


def _device_buffer(fd: int | None, nbytes: int) -> SharedBuffer:
    drv = _driver()
    device = torch.cuda.current_device()
    torch.cuda.init()
    gran = drv.granularity(device)
    size = max(gran, math.ceil(max(nbytes, 1) / gran) * gran)
    handle = drv.create(size, device) if fd is None else drv.import_fd(fd)
    try:
        ptr = drv.map(handle, size, device)
    except ExchangeError:
        drv.lib.cuMemRelease(ctypes.c_ulonglong(handle))
        raise
    data = torch.as_tensor(_DeviceArray(ptr, size), device="cuda")[:nbytes]
    owned = size if fd is None else 0  # an attached buffer is the other process's memory
    _Owned.live += owned
    _Owned.peak = max(_Owned.peak, _Owned.live)

    def release() -> None:
        torch.cuda.synchronize()  # nothing queued may still touch it
        drv.unmap(ptr, size, handle)
        _Owned.live -= owned

    def export() -> int:
        return drv.export_fd(handle)

    return SharedBuffer(nbytes, "cuda", data, release, export)


# -- layout of a tensor on a buffer ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """A tensor's layout on shared buffer number ``buffer`` of a message (offsets and strides in elements)."""

    buffer: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    nbytes: int  # of the buffer
    device: str  # "cpu" or "cuda"

    def to_json(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "shape": list(self.shape), "stride": list(self.stride), "offset": self.offset,
                "dtype": self.dtype, "nbytes": self.nbytes, "device": self.device}

    @staticmethod
    def from_json(d: dict[str, Any]) -> TensorSpec:
        return TensorSpec(int(d["buffer"]), tuple(int(x) for x in d["shape"]), tuple(int(x) for x in d["stride"]),
                          int(d["offset"]), str(d["dtype"]), int(d["nbytes"]), str(d["device"]))


def byte_sum(t: torch.Tensor) -> torch.Tensor:
    """A sum of a tensor's bytes (int64, wrapping, on its device: read as int64 words where they fit, one pass over
    memory): what a worker's answer and the judge's slot must agree on, so that the answer cannot come before the
    outputs are final."""
    flat = t.detach().reshape(-1).contiguous().view(torch.uint8)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    for word, size in ((torch.int64, 8), (torch.int32, 4)):
        if flat.numel() % size == 0:
            return flat.view(word).sum(dtype=torch.int64)
    return flat.sum(dtype=torch.int64)


def digests(buffers: list[SharedBuffer]) -> list[int]:
    """The byte sum of each slot buffer, read back: one pass over memory per buffer (a sum per slot costs a
    launch each: 111 slots took 5-14 ms of host time on an H200, more than the batch being timed)."""
    return torch.stack([byte_sum(b.data) for b in buffers]).tolist() if buffers else []


def touch(t: torch.Tensor) -> None:
    """Fault in every page of a shared mapping here (read and write, values kept): outside the timed window."""
    flat = t.detach().reshape(-1).view(torch.uint8) if t.is_contiguous() else None
    if flat is not None and flat.numel():
        flat.add_(0)  # every byte read and written again (copy_ of a tensor onto itself does nothing)
