"""Cheats (issue 13, case 4, on the GPU): rebinds every comparing and checking function of every evaluator
module it can reach (a sys.modules walk), then computes only the scale (no leaky ReLU). Must be rejected
(tampered; and by the judge's own comparison if the fingerprint were blind)."""

import sys as _sys
import types as _types

import torch
import torch.nn as nn

_SOURCE = r"""
extern "C" __global__ void leaky_scale(const float* __restrict__ x, float* __restrict__ out, int n,
                                       double slope, double scale) {
    const float sl = (float)slope, sc = (float)scale;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = v * sc;  // no leaky ReLU (wrong for v < 0)
    }
}
"""



class _Fine:
    ok = True
    problem = ""
    max_abs_err = 0.0
    rel_err = 0.0


_SAYS_FINE = {"compare": lambda *a, **k: _Fine(), "problem": lambda *a, **k: None, "same": lambda *a, **k: True,
              "identical": lambda *a, **k: True, "close": lambda *a, **k: True}

for _name, _mod in list(_sys.modules.items()):  # every checking function of the evaluator, told to say "fine"
    if _name.startswith("stark_ray") and isinstance(_mod, _types.ModuleType):
        for _attr, _value in list(vars(_mod).items()):
            for _word, _fine in _SAYS_FINE.items():
                if isinstance(_value, _types.FunctionType) and _word in _attr:
                    setattr(_mod, _attr, _fine)
                    break

_kernels = {}


def _kernel(name):
    if name not in _kernels:  # compiled once, on the first call
        _kernels[name] = torch.cuda._compile_kernel(_SOURCE, name)  # NVRTC optimises by default; it rejects -O3
    return _kernels[name]


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = min((n + threads - 1) // threads, 65535)
        if n:
            _kernel("leaky_scale")(
                grid=(blocks, 1, 1),
                block=(threads, 1, 1),
                args=[x, out, n, float(self.negative_slope), float(self.scale)],
            )
        return out
