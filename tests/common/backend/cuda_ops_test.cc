// The CUDA kernels against the CPU reference: embedding, RMSNorm, q/k norm + RoPE, paged KV
// append and paged attention. The linear, MoE and sampling kernels are in the sibling files of
// this test binary.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/rope.h"
#include "common/cuda/kernels/embedding_kernels.h"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/cuda/kernels/norm_kernels.h"
#include "common/cuda/kernels/paged_attention_kernels.h"
#include "common/cuda/kernels/paged_kv_kernels.h"
#include "common/cuda/kernels/rope_kernels.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

using gpu::bf16;

TEST_F(CudaOpsTest, EmbeddingGather) {
  const int64_t vocab = 1000;
  for (int64_t hidden : {64, 2048, 100}) {
    for (int64_t n : {1, 3, 17}) {
      const std::vector<uint16_t> table = RandomBf16(vocab * hidden);
      std::vector<int32_t> ids(n);
      for (int32_t& id : ids) id = RandomInt(0, vocab - 1);
      if (n == 17) {
        ids[5] = -1;  // out of range: zero rows
        ids[6] = vocab;
        ids[7] = ids[8];  // a repeated id
      }
      const uint16_t* d_table = Put(table);
      const int32_t* d_ids = Put(ids);
      uint16_t* d_out = Poisoned<uint16_t>(n * hidden);
      ASSERT_FALSE(HasFailure());
      LAUNCH_OK(gpu::LaunchEmbeddingGather(AsBf16(d_table), vocab, hidden, d_ids, n, AsBf16(d_out),
                                           stream()));
      std::vector<float> ref(n * hidden, 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        if (ids[t] < 0 || ids[t] >= vocab) continue;
        for (int64_t i = 0; i < hidden; ++i) ref[t * hidden + i] = F(table[ids[t] * hidden + i]);
      }
      ExpectClose("embedding", absl::StrCat("n=", n, " hidden=", hidden),
                  GetBf16(AsBf16(d_out), n * hidden), ref, 0.0);
    }
  }
}

// A decode step whose tokens are still on the device: negative ids take the fallback's.
TEST_F(CudaOpsTest, EmbeddingGatherFallsBackForNegativeIds) {
  const int64_t vocab = 1000, hidden = 2048, n = 5;
  const std::vector<uint16_t> table = RandomBf16(vocab * hidden);
  const std::vector<int32_t> ids = {7, -1, 3, -1, -1};
  const std::vector<int32_t> fallback = {900, 11, 500, 999, 0};
  const uint16_t* d_table = Put(table);
  const int32_t* d_ids = Put(ids);
  const int32_t* d_fallback = Put(fallback);
  uint16_t* d_out = Poisoned<uint16_t>(n * hidden);
  ASSERT_FALSE(HasFailure());
  LAUNCH_OK(gpu::LaunchEmbeddingGather(AsBf16(d_table), vocab, hidden, d_ids, n, AsBf16(d_out),
                                       stream(), d_fallback));
  std::vector<float> ref(n * hidden);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids[t] >= 0 ? ids[t] : fallback[t];
    for (int64_t i = 0; i < hidden; ++i) ref[t * hidden + i] = F(table[id * hidden + i]);
  }
  ExpectClose("embedding with fallback", "n=5", GetBf16(AsBf16(d_out), n * hidden), ref, 0.0);
}

TEST_F(CudaOpsTest, RmsNorm) {
  const float eps = 1e-6f;
  for (int64_t dim : {64, 2048, 100}) {
    for (int64_t n : {1, 3, 17}) {
      const std::vector<uint16_t> x = RandomBf16(n * dim, 2.0f);
      const std::vector<uint16_t> w = RandomBf16(dim, 1.5f);
      std::vector<float> xf = ToFloat(x), ref(n * dim);
      for (int64_t t = 0; t < n; ++t) {
        cpu::RmsNorm(xf.data() + t * dim, HostVector(w), dim, eps, ref.data() + t * dim);
      }
      const std::string shape = absl::StrCat("n=", n, " dim=", dim);
      uint16_t* d_x = Put(x);
      const uint16_t* d_w = Put(w);
      uint16_t* d_out = Poisoned<uint16_t>(n * dim);
      ASSERT_FALSE(HasFailure());
      LAUNCH_OK(gpu::LaunchRmsNorm(AsBf16(d_x), AsBf16(d_w), n, dim, eps, AsBf16(d_out), stream()));
      ExpectClose("rmsnorm", shape, GetBf16(AsBf16(d_out), n * dim), ref, 1e-2);
      LAUNCH_OK(gpu::LaunchRmsNorm(AsBf16(d_x), AsBf16(d_w), n, dim, eps, AsBf16(d_x), stream()));
      ExpectClose("rmsnorm in place", shape, GetBf16(AsBf16(d_x), n * dim), ref, 1e-2);
    }
  }
}

TEST_F(CudaOpsTest, AddRmsNorm) {
  const float eps = 1e-5f;
  for (int64_t dim : {64, 2048, 100}) {
    for (int64_t n : {1, 3, 17}) {
      const std::vector<uint16_t> residual = RandomBf16(n * dim, 3.0f);
      const std::vector<uint16_t> x = RandomBf16(n * dim, 1.0f);
      const std::vector<uint16_t> w = RandomBf16(dim, 1.5f);
      std::vector<float> sum(n * dim), ref(n * dim);
      for (int64_t i = 0; i < n * dim; ++i) sum[i] = F(Bf16(F(residual[i]) + F(x[i])));
      for (int64_t t = 0; t < n; ++t) {
        cpu::RmsNorm(sum.data() + t * dim, HostVector(w), dim, eps, ref.data() + t * dim);
      }
      uint16_t* d_res = Put(residual);
      const uint16_t* d_x = Put(x);
      const uint16_t* d_w = Put(w);
      uint16_t* d_out = Poisoned<uint16_t>(n * dim);
      ASSERT_FALSE(HasFailure());
      LAUNCH_OK(gpu::LaunchAddRmsNorm(AsBf16(d_res), AsBf16(d_x), AsBf16(d_w), n, dim, eps,
                                      AsBf16(d_out), stream()));
      const std::string shape = absl::StrCat("n=", n, " dim=", dim);
      ExpectClose("add+rmsnorm residual", shape, GetBf16(AsBf16(d_res), n * dim), sum, 0.0);
      ExpectClose("add+rmsnorm out", shape, GetBf16(AsBf16(d_out), n * dim), ref, 1e-2);
    }
  }
}

