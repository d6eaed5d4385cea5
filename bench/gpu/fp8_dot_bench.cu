// How fast an FP8 E4M3 GEMV can turn weight bytes into products, by the way it decodes them.
// One token, rows of 2048, 16-byte loads, every load of a thread issued before any is used (as
// the decode kernels do); matrices rotate through copies larger than L2. Decodes:
//   cvt-f32   hardware e4m3x2 -> f16x2, then f16 -> f32 and FFMA (as the kernels shipped)
//   cvt-h2    hardware e4m3x2 -> f16x2, HFMA2 against x * 2^-8 in f16, f32 per 16 products
//   int-h2    integer decode to f16 (code * 2^-8, exact), HFMA2 against x in f16
//   int-f32   integer decode to f32 (code * 2^-120, exact), FFMA against x * 2^60
// Prints us, GB/s and the largest error against a float64 reference, relative to the largest
// output. Build: nvcc -std=c++20 -O3 -arch=sm_90 bench/gpu/fp8_dot_bench.cu -o fp8_dot_bench
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(x)                                                   \
  do {                                                             \
    const cudaError_t e = (x);                                     \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

namespace {

constexpr int kThreads = 256;
constexpr int kRows = 4;    // rows a warp computes
constexpr int kUnroll = 2;  // 16-byte chunks of each row a lane loads before using any

__device__ __forceinline__ __half2 AsHalf2(uint32_t v) {
  return *reinterpret_cast<const __half2*>(&v);
}

// Two E4M3 codes (bytes 8..15 of each 16-bit lane of t) as f16 code * 2^-8: the sign stays at
// bit 15, exponent and mantissa move down one bit (bias 7 -> 15 is the 2^-8).
__device__ __forceinline__ __half2 LaneBytesToHalf2(uint32_t t) {
  const uint32_t u = t >> 1;
  return AsHalf2((u & 0x3F803F80u) | (t & 0x80008000u));
}

// E4M3 byte at bits 24..31 of t as f32 code * 2^-120 (bias 7 -> 127).
__device__ __forceinline__ float TopByteToFloat(uint32_t t) {
  return __uint_as_float(static_cast<uint32_t>(static_cast<int32_t>(t) >> 4) & 0x87F00000u);
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 3)
    Fp8Gemv(const uint4* __restrict__ w, const __nv_bfloat16* __restrict__ x,
            const float* __restrict__ scale, float* __restrict__ y, int rows, int cols) {
  const int lane = threadIdx.x % 32;
  const int warp = (blockIdx.x * kThreads + threadIdx.x) / 32;
  const int row0 = warp * kRows;
  if (row0 >= rows) return;
  const int chunks = cols / 16;
  float acc[kRows] = {};
  for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 raw[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = min(c0 + 32 * u, chunks - 1);
#pragma unroll
      for (int r = 0; r < kRows; ++r) raw[u][r] = __ldg(w + int64_t{row0 + r} * chunks + c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c >= chunks) continue;
      const uint4 xv4[2] = {__ldg(reinterpret_cast<const uint4*>(x + c * 16)),
                            __ldg(reinterpret_cast<const uint4*>(x + c * 16) + 1)};
      const __nv_bfloat162* xb = reinterpret_cast<const __nv_bfloat162*>(xv4);
      if constexpr (kMode == 0 || kMode == 3) {
        float xf[16];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 f = __bfloat1622float2(xb[j]);
          xf[2 * j] = kMode == 3 ? f.x * 0x1p60f : f.x;
          xf[2 * j + 1] = kMode == 3 ? f.y * 0x1p60f : f.y;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw[u][r]);
          if constexpr (kMode == 0) {
            const __nv_fp8x2_storage_t* pairs =
                reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw[u][r]);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float2 f =
                  __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
              acc[r] = fmaf(f.x, xf[2 * j], acc[r]);
              acc[r] = fmaf(f.y, xf[2 * j + 1], acc[r]);
            }
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t v = words[q];
              acc[r] = fmaf(TopByteToFloat(v << 24), xf[4 * q], acc[r]);
              acc[r] = fmaf(TopByteToFloat(v << 16), xf[4 * q + 1], acc[r]);
              acc[r] = fmaf(TopByteToFloat(v << 8), xf[4 * q + 2], acc[r]);
              acc[r] = fmaf(TopByteToFloat(v), xf[4 * q + 3], acc[r]);
            }
          }
        }
      } else {
        __half2 xh[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float2 f = __bfloat1622float2(xb[j]);
          if (kMode == 1) f = make_float2(f.x * 0x1p-8f, f.y * 0x1p-8f);
          xh[j] = __float22half2_rn(f);
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw[u][r]);
          __half2 part = __float2half2_rn(0.0f);
          if constexpr (kMode == 1) {
            const __nv_fp8x2_storage_t* pairs =
                reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw[u][r]);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              part = __hfma2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)), xh[j], part);
            }
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t v = words[q];
              part = __hfma2(LaneBytesToHalf2(__byte_perm(v, 0, 0x1404)), xh[2 * q], part);
              part = __hfma2(LaneBytesToHalf2(__byte_perm(v, 0, 0x3424)), xh[2 * q + 1], part);
            }
          }
          const float2 f = __half22float2(part);
          acc[r] += f.x + f.y;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (lane < kRows) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kRows; ++r) v = lane == r ? acc[r] : v;
    // int-f32: 2^-120 * 2^60 * 2^60 = 1; the f16 decodes carry 2^-8 (cvt-h2 on x, int-h2 on w).
    const float fix = kMode == 3 ? 0x1p60f : (kMode == 0 ? 1.0f : 256.0f);
    y[row0 + lane] = v * fix * scale[row0 + lane];
  }
}

