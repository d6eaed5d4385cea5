// Block-scaled FP8 twins of an oracle model for tests: the same model written with its
// decoder-layer linears as FP8 codes with a float32 scale per 16 x 8 block (DeepSeek's
// weight_scale_inv layout, blocks small enough that every oracle matrix spans several, most
// partial at one edge somewhere), and with those linears as float32 code x scale.
#ifndef STRATA_TESTS_TESTING_BLOCK_FP8_TWINS_H_
#define STRATA_TESTS_TESTING_BLOCK_FP8_TWINS_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "common/model/safetensors.h"
#include "common/tensor/dtype.h"
#include "common/util/read_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/safetensors_builder.h"

namespace strata::testing {

constexpr int64_t kBlockRows = 16, kBlockCols = 8;

template <typename T>
inline std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Every decoder-layer linear but the MoE gates (kept 16-bit, as DeepSeek keeps its router).
inline bool Quantized(const SafetensorsEntry& e) {
  return e.shape.size() == 2 && absl::StartsWith(e.name, "model.layers.") &&
         absl::EndsWith(e.name, ".weight") && !absl::EndsWith(e.name, ".mlp.gate.weight");
}

// Writes the oracle `name` twice: into `fp8_dir` block-scaled (codes, `_scale_inv` and the
// quantization_config) and into `f32_dir` with those linears as float32 code x scale. Returns
// how many matrices became FP8.
inline int WriteBlockFp8Twins(const std::string& name, const std::string& fp8_dir,
                              const std::string& f32_dir) {
  namespace fs = std::filesystem;
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
    for (float& s : scales) s = s > 0.0f ? s : 1.0f;  // an all-zero block: codes of 0
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

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_BLOCK_FP8_TWINS_H_
