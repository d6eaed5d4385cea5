// strata plan on models/strata-demo: a few held-out sentences as calibration, the plan.json
// fields, counts that add up to tokens x top-k, and clear errors for bad input.
#include "tools/strata/plan_command.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
const std::string kHeldout = std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.txt";

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The first `n` sentences of the held-out text, one {"text": ...} line each.
std::vector<std::string> Sentences(int n) {
  std::ifstream in(kHeldout, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  std::vector<std::string> out;
  size_t start = text.find("There is no inspired title");
  while (static_cast<int>(out.size()) < n && start != std::string::npos) {
    const size_t end = text.find(". ", start);
    out.push_back(text.substr(start, end - start + 1));
    start = end + 2;
  }
  return out;
}

PlanOptions Options(const TempDir& dir, int workers) {
  PlanOptions options;
  options.engine.model_dir = kModel;
  options.engine.num_threads = 2;
  options.calibration_file = dir.File("calibration.jsonl");
  options.workers = workers;
  options.out = dir.File("plan.json");
  return options;
}

TEST(PlanCommandTest, PlansTheDemoModel) {
  TempDir dir;
  std::string calibration;
  for (const std::string& s : Sentences(4)) {
    calibration += nlohmann::json{{"text", s}}.dump() + "\n";
  }
  calibration += "\n{\"token_ids\": [10, 200, 3000, 40, 5], \"source\": \"ids\"}\n";
  WriteText(dir.File("calibration.jsonl"), calibration);

  std::ostringstream summary;
  ASSERT_TRUE(RunPlanCommand(Options(dir, 2), summary).ok());
  std::cout << summary.str();
  EXPECT_THAT(summary.str(), HasSubstr("5 prompts"));
  EXPECT_THAT(summary.str(), HasSubstr("imbalance contiguous -> plan"));

  std::ifstream in(dir.File("plan.json"));
  const nlohmann::json plan = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(plan.is_discarded());
  EXPECT_EQ(plan["format"], "strata-placement-plan");
  EXPECT_EQ(plan["model"], kModel);
  EXPECT_EQ(plan["workers"], 2);
  EXPECT_EQ(plan["num_layers"], 8);
  EXPECT_EQ(plan["num_experts"], 16);
  const int64_t tokens = plan["tokens"].get<int64_t>();
  EXPECT_GT(tokens, 50);
  const auto counts = plan["counts"].get<std::vector<std::vector<int64_t>>>();
  const auto assignment = plan["assignment"].get<std::vector<std::vector<int>>>();
  ASSERT_EQ(counts.size(), 8u);
  ASSERT_EQ(assignment.size(), 8u);
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    EXPECT_EQ(std::accumulate(counts[layer].begin(), counts[layer].end(), int64_t{0}),
              tokens * 4)  // top-4
        << "layer " << layer;
    ASSERT_EQ(assignment[layer].size(), 16u);
    for (int w : assignment[layer]) EXPECT_TRUE(w == 0 || w == 1);
  }
  EXPECT_EQ(plan["counted_layers"].size(), 8u);
  EXPECT_EQ(plan["gini"]["per_layer"].size(), 8u);
  EXPECT_GT(plan["gini"]["overall"].get<double>(), 0.0);
  for (const char* which : {"plan", "contiguous"}) {
    EXPECT_EQ(plan["imbalance"][which]["per_layer"].size(), 8u) << which;
    EXPECT_LE(plan["imbalance"][which]["mean"].get<double>(),
              plan["imbalance"][which]["max"].get<double>() + 1e-12)
        << which;
  }
  // Greedy is never worse than the contiguous split on the counts it was made from.
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_LE(plan["imbalance"]["plan"]["per_layer"][i].get<double>(),
              plan["imbalance"]["contiguous"]["per_layer"][i].get<double>() + 1e-12);
  }
  // What the router will load.
  auto loaded = LoadPlan(dir.File("plan.json"), 8, 16, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->plan.owner, assignment);
  EXPECT_EQ(loaded->counts, counts);
}

