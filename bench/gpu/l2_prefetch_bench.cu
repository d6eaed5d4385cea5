// Not a test: can a latency-bound kernel pull the next kernel's weights into L2 (the bulk
// prefetch of sm_90, cp.async.bulk.prefetch.L2) so that the decode GEMVs and one-token experts
// read them from there? Times, at the qwen3-30b-a3b shape with FP8 weights: the GEMVs cold and
// warm, after a kernel that spins for 3/6/10 us with and without prefetching their weights, the
// experts after their weights' prefetch, and whether a prefetch survives the experts streaming
// through L2. Built by hand like kernel_bench (bench/gpu/build_kernel_bench.sh).
#include <initializer_list>

#include "bench/gpu/kernel_bench_common.cuh"

namespace {

struct PrefetchList {
  static constexpr int kMax = 32;
  const void* ptr[kMax];
  uint32_t bytes[kMax];
  int count = 0;
  void Add(const void* p, size_t n) {
    if (count == kMax || n > UINT32_MAX) {
      std::fprintf(stderr, "PrefetchList: more than %d ranges or a range past 4 GB\n", kMax);
      std::exit(1);
    }
    ptr[count] = p;
    bytes[count] = static_cast<uint32_t>(n);
    ++count;
  }
};

// How SpinPrefetch requests the list's bytes (printed as its number in the rows' names).
enum class Prefetch : int { kNone = 0, kBulk = 1, kBulkEvictLast = 2 };

// The list's ranges prefetched as `mode` says, 64 KB a request spread over the block's
// threads; then thread 0 spins for spin_ns (a stand-in for a latency-bound kernel such as
// decode attention).
__global__ void SpinPrefetch(const __grid_constant__ PrefetchList l, int64_t spin_ns,
                             Prefetch mode) {
  constexpr uint32_t kChunk = 64 * 1024;
  uint64_t policy = 0;
  if (mode == Prefetch::kBulkEvictLast) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  }
  if (mode != Prefetch::kNone) {
    for (int r = 0; r < l.count; ++r) {
      const char* base = static_cast<const char*>(l.ptr[r]);
      for (uint32_t off = threadIdx.x * kChunk; off < l.bytes[r]; off += blockDim.x * kChunk) {
        const uint32_t n = min(kChunk, l.bytes[r] - off);
        if (mode == Prefetch::kBulkEvictLast) {
          asm volatile(
              "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(base + off),
              "r"(n), "l"(policy)
              : "memory");
        } else {
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n)
                       : "memory");
        }
      }
    }
  }
  if (threadIdx.x == 0 && spin_ns > 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < static_cast<uint64_t>(spin_ns));
  }
}

void Spin(cudaStream_t s, const PrefetchList& l, int64_t ns, Prefetch mode) {
  SpinPrefetch<<<1, 32, 0, s>>>(l, ns, mode);
  CK(cudaGetLastError());
}

PrefetchList WeightList(std::initializer_list<const DeviceWeight*> ws) {
  PrefetchList l;
  for (const DeviceWeight* w : ws) l.Add(w->data, w->out * w->in);
  return l;
}