struct RopeCase {
  int64_t n;
  int heads, kv_heads, head_dim;
  bool qk_norm, yarn, fused_qkv;
  int rope_dim = 0;  // partial rotary (GLM-4.5); 0: the whole head
};

TEST_F(CudaOpsTest, QkNormRope) {
  const RopeCase cases[] = {
      {3, 4, 2, 64, true, false, false},
      {17, 8, 2, 128, false, true, true},
      {1, 32, 4, 128, true, false, true},
      {17, 8, 8, 64, true, true, false},
      {3, 4, 1, 256, false, false, false},
      // GLM-4.5's half-rotated heads, and the glm4_moe oracle's (a pair of 8 inside one lane).
      {17, 12, 2, 128, true, false, false, 64},
      {5, 4, 2, 32, true, false, true, 16},
      {3, 4, 2, 64, false, true, false, 48},
  };
  const float eps = 1e-6f;
  for (const RopeCase& c : cases) {
    RopeConfig rope;
    if (c.yarn) {  // gpt-oss's YaRN settings
      rope.type = RopeConfig::Type::kYarn;
      rope.theta = 150000.0;
      rope.factor = 32.0;
      rope.original_max_position_embeddings = 4096.0;
      rope.truncate = false;
    } else {
      rope.theta = 1000000.0;
    }
    const int rope_dim = c.rope_dim > 0 ? c.rope_dim : c.head_dim;
    const RopeTable table = BuildRopeTable(rope, rope_dim);
    const int64_t d = c.head_dim;
    const int64_t q_dim = c.heads * d, kv_dim = c.kv_heads * d;
    // Fused: one [n, q | k | v] buffer, as a fused qkv projection writes it.
    const int64_t row = c.fused_qkv ? q_dim + 2 * kv_dim : 0;
    const std::vector<uint16_t> q = RandomBf16(c.fused_qkv ? c.n * row : c.n * q_dim, 2.0f);
    const std::vector<uint16_t> k =
        c.fused_qkv ? std::vector<uint16_t>() : RandomBf16(c.n * kv_dim, 2.0f);
    const std::vector<uint16_t> q_norm = RandomBf16(d, 1.5f), k_norm = RandomBf16(d, 1.5f);
    std::vector<int32_t> pos(c.n);
    for (int32_t& p : pos) p = RandomInt(0, 8191);
    pos[0] = 100003;  // a long-context angle

    const int64_t q_stride = c.fused_qkv ? row : q_dim;
    const int64_t k_stride = c.fused_qkv ? row : kv_dim;
    auto q_at = [&](int64_t t, int64_t i) { return F(q[t * q_stride + i]); };
    auto k_at = [&](int64_t t, int64_t i) {
      return c.fused_qkv ? F(q[t * row + q_dim + i]) : F(k[t * kv_dim + i]);
    };
    std::vector<float> ref_q(c.n * q_dim), ref_k(c.n * kv_dim);
    for (int64_t t = 0; t < c.n; ++t) {
      for (int h = 0; h < c.heads + c.kv_heads; ++h) {
        const bool is_q = h < c.heads;
        float* x = is_q ? &ref_q[t * q_dim + h * d] : &ref_k[t * kv_dim + (h - c.heads) * d];
        for (int64_t i = 0; i < d; ++i) {
          x[i] = is_q ? q_at(t, h * d + i) : k_at(t, (h - c.heads) * d + i);
        }
        if (c.qk_norm) cpu::RmsNorm(x, HostVector(is_q ? q_norm : k_norm), d, eps, x);
        ApplyRope(table, pos[t], x, rope_dim);
      }
    }

    uint16_t* d_q = Put(q);
    uint16_t* d_k = c.fused_qkv ? d_q + q_dim : Put(k);
    const float* d_freq = Put(table.inv_freq);
    const int32_t* d_pos = Put(pos);
    const uint16_t* d_qn = Put(q_norm);
    const uint16_t* d_kn = Put(k_norm);
    ASSERT_FALSE(HasFailure());
    gpu::QkRopeParams params{.num_heads = c.heads,
                             .num_kv_heads = c.kv_heads,
                             .head_dim = c.head_dim,
                             .rope_dim = c.rope_dim,
                             .q_stride = q_stride,
                             .k_stride = k_stride,
                             .inv_freq = d_freq,
                             .attention_scaling = table.attention_scaling,
                             .q_norm = c.qk_norm ? AsBf16(d_qn) : nullptr,
                             .k_norm = c.qk_norm ? AsBf16(d_kn) : nullptr,
                             .eps = eps};
    LAUNCH_OK(gpu::LaunchQkNormRope(AsBf16(d_q), AsBf16(d_k), c.n, d_pos, params, stream()));
    const std::vector<float> got_q = GetBf16(AsBf16(d_q), q.size());
    const std::vector<float> got_k =
        c.fused_qkv ? std::vector<float>() : GetBf16(AsBf16(d_k), k.size());
    std::vector<float> out_q(c.n * q_dim), out_k(c.n * kv_dim), v_got, v_ref;
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t i = 0; i < q_dim; ++i) out_q[t * q_dim + i] = got_q[t * q_stride + i];
      for (int64_t i = 0; i < kv_dim; ++i) {
        out_k[t * kv_dim + i] = c.fused_qkv ? got_q[t * row + q_dim + i] : got_k[t * kv_dim + i];
      }
      if (c.fused_qkv) {  // v must be untouched
        for (int64_t i = 0; i < kv_dim; ++i) {
          v_got.push_back(got_q[t * row + q_dim + kv_dim + i]);
          v_ref.push_back(F(q[t * row + q_dim + kv_dim + i]));
        }
      }
    }
    const std::string shape =
        absl::StrCat("n=", c.n, " h=", c.heads, "/", c.kv_heads, " d=", d, c.qk_norm ? " norm" : "",
                     c.yarn ? " yarn" : "", c.fused_qkv ? " fused" : "",
                     c.rope_dim > 0 ? absl::StrCat(" rope ", c.rope_dim) : "");
    ExpectClose("qk norm+rope q", shape, out_q, ref_q, 1e-2);
    ExpectClose("qk norm+rope k", shape, out_k, ref_k, 1e-2);
    if (c.fused_qkv) ExpectClose("qk norm+rope v untouched", shape, v_got, v_ref, 0.0);
  }
}

