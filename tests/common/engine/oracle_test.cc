// The CPU reference forward pass against logits and greedy tokens that Hugging Face
// transformers computed for the same weights (tests/data/oracles, made by
// scripts/make_oracles.py).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/engine/local_engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/oracles.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

using ::strata::testing::OracleNames;

struct EngineShape {
  int kv_block_size;
  int prefill_chunk;
};

class OracleTest : public ::testing::TestWithParam<std::tuple<std::string, EngineShape>> {
 protected:
  void SetUp() override {
    dir_ = (fs::path(STRATA_TEST_DATA_DIR) / "oracles" / std::get<0>(GetParam())).string();
    std::ifstream in(fs::path(dir_) / "oracle.json");
    oracle_ = nlohmann::json::parse(in);
    LocalEngineOptions options;
    options.model_dir = dir_;
    options.num_threads = 2;
    options.kv.block_size = std::get<1>(GetParam()).kv_block_size;
    options.prefill_chunk_tokens = std::get<1>(GetParam()).prefill_chunk;
    auto engine = LocalEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  std::string dir_;
  nlohmann::json oracle_;
  std::unique_ptr<LocalEngine> engine_;
};

TEST_P(OracleTest, LogitsMatchTransformers) {
  for (const auto& c : oracle_["cases"]) {
    const std::vector<int32_t> ids = c["all_ids"].get<std::vector<int32_t>>();
    auto logits = engine_->Logits(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->rows(), static_cast<int64_t>(ids.size()));
    for (size_t r = 0; r < ids.size(); ++r) {
      const std::vector<float> ref = c["logits"][r].get<std::vector<float>>();
      ASSERT_EQ(logits->cols(), static_cast<int64_t>(ref.size()));
      double diff = 0.0, norm = 0.0;
      for (size_t v = 0; v < ref.size(); ++v) {
        const double d = logits->row(r)[v] - ref[v];
        diff += d * d;
        norm += static_cast<double>(ref[v]) * ref[v];
      }
      const double rel = std::sqrt(diff) / std::sqrt(norm);
      EXPECT_LE(rel, 1e-4) << "row " << r << " of a " << ids.size() << "-token case";
    }
  }
}

TEST_P(OracleTest, GreedyTokensMatchTransformers) {
  for (const auto& c : oracle_["cases"]) {
    const std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
    const std::vector<int32_t> expected = c["greedy"].get<std::vector<int32_t>>();
    GenerateOptions options;
    options.max_new_tokens = static_cast<int>(expected.size());
    options.ignore_eos = true;
    auto tokens = engine_->Generate(prompt, options);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    EXPECT_EQ(*tokens, expected) << "prompt of " << prompt.size() << " tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllOracles, OracleTest,
    ::testing::Combine(::testing::ValuesIn(OracleNames()),
                       // The default shape, and small blocks and chunks that make a prompt
                       // span many blocks and several prefill steps.
                       ::testing::Values(EngineShape{32, 512}, EngineShape{4, 7})),
    [](const auto& info) {
      const EngineShape& shape = std::get<1>(info.param);
      return std::get<0>(info.param) + "_block" + std::to_string(shape.kv_block_size) + "_chunk" +
             std::to_string(shape.prefill_chunk);
    });

}  // namespace
}  // namespace strata
