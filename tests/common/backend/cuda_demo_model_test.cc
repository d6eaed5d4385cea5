// The trained demo model on the GPU against transformers' float32 figures on the held-out
// text: perplexity within 1% (bf16 experts) or 2% (FP8 experts, or FP8 keys and values), and
// greedy argmax agreement.
// Skips without a GPU.
#include <algorithm>
#include <fstream>
#include <set>

#include "common/cuda/cuda_context.h"
#include "common/engine/local_engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";

class CudaDemoModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDemoModelTest, HeldOutPerplexityAndArgmax) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::ifstream ref_in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-reference.json");
  const auto ref = nlohmann::json::parse(ref_in)["by_temperature"]["1.0"];
  // The held-out text's ids (tokenizer.json's encoding, checked in demo_model_test).
  std::ifstream ids_in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.ids.json");
  const auto ids = std::make_unique<std::vector<int32_t>>(
      nlohmann::json::parse(ids_in).get<std::vector<int32_t>>());
  // "WEIGHTS" or "WEIGHTS/kv-fp8": FP8 keys and values calibrated on the first chunk (kept
  // 16-bit), every later chunk coded.
  const std::string weights = GetParam().substr(0, GetParam().find('/'));
  const bool kv_fp8 = GetParam().find("kv-fp8") != std::string::npos;
  LocalEngineOptions options;
  options.model_dir = kModel;
  options.device = "cuda";
  options.expert_weights = weights;
  options.prefill_chunk_tokens = 256;
  if (kv_fp8) {
    options.kv.dtype = KvDtype::kFp8;
    options.kv.calibration_tokens = 256;
    options.kv.fp16_above_tokens = 0;
  }
  auto engine = LocalEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto expected_argmax = ref["argmax"].get<std::vector<int32_t>>();
  double nll = 0.0;
  int64_t scored = 0, agree = 0;
  for (size_t start = 0; start < ids->size(); start += 256) {
    const size_t len = std::min<size_t>(256, ids->size() - start);
    if (len < 2) continue;
    auto logits = (*engine)->Logits(absl::Span<const int32_t>(ids->data() + start, len));
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (size_t i = 0; i + 1 < len; ++i) {
      const float* row = logits->row(static_cast<int64_t>(i));
      const int64_t vocab = logits->cols();
      const float max = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - max));
      nll -= row[(*ids)[start + i + 1]] - max - std::log(sum);
      agree += (std::max_element(row, row + vocab) - row) == expected_argmax[scored];
      ++scored;
    }
  }
  const double perplexity = std::exp(nll / static_cast<double>(scored));
  const double expected = ref["perplexity"].get<double>();
  std::cout << GetParam() << ": perplexity " << perplexity << " (transformers float32 " << expected
            << "), argmax agreement " << agree << "/" << scored << "\n";
  EXPECT_NEAR(perplexity, expected, (weights == "fp8" || kv_fp8 ? 0.02 : 0.01) * expected);
  EXPECT_GE(static_cast<double>(agree) / static_cast<double>(scored), 0.95);
}

INSTANTIATE_TEST_SUITE_P(Weights, CudaDemoModelTest,
                         ::testing::Values("bf16", "fp8", "bf16/kv-fp8"), [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '/', '_');
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A 2,000-token prompt prefilled whole (the tensor-core attention over one 2,048-token chunk),
// in 256-token chunks (each attending to the cached prefix) and token by token (the decode
// attention only): the same greedy continuation.
TEST(CudaDemoModelTest, LongPromptPrefillMatchesTheAllDecodePath) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::ifstream ids_in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.ids.json");
  std::vector<int32_t> prompt = nlohmann::json::parse(ids_in).get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 2000u);
  prompt.resize(2000);
  std::vector<std::vector<int32_t>> continuations;
  for (int chunk : {2048, 256, 1}) {
    LocalEngineOptions options;
    options.model_dir = kModel;
    options.device = "cuda";
    options.prefill_chunk_tokens = chunk;
    auto engine = LocalEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    GenerateOptions g;
    g.max_new_tokens = 24;
    g.ignore_eos = true;
    auto tokens = (*engine)->Generate(prompt, g);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    continuations.push_back(*tokens);
  }
  EXPECT_EQ(continuations[0], continuations[2]) << "whole prompt against token by token";
  EXPECT_EQ(continuations[1], continuations[2]) << "256-token chunks against token by token";
}