// A cache of one layer on the device with random block tables for `contexts.size()` sequences.
struct TestCache {
  int block_size = 0, kv_heads = 0, head_dim = 0, max_blocks = 0, num_blocks = 0;
  std::vector<int32_t> tables;  // [num_seqs][max_blocks]
  uint16_t* data = nullptr;
  int32_t* d_tables = nullptr;

  int64_t kv_dim() const { return int64_t{kv_heads} * head_dim; }
  gpu::PagedKvLayer Layer() const {
    return gpu::PagedKvLayer{.data = reinterpret_cast<gpu::bf16*>(data),
                             .block_tables = d_tables,
                             .max_blocks_per_seq = max_blocks,
                             .block_size = block_size,
                             .num_kv_heads = kv_heads,
                             .head_dim = head_dim};
  }
  // Element offset of (seq, pos)'s key (kv = 0) or value (kv = 1) row.
  int64_t Offset(int seq, int64_t pos, int kv) const {
    return gpu::PagedKvOffset(tables[seq * max_blocks + pos / block_size], kv, pos % block_size,
                              block_size, kv_dim());
  }
  // The key and value rows of each (seq[t], pos[t]) in a host copy of the cache, as float, t by
  // t; the copy's rows are zeroed, so what remains can be compared whole.
  std::vector<float> TakeRows(std::vector<uint16_t>& host, const std::vector<int32_t>& seq,
                              const std::vector<int32_t>& pos) const {
    std::vector<float> rows;
    for (size_t t = 0; t < seq.size(); ++t) {
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t off = Offset(seq[t], pos[t], kv);
        for (int64_t i = 0; i < kv_dim(); ++i) {
          rows.push_back(F(host[off + i]));
          host[off + i] = 0;
        }
      }
    }
    return rows;
  }
};

class PagedCacheTest : public CudaOpsTest {
 protected:
  // Attention over q and output rows of heads x head_dim, the default score scale.
  static gpu::PagedAttentionParams AttentionParams(int heads, int kv_heads, int head_dim,
                                                   int window, const float* sinks,
                                                   int max_context) {
    const int64_t q_dim = int64_t{heads} * head_dim;
    return gpu::PagedAttentionParams{.num_heads = heads,
                                     .num_kv_heads = kv_heads,
                                     .head_dim = head_dim,
                                     .q_stride = q_dim,
                                     .out_stride = q_dim,
                                     .sliding_window = window,
                                     .sinks = sinks,
                                     .scale = 0.0f,
                                     .max_context = max_context};
  }

  // A decode step's q/k norm and rotary parameters (theta 1e6, random norm weights) on the
  // device, for q and k rows of all heads.
  gpu::QkRopeParams DecodeRope(int heads, int kv_heads, int head_dim) {
    RopeConfig rope_config;
    rope_config.theta = 1000000.0;
    const RopeTable table = BuildRopeTable(rope_config, head_dim);
    return gpu::QkRopeParams{.num_heads = heads,
                             .num_kv_heads = kv_heads,
                             .head_dim = head_dim,
                             .q_stride = int64_t{heads} * head_dim,
                             .k_stride = int64_t{kv_heads} * head_dim,
                             .inv_freq = Put(table.inv_freq),
                             .attention_scaling = table.attention_scaling,
                             .q_norm = AsBf16(Put(RandomBf16(head_dim, 1.5f))),
                             .k_norm = AsBf16(Put(RandomBf16(head_dim, 1.5f))),
                             .eps = 1e-6f};
  }

  // A decode step of one token a sequence: sequence t at position contexts[t] - 1.
  static void DecodeTokens(const std::vector<int64_t>& contexts, std::vector<int32_t>& seq,
                           std::vector<int32_t>& pos) {
    seq.resize(contexts.size());
    pos.resize(contexts.size());
    for (size_t t = 0; t < contexts.size(); ++t) {
      seq[t] = static_cast<int32_t>(t);
      pos[t] = static_cast<int32_t>(contexts[t] - 1);
    }
  }

