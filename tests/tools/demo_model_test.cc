// models/strata-demo, the trained demo model, against what transformers recorded for it:
// tokenizer round trip, greedy continuations, held-out perplexity (also at lower router
// temperatures), argmax agreement and expert activation counts.
#include <filesystem>
#include <fstream>

#include "common/engine/local_engine.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/strata/eval_command.h"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
const std::string kHeldout = std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.txt";

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const nlohmann::json& HeldoutReference() {
  static const auto* ref = new nlohmann::json(
      ReadJson(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-reference.json"));
  return *ref;
}

LocalEngineOptions EngineOptions() {
  LocalEngineOptions options;
  options.model_dir = kModel;
  options.num_threads = 2;
  return options;
}

TEST(DemoModelTest, TokenizerRoundTripsTheHeldOutText) {
  auto tokenizer = Tokenizer::FromFile(kModel + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = ReadText(kHeldout);
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(static_cast<int64_t>(ids->size()), HeldoutReference()["tokens_in_file"].get<int64_t>());
  // The ids the GPU test reads instead of linking a tokenizer.
  EXPECT_EQ(*ids,
            ReadJson(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.ids.json")
                .get<std::vector<int32_t>>());
  auto decoded = (*tokenizer)->Decode(*ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);
}

TEST(DemoModelTest, GreedyContinuationsMatchTransformers) {
  auto engine = LocalEngine::Create(EngineOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto reference = ReadJson(kModel + "/reference.json");
  ASSERT_GE(reference["generation"]["prompts"].size(), 1u);
  for (const auto& p : reference["generation"]["prompts"]) {
    const auto prompt = p["input_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    GenerateOptions options;
    options.max_new_tokens = static_cast<int>(expected.size());
    options.ignore_eos = true;
    auto tokens = (*engine)->Generate(prompt, options);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    EXPECT_EQ(*tokens, expected) << p["prompt"];
  }
}

TEST(DemoModelTest, HeldOutPerplexityWithinOnePercentOfTransformers) {
  for (const char* temperature : {"1.0", "0.7"}) {
    EvalOptions options;
    options.engine = EngineOptions();
    options.engine.gate_temperature = std::stof(temperature);
    options.text_file = kHeldout;
    options.expert_stats = std::string(temperature) == "1.0";
    auto result = Evaluate(options);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto& ref = HeldoutReference()["by_temperature"][temperature];
    EXPECT_EQ(result->tokens, ref["tokens"].get<int64_t>());
    const double expected = ref["perplexity"].get<double>();
    EXPECT_NEAR(result->perplexity, expected, 0.01 * expected)
        << "gate temperature " << temperature;
    if (options.expert_stats) {
      EXPECT_EQ(result->expert_counts,
                ref["expert_counts"].get<std::vector<std::vector<int64_t>>>());
    }
  }
}

TEST(DemoModelTest, ArgmaxAgreesWithTransformers) {
  auto engine = LocalEngine::Create(EngineOptions());
  ASSERT_TRUE(engine.ok());
  auto tokenizer = Tokenizer::FromFile(kModel + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  auto ids = (*tokenizer)->Encode(ReadText(kHeldout));
  ASSERT_TRUE(ids.ok());
  const auto expected =
      HeldoutReference()["by_temperature"]["1.0"]["argmax"].get<std::vector<int32_t>>();
  const int window = HeldoutReference()["window"].get<int>();
  std::vector<int32_t> ours;
  for (size_t start = 0; start < ids->size(); start += window) {
    const size_t len = std::min<size_t>(window, ids->size() - start);
    if (len < 2) continue;
    auto logits = (*engine)->Logits(absl::Span<const int32_t>(ids->data() + start, len));
    ASSERT_TRUE(logits.ok());
    for (size_t i = 0; i + 1 < len; ++i) {
      const float* row = logits->row(static_cast<int64_t>(i));
      ours.push_back(static_cast<int32_t>(std::max_element(row, row + logits->cols()) - row));
    }
  }
  ASSERT_EQ(ours.size(), expected.size());
  size_t agree = 0;
  for (size_t i = 0; i < ours.size(); ++i) agree += ours[i] == expected[i];
  const double rate = static_cast<double>(agree) / static_cast<double>(ours.size());
  std::cout << "argmax agreement with transformers: " << agree << "/" << ours.size() << " = "
            << rate << "\n";
  // Float32 math on both sides: only exact ties in the top two logits could differ.
  EXPECT_GE(rate, 0.999);
}

TEST(DemoModelTest, GiniOfKnownCounts) {
  EXPECT_DOUBLE_EQ(Gini(std::vector<int64_t>{5, 5, 5, 5}), 0.0);
  EXPECT_NEAR(Gini(std::vector<int64_t>{0, 0, 0, 8}), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(Gini(std::vector<int64_t>{}), 0.0);
}

}  // namespace
}  // namespace strata
