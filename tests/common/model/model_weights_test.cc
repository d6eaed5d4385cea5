// Binding a checkpoint to an architecture: a missing or misshapen tensor is reported by name.
#include "common/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/safetensors_builder.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::SafetensorsBuilder;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// `values` as the bytes of a tensor of `dtype`, F32 or BF16.
std::vector<uint8_t> ScaleBytes(const std::vector<float>& values, const std::string& dtype) {
  std::vector<uint8_t> bytes;
  for (float f : values) {
    if (dtype == "F32") {
      const auto* p = reinterpret_cast<const uint8_t*>(&f);
      bytes.insert(bytes.end(), p, p + 4);
    } else {
      const uint16_t b = FloatToBf16(f);
      const auto* p = reinterpret_cast<const uint8_t*>(&b);
      bytes.insert(bytes.end(), p, p + 2);
    }
  }
  return bytes;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Copies an oracle model into `dir`, its checkpoint rewritten tensor by tensor:
// rewrite(entry, bytes, builder) adds what stands for the tensor (itself, changed, or nothing).
template <typename Rewrite>
void RewriteModel(const std::string& oracle, const TempDir& dir, Rewrite rewrite) {
  const fs::path src = fs::path(STRATA_TEST_DATA_DIR) / "oracles" / oracle;
  fs::copy_file(src / "config.json", dir.File("config.json"));
  const std::string file = ReadAll((src / "model.safetensors").string());
  auto entries = ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "x");
  ASSERT_TRUE(entries.ok());
  SafetensorsBuilder builder;
  for (const auto& e : *entries) {
    std::vector<uint8_t> bytes(file.begin() + e.begin, file.begin() + e.end);
    rewrite(e, bytes, builder);
  }
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors"), builder.Build());
}

// Copies an oracle model into `dir`, rewriting its checkpoint through `edit`, which may drop
// or reshape tensors.
template <typename Edit>
void CopyModel(const std::string& oracle, const TempDir& dir, Edit edit) {
  RewriteModel(
      oracle, dir,
      [&](const SafetensorsEntry& e, std::vector<uint8_t>& bytes, SafetensorsBuilder& builder) {
        std::vector<int64_t> shape = e.shape;
        if (edit(e.name, shape, bytes)) builder.Add(e.name, e.dtype, shape, bytes);
      });
}

TEST(ModelWeightsTest, LoadsEveryOracle) {
  for (const char* name : {"qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "qwen3_moe_dense_tied",
                           "glm4_moe", "deepseek_v3"}) {
    auto model = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/" + name);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    EXPECT_EQ((*model)->weights.layers.size(), static_cast<size_t>((*model)->config.num_layers));
  }
}

TEST(ModelWeightsTest, TiedEmbeddingsShareTheMatrix) {
  auto model = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_dense_tied");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights.lm_head.data, (*model)->weights.embedding.data);
  EXPECT_TRUE((*model)->weights.layers[0].dense_mlp.has_value());
  EXPECT_TRUE((*model)->weights.layers[0].experts.empty());
  EXPECT_EQ((*model)->weights.layers[1].experts.size(), 12u);
}

TEST(ModelWeightsTest, Glm4MoeRouterBiasAndUngatedSharedExperts) {
  auto model = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/glm4_moe");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelWeights& w = (*model)->weights;
  EXPECT_TRUE(w.layers[0].dense_mlp.has_value());
  EXPECT_FALSE(w.layers[0].router_correction_bias.present());
  for (int l : {1, 2}) {
    const LayerWeights& layer = w.layers[l];
    EXPECT_EQ(layer.experts.size(), 16u);
    EXPECT_EQ(layer.router_correction_bias.size, 16);
    ASSERT_TRUE(layer.shared_expert.has_value());
    EXPECT_EQ(layer.shared_expert->gate.out, 32);
    EXPECT_FALSE(layer.shared_expert_gate.present());
  }
  const AttentionWeights& a = w.layers[0].attention;
  EXPECT_TRUE(a.q_bias.present() && a.k_bias.present() && a.v_bias.present());
  EXPECT_FALSE(a.o_bias.present());
  EXPECT_EQ(a.q_norm.size, 32);
}

