// The prefill kernels alone, at qwen3-30b-a3b's and Mixtral's shapes: attention over a long
// prompt (the CUDA-core kernel against the tensor-core one, bf16 and FP8 caches) and the
// grouped experts of a prefill chunk (tensor-core items of 16 tokens against 64-token
// shared-memory tiles). Prints a table with the achieved TFLOP/s and the share of the dense
// bf16 peak given by --peak-tflops (989: the H100 SXM's; the H200 has the same tensor cores),
// and writes the rows as JSON to the file named by --json.
//   prefill_kernel_bench [--json FILE] [--peak-tflops 989] [--attention-only]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/gpu/kernel_bench_common.cuh"
#include "common/cuda/kernels/paged_attention_kernels.h"

namespace {

struct Result {
  std::string name;
  double us, tflop;
};
std::vector<Result> results;
double peak_tflops = 989.0;

void Report(const std::string& name, double us, double flop) {
  const double tflops = flop / (us * 1e6);
  std::printf("time  %-58s %10.1f us  %6.1f TFLOP/s  %5.1f%% of peak\n", name.c_str(), us, tflops,
              100.0 * tflops / peak_tflops);
  results.push_back({name, us, flop / 1e12});
}

// One sequence's cache of `context` positions (block 32, scattered blocks), random bf16, or
// random E4M3 codes read as an FP8 cache with scales 0.01.
struct Cache {
  PagedKvLayer layer;
  int blocks;
};
Cache MakeCache(int context, bool fp8) {
  constexpr int kBlock = 32;
  Cache c;
  c.blocks = (context + kBlock - 1) / kBlock;
  std::vector<int32_t> table(c.blocks);
  for (int b = 0; b < c.blocks; ++b) table[b] = (b * 37) % c.blocks;  // blocks: powers of 2
  const size_t elems = static_cast<size_t>(c.blocks) * 2 * kBlock * kKvHeads * kHeadDim;
  PagedKvLayer& kv = c.layer;
  kv.data = RandBf16(elems, 1.0f);
  if (fp8) {
    FillFp8<<<1024, 256>>>(reinterpret_cast<uint8_t*>(kv.data), elems, 77);  // codes, 1 byte each
    kv.fp8 = true;
    kv.k_scale = Put(std::vector<float>(2 * kKvHeads, 0.01f));
    kv.v_scale = kv.k_scale + kKvHeads;
  }
  kv.block_tables = Put(table);
  kv.max_blocks_per_seq = c.blocks;
  kv.block_size = kBlock;
  kv.num_kv_heads = kKvHeads;
  kv.head_dim = kHeadDim;
  return c;
}

// Queries at positions [first, context) of one sequence over a cache of `context` keys.
void AttentionRows(cudaStream_t s, int first, int context, bool fp8, bool with_cuda_cores) {
  const Cache cache = MakeCache(context, fp8);
  const int n = context - first;
  std::vector<int32_t> seq(n, 0), pos(n);
  for (int i = 0; i < n; ++i) pos[i] = first + i;
  const TokenBatch tokens{Put(seq), Put(pos), n};
  const bf16* q = RandBf16(static_cast<size_t>(n) * kHeads * kHeadDim, 2.0f);
  bf16* out_tc = Alloc<bf16>(static_cast<size_t>(n) * kHeads * kHeadDim);
  bf16* out_cc = Alloc<bf16>(static_cast<size_t>(n) * kHeads * kHeadDim);
  PagedAttentionParams p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.q_stride = p.out_stride = kHeads * kHeadDim;
  p.max_context = context;
  p.max_queries_per_seq = n;
  const PagedAttentionPlan tc = PlanPagedAttention(n, p, 132);
  if (!tc.tensor_cores) std::printf("note: the planner did not choose the tensor cores\n");
  p.max_queries_per_seq = 1;
  const PagedAttentionPlan cc = PlanPagedAttention(n, p, 132);
  uint8_t* ws = Alloc<uint8_t>(std::max<size_t>(cc.workspace_bytes, 16));
  // Causal: query i sees first + i + 1 keys; QK and PV 2 FLOP each per (key, dim, head).
  const double flop = 4.0 * kHeads * kHeadDim * (double(n) * (first + 1) + double(n) * (n - 1) / 2);
  char name[128];
  const char* kind = fp8 ? "fp8" : "bf16";
  std::snprintf(name, sizeof(name), "attention %s: queries %d-%d, tensor cores", kind, first,
                context - 1);
  const int calls = context >= 16384 ? 1 : 4;
  Report(name,
         TimeUs(s, calls,
                [&](int) {
                  CK(LaunchPagedAttention(q, tokens, cache.layer, p, tc, nullptr, out_tc, s));
                }),
         flop);
  if (!with_cuda_cores) return;
  std::snprintf(name, sizeof(name), "attention %s: queries %d-%d, CUDA cores (%d splits)", kind,
                first, context - 1, cc.num_splits);
  Report(
      name,
      TimeUs(s, calls,
             [&](int) { CK(LaunchPagedAttention(q, tokens, cache.layer, p, cc, ws, out_cc, s)); }),
      flop);
  CK(cudaStreamSynchronize(s));
  std::snprintf(name, sizeof(name), "attention %s %d-%d: tensor cores vs CUDA cores", kind, first,
                context - 1);
  Check(name,
        RelErr(Get(out_tc, static_cast<size_t>(n) * kHeads * kHeadDim),
               Get(out_cc, static_cast<size_t>(n) * kHeads * kHeadDim)),
        1e-2);
}

// Uniformly routed experts of n tokens: items of 16 on the tensor cores against the tiles.
void ExpertRows(cudaStream_t s, const char* shape, int num_experts, int top_k, int64_t hidden,
                int64_t inter, int n, bool fp8) {
  const ExpertWeightTable t = MakeExperts(num_experts, hidden, inter, fp8);
  std::vector<int32_t> ids(static_cast<size_t>(n) * top_k);
  std::vector<float> wts(ids.size(), 1.0f / top_k);
  srand(5);
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> pool(num_experts);
    for (int e = 0; e < num_experts; ++e) pool[e] = e;
    for (int j = 0; j < top_k; ++j) {
      std::swap(pool[j], pool[j + rand() % (num_experts - j)]);
      ids[static_cast<size_t>(i) * top_k + j] = pool[j];
    }
  }
  const int32_t* d_ids = Put(ids);
  const float* d_wts = Put(wts);
  const bf16* x = RandBf16(static_cast<size_t>(n) * hidden, 1.0f);
  uint8_t* wsb = Alloc<uint8_t>(ExpertWorkspaceBytes(n, top_k, hidden, inter));
  const ExpertWorkspace ws = CarveExpertWorkspace(wsb, n, top_k, hidden, inter);
  std::vector<bf16*> outs = {Alloc<bf16>(static_cast<size_t>(n) * hidden),
                             Alloc<bf16>(static_cast<size_t>(n) * hidden)};
  const double flop = 2.0 * 3.0 * double(n) * top_k * hidden * inter;
  for (bool tiled : {false, true}) {
    SetTiledExperts(tiled);
    char name[128];
    std::snprintf(name, sizeof(name), "experts %s %s n=%d: %s", shape, fp8 ? "fp8" : "bf16", n,
                  tiled ? "64-token tiles" : "16-token items");
    bf16* out = outs[tiled];
    Report(name,
           TimeUs(s, 4,
                  [&](int) {
                    CK(LaunchGroupedExperts(x, d_ids, d_wts, n, top_k, t, GluParams(), ws, out, s));
                  }),
           flop);
  }
  SetTiledExperts(true);
  CK(cudaStreamSynchronize(s));
  char check[128];
  std::snprintf(check, sizeof(check), "experts %s %s n=%d: tiles vs items", shape,
                fp8 ? "fp8" : "bf16", n);
  Check(check,
        RelErr(Get(outs[1], static_cast<size_t>(n) * hidden),
               Get(outs[0], static_cast<size_t>(n) * hidden)),
        1e-2);
}