TEST(PlanCommandTest, ReadCalibrationNamesTheBadLine) {
  TempDir dir;
  const std::string path = dir.File("calibration.jsonl");
  EXPECT_EQ(ReadCalibration(dir.File("missing.jsonl"), nullptr).status().code(),
            absl::StatusCode::kNotFound);
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {"{\"token_ids\": [1, 2]}\nnot json\n", "line 2: not a JSON object"},
      {"{\"token_ids\": [1, 2]}\n\n{\"ids\": [1]}\n", "line 3: needs exactly one of"},
      {"{\"token_ids\": [1, 2], \"text\": \"a\"}\n", "line 1: needs exactly one of"},
      {"{\"token_ids\": [1, -2]}\n", "line 1: token_ids[1] must be a non-negative integer"},
      {"{\"token_ids\": []}\n", "line 1: the prompt has no tokens"},
      {"{\"text\": 5}\n", "line 1: \"text\" must be a string"},
      {"{\"text\": \"hello\"}\n", "line 1: \"text\" needs the model's tokenizer"},
      {"\n  \n", "no prompts"},
  };
  for (const auto& c : cases) {
    WriteText(path, c.text);
    const auto prompts = ReadCalibration(path, nullptr);
    EXPECT_EQ(prompts.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(prompts.status().message(), HasSubstr(c.error)) << c.text;
  }
  WriteText(path, "\r\n{\"token_ids\": [7, 8, 9]}\r\n{\"token_ids\": [1]}");
  const auto prompts = ReadCalibration(path, nullptr);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 2u);
  EXPECT_EQ((*prompts)[0].line, 2);
  EXPECT_EQ((*prompts)[0].ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ((*prompts)[1].line, 3);
}

TEST(PlanCommandTest, ClearErrors) {
  TempDir dir;
  WriteText(dir.File("calibration.jsonl"), "{\"token_ids\": [1, 2, 3]}\n{\"token_ids\": [8192]}\n");
  std::ostringstream out;
  EXPECT_THAT(RunPlanCommand(Options(dir, 0), out).message(), HasSubstr("at least 1"));
  EXPECT_THAT(RunPlanCommand(Options(dir, 17), out).message(),
              HasSubstr("--workers 17 is more than the model's 16 experts"));
  // An id outside the vocabulary: the engine's error, with the line.
  EXPECT_THAT(RunPlanCommand(Options(dir, 2), out).message(),
              HasSubstr("calibration.jsonl line 2: token id 8192"));
  PlanOptions no_file = Options(dir, 2);
  no_file.calibration_file = dir.File("missing.jsonl");
  EXPECT_EQ(RunPlanCommand(no_file, out).code(), absl::StatusCode::kNotFound);
  no_file.calibration_file.clear();
  EXPECT_THAT(RunPlanCommand(no_file, out).message(), HasSubstr("--calibration is required"));
  PlanOptions no_model = Options(dir, 2);
  no_model.engine.model_dir = dir.File("no-model");
  EXPECT_FALSE(RunPlanCommand(no_model, out).ok());
  EXPECT_FALSE(fs::exists(dir.File("plan.json")));
}

TEST(PlanCommandTest, AModelWithoutATokenizerTakesTokenIdsOnly) {
  TempDir dir;
  const std::string model = dir.File("model");
  fs::create_directory(model);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    fs::create_symlink(fs::path(kModel) / f, fs::path(model) / f);
  }
  PlanOptions options = Options(dir, 4);
  options.engine.model_dir = model;
  std::ostringstream out;
  WriteText(options.calibration_file, "{\"text\": \"In the beginning\"}\n");
  EXPECT_THAT(RunPlanCommand(options, out).message(),
              HasSubstr("line 1: \"text\" needs the model's tokenizer (tokenizer.json or "
                        "tiktoken.model), which it lacks"));
  WriteText(options.calibration_file, "{\"token_ids\": [1, 2, 3, 4, 5, 6, 7, 8]}\n");
  ASSERT_TRUE(RunPlanCommand(options, out).ok());
  auto plan = LoadPlan(options.out, 8, 16, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tokens, 8);
}

}  // namespace
}  // namespace strata
