// Binding a checkpoint to an architecture: a missing or misshapen tensor is reported by name.
#include "common/model/model_weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>

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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Copies an oracle model into `dir`, rewriting its checkpoint through `edit`, which may drop
// or reshape tensors.
template <typename Edit>
void CopyModel(const std::string& oracle, const TempDir& dir, Edit edit) {
  const fs::path src = fs::path(STRATA_TEST_DATA_DIR) / "oracles" / oracle;
  fs::copy_file(src / "config.json", dir.File("config.json"));
  const std::string file = ReadAll((src / "model.safetensors").string());
  auto entries = ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "x");
  ASSERT_TRUE(entries.ok());
  SafetensorsBuilder builder;
  for (const auto& e : *entries) {
    std::vector<int64_t> shape = e.shape;
    std::vector<uint8_t> bytes(file.begin() + e.begin, file.begin() + e.end);
    if (!edit(e.name, shape, bytes)) continue;
    builder.Add(e.name, e.dtype, shape, bytes);
  }
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors"), builder.Build());
}

TEST(ModelWeightsTest, LoadsEveryOracle) {
  for (const char* name :
       {"qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "qwen3_moe_dense_tied"}) {
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

}  // namespace
}  // namespace strata
