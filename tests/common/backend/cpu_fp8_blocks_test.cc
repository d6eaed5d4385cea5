// Block-scaled FP8 (DeepSeek's weight_scale_inv layout) on the CPU: every element takes its own
// block's scale, the last blocks of a row or column partial; views into the tensor (a slice of
// rows starting mid-block, its transpose, as latent attention reads kv_b_proj) keep their
// scales; cpu::Linear computes with exactly those values.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/backend/cpu/cpu_kernels.h"
#include "common/model/model_weights.h"
#include "common/tensor/dtype.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int64_t kOut = 300, kIn = 200, kBlock = 128;  // a 3 x 2 grid of blocks

// Random codes (no NaN codes) and a different scale for every block.
struct BlockScaled {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  WeightMatrix m;
};

BlockScaled Make() {
  BlockScaled b;
  std::mt19937 rng(7);
  b.codes.resize(kOut * kIn);
  for (uint8_t& c : b.codes) {
    do {
      c = static_cast<uint8_t>(rng());
    } while ((c & 0x7f) == 0x7f);
  }
  for (int k = 0; k < 6; ++k) b.scales.push_back(0.001f * (k + 1) + 0.0001f * k * k);
  b.m = WeightMatrix{b.codes.data(), DType::kF8E4M3, kOut, kIn, /*out_stride=*/kIn, 1};
  b.m.blocks = Fp8BlockScales{b.scales.data(), b.codes.data(), kOut, kIn, kBlock, kBlock};
  return b;
}

float Dequantized(const BlockScaled& b, int64_t r, int64_t c) {
  return Fp8E4M3ToFloat(b.codes[r * kIn + c]) * b.scales[(r / kBlock) * 2 + c / kBlock];
}

// y[o] = sum_i W[o, i] x[i], summed as cpu::Dot sums (what Linear must give bit for bit).
std::vector<float> Reference(const WeightMatrix& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(n * w.out), row(w.in);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < w.out; ++o) {
      for (int64_t i = 0; i < w.in; ++i) row[i] = w.At(o, i);
      y[t * w.out + o] = cpu::Dot(row.data(), x.data() + t * w.in, w.in);
    }
  }
  return y;
}

std::vector<float> RandomRows(int64_t n, int64_t width) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * width);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(CpuFp8BlocksTest, EachElementTakesItsBlocksScale) {
  const BlockScaled b = Make();
  EXPECT_TRUE(b.m.scales_match_dtype());
  EXPECT_TRUE(b.m.whole_block_scaled());
  EXPECT_EQ(b.m.blocks.grid_rows(), 3);
  EXPECT_EQ(b.m.blocks.grid_cols(), 2);
  // The block edges: last of one block, first of the next, and the partial last blocks.
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{0, 0},
                                                              {127, 127},
                                                              {127, 128},
                                                              {128, 127},
                                                              {128, 128},
                                                              {255, 199},
                                                              {256, 0},
                                                              {256, 128},
                                                              {299, 127},
                                                              {299, 199}}) {
    EXPECT_EQ(b.m.At(r, c), Dequantized(b, r, c)) << r << ", " << c;
  }
  for (int64_t r = 0; r < kOut; ++r) {
    for (int64_t c = 0; c < kIn; ++c) {
      ASSERT_EQ(b.m.ScaleAt(r, c), b.scales[(r / kBlock) * 2 + c / kBlock]) << r << ", " << c;
    }
  }
}

TEST(CpuFp8BlocksTest, LinearComputesWithEachBlocksScale) {
  const BlockScaled b = Make();
  ThreadPool pool(2);
  for (int64_t n : {1, 3}) {
    const std::vector<float> x = RandomRows(n, kIn);
    std::vector<float> y(n * kOut);
    cpu::Linear(pool, x.data(), n, b.m, WeightVector{}, y.data());
    EXPECT_EQ(y, Reference(b.m, x, n)) << n << " rows";
  }
}

// Rows [100, 260) (starting and ending inside blocks), then the transpose of that slice, as
// CpuRouterBackend::LatentAttention takes a head's rows of kv_b_proj and their transpose.
TEST(CpuFp8BlocksTest, ViewsIntoTheTensorKeepTheirScales) {
  const BlockScaled b = Make();
  WeightMatrix slice = b.m;
  slice.data = b.codes.data() + 100 * kIn;
  slice.out = 160;
  WeightMatrix transposed = slice;
  transposed.out = slice.in;
  transposed.in = slice.out;
  transposed.out_stride = slice.in_stride;
  transposed.in_stride = slice.out_stride;
  EXPECT_FALSE(slice.whole_block_scaled());
  for (int64_t o = 0; o < slice.out; ++o) {
    for (int64_t i = 0; i < slice.in; ++i) {
      ASSERT_EQ(slice.At(o, i), Dequantized(b, 100 + o, i)) << o << ", " << i;
      ASSERT_EQ(transposed.At(i, o), Dequantized(b, 100 + o, i)) << i << ", " << o;
    }
  }
  ThreadPool pool(2);
  for (const WeightMatrix* w : {&slice, &transposed}) {
    const std::vector<float> x = RandomRows(2, w->in);
    std::vector<float> y(2 * w->out);
    cpu::Linear(pool, x.data(), 2, *w, WeightVector{}, y.data());
    EXPECT_EQ(y, Reference(*w, x, 2)) << (w == &slice ? "slice" : "transpose");
  }
}

}  // namespace
}  // namespace strata
