// The whole model on the GPU (CudaRouterBackend + CudaExpertBackend through LocalEngine)
// against the transformers oracles (float32 references). The oracle models are random with a
// large init, so small bf16 differences are amplified through the layers on some rows; the
// test holds the typical (median) row to bf16 accuracy and the argmax to the reference wherever
// the reference's top-two margin is clear (at least a tenth of the row's RMS). The trained
// demo model is the tighter check (cuda_demo_model_test). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/cuda/cuda_context.h"
#include "common/engine/local_engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/oracles.h"
#include "tests/testing/temp_dir.h"
#include "tools/strata/make_model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

using ::strata::testing::OracleNames;

class CudaEngineTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaEngineTest, MatchesTransformers) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto& [name, weights] = GetParam();
  const std::string dir = (fs::path(STRATA_TEST_DATA_DIR) / "oracles" / name).string();
  std::ifstream in(fs::path(dir) / "oracle.json");
  const auto oracle = nlohmann::json::parse(in);
  LocalEngineOptions options;
  options.model_dir = dir;
  options.device = "cuda";
  options.expert_weights = weights;
  options.prefill_chunk_tokens = 64;  // several chunks for the long prompts
  auto engine = LocalEngine::Create(options);
  if (absl::IsUnimplemented(engine.status())) GTEST_SKIP() << engine.status().message();
  ASSERT_TRUE(engine.ok()) << engine.status();
  // FP8 rounds seven matrices a layer (q, k, v, o and the experts' three, about 3% each) and
  // the random nets amplify that, some more than others (median row 13% for qwen3_moe_hd64,
  // 22-29% for gpt_oss_hd64, qwen2_moe_hd64 and mixtral_hd128 on the H200). Against bf16
  // transformers this only bounds gross errors (a wrong kernel is ~100% off); the FP8 kernels
  // are checked exactly against the CPU backend on the same FP8 weights
  // (CudaEngineFp8CheckpointTest), and the trained demo model holds FP8 to perplexity within
  // 2% (cuda_demo_model_test).
  const double tolerance = weights == "fp8" ? 0.35 : 3e-2;
  std::vector<double> errors;
  int clear_rows = 0, agreeing = 0;
  for (const auto& c : oracle["cases"]) {
    const auto ids = c["all_ids"].get<std::vector<int32_t>>();
    auto logits = (*engine)->Logits(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (size_t r = 0; r < ids.size(); ++r) {
      const auto ref = c["logits"][r].get<std::vector<float>>();
      double diff = 0, norm = 0;
      size_t best = 0, second = 1;
      for (size_t v = 0; v < ref.size(); ++v) {
        const float out = logits->row(static_cast<int64_t>(r))[v];
        ASSERT_FALSE(std::isnan(out));
        diff += (out - ref[v]) * (out - ref[v]);
        norm += ref[v] * ref[v];
        if (ref[v] > ref[best]) {
          second = best;
          best = v;
        } else if (v != best && ref[v] > ref[second]) {
          second = v;
        }
      }
      errors.push_back(std::sqrt(diff / norm));
      const double row_rms = std::sqrt(norm / ref.size());
      if (ref[best] - ref[second] > 0.1 * row_rms) {
        ++clear_rows;
        const float* row = logits->row(static_cast<int64_t>(r));
        agreeing += static_cast<size_t>(std::max_element(row, row + ref.size()) - row) == best;
      }
    }
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2];
  const double p90 = errors[errors.size() * 9 / 10];
  std::cout << name << " " << weights << ": row rel err median " << median << ", p90 " << p90
            << ", worst " << errors.back() << "; argmax " << agreeing << "/" << clear_rows
            << " on clear rows\n";
  EXPECT_LE(median, tolerance);
  EXPECT_GT(clear_rows, 0);
  // FP8 weights flip more of a chaotic random net's close calls (67-81% kept on the H200).
  EXPECT_GE(agreeing, clear_rows * (weights == "fp8" ? 60 : 95) / 100);
}

// The logits of `ids` from the checkpoint in `dir` on `device`, experts and attention as
// `experts` and `attention` say; empty after a recorded failure.
std::vector<float> CheckpointLogits(const std::string& dir, const std::string& device,
                                    const std::string& experts, const std::string& attention,
                                    const std::vector<int32_t>& ids) {
  LocalEngineOptions options;
  options.model_dir = dir;
  options.device = device;
  options.expert_weights = experts;
  options.attention_weights = attention;
  auto engine = LocalEngine::Create(options);
  if (!engine.ok()) {
    ADD_FAILURE() << device << " " << experts << ": " << engine.status();
    return {};
  }
  auto logits = (*engine)->Logits(ids);
  if (!logits.ok()) {
    ADD_FAILURE() << device << " " << experts << ": " << logits.status();
    return {};
  }
  return std::vector<float>(logits->data(), logits->data() + logits->size());
}

