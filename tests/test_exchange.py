"""Shared buffers between two processes: the judge's memory, mapped by a worker that writes into it.

On the CPU (memfd) here; on a CUDA device (the driver's VMM, POSIX descriptors) with ``-m gpu``, also into a
worker in PID and network namespaces of its own, where legacy CUDA IPC handles do not work."""

from __future__ import annotations

import gc
import itertools
import json
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix
from stark_ray.eval.wire.exchange import ExchangeError, SharedBuffer, TensorSpec
from stark_ray.eval.wire.outbox import Outbox
from stark_ray.eval.wire.protocol import send_fds
from stark_ray.eval.wire.trees import decode_leaf_meta, decode_tree, encode_tree

ROOT = Path(__file__).resolve().parents[1]

# the peer: maps every buffer it gets, adds 1 to the first tensor and writes 2 * it into the second
PEER = r"""
import json, socket, sys
import torch
from stark_ray.eval.wire.exchange import SharedBuffer, TensorSpec
from stark_ray.eval.wire.protocol import recv_fds
sock = socket.socket(fileno=int(sys.argv[1]))
msg = json.loads(sys.stdin.readline())
fds = recv_fds(sock, len(msg["specs"]))
specs = [TensorSpec.from_json(s) for s in msg["specs"]]
bufs = [SharedBuffer.attach(fd, s.nbytes, s.device) for fd, s in zip(fds, specs)]
x, out = (b.view(s) for b, s in zip(bufs, specs))
seen = x.clone()
x.add_(1)
out.copy_(seen * 2)
if x.is_cuda:
    torch.cuda.synchronize()
print(json.dumps({"ptr": x.data_ptr() != 0, "sum": float(seen.double().sum())}), flush=True)
sys.stdin.readline()
"""


def _exchange(device: str, isolate: bool = False) -> None:
    x = torch.arange(12, dtype=torch.float32, device=device).reshape(3, 4).t()  # not contiguous: strides travel
    box = Outbox()
    spec_x, view_x = box.place(x)
    spec_out, slot = box.slot((4, 3), torch.float32, device)
    assert torch.isnan(slot).all()  # poisoned until written
    parent, child = socket.socketpair()
    prefix = list(isolation_prefix()) if isolate else []
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([*prefix, sys.executable, "-c", PEER, str(child.fileno())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, pass_fds=[child.fileno()], env=env, text=True)
    child.close()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"specs": [spec_x.to_json(), spec_out.to_json()]}) + "\n")
        proc.stdin.flush()
        fds = box.fds()
        send_fds(parent, fds)
        for fd in fds:
            os.close(fd)
        reply = json.loads(proc.stdout.readline())
        assert reply["ptr"] and reply["sum"] == float(x.double().sum())
        if device == "cuda":
            torch.cuda.synchronize()
        assert torch.equal(view_x, x + 1)  # the peer's writes are seen here
        assert torch.equal(slot, x * 2)
        assert torch.equal(x, torch.arange(12, dtype=torch.float32, device=device).reshape(3, 4).t())  # ours kept
        proc.stdin.write("bye\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        parent.close()
        box.release()


def test_host_buffers_are_shared_with_another_process() -> None:
    _exchange("cpu")


def test_host_buffers_reach_an_isolated_process() -> None:
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    _exchange("cpu", isolate=True)


@pytest.mark.gpu
def test_device_buffers_are_shared_with_another_process() -> None:
    _exchange("cuda")


@pytest.mark.gpu
def test_device_buffers_reach_an_isolated_process() -> None:
    _exchange("cuda", isolate=True)


def test_a_view_keeps_dtype_shape_and_strides() -> None:
    buf = SharedBuffer.allocate(64, "cpu")
    t = buf.view(TensorSpec(0, (2, 3), (1, 2), 1, "float64", 64, "cpu"))
    assert t.shape == (2, 3) and t.stride() == (1, 2) and t.dtype == torch.float64
    buf.release()


def test_packed_tensors_share_one_buffer_and_keep_their_layouts() -> None:
    """A confirmation batch's hundreds of sets go on one buffer (one descriptor), each tensor at an aligned offset
    with its strides and values, readable from the descriptor as another process maps it; slots start as 0xFF."""
    tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), torch.arange(5, dtype=torch.int8),
               torch.randn(3, dtype=torch.float64)] * 100
    box = Outbox()
    placed = box.pack(tensors)
    slots = box.pack(tensors[:3], slots=True)
    try:
        assert len(box.buffers) == 2 and box.slot_buffers == box.buffers[1:]
        other = SharedBuffer.attach(box.buffers[0].export_fd(), box.buffers[0].nbytes, "cpu")
        for t, (spec, view) in zip(tensors, placed, strict=True):
            assert spec.buffer == 0 and (spec.offset * t.element_size()) % 256 == 0
            assert view.stride() == t.stride() and torch.equal(view, t)
            assert torch.equal(other.view(TensorSpec.from_json(json.loads(json.dumps(spec.to_json())))), t)
        spans = sorted((s.offset * t.element_size(), s.offset * t.element_size() + t.numel() * t.element_size())
                       for t, (s, _) in zip(tensors, placed, strict=True))
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no two overlap
        for t, (spec, view) in zip(tensors[:3], slots, strict=True):
            assert spec.buffer == 1 and view.is_contiguous() and view.shape == t.shape
            assert bool((view.contiguous().view(torch.uint8) == 255).all())
        other.release()
    finally:
        box.release()