  // Blocks for each context, shuffled so sequences interleave in the pool; one spare block.
  TestCache MakeCache(int block_size, int kv_heads, int head_dim,
                      const std::vector<int64_t>& contexts) {
    TestCache cache;
    cache.block_size = block_size;
    cache.kv_heads = kv_heads;
    cache.head_dim = head_dim;
    for (int64_t len : contexts) {
      cache.max_blocks = std::max<int>(cache.max_blocks, (len + block_size - 1) / block_size);
      cache.num_blocks += (len + block_size - 1) / block_size;
    }
    cache.num_blocks += 1;
    std::vector<int32_t> pool(cache.num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng());
    cache.tables.assign(contexts.size() * cache.max_blocks, -1);
    size_t next = 0;
    for (size_t s = 0; s < contexts.size(); ++s) {
      for (int b = 0; b < (contexts[s] + block_size - 1) / block_size; ++b) {
        cache.tables[s * cache.max_blocks + b] = pool[next++];
      }
    }
    cache.data = Poisoned<uint16_t>(int64_t{cache.num_blocks} * 2 * block_size * cache.kv_dim());
    cache.d_tables = Put(cache.tables);
    return cache;
  }
};

TEST_F(PagedCacheTest, KvAppend) {
  for (int block_size : {16, 32}) {
    for (int head_dim : {64, 128}) {
      const int kv_heads = 2;
      const std::vector<int64_t> contexts = {40, 1, 70};
      TestCache cache = MakeCache(block_size, kv_heads, head_dim, contexts);
      const int64_t kv_dim = cache.kv_dim();
      // 17 distinct (seq, pos) pairs; k and v read from a wider (qkv-like) row.
      std::vector<std::pair<int, int>> slots;
      for (size_t s = 0; s < contexts.size(); ++s) {
        for (int p = 0; p < contexts[s]; ++p) slots.emplace_back(static_cast<int>(s), p);
      }
      std::shuffle(slots.begin(), slots.end(), rng());
      slots.resize(17);
      const int64_t n = 17, stride = 3 * kv_dim;
      const std::vector<uint16_t> rows = RandomBf16(n * stride);
      std::vector<int32_t> seq(n), pos(n);
      for (int64_t t = 0; t < n; ++t) std::tie(seq[t], pos[t]) = slots[t];
      const uint16_t* d_rows = Put(rows);
      const int32_t* d_seq = Put(seq);
      const int32_t* d_pos = Put(pos);
      ASSERT_FALSE(HasFailure());
      const gpu::TokenBatch tokens{.seq = d_seq, .pos = d_pos, .n = n};
      LAUNCH_OK(gpu::LaunchPagedKvAppend(AsBf16(d_rows), stride, AsBf16(d_rows + kv_dim), stride,
                                         tokens, cache.Layer(), stream()));
      std::vector<uint16_t> got =
          Get(cache.data, int64_t{cache.num_blocks} * 2 * block_size * kv_dim);
      const std::vector<float> out = cache.TakeRows(got, seq, pos);
      std::vector<float> ref;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < 2 * kv_dim; ++i) ref.push_back(F(rows[t * stride + i]));
      }
      ExpectClose("paged kv append",
                  absl::StrCat("n=17 bs=", block_size, " kv=", kv_heads, "x", head_dim), out, ref,
                  0.0);
    }
  }
}

// Float64 attention of query rows q ([n][heads * d]) at (seq[t], pos[t]) over keys[s] and
// values[s] ([position][kv_heads * d] floats), causal, with the window and sinks if given.
std::vector<double> ReferenceAttention(const std::vector<uint16_t>& q,
                                       const std::vector<std::vector<float>>& keys,
                                       const std::vector<std::vector<float>>& values,
                                       const std::vector<int32_t>& seq,
                                       const std::vector<int32_t>& pos, int heads, int kv_heads,
                                       int d, int window, const std::vector<float>* sinks) {
  const int64_t n = static_cast<int64_t>(seq.size());
  const int64_t q_dim = int64_t{heads} * d, kv_dim = int64_t{kv_heads} * d;
  const int group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> ref(n * q_dim);
  std::vector<double> qrow(d), scores;
  for (int64_t t = 0; t < n; ++t) {
    const int s = seq[t];
    const int64_t first = window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
    for (int h = 0; h < heads; ++h) {
      const int64_t koff = int64_t{h / group} * d;
      for (int64_t i = 0; i < d; ++i) qrow[i] = F(q[t * q_dim + h * d + i]);
      scores.clear();
      double mx = sinks != nullptr ? (*sinks)[h] : -INFINITY;
      for (int64_t j = first; j <= pos[t]; ++j) {
        const float* key = &keys[s][j * kv_dim + koff];
        double dot = 0.0;
        for (int64_t i = 0; i < d; ++i) dot += qrow[i] * key[i];
        scores.push_back(dot * scale);
        mx = std::max(mx, scores.back());
      }
      double denom = sinks != nullptr ? std::exp((*sinks)[h] - mx) : 0.0;
      for (double& sc : scores) denom += (sc = std::exp(sc - mx));
      double* out = &ref[t * q_dim + h * d];
      for (int64_t j = first; j <= pos[t]; ++j) {
        const double p = scores[j - first] / denom;
        const float* value = &values[s][j * kv_dim + koff];
        for (int64_t i = 0; i < d; ++i) out[i] += p * value[i];
      }
    }
  }
  return ref;
}

struct AttentionCase {
  int head_dim, block_size, heads, kv_heads, window;
  bool sinks;
  std::vector<int64_t> contexts;
  int prefill;  // queries per sequence: the last `prefill` positions (1 = decode)
};

