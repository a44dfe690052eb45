"""The benchmark candidate set: hand-written, correct kernels for four example tasks, in three backend formats.

Each task has four kernel variants (block size, vector width, elements per thread, reduction layout). Every variant
exists in the three formats of ``stark_ray/prompts/templates``:

* ``cuda``: ``load_inline`` with the kernels and a raw-pointer launcher in ``cuda_sources`` (no torch headers),
  the torch wrapper in ``cpp_sources``, ``extra_cuda_cflags=["-O3"]``;
* ``cuda_nvrtc``: the SAME kernel text (``extern "C"`` kernels, int and double scalar parameters, as NVRTC
  launches expect) compiled with ``torch.cuda._compile_kernel``; the launch geometry is the same expression text
  as the cuda launcher's (``cdiv``/``idiv``/``imin``/``imax``/``num_sms`` exist in both languages);
* ``triton``: the same algorithm written in Triton.

Each candidate's text is distinct (its extension and kernel names carry the task and variant), so every one is a
fresh build. ``candidates(backend)`` returns ``(task_file_stem, source)`` pairs in round-robin task order (the first
N candidates cover as many tasks as possible); ``python benchmarks/candidates.py --dump DIR`` writes them as files.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("cuda", "cuda_nvrtc", "triton")
TASK_STEMS = ("1_LeakyReluScale", "2_FusedSwishScaleClamp", "5_RowSoftmax", "6_ResidualLayerNorm")
TASKS_DIR = Path(__file__).resolve().parent.parent / "examples" / "tasks"

# ---------------------------------------------------------------------------------------------------------------
# Device code shared by the cuda and cuda_nvrtc formats. Only what NVRTC has without headers: no <cmath>, no
# INFINITY, no std::. Scalars arrive as int and double (what torch.cuda._compile_kernel passes for Python values).
# ---------------------------------------------------------------------------------------------------------------
_REDUCE_HELPERS = r"""
#define STARK_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reductions (blockDim.x a multiple of 32); every thread gets the result. `red` holds 32 floats.
// The first barrier lets a previous reduction's readers finish before `red` is overwritten.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nwarps ? red[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < nwarps ? red[lane] : STARK_NEG_INF);
}
"""

# --- 1_LeakyReluScale: out = leaky_relu(x, slope) * scale ------------------------------------------------------
_LEAKY_OP = r"""
__device__ __forceinline__ float leaky_scale(float v, float slope, float scale) {
    return (v > 0.0f ? v : v * slope) * scale;
}
"""

_LEAKY_SCALAR = _LEAKY_OP + r"""
extern "C" __global__ void leaky_scale_scalar(const float* __restrict__ x, float* __restrict__ out, int n,
                                              double slope_d, double scale_d) {
    const float slope = (float)slope_d, scale = (float)scale_d;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = leaky_scale(x[i], slope, scale);
}
"""

_LEAKY_VEC4 = _LEAKY_OP + r"""
// One float4 per thread (x and out 16-byte aligned); threads 0..2 also take the n % 4 tail elements.
extern "C" __global__ void leaky_scale_vec4(const float* __restrict__ x, float* __restrict__ out, int n,
                                            double slope_d, double scale_d) {
    const float slope = (float)slope_d, scale = (float)scale_d;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = n / 4;
    if (i < n4) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = leaky_scale(v.x, slope, scale);
        v.y = leaky_scale(v.y, slope, scale);
        v.z = leaky_scale(v.z, slope, scale);
        v.w = leaky_scale(v.w, slope, scale);
        reinterpret_cast<float4*>(out)[i] = v;
    }
    const long long t = n4 * 4 + i;
    if (t < n) out[t] = leaky_scale(x[t], slope, scale);
}
"""

_LEAKY_GRIDSTRIDE = _LEAKY_OP + r"""
extern "C" __global__ void leaky_scale_gridstride(const float* __restrict__ x, float* __restrict__ out, int n,
                                                  double slope_d, double scale_d) {
    const float slope = (float)slope_d, scale = (float)scale_d;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = leaky_scale(x[i], slope, scale);
}
"""

_LEAKY_ILP4 = _LEAKY_OP + r"""
// Four elements per thread, blockDim apart (coalesced); all four loads issued before any store.
extern "C" __global__ void leaky_scale_ilp4(const float* __restrict__ x, float* __restrict__ out, int n,
                                            double slope_d, double scale_d) {
    const float slope = (float)slope_d, scale = (float)scale_d;
    const long long base = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        v[k] = i < n ? x[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        if (i < n) out[i] = leaky_scale(v[k], slope, scale);
    }
}
"""

# --- 2_FusedSwishScaleClamp: y = x*scale + bias[col]; y = y*sigmoid(y); clamp(lo, hi); out = y*x + x -----------
_SWISH_OP = r"""
__device__ __forceinline__ float swish_clamp(float v, float b, float scale, float lo, float hi) {
    float y = v * scale + b;
    y = y * (1.0f / (1.0f + expf(-y)));
    y = fminf(fmaxf(y, lo), hi);
    return y * v + v;
}
"""

_SWISH_SCALAR = _SWISH_OP + r"""
extern "C" __global__ void swish_clamp_scalar(const float* __restrict__ x, const float* __restrict__ bias,
                                              float* __restrict__ out, int n, int rows, int features,
                                              double scale_d, double lo_d, double hi_d) {
    const float scale = (float)scale_d, lo = (float)lo_d, hi = (float)hi_d;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = swish_clamp(x[i], bias[i % features], scale, lo, hi);
}
"""

_SWISH_VEC4 = _SWISH_OP + r"""
extern "C" __global__ void swish_clamp_vec4(const float* __restrict__ x, const float* __restrict__ bias,
                                            float* __restrict__ out, int n, int rows, int features,
                                            double scale_d, double lo_d, double hi_d) {
    const float scale = (float)scale_d, lo = (float)lo_d, hi = (float)hi_d;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = n / 4;
    if (i < n4) {
        const long long e = i * 4;
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = swish_clamp(v.x, bias[e % features], scale, lo, hi);
        v.y = swish_clamp(v.y, bias[(e + 1) % features], scale, lo, hi);
        v.z = swish_clamp(v.z, bias[(e + 2) % features], scale, lo, hi);
        v.w = swish_clamp(v.w, bias[(e + 3) % features], scale, lo, hi);
        reinterpret_cast<float4*>(out)[i] = v;
    }
    const long long t = n4 * 4 + i;
    if (t < n) out[t] = swish_clamp(x[t], bias[t % features], scale, lo, hi);
}
"""

_SWISH_ROWS2D = _SWISH_OP + r"""
// blockIdx.x tiles the columns, blockIdx.y strides over the rows: the bias is read once per thread.
extern "C" __global__ void swish_clamp_rows2d(const float* __restrict__ x, const float* __restrict__ bias,
                                              float* __restrict__ out, int n, int rows, int features,
                                              double scale_d, double lo_d, double hi_d) {
    const float scale = (float)scale_d, lo = (float)lo_d, hi = (float)hi_d;
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= features) return;
    const float b = bias[col];
    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {
        const long long i = row * features + col;
        out[i] = swish_clamp(x[i], b, scale, lo, hi);
    }
}
"""

_SWISH_ILP4 = _SWISH_OP + r"""
extern "C" __global__ void swish_clamp_ilp4(const float* __restrict__ x, const float* __restrict__ bias,
                                            float* __restrict__ out, int n, int rows, int features,
                                            double scale_d, double lo_d, double hi_d) {
    const float scale = (float)scale_d, lo = (float)lo_d, hi = (float)hi_d;
    const long long base = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    float v[4], b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        v[k] = i < n ? x[i] : 0.0f;
        b[k] = i < n ? bias[i % features] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        if (i < n) out[i] = swish_clamp(v[k], b[k], scale, lo, hi);
    }
}
"""

# --- 5_RowSoftmax: softmax over the last dimension ---------------------------------------------------------------
_SOFTMAX_BLOCK = _REDUCE_HELPERS + r"""
// One block per row, three passes over global memory (max, sum of exp, write).
extern "C" __global__ void softmax_block3pass(const float* __restrict__ x, float* __restrict__ out, int rows,
                                              int cols) {
    __shared__ float red[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* orow = out + row * cols;
    float m = STARK_NEG_INF;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    const float inv = 1.0f / block_sum(s, red);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = expf(xr[c] - m) * inv;
}
"""

_SOFTMAX_WARP = _REDUCE_HELPERS + r"""
// One warp per row, blockDim.x / 32 rows per block, shuffle reductions only.
extern "C" __global__ void softmax_warprow(const float* __restrict__ x, float* __restrict__ out, int rows,
                                           int cols) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* orow = out + row * cols;
    float m = STARK_NEG_INF;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += expf(xr[c] - m);
    const float inv = 1.0f / warp_sum(s);
    for (int c = lane; c < cols; c += 32) orow[c] = expf(xr[c] - m) * inv;
}
"""

_SOFTMAX_ONLINE = _REDUCE_HELPERS + r"""
// (m, s) := running max and sum of exp(v - m); merging two pairs rescales the smaller max's sum.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == STARK_NEG_INF) return;
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else if (m != STARK_NEG_INF) {  // v <= m == -inf adds nothing (and would give NaN)
        s += expf(v - m);
    }
}