def test_trees_cross_as_json_and_unknown_values_stay_unreadable() -> None:
    value = (torch.ones(2), [1, 2.5, None, True], {"a": torch.zeros(1), "b": "x"}, float("nan"), object())
    tensors: list[torch.Tensor] = []
    paths: list[str] = []

    def on_tensor(t: torch.Tensor, path: str) -> dict:
        tensors.append(t)
        paths.append(path)
        return {"i": len(tensors) - 1}

    tree = json.loads(json.dumps(encode_tree(value, on_tensor)))
    back = decode_tree(tree, lambda node: tensors[node["i"]])
    assert isinstance(back, tuple) and back[0] is tensors[0] and back[1] == [1, 2.5, None, True]
    assert back[2]["b"] == "x" and back[2]["a"] is tensors[1]
    assert back[3] != back[3] and repr(back[4]) == "<object>"
    assert paths == ["output[0]", "output[2]['a']"]


def test_describing_a_tree_leaves_no_cycle_that_keeps_its_tensors() -> None:
    """What ``on_tensor`` refers to (a large trial's inputs, the worker's mapped slots) goes as soon as the
    caller drops it, without waiting for the garbage collector: no reference cycle holds it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        big = torch.ones(1024)
        gone = weakref.ref(big)

        def on_tensor(t: torch.Tensor, path: str, trial: tuple = (big,)) -> dict:  # it refers to the trial
            return {"n": len(trial)}

        encode_tree([big, (big, {"x": big})], on_tensor)
        del big, on_tensor
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("node", [
    {"shape": [-1], "dtype": "float32", "device": "cpu", "slot": None},
    {"shape": [1], "dtype": 3, "device": "cpu", "slot": None},
    {"shape": [1], "dtype": "float32", "device": "cpu", "slot": "output[7]"},
    {"shape": "1", "dtype": "float32", "device": "cpu", "slot": None},
    {"shape": [1], "dtype": "float32", "device": "tpu", "slot": None},
])
def test_a_workers_description_of_an_output_is_checked(node: dict) -> None:
    with pytest.raises(ExchangeError):
        decode_leaf_meta(node, {"output"})
    ok = decode_leaf_meta({"shape": [2], "dtype": "float8_e4m3fn", "device": "cuda", "slot": "output"}, {"output"})
    assert ok.slot == "output" and ok.dtype == "float8_e4m3fn"


def test_malformed_trees_are_refused() -> None:
    for bad in ({"k": "list", "items": 3}, {"k": "value", "v": [1]}, {"k": "nope"}, "x"):
        with pytest.raises(ExchangeError):
            decode_tree(bad, lambda node: None)