TEST(ModelWeightsTest, DeepseekV3LatentAttention) {
  auto model = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/deepseek_v3");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelWeights& w = (*model)->weights;
  for (const LayerWeights& layer : w.layers) {
    const AttentionWeights& a = layer.attention;
    EXPECT_EQ(a.q_a.out, 48);
    EXPECT_EQ(a.q_a_norm.size, 48);
    EXPECT_EQ(a.q.out, 4 * 24);  // q_b_proj
    EXPECT_EQ(a.q.in, 48);
    EXPECT_EQ(a.kv_a.out, 32 + 8);
    EXPECT_EQ(a.kv_a_norm.size, 32);
    EXPECT_EQ(a.kv_b.out, 4 * (16 + 16));
    EXPECT_EQ(a.kv_b.in, 32);
    EXPECT_EQ(a.o.in, 4 * 16);
    EXPECT_FALSE(a.k.present() || a.v.present() || a.q_bias.present() || a.o_bias.present());
  }
  EXPECT_TRUE(w.layers[0].dense_mlp.has_value());
  EXPECT_EQ(w.layers[0].dense_mlp->gate.out, 128);
  for (int l : {1, 2}) {
    const LayerWeights& layer = w.layers[l];
    EXPECT_EQ(layer.experts.size(), 16u);
    EXPECT_EQ(layer.router_correction_bias.size, 16);
    ASSERT_TRUE(layer.shared_expert.has_value());
    EXPECT_EQ(layer.shared_expert->gate.out, 32);
    EXPECT_FALSE(layer.shared_expert_gate.present());
  }
}

// Without q_lora_rank the queries come straight from q_proj.
TEST(ModelWeightsTest, DeepseekV3WithoutQueryLatentBindsQProj) {
  TempDir dir;
  const fs::path src = fs::path(STRATA_TEST_DATA_DIR) / "oracles" / "deepseek_v3";
  std::string config = ReadAll((src / "config.json").string());
  const std::string rank = "\"q_lora_rank\": 48";
  config.replace(config.find(rank), rank.size(), "\"q_lora_rank\": null");
  RewriteModel("deepseek_v3", dir,
               [](const SafetensorsEntry& e, std::vector<uint8_t>& bytes, SafetensorsBuilder& b) {
                 if (e.name.find("q_a_") != std::string::npos) return;
                 const size_t at = e.name.find("q_b_proj");
                 if (at == std::string::npos) {
                   b.Add(e.name, e.dtype, e.shape, bytes);
                   return;
                 }
                 // A [96, 64] q_proj in its place: the q_b_proj bytes twice, reshaped.
                 std::vector<uint8_t> q(bytes);
                 q.insert(q.end(), bytes.begin(), bytes.end());
                 q.resize(96 * 64 * 2);
                 b.Add(e.name.substr(0, at) + "q_proj.weight", e.dtype, {96, 64}, q);
               });
  {
    std::ofstream out(dir.File("config.json"), std::ios::trunc);
    out << config;
  }
  auto model = LoadModel(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  const AttentionWeights& a = (*model)->weights.layers[1].attention;
  EXPECT_FALSE(a.q_a.present());
  EXPECT_EQ(a.q.out, 96);
  EXPECT_EQ(a.q.in, 64);

  TempDir missing;
  RewriteModel("deepseek_v3", missing,
               [](const SafetensorsEntry& e, std::vector<uint8_t>& bytes, SafetensorsBuilder& b) {
                 if (e.name != "model.layers.2.self_attn.kv_a_layernorm.weight") {
                   b.Add(e.name, e.dtype, e.shape, bytes);
                 }
               });
  auto bad = LoadModel(missing.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("model.layers.2.self_attn.kv_a_layernorm.weight"));
}

TEST(ModelWeightsTest, GptOssInterleavedExpertLayout) {
  auto model = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/gpt_oss");
  ASSERT_TRUE(model.ok()) << model.status();
  const Checkpoint& ckpt = *(*model)->checkpoint;
  auto gate_up = ckpt.Get("model.layers.0.mlp.experts.gate_up_proj", {8, 64, 128});
  ASSERT_TRUE(gate_up.ok());
  const FfnWeights& e3 = (*model)->weights.layers[0].experts[3];
  // gate row j, input i is gate_up[3, i, 2j]; up is gate_up[3, i, 2j + 1].
  for (int j : {0, 5, 63}) {
    for (int i : {0, 17, 63}) {
      EXPECT_EQ(e3.gate.At(j, i),
                LoadAsFloat(gate_up->data, gate_up->dtype, (3 * 64 + i) * 128 + 2 * j));
      EXPECT_EQ(e3.up.At(j, i),
                LoadAsFloat(gate_up->data, gate_up->dtype, (3 * 64 + i) * 128 + 2 * j + 1));
    }
  }
}

TEST(ModelWeightsTest, MissingTensorIsNamed) {
  TempDir dir;
  CopyModel("mixtral", dir, [](const std::string& name, auto&, auto&) {
    return name != "model.layers.1.block_sparse_moe.experts.5.w3.weight";
  });
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("missing tensor 'model.layers.1.block_sparse_moe.experts.5.w3.weight'"));
}

