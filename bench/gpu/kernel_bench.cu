// Not a test: checks and times the batch-1 decode kernels at the qwen3-30b-a3b shape (hidden
// 2048, 32/4 heads x 128, 128 experts top-8 x 768, vocab 151936) through their launch APIs,
// each timed as many launches replayed from one CUDA graph, with inputs rotated over copies
// that together exceed the L2 cache. Checks compare the fused paths with the unfused ones.
// Built by hand against the library's kernel objects (bench/gpu/build_kernel_bench.sh).
#include <cstdio>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/gpu/kernel_bench_common.cuh"
#include "common/cuda/kernels/paged_attention_kernels.h"
#include "common/cuda/kernels/paged_kv_kernels.h"
#include "common/cuda/kernels/rope_kernels.h"

namespace {

void GemvChecksAndTimes(cudaStream_t s) {
  const bf16* x = RandBf16(kHidden, 1.0f);
  Weights q = MakeWeights(kHeads * kHeadDim, kHidden, false);
  Weights k = MakeWeights(kKvHeads * kHeadDim, kHidden, false);
  Weights v = MakeWeights(kKvHeads * kHeadDim, kHidden, false);
  Weights o = MakeWeights(kHidden, kHeads * kHeadDim, false);
  Weights lm = MakeWeights(kVocab, kHidden, false);
  bf16* yq = Alloc<bf16>(kHeads * kHeadDim);
  bf16* yk = Alloc<bf16>(kKvHeads * kHeadDim);
  bf16* yv = Alloc<bf16>(kKvHeads * kHeadDim);
  bf16* yq2 = Alloc<bf16>(kHeads * kHeadDim);
  bf16* yk2 = Alloc<bf16>(kKvHeads * kHeadDim);
  bf16* yv2 = Alloc<bf16>(kKvHeads * kHeadDim);
  float* logits = Alloc<float>(kVocab);
  const bf16* xo = RandBf16(kHeads * kHeadDim, 1.0f);
  bf16* yo = Alloc<bf16>(kHidden);

  auto separate = [&](int i, bf16* a, bf16* b, bf16* c) {
    CK(LaunchGemv(q.at(i), x, kHidden, 1, a, OutType::kBf16, q.at(i).out, s));
    CK(LaunchGemv(k.at(i), x, kHidden, 1, b, OutType::kBf16, k.at(i).out, s));
    CK(LaunchGemv(v.at(i), x, kHidden, 1, c, OutType::kBf16, v.at(i).out, s));
  };
  // q, k and v of copy i in one launch, bf16 or FP8 weights.
  auto qkv = [&](Weights& wq, Weights& wk, Weights& wv, int i) {
    const DeviceWeight* w[] = {&wq.at(i), &wk.at(i), &wv.at(i)};
    void* y[] = {yq2, yk2, yv2};
    CK(LaunchGemvMulti(w, y, 3, x, 1, OutType::kBf16, s));
  };
  auto fused = [&](int i) { qkv(q, k, v, i); };
  separate(0, yq, yk, yv);
  fused(0);
  CK(cudaStreamSynchronize(s));
  const double err = RelErr(Get(yq, kHeads * kHeadDim), Get(yq2, kHeads * kHeadDim)) +
                     RelErr(Get(yk, kKvHeads * kHeadDim), Get(yk2, kKvHeads * kHeadDim)) +
                     RelErr(Get(yv, kKvHeads * kHeadDim), Get(yv2, kKvHeads * kHeadDim));
  Check("gemv multi (q,k,v) vs three gemvs", err, 0.0);

  const double qkv_bytes = (kHeads + 2 * kKvHeads) * kHeadDim * kHidden * 2.0;
  Row("gemv q 4096x2048 bf16",
      TimeUs(s, 64,
             [&](int i) {
               CK(LaunchGemv(q.at(i), x, kHidden, 1, yq, OutType::kBf16, q.at(i).out, s));
             }),
      kHeads * kHeadDim * kHidden * 2.0);
  Row("gemv q, k, v: three launches", TimeUs(s, 64, [&](int i) { separate(i, yq, yk, yv); }),
      qkv_bytes);
  Row("gemv q, k, v: one launch", TimeUs(s, 64, fused), qkv_bytes);
  Row("gemv o 2048x4096 bf16",
      TimeUs(s, 64,
             [&](int i) {
               CK(LaunchGemv(o.at(i), xo, kHeads * kHeadDim, 1, yo, OutType::kBf16, kHidden, s));
             }),
      kHidden * kHeads * kHeadDim * 2.0);
  Row("gemv lm_head 151936x2048 bf16 -> f32",
      TimeUs(s, 8,
             [&](int i) {
               CK(LaunchGemv(lm.at(i), x, kHidden, 1, logits, OutType::kF32, kVocab, s));
             }),
      kVocab * kHidden * 2.0);
  Weights q8 = MakeWeights(kHeads * kHeadDim, kHidden, true);
  Weights k8 = MakeWeights(kKvHeads * kHeadDim, kHidden, true);
  Weights v8 = MakeWeights(kKvHeads * kHeadDim, kHidden, true);
  Weights o8 = MakeWeights(kHidden, kHeads * kHeadDim, true);
  Row("gemv q 4096x2048 fp8",
      TimeUs(s, 64,
             [&](int i) {
               CK(LaunchGemv(q8.at(i), x, kHidden, 1, yq, OutType::kBf16, q8.at(i).out, s));
             }),
      kHeads * kHeadDim * kHidden * 1.0);
  // The FP8 attention projections at the shapes the router runs them (--weights fp8).
  Row("gemv q, k, v: one launch fp8", TimeUs(s, 64, [&](int i) { qkv(q8, k8, v8, i); }),
      qkv_bytes / 2);
  Row("gemv o 2048x4096 fp8",
      TimeUs(s, 64,
             [&](int i) {
               CK(LaunchGemv(o8.at(i), xo, kHeads * kHeadDim, 1, yo, OutType::kBf16, kHidden, s));
             }),
      kHidden * kHeads * kHeadDim * 1.0);
}

void ExpertChecksAndTimes(cudaStream_t s, bool fp8) {
  const size_t mat = kHidden * kInter;
  const size_t elem = fp8 ? 1 : 2;
  const ExpertWeightTable t = MakeExperts(kExperts, kHidden, kInter, fp8);
  // Routing sets: 16 different draws of 8 distinct experts (one slot skipped in set 0).
  constexpr int kSets = 16;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  DrawRoutings(kSets, 7, ids, wts);
  ids[3] = -1;
  const int32_t* d_ids = Put(ids);
  const float* d_wts = Put(wts);
  const bf16* x = RandBf16(kSets * kHidden, 1.0f);
  uint8_t* wsb = Alloc<uint8_t>(ExpertWorkspaceBytes(1, kTopK, kHidden, kInter));
  const ExpertWorkspace ws = CarveExpertWorkspace(wsb, 1, kTopK, kHidden, kInter);
  bf16* out = Alloc<bf16>(kHidden);
  bf16* out2 = Alloc<bf16>(kHidden);
  const GluParams act;
  auto staged = [&](int i, bf16* y) {
    const int r = i % kSets;
    const bf16* xr = x + r * kHidden;
    CK(LaunchExpertPlan(d_ids + r * kTopK, 1, kTopK, t, ws, s));
    CK(LaunchExpertGateUp(xr, 1, kTopK, t, act, ws, s));
    CK(LaunchExpertDown(1, kTopK, t, ws, s));
    CK(LaunchExpertCombine(d_ids + r * kTopK, d_wts + r * kTopK, 1, kTopK, kExperts, kHidden, ws, y,
                           s));
  };
  auto grouped = [&](int i, bf16* y) {
    const int r = i % kSets;
    CK(LaunchGroupedExperts(x + r * kHidden, d_ids + r * kTopK, d_wts + r * kTopK, 1, kTopK, t, act,
                            ws, y, s));
  };
  for (int r : {0, 1}) {
    staged(r, out);
    grouped(r, out2);
    CK(cudaStreamSynchronize(s));
    Check(fp8 ? "experts n=1 fp8: direct vs staged" : "experts n=1 bf16: direct vs staged",
          RelErr(Get(out2, kHidden), Get(out, kHidden)), 1e-2);
  }
  const double bytes = 3.0 * kTopK * mat * elem;
  Row(fp8 ? "experts n=1 fp8: plan/gate-up/down/combine"
          : "experts n=1 bf16: plan/gate-up/down/combine",
      TimeUs(s, 32, [&](int i) { staged(i, out); }), bytes);
  Row(fp8 ? "experts n=1 fp8: direct gate-up, down+combine"
          : "experts n=1 bf16: direct gate-up, down+combine",
      TimeUs(s, 32, [&](int i) { grouped(i, out2); }), bytes);
}

// Several tokens' experts in one grouped launch (the decode step of a batch), uniform routing
// of `top_k` distinct experts a token; bytes: the distinct experts' weights, read once each.
void MultiTokenExpertTimes(cudaStream_t s, const char* shape, int num_experts, int top_k,
                           int64_t hidden, int64_t inter, bool fp8) {
  const ExpertWeightTable t = MakeExperts(num_experts, hidden, inter, fp8);
  const GluParams act;
  for (int n : {2, 8, 32}) {
    constexpr int kSets = 4;
    std::vector<int32_t> ids(kSets * n * top_k);
    std::vector<float> wts(ids.size(), 0.125f);
    srand(11);
    double distinct = 0;
    for (int r = 0; r < kSets; ++r) {
      std::vector<bool> used(num_experts, false);
      for (int i = 0; i < n; ++i) {
        std::vector<int32_t> pool(num_experts);
        for (int e = 0; e < num_experts; ++e) pool[e] = e;
        for (int j = 0; j < top_k; ++j) {
          std::swap(pool[j], pool[j + rand() % (num_experts - j)]);
          ids[(r * n + i) * top_k + j] = pool[j];
          used[pool[j]] = true;
        }
      }
      distinct += std::count(used.begin(), used.end(), true);
    }
    distinct /= kSets;
    const int32_t* d_ids = Put(ids);
    const float* d_wts = Put(wts);
    const bf16* x = RandBf16(n * hidden, 1.0f);
    uint8_t* wsb = Alloc<uint8_t>(ExpertWorkspaceBytes(n, top_k, hidden, inter));
    const ExpertWorkspace ws = CarveExpertWorkspace(wsb, n, top_k, hidden, inter);
    bf16* out = Alloc<bf16>(n * hidden);
    for (bool tensor_cores : {false, true}) {
      SetTensorCoreExperts(tensor_cores);
      char what[96];
      std::snprintf(what, sizeof(what), "experts %s n=%d %s (%.0f experts)%s", shape, n,
                    fp8 ? "fp8" : "bf16", distinct, tensor_cores ? " mma" : "");
      const double us = TimeUs(s, 8, [&](int i) {
        const int r = i % kSets;
        CK(LaunchGroupedExperts(x, d_ids + r * n * top_k, d_wts + r * n * top_k, n, top_k, t, act,
                                ws, out, s));
      });
      Row(what, us, distinct * 3.0 * hidden * inter * (fp8 ? 1 : 2));
    }
    // The two kernels on the same routing give the same sums but for rounding.
    std::vector<std::vector<bf16>> outs;
    for (bool tensor_cores : {false, true}) {
      SetTensorCoreExperts(tensor_cores);
      CK(LaunchGroupedExperts(x, d_ids, d_wts, n, top_k, t, act, ws, out, s));
      CK(cudaStreamSynchronize(s));
      outs.push_back(Get(out, n * hidden));
    }
    char check[96];
    std::snprintf(check, sizeof(check), "experts %s n=%d %s: tensor cores against CUDA cores",
                  shape, n, fp8 ? "fp8" : "bf16");
    Check(check, RelErr(outs[1], outs[0]), 1e-2);
  }
}

// A zeroed workspace for cluster plans split over key-range groups (they leave it zeroed).
uint8_t* ClusterWorkspace() {
  static uint8_t* ws = [] {
    const size_t bytes = size_t{64} << 20;
    uint8_t* p = Alloc<uint8_t>(bytes);
    CK(cudaMemset(p, 0, bytes));
    return p;
  }();
  return ws;
}

// `count` caches of `blocks` random bf16 blocks of the benchmark's heads: rotating through
// them makes the keys come from DRAM.
std::vector<bf16*> RandomCaches(int count, int blocks, int block_size) {
  std::vector<bf16*> caches;
  for (int i = 0; i < count; ++i) {
    caches.push_back(RandBf16(size_t{blocks} * 2 * block_size * kKvHeads * kHeadDim, 1.0f));
  }
  return caches;
}

// A block table of `blocks` scattered blocks.
std::vector<int32_t> ScatteredTable(int blocks) {
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = (b * 37) % blocks;
  return table;
}

// The decode kernel's cluster shapes (blocks a cluster x query heads a block; 8x8 is the shape
// before the planner chose among them).
constexpr std::pair<int, int> kClusterShapes[] = {{8, 8}, {16, 8}, {8, 4}, {16, 4}, {16, 2}};

// " (planned)" when the shape is the plan's.
const char* PlannedMark(const PagedAttentionPlan& plan, int cluster_blocks, int heads) {
  return cluster_blocks == plan.num_splits && heads == plan.heads_per_block ? " (planned)" : "";
}

// Decode attention over the benchmark's heads, planned for `max_context` keys.
PagedAttentionParams DecodeParams(int max_context) {
  PagedAttentionParams p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.q_stride = kHeads * kHeadDim;
  p.out_stride = kHeads * kHeadDim;
  p.max_context = max_context;
  return p;
}

PagedKvLayer KvLayer(bf16* data, const int32_t* table, int blocks, int block_size) {
  PagedKvLayer kv;
  kv.data = data;
  kv.block_tables = table;
  kv.max_blocks_per_seq = blocks;
  kv.block_size = block_size;
  kv.num_kv_heads = kKvHeads;
  kv.head_dim = kHeadDim;
  return kv;
}

void AttentionChecksAndTimes(cudaStream_t s, int sm_count) {
  constexpr int kBlock = 16, kMaxContext = 4096;
  constexpr int kLayers = 16;  // rotate caches so the keys come from DRAM
  const int64_t kv_dim = kKvHeads * kHeadDim;
  const int blocks = kMaxContext / kBlock;
  const int32_t* d_table = Put(ScatteredTable(blocks));
  const std::vector<bf16*> caches = RandomCaches(kLayers, blocks, kBlock);
  const bf16* q = RandBf16(kHeads * kHeadDim, 2.0f);
  bf16* out = Alloc<bf16>(kHeads * kHeadDim);
  bf16* out2 = Alloc<bf16>(kHeads * kHeadDim);
  const int32_t zero = 0;
  const int32_t* d_seq = Put(std::vector<int32_t>{zero});
  int32_t* d_pos = Alloc<int32_t>(1);
  const PagedAttentionParams p = DecodeParams(kMaxContext);
  const PagedAttentionPlan plan = PlanPagedAttention(1, p, sm_count);
  // The previous decode graph's plan: 32 splits of 128 keys and a merge kernel.
  PagedAttentionPlan split;
  split.num_splits = 32;
  split.split_len = 128;
  split.workspace_bytes = size_t{kHeads} * split.num_splits * (kHeadDim * 4 + 8);
  uint8_t* ws = Alloc<uint8_t>(split.workspace_bytes);
  auto layer = [&](int l) { return KvLayer(caches[l % kLayers], d_table, blocks, kBlock); };
  const TokenBatch tokens{d_seq, d_pos, 1};
  std::printf("plan: cluster %d, blocks %d, heads a block %d (largest cluster here %d)\n",
              plan.cluster, plan.num_splits, plan.heads_per_block, MaxDecodeClusterBlocks());
  for (int context : {1, 128, 640, 4096}) {
    const int32_t pos = context - 1;
    CK(cudaMemcpy(d_pos, &pos, sizeof(pos), cudaMemcpyHostToDevice));
    CK(LaunchPagedAttention(q, tokens, layer(0), p, split, ws, out, s));
    CK(cudaStreamSynchronize(s));
    const std::vector<bf16> want = Get(out, kHeads * kHeadDim);
    const double bytes = 2.0 * context * kv_dim * 2;
    char name[96];
    std::snprintf(name, sizeof(name), "attention ctx %d: 32 splits + merge", context);
    Row(name,
        TimeUs(s, 64,
               [&](int i) { CK(LaunchPagedAttention(q, tokens, layer(i), p, split, ws, out, s)); }),
        bytes);
    for (const auto& [cluster_blocks, heads] : kClusterShapes) {
      const PagedAttentionPlan shaped = ClusterDecodePlan(p, cluster_blocks, heads);
      CK(LaunchPagedAttention(q, tokens, layer(0), p, shaped, nullptr, out2, s));
      CK(cudaStreamSynchronize(s));
      std::snprintf(name, sizeof(name), "attention ctx %d: cluster %dx%d vs split kernel", context,
                    cluster_blocks, heads);
      Check(name, RelErr(Get(out2, kHeads * kHeadDim), want), 1e-2);
      std::snprintf(name, sizeof(name), "attention ctx %d: cluster kernel %dx%d%s", context,
                    cluster_blocks, heads, PlannedMark(plan, cluster_blocks, heads));
      Row(name,
          TimeUs(s, 64,
                 [&](int i) {
                   CK(LaunchPagedAttention(q, tokens, layer(i), p, shaped, nullptr, out2, s));
                 }),
          bytes);
    }
  }
}

// The fused decode (norm + rope + append + attention in one kernel) against the three
// launches it replaces, on two copies of one cache.
void FusedDecodeChecksAndTimes(cudaStream_t s, int sm_count) {
  constexpr int kBlock = 16, kMaxContext = 4096, kContext = 640;
  const int64_t q_dim = kHeads * kHeadDim, kv_dim = kKvHeads * kHeadDim;
  const int blocks = kMaxContext / kBlock;
  const std::vector<int32_t> table = ScatteredTable(blocks);
  const int32_t* d_table = Put(table);
  const size_t cache_elems = size_t{blocks} * 2 * kBlock * kv_dim;
  bf16* cache_a = RandBf16(cache_elems, 1.0f);
  bf16* cache_b = Alloc<bf16>(cache_elems);
  CK(cudaMemcpy(cache_b, cache_a, cache_elems * sizeof(bf16), cudaMemcpyDeviceToDevice));
  const bf16* q = RandBf16(q_dim, 2.0f);
  const bf16* k = RandBf16(kv_dim, 2.0f);
  const bf16* v = RandBf16(kv_dim, 1.0f);
  bf16* q1 = Alloc<bf16>(q_dim);
  bf16* k1 = Alloc<bf16>(kv_dim);
  std::vector<float> inv_freq(kHeadDim / 2);
  for (int j = 0; j < kHeadDim / 2; ++j) inv_freq[j] = std::pow(1e6f, -2.0f * j / kHeadDim);
  QkRopeParams rope;
  rope.num_heads = kHeads;
  rope.num_kv_heads = kKvHeads;
  rope.head_dim = kHeadDim;
  rope.q_stride = q_dim;
  rope.k_stride = kv_dim;
  rope.inv_freq = Put(inv_freq);
  rope.q_norm = RandBf16(kHeadDim, 0.5f);
  rope.k_norm = RandBf16(kHeadDim, 0.5f);
  const int32_t pos = kContext - 1;
  const int32_t* d_seq = Put(std::vector<int32_t>{0});
  const int32_t* d_pos = Put(std::vector<int32_t>{pos});
  const TokenBatch tokens{d_seq, d_pos, 1};
  const PagedAttentionParams p = DecodeParams(kMaxContext);
  const PagedAttentionPlan plan = PlanPagedAttention(1, p, sm_count);
  auto layer = [&](bf16* data) { return KvLayer(data, d_table, blocks, kBlock); };
  bf16* out_a = Alloc<bf16>(q_dim);
  bf16* out_b = Alloc<bf16>(q_dim);
  auto unfused = [&](int) {
    CK(cudaMemcpyAsync(q1, q, q_dim * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(k1, k, kv_dim * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    CK(LaunchQkNormRope(q1, k1, 1, d_pos, rope, s));
    CK(LaunchPagedKvAppend(k1, kv_dim, v, kv_dim, tokens, layer(cache_a), s));
    CK(LaunchPagedAttention(q1, tokens, layer(cache_a), p, plan, ClusterWorkspace(), out_a, s));
  };
  auto fused = [&](int) {
    CK(LaunchPagedDecodeWithRope(q, k, v, kv_dim, tokens, layer(cache_b), p, rope, plan,
                                 ClusterWorkspace(), out_b, s));
  };
  unfused(0);
  fused(0);
  CK(cudaStreamSynchronize(s));
  // Two kernels may contract the rotation into FMAs differently: allow bf16 rounding flips.
  Check("fused decode vs rope+append+attention", RelErr(Get(out_b, q_dim), Get(out_a, q_dim)),
        1e-3);
  const std::vector<bf16> ca = Get(cache_a, cache_elems), cb = Get(cache_b, cache_elems);
  std::vector<bf16> rows_a, rows_b;
  for (int kv = 0; kv < 2; ++kv) {
    const size_t off =
        ((size_t{static_cast<uint32_t>(table[pos / kBlock])} * 2 + kv) * kBlock + pos % kBlock) *
        kv_dim;
    rows_a.insert(rows_a.end(), ca.begin() + off, ca.begin() + off + kv_dim);
    rows_b.insert(rows_b.end(), cb.begin() + off, cb.begin() + off + kv_dim);
  }
  Check("fused decode: appended key and value", RelErr(rows_b, rows_a), 1e-2);
  Check("fused decode: the rest of the cache", RelErr(cb, ca), 1e-4);
  Row("decode ctx 640: rope, append, attention", TimeUs(s, 64, unfused), 4.0 * kContext * kv_dim);
  Row("decode ctx 640: fused kernel, planned", TimeUs(s, 64, fused), 4.0 * kContext * kv_dim);
  const PagedAttentionPlan before = ClusterDecodePlan(p, 8, 8);
  Row("decode ctx 640: fused kernel, 8x8",
      TimeUs(s, 64,
             [&](int) {
               CK(LaunchPagedDecodeWithRope(q, k, v, kv_dim, tokens, layer(cache_b), p, rope,
                                            before, ClusterWorkspace(), out_b, s));
             }),
      4.0 * kContext * kv_dim);

  // In place the decode sits between the FP8 q/k/v GEMV it waits for and the o GEMV that waits
  // for it, all launched early (PDL): what it adds to that chain can rank the shapes otherwise
  // than its time alone. Each row: the chain with the decode, less the chain without it.
  const bf16* x = RandBf16(kHidden, 1.0f);
  Weights wq = MakeWeights(q_dim, kHidden, true), wk = MakeWeights(kv_dim, kHidden, true),
          wv = MakeWeights(kv_dim, kHidden, true), wo = MakeWeights(kHidden, q_dim, true);
  bf16* yq = Alloc<bf16>(q_dim);
  bf16* yk = Alloc<bf16>(kv_dim);
  bf16* yv = Alloc<bf16>(kv_dim);
  bf16* yo = Alloc<bf16>(kHidden);
  int32_t* d_chain_pos = Alloc<int32_t>(1);
  // Caches rotate, 8 x 8.4 MB, more than L2 holds: in the model each layer's keys come from DRAM.
  std::vector<bf16*> chain_caches;
  for (int c = 0; c < 8; ++c) chain_caches.push_back(RandBf16(cache_elems, 1.0f));
  const TokenBatch chain_tokens{d_seq, d_chain_pos, 1};
  auto chain = [&](int i, const PagedAttentionPlan* shape) {
    const DeviceWeight* w[] = {&wq.at(i), &wk.at(i), &wv.at(i)};
    void* y[] = {yq, yk, yv};
    CK(LaunchGemvMulti(w, y, 3, x, 1, OutType::kBf16, s));
    if (shape != nullptr) {
      CK(LaunchPagedDecodeWithRope(yq, yk, yv, kv_dim, chain_tokens,
                                   layer(chain_caches[i % chain_caches.size()]), p, rope, *shape,
                                   ClusterWorkspace(), out_b, s));
    }
    CK(LaunchGemv(wo.at(i), out_b, q_dim, 1, yo, OutType::kBf16, kHidden, s));
  };
  for (int context : {128, 640, 4096}) {
    const int32_t chain_pos = context - 1;
    CK(cudaMemcpy(d_chain_pos, &chain_pos, sizeof(chain_pos), cudaMemcpyHostToDevice));
    // Measured again for each context, next to the rows it is taken from.
    const double without = TimeUs(s, 64, [&](int i) { chain(i, nullptr); });
    char base[96];
    std::snprintf(base, sizeof(base), "chain ctx %d: q/k/v GEMV + o GEMV, no decode", context);
    Row(base, without, 0.0);
    for (const auto& [cluster_blocks, heads] : kClusterShapes) {
      const PagedAttentionPlan shape = ClusterDecodePlan(p, cluster_blocks, heads);
      char name[96];
      std::snprintf(name, sizeof(name), "chain ctx %d: fused decode %dx%d adds%s", context,
                    cluster_blocks, heads, PlannedMark(plan, cluster_blocks, heads));
      Row(name, TimeUs(s, 64, [&](int i) { chain(i, &shape); }) - without, 0.0);  // a difference
    }
  }
}

// Batch-1 decode attention at long contexts (`kernel_bench attention`): the cluster shapes,
// including one query head a block, and the split kernel with 32 and 64 splits, over bf16 and
// FP8 caches (FP8 times only: its codes are random bytes).
void LongContextAttentionTimes(cudaStream_t s, int sm_count) {
  constexpr int kBlock = 32, kMaxContext = 16384, kLayers = 8;
  const int64_t kv_dim = kKvHeads * kHeadDim;
  const int blocks = kMaxContext / kBlock;
  const int32_t* d_table = Put(ScatteredTable(blocks));
  const std::vector<bf16*> caches = RandomCaches(kLayers, blocks, kBlock);
  const float* scales = Put(std::vector<float>(2 * kKvHeads, 0.01f));
  const bf16* q = RandBf16(kHeads * kHeadDim, 2.0f);
  bf16* out = Alloc<bf16>(kHeads * kHeadDim);
  const int32_t* d_seq = Put(std::vector<int32_t>{0});
  int32_t* d_pos = Alloc<int32_t>(1);
  const PagedAttentionParams p = DecodeParams(kMaxContext);
  const PagedAttentionPlan plan = PlanPagedAttention(1, p, sm_count);
  const TokenBatch tokens{d_seq, d_pos, 1};
  std::vector<PagedAttentionPlan> splits;
  for (int n : {32, 64}) {
    PagedAttentionPlan split;
    split.num_splits = n;
    split.split_len = kMaxContext / n;
    split.workspace_bytes = size_t{kHeads} * n * (kHeadDim * 4 + 8);
    splits.push_back(split);
  }
  uint8_t* ws = Alloc<uint8_t>(splits.back().workspace_bytes);
  constexpr std::pair<int, int> kShapes[] = {{16, 8}, {16, 4}, {16, 2}, {16, 1}, {8, 1}};
  for (bool fp8 : {false, true}) {
    auto layer = [&](int l) {
      PagedKvLayer kv = KvLayer(caches[l % kLayers], d_table, blocks, kBlock);
      kv.fp8 = fp8;
      kv.k_scale = scales;
      kv.v_scale = scales + kKvHeads;
      return kv;
    };
    for (int context : {2048, 8192, 16384}) {
      const int32_t pos = context - 1;
      CK(cudaMemcpy(d_pos, &pos, sizeof(pos), cudaMemcpyHostToDevice));
      const double bytes = 2.0 * context * kv_dim * (fp8 ? 1 : 2);
      char name[112];
      for (const PagedAttentionPlan& split : splits) {
        std::snprintf(name, sizeof(name), "long %s ctx %d: %d splits + merge", fp8 ? "fp8" : "bf16",
                      context, split.num_splits);
        Row(name,
            TimeUs(s, 64,
                   [&](int i) {
                     CK(LaunchPagedAttention(q, tokens, layer(i), p, split, ws, out, s));
                   }),
            bytes);
      }
      for (const auto& [cluster_blocks, heads] : kShapes) {
        for (int groups : {1, 8}) {
          const PagedAttentionPlan shaped = ClusterDecodePlan(p, cluster_blocks, heads, 1, groups);
          const bool planned = cluster_blocks == plan.num_splits && heads == plan.heads_per_block &&
                               groups == plan.groups;
          std::snprintf(name, sizeof(name), "long %s ctx %d: cluster %dx%d, %d groups%s",
                        fp8 ? "fp8" : "bf16", context, cluster_blocks, heads, groups,
                        planned ? " (planned)" : "");
          Row(name,
              TimeUs(s, 64,
                     [&](int i) {
                       CK(LaunchPagedAttention(q, tokens, layer(i), p, shaped, ClusterWorkspace(),
                                               out, s));
                     }),
              bytes);
        }
      }
    }
  }
}

// Compaction's cost (`kernel_bench attention`): moving blocks of a block-major bf16 cache of
// qwen3-30b-a3b's shape (48 layers, block 32: 3 MiB a block, every layer), `moves` at once.
void CompactionTimes(cudaStream_t s) {
  constexpr int kLayers = 48, kBlock = 32, kBlocks = 2048;
  const int64_t block_bytes = PagedKvBlockBytes(kBlock, kKvHeads * kHeadDim, false);
  uint8_t* data = Alloc<uint8_t>(size_t(block_bytes) * kLayers * kBlocks);
  for (int moves : {16, 256, 1024}) {
    std::vector<KvMoveBlock> host;
    for (int i = 0; i < moves; ++i) host.push_back({kBlocks - 1 - i, i, -1});
    const KvMoveBlock* d_moves = Put(host);
    char name[96];
    std::snprintf(name, sizeof(name), "kv compaction: %d blocks moved (%.0f MiB)", moves,
                  moves * double(block_bytes) * kLayers / (1 << 20));
    Row(name,
        TimeUs(s, 8,
               [&](int) { CK(LaunchKvCopyBlocks(data, block_bytes, kLayers, d_moves, moves, s)); }),
        2.0 * moves * block_bytes * kLayers);
  }
}

}  // namespace

// `kernel_bench experts`: the one-token expert rows only; `kernel_bench grouped`: the rows of
// several tokens' experts only; `kernel_bench attention`: the long-context decode attention rows
// only.
int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  ClusterWorkspace();  // allocated before any timing captures a graph
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const bool experts_only = argc > 1 && std::string_view(argv[1]) == "experts";
  if (argc > 1 && std::string_view(argv[1]) == "grouped") {  // several tokens' experts only
    MultiTokenExpertTimes(s, "qwen3", kExperts, kTopK, kHidden, kInter, false);
    MultiTokenExpertTimes(s, "qwen3", kExperts, kTopK, kHidden, kInter, true);
    MultiTokenExpertTimes(s, "mixtral", 8, 2, 4096, 14336, false);
    MultiTokenExpertTimes(s, "mixtral", 8, 2, 4096, 14336, true);
    std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "attention") {
    LongContextAttentionTimes(s, prop.multiProcessorCount);
    CompactionTimes(s);
    return failures ? 1 : 0;
  }
  if (!experts_only) GemvChecksAndTimes(s);
  ExpertChecksAndTimes(s, false);
  ExpertChecksAndTimes(s, true);
  if (!experts_only) {
    MultiTokenExpertTimes(s, "qwen3", kExperts, kTopK, kHidden, kInter, false);
    MultiTokenExpertTimes(s, "qwen3", kExperts, kTopK, kHidden, kInter, true);
    MultiTokenExpertTimes(s, "mixtral", 8, 2, 4096, 14336, false);
    AttentionChecksAndTimes(s, prop.multiProcessorCount);
    FusedDecodeChecksAndTimes(s, prop.multiProcessorCount);
  }
  std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
