// FP8 keys and values through the CPU engine: calibrated on the first tokens (16-bit until
// then), close to the float32 cache after, and a sequence growing past fp16_above_tokens is
// converted to 16-bit mid-generation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/local_engine.h"
#include "common/engine/model_stack.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/safetensors_builder.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

LocalEngineOptions Options(KvDtype dtype) {
  LocalEngineOptions options;
  options.model_dir =
      (std::filesystem::path(STRATA_TEST_DATA_DIR) / "oracles" / "qwen3_moe").string();
  options.num_threads = 1;
  options.kv.dtype = dtype;
  options.kv.calibration_tokens = 16;
  options.kv.fp16_above_tokens = 0;
  return options;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + salt * 11 + 3) % 150 + 1;
  return ids;
}

// Root-mean-square difference of two logit tables over the reference's norm, and the share
// of rows whose argmax agrees.
struct Compare {
  double relative = 0;
  double argmax_agree = 0;
};
Compare CompareLogits(const Tensor& a, const Tensor& ref) {
  double diff = 0, norm = 0;
  int agree = 0;
  for (int64_t r = 0; r < ref.rows(); ++r) {
    const float* x = a.row(r);
    const float* y = ref.row(r);
    for (int64_t v = 0; v < ref.cols(); ++v) {
      diff += (x[v] - y[v]) * (x[v] - y[v]);
      norm += y[v] * y[v];
    }
    agree += std::max_element(x, x + ref.cols()) - x == std::max_element(y, y + ref.cols()) - y;
  }
  return {std::sqrt(diff / norm), static_cast<double>(agree) / static_cast<double>(ref.rows())};
}

TEST(Fp8KvEngineTest, CalibratesThenTracksTheFloatCache) {
  auto reference = LocalEngine::Create(Options(KvDtype::kAuto));
  auto fp8 = LocalEngine::Create(Options(KvDtype::kFp8));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  PagedKvCache& kv = (*fp8)->kv();
  ASSERT_TRUE(kv.calibrating());

  // The first prompt calibrates: its keys and values are kept in bf16.
  const std::vector<int32_t> first = Prompt(24, 1);
  auto ref_first = (*reference)->Logits(first);
  auto fp8_first = (*fp8)->Logits(first);
  ASSERT_TRUE(ref_first.ok() && fp8_first.ok());
  ASSERT_FALSE(kv.calibrating());
  const Compare bf16 = CompareLogits(*fp8_first, *ref_first);
  EXPECT_LT(bf16.relative, 0.01);
  for (float s : kv.scales().k) {
    EXPECT_GT(s, 0.0f);
    EXPECT_NE(s, 1.0f);  // 1 is what a head that saw nothing gets
  }

  // Later prompts are coded in E4M3.
  const std::vector<int32_t> second = Prompt(40, 2);
  auto ref_second = (*reference)->Logits(second);
  auto fp8_second = (*fp8)->Logits(second);
  ASSERT_TRUE(ref_second.ok() && fp8_second.ok());
  const Compare coded = CompareLogits(*fp8_second, *ref_second);
  std::cout << "logits from the float32 cache: calibrating (bf16) " << bf16.relative << ", E4M3 "
            << coded.relative << " (argmax " << coded.argmax_agree << ")\n";
  EXPECT_GT(coded.relative, bf16.relative);  // the codes do change the keys and values
  EXPECT_LT(coded.relative, 0.12);  // the random net amplifies: a wrong kernel is ~100% off
  EXPECT_GE(coded.argmax_agree, 0.9);
}