TEST(ModelWeightsTest, WrongShapeIsNamed) {
  TempDir dir;
  CopyModel("qwen3_moe", dir, [](const std::string& name, std::vector<int64_t>& shape, auto&) {
    if (name == "model.layers.2.self_attn.q_proj.weight") shape = {32, 128};
    return true;
  });
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("model.safetensors: tensor 'model.layers.2.self_attn.q_proj.weight': "
                        "expected shape [64, 64], found [32, 128]"));
}

TEST(ModelWeightsTest, WrongDtypeIsNamed) {
  TempDir dir;
  CopyModel("qwen2_moe", dir, [](const std::string& name, auto&, auto&) { return true; });
  // Rewrite with the shared expert gate stored as I16: same size, not a float type.
  const std::string file = ReadAll(dir.File("model.safetensors"));
  auto entries = ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "x");
  ASSERT_TRUE(entries.ok());
  SafetensorsBuilder builder;
  for (const auto& e : *entries) {
    const bool target = e.name == "model.layers.0.mlp.shared_expert_gate.weight";
    builder.Add(e.name, target ? "I16" : e.dtype, e.shape,
                std::vector<uint8_t>(file.begin() + e.begin, file.begin() + e.end));
  }
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors"), builder.Build());
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(
      std::string(model.status().message()),
      HasSubstr("tensor 'model.layers.0.mlp.shared_expert_gate.weight': unsupported dtype"));
}

// The qwen3_moe oracle copied into `dir` with layer 0's expert 1 down_proj ([64, 32], bf16)
// replaced by what replace(entry, bytes, builder) adds.
template <typename Replace>
void ReplaceExpertMatrix(const TempDir& dir, Replace replace) {
  RewriteModel(
      "qwen3_moe", dir,
      [&](const SafetensorsEntry& e, std::vector<uint8_t>& bytes, SafetensorsBuilder& builder) {
        if (e.name == "model.layers.0.mlp.experts.1.down_proj.weight") {
          ASSERT_EQ(e.dtype, "BF16");
          replace(e, bytes, builder);
        } else {
          builder.Add(e.name, e.dtype, e.shape, bytes);
        }
      });
}

// One expert matrix of an oracle stored as FP8 E4M3 with per-row scales beside it, as
// `scale_dtype` of `scale_shape` under `scale_name` (empty: none).
void CopyWithFp8Expert(const TempDir& dir, const std::string& scale_name,
                       const std::string& scale_dtype, std::vector<int64_t> scale_shape) {
  ReplaceExpertMatrix(dir, [&](const SafetensorsEntry& e, std::vector<uint8_t>& bytes,
                               SafetensorsBuilder& builder) {
    const int64_t out = e.shape[0], in = e.shape[1];
    std::vector<uint16_t> bf16(out * in);
    std::memcpy(bf16.data(), bytes.data(), bf16.size() * 2);
    std::vector<uint8_t> codes(out * in);
    std::vector<float> scales(out);
    QuantizeBf16RowsToFp8E4M3(bf16.data(), out, in, codes.data(), scales.data());
    builder.Add(e.name, "F8_E4M3", e.shape, codes);
    if (scale_name.empty()) return;
    builder.Add(e.name + scale_name, scale_dtype, scale_shape, ScaleBytes(scales, scale_dtype));
  });
}