void PrefetchTimes(cudaStream_t s) {
  const bf16* x = RandBf16(kHidden, 1.0f);
  const bf16* xo = RandBf16(kHeads * kHeadDim, 1.0f);
  Weights q8 = MakeWeights(kHeads * kHeadDim, kHidden, true);
  Weights k8 = MakeWeights(kKvHeads * kHeadDim, kHidden, true);
  Weights v8 = MakeWeights(kKvHeads * kHeadDim, kHidden, true);
  Weights o8 = MakeWeights(kHidden, kHeads * kHeadDim, true);
  bf16* yq = Alloc<bf16>(kHeads * kHeadDim);
  bf16* yk = Alloc<bf16>(kKvHeads * kHeadDim);
  bf16* yv = Alloc<bf16>(kKvHeads * kHeadDim);
  bf16* yo = Alloc<bf16>(kHidden);
  auto gemv_o = [&](int i) {
    CK(LaunchGemv(o8.at(i), xo, kHeads * kHeadDim, 1, yo, OutType::kBf16, kHidden, s));
  };
  auto gemv_qkv = [&](int i) {
    const DeviceWeight* w[] = {&q8.at(i), &k8.at(i), &v8.at(i)};
    void* y[] = {yq, yk, yv};
    CK(LaunchGemvMulti(w, y, 3, x, 1, OutType::kBf16, s));
  };
  const PrefetchList none{};
  const double o_bytes = kHidden * kHeads * kHeadDim * 1.0;
  const double qkv_bytes = (kHeads + 2 * kKvHeads) * kHeadDim * kHidden * 1.0;
  Row("gemv o fp8 alone, cold", TimeUs(s, 64, gemv_o), o_bytes);
  Row("gemv o fp8 alone, warm (one copy)", TimeUs(s, 64, [&](int) { gemv_o(0); }), o_bytes);
  Row("gemv qkv fp8 alone, cold", TimeUs(s, 64, gemv_qkv), qkv_bytes);
  Row("gemv qkv fp8 alone, warm (one copy)", TimeUs(s, 64, [&](int) { gemv_qkv(0); }), qkv_bytes);
  for (int64_t ns : {3000, 6000, 10000}) {
    const double spin = TimeUs(s, 64, [&](int) { Spin(s, none, ns, Prefetch::kNone); });
    std::printf("spin %lld ns alone: %.2f us\n", static_cast<long long>(ns), spin);
    for (Prefetch mode : {Prefetch::kNone, Prefetch::kBulk, Prefetch::kBulkEvictLast}) {
      char name[96];
      std::snprintf(name, sizeof(name), "o after spin %lld, prefetch mode %d (minus spin)",
                    static_cast<long long>(ns), static_cast<int>(mode));
      Row(name,
          TimeUs(s, 64,
                 [&](int i) {
                   Spin(s, WeightList({&o8.at(i)}), ns, mode);
                   gemv_o(i);
                 }) -
              spin,
          o_bytes);
      std::snprintf(name, sizeof(name), "qkv after spin %lld, prefetch mode %d (minus spin)",
                    static_cast<long long>(ns), static_cast<int>(mode));
      Row(name,
          TimeUs(s, 64,
                 [&](int i) {
                   Spin(s, WeightList({&q8.at(i), &k8.at(i), &v8.at(i)}), ns, mode);
                   gemv_qkv(i);
                 }) -
              spin,
          qkv_bytes);
    }
  }

  // One-token experts: the down weights (or all) of the step's experts prefetched just before.
  const ExpertWeightTable t = MakeExperts(kExperts, kHidden, kInter, true);
  const std::vector<const void*> gate = Get(t.gate, kExperts), up = Get(t.up, kExperts),
                                 down = Get(t.down, kExperts);
  constexpr int kSets = 16;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  DrawRoutings(kSets, 11, ids, wts);
  const int32_t* d_ids = Put(ids);
  const float* d_wts = Put(wts);
  uint8_t* wsb = Alloc<uint8_t>(ExpertWorkspaceBytes(1, kTopK, kHidden, kInter));
  const ExpertWorkspace ws = CarveExpertWorkspace(wsb, 1, kTopK, kHidden, kInter);
  bf16* out = Alloc<bf16>(kHidden);
  const GluParams act;
  const size_t mat = kHidden * kInter;
  auto experts = [&](int i) {
    const int r = i % kSets;
    CK(LaunchGroupedExperts(x, d_ids + r * kTopK, d_wts + r * kTopK, 1, kTopK, t, act, ws, out, s));
  };
  auto list = [&](int i, bool all) {
    PrefetchList l;
    for (int j = 0; j < kTopK; ++j) {
      const int e = ids[(i % kSets) * kTopK + j];
      l.Add(down[e], mat);
      if (all) {
        l.Add(gate[e], mat);
        l.Add(up[e], mat);
      }
    }
    return l;
  };
  const double expert_bytes = 3.0 * kTopK * mat;
  const double gap = TimeUs(s, 32, [&](int) { Spin(s, none, 0, Prefetch::kNone); });
  Row("experts fp8 after empty kernel (minus it)",
      TimeUs(s, 32,
             [&](int i) {
               Spin(s, none, 0, Prefetch::kNone);
               experts(i);
             }) -
          gap,
      expert_bytes);
  for (Prefetch mode : {Prefetch::kBulk, Prefetch::kBulkEvictLast}) {
    for (const bool all : {false, true}) {
      char name[96];
      std::snprintf(name, sizeof(name), "experts fp8, %s prefetched at start, mode %d",
                    all ? "all" : "down", static_cast<int>(mode));
      Row(name,
          TimeUs(s, 32,
                 [&](int i) {
                   Spin(s, list(i, all), 0, mode);
                   experts(i);
                 }) -
              gap,
          expert_bytes);
    }
  }
  const double spin10 = TimeUs(s, 32, [&](int) { Spin(s, none, 10000, Prefetch::kNone); });
  // As if the experts were known 10 us ahead: the most a prefetch could give them.
  Row("experts fp8, all prefetched during 10 us (bound)",
      TimeUs(s, 32,
             [&](int i) {
               Spin(s, list(i, true), 10000, Prefetch::kBulkEvictLast);
               experts(i);
             }) -
          spin10,
      expert_bytes);

  // Does a prefetch survive the experts streaming through L2 in between?
  const double base = TimeUs(s, 32, [&](int i) {
    Spin(s, none, 0, Prefetch::kNone);
    experts(i);
    gemv_qkv(i);
  });
  std::printf("experts + qkv, no prefetch: %.2f us\n", base);
  for (Prefetch mode : {Prefetch::kBulk, Prefetch::kBulkEvictLast}) {
    const double with = TimeUs(s, 32, [&](int i) {
      Spin(s, WeightList({&q8.at(i), &k8.at(i), &v8.at(i)}), 0, mode);
      experts(i);
      gemv_qkv(i);
    });
    std::printf("experts + qkv, qkv prefetched before the experts, mode %d: %.2f us (%+.2f)\n",
                static_cast<int>(mode), with, with - base);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  PrefetchTimes(s);
  return 0;
}
