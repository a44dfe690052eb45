"""The build cache's choice of headers for a load_inline ``.cu``: without torch/types.h when it builds so (most of
a build's time is that header), else as load_inline builds it — the same choice on every later load. The real
builds are in ``pytest -m gpu`` (tests/test_gpu.py); here load_inline is a recorder with its signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stark_ray.eval.build.cache import HEADERS_FULL, HEADERS_LIGHT, BuildCache, build_key, light_cuda_candidate

KERNEL = "__global__ void scale(float* x, float s, int n) { int i = threadIdx.x; if (i < n) x[i] *= s; }\n" \
         "void scale_launch(float* x, float s, int n) { scale<<<1, 256>>>(x, s, n); }\n"
WRAPPER = "void scale_launch(float* x, float s, int n);\n" \
          "torch::Tensor run(torch::Tensor x) { scale_launch(x.data_ptr<float>(), 2.0f, x.numel()); return x; }\n"


class Recorder:
    """Stands in for load_inline: records each call; the light form (no implicit headers) fails when asked."""

    def __init__(self, light_fails: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.light_fails = light_fails

    def __call__(self, name: str, cpp_sources: Any, cuda_sources: Any = None, sycl_sources: Any = None,
                 functions: Any = None, extra_cflags: Any = None, extra_cuda_cflags: Any = None,
                 extra_sycl_cflags: Any = None, extra_ldflags: Any = None, extra_include_paths: Any = None,
                 build_directory: str | None = None, verbose: bool = False, with_cuda: bool | None = None,
                 with_sycl: bool | None = None, is_python_module: bool = True,
                 with_pytorch_error_handling: bool = True, keep_intermediates: bool = True, use_pch: bool = False,
                 no_implicit_headers: bool = False) -> str:
        self.calls.append({"name": name, "cpp_sources": cpp_sources, "cuda_sources": cuda_sources,
                           "verbose": verbose, "no_implicit_headers": no_implicit_headers,
                           "build_directory": build_directory})
        if no_implicit_headers and self.light_fails:
            raise RuntimeError("Error building extension: cuda.cu(3): error: identifier \"half\" is undefined")
        return f"module:{name}"


def build(tmp_path: Path, recorder: Recorder, cuda: str = KERNEL) -> Any:
    load_inline = BuildCache(tmp_path, use_pch=False).wrap(recorder, is_inline=True)
    return load_inline(name="ext", cpp_sources=WRAPPER, cuda_sources=cuda, functions=["run"],
                       extra_cuda_cflags=["-O3"])


def choice(tmp_path: Path) -> str:
    key = build_key({"name": "ext", "cpp_sources": WRAPPER, "cuda_sources": KERNEL, "functions": ["run"],
                     "extra_cuda_cflags": ["-O3"]})
    return (tmp_path / key / "stark_headers").read_text()


def test_a_torch_free_cu_builds_without_torch_types_and_keeps_that_choice(tmp_path: Path) -> None:
    first = Recorder()
    assert build(tmp_path, first).startswith("module:ext_")
    (call,) = first.calls
    assert call["no_implicit_headers"] is True and call["verbose"] is False
    assert call["cpp_sources"] == ["#include <torch/extension.h>", WRAPPER]  # what load_inline would put first
    assert call["cuda_sources"] == ["#include <cuda.h>", "#include <cuda_runtime.h>", KERNEL]
    assert choice(tmp_path) == HEADERS_LIGHT
    later = Recorder()  # the device worker loads what the compile pool built: the same sources, so no rebuild
    build(tmp_path, later)
    assert [(c["no_implicit_headers"], c["cuda_sources"]) for c in later.calls] == [(True, call["cuda_sources"])]
    assert later.calls[0]["verbose"] is True


def test_a_cu_that_needs_torch_types_is_built_again_as_load_inline_does(tmp_path: Path) -> None:
    first = Recorder(light_fails=True)
    build(tmp_path, first)
    light, full = first.calls
    assert light["no_implicit_headers"] and not full["no_implicit_headers"]
    assert full["cuda_sources"] == KERNEL and full["cpp_sources"] == WRAPPER and full["verbose"] is True  # as given
    assert light["build_directory"] == full["build_directory"]
    assert choice(tmp_path) == HEADERS_FULL
    later = Recorder(light_fails=True)
    build(tmp_path, later)
    assert [c["no_implicit_headers"] for c in later.calls] == [False]  # no second try on a later load


@pytest.mark.parametrize("cuda", [
    "#include <torch/types.h>\n" + KERNEL,
    KERNEL + "void f(torch::Tensor t) {}\n",
    KERNEL + "void g(at::Tensor t) {}\n",
    KERNEL + "#define CHECK(x) TORCH_CHECK(x.is_cuda(), \"cuda\")\n",
    KERNEL + "void h() { AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), \"h\", [&] {}); }\n",
])
def test_a_cu_that_names_torch_is_built_as_load_inline_does(tmp_path: Path, cuda: str) -> None:
    assert not light_cuda_candidate({"cuda_sources": cuda})
    rec = Recorder()
    build(tmp_path, rec, cuda)
    assert [c["no_implicit_headers"] for c in rec.calls] == [False]


def test_only_cuda_builds_with_implicit_headers_qualify() -> None:
    assert light_cuda_candidate({"cuda_sources": [KERNEL]})
    assert not light_cuda_candidate({"cuda_sources": None, "cpp_sources": WRAPPER})  # cpu_cpp
    assert not light_cuda_candidate({"cuda_sources": KERNEL, "no_implicit_headers": True})  # the candidate's own
    assert not light_cuda_candidate({"cuda_sources": KERNEL, "sycl_sources": "x"})


def test_a_build_counted_while_headers_are_being_made_is_looked_at_again(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # CI saw a due header never made: the background thread had read the counts before the last build was counted,
    # and the call after that build found the thread still alive and left it; each call must be looked at
    import threading

    from stark_ray.config import EvalConfig
    from stark_ray.eval import service as service_module
    from stark_ray.eval.service import EvalService

    looked: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def make_due_headers(cache: Path) -> int:
        looked.append(len(looked))
        inside.set()
        assert release.wait(30)
        return 0

    monkeypatch.setattr(service_module, "make_due_headers", make_due_headers)
    with EvalService(EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path), isolate="off")) as svc:
        svc._make_headers()
        assert inside.wait(30)  # the thread is looking now
        svc._make_headers()  # a build counted meanwhile
        svc._make_headers()  # and another: one more look covers both
        release.set()
        assert svc.wait_for_headers(30)
    assert looked == [0, 1]
