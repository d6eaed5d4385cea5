// What the standalone kernel benchmarks share (kernel_bench.cu, l2_prefetch_bench.cu): random
// device inputs, weights with enough copies that rotating over them streams from DRAM, and a
// timer of launches replayed from one CUDA graph. Included by one .cu file each.
#ifndef STRATA_BENCH_GPU_KERNEL_BENCH_COMMON_CUH_
#define STRATA_BENCH_GPU_KERNEL_BENCH_COMMON_CUH_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "common/cuda/kernels/gemv_kernels.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"

using namespace strata::gpu;  // NOLINT: standalone tools

namespace {

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int64_t kHidden = 2048, kHeads = 32, kKvHeads = 4, kHeadDim = 128;
constexpr int64_t kExperts = 128, kTopK = 8, kInter = 768, kVocab = 151936;
constexpr size_t kRotateBytes = size_t{256} << 20;  // > 50 MB of L2, several times over
int failures = 0;

__device__ uint32_t Hash(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x);
}

__global__ void FillBf16(bf16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = __float2bfloat16((Hash(i, seed) / 4294967296.0f - 0.5f) * 2.0f * scale);
  }
}

__global__ void FillFp8(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint8_t b = Hash(i, seed) & 0xff;
    p[i] = (b & 0x7f) == 0x7f ? 0 : b;  // no NaN
  }
}

__global__ void FillF32(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = lo + (hi - lo) * (Hash(i, seed) / 4294967296.0f);
  }
}

template <typename T>
T* Alloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

bf16* RandBf16(size_t n, float scale) {
  static uint64_t seed = 1;
  bf16* p = Alloc<bf16>(n);
  FillBf16<<<1024, 256>>>(p, n, ++seed, scale);
  return p;
}

template <typename T>
std::vector<T> Get(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <typename T>
T* Put(const std::vector<T>& h) {
  T* d = Alloc<T>(h.size());
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

float F(bf16 v) { return __bfloat162float(v); }

template <typename A, typename B>
double RelErr(const std::vector<A>& a, const std::vector<B>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = F(a[i]), y = F(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    d += (x - y) * (x - y);
    n += y * y;
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

void Check(const char* what, double err, double tol) {
  const bool ok = err <= tol;
  failures += !ok;
  std::printf("check %-44s rel err %.3g (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAILED");
}

// Median time per call of body(i) over `calls` calls captured in one graph.
double TimeUs(cudaStream_t s, int calls, const std::function<void(int)>& body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) body(i);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, s));
  std::vector<float> ms;
  for (int r = 0; r < 9; ++r) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms[ms.size() / 2] * 1e3 / calls;
}

void Row(const char* what, double us, double bytes) {
  std::printf("time  %-44s %8.2f us  %7.0f GB/s\n", what, us, bytes / (us * 1e3));
}

// A weight matrix with `copies` copies, so rotating launches stream from DRAM.
struct Weights {
  std::vector<DeviceWeight> w;
  DeviceWeight& at(int i) { return w[i % w.size()]; }
};

Weights MakeWeights(int64_t out, int64_t in, bool fp8) {
  const size_t bytes = out * in * (fp8 ? 1 : 2);
  const int copies = static_cast<int>(std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes));
  Weights r;
  for (int c = 0; c < copies; ++c) {
    DeviceWeight w;
    w.out = out;
    w.in = in;
    if (fp8) {
      uint8_t* d = Alloc<uint8_t>(out * in);
      FillFp8<<<1024, 256>>>(d, out * in, 100 + c);
      float* s = Alloc<float>(out);
      FillF32<<<64, 256>>>(s, out, 200 + c, 0.5f / 448, 1.5f / 448);
      w.data = d;
      w.scale = s;
      w.format = WeightFormat::kFp8E4M3;
    } else {
      w.data = RandBf16(out * in, 0.03f);
    }
    r.w.push_back(w);
  }
  return r;
}

// Random experts of one shape (bf16, or FP8 with per-row scales), each in its own buffers.
ExpertWeightTable MakeExperts(int num_experts, int64_t hidden, int64_t inter, bool fp8) {
  const size_t mat = hidden * inter;
  std::vector<const void*> gate(num_experts), up(num_experts), down(num_experts);
  std::vector<const float*> gs(num_experts), us(num_experts), ds(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    const void** ptrs[3] = {&gate[e], &up[e], &down[e]};
    const float** sptrs[3] = {&gs[e], &us[e], &ds[e]};
    const int64_t outs[3] = {inter, inter, hidden};
    for (int j = 0; j < 3; ++j) {
      if (fp8) {
        uint8_t* d = Alloc<uint8_t>(mat);
        FillFp8<<<256, 256>>>(d, mat, 1000 + 3 * e + j);
        float* sc = Alloc<float>(outs[j]);
        FillF32<<<8, 256>>>(sc, outs[j], 5000 + 3 * e + j, 0.02f / 448, 0.04f / 448);
        *ptrs[j] = d;
        *sptrs[j] = sc;
      } else {
        *ptrs[j] = RandBf16(mat, 0.03f);
      }
    }
  }
  ExpertWeightTable t;
  t.format = fp8 ? WeightFormat::kFp8E4M3 : WeightFormat::kBf16;
  t.num_experts = num_experts;
  t.hidden = hidden;
  t.intermediate = inter;
  t.gate = Put(gate);
  t.up = Put(up);
  t.down = Put(down);
  if (fp8) {
    t.gate_scale = Put(gs);
    t.up_scale = Put(us);
    t.down_scale = Put(ds);
  }
  return t;
}

// `sets` routings of kTopK distinct experts of kExperts each, and a weight per slot.
void DrawRoutings(int sets, unsigned seed, std::vector<int32_t>& ids, std::vector<float>& wts) {
  ids.assign(sets * kTopK, 0);
  wts.assign(sets * kTopK, 0.0f);
  srand(seed);
  for (int r = 0; r < sets; ++r) {
    std::vector<int32_t> pool(kExperts);
    for (int e = 0; e < kExperts; ++e) pool[e] = e;
    for (int j = 0; j < kTopK; ++j) {
      std::swap(pool[j], pool[j + rand() % (kExperts - j)]);
      ids[r * kTopK + j] = pool[j];
      wts[r * kTopK + j] = 0.05f + (rand() % 1000) / 4000.0f;
    }
  }
}

}  // namespace

#endif  // STRATA_BENCH_GPU_KERNEL_BENCH_COMMON_CUH_
