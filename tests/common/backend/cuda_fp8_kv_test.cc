// FP8 keys and values on the GPU (the trained demo model): calibrated scales close to the CPU
// backend's, logits close to the CPU backend's FP8 cache, and a sequence that grows past
// fp16_above_tokens while decoding by graph replay is converted on the device and decodes the
// same tokens as without graphs. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "common/cuda/cuda_context.h"
#include "common/engine/local_engine.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";

LocalEngineOptions Options(const std::string& device, int64_t fp16_above) {
  LocalEngineOptions options;
  options.model_dir = kModel;
  options.device = device;
  options.kv.dtype = KvDtype::kFp8;
  options.kv.calibration_tokens = 32;
  options.kv.fp16_above_tokens = fp16_above;
  return options;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 131 + salt * 17 + 5) % 2000 + 10;
  return ids;
}

double Relative(const float* x, const float* ref, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / norm);
}

TEST(CudaFp8KvTest, CalibratesAndTracksTheCpuBackend) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu_engine = LocalEngine::Create(Options("cuda", 0));
  auto cpu_engine = LocalEngine::Create(Options("cpu", 0));
  ASSERT_TRUE(gpu_engine.ok()) << gpu_engine.status();
  ASSERT_TRUE(cpu_engine.ok()) << cpu_engine.status();
  const std::vector<int32_t> first = Prompt(48, 1);
  ASSERT_TRUE((*gpu_engine)->Logits(first).ok());
  ASSERT_TRUE((*cpu_engine)->Logits(first).ok());
  const KvScales& g = (*gpu_engine)->kv().scales();
  const KvScales& c = (*cpu_engine)->kv().scales();
  ASSERT_FALSE((*gpu_engine)->kv().calibrating());
  ASSERT_EQ(g.k.size(), c.k.size());
  // The GPU's activations are bf16 through every layer before, the CPU's float32: the maxima
  // agree to a few percent (2.2% at most measured on the H200).
  for (size_t i = 0; i < g.k.size(); ++i) {
    EXPECT_NEAR(g.k[i], c.k[i], 0.05 * c.k[i]) << i;
    EXPECT_NEAR(g.v[i], c.v[i], 0.05 * c.v[i]) << i;
  }
  const std::vector<int32_t> second = Prompt(200, 2);
  auto on_gpu = (*gpu_engine)->Logits(second);
  auto on_cpu = (*cpu_engine)->Logits(second);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok());
  const int64_t vocab = on_cpu->cols();
  std::vector<double> errors;
  int agree = 0;
  for (int64_t r = 0; r < on_cpu->rows(); ++r) {
    errors.push_back(Relative(on_gpu->row(r), on_cpu->row(r), vocab));
    const float* a = on_gpu->row(r);
    const float* b = on_cpu->row(r);
    agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2];
  std::cout << "fp8 KV, GPU against CPU: median row " << median << ", argmax " << agree << "/"
            << on_cpu->rows() << "\n";
  EXPECT_LT(median, 0.03);
  EXPECT_GE(agree, on_cpu->rows() * 9 / 10);
}