// Decode steps replayed from one CUDA graph give exactly the tokens of eager launches (greedy
// by the device's argmax, and top-1 sampling by the host on the logits a replay copies on
// demand), with greedy steps launched one by one (mode 1) or each before the last one's token
// is read (mode 2, the default), and follow transformers' greedy continuations.
TEST(CudaDemoModelTest, GraphDecodeMatchesEagerDecode) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::ifstream in(kModel + "/reference.json");
  const auto prompts = nlohmann::json::parse(in)["generation"]["prompts"];
  constexpr int kModes = 3;
  std::vector<std::vector<int32_t>> by_mode[kModes], sampled_by_mode[kModes];
  int64_t overlapped[kModes] = {};
  for (int graphs = 0; graphs < kModes; ++graphs) {
    LocalEngineOptions options;
    options.model_dir = kModel;
    options.device = "cuda";
    options.cuda_graphs = graphs > 0;
    options.overlap_decode_steps = graphs == 2;
    auto engine = LocalEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) {
      GenerateOptions g;
      g.max_new_tokens = static_cast<int>(p["greedy_ids"].size());
      g.ignore_eos = true;
      auto tokens = (*engine)->Generate(p["input_ids"].get<std::vector<int32_t>>(), g);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      by_mode[graphs].push_back(*tokens);
      // Sampled from the top 1: the host's sampler on the logits the replay copies on demand,
      // which must pick what the device's argmax picked for the greedy run.
      g.sampling.temperature = 0.8f;
      g.sampling.top_k = 1;
      g.sampling.seed = 7;
      auto sampled = (*engine)->Generate(p["input_ids"].get<std::vector<int32_t>>(), g);
      ASSERT_TRUE(sampled.ok()) << sampled.status();
      sampled_by_mode[graphs].push_back(*sampled);
    }
    overlapped[graphs] = (*engine)->decode_graph_timing().overlapped;
  }
  EXPECT_EQ(by_mode[0], by_mode[1]);
  EXPECT_EQ(by_mode[0], by_mode[2]);
  for (int mode = 0; mode < kModes; ++mode) EXPECT_EQ(sampled_by_mode[mode], by_mode[mode]);
  EXPECT_EQ(overlapped[1], 0);
  EXPECT_GT(overlapped[2], 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto expected = prompts[i]["greedy_ids"].get<std::vector<int32_t>>();
    size_t same = 0;
    while (same < expected.size() && by_mode[2][i][same] == expected[same]) ++same;
    std::cout << "prompt " << i << ": first " << same << " of " << expected.size()
              << " greedy tokens equal transformers' (float32)\n";
  }
}

// Sampled decoding draws the same tokens whether the host picks them from eager steps' logits
// (mode 0), the device picks them in replayed steps (mode 1) or in steps launched ahead (mode
// 2): both take the Philox draws of (seed, step). A penalized request is sampled on the host in
// every mode.
TEST(CudaDemoModelTest, SampledDecodeIsTheSameOnTheDeviceAndTheHost) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::ifstream in(kModel + "/reference.json");
  const auto prompts = nlohmann::json::parse(in)["generation"]["prompts"];
  const SamplingParams settings[] = {
      {.temperature = 1.0f, .seed = 11},                 // Gumbel over the vocabulary
      {.temperature = 0.7f, .top_p = 0.9f, .seed = 12},  // nucleus
      {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 13},
      {.temperature = 1.0f, .seed = 14, .min_p = 0.05f},
      {.temperature = 0.7f, .top_p = 0.9f, .seed = 15, .repetition_penalty = 1.1f},
  };
  constexpr int kModes = 3;
  std::vector<std::vector<int32_t>> by_mode[kModes];
  int64_t overlapped[kModes] = {};
  for (int mode = 0; mode < kModes; ++mode) {
    LocalEngineOptions options;
    options.model_dir = kModel;
    options.device = "cuda";
    options.cuda_graphs = mode > 0;
    options.overlap_decode_steps = mode == 2;
    auto engine = LocalEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) {
      for (const SamplingParams& sampling : settings) {
        GenerateOptions g;
        g.max_new_tokens = 32;
        g.ignore_eos = true;
        g.sampling = sampling;
        auto tokens = (*engine)->Generate(p["input_ids"].get<std::vector<int32_t>>(), g);
        ASSERT_TRUE(tokens.ok()) << tokens.status();
        by_mode[mode].push_back(*tokens);
      }
    }
    overlapped[mode] = (*engine)->decode_graph_timing().overlapped;
  }
  for (size_t i = 0; i < by_mode[0].size(); ++i) {
    EXPECT_EQ(by_mode[0][i], by_mode[1][i]) << "request " << i << ": replayed against eager";
    EXPECT_EQ(by_mode[0][i], by_mode[2][i]) << "request " << i << ": ahead against eager";
    // Draws, not the arg-max: a sampled continuation has more than one distinct token.
    EXPECT_GT(std::set<int32_t>(by_mode[0][i].begin(), by_mode[0][i].end()).size(), 1u);
  }
  EXPECT_GT(overlapped[2], 0);  // sampled steps went ahead
}

}  // namespace
}  // namespace strata