void WriteJson(const char* path, const char* device) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::perror(path);
    return;
  }
  std::fprintf(f, "{\"device\": \"%s\", \"peak_tflops\": %.0f, \"rows\": [\n", device, peak_tflops);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f, "  {\"name\": \"%s\", \"us\": %.1f, \"tflop\": %.4f, \"tflops\": %.1f}%s\n",
                 r.name.c_str(), r.us, r.tflop, r.tflop / (r.us * 1e-6),
                 i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "], \"failures\": %d}\n", failures);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  bool attention_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--attention-only") == 0) attention_only = true;
    if (i + 1 >= argc) continue;
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
    if (std::strcmp(argv[i], "--peak-tflops") == 0) peak_tflops = std::atof(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; peak assumed %.0f TFLOP/s dense bf16\n", prop.name,
              prop.multiProcessorCount, peak_tflops);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  // qwen3-30b-a3b's attention (32 query heads, 4 kv heads, 128 dims): whole prompts, and the
  // last 4,096-token chunk of a 16k prompt as the scheduler cuts it.
  AttentionRows(s, 0, 4096, false, true);
  AttentionRows(s, 12288, 16384, false, true);
  AttentionRows(s, 0, 16384, false, true);
  AttentionRows(s, 0, 16384, true, false);
  AttentionRows(s, 0, 32768, false, false);
  if (!attention_only) {
    for (bool fp8 : {true, false}) {
      for (int n : {512, 4096}) ExpertRows(s, "qwen3", kExperts, kTopK, kHidden, kInter, n, fp8);
    }
    ExpertRows(s, "mixtral", 8, 2, 4096, 14336, 4096, true);
  }
  std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "PASSED", failures);
  if (json != nullptr) WriteJson(json, prop.name);
  return failures ? 1 : 0;
}