float Fp8ToFloat(uint8_t b) {
  __nv_fp8_e4m3 f;
  f.__x = b;
  return static_cast<float>(f);
}

template <int kMode>
void Run(const char* name, const std::vector<uint4*>& w, const __nv_bfloat16* x, const float* scale,
         float* y, int rows, int cols, const std::vector<double>& ref) {
  const int blocks = (rows / kRows * 32 + kThreads - 1) / kThreads;
  auto launch = [&](int i) {
    Fp8Gemv<kMode><<<blocks, kThreads>>>(w[i % w.size()], x, scale, y, rows, cols);
  };
  launch(0);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> got(rows);
  CHECK(cudaMemcpy(got.data(), y, rows * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0, top = 0;
  for (int i = 0; i < rows; ++i) {
    err = std::max(err, std::fabs(got[i] - ref[i]));
    top = std::max(top, std::fabs(ref[i]));
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  constexpr int kIters = 400;
  for (int i = 0; i < 20; ++i) launch(i);
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < kIters; ++i) launch(i);
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  const double us = ms * 1000.0 / kIters;
  std::printf("%-8s %5d x %d  %8.2f us  %6.0f GB/s  max err %.2e of the largest output\n", name,
              rows, cols, us, double(rows) * cols / us / 1e3, err / top);
}

void Shape(int rows, int cols) {
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(size_t(rows) * cols);
  for (auto& c : codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c &= 0xFE;  // no NaN codes
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<__nv_bfloat16> xh(cols);
  std::vector<float> scale(rows);
  for (auto& v : xh) v = __float2bfloat16(normal(rng) * 4.0f);
  for (auto& s : scale) s = 0.001f * (1.0f + (rng() % 100) / 100.0f);
  std::vector<double> ref(rows);
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int c = 0; c < cols; ++c) {
      sum += double(Fp8ToFloat(codes[size_t(r) * cols + c])) * __bfloat162float(xh[c]);
    }
    ref[r] = sum * scale[r];
  }
  // Copies past L2 (50 MB on the H200), so every launch reads DRAM.
  const size_t bytes = codes.size();
  const int copies = std::max<int>(2, int(200e6 / bytes));
  std::vector<uint4*> w(copies);
  for (auto& p : w) {
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemcpy(p, codes.data(), bytes, cudaMemcpyHostToDevice));
  }
  __nv_bfloat16* x;
  float *s, *y;
  CHECK(cudaMalloc(&x, cols * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&s, rows * sizeof(float)));
  CHECK(cudaMalloc(&y, rows * sizeof(float)));
  CHECK(cudaMemcpy(x, xh.data(), cols * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(s, scale.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
  Run<0>("cvt-f32", w, x, s, y, rows, cols, ref);
  Run<1>("cvt-h2", w, x, s, y, rows, cols, ref);
  Run<2>("int-h2", w, x, s, y, rows, cols, ref);
  Run<3>("int-f32", w, x, s, y, rows, cols, ref);
  Run<0>("cvt-f32", w, x, s, y, rows, cols, ref);
  for (auto p : w) CHECK(cudaFree(p));
  CHECK(cudaFree(x));
  CHECK(cudaFree(s));
  CHECK(cudaFree(y));
}

}  // namespace

int main() {
  Shape(12288, 2048);  // Qwen3's 8 experts' gate and up rows at one token
  Shape(4096, 2048);   // its q projection
  Shape(2048, 6144);   // down rows over 8 experts' 768 (as one long row)
  return 0;
}