// FP8 matrices bind with their row scales ([out] or [out, 1]; F32, or BF16 converted) and read
// as the bf16 values within E4M3 rounding; a missing, misshapen or block-wise scale is an error
// that says so.
TEST(ModelWeightsTest, Fp8MatricesNeedPerRowScales) {
  auto reference = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe");
  ASSERT_TRUE(reference.ok()) << reference.status();
  const WeightMatrix& want = reference.value()->weights.layers[0].experts[1].down;
  struct Variant {
    std::string dtype;
    std::vector<int64_t> shape;
  };
  for (const Variant& v :
       {Variant{"F32", {want.out, 1}}, Variant{"F32", {want.out}}, Variant{"BF16", {want.out}}}) {
    TempDir dir;
    ASSERT_NO_FATAL_FAILURE(CopyWithFp8Expert(dir, "_scale", v.dtype, v.shape));
    auto model = LoadModel(dir.path());
    ASSERT_TRUE(model.ok()) << model.status();
    const WeightMatrix& got = (*model)->weights.layers[0].experts[1].down;
    EXPECT_EQ(got.dtype, DType::kF8E4M3);
    ASSERT_NE(got.scale, nullptr);
    // BF16 scales round the row scale itself (up to 2^-8 relative) on top of E4M3's half step.
    const float relative = 1.0f / 16 + (v.dtype == "BF16" ? 1.0f / 256 : 0.0f);
    for (int64_t o = 0; o < want.out; ++o) {
      for (int64_t i = 0; i < want.in; ++i) {
        ASSERT_NEAR(got.At(o, i), want.At(o, i),
                    std::fabs(want.At(o, i)) * relative + got.scale[o] / 1024)
            << v.dtype;
      }
    }
  }
  auto error = [](const std::string& scale_name, const std::string& dtype,
                  std::vector<int64_t> shape) {
    TempDir dir;
    CopyWithFp8Expert(dir, scale_name, dtype, shape);
    auto model = LoadModel(dir.path());
    return model.ok() ? std::string("ok") : model.status().ToString();
  };
  const int64_t out = want.out;
  EXPECT_THAT(error("", "F32", {out}),
              HasSubstr("down_proj.weight is FP8 E4M3 and needs per-row scales: "));
  EXPECT_THAT(error("_scale", "F32", {out / 2, 2}), HasSubstr("expected shape"));
  // Block scales without the block size of a quantization_config.
  EXPECT_THAT(error("_scale_inv", "F32", {out}),
              HasSubstr("model.layers.0.mlp.experts.1.down_proj.weight_scale_inv: block-scaled "
                        "FP8 needs the block size"));
}

// The qwen3_moe oracle with expert 1's down_proj of layer 0 ([64, 32]) block-scaled as DeepSeek
// stores FP8: blocks of 24 x 20 here, so that its 3 x 2 grid ends in partial blocks both ways;
// F32 scales under `<name>_scale_inv` of `scale_shape` (`scale_dtype` BF16: the same values
// rounded). The codes and scales written are returned.
struct BlockScaledExpert {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
constexpr int64_t kBlockRows = 24, kBlockCols = 20;

BlockScaledExpert CopyWithBlockScaledExpert(const TempDir& dir, std::vector<int64_t> scale_shape,
                                            const std::string& scale_dtype = "F32",
                                            bool with_block_size = true) {
  BlockScaledExpert written;
  ReplaceExpertMatrix(dir, [&](const SafetensorsEntry& e, std::vector<uint8_t>& bytes,
                               SafetensorsBuilder& builder) {
    const int64_t out = e.shape[0], in = e.shape[1];
    const int64_t grid_cols = (in + kBlockCols - 1) / kBlockCols;
    auto value = [&](int64_t r, int64_t c) {
      uint16_t v;
      std::memcpy(&v, bytes.data() + (r * in + c) * 2, 2);
      return Bf16ToFloat(v);
    };
    written.scales.assign(((out + kBlockRows - 1) / kBlockRows) * grid_cols, 0.0f);
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        float& s = written.scales[(r / kBlockRows) * grid_cols + c / kBlockCols];
        s = std::max(s, std::fabs(value(r, c)) / 448.0f);
      }
    }
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        const float s = written.scales[(r / kBlockRows) * grid_cols + c / kBlockCols];
        written.codes.push_back(FloatToFp8E4M3(value(r, c) / s));
      }
    }
    builder.Add(e.name, "F8_E4M3", e.shape, written.codes);
    std::vector<uint8_t> scale_bytes = ScaleBytes(written.scales, scale_dtype);
    scale_bytes.resize(scale_shape[0] * scale_shape[1] * (scale_dtype == "BF16" ? 2 : 4));
    builder.Add(e.name + "_scale_inv", scale_dtype, scale_shape, scale_bytes);
  });
  if (with_block_size) {
    std::string config = ReadAll(dir.File("config.json"));
    config.replace(config.find('{'), 1,
                   absl::StrCat("{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                                "\"e4m3\", \"activation_scheme\": \"dynamic\", "
                                "\"weight_block_size\": [",
                                kBlockRows, ", ", kBlockCols, "]},"));
    std::ofstream(dir.File("config.json"), std::ios::trunc) << config;
  }
  return written;
}

