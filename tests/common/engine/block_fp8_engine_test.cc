// Block-scaled FP8 (DeepSeek's weight_scale_inv layout) through the CPU engine: a checkpoint
// whose linears are FP8 codes with a float32 scale per block computes exactly what the same
// model with the dequantized weights (code x scale, stored as float32) computes. The oracles'
// matrices are at most 128 wide, so blocks of 16 x 8 here make every matrix span several
// blocks, most of them partial at one edge somewhere, and DeepSeek-V3's kv_b_proj (FP8 as
// DeepSeek ships it) is read through row slices and transposes that cross block boundaries.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "common/engine/local_engine.h"
#include "common/model/safetensors.h"
#include "common/tensor/dtype.h"
#include "common/util/read_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/block_fp8_twins.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::TempDir;
using ::strata::testing::WriteBlockFp8Twins;

std::unique_ptr<LocalEngine> Engine(const std::string& dir) {
  LocalEngineOptions options;
  options.model_dir = dir;
  options.num_threads = 2;
  auto engine = LocalEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

class BlockFp8EngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BlockFp8EngineTest, ComputesWhatTheDequantizedWeightsCompute) {
  TempDir tmp;
  const int quantized = WriteBlockFp8Twins(GetParam(), tmp.File("fp8"), tmp.File("f32"));
  EXPECT_GT(quantized, 0);
  auto fp8 = Engine(tmp.File("fp8"));
  auto f32 = Engine(tmp.File("f32"));
  ASSERT_TRUE(fp8 != nullptr && f32 != nullptr);
  const std::vector<int32_t> ids = {1, 17, 200, 33, 4, 90, 300, 7, 12, 450, 5, 6};
  auto a = fp8->Logits(ids);
  auto b = f32->Logits(ids);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->size(), b->size());
  // The same float32 weights, the same kernels and order of sums: the same logits, bit for bit.
  int differ = 0;
  for (int64_t i = 0; i < a->size(); ++i) differ += a->data()[i] != b->data()[i];
  EXPECT_EQ(differ, 0) << "of " << a->size() << " logits";
  GenerateOptions greedy;
  greedy.max_new_tokens = 8;
  greedy.ignore_eos = true;
  auto ta = fp8->Generate(ids, greedy);
  auto tb = f32->Generate(ids, greedy);
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(*ta, *tb);
}

// DeepSeek-V3 (kv_b_proj FP8 too: latent attention reads it by head and transposed), GLM-4.5
// and Qwen3-MoE (dense and shared-expert MLPs, q/k/v/o).
INSTANTIATE_TEST_SUITE_P(Oracles, BlockFp8EngineTest,
                         ::testing::Values("deepseek_v3", "glm4_moe", "qwen3_moe"));

}  // namespace
}  // namespace strata