TEST_F(PagedCacheTest, PagedAttention) {
  const AttentionCase cases[] = {
      {128, 16, 32, 4, 0, false, {1, 33, 700}, 1},   // Qwen3 decode, split-K
      {128, 32, 32, 4, 0, false, {1, 33, 700}, 40},  // chunked prefill
      {64, 16, 64, 8, 128, true, {1, 33, 700}, 1},   // gpt-oss: window + sinks
      {64, 32, 64, 8, 128, true, {33, 700}, 40},
      {64, 32, 16, 16, 0, true, {33, 700}, 1},         // no GQA
      {128, 16, 32, 2, 0, false, {700}, 3},            // group 16: two head chunks
      {256, 16, 8, 2, 0, false, {33}, 33},             // head_dim 256, full prefill
      {128, 16, 28, 4, 0, false, {33, 700}, 1},        // group 7: uneven head chunks (4 + 3, ...)
      {128, 16, 32, 4, 0, false, {1, 1100, 5000}, 1},  // long decode: keys over cluster groups
      {64, 32, 64, 8, 0, true, {3000}, 1},             // groups with sinks
      // Tensor-core prefill: long prompts, tiles spanning sequences, windows at length.
      {128, 16, 28, 4, 0, false, {33, 700}, 50},       // group 7: 9 tokens a tile, 63 rows
      {64, 16, 8, 1, 0, false, {2048}, 2048},          // a whole 2k prompt
      {128, 32, 8, 1, 0, false, {32768}, 24},          // the last queries of 32k keys
      {64, 32, 16, 2, 128, true, {3000, 5, 77}, 300},  // window + sinks, three sequences
      {128, 16, 64, 1, 0, false, {150, 90}, 90},       // group 64: one token a tile
  };
  for (const AttentionCase& c : cases) {
    TestCache cache = MakeCache(c.block_size, c.kv_heads, c.head_dim, c.contexts);
    const int64_t kv_dim = cache.kv_dim();
    const int64_t d = c.head_dim;
    const int num_seqs = static_cast<int>(c.contexts.size());

    // Every position's key and value, appended through the kernel.
    std::vector<std::vector<float>> keys(num_seqs), values(num_seqs);
    std::vector<int32_t> all_seq, all_pos;
    std::vector<uint16_t> k_rows, v_rows;
    for (int s = 0; s < num_seqs; ++s) {
      const std::vector<uint16_t> k_bits = RandomBf16(c.contexts[s] * kv_dim);
      const std::vector<uint16_t> v_bits = RandomBf16(c.contexts[s] * kv_dim);
      keys[s] = ToFloat(k_bits);
      values[s] = ToFloat(v_bits);
      k_rows.insert(k_rows.end(), k_bits.begin(), k_bits.end());
      v_rows.insert(v_rows.end(), v_bits.begin(), v_bits.end());
      for (int64_t p = 0; p < c.contexts[s]; ++p) {
        all_seq.push_back(s);
        all_pos.push_back(static_cast<int32_t>(p));
      }
    }
    const uint16_t* d_k = Put(k_rows);
    const uint16_t* d_v = Put(v_rows);
    const int32_t* d_all_seq = Put(all_seq);
    const int32_t* d_all_pos = Put(all_pos);
    ASSERT_FALSE(HasFailure());
    LAUNCH_OK(gpu::LaunchPagedKvAppend(
        AsBf16(d_k), kv_dim, AsBf16(d_v), kv_dim,
        gpu::TokenBatch{.seq = d_all_seq, .pos = d_all_pos, .n = int64_t(all_seq.size())},
        cache.Layer(), stream()));

    // Queries: the last `prefill` positions of every sequence.
    std::vector<int32_t> seq, pos;
    for (int s = 0; s < num_seqs; ++s) {
      for (int64_t p = std::max<int64_t>(0, c.contexts[s] - c.prefill); p < c.contexts[s]; ++p) {
        seq.push_back(s);
        pos.push_back(static_cast<int32_t>(p));
      }
    }
    const int64_t n = static_cast<int64_t>(seq.size());
    const int64_t q_dim = int64_t{c.heads} * d;
    const std::vector<uint16_t> q = RandomBf16(n * q_dim, 4.0f);  // scores of a few units
    std::vector<float> sinks(c.heads);
    for (float& s : sinks) s = RandomFloats(1, 2.0f)[0] + 1.0f;
    const std::vector<double> ref =
        ReferenceAttention(q, keys, values, seq, pos, c.heads, c.kv_heads, c.head_dim, c.window,
                           c.sinks ? &sinks : nullptr);

    const uint16_t* d_q = Put(q);
    const int32_t* d_seq = Put(seq);
    const int32_t* d_pos = Put(pos);
    const float* d_sinks = Put(sinks);
    ASSERT_FALSE(HasFailure());
    gpu::PagedAttentionParams params =
        AttentionParams(c.heads, c.kv_heads, c.head_dim, c.window, c.sinks ? d_sinks : nullptr,
                        *std::max_element(pos.begin(), pos.end()) + 1);
    params.max_queries_per_seq = c.prefill;
    // The device's own plan (split-K when the batch is small), a forced single split and, where
    // the decode kernel takes the head size, its other cluster shapes.
    std::vector<gpu::PagedAttentionPlan> plans = {
        gpu::PlanPagedAttention(n, params, context().num_sms()),
        gpu::PlanPagedAttention(n, params, 1)};
    if (d <= 128) {
      // {blocks a cluster, heads a block, clusters a token's keys at most}
      const std::tuple<int, int, int> shapes[] = {{8, 8, 1},  {16, 4, 1}, {8, 2, 1},
                                                  {16, 1, 1}, {8, 4, 8},  {16, 2, 3}};
      for (const auto& [blocks, heads, groups] : shapes) {
        if (blocks > gpu::MaxDecodeClusterBlocks()) continue;
        plans.push_back(gpu::ClusterDecodePlan(params, blocks, heads, n, groups));
        ASSERT_TRUE(plans.back().cluster);
      }
      // The tensor-core kernel on every case, decode steps too (a tile of many sequences).
      plans.push_back(gpu::PrefillPlan(params));
      ASSERT_TRUE(plans.back().tensor_cores);
    }
    for (const gpu::PagedAttentionPlan& plan : plans) {
      // Cluster plans split over groups need their workspace zeroed (and leave it so: launched
      // twice here); the split kernel's may hold anything.
      uint8_t* ws = plan.cluster
                        ? Put(std::vector<uint8_t>(std::max<size_t>(plan.workspace_bytes, 1), 0))
                        : Poisoned<uint8_t>(std::max<size_t>(plan.workspace_bytes, 1));
      uint16_t* d_out = Poisoned<uint16_t>(n * q_dim);
      ASSERT_FALSE(HasFailure());
      for (int launch = 0; launch < (plan.groups > 1 ? 2 : 1); ++launch) {
        LAUNCH_OK(gpu::LaunchPagedAttention(
            AsBf16(d_q), gpu::TokenBatch{.seq = d_seq, .pos = d_pos, .n = n}, cache.Layer(), params,
            plan, ws, AsBf16(d_out), stream()));
      }
      std::string contexts;
      for (int64_t len : c.contexts) absl::StrAppend(&contexts, contexts.empty() ? "" : ",", len);
      ExpectClose(
          "paged attention",
          absl::StrCat("d=", d, " bs=", c.block_size, " h=", c.heads, "/", c.kv_heads,
                       " ctx=", contexts, " n=", n, c.window ? " win" : "", c.sinks ? " sink" : "",
                       " splits=", plan.num_splits, plan.tensor_cores ? " tensor cores" : "",
                       plan.cluster ? " cluster, heads " : "", plan.heads_per_block, " groups ",
                       plan.groups),
          GetBf16(AsBf16(d_out), n * q_dim), ref, 1e-2);
    }
  }
}