// Feeds `tokens` one step at a time after a 12-token prefill; returns the last row's logits.
std::vector<float> StepThrough(LocalEngine& engine, absl::Span<const int32_t> tokens,
                               std::vector<bool>* wide_after) {
  const auto seq = engine.AddSequence();
  auto step = engine.RunStep(seq, tokens.first(12), 0);
  EXPECT_TRUE(step.ok()) << step.status();
  for (int64_t pos = 12; pos < std::ssize(tokens) && step.ok(); ++pos) {
    step = engine.RunStep(seq, tokens.subspan(pos, 1), pos);
    EXPECT_TRUE(step.ok()) << step.status();
    if (wide_after != nullptr) wide_after->push_back(engine.kv().wide(seq));
  }
  std::vector<float> last(step->logits(0), step->logits(0) + engine.config().vocab_size);
  engine.ReleaseSequence(seq);
  return last;
}

double Relative(const std::vector<float>& x, const float* ref) {
  double diff = 0, norm = 0;
  for (size_t v = 0; v < x.size(); ++v) {
    diff += (x[v] - ref[v]) * (x[v] - ref[v]);
    norm += ref[v] * ref[v];
  }
  return std::sqrt(diff / norm);
}

TEST(Fp8KvEngineTest, ASequenceGrowingPastTheThresholdTurnsSixteenBit) {
  // Two caches calibrated alike: one switches at 20 tokens, one never does.
  LocalEngineOptions options = Options(KvDtype::kFp8);
  options.kv.fp16_above_tokens = 20;
  auto switching = LocalEngine::Create(options);
  auto coded = LocalEngine::Create(Options(KvDtype::kFp8));
  ASSERT_TRUE(switching.ok() && coded.ok());
  ASSERT_TRUE((*switching)->Logits(Prompt(16, 3)).ok());  // calibrates
  ASSERT_TRUE((*coded)->Logits(Prompt(16, 3)).ok());
  ASSERT_EQ((*switching)->kv().scales().k, (*coded)->kv().scales().k);

  // 12 prompt tokens (FP8) and 20 single-token steps: the step to position 20 converts.
  const std::vector<int32_t> tokens = Prompt(32, 4);
  std::vector<bool> wide;
  const std::vector<float> switched = StepThrough(**switching, tokens, &wide);
  ASSERT_EQ(wide.size(), 20u);
  for (size_t i = 0; i < wide.size(); ++i) {
    EXPECT_EQ(wide[i], 12 + i + 1 > 20) << "after position " << 12 + i;
  }
  const std::vector<float> all_coded = StepThrough(**coded, tokens, nullptr);

  // Against a pass that is 16-bit from the start (32 tokens: wide at once), the switched
  // sequence (its first 20 tokens E4M3) is closer than the one coded throughout.
  auto sixteen_bit = (*switching)->Logits(tokens);
  ASSERT_TRUE(sixteen_bit.ok());
  const double switched_error = Relative(switched, sixteen_bit->row(31));
  const double coded_error = Relative(all_coded, sixteen_bit->row(31));
  std::cout << "last row from a 16-bit pass: switched at 20 " << switched_error
            << ", coded throughout " << coded_error << "\n";
  EXPECT_LT(switched_error, coded_error);
  EXPECT_GT(switched_error, 0.0);  // its first 20 tokens did keep E4M3's rounding
}

// A pool that cannot hold one 16-bit sequence just past fp16_above_tokens is refused at start.
TEST(Fp8KvEngineTest, AThresholdThatCannotFitIsAnError) {
  ModelStackOptions options;
  options.num_threads = 1;
  options.kv.block_size = 32;
  options.kv_blocks = 10;
  options.kv.dtype = KvDtype::kFp8;
  options.kv.fp16_above_tokens = 1000;
  const std::string dir = Options(KvDtype::kFp8).model_dir;
  auto stack = ModelStack::Create(dir, options);
  ASSERT_FALSE(stack.ok());
  EXPECT_NE(stack.status().message().find("kv_cache.fp16_above_tokens (1000) cannot fit"),
            std::string::npos)
      << stack.status();
  options.kv.fp16_above_tokens = 100;  // 4 blocks, 16-bit: 8 of the 10
  EXPECT_TRUE(ModelStack::Create(dir, options).ok());
}

