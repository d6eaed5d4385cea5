// The latent attention kernels (latent_attention_kernels.h) against a float32 reference of the
// absorbed multi-head latent attention: a step's cache rows appended, its queries moved into
// cache space, causal attention over the rows, and the heads' outputs through W_UV.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/rope.h"
#include "common/cuda/kernels/latent_attention_kernels.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

struct LatentCase {
  int heads, nope, rope, rank, v_dim;
  int tokens;      // one sequence, positions 0..tokens-1, in one step
  int check_from;  // tokens before it are not compared (the reference is quadratic)
  int block_size;
  bool interleave;
};

// DeepSeek's rope part as the CPU backend rotates it (cpu_latent_attention.cc).
void RopeRef(const RopeTable& table, int64_t pos, bool interleave, float* x, int dim) {
  if (interleave) {
    std::vector<float> tmp(x, x + dim);
    for (int i = 0; i < dim / 2; ++i) {
      x[i] = tmp[2 * i];
      x[dim / 2 + i] = tmp[2 * i + 1];
    }
  }
  ApplyRope(table, pos, x, dim);
}

TEST_F(CudaOpsTest, LatentAttentionMatchesReference) {
  const LatentCase cases[] = {
      {4, 16, 8, 32, 16, 40, 0, 16, true},             // the deepseek_v3 oracle's shape
      {16, 128, 64, 512, 128, 200, 150, 32, true},     // DeepSeek-V3's head sizes
      {128, 128, 64, 512, 128, 1500, 1498, 64, true},  // its 128 heads, a long context
      {8, 64, 32, 256, 64, 70, 0, 16, false},
  };
  for (const LatentCase& c : cases) {
    const int width = c.rank + c.rope, qw = c.nope + c.rope;
    const int64_t n = c.tokens;
    RopeConfig rope_config;
    rope_config.type = RopeConfig::Type::kYarn;  // DeepSeek-V3's scaling
    rope_config.theta = 10000.0;
    rope_config.factor = 40.0;
    rope_config.original_max_position_embeddings = 4096.0;
    const RopeTable table = BuildRopeTable(rope_config, c.rope);
    const float eps = 1e-6f, scale = 1.0f / std::sqrt(static_cast<float>(qw)) * 1.3f;

    const std::vector<uint16_t> kv_a = RandomBf16(n * width, 2.0f);
    const std::vector<uint16_t> norm = RandomBf16(c.rank, 1.5f);
    const std::vector<uint16_t> q = RandomBf16(n * c.heads * qw, 1.0f);
    const std::vector<uint16_t> kv_b =
        RandomBf16(int64_t{c.heads} * (c.nope + c.v_dim) * c.rank,
                   2.0f / std::sqrt(static_cast<float>(std::max(c.nope, c.rank))));
    // Blocks in a shuffled order, so the table matters.
    const int blocks = (c.tokens + c.block_size - 1) / c.block_size;
    std::vector<int32_t> table_row(blocks);
    std::iota(table_row.begin(), table_row.end(), 0);
    std::shuffle(table_row.begin(), table_row.end(), rng());
    std::vector<int32_t> seq(n, 0), pos(n);
    std::iota(pos.begin(), pos.end(), 0);

    // Reference: the rows, then the checked tokens' outputs.
    std::vector<float> rows(n * width);
    for (int64_t j = 0; j < n; ++j) {
      float* r = &rows[j * width];
      double sum_sq = 0;
      for (int i = 0; i < c.rank; ++i) sum_sq += F(kv_a[j * width + i]) * F(kv_a[j * width + i]);
      const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / c.rank) + eps);
      for (int i = 0; i < c.rank; ++i) r[i] = F(norm[i]) * (F(kv_a[j * width + i]) * inv);
      for (int i = 0; i < c.rope; ++i) r[c.rank + i] = F(kv_a[j * width + c.rank + i]);
      RopeRef(table, j, c.interleave, r + c.rank, c.rope);
    }
    std::vector<float> ref, got_rows;
    for (int64_t t = c.check_from; t < n; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        const uint16_t* qh = &q[(t * c.heads + h) * qw];
        const int64_t first = int64_t{h} * (c.nope + c.v_dim);
        std::vector<float> query(width, 0.0f);
        for (int d = 0; d < c.nope; ++d) {
          for (int i = 0; i < c.rank; ++i) query[i] += F(qh[d]) * F(kv_b[(first + d) * c.rank + i]);
        }
        for (int i = 0; i < c.rope; ++i) query[c.rank + i] = F(qh[c.nope + i]);
        RopeRef(table, t, c.interleave, query.data() + c.rank, c.rope);
        std::vector<double> scores(t + 1);
        double best = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < width; ++i) dot += query[i] * rows[j * width + i];
          scores[j] = dot * scale;
          best = std::max(best, scores[j]);
        }
        double denom = 0;
        for (double& s : scores) denom += (s = std::exp(s - best));
        std::vector<double> latent(c.rank, 0.0);
        for (int64_t j = 0; j <= t; ++j) {
          for (int i = 0; i < c.rank; ++i) latent[i] += scores[j] / denom * rows[j * width + i];
        }
        for (int r = 0; r < c.v_dim; ++r) {
          double o = 0;
          for (int i = 0; i < c.rank; ++i) {
            o += F(kv_b[(first + c.nope + r) * c.rank + i]) * latent[i];
          }
          ref.push_back(static_cast<float>(o));
        }
      }
    }

    uint16_t* d_cache = Poisoned<uint16_t>(int64_t{blocks} * c.block_size * width);
    const uint16_t* d_kv_a = Put(kv_a);
    const uint16_t* d_norm = Put(norm);
    const uint16_t* d_q = Put(q);
    const uint16_t* d_kv_b = Put(kv_b);
    const int32_t* d_table = Put(table_row);
    const int32_t* d_seq = Put(seq);
    const int32_t* d_pos = Put(pos);
    const float* d_freq = Put(table.inv_freq);
    uint16_t* d_queries = Poisoned<uint16_t>(n * c.heads * width);
    uint16_t* d_latent = Poisoned<uint16_t>(n * c.heads * c.rank);
    uint16_t* d_out = Poisoned<uint16_t>(n * c.heads * c.v_dim);
    ASSERT_FALSE(HasFailure());
    gpu::LatentShape shape;
    shape.num_heads = c.heads;
    shape.nope = c.nope;
    shape.rope = c.rope;
    shape.rank = c.rank;
    shape.v_dim = c.v_dim;
    shape.interleave = c.interleave;
    shape.inv_freq = d_freq;
    shape.attention_scaling = table.attention_scaling;
    ASSERT_TRUE(gpu::LatentShapeFits(shape));
    gpu::PagedKvLayer kv;
    kv.data = AsBf16(d_cache);
    kv.block_tables = d_table;
    kv.max_blocks_per_seq = blocks;
    kv.block_size = c.block_size;
    kv.num_kv_heads = 1;
    kv.head_dim = width;
    kv.block_stride = int64_t{c.block_size} * width * 2;  // keys only
    const gpu::TokenBatch tokens{d_seq, d_pos, n};
    LAUNCH_OK(gpu::LaunchLatentKvAppend(AsBf16(d_kv_a), AsBf16(d_norm), eps, shape, tokens, kv,
                                        stream()));
    LAUNCH_OK(gpu::LaunchLatentQueries(AsBf16(d_q), AsBf16(d_kv_b), shape, d_pos, n,
                                       AsBf16(d_queries), stream()));
    LAUNCH_OK(gpu::LaunchLatentAttention(AsBf16(d_queries), shape, scale, tokens, kv,
                                         AsBf16(d_latent), stream()));
    LAUNCH_OK(gpu::LaunchLatentValues(AsBf16(d_latent), AsBf16(d_kv_b), shape, n, AsBf16(d_out),
                                      stream()));
    const std::vector<float> out = GetBf16(AsBf16(d_out), n * c.heads * c.v_dim);
    const std::vector<float> checked(out.begin() + int64_t{c.check_from} * c.heads * c.v_dim,
                                     out.end());
    // The cache rows as written, in position order through the table.
    const std::vector<float> cache =
        GetBf16(AsBf16(d_cache), int64_t{blocks} * c.block_size * width);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = int64_t{table_row[j / c.block_size]} * c.block_size + j % c.block_size;
      got_rows.insert(got_rows.end(), cache.begin() + slot * width,
                      cache.begin() + (slot + 1) * width);
    }
    const std::string name =
        absl::StrCat("heads=", c.heads, " nope=", c.nope, " rope=", c.rope, " rank=", c.rank,
                     " v=", c.v_dim, " tokens=", c.tokens, c.interleave ? " interleaved" : "");
    ExpectClose("latent cache rows", name, got_rows, rows, 1e-2);
    ExpectClose("latent attention out", name, checked, ref, 2e-2);
  }
}

}  // namespace
}  // namespace strata::testing_cuda
