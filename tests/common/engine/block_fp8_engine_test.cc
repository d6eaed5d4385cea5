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
#include "tests/testing/safetensors_builder.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::SafetensorsBuilder;
using ::strata::testing::TempDir;

constexpr int64_t kBlockRows = 16, kBlockCols = 8;

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Every decoder-layer linear but the MoE gates (kept 16-bit, as DeepSeek keeps its router).
bool Quantized(const SafetensorsEntry& e) {
  return e.shape.size() == 2 && absl::StartsWith(e.name, "model.layers.") &&
         absl::EndsWith(e.name, ".weight") && !absl::EndsWith(e.name, ".mlp.gate.weight");
}

// Writes the oracle `name` twice: into `fp8_dir` block-scaled (codes, `_scale_inv` and the
// quantization_config) and into `f32_dir` with those linears as float32 code x scale. Returns
// how many matrices became FP8.
int WriteTwins(const std::string& name, const std::string& fp8_dir, const std::string& f32_dir) {
  const fs::path src = fs::path(STRATA_TEST_DATA_DIR) / "oracles" / name;
  const std::string file = *ReadFileToString((src / "model.safetensors").string());
  auto entries = ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "x");
  EXPECT_TRUE(entries.ok()) << entries.status();
  SafetensorsBuilder fp8, f32;
  int quantized = 0;
  for (const SafetensorsEntry& e : *entries) {
    std::vector<uint8_t> bytes(file.begin() + e.begin, file.begin() + e.end);
    if (!Quantized(e)) {
      fp8.Add(e.name, e.dtype, e.shape, bytes);
      f32.Add(e.name, e.dtype, e.shape, bytes);
      continue;
    }
    EXPECT_EQ(e.dtype, "BF16") << e.name;
    ++quantized;
    const int64_t rows = e.shape[0], cols = e.shape[1];
    const int64_t grid_rows = (rows + kBlockRows - 1) / kBlockRows;
    const int64_t grid_cols = (cols + kBlockCols - 1) / kBlockCols;
    auto value = [&](int64_t r, int64_t c) {
      uint16_t v;
      std::memcpy(&v, bytes.data() + (r * cols + c) * 2, 2);
      return Bf16ToFloat(v);
    };
    auto block = [&](int64_t r, int64_t c) {
      return (r / kBlockRows) * grid_cols + c / kBlockCols;
    };
    std::vector<float> scales(grid_rows * grid_cols, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        scales[block(r, c)] = std::max(scales[block(r, c)], std::fabs(value(r, c)) / 448.0f);
      }
    }
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> dequantized(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float s = scales[block(r, c)];
        codes[r * cols + c] = FloatToFp8E4M3(value(r, c) / s);
        dequantized[r * cols + c] = Fp8E4M3ToFloat(codes[r * cols + c]) * s;
      }
    }
    fp8.Add(e.name, "F8_E4M3", e.shape, codes);
    fp8.Add(e.name + "_scale_inv", "F32", {grid_rows, grid_cols}, Bytes(scales));
    f32.Add(e.name, "F32", e.shape, Bytes(dequantized));
  }
  fs::create_directories(fp8_dir);
  fs::create_directories(f32_dir);
  SafetensorsBuilder::WriteFile(fp8_dir + "/model.safetensors", fp8.Build());
  SafetensorsBuilder::WriteFile(f32_dir + "/model.safetensors", f32.Build());
  nlohmann::json config = nlohmann::json::parse(*ReadFileToString((src / "config.json").string()));
  std::ofstream(f32_dir + "/config.json") << config.dump(2);
  config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                   {"fmt", "e4m3"},
                                   {"quant_method", "fp8"},
                                   {"weight_block_size", {kBlockRows, kBlockCols}}};
  std::ofstream(fp8_dir + "/config.json") << config.dump(2);
  return quantized;
}

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
  const int quantized = WriteTwins(GetParam(), tmp.File("fp8"), tmp.File("f32"));
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