// Block-scaled FP8 loads as stored: each element is its code times its block's scale, at every
// block edge and in the partial blocks, within E4M3 rounding of the bf16 weights.
TEST(ModelWeightsTest, BlockScaledFp8TakesEachBlocksScale) {
  auto reference = LoadModel(std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe");
  ASSERT_TRUE(reference.ok()) << reference.status();
  const WeightMatrix& want = reference.value()->weights.layers[0].experts[1].down;
  ASSERT_EQ(want.out, 64);
  ASSERT_EQ(want.in, 32);
  TempDir dir;
  const BlockScaledExpert written = CopyWithBlockScaledExpert(dir, {3, 2});
  auto model = LoadModel(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config.fp8_block_rows, kBlockRows);
  EXPECT_EQ((*model)->config.fp8_block_cols, kBlockCols);
  const WeightMatrix& got = (*model)->weights.layers[0].experts[1].down;
  EXPECT_EQ(got.dtype, DType::kF8E4M3);
  EXPECT_EQ(got.scale, nullptr);
  ASSERT_TRUE(got.blocks.present());
  EXPECT_TRUE(got.whole_block_scaled());
  EXPECT_EQ(got.blocks.count(), 6);
  for (int64_t o = 0; o < want.out; ++o) {
    for (int64_t i = 0; i < want.in; ++i) {
      const float scale = written.scales[(o / kBlockRows) * 2 + i / kBlockCols];
      ASSERT_EQ(got.At(o, i), Fp8E4M3ToFloat(written.codes[o * want.in + i]) * scale)
          << o << ", " << i;
      ASSERT_NEAR(got.At(o, i), want.At(o, i), std::fabs(want.At(o, i)) / 16 + scale / 512)
          << o << ", " << i;
    }
  }
  // The other matrices are as they were.
  EXPECT_EQ((*model)->weights.layers[0].experts[1].up.dtype, DType::kBF16);
}

// A malformed block-scale tensor is refused with an error naming it.
TEST(ModelWeightsTest, BlockScaledFp8RefusesMalformedScales) {
  auto error = [](std::vector<int64_t> shape, const std::string& dtype, bool block_size) {
    TempDir dir;
    CopyWithBlockScaledExpert(dir, shape, dtype, block_size);
    auto model = LoadModel(dir.path());
    return model.ok() ? std::string("ok") : model.status().ToString();
  };
  const std::string name = "model.layers.0.mlp.experts.1.down_proj.weight_scale_inv";
  EXPECT_EQ(error({3, 2}, "F32", true), "ok");
  EXPECT_THAT(error({3, 1}, "F32", true),
              HasSubstr(name + " must hold one scale per 24x20 block of "
                               "model.layers.0.mlp.experts.1.down_proj.weight [64, 32]"));
  EXPECT_THAT(error({2, 2}, "F32", true), HasSubstr("expected shape [3, 2], found [2, 2]"));
  EXPECT_THAT(error({3, 2}, "BF16", true),
              HasSubstr(name + ": block scales must be F32, not BF16"));
  EXPECT_THAT(error({3, 2}, "F32", false),
              HasSubstr(name + ": block-scaled FP8 needs the block size"));
}

}  // namespace
}  // namespace strata