// One block per row, float4 loads when the row allows; one pass for max and sum (online softmax), one to write.
extern "C" __global__ void softmax_online_vec4(const float* __restrict__ x, float* __restrict__ out, int rows,
                                               int cols) {
    __shared__ float red_m[32], red_s[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* orow = out + row * cols;
    const bool vec = (cols & 3) == 0;  // rows 16-byte aligned (the base pointer is)
    float m = STARK_NEG_INF, s = 0.0f;
    if (vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            const float4 v = x4[c];
            online_add(m, s, v.x);
            online_add(m, s, v.y);
            online_add(m, s, v.z);
            online_add(m, s, v.w);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) online_add(m, s, xr[c]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        red_m[warp] = m;
        red_s[warp] = s;
    }
    __syncthreads();
    m = STARK_NEG_INF;
    s = 0.0f;
    for (int w = 0; w < nwarps; ++w) online_merge(m, s, red_m[w], red_s[w]);
    const float inv = 1.0f / s;
    if (vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* o4 = reinterpret_cast<float4*>(orow);
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            const float4 v = x4[c];
            o4[c] = make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv,
                                expf(v.w - m) * inv);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = expf(xr[c] - m) * inv;
    }
}
"""

_SOFTMAX_SMEM = _REDUCE_HELPERS + r"""
// One block per row; the row is read from global memory once and kept in dynamic shared memory (cols floats).
extern "C" __global__ void softmax_smemrow(const float* __restrict__ x, float* __restrict__ out, int rows,
                                           int cols) {
    extern __shared__ float rowbuf[];
    __shared__ float red[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* orow = out + row * cols;
    float m = STARK_NEG_INF;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = xr[c];
        rowbuf[c] = v;
        m = fmaxf(m, v);
    }
    m = block_max(m, red);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {  // each thread reads back only what it wrote
        const float e = expf(rowbuf[c] - m);
        rowbuf[c] = e;
        s += e;
    }
    const float inv = 1.0f / block_sum(s, red);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = rowbuf[c] * inv;
}
"""

# --- 6_ResidualLayerNorm: out = layer_norm(x + residual) * weight + bias over the last dimension ------------------
_LN_BLOCK = _REDUCE_HELPERS + r"""
// One block per row; z = x + r recomputed in each of three passes (mean, variance, write).
extern "C" __global__ void layernorm_block3pass(const float* __restrict__ x, const float* __restrict__ r,
                                                const float* __restrict__ w, const float* __restrict__ b,
                                                float* __restrict__ out, int rows, int cols, double eps) {
    __shared__ float red[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    const float* rr = r + row * cols;
    float* orow = out + row * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c] + rr[c];
    const float mean = block_sum(s, red) / cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = xr[c] + rr[c] - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(block_sum(q, red) / cols + (float)eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        orow[c] = (xr[c] + rr[c] - mean) * rstd * w[c] + b[c];
}
"""

_LN_WARP = _REDUCE_HELPERS + r"""
// One warp per row, blockDim.x / 32 rows per block, shuffle reductions only.
extern "C" __global__ void layernorm_warprow(const float* __restrict__ x, const float* __restrict__ r,
                                             const float* __restrict__ w, const float* __restrict__ b,
                                             float* __restrict__ out, int rows, int cols, double eps) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + row * cols;
    const float* rr = r + row * cols;
    float* orow = out + row * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += xr[c] + rr[c];
    const float mean = warp_sum(s) / cols;
    float q = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float d = xr[c] + rr[c] - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(warp_sum(q) / cols + (float)eps);
    for (int c = lane; c < cols; c += 32) orow[c] = (xr[c] + rr[c] - mean) * rstd * w[c] + b[c];
}
"""

_LN_WELFORD = _REDUCE_HELPERS + r"""
// Welford state (count, mean, M2); Chan's formula merges two states.
__device__ __forceinline__ void welford_merge(float& n, float& mean, float& m2, float n2, float mean2, float m22) {
    if (n2 == 0.0f) return;
    const float tot = n + n2;
    const float d = mean2 - mean;
    mean += d * (n2 / tot);
    m2 += m22 + d * d * (n * n2 / tot);
    n = tot;
}