// The oracle model with per-layer KV scales added as vLLM's FP8 checkpoints carry them (a
// second shard and an index naming both): no calibration, the scales as written, broadcast to
// the KV heads (or one per head). Some layers without them is an error.
class CheckpointScalesTest : public ::testing::Test {
 protected:
  // Writes the model to dir_ with k_scale / v_scale for the first `layers` layers.
  void WriteModel(int layers, bool per_head) {
    namespace fs = std::filesystem;
    const fs::path src = Options(KvDtype::kFp8).model_dir;
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
      fs::copy_file(src / f, fs::path(dir_.path()) / f, fs::copy_options::overwrite_existing);
    }
    // The original shard's tensor names, from its header.
    std::ifstream in(src / "model.safetensors", std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, ' ');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const nlohmann::json tensors = nlohmann::json::parse(header);
    nlohmann::json index;
    for (const auto& [name, value] : tensors.items()) {
      if (name != "__metadata__") index["weight_map"][name] = "model.safetensors";
    }
    testing::SafetensorsBuilder scales;
    for (int l = 0; l < layers; ++l) {
      for (const char* kind : {"k_scale", "v_scale"}) {
        const std::string name = absl::StrCat("model.layers.", l, ".self_attn.", kind);
        const int n = per_head ? 2 : 1;
        std::vector<uint8_t> bytes(4 * n);
        for (int h = 0; h < n; ++h) {
          const float v = 0.01f * (l + 1) * (kind[0] == 'k' ? 1 : 2) * (h + 1);
          std::memcpy(bytes.data() + 4 * h, &v, 4);
        }
        scales.Add(name, "F32", per_head ? std::vector<int64_t>{n} : std::vector<int64_t>{},
                   std::move(bytes));
        index["weight_map"][name] = "kv_scales.safetensors";
      }
    }
    std::ofstream(fs::path(dir_.path()) / "kv_scales.safetensors", std::ios::binary)
        << scales.Build();
    std::ofstream(fs::path(dir_.path()) / "model.safetensors.index.json") << index.dump();
  }

  absl::StatusOr<std::unique_ptr<LocalEngine>> Engine() {
    LocalEngineOptions options = Options(KvDtype::kFp8);
    options.model_dir = dir_.path();
    return LocalEngine::Create(options);
  }

  testing::TempDir dir_;
};

TEST_F(CheckpointScalesTest, ReplaceCalibration) {
  WriteModel(3, /*per_head=*/false);
  auto engine = Engine();
  ASSERT_TRUE(engine.ok()) << engine.status();
  const PagedKvCache& kv = (*engine)->kv();
  ASSERT_FALSE(kv.calibrating());
  ASSERT_EQ(kv.scales().k.size(), 6u);  // 3 layers x 2 KV heads
  EXPECT_FLOAT_EQ(kv.scales().k[0], 0.01f);
  EXPECT_FLOAT_EQ(kv.scales().k[1], 0.01f);  // broadcast
  EXPECT_FLOAT_EQ(kv.scales().v[4], 0.06f);
  EXPECT_FALSE((*engine)->kv().WantsWide(10));  // coded from the first request
  EXPECT_TRUE((*engine)->Logits(Prompt(20, 1)).ok());
  EXPECT_EQ((*engine)->kv().observed_tokens(), 0);
}

TEST_F(CheckpointScalesTest, PerHeadScales) {
  WriteModel(3, /*per_head=*/true);
  auto engine = Engine();
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FLOAT_EQ((*engine)->kv().scales().k[0], 0.01f);
  EXPECT_FLOAT_EQ((*engine)->kv().scales().k[1], 0.02f);
}

TEST_F(CheckpointScalesTest, SomeLayersOnlyIsAnError) {
  WriteModel(2, /*per_head=*/false);
  auto engine = Engine();
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("4 of the 6"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace strata