// Prefill over an FP8 cache: the tensor-core kernel and the split kernel scale the same codes
// into bf16 on their way in; both against the float64 attention over the decoded codes.
TEST_F(PagedCacheTest, PrefillOverFp8Codes) {
  const int heads = 16, kv_heads = 2, d = 128, block_size = 16, prefill = 100;
  const std::vector<int64_t> contexts = {900, 40};
  TestCache cache = MakeCache(block_size, kv_heads, d, contexts);
  const int64_t kv_dim = cache.kv_dim();
  // Codes with the top exponent bit clear: magnitudes below 2, never NaN.
  std::vector<uint8_t> codes(int64_t{cache.num_blocks} * 2 * block_size * kv_dim);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(RandomInt(0, 255) & 0xbf);
  const std::vector<float> scales = {0.9f, 0.6f, 1.3f, 0.7f};  // k per head, then v
  std::vector<std::vector<float>> keys(contexts.size()), values(contexts.size());
  for (size_t s = 0; s < contexts.size(); ++s) {
    for (int64_t j = 0; j < contexts[s]; ++j) {
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t off = cache.Offset(static_cast<int>(s), j, kv);  // bytes in an FP8 cache
        for (int64_t i = 0; i < kv_dim; ++i) {
          const float x = Fp8E4M3ToFloat(codes[off + i]) * scales[kv * kv_heads + i / d];
          (kv == 0 ? keys : values)[s].push_back(x);
        }
      }
    }
  }
  std::vector<int32_t> seq, pos;
  for (size_t s = 0; s < contexts.size(); ++s) {
    for (int64_t p = std::max<int64_t>(0, contexts[s] - prefill); p < contexts[s]; ++p) {
      seq.push_back(static_cast<int32_t>(s));
      pos.push_back(static_cast<int32_t>(p));
    }
  }
  const int64_t n = static_cast<int64_t>(seq.size());
  const std::vector<uint16_t> q = RandomBf16(n * heads * d, 2.0f);
  const std::vector<double> ref =
      ReferenceAttention(q, keys, values, seq, pos, heads, kv_heads, d, 0, nullptr);

  gpu::PagedKvLayer layer = cache.Layer();
  layer.data = reinterpret_cast<bf16*>(Put(codes));
  layer.fp8 = true;
  layer.k_scale = Put(scales);
  layer.v_scale = layer.k_scale + kv_heads;
  const uint16_t* d_q = Put(q);
  const int32_t* d_seq = Put(seq);
  const int32_t* d_pos = Put(pos);
  ASSERT_FALSE(HasFailure());
  gpu::PagedAttentionParams params =
      AttentionParams(heads, kv_heads, d, 0, nullptr, static_cast<int>(contexts[0]));
  params.max_queries_per_seq = prefill;
  const gpu::PagedAttentionPlan tensor_cores = gpu::PlanPagedAttention(n, params, 132);
  ASSERT_TRUE(tensor_cores.tensor_cores);
  for (const gpu::PagedAttentionPlan& plan :
       {tensor_cores, gpu::PagedAttentionPlan{.split_len = 900}}) {
    uint16_t* d_out = Poisoned<uint16_t>(n * heads * d);
    ASSERT_FALSE(HasFailure());
    LAUNCH_OK(gpu::LaunchPagedAttention(AsBf16(d_q),
                                        gpu::TokenBatch{.seq = d_seq, .pos = d_pos, .n = n}, layer,
                                        params, plan, nullptr, AsBf16(d_out), stream()));
    ExpectClose("paged attention, fp8 cache",
                plan.tensor_cores ? "prefill 100+40 tensor cores" : "prefill 100+40 one split",
                GetBf16(AsBf16(d_out), n * heads * d), ref, 1e-2);
  }
}