// One block per row: one Welford pass for mean and variance, one pass to write.
extern "C" __global__ void layernorm_welford(const float* __restrict__ x, const float* __restrict__ r,
                                             const float* __restrict__ w, const float* __restrict__ b,
                                             float* __restrict__ out, int rows, int cols, double eps) {
    __shared__ float red_n[32], red_mean[32], red_m2[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    const float* rr = r + row * cols;
    float* orow = out + row * cols;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float z = xr[c] + rr[c];
        n += 1.0f;
        const float d = z - mean;
        mean += d / n;
        m2 += d * (z - mean);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float n2 = __shfl_xor_sync(0xffffffffu, n, o);
        const float mean2 = __shfl_xor_sync(0xffffffffu, mean, o);
        const float m22 = __shfl_xor_sync(0xffffffffu, m2, o);
        welford_merge(n, mean, m2, n2, mean2, m22);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        red_n[warp] = n;
        red_mean[warp] = mean;
        red_m2[warp] = m2;
    }
    __syncthreads();
    n = 0.0f;
    mean = 0.0f;
    m2 = 0.0f;
    for (int k = 0; k < nwarps; ++k) welford_merge(n, mean, m2, red_n[k], red_mean[k], red_m2[k]);
    const float rstd = rsqrtf(m2 / cols + (float)eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        orow[c] = (xr[c] + rr[c] - mean) * rstd * w[c] + b[c];
}
"""

_LN_SMEM = _REDUCE_HELPERS + r"""
// One block per row; z = x + r is computed once and kept in dynamic shared memory (cols floats).
extern "C" __global__ void layernorm_smemrow(const float* __restrict__ x, const float* __restrict__ r,
                                             const float* __restrict__ w, const float* __restrict__ b,
                                             float* __restrict__ out, int rows, int cols, double eps) {
    extern __shared__ float zbuf[];
    __shared__ float red[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    const float* rr = r + row * cols;
    float* orow = out + row * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float z = xr[c] + rr[c];
        zbuf[c] = z;
        s += z;
    }
    const float mean = block_sum(s, red) / cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {  // each thread reads back only what it wrote
        const float d = zbuf[c] - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(block_sum(q, red) / cols + (float)eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = (zbuf[c] - mean) * rstd * w[c] + b[c];
}
"""

# ---------------------------------------------------------------------------------------------------------------
# Triton kernels: the same algorithms. Each variant defines its kernel(s) and `_launch(...)`, called by ModelNew.
# ---------------------------------------------------------------------------------------------------------------
_TRITON_LEAKY_FLAT = r'''
@triton.jit
def {name}(x_ptr, out_ptr, n, slope, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    y = tl.where(v > 0.0, v, v * slope) * scale
    tl.store(out_ptr + offs, y, mask=mask)


def _launch(x, out, n, slope, scale):
    grid = (triton.cdiv(n, {block}),)
    {name}[grid](x, out, n, slope, scale, BLOCK={block}, num_warps={warps})
'''

_TRITON_LEAKY_GRIDSTRIDE = r'''
@triton.jit
def {name}(x_ptr, out_ptr, n, slope, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x_ptr + offs, mask=mask)
        y = tl.where(v > 0.0, v, v * slope) * scale
        tl.store(out_ptr + offs, y, mask=mask)


def _launch(x, out, n, slope, scale):
    programs = max(1, min(triton.cdiv(n, {block}), num_sms(x) * {waves}))
    grid = (programs,)
    {name}[grid](x, out, n, slope, scale, BLOCK={block}, num_warps={warps})
'''

_TRITON_SWISH_BODY = r'''    y = v * scale + b
    y = y * (1.0 / (1.0 + tl.exp(-y)))
    y = tl.minimum(tl.maximum(y, lo), hi)
    tl.store(out_ptr + offs, y * v + v, mask=mask)
'''

_TRITON_SWISH_FLAT = r'''
@triton.jit
def {name}(x_ptr, bias_ptr, out_ptr, n, rows, features, scale, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(bias_ptr + offs % features, mask=mask)
''' + _TRITON_SWISH_BODY + r'''

def _launch(x, bias, out, n, rows, features, scale, lo, hi):
    grid = (triton.cdiv(n, {block}),)
    {name}[grid](x, bias, out, n, rows, features, scale, lo, hi, BLOCK={block}, num_warps={warps})
'''

_TRITON_SWISH_ROWS2D = r'''
@triton.jit
def {name}(x_ptr, bias_ptr, out_ptr, n, rows, features, scale, lo, hi, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < features
    b = tl.load(bias_ptr + cols, mask=mask)
    first = tl.program_id(1)
    step = tl.num_programs(1)
    x_row = x_ptr + first.to(tl.int64) * features + cols  # pointers advance row by row (64-bit safe)
    out_row = out_ptr + first.to(tl.int64) * features + cols
    for _ in range(first, rows, step):
        v = tl.load(x_row, mask=mask)
        y = v * scale + b
        y = y * (1.0 / (1.0 + tl.exp(-y)))
        y = tl.minimum(tl.maximum(y, lo), hi)
        tl.store(out_row, y * v + v, mask=mask)
        x_row += step * features
        out_row += step * features


def _launch(x, bias, out, n, rows, features, scale, lo, hi):
    grid = (triton.cdiv(features, {block}), max(1, min(rows, 65535)))
    {name}[grid](x, bias, out, n, rows, features, scale, lo, hi, BLOCK={block}, num_warps={warps})
'''

_TRITON_SOFTMAX_TILED = r'''
@triton.jit
def {name}(x_ptr, out_ptr, rows, cols, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    m = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        m = tl.maximum(m, tl.load(x_ptr + base + offs, mask=offs < cols, other=float("-inf")))
    mx = tl.max(m, axis=0)
    s = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        s += tl.exp(tl.load(x_ptr + base + offs, mask=offs < cols, other=float("-inf")) - mx)
    inv = 1.0 / tl.sum(s, axis=0)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        v = tl.load(x_ptr + base + offs, mask=mask, other=float("-inf"))
        tl.store(out_ptr + base + offs, tl.exp(v - mx) * inv, mask=mask)


def _launch(x, out, rows, cols):
    grid = (rows,)
    {name}[grid](x, out, rows, cols, BLOCK_C={block}, num_warps={warps})
'''

_TRITON_SOFTMAX_MULTIROW = r'''
@triton.jit
def {name}(x_ptr, out_ptr, rows, cols, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r.to(tl.int64)[:, None] * cols + c[None, :]
    v = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
    m = tl.max(v, axis=1)
    e = tl.exp(v - m[:, None])
    e = tl.where(mask, e, 0.0)
    s = tl.sum(e, axis=1)
    tl.store(out_ptr + offs, e / s[:, None], mask=mask)


def _launch(x, out, rows, cols):
    grid = (triton.cdiv(rows, {rows}),)
    {name}[grid](x, out, rows, cols, ROWS={rows}, BLOCK_C=triton.next_power_of_2(cols), num_warps={warps})
'''

_TRITON_SOFTMAX_ONLINE = r'''
@triton.jit
def {name}(x_ptr, out_ptr, rows, cols, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    m = tl.full([BLOCK_C], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, cols, BLOCK_C):  # per lane: running max and rescaled sum (online softmax)
        offs = c0 + tl.arange(0, BLOCK_C)
        v = tl.load(x_ptr + base + offs, mask=offs < cols, other=float("-inf"))
        m_new = tl.maximum(m, v)
        empty = m_new == float("-inf")
        s = tl.where(empty, 0.0, s * tl.exp(m - m_new) + tl.exp(v - m_new))
        m = m_new
    mx = tl.max(m, axis=0)
    inv = 1.0 / tl.sum(s * tl.exp(m - mx), axis=0)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        v = tl.load(x_ptr + base + offs, mask=mask, other=float("-inf"))
        tl.store(out_ptr + base + offs, tl.exp(v - mx) * inv, mask=mask)


def _launch(x, out, rows, cols):
    grid = (rows,)
    {name}[grid](x, out, rows, cols, BLOCK_C={block}, num_warps={warps})
'''

_TRITON_SOFTMAX_WHOLEROW = r'''
@triton.jit
def {name}(x_ptr, out_ptr, rows, cols, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    offs = tl.arange(0, BLOCK_C)
    mask = offs < cols
    v = tl.load(x_ptr + base + offs, mask=mask, other=float("-inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    e = tl.where(mask, e, 0.0)
    tl.store(out_ptr + base + offs, e / tl.sum(e, axis=0), mask=mask)


def _launch(x, out, rows, cols):
    grid = (rows,)
    {name}[grid](x, out, rows, cols, BLOCK_C=triton.next_power_of_2(cols), num_warps={warps})
'''

_TRITON_LN_TILED = r'''
@triton.jit
def {name}(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, rows, cols, eps, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    acc = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        acc += tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
    mean = tl.sum(acc, axis=0) / cols
    acc = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        z = tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
        d = tl.where(mask, z - mean, 0.0)
        acc += d * d
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / cols + eps)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        z = tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + base + offs, (z - mean) * rstd * w + b, mask=mask)


def _launch(x, r, w, b, out, rows, cols, eps):
    grid = (rows,)
    {name}[grid](x, r, w, b, out, rows, cols, eps, BLOCK_C={block}, num_warps={warps})
'''

_TRITON_LN_MULTIROW = r'''
@triton.jit
def {name}(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, rows, cols, eps, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    rr = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_C)
    cmask = c < cols
    mask = (rr[:, None] < rows) & cmask[None, :]
    offs = rr.to(tl.int64)[:, None] * cols + c[None, :]
    z = tl.load(x_ptr + offs, mask=mask, other=0.0) + tl.load(r_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(z, axis=1) / cols
    d = tl.where(mask, z - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=1) / cols + eps)
    w = tl.load(w_ptr + c, mask=cmask, other=0.0)
    b = tl.load(b_ptr + c, mask=cmask, other=0.0)
    tl.store(out_ptr + offs, d * rstd[:, None] * w[None, :] + b[None, :], mask=mask)


def _launch(x, r, w, b, out, rows, cols, eps):
    grid = (triton.cdiv(rows, {rows}),)
    {name}[grid](x, r, w, b, out, rows, cols, eps, ROWS={rows}, BLOCK_C=triton.next_power_of_2(cols), num_warps={warps})
'''

_TRITON_LN_WELFORD = r'''
@triton.jit
def {name}(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, rows, cols, eps, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    cnt = tl.zeros([BLOCK_C], tl.float32)
    mean = tl.zeros([BLOCK_C], tl.float32)
    m2 = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, cols, BLOCK_C):  # per lane: a Welford update with one element per tile
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        z = tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
        cnt_new = cnt + tl.where(mask, 1.0, 0.0)
        d = z - mean
        mean = tl.where(mask, mean + d / tl.maximum(cnt_new, 1.0), mean)
        m2 = tl.where(mask, m2 + d * (z - mean), m2)
        cnt = cnt_new
    total = tl.sum(cnt, axis=0)  # merge the lanes: the row mean, then M2 plus the spread of the lane means
    row_mean = tl.sum(cnt * mean, axis=0) / total
    dm = mean - row_mean
    var = (tl.sum(m2, axis=0) + tl.sum(cnt * dm * dm, axis=0)) / total
    rstd = tl.rsqrt(var + eps)
    for c0 in range(0, cols, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        mask = offs < cols
        z = tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + base + offs, (z - row_mean) * rstd * w + b, mask=mask)


def _launch(x, r, w, b, out, rows, cols, eps):
    grid = (rows,)
    {name}[grid](x, r, w, b, out, rows, cols, eps, BLOCK_C={block}, num_warps={warps})
'''

_TRITON_LN_WHOLEROW = r'''
@triton.jit
def {name}(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, rows, cols, eps, BLOCK_C: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * cols
    offs = tl.arange(0, BLOCK_C)
    mask = offs < cols
    z = tl.load(x_ptr + base + offs, mask=mask, other=0.0) + tl.load(r_ptr + base + offs, mask=mask, other=0.0)
    mean = tl.sum(z, axis=0) / cols
    d = tl.where(mask, z - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + base + offs, d * rstd * w + b, mask=mask)


def _launch(x, r, w, b, out, rows, cols, eps):
    grid = (rows,)
    {name}[grid](x, r, w, b, out, rows, cols, eps, BLOCK_C=triton.next_power_of_2(cols), num_warps={warps})
'''


# ---------------------------------------------------------------------------------------------------------------
# Variants and tasks
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One kernel variant. ``grid``/``block``/``smem`` are expressions valid both in C++ (the cuda launcher) and
    in Python (the nvrtc forward) over the task's size names; ``triton`` is a template of kernel + ``_launch``."""

    label: str
    kernels: str  # device code shared by cuda and cuda_nvrtc
    kernel: str  # the extern "C" kernel's name
    grid: tuple[str, str]
    block: int
    smem: str
    triton: str
    triton_params: tuple[tuple[str, int], ...]  # block, warps, waves, rows substituted into the template


@dataclass(frozen=True)
class TaskFormat:
    """What the three formats of one task share across its variants."""

    stem: str
    short: str  # used in extension and kernel names
    init: str  # ModelNew.__init__ body (creates parameters in the reference's order and RNG use)
    init_args: str  # ModelNew.__init__ parameters after self
    prepare: str  # forward prologue (Python): contiguous inputs, output, size names; may return early
    launcher_params: str  # C++ launcher parameters before the stream
    kernel_args: str  # C++ kernel-call arguments (also the order of the nvrtc args)
    nvrtc_args: str  # Python list of the kernel arguments in the nvrtc form
    cpp_wrapper: str  # C++ torch wrapper (format: {launcher})
    wrapper_fn: str  # its name
    cuda_call: str  # forward body (cuda form)
    triton_call: str  # forward epilogue (triton form): calls _launch and returns
    variants: tuple[Variant, ...]


_CPP_HEAD = r"""#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <climits>
#include <cstdint>
"""

_ALIGN16 = "reinterpret_cast<uintptr_t>({t}.data_ptr()) % 16 != 0"

_LEAKY = TaskFormat(
    stem="1_LeakyReluScale",
    short="leaky",
    init_args="negative_slope, scale",
    init="        self.negative_slope = float(negative_slope)\n        self.scale = float(scale)\n",
    prepare=(
        "        x = x.contiguous()\n"
        "        if x.data_ptr() % 16:  # vector access needs 16-byte alignment\n"
        "            x = x.clone()\n"
        "        out = torch.empty_like(x)\n"
        "        n = x.numel()\n"
        "        if n == 0:\n"
        "            return out\n"
    ),
    launcher_params="const float* x, float* out, int n, double slope, double scale",
    kernel_args="x, out, n, slope, scale",
    nvrtc_args="[x, out, n, self.negative_slope, self.scale]",
    cpp_wrapper=_CPP_HEAD + r"""
cudaError_t {launcher}(const float* x, float* out, int n, double slope, double scale, cudaStream_t stream);

torch::Tensor leaky_relu_scale(torch::Tensor x, double slope, double scale) {{
    TORCH_CHECK(x.is_cuda(), "leaky_relu_scale: a CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "leaky_relu_scale: float32 only");
    TORCH_CHECK(x.numel() <= INT_MAX, "leaky_relu_scale: too many elements");
    auto xc = x.contiguous();
    if ({align_x}) xc = xc.clone();  // float4 access needs 16-byte alignment
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    cudaError_t err = {launcher}(xc.data_ptr<float>(), out.data_ptr<float>(), (int)xc.numel(), slope, scale,
                                 c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "leaky_relu_scale launch failed: ", cudaGetErrorString(err));
    return out;
}}
""",
    wrapper_fn="leaky_relu_scale",
    cuda_call="        return _ext.leaky_relu_scale(x, self.negative_slope, self.scale)\n",
    triton_call="        _launch(x, out, n, self.negative_slope, self.scale)\n        return out\n",
    variants=(
        Variant("scalar256", _LEAKY_SCALAR, "leaky_scale_scalar", ("cdiv(n, 256)", "1"), 256, "0",
                _TRITON_LEAKY_FLAT, (("block", 256), ("warps", 8))),
        Variant("vec4x256", _LEAKY_VEC4, "leaky_scale_vec4", ("imax(1, cdiv(idiv(n, 4), 256))", "1"), 256, "0",
                _TRITON_LEAKY_FLAT, (("block", 1024), ("warps", 8))),
        Variant("gridstride512", _LEAKY_GRIDSTRIDE, "leaky_scale_gridstride",
                ("imax(1, imin(cdiv(n, 512), num_sms() * 4))", "1"), 512, "0",
                _TRITON_LEAKY_GRIDSTRIDE, (("block", 2048), ("warps", 16), ("waves", 4))),
        Variant("ilp4x128", _LEAKY_ILP4, "leaky_scale_ilp4", ("cdiv(n, 512)", "1"), 128, "0",
                _TRITON_LEAKY_FLAT, (("block", 512), ("warps", 4))),
    ),
)

_SWISH = TaskFormat(
    stem="2_FusedSwishScaleClamp",
    short="swish",
    init_args="features, scale, lo, hi",
    init=(
        "        self.bias = nn.Parameter(torch.randn(features) * 0.1)  # as the reference: same RNG draw\n"
        "        self.scale = float(scale)\n"
        "        self.lo = float(lo)\n"
        "        self.hi = float(hi)\n"
    ),
    prepare=(
        "        features = self.bias.numel()\n"
        "        if x.shape[-1] != features:\n"
        "            raise ValueError(f'expected last dimension {features}, got {tuple(x.shape)}')\n"
        "        x = x.contiguous()\n"
        "        if x.data_ptr() % 16:  # vector access needs 16-byte alignment\n"
        "            x = x.clone()\n"
        "        bias = self.bias.detach().contiguous()\n"
        "        out = torch.empty_like(x)\n"
        "        n = x.numel()\n"
        "        rows = n // features\n"
        "        if n == 0:\n"
        "            return out\n"
    ),
    launcher_params=("const float* x, const float* bias, float* out, int n, int rows, int features, double scale, "
                     "double lo, double hi"),
    kernel_args="x, bias, out, n, rows, features, scale, lo, hi",
    nvrtc_args="[x, bias, out, n, rows, features, self.scale, self.lo, self.hi]",
    cpp_wrapper=_CPP_HEAD + r"""
cudaError_t {launcher}(const float* x, const float* bias, float* out, int n, int rows, int features,
                       double scale, double lo, double hi, cudaStream_t stream);

torch::Tensor swish_scale_clamp(torch::Tensor x, torch::Tensor bias, double scale, double lo, double hi) {{
    TORCH_CHECK(x.is_cuda() && bias.is_cuda(), "swish_scale_clamp: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat,
                "swish_scale_clamp: float32 only");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == bias.numel(), "swish_scale_clamp: last dimension != features");
    TORCH_CHECK(x.numel() <= INT_MAX, "swish_scale_clamp: too many elements");
    auto xc = x.contiguous();
    if ({align_x}) xc = xc.clone();  // float4 access needs 16-byte alignment
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    const int features = (int)bc.numel();
    const int n = (int)xc.numel();
    cudaError_t err = {launcher}(xc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n,
                                 n / features, features, scale, lo, hi, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "swish_scale_clamp launch failed: ", cudaGetErrorString(err));
    return out;
}}
""",
    wrapper_fn="swish_scale_clamp",
    cuda_call="        return _ext.swish_scale_clamp(x, self.bias, self.scale, self.lo, self.hi)\n",
    triton_call="        _launch(x, bias, out, n, rows, features, self.scale, self.lo, self.hi)\n        return out\n",
    variants=(
        Variant("scalar256", _SWISH_SCALAR, "swish_clamp_scalar", ("cdiv(n, 256)", "1"), 256, "0",
                _TRITON_SWISH_FLAT, (("block", 256), ("warps", 8))),
        Variant("vec4x256", _SWISH_VEC4, "swish_clamp_vec4", ("imax(1, cdiv(idiv(n, 4), 256))", "1"), 256, "0",
                _TRITON_SWISH_FLAT, (("block", 1024), ("warps", 8))),
        Variant("rows2d256", _SWISH_ROWS2D, "swish_clamp_rows2d", ("cdiv(features, 256)", "imin(rows, 65535)"),
                256, "0", _TRITON_SWISH_ROWS2D, (("block", 256), ("warps", 2))),
        Variant("ilp4x128", _SWISH_ILP4, "swish_clamp_ilp4", ("cdiv(n, 512)", "1"), 128, "0",
                _TRITON_SWISH_FLAT, (("block", 512), ("warps", 4))),
    ),
)

_SOFTMAX = TaskFormat(
    stem="5_RowSoftmax",
    short="softmax",
    init_args="",
    init="",
    prepare=(
        "        x = x.contiguous()\n"
        "        if x.data_ptr() % 16:  # vector access needs 16-byte alignment\n"
        "            x = x.clone()\n"
        "        out = torch.empty_like(x)\n"
        "        if x.numel() == 0:\n"
        "            return out\n"
        "        cols = x.shape[-1]\n"
        "        rows = x.numel() // cols\n"
        "        if cols > 12288:\n"
        "            raise ValueError(f'rows of at most 12288 elements, got {cols}')\n"
    ),
    launcher_params="const float* x, float* out, int rows, int cols",
    kernel_args="x, out, rows, cols",
    nvrtc_args="[x, out, rows, cols]",
    cpp_wrapper=_CPP_HEAD + r"""
cudaError_t {launcher}(const float* x, float* out, int rows, int cols, cudaStream_t stream);

torch::Tensor row_softmax(torch::Tensor x) {{
    TORCH_CHECK(x.is_cuda(), "row_softmax: a CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "row_softmax: float32 only");
    TORCH_CHECK(x.dim() >= 1 && x.numel() <= INT_MAX, "row_softmax: bad shape");
    auto xc = x.contiguous();
    if ({align_x}) xc = xc.clone();  // float4 access needs 16-byte alignment
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    const int cols = (int)xc.size(-1);
    TORCH_CHECK(cols <= 12288, "row_softmax: rows of at most 12288 elements");  // a row fits in shared memory
    cudaError_t err = {launcher}(xc.data_ptr<float>(), out.data_ptr<float>(), (int)(xc.numel() / cols), cols,
                                 c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "row_softmax launch failed: ", cudaGetErrorString(err));
    return out;
}}
""",
    wrapper_fn="row_softmax",
    cuda_call="        return _ext.row_softmax(x)\n",
    triton_call="        _launch(x, out, rows, cols)\n        return out\n",
    variants=(
        Variant("block3pass256", _SOFTMAX_BLOCK, "softmax_block3pass", ("rows", "1"), 256, "0",
                _TRITON_SOFTMAX_TILED, (("block", 512), ("warps", 4))),
        Variant("warprow128", _SOFTMAX_WARP, "softmax_warprow", ("cdiv(rows, 4)", "1"), 128, "0",
                _TRITON_SOFTMAX_MULTIROW, (("rows", 4), ("warps", 4))),
        Variant("onlinevec4x128", _SOFTMAX_ONLINE, "softmax_online_vec4", ("rows", "1"), 128, "0",
                _TRITON_SOFTMAX_ONLINE, (("block", 256), ("warps", 2))),
        Variant("smemrow512", _SOFTMAX_SMEM, "softmax_smemrow", ("rows", "1"), 512, "cols * 4",
                _TRITON_SOFTMAX_WHOLEROW, (("warps", 8),)),
    ),
)

_LAYERNORM = TaskFormat(
    stem="6_ResidualLayerNorm",
    short="layernorm",
    init_args="features, eps",
    init=(
        "        self.norm = nn.LayerNorm(features, eps=eps)  # as the reference: same parameters, same RNG draws\n"
        "        with torch.no_grad():\n"
        "            self.norm.weight.uniform_(0.5, 1.5)\n"
        "            self.norm.bias.uniform_(-0.5, 0.5)\n"
    ),
    prepare=(
        "        if x.shape != residual.shape or x.shape[-1] != self.norm.weight.numel():\n"
        "            raise ValueError(f'bad shapes {tuple(x.shape)} and {tuple(residual.shape)}')\n"
        "        x = x.contiguous()\n"
        "        residual = residual.contiguous()\n"
        "        w = self.norm.weight.detach().contiguous()\n"
        "        b = self.norm.bias.detach().contiguous()\n"
        "        out = torch.empty_like(x)\n"
        "        if x.numel() == 0:\n"
        "            return out\n"
        "        cols = x.shape[-1]\n"
        "        rows = x.numel() // cols\n"
        "        if cols > 12288:\n"
        "            raise ValueError(f'rows of at most 12288 elements, got {cols}')\n"
    ),
    launcher_params=("const float* x, const float* r, const float* w, const float* b, float* out, int rows, "
                     "int cols, double eps"),
    kernel_args="x, r, w, b, out, rows, cols, eps",
    nvrtc_args="[x, residual, w, b, out, rows, cols, float(self.norm.eps)]",
    cpp_wrapper=_CPP_HEAD + r"""
cudaError_t {launcher}(const float* x, const float* r, const float* w, const float* b, float* out, int rows,
                       int cols, double eps, cudaStream_t stream);

torch::Tensor residual_layernorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                 torch::Tensor bias, double eps) {{
    TORCH_CHECK(x.is_cuda() && residual.is_cuda() && weight.is_cuda() && bias.is_cuda(),
                "residual_layernorm: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && residual.scalar_type() == torch::kFloat &&
                weight.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat,
                "residual_layernorm: float32 only");
    TORCH_CHECK(x.sizes() == residual.sizes(), "residual_layernorm: shape mismatch");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.numel() && x.size(-1) == bias.numel(),
                "residual_layernorm: last dimension != features");
    TORCH_CHECK(x.numel() <= INT_MAX, "residual_layernorm: too many elements");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    const int cols = (int)xc.size(-1);
    TORCH_CHECK(cols <= 12288, "residual_layernorm: rows of at most 12288 elements");  // fits in shared memory
    cudaError_t err = {launcher}(xc.data_ptr<float>(), rc.data_ptr<float>(), wc.data_ptr<float>(),
                                 bc.data_ptr<float>(), out.data_ptr<float>(), (int)(xc.numel() / cols), cols, eps,
                                 c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "residual_layernorm launch failed: ", cudaGetErrorString(err));
    return out;
}}
""",
    wrapper_fn="residual_layernorm",
    cuda_call=("        return _ext.residual_layernorm(x, residual, self.norm.weight, self.norm.bias, "
               "float(self.norm.eps))\n"),
    triton_call="        _launch(x, residual, w, b, out, rows, cols, float(self.norm.eps))\n        return out\n",
    variants=(
        Variant("block3pass256", _LN_BLOCK, "layernorm_block3pass", ("rows", "1"), 256, "0",
                _TRITON_LN_TILED, (("block", 512), ("warps", 4))),
        Variant("warprow128", _LN_WARP, "layernorm_warprow", ("cdiv(rows, 4)", "1"), 128, "0",
                _TRITON_LN_MULTIROW, (("rows", 4), ("warps", 4))),
        Variant("welford128", _LN_WELFORD, "layernorm_welford", ("rows", "1"), 128, "0",
                _TRITON_LN_WELFORD, (("block", 256), ("warps", 2))),
        Variant("smemrow256", _LN_SMEM, "layernorm_smemrow", ("rows", "1"), 256, "cols * 4",
                _TRITON_LN_WHOLEROW, (("warps", 8),)),
    ),
)

FORMATS: dict[str, TaskFormat] = {f.stem: f for f in (_LEAKY, _SWISH, _SOFTMAX, _LAYERNORM)}

# Launch-geometry helpers: the same names in C++ (.cu launcher) and Python (nvrtc forward).
_CUDA_HELPERS = {
    "cdiv": "static inline long long cdiv(long long a, long long b) { return (a + b - 1) / b; }\n",
    "idiv": "static inline long long idiv(long long a, long long b) { return a / b; }\n",
    "imin": "static inline long long imin(long long a, long long b) { return a < b ? a : b; }\n",
    "imax": "static inline long long imax(long long a, long long b) { return a > b ? a : b; }\n",
    "num_sms": r"""static inline long long num_sms() {
    static int sms = 0;
    if (sms == 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
            sms = 1;
    }
    return sms;
}
""",
}


def _cuda_helpers(var: Variant) -> str:
    """The C++ launch helpers that this variant's geometry expressions use (unused ones would draw warnings)."""
    used = " ".join((*var.grid, var.smem))
    return "".join(code for name, code in _CUDA_HELPERS.items() if re.search(rf"\b{name}\(", used))


_PY_HELPERS = '''

def cdiv(a, b):
    return (a + b - 1) // b


def idiv(a, b):
    return a // b


def imin(a, b):
    return min(a, b)


def imax(a, b):
    return max(a, b)


def num_sms(t=None):
    if t is not None and not t.is_cuda:
        return 132  # Triton's CPU interpreter (a check run): any count will do
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
'''


def _ident(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)


def _names(fmt: TaskFormat, var: Variant, tag: str) -> tuple[str, str]:
    """(extension name, kernel-name suffix) distinct for each task, variant and tag."""
    suffix = f"_{_ident(tag)}" if tag else ""
    return f"stark_bench_{fmt.short}_{var.label}{suffix}", suffix


def _model_class(fmt: TaskFormat, forward_args: str, body: str) -> str:
    init_args = f", {fmt.init_args}" if fmt.init_args else ""
    return (f"class ModelNew(nn.Module):\n    def __init__(self{init_args}):\n        super().__init__()\n"
            f"{fmt.init}\n    def forward(self, {forward_args}):\n{body}")


def _forward_args(fmt: TaskFormat) -> str:
    return "x, residual" if fmt.stem == "6_ResidualLayerNorm" else "x"


def _header(fmt: TaskFormat, var: Variant, backend: str, tag: str) -> str:
    extra = f", tag {tag}" if tag else ""
    return f'"""Benchmark candidate: {fmt.stem}, variant {var.label}, {backend} format{extra}."""\n'


def cuda_source(fmt: TaskFormat, var: Variant, tag: str = "") -> str:
    """The ``cuda`` (load_inline) format of one variant."""
    ext, suffix = _names(fmt, var, tag)
    kernel = var.kernel + suffix
    launcher = f"{kernel}_launch"
    kernels = var.kernels.replace(var.kernel + "(", kernel + "(")
    cu = (f"#include <cuda_runtime.h>\n#include <cstdint>\n{_cuda_helpers(var)}{kernels}\n"
          f"cudaError_t {launcher}({fmt.launcher_params}, cudaStream_t stream) {{\n"
          f"    const dim3 grid((unsigned int)({var.grid[0]}), (unsigned int)({var.grid[1]}));\n"
          f"    const dim3 block({var.block});\n"
          f"    const size_t smem = (size_t)({var.smem});\n"
          f"    {kernel}<<<grid, block, smem, stream>>>({fmt.kernel_args});\n"
          f"    return cudaGetLastError();\n}}\n")
    align_x = _ALIGN16.format(t="xc")
    cpp = fmt.cpp_wrapper.format(launcher=launcher, align_x=align_x)
    model = _model_class(fmt, _forward_args(fmt), fmt.cuda_call)
    return (f"{_header(fmt, var, 'cuda', tag)}\nimport torch\nimport torch.nn as nn\n"
            f"from torch.utils.cpp_extension import load_inline\n\n"
            f'_CUDA = r"""\n{cu}"""\n\n_CPP = r"""\n{cpp}"""\n\n'
            f'_ext = load_inline(\n    name="{ext}",\n    cpp_sources=_CPP,\n    cuda_sources=_CUDA,\n'
            f'    functions=["{fmt.wrapper_fn}"],\n    extra_cuda_cflags=["-O3"],\n    verbose=False,\n)\n\n\n'
            f"{model}")


def nvrtc_source(fmt: TaskFormat, var: Variant, tag: str = "") -> str:
    """The ``cuda_nvrtc`` format: the same kernel text, compiled by NVRTC, launched with the same geometry."""
    _, suffix = _names(fmt, var, tag)
    kernel = var.kernel + suffix
    kernels = var.kernels.replace(var.kernel + "(", kernel + "(")
    body = (fmt.prepare
            + f"        grid = (int({var.grid[0]}), int({var.grid[1]}), 1)\n"
            + f"        smem = int({var.smem})\n"
            + f'        _kernel("{kernel}")(grid=grid, block=({var.block}, 1, 1), args={fmt.nvrtc_args}, '
            + "shared_mem=smem)\n        return out\n")
    model = _model_class(fmt, _forward_args(fmt), body)
    return (f"{_header(fmt, var, 'cuda_nvrtc', tag)}\nimport torch\nimport torch.nn as nn\n\n"
            f'_SOURCE = r"""{kernels}"""\n\n_kernels = {{}}\n\n\n'
            f"def _kernel(name):\n    if name not in _kernels:\n"
            f"        _kernels[name] = torch.cuda._compile_kernel(_SOURCE, name)\n    return _kernels[name]\n"
            f"{_PY_HELPERS}\n\n{model}")


def triton_source(fmt: TaskFormat, var: Variant, tag: str = "") -> str:
    """The ``triton`` format: the same algorithm as a Triton kernel."""
    _, suffix = _names(fmt, var, tag)
    params = dict(var.triton_params)
    kernels = var.triton.format(name=f"{fmt.short}_{var.label}{suffix}_kernel", **params)
    model = _model_class(fmt, _forward_args(fmt), fmt.prepare + fmt.triton_call)
    return (f"{_header(fmt, var, 'triton', tag)}\nimport torch\nimport torch.nn as nn\nimport triton\n"
            f"import triton.language as tl\n{_PY_HELPERS}\n{kernels}\n\n{model}")


_RENDER = {"cuda": cuda_source, "cuda_nvrtc": nvrtc_source, "triton": triton_source}


def render(stem: str, variant: int | str, backend: str, tag: str = "") -> str:
    """One candidate: task ``stem``, variant index or label, in ``backend`` format; ``tag`` makes names unique."""
    if backend not in _RENDER:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    fmt = FORMATS[stem]
    var = (fmt.variants[variant] if isinstance(variant, int)
           else next(v for v in fmt.variants if v.label == variant))
    return _RENDER[backend](fmt, var, tag)


def candidates(backend: str, tag: str = "") -> list[tuple[str, str]]:
    """Every candidate in ``backend`` format as ``(task_file_stem, source)``, round-robin over the tasks."""
    n_variants = max(len(f.variants) for f in FORMATS.values())
    out = []
    for i in range(n_variants):
        for stem in TASK_STEMS:
            if i < len(FORMATS[stem].variants):
                out.append((stem, render(stem, i, backend, tag)))
    return out


def candidate_labels() -> list[tuple[str, str]]:
    """``(task_file_stem, variant label)`` in the order of :func:`candidates`."""
    n_variants = max(len(f.variants) for f in FORMATS.values())
    return [(stem, FORMATS[stem].variants[i].label) for i in range(n_variants) for stem in TASK_STEMS
            if i < len(FORMATS[stem].variants)]


def task_path(stem: str) -> Path:
    return TASKS_DIR / f"{stem}.py"


def dump(directory: Path, backends: tuple[str, ...] = BACKENDS) -> list[Path]:
    written = []
    for backend in backends:
        sub = directory / backend
        sub.mkdir(parents=True, exist_ok=True)
        for k, ((stem, source), (_, label)) in enumerate(zip(candidates(backend), candidate_labels(), strict=True)):
            path = sub / f"{k:02d}_{stem}_{label}.py"
            path.write_text(source, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", metavar="DIR", type=Path,
                        help="write every candidate as DIR/BACKEND/NN_TASK_VARIANT.py")
    parser.add_argument("--backend", choices=BACKENDS, action="append",
                        help="only this format (repeatable; default: all three)")
    args = parser.parse_args(argv)
    backends = tuple(args.backend) if args.backend else BACKENDS
    if args.dump is None:
        for backend in backends:
            print(f"{backend}: {len(candidates(backend))} candidates")
        for k, (stem, label) in enumerate(candidate_labels()):
            print(f"  {k:2d} {stem} {label}")
        return 0
    paths = dump(args.dump, backends)
    print(f"wrote {len(paths)} candidates under {args.dump}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
