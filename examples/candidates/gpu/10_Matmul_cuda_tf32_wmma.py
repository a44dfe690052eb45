"""Honest TF32: a tensor-core GEMM of its own (nvcuda::wmma, precision::tf32, m16n16k8, float accumulation).

A kernel using TF32 where the task's tolerance allows it: flagged reduced_precision (its normalized error, ~2.9e-4,
is about a thousand times the reference's own float32 error against float64), not rejected; faster_than_sol too
where it beats 1.64 ms (84 TFLOP/s, the float32 bound of 2.05 ms less the margin). 128x128 block tiles,
k-steps of 32 through a 3-stage cp.async pipeline in padded shared memory, eight warps of 64x32; values are
rounded to TF32 (wmma::__float_to_tf32) once they are in the fragments. Shapes the tiles do not cover go to a plain
float32 tiled kernel. Built for the local GPU (sm_80 or later: TF32 wmma needs Ampere).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <mma.h>
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "TF32 wmma and cp.async need sm_80 or later"
#endif

using namespace nvcuda;

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, THREADS = 256;
// Row strides of the tiles (floats), padded so that a fragment's 32 lanes hit 32 banks; every fragment still
// starts 32-byte aligned, as load_matrix_sync requires.
constexpr int LDA = BK + 4;
constexpr int LDB = BN + 8;
constexpr int A_STAGE = BM * LDA, B_STAGE = BK * LDB;  // floats per stage
constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * (int)sizeof(float);  // 107,520

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One BMxBK tile of A and one BKxBN tile of B (k-tile kt) into stage `stage`: 4 + 4 16-byte copies per thread.
__device__ __forceinline__ void load_tiles(float* As, float* Bs, const float* __restrict__ A,
                                           const float* __restrict__ B, int K, int N, int row0, int col0,
                                           int kt, int stage) {
    float* as = As + stage * A_STAGE;
    float* bs = Bs + stage * B_STAGE;
    const int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int idx = threadIdx.x + i * THREADS;  // 0..1023
        const int r = idx >> 3, c = (idx & 7) * 4;   // A: 128 rows of 8 float4
        cp_async16(as + r * LDA + c, A + (int64_t)(row0 + r) * K + k0 + c);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int idx = threadIdx.x + i * THREADS;
        const int r = idx >> 5, c = (idx & 31) * 4;  // B: 32 rows of 32 float4
        cp_async16(bs + r * LDB + c, B + (int64_t)(k0 + r) * N + col0 + c);
    }
}

// C = A @ B for row-major A (MxK), B (KxN), C (MxN); M % 128 == N % 128 == K % 32 == 0, A and B 16-byte aligned.
__global__ void __launch_bounds__(THREADS, 2) tf32_wmma_gemm_kernel(const float* __restrict__ A,
                                                                   const float* __restrict__ B,
                                                                   float* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(128) float smem[];
    float* As = smem;
    float* Bs = smem + STAGES * A_STAGE;

    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, each 64 rows x 32 columns of the block tile

    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int ktiles = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_tiles(As, Bs, A, B, K, N, row0, col0, s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile kt have landed ...
        __syncthreads();              // ... everyone's, and everyone is done with tile kt - 1
        const int next = kt + STAGES - 1;  // into the stage tile kt - 1 used
        if (next < ktiles) load_tiles(As, Bs, A, B, K, N, row0, col0, next, next % STAGES);
        cp_async_commit();  // an empty group where nothing was loaded: the count stays one per iteration

        const float* as = As + (kt % STAGES) * A_STAGE + (wm * 64) * LDA;
        const float* bs = Bs + (kt % STAGES) * B_STAGE + wn * 32;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wmma::load_matrix_sync(a[i], as + i * 16 * LDA + kk, LDA);
#pragma unroll
                for (int t = 0; t < a[i].num_elements; ++t) a[i].x[t] = wmma::__float_to_tf32(a[i].x[t]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(b[j], bs + kk * LDB + j * 16, LDB);
#pragma unroll
                for (int t = 0; t < b[j].num_elements; ++t) b[j].x[t] = wmma::__float_to_tf32(b[j].x[t]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float* c = C + (int64_t)(row0 + wm * 64 + i * 16) * N + col0 + wn * 32 + j * 16;
            wmma::store_matrix_sync(c, acc[i][j], N, wmma::mem_row_major);
        }
}

// Any shape, float32 on CUDA cores: 16x16 tiles through shared memory.
__global__ void sgemm_tiled_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                   int M, int N, int K) {
    __shared__ float as[16][17];
    __shared__ float bs[16][17];
    const int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;
    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        as[threadIdx.y][threadIdx.x] = (r < M && k0 + threadIdx.x < K) ? A[(int64_t)r * K + k0 + threadIdx.x] : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (k0 + threadIdx.y < K && c < N) ? B[(int64_t)(k0 + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 16; ++k) sum = fmaf(as[threadIdx.y][k], bs[k][threadIdx.x], sum);
        __syncthreads();
    }
    if (r < M && c < N) C[(int64_t)r * N + c] = sum;
}

cudaError_t tf32_gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
    const bool tiled = M % BM == 0 && N % BN == 0 && K % BK == 0 && K > 0 &&
                       reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0;
    if (tiled) {
        cudaError_t err = cudaFuncSetAttribute(tf32_wmma_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               SMEM_BYTES);
        if (err != cudaSuccess) return err;
        tf32_wmma_gemm_kernel<<<dim3(N / BN, M / BM), THREADS, SMEM_BYTES, stream>>>(A, B, C, M, N, K);
    } else {
        sgemm_tiled_kernel<<<dim3((N + 15) / 16, (M + 15) / 16), dim3(16, 16), 0, stream>>>(A, B, C, M, N, K);
    }
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t tf32_gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream);

torch::Tensor tf32_matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "tf32_matmul: CUDA tensors expected");
    TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat, "tf32_matmul: float32 only");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "tf32_matmul: (M, K) @ (K, N) expected");
    TORCH_CHECK(a.size(0) < (1LL << 31) && a.size(1) < (1LL << 31) && b.size(1) < (1LL << 31),
                "tf32_matmul: dimensions must fit in int");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    const int64_t M = ac.size(0), K = ac.size(1), N = bc.size(1);
    auto out = torch::empty({M, N}, ac.options());
    if (out.numel() == 0) return out;
    if (K == 0) return out.zero_();
    cudaError_t err = tf32_gemm_launch(ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
                                       (int)M, (int)N, (int)K, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "tf32_matmul launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_matmul_10_tf32_wmma",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["tf32_matmul"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return _ext.tf32_matmul(A, B)