double RelativeError(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / norm);
}

// One layer of `shape` (make-model's cut: a MoE layer), FP8, into `dir`.
bool MakeFp8Layer(const std::string& shape, const std::string& dir) {
  MakeModelOptions make;
  make.shape = shape;
  make.layers = 1;
  make.out_dir = dir;
  make.dtype = "fp8";
  make.num_threads = 0;
  const absl::StatusOr<MakeModelResult> made = MakeModel(make);
  if (!made.ok()) ADD_FAILURE() << shape << ": " << made.status();
  return made.ok();
}

// A checkpoint with FP8 E4M3 experts and row scales (`strata make-model --dtype fp8`) on the
// GPU, dequantized to bf16 or uploaded as FP8 as it is, against the CPU backend on the same
// checkpoint.
TEST(CudaEngineFp8CheckpointTest, MatchesTheCpuBackend) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  // One layer of the real shape: the CUDA attention kernels take head_dim 64/128/256.
  const std::string dir = tmp.File("fp8");
  ASSERT_TRUE(MakeFp8Layer("qwen3-30b-a3b", dir));
  const std::vector<int32_t> ids = {5, 17, 3, 99, 42, 7, 250, 11};
  // The checkpoint's attention is bf16: quantizing it too would test FP8 attention, which the
  // oracle test above bounds, rather than the FP8 experts going up as they are.
  const std::vector<float> cpu = CheckpointLogits(dir, "cpu", "bf16", "bf16", ids);
  ASSERT_FALSE(cpu.empty());
  for (const char* weights : {"bf16", "fp8"}) {
    const std::vector<float> gpu = CheckpointLogits(dir, "cuda", weights, "bf16", ids);
    ASSERT_EQ(gpu.size(), cpu.size());
    std::cout << "fp8 checkpoint on the GPU, " << weights << " at load: logits relative error "
              << RelativeError(gpu, cpu) << "\n";
    // The same weights on both sides (FP8 experts go up as they are, or dequantized to bf16
    // with at most 2^-8 relative error): what is left is bf16 activations (METHOD.md, 1e-2).
    EXPECT_LT(RelativeError(gpu, cpu), 3e-2) << weights;
  }
}

// One MoE layer of DeepSeek-V3's real shape (128 heads of latent attention at rank 512, 256
// experts in 8 groups, FP8 as DeepSeek ships it but per row): the GPU against the CPU backend.
TEST(CudaEngineFp8CheckpointTest, DeepseekV3LayerMatchesTheCpuBackend) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = tmp.File("dsv3");
  ASSERT_TRUE(MakeFp8Layer("deepseek-v3", dir));
  const std::vector<int32_t> ids = {5, 17, 3, 99, 42, 7, 250, 11, 1000, 64000};
  const std::vector<float> cpu = CheckpointLogits(dir, "cpu", "fp8", "fp8", ids);
  ASSERT_FALSE(cpu.empty());
  const std::vector<float> gpu = CheckpointLogits(dir, "cuda", "fp8", "fp8", ids);
  ASSERT_EQ(gpu.size(), cpu.size());
  // Per token: a token whose top 8 of 256 sigmoid scores sit closer than bf16 rounding may pick
  // another expert on each side, and its row then differs by that expert's whole share.
  const size_t vocab = cpu.size() / ids.size();
  std::vector<double> rows;
  for (size_t t = 0; t < ids.size(); ++t) {
    rows.push_back(
        RelativeError(std::vector<float>(gpu.begin() + t * vocab, gpu.begin() + (t + 1) * vocab),
                      std::vector<float>(cpu.begin() + t * vocab, cpu.begin() + (t + 1) * vocab)));
    std::cout << "deepseek-v3 layer on the GPU, token " << t << ": logits relative error "
              << rows.back() << "\n";
  }
  std::sort(rows.begin(), rows.end());
  EXPECT_LT(rows[rows.size() / 2], 3e-2);
}

INSTANTIATE_TEST_SUITE_P(AllOracles, CudaEngineTest,
                         ::testing::Combine(::testing::ValuesIn(OracleNames()),
                                            ::testing::Values("bf16", "fp8")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace strata