// The decode step's fused kernel (q/k norm + rope, the key and value appended, attention in
// clusters) against the three launches it replaces, on copies of one cache: the same output
// and the same cache after. Several sequences of different lengths, so the blocks' shares,
// the owner of each token's own key and the first tile it loads early all differ.
TEST_F(PagedCacheTest, FusedDecodeMatchesRopeAppendAttention) {
  struct FusedCase {
    int head_dim, block_size, heads, kv_heads, window;
    bool sinks;
  };
  const FusedCase cases[] = {{128, 16, 32, 4, 0, false}, {64, 32, 64, 8, 128, true}};
  // Each sequence's new position + 1; 9000 keys give a block a share of over 64 cache blocks,
  // whose table it reads per key instead of from shared memory.
  const std::vector<int64_t> contexts = {1, 9, 200, 700, 9000};
  for (const FusedCase& c : cases) {
    TestCache a = MakeCache(c.block_size, c.kv_heads, c.head_dim, contexts);
    const int64_t kv_dim = a.kv_dim(), d = c.head_dim, q_dim = int64_t{c.heads} * d;
    const int64_t cache_elems = int64_t{a.num_blocks} * 2 * c.block_size * kv_dim;
    // Older keys and values: random everywhere; the second cache starts as a copy.
    const std::vector<uint16_t> old = RandomBf16(cache_elems);
    const int64_t n = static_cast<int64_t>(contexts.size());
    std::vector<int32_t> seq, pos;
    DecodeTokens(contexts, seq, pos);
    const std::vector<uint16_t> q = RandomBf16(n * q_dim, 2.0f), k = RandomBf16(n * kv_dim, 2.0f),
                                v = RandomBf16(n * kv_dim);
    std::vector<float> sinks(c.heads);
    for (float& s : sinks) s = RandomFloats(1, 2.0f)[0] + 1.0f;
    const uint16_t* d_q = Put(q);
    const uint16_t* d_k = Put(k);
    const uint16_t* d_v = Put(v);
    uint16_t* d_q_rot = Put(q);
    uint16_t* d_k_rot = Put(k);
    const int32_t* d_seq = Put(seq);
    const int32_t* d_pos = Put(pos);
    const float* d_sinks = Put(sinks);
    const gpu::QkRopeParams rope = DecodeRope(c.heads, c.kv_heads, c.head_dim);
    // Planned for a graph's context, not the step's.
    const gpu::PagedAttentionParams params = AttentionParams(
        c.heads, c.kv_heads, c.head_dim, c.window, c.sinks ? d_sinks : nullptr, 16384);
    const gpu::PagedAttentionPlan device_plan =
        gpu::PlanPagedAttention(n, params, context().num_sms());
    ASSERT_TRUE(device_plan.cluster);
    // The device's cluster shape and others: which cluster owns a token's own key, and how many
    // clusters write it, differ.
    const int large = gpu::MaxDecodeClusterBlocks();
    for (const gpu::PagedAttentionPlan& plan :
         {device_plan, gpu::ClusterDecodePlan(params, large, 2),
          gpu::ClusterDecodePlan(params, large, 8), gpu::ClusterDecodePlan(params, 8, 4),
          gpu::ClusterDecodePlan(params, 8, 4, n, 3)}) {
      ASSERT_TRUE(plan.cluster);
      uint8_t* ws = Put(std::vector<uint8_t>(std::max<size_t>(plan.workspace_bytes, 1), 0));
      TestCache b = a;
      b.data = Put(old);
      CUDA_ASSERT_OK(cudaMemcpy(a.data, old.data(), old.size() * 2, cudaMemcpyHostToDevice));
      CUDA_ASSERT_OK(cudaMemcpy(d_q_rot, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
      CUDA_ASSERT_OK(cudaMemcpy(d_k_rot, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
      CUDA_ASSERT_OK(cudaDeviceSynchronize());  // plain copies: the legacy stream
      uint16_t* d_out_a = Poisoned<uint16_t>(n * q_dim);
      uint16_t* d_out_b = Poisoned<uint16_t>(n * q_dim);
      ASSERT_FALSE(HasFailure());
      const gpu::TokenBatch tokens{.seq = d_seq, .pos = d_pos, .n = n};
      LAUNCH_OK(gpu::LaunchQkNormRope(AsBf16(d_q_rot), AsBf16(d_k_rot), n, d_pos, rope, stream()));
      LAUNCH_OK(gpu::LaunchPagedKvAppend(AsBf16(d_k_rot), kv_dim, AsBf16(d_v), kv_dim, tokens,
                                         a.Layer(), stream()));
      LAUNCH_OK(gpu::LaunchPagedAttention(AsBf16(d_q_rot), tokens, a.Layer(), params, plan, ws,
                                          AsBf16(d_out_a), stream()));
      LAUNCH_OK(gpu::LaunchPagedDecodeWithRope(AsBf16(d_q), AsBf16(d_k), AsBf16(d_v), kv_dim,
                                               tokens, b.Layer(), params, rope, plan, ws,
                                               AsBf16(d_out_b), stream()));
      const std::string shape = absl::StrCat(
          "d=", d, " h=", c.heads, "/", c.kv_heads, c.window ? " win" : "", c.sinks ? " sink" : "",
          " blocks ", plan.num_splits, " heads ", plan.heads_per_block, " groups ", plan.groups);
      // Two kernels may contract the rotation into FMAs differently: bf16 rounding flips only.
      ExpectClose("fused decode vs rope+append+attention", shape,
                  GetBf16(AsBf16(d_out_b), n * q_dim), GetBf16(AsBf16(d_out_a), n * q_dim), 1e-3);
      // The appended rows (rotation rounding as above), then every other element untouched.
      std::vector<uint16_t> got = Get(b.data, cache_elems), want = Get(a.data, cache_elems);
      const std::vector<float> got_rows = a.TakeRows(got, seq, pos);
      const std::vector<float> want_rows = a.TakeRows(want, seq, pos);
      ExpectClose("fused decode: appended key and value", shape, got_rows, want_rows, 1e-3);
      EXPECT_EQ(got, want) << "fused decode wrote outside the appended rows, " << shape;
    }
  }
}

// The fused decode reads q, k and v only after its PDL wait: here they come from a kernel
// launched just before it (a GEMV that takes a few hundred microseconds: one-hot rows over a
// 65536-wide input, so it copies the values exactly), whose output buffers start as NaN. A read
// ahead of the wait would see NaN; the output and the cache must equal the decode's on the same
// values from host copies.
TEST_F(PagedCacheTest, FusedDecodeWaitsForTheKernelThatWritesQkv) {
  const int head_dim = 128, block_size = 16, heads = 32, kv_heads = 4;
  const std::vector<int64_t> contexts = {700, 33};
  TestCache a = MakeCache(block_size, kv_heads, head_dim, contexts);
  const int64_t kv_dim = a.kv_dim(), q_dim = int64_t{heads} * head_dim;
  const int64_t cache_elems = int64_t{a.num_blocks} * 2 * block_size * kv_dim;
  const std::vector<uint16_t> old = RandomBf16(cache_elems);
  CUDA_ASSERT_OK(cudaMemcpy(a.data, old.data(), old.size() * 2, cudaMemcpyHostToDevice));
  TestCache b = a;
  b.data = Put(old);
  const int64_t n = static_cast<int64_t>(contexts.size());
  std::vector<int32_t> seq, pos;
  DecodeTokens(contexts, seq, pos);
  const std::vector<uint16_t> q = RandomBf16(n * q_dim, 2.0f), k = RandomBf16(n * kv_dim, 2.0f),
                              v = RandomBf16(n * kv_dim);
  const gpu::QkRopeParams rope = DecodeRope(heads, kv_heads, head_dim);
  const gpu::PagedAttentionParams params =
      AttentionParams(heads, kv_heads, head_dim, 0, nullptr, 4096);
  const gpu::PagedAttentionPlan plan = gpu::PlanPagedAttention(n, params, context().num_sms());
  ASSERT_TRUE(plan.cluster);
  const int32_t* d_seq = Put(seq);
  const int32_t* d_pos = Put(pos);
  const gpu::TokenBatch tokens{.seq = d_seq, .pos = d_pos, .n = n};

  // The producer: x[t] = (q[t], k[t], v[t], zeros); each output row r of q, k, v picks one
  // element of x with a weight of 1.
  constexpr int64_t in = int64_t{1} << 16;
  std::vector<uint16_t> x(n * in, 0);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(q.begin() + t * q_dim, q_dim, x.begin() + t * in);
    std::copy_n(k.begin() + t * kv_dim, kv_dim, x.begin() + t * in + q_dim);
    std::copy_n(v.begin() + t * kv_dim, kv_dim, x.begin() + t * in + q_dim + kv_dim);
  }
  const uint16_t* d_x = Put(x);
  auto one_hot = [&](int64_t out, int64_t first_column) {
    uint16_t* w = Poisoned<uint16_t>(out * in);
    if (w == nullptr) return w;
    EXPECT_EQ(cudaMemset(w, 0, out * in * 2), cudaSuccess);
    const std::vector<uint16_t> ones(out, Bf16(1.0f));
    // Row r's element first_column + r: one element every in + 1.
    EXPECT_EQ(cudaMemcpy2D(w + first_column, (in + 1) * 2, ones.data(), 2, 2, out,
                           cudaMemcpyHostToDevice),
              cudaSuccess);
    return w;
  };
  const uint16_t* wq = one_hot(q_dim, 0);
  const uint16_t* wk = one_hot(kv_dim, q_dim);
  const uint16_t* wv = one_hot(kv_dim, q_dim + kv_dim);
  uint16_t* yq = Poisoned<uint16_t>(n * q_dim);
  uint16_t* yk = Poisoned<uint16_t>(n * kv_dim);
  uint16_t* yv = Poisoned<uint16_t>(n * kv_dim);
  uint16_t* d_out_a = Poisoned<uint16_t>(n * q_dim);
  uint16_t* d_out_b = Poisoned<uint16_t>(n * q_dim);
  // The plain copies above run on the legacy stream: all of them land before the launches.
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  ASSERT_FALSE(HasFailure());
  auto weight = [&](const uint16_t* w, int64_t out) {
    return gpu::DeviceWeight{.data = w, .format = gpu::WeightFormat::kBf16, .out = out, .in = in};
  };
  const gpu::DeviceWeight w_q = weight(wq, q_dim), w_k = weight(wk, kv_dim),
                          w_v = weight(wv, kv_dim);

  // The reference: the same decode on host copies of q, k and v.
  uint8_t* ws = Put(std::vector<uint8_t>(std::max<size_t>(plan.workspace_bytes, 1), 0));
  LAUNCH_OK(gpu::LaunchPagedDecodeWithRope(AsBf16(Put(q)), AsBf16(Put(k)), AsBf16(Put(v)), kv_dim,
                                           tokens, a.Layer(), params, rope, plan, ws,
                                           AsBf16(d_out_a), stream()));
  // The producer and the decode back to back, the decode free to launch early.
  const gpu::DeviceWeight* w[] = {&w_q, &w_k, &w_v};
  void* y[] = {yq, yk, yv};
  CUDA_ASSERT_OK(gpu::LaunchGemvMulti(w, y, 3, AsBf16(d_x), n, gpu::OutType::kBf16, stream()));
  LAUNCH_OK(gpu::LaunchPagedDecodeWithRope(AsBf16(yq), AsBf16(yk), AsBf16(yv), kv_dim, tokens,
                                           b.Layer(), params, rope, plan, ws, AsBf16(d_out_b),
                                           stream()));
  EXPECT_EQ(Get(yq, n * q_dim), q) << "the producer copies q exactly";
  EXPECT_EQ(Get(yk, n * kv_dim), k) << "the producer copies k exactly";
  EXPECT_EQ(Get(yv, n * kv_dim), v) << "the producer copies v exactly";
  EXPECT_EQ(Get(d_out_b, n * q_dim), Get(d_out_a, n * q_dim));
  EXPECT_EQ(Get(b.data, cache_elems), Get(a.data, cache_elems));
}

}  // namespace
}  // namespace strata::testing_cuda
