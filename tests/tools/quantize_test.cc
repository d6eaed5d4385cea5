// `strata quantize`: FP8 E4M3 per-channel weights in the compressed-tensors layout, checked
// tensor by tensor against the input, loaded back by the engine, and its refusals.
#include "tools/strata/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/engine/local_engine.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors.h"
#include "common/tensor/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/block_fp8_twins.h"
#include "tests/testing/temp_dir.h"
#include "tools/strata/make_model.h"
#include "tools/strata/quantize_command.h"
#include "tools/strata/quantize_rules.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::TempDir;
using ::testing::Contains;
using ::testing::HasSubstr;

const std::string kOracle = std::string(STRATA_SOURCE_DIR) + "/tests/data/oracles/qwen3_moe";
const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";

// A safetensors file's tensors by name, with the map that holds their bytes.
struct Tensors {
  std::unique_ptr<MappedFile> file;
  std::map<std::string, SafetensorsEntry> entries;
  const uint8_t* data(const std::string& name) const {
    return file->bytes().data() + entries.at(name).begin;
  }
  size_t size(const std::string& name) const {
    return entries.at(name).end - entries.at(name).begin;
  }
};

Tensors Read(const std::string& path) {
  Tensors t;
  t.file = *MappedFile::Open(path);
  const auto entries = ParseSafetensors(t.file->bytes(), path);
  EXPECT_TRUE(entries.ok()) << entries.status();
  for (const auto& e : *entries) t.entries[e.name] = e;
  return t;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

QuantizeOptions Options(const std::string& model, const std::string& out) {
  QuantizeOptions o;
  o.model_dir = model;
  o.out_dir = out;
  o.num_threads = 2;
  return o;
}

// Relative L2 error of the quantized model's logits over every position, and the share of
// positions whose argmax agrees.
struct LogitError {
  double relative = 0.0;
  double argmax_agreement = 0.0;
};

LogitError CompareLogits(const std::string& original, const std::string& quantized,
                         const std::vector<int32_t>& ids) {
  LocalEngineOptions options;
  options.num_threads = 2;
  options.kv.memory_mb = 64;
  options.model_dir = original;
  auto a_engine = LocalEngine::Create(options);
  EXPECT_TRUE(a_engine.ok()) << a_engine.status();
  options.model_dir = quantized;
  auto b_engine = LocalEngine::Create(options);
  EXPECT_TRUE(b_engine.ok()) << b_engine.status();
  auto a = (*a_engine)->Logits(ids);
  auto b = (*b_engine)->Logits(ids);
  EXPECT_TRUE(a.ok() && b.ok());
  double diff = 0.0, norm = 0.0;
  int agree = 0;
  for (int64_t r = 0; r < a->rows(); ++r) {
    const float* x = a->row(r);
    const float* y = b->row(r);
    for (int64_t c = 0; c < a->cols(); ++c) {
      diff += (x[c] - y[c]) * static_cast<double>(x[c] - y[c]);
      norm += x[c] * static_cast<double>(x[c]);
    }
    agree += std::max_element(x, x + a->cols()) - x == std::max_element(y, y + b->cols()) - y;
  }
  return {std::sqrt(diff / norm), static_cast<double>(agree) / a->rows()};
}

TEST(QuantizeTest, OracleTensorsScalesAndConfig) {
  TempDir tmp;
  const std::string out = tmp.File("fp8");
  auto result = Quantize(Options(kOracle, out));
  ASSERT_TRUE(result.ok()) << result.status();

  const Tensors in = Read(kOracle + "/model.safetensors");
  const Tensors q = Read(out + "/model.safetensors");
  int quantized = 0;
  for (const auto& [name, e] : in.entries) {
    ASSERT_TRUE(q.entries.contains(name)) << name;
    const SafetensorsEntry& o = q.entries.at(name);
    EXPECT_EQ(o.shape, e.shape) << name;
    if (!IsFp8Linear(name, e.shape)) {
      // Routers, embeddings, lm_head, norms: byte for byte.
      EXPECT_EQ(o.dtype, e.dtype) << name;
      ASSERT_EQ(q.size(name), in.size(name)) << name;
      EXPECT_EQ(std::memcmp(q.data(name), in.data(name), in.size(name)), 0) << name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(o.dtype, "F8_E4M3") << name;
    const SafetensorsEntry& s = q.entries.at(name + "_scale");
    EXPECT_EQ(s.dtype, "BF16") << name;
    EXPECT_EQ(s.shape, (std::vector<int64_t>{e.shape[0], 1})) << name;
    const auto* w = reinterpret_cast<const uint16_t*>(in.data(name));
    const auto* scales = reinterpret_cast<const uint16_t*>(q.data(name + "_scale"));
    const uint8_t* codes = q.data(name);
    for (int64_t r = 0; r < e.shape[0]; ++r) {
      float absmax = 0.0f;
      for (int64_t c = 0; c < e.shape[1]; ++c) {
        absmax = std::max(absmax, std::fabs(Bf16ToFloat(w[r * e.shape[1] + c])));
      }
      // The scale in the checkpoint's dtype, bf16(max|row| / 448).
      ASSERT_EQ(scales[r], FloatToBf16(absmax / 448.0f)) << name << " row " << r;
      const float scale = Bf16ToFloat(scales[r]);
      for (int64_t c = 0; c < e.shape[1]; ++c) {
        const float x = Bf16ToFloat(w[r * e.shape[1] + c]);
        ASSERT_EQ(codes[r * e.shape[1] + c], FloatToFp8E4M3(x * (1.0f / scale)))
            << name << " [" << r << ", " << c << "]";
        // E4M3 keeps 3 mantissa bits: within half a step, 1/16 of the value (or of the
        // smallest normal step for tiny values).
        EXPECT_NEAR(Fp8E4M3ToFloat(codes[r * e.shape[1] + c]) * scale, x,
                    std::max(std::fabs(x) / 16.0f, scale / 512.0f) + 1e-9f);
      }
    }
  }
  EXPECT_EQ(quantized, result->quantized_tensors);
  // 3 layers x (4 attention + 16 experts x 3) linears.
  EXPECT_EQ(quantized, 3 * (4 + 16 * 3));
  EXPECT_EQ(q.entries.size(), in.entries.size() + quantized);
  EXPECT_EQ(q.entries.at("model.layers.0.mlp.gate.weight").dtype, "BF16");
  EXPECT_LT(result->bytes_after, result->bytes_before);

  const nlohmann::json config = ReadJson(out + "/config.json");
  const nlohmann::json& qc = config.at("quantization_config");
  EXPECT_EQ(qc.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(qc.at("format"), "float-quantized");
  const nlohmann::json& group = qc.at("config_groups").at("group_0");
  EXPECT_EQ(group.at("targets"), nlohmann::json::array({"Linear"}));
  EXPECT_TRUE(group.at("input_activations").is_null());
  const nlohmann::json& w = group.at("weights");
  EXPECT_EQ(w.at("num_bits"), 8);
  EXPECT_EQ(w.at("type"), "float");
  EXPECT_EQ(w.at("strategy"), "channel");
  EXPECT_EQ(w.at("symmetric"), true);
  EXPECT_EQ(w.at("dynamic"), false);
  const auto ignore = qc.at("ignore").get<std::vector<std::string>>();
  EXPECT_THAT(ignore, Contains("lm_head"));
  EXPECT_THAT(ignore, Contains("model.layers.0.mlp.gate"));
  EXPECT_THAT(ignore, Contains("model.layers.1.mlp.gate"));
  EXPECT_THAT(ignore, Contains("model.layers.2.mlp.gate"));
  EXPECT_EQ(ignore.size(), 4u);
  // The rest of the config as it was.
  nlohmann::json rest = config;
  rest.erase("quantization_config");
  EXPECT_EQ(rest, ReadJson(kOracle + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  EXPECT_FALSE(fs::exists(out + "/oracle.json"));
}

// The random-weight oracle amplifies rounding layer by layer (its logits are small and flat),
// so it gets a loose bound; the trained demo model's logits move far less.
TEST(QuantizeTest, OracleLoadsAndLogitsStayClose) {
  TempDir tmp;
  const std::string out = tmp.File("fp8");
  ASSERT_TRUE(Quantize(Options(kOracle, out)).ok());
  const LogitError e = CompareLogits(kOracle, out, {1, 17, 200, 33, 4, 90, 300, 7, 12, 450});
  std::cout << "oracle: relative logit error " << e.relative << ", argmax agreement "
            << e.argmax_agreement << "\n";
  EXPECT_LT(e.relative, 0.15);
}

// GLM-4.5: the router and its correction bias stay as they were (the choice of experts flips on
// small errors), the shared experts and the dense layer's MLP become FP8.
TEST(QuantizeTest, Glm4MoeKeepsTheRouterAndQuantizesSharedExperts) {
  const std::string glm = std::string(STRATA_SOURCE_DIR) + "/tests/data/oracles/glm4_moe";
  TempDir tmp;
  const std::string out = tmp.File("fp8");
  auto result = Quantize(Options(glm, out));
  ASSERT_TRUE(result.ok()) << result.status();
  // Layer 0: 4 attention and 3 dense MLP linears; layers 1-2: 4 attention, 16 x 3 expert and
  // 3 shared-expert linears.
  EXPECT_EQ(result->quantized_tensors, 7 + 2 * (4 + 16 * 3 + 3));
  const Tensors in = Read(glm + "/model.safetensors");
  const Tensors q = Read(out + "/model.safetensors");
  for (const char* kept :
       {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.2.self_attn.q_proj.bias"}) {
    ASSERT_EQ(q.entries.at(kept).dtype, in.entries.at(kept).dtype) << kept;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(q.data(kept)), q.size(kept)),
              std::string(reinterpret_cast<const char*>(in.data(kept)), in.size(kept)))
        << kept;
  }
  EXPECT_EQ(q.entries.at("model.layers.1.mlp.shared_experts.up_proj.weight").dtype, "F8_E4M3");
  EXPECT_EQ(q.entries.at("model.layers.0.mlp.down_proj.weight").dtype, "F8_E4M3");
  const LogitError e = CompareLogits(glm, out, {1, 17, 200, 33, 4, 90, 300, 7, 12, 450});
  std::cout << "glm4_moe: relative logit error " << e.relative << ", argmax agreement "
            << e.argmax_agreement << "\n";
  EXPECT_LT(e.relative, 0.15);
}

// --fp8-scaling block: DeepSeek's layout, `<name>_scale_inv` float32 [ceil(out / 128),
// ceil(in / 128)] with max |block| / 448, codes over it; DeepSeek's quantization_config with
// the 16-bit linears listed; the model loads and its logits stay within the per-channel bound.
TEST(QuantizeTest, BlockScaledOracleTensorsConfigAndLogits) {
  for (const std::string oracle : {"qwen3_moe", "deepseek_v3"}) {
    const std::string src = std::string(STRATA_SOURCE_DIR) + "/tests/data/oracles/" + oracle;
    TempDir tmp;
    const std::string out = tmp.File("fp8");
    QuantizeOptions options = Options(src, out);
    options.scaling = Fp8Scaling::kBlock;
    auto result = Quantize(options);
    ASSERT_TRUE(result.ok()) << result.status();
    // qwen3_moe: 3 layers x (4 attention + 16 x 3 expert linears); deepseek_v3: 4 attention
    // linears a layer (kv_b_proj stays 16-bit), layer 0's dense MLP, 16 x 3 + 3 shared-expert
    // linears in layers 1 and 2.
    EXPECT_EQ(result->quantized_tensors,
              oracle == "qwen3_moe" ? 3 * (4 + 16 * 3) : 3 * 4 + 3 + 2 * (16 * 3 + 3))
        << oracle;
    const Tensors in = Read(src + "/model.safetensors");
    const Tensors q = Read(out + "/model.safetensors");
    for (const auto& [name, e] : in.entries) {
      if (!IsFp8Linear(name, e.shape)) {
        ASSERT_EQ(q.entries.at(name).dtype, e.dtype) << name;
        EXPECT_FALSE(q.entries.contains(name + "_scale_inv")) << name;
        continue;
      }
      const int64_t rows = e.shape[0], cols = e.shape[1];
      const int64_t grid_cols = (cols + 127) / 128;
      const SafetensorsEntry& s = q.entries.at(name + "_scale_inv");
      EXPECT_EQ(s.dtype, "F32") << name;
      ASSERT_EQ(s.shape, (std::vector<int64_t>{(rows + 127) / 128, grid_cols})) << name;
      EXPECT_FALSE(q.entries.contains(name + "_scale")) << name;
      const auto* w = reinterpret_cast<const uint16_t*>(in.data(name));
      const auto* scales = reinterpret_cast<const float*>(q.data(name + "_scale_inv"));
      const uint8_t* codes = q.data(name);
      std::vector<float> absmax(s.shape[0] * s.shape[1], 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float& m = absmax[(r / 128) * grid_cols + c / 128];
          m = std::max(m, std::fabs(Bf16ToFloat(w[r * cols + c])));
        }
      }
      for (size_t k = 0; k < absmax.size(); ++k) ASSERT_EQ(scales[k], absmax[k] / 448.0f) << name;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float scale = scales[(r / 128) * grid_cols + c / 128];
          const float x = Bf16ToFloat(w[r * cols + c]);
          ASSERT_EQ(codes[r * cols + c], FloatToFp8E4M3(x * (1.0f / scale))) << name;
        }
      }
    }
    EXPECT_EQ(q.entries.count("model.layers.1.self_attn.kv_b_proj.weight_scale_inv"), 0u);
    const nlohmann::json qc = ReadJson(out + "/config.json").at("quantization_config");
    EXPECT_EQ(qc.at("quant_method"), "fp8");
    EXPECT_EQ(qc.at("fmt"), "e4m3");
    EXPECT_EQ(qc.at("activation_scheme"), "dynamic");
    EXPECT_EQ(qc.at("weight_block_size"), nlohmann::json::array({128, 128}));
    const auto kept = qc.at("modules_to_not_convert").get<std::vector<std::string>>();
    EXPECT_THAT(kept, Contains("lm_head"));
    EXPECT_THAT(kept, Contains("model.layers.2.mlp.gate"));
    if (oracle == "deepseek_v3") EXPECT_THAT(kept, Contains("model.layers.0.self_attn.kv_b_proj"));

    // The random oracles amplify rounding (see OracleLoadsAndLogitsStayClose). Their matrices
    // are at most 128 wide, one block each: a scale per matrix, coarser than per row. qwen3_moe
    // stays within the per-channel bound (0.116 against 0.102 per channel); deepseek_v3, whose
    // per-channel error is already 0.147, lands at 0.179. That block scales are applied as
    // they should be is block_fp8_engine_test's (logits equal to the dequantized model's).
    const LogitError e = CompareLogits(src, out, {1, 17, 200, 33, 4, 90, 300, 7, 12, 450});
    std::cout << oracle << " block-scaled: relative logit error " << e.relative
              << ", argmax agreement " << e.argmax_agreement << "\n";
    EXPECT_LT(e.relative, oracle == "qwen3_moe" ? 0.15 : 0.2) << oracle;
  }
}

// DeepSeek-V3 per channel: the latent attention's projections but kv_b_proj (which attention
// reads transposed) become FP8 with row scales, kv_b_proj is in the ignore list.
TEST(QuantizeTest, DeepseekV3PerChannelKeepsKvBProj16Bit) {
  const std::string src = std::string(STRATA_SOURCE_DIR) + "/tests/data/oracles/deepseek_v3";
  TempDir tmp;
  const std::string out = tmp.File("fp8");
  auto result = Quantize(Options(src, out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->quantized_tensors, 3 * 4 + 3 + 2 * (16 * 3 + 3));
  const Tensors q = Read(out + "/model.safetensors");
  EXPECT_EQ(q.entries.at("model.layers.1.self_attn.q_a_proj.weight").dtype, "F8_E4M3");
  EXPECT_EQ(q.entries.at("model.layers.1.self_attn.q_b_proj.weight").dtype, "F8_E4M3");
  EXPECT_EQ(q.entries.at("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").dtype, "F8_E4M3");
  EXPECT_EQ(q.entries.at("model.layers.1.self_attn.kv_b_proj.weight").dtype, "BF16");
  EXPECT_EQ(q.entries.at("model.layers.1.mlp.gate.e_score_correction_bias").dtype, "BF16");
  const auto ignore = ReadJson(out + "/config.json")
                          .at("quantization_config")
                          .at("ignore")
                          .get<std::vector<std::string>>();
  EXPECT_THAT(ignore, Contains("model.layers.2.self_attn.kv_b_proj"));
  const LogitError e = CompareLogits(src, out, {1, 17, 200, 33, 4, 90, 300, 7, 12, 450});
  std::cout << "deepseek_v3 per channel: relative logit error " << e.relative << "\n";
  EXPECT_LT(e.relative, 0.15);
}

// A block-scaled FP8 checkpoint (DeepSeek's release layout) requantized with a scale per row,
// what the CUDA backend loads: each FP8 linear's codes x row scale within E4M3 rounding of the
// block-dequantized weight, kv_b_proj (FP8 with block scales in DeepSeek's release) written
// 16-bit, no `_scale_inv` left, the compressed-tensors config, and logits close to the
// block-scaled model's.
TEST(QuantizeTest, BlockScaledFp8RequantizesPerChannel) {
  for (const std::string oracle : {"qwen3_moe", "deepseek_v3"}) {
    TempDir tmp;
    const int block_linears =
        testing::WriteBlockFp8Twins(oracle, tmp.File("block"), tmp.File("dequantized"));
    auto result = Quantize(Options(tmp.File("block"), tmp.File("channel")));
    ASSERT_TRUE(result.ok()) << result.status();
    // deepseek_v3's three kv_b_proj stay 16-bit.
    EXPECT_EQ(result->quantized_tensors, block_linears - (oracle == "deepseek_v3" ? 3 : 0));
    const Tensors f32 = Read(tmp.File("dequantized") + "/model.safetensors");
    const Tensors q = Read(tmp.File("channel") + "/model.safetensors");
    int checked = 0;
    for (const auto& [name, e] : f32.entries) {
      EXPECT_FALSE(q.entries.contains(name + "_scale_inv")) << name;
      if (e.dtype != "F32" || !IsFp8Linear(name, e.shape)) continue;
      const int64_t rows = e.shape[0], cols = e.shape[1];
      const auto* want = reinterpret_cast<const float*>(f32.data(name));
      ASSERT_EQ(q.entries.at(name).dtype, "F8_E4M3") << name;
      ASSERT_EQ(q.entries.at(name + "_scale").shape, (std::vector<int64_t>{rows, 1})) << name;
      const auto* scales = reinterpret_cast<const uint16_t*>(q.data(name + "_scale"));
      const uint8_t* codes = q.data(name);
      for (int64_t r = 0; r < rows; ++r) {
        const float scale = Bf16ToFloat(scales[r]);
        float absmax = 0.0f;
        for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(want[r * cols + c]));
        ASSERT_NEAR(scale, absmax / 448.0f, absmax / 448.0f / 128.0f) << name << " row " << r;
        for (int64_t c = 0; c < cols; ++c) {
          const float x = want[r * cols + c];
          const float got = Fp8E4M3ToFloat(codes[r * cols + c]) * scale;
          // Half an E4M3 step: 2^-4 of the value among normals, 2^-10 of the scale below them
          // (and the bf16 scale's rounding).
          const float bound =
              std::max(std::fabs(x) * 0x1p-4f, scale * 0x1p-10f) * 1.01f + std::fabs(x) * 0x1p-8f;
          ASSERT_LE(std::fabs(got - x), bound) << name << " (" << r << ", " << c << ")";
        }
      }
      ++checked;
    }
    EXPECT_EQ(checked, result->quantized_tensors) << oracle;
    if (oracle == "deepseek_v3") {
      const std::string kv_b = "model.layers.1.self_attn.kv_b_proj.weight";
      ASSERT_EQ(q.entries.at(kv_b).dtype, "BF16");
      const auto* got = reinterpret_cast<const uint16_t*>(q.data(kv_b));
      const auto* want = reinterpret_cast<const float*>(f32.data(kv_b));
      for (size_t i = 0; i < q.size(kv_b) / 2; ++i) {
        ASSERT_EQ(got[i], FloatToBf16(want[i])) << kv_b << " element " << i;
      }
    }
    const nlohmann::json qc =
        ReadJson(tmp.File("channel") + "/config.json").at("quantization_config");
    EXPECT_EQ(qc.at("quant_method"), "compressed-tensors");
    EXPECT_EQ(qc.at("config_groups").at("group_0").at("weights").at("strategy"), "channel");
    if (oracle == "deepseek_v3") {
      EXPECT_THAT(qc.at("ignore").get<std::vector<std::string>>(),
                  Contains("model.layers.2.self_attn.kv_b_proj"));
    }
    // Against the block-scaled weights (dequantized exactly): one more E4M3 rounding. The
    // random oracles amplify it (OracleLoadsAndLogitsStayClose): 0.092 (qwen3_moe) and 0.149
    // (deepseek_v3), within their per-channel and block bounds.
    const LogitError e = CompareLogits(tmp.File("dequantized"), tmp.File("channel"),
                                       {1, 17, 200, 33, 4, 90, 300, 7, 12, 450});
    std::cout << oracle << " block-scaled to per channel: relative logit error " << e.relative
              << ", argmax agreement " << e.argmax_agreement << "\n";
    EXPECT_LT(e.relative, oracle == "qwen3_moe" ? 0.15 : 0.2) << oracle;
  }
}

// A block-scaled input asked to stay block-scaled, or missing a weight's scales: refused,
// naming what is wrong, and nothing written.
TEST(QuantizeTest, BlockScaledFp8Refusals) {
  TempDir tmp;
  testing::WriteBlockFp8Twins("qwen3_moe", tmp.File("block"), tmp.File("dequantized"));
  QuantizeOptions block = Options(tmp.File("block"), tmp.File("again"));
  block.scaling = Fp8Scaling::kBlock;
  auto r = Quantize(block);
  EXPECT_THAT(r.status().message(), HasSubstr("block-scaled FP8 already"));
  EXPECT_FALSE(fs::exists(tmp.File("again")));

  // The same checkpoint without one weight's scales.
  const std::string missing = tmp.File("missing");
  fs::create_directories(missing);
  fs::copy_file(tmp.File("block") + "/config.json", missing + "/config.json");
  const Tensors in = Read(tmp.File("block") + "/model.safetensors");
  testing::SafetensorsBuilder without;
  const std::string dropped = "model.layers.1.self_attn.q_proj.weight_scale_inv";
  for (const auto& [name, e] : in.entries) {
    if (name == dropped) continue;
    without.Add(name, e.dtype, e.shape,
                std::vector<uint8_t>(in.data(name), in.data(name) + in.size(name)));
  }
  testing::SafetensorsBuilder::WriteFile(missing + "/model.safetensors", without.Build());
  r = Quantize(Options(missing, tmp.File("missing-out")));
  EXPECT_THAT(r.status().message(), HasSubstr("has no " + dropped));
  EXPECT_FALSE(fs::exists(tmp.File("missing-out")));

  // Scales of a tensor that is not FP8 would be dropped with nothing to apply them to.
  const std::string stray = tmp.File("stray");
  fs::create_directories(stray);
  fs::copy_file(tmp.File("block") + "/config.json", stray + "/config.json");
  testing::SafetensorsBuilder with_stray;
  for (const auto& [name, e] : in.entries) {
    with_stray.Add(name, e.dtype, e.shape,
                   std::vector<uint8_t>(in.data(name), in.data(name) + in.size(name)));
  }
  with_stray.Add("model.norm.weight_scale_inv", "F32", {1, 1}, std::vector<uint8_t>(4, 0));
  testing::SafetensorsBuilder::WriteFile(stray + "/model.safetensors", with_stray.Build());
  r = Quantize(Options(stray, tmp.File("stray-out")));
  EXPECT_THAT(r.status().message(), HasSubstr("model.norm.weight, which is not an F8_E4M3 tensor"));
  EXPECT_FALSE(fs::exists(tmp.File("stray-out")));
}

// A dequantized tensor (kv_b_proj) that starts at an odd byte of its file, long enough that
// the writer's chunks end inside its elements (the writer hands the fill whole elements
// only): every bf16 value whole and in its place.
TEST(QuantizeTest, BlockScaledFp8DequantizesAtOddOffsets) {
  TempDir tmp;
  const std::string src = tmp.File("block");
  fs::create_directories(src);
  nlohmann::json config =
      ReadJson(std::string(STRATA_SOURCE_DIR) + "/tests/data/oracles/deepseek_v3/config.json");
  config["quantization_config"] = {{"quant_method", "fp8"},
                                   {"fmt", "e4m3"},
                                   {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {128, 128}}};
  std::ofstream(src + "/config.json") << config.dump();
  const int64_t rows = 2048, cols = 2560;  // 10 MB of bf16 out: several chunks
  std::vector<uint8_t> codes(rows * cols);
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<uint8_t>((i * 37 + i / 7) % 0x7e);
  std::vector<float> scales((rows / 128) * (cols / 128));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.001f * static_cast<float>(i + 1);
  testing::SafetensorsBuilder b;
  // 15 FP8 bytes and 1 bf16 row scale... then 6 bytes of row scales: kv_b_proj at an odd offset.
  b.Add("model.layers.0.self_attn.q_a_proj.weight", "F8_E4M3", {3, 5},
        std::vector<uint8_t>(15, 0x38));
  b.Add("model.layers.0.self_attn.q_a_proj.weight_scale_inv", "F32", {1, 1},
        testing::Bytes(std::vector<float>{0.5f}));
  b.Add("model.layers.0.self_attn.kv_b_proj.weight", "F8_E4M3", {rows, cols}, codes);
  b.Add("model.layers.0.self_attn.kv_b_proj.weight_scale_inv", "F32", {rows / 128, cols / 128},
        testing::Bytes(scales));
  testing::SafetensorsBuilder::WriteFile(src + "/model.safetensors", b.Build());
  auto result = Quantize(Options(src, tmp.File("channel")));
  ASSERT_TRUE(result.ok()) << result.status();
  const Tensors q = Read(tmp.File("channel") + "/model.safetensors");
  const std::string kv_b = "model.layers.0.self_attn.kv_b_proj.weight";
  ASSERT_EQ(q.entries.at(kv_b).dtype, "BF16");
  EXPECT_EQ(q.entries.at(kv_b).begin % 2, 1u) << "the case this test is for";
  const uint8_t* got = q.data(kv_b);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want =
          Fp8E4M3ToFloat(codes[r * cols + c]) * scales[(r / 128) * (cols / 128) + c / 128];
      uint16_t bits;
      std::memcpy(&bits, got + 2 * (r * cols + c), 2);
      ASSERT_EQ(bits, FloatToBf16(want)) << "(" << r << ", " << c << ")";
    }
  }
}