// Decodes by RunStep (one token a step, through the graphs where they apply) past the threshold
// and returns the last step's logits; `seq` stays held.
std::vector<float> DecodePast(LocalEngine& engine, PagedKvCache::SequenceId seq,
                              std::vector<int32_t>& tokens, int64_t until, int64_t threshold,
                              bool& widened_on_time) {
  const int64_t vocab = engine.config().vocab_size;
  auto step = engine.RunStep(seq, tokens, 0);
  EXPECT_TRUE(step.ok()) << step.status();
  std::vector<float> last(step->logits(static_cast<int64_t>(tokens.size()) - 1),
                          step->logits(static_cast<int64_t>(tokens.size()) - 1) + vocab);
  widened_on_time = true;
  for (int64_t pos = static_cast<int64_t>(tokens.size()); pos < until; ++pos) {
    tokens.push_back(
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    step = engine.RunStep(seq, {&tokens.back(), 1}, pos);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return last;
    last.assign(step->logits(0), step->logits(0) + vocab);
    widened_on_time &= engine.kv().wide(seq) == (pos + 1 > threshold);
  }
  return last;
}

TEST(CudaFp8KvTest, WidensOnTheDeviceAndKeepsDecoding) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kThreshold = 80;
  auto engine = LocalEngine::Create(Options("cuda", kThreshold));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Logits(Prompt(40, 3)).ok());  // calibrates
  ASSERT_FALSE((*engine)->kv().calibrating());

  std::vector<int32_t> tokens = Prompt(50, 4);
  const auto seq = (*engine)->AddSequence();
  ASSERT_FALSE((*engine)->kv().wide(seq));
  bool on_time = false;
  const std::vector<float> last = DecodePast(**engine, seq, tokens, 120, kThreshold, on_time);
  EXPECT_TRUE(on_time);
  EXPECT_TRUE((*engine)->kv().wide(seq));

  // A fresh pass over the same 120 tokens is 16-bit from the start; the converted sequence
  // differs only by its first 80 tokens' E4M3 rounding.
  auto whole = (*engine)->Logits(tokens);
  ASSERT_TRUE(whole.ok());
  const int64_t vocab = whole->cols();
  const double error = Relative(last.data(), whole->row(119), vocab);
  std::cout << "after widening on the device: last row " << error << " from a 16-bit pass\n";
  EXPECT_LT(error, 0.05);
  (*engine)->ReleaseSequence(seq);

  // Greedy generation across the threshold: graphs (the conversion before a replay) and
  // eager steps give the same tokens.
  LocalEngineOptions eager_options = Options("cuda", kThreshold);
  eager_options.cuda_graphs = false;
  auto eager = LocalEngine::Create(eager_options);
  ASSERT_TRUE(eager.ok());
  ASSERT_TRUE((*eager)->Logits(Prompt(40, 3)).ok());  // the same calibration
  GenerateOptions generate;
  generate.max_new_tokens = 60;
  generate.ignore_eos = true;
  const std::vector<int32_t> prompt = Prompt(50, 5);
  auto with_graphs = (*engine)->Generate(prompt, generate);
  auto without = (*eager)->Generate(prompt, generate);
  ASSERT_TRUE(with_graphs.ok()) << with_graphs.status();
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(*with_graphs, *without);
}

// Compaction on the device: a sequence whose blocks sit past a shrunk pool's end is moved
// below it (a copy kernel before the next step) and decodes exactly as without the move, with a
// bf16 and an FP8 cache.
TEST(CudaKvCompactionTest, MovedBlocksDecodeAsBefore) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const KvDtype dtype : {KvDtype::kAuto, KvDtype::kFp8}) {
    LocalEngineOptions options = Options("cuda", 0);
    options.kv.dtype = dtype;
    options.kv.memory_mb = 256;
    auto moved = LocalEngine::Create(options);
    auto still = LocalEngine::Create(options);
    ASSERT_TRUE(moved.ok() && still.ok());
    for (auto* engine : {&*moved, &*still}) {
      ASSERT_TRUE((*engine)->Logits(Prompt(40, 3)).ok());  // calibrates an FP8 cache
    }
    PagedKvCache& kv = (*moved)->kv();
    // A pad sequence takes the low blocks, so the measured one lands past them.
    const auto pad = (*moved)->AddSequence();
    ASSERT_TRUE((*moved)->RunStep(pad, Prompt(300, 6), 0).ok());
    std::vector<int32_t> tokens = Prompt(100, 7);
    const auto seq = (*moved)->AddSequence();
    const auto ref = (*still)->AddSequence();
    ASSERT_TRUE((*moved)->RunStep(seq, tokens, 0).ok());
    ASSERT_TRUE((*still)->RunStep(ref, tokens, 0).ok());
    (*moved)->ReleaseSequence(pad);
    const int keep = static_cast<int>(kv.blocks_held(seq)) + 2;
    int past = 0;
    for (int b : kv.block_table(seq)) past += b >= keep;
    ASSERT_GT(past, 0);
    auto resized = kv.Resize(keep);
    ASSERT_TRUE(resized.ok()) << resized.status();
    EXPECT_EQ(*resized, past);
    for (int b : kv.block_table(seq)) EXPECT_LT(b, keep);
    // Decode on both, token by token (graph replays where they apply).
    for (int64_t pos = 100; pos < 120; ++pos) {
      tokens.push_back(static_cast<int32_t>(pos % 50 + 20));
      auto a = (*moved)->RunStep(seq, {&tokens.back(), 1}, pos);
      auto b = (*still)->RunStep(ref, {&tokens.back(), 1}, pos);
      ASSERT_TRUE(a.ok() && b.ok());
      const int64_t vocab = (*moved)->config().vocab_size;
      ASSERT_EQ(std::vector<float>(a->logits(0), a->logits(0) + vocab),
                std::vector<float>(b->logits(0), b->logits(0) + vocab))
          << KvDtypeName(dtype) << " position " << pos;
    }
    (*moved)->ReleaseSequence(seq);
    (*still)->ReleaseSequence(ref);
  }
}

}  // namespace
}  // namespace strata