TEST(QuantizeTest, DemoModelLoadsAndLogitsStayClose) {
  TempDir tmp;
  const std::string out = tmp.File("demo-fp8");
  auto result = Quantize(Options(kDemo, out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->quantized_tensors, 8 * (4 + 16 * 3));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer_config.json"));
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(100 + 37 * i % 8000);
  const LogitError e = CompareLogits(kDemo, out, ids);
  std::cout << "demo: relative logit error " << e.relative << ", argmax agreement "
            << e.argmax_agreement << "\n";
  EXPECT_LT(e.relative, 0.05);
  EXPECT_GE(e.argmax_agreement, 0.85);
}

// A sharded checkpoint stays sharded the same way, with an index naming the scales too.
TEST(QuantizeTest, ShardedCheckpointKeepsItsShards) {
  TempDir tmp;
  MakeModelOptions make;
  make.shape = "tiny-qwen3";
  make.out_dir = tmp.File("bf16");
  make.num_threads = 2;
  make.max_shard_bytes = 64 << 10;
  auto made = MakeModel(make);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_GT(made->shards, 1);
  const std::string out = tmp.File("fp8");
  auto result = Quantize(Options(make.out_dir, out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->shards, made->shards);
  const nlohmann::json index = ReadJson(out + "/model.safetensors.index.json");
  const nlohmann::json& map = index.at("weight_map");
  uint64_t total = 0;
  std::set<std::string> files;
  for (const auto& [name, file] : map.items()) files.insert(file.get<std::string>());
  for (const std::string& file : files) {
    const Tensors t = Read(out + "/" + file);
    for (const auto& [name, e] : t.entries) {
      EXPECT_EQ(map.at(name), file) << name;
      total += e.end - e.begin;
    }
  }
  EXPECT_EQ(files.size(), static_cast<size_t>(made->shards));
  EXPECT_EQ(index.at("metadata").at("total_size"), total);
  EXPECT_EQ(map.size(), static_cast<size_t>(result->kept_tensors + 2 * result->quantized_tensors));
  const LogitError e = CompareLogits(make.out_dir, out, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_LT(e.relative, 0.15);
}

TEST(QuantizeTest, CalibrationReportsBothPerplexities) {
  TempDir tmp;
  const std::string out = tmp.File("demo-fp8");
  ASSERT_TRUE(Quantize(Options(kDemo, out)).ok());
  LocalEngineOptions engine;
  engine.num_threads = 2;
  engine.kv.memory_mb = 64;
  auto ppl = ComparePerplexity(
      kDemo, out, std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-calibration.jsonl", 4,
      engine);
  ASSERT_TRUE(ppl.ok()) << ppl.status();
  EXPECT_EQ(ppl->prompts, 4);
  EXPECT_GT(ppl->tokens, 0);
  EXPECT_GT(ppl->original, 1.0);
  EXPECT_NEAR(ppl->quantized / ppl->original, 1.0, 0.05);
}

// KV-cache scales calibrated on prompts go into the quantized model: one scalar a layer for keys
// and values, listed in an index made for the single-file checkpoint, the kv_cache_scheme set;
// an FP8 KV cache loads them instead of calibrating.
TEST(QuantizeTest, KvScalesFromCalibrationLoadInsteadOfCalibrating) {
  TempDir tmp;
  const std::string out = tmp.File("demo-fp8");
  ASSERT_TRUE(Quantize(Options(kDemo, out)).ok());
  LocalEngineOptions engine;
  engine.num_threads = 2;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) {
    prompts.emplace_back();
    for (int i = 0; i < 40 + 10 * p; ++i) prompts.back().push_back(100 + (37 * i + p) % 8000);
  }
  auto scales = CalibrateKvScales(out, prompts, engine);
  ASSERT_TRUE(scales.ok()) << scales.status();
  ASSERT_EQ(scales->k.size(), 8u);
  ASSERT_EQ(scales->v.size(), 8u);
  for (size_t l = 0; l < 8; ++l) {
    EXPECT_GT(scales->k[l], 0.0f);
    EXPECT_NE(scales->k[l], 1.0f) << "layer " << l << " kept the placeholder";
  }
  ASSERT_TRUE(AddKvScales(out, *scales).ok());

  const nlohmann::json config = ReadJson(out + "/config.json");
  EXPECT_EQ(config.at("quantization_config").at("kv_cache_scheme").at("strategy"), "tensor");
  const nlohmann::json index = ReadJson(out + "/model.safetensors.index.json");
  EXPECT_EQ(index.at("weight_map").at("model.layers.3.self_attn.v_scale"), "kv_scales.safetensors");
  EXPECT_EQ(index.at("weight_map").at("model.embed_tokens.weight"), "model.safetensors");

  engine.model_dir = out;
  engine.kv.dtype = KvDtype::kFp8;
  engine.kv.fp16_above_tokens = 0;
  auto loaded = LocalEngine::Create(engine);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE((*loaded)->kv().calibrating());
  for (size_t l = 0; l < 8; ++l) {
    EXPECT_FLOAT_EQ((*loaded)->kv().scales().k[l * 2], scales->k[l]);  // 2 KV heads, one scale
    EXPECT_FLOAT_EQ((*loaded)->kv().scales().v[l * 2 + 1], scales->v[l]);
  }
  auto logits = (*loaded)->Logits(prompts[0]);
  ASSERT_TRUE(logits.ok()) << logits.status();
  // A model with scales already is not calibrated again.
  EXPECT_TRUE(absl::IsFailedPrecondition(CalibrateKvScales(out, prompts, engine).status()));
}

TEST(QuantizeTest, Refusals) {
  TempDir tmp;
  // Missing model directory.
  auto r = Quantize(Options(tmp.File("nope"), tmp.File("out")));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no such model directory"));

  // An already FP8 model.
  const std::string fp8 = tmp.File("fp8");
  ASSERT_TRUE(Quantize(Options(kOracle, fp8)).ok());
  r = Quantize(Options(fp8, tmp.File("again")));
  EXPECT_THAT(r.status().message(), HasSubstr("already quantized"));
  EXPECT_FALSE(fs::exists(tmp.File("again")));

  // A non-empty destination needs --force, and is left alone without it.
  const std::string busy = tmp.File("busy");
  fs::create_directories(busy);
  std::ofstream(busy + "/keep.txt") << "x";
  r = Quantize(Options(kOracle, busy));
  EXPECT_THAT(r.status().message(), HasSubstr("--force"));
  EXPECT_TRUE(fs::exists(busy + "/keep.txt"));
  QuantizeOptions forced = Options(kOracle, busy);
  forced.force = true;
  ASSERT_TRUE(Quantize(forced).ok());
  EXPECT_FALSE(fs::exists(busy + "/keep.txt"));
  EXPECT_TRUE(fs::exists(busy + "/model.safetensors"));

  // KV scales come from calibration prompts only.
  QuantizeCommandOptions no_prompts;
  no_prompts.quantize = Options(kOracle, tmp.File("kv"));
  no_prompts.kv_scales = true;
  std::ostringstream ignored;
  EXPECT_THAT(RunQuantizeCommand(no_prompts, ignored).message(), HasSubstr("--calibration"));
  EXPECT_FALSE(fs::exists(tmp.File("kv")));

  // An architecture quantize does not know.
  const std::string llama = tmp.File("llama");
  fs::create_directories(llama);
  fs::copy_file(kOracle + "/model.safetensors", llama + "/model.safetensors");
  nlohmann::json config = ReadJson(kOracle + "/config.json");
  config["model_type"] = "llama";
  std::ofstream(llama + "/config.json") << config.dump();
  r = Quantize(Options(llama, tmp.File("llama-fp8")));
  EXPECT_THAT(r.status().message(), HasSubstr("model_type \"llama\""));

  // A failure half-way (a shard that does not parse) leaves nothing behind.
  const std::string broken = tmp.File("broken");
  fs::create_directories(broken);
  fs::copy_file(kOracle + "/config.json", broken + "/config.json");
  std::ofstream(broken + "/model.safetensors") << "not a safetensors file";
  r = Quantize(Options(broken, tmp.File("broken-fp8")));
  EXPECT_FALSE(r.ok());
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr("quantize-")));
  }
  EXPECT_FALSE(fs::exists(tmp.File("broken-fp8")));
}

}  // namespace
}  // namespace strata
