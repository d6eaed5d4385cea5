// plan.json: save and load round trip, the derived figures, and errors for bad or foreign plans.
#include "common/placement/plan_file.h"

#include <fstream>

#include "common/placement/placement_stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::TempDir;
using ::testing::HasSubstr;

PlanFile Sample() {
  PlanFile file;
  file.counts = {{40, 30, 20, 10, 0, 0}, {1, 1, 1, 1, 1, 95}, {0, 0, 0, 0, 0, 0}};
  file.plan = *PlacementPlan::Greedy(file.counts, 2);
  file.model = "models/example";
  file.tokens = 50;
  return file;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

TEST(PlanFileTest, RoundTrips) {
  TempDir dir;
  const PlanFile file = Sample();
  ASSERT_TRUE(SavePlan(dir.File("plan.json"), file).ok());
  auto loaded = LoadPlan(dir.File("plan.json"), 3, 6, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->plan.owner, file.plan.owner);
  EXPECT_EQ(loaded->plan.num_workers, 2);
  EXPECT_EQ(loaded->counts, file.counts);
  EXPECT_EQ(loaded->model, file.model);
  EXPECT_EQ(loaded->tokens, 50);
}

TEST(PlanFileTest, RecordsTheDerivedFigures) {
  TempDir dir;
  const PlanFile file = Sample();
  ASSERT_TRUE(SavePlan(dir.File("plan.json"), file).ok());
  const nlohmann::json json = ReadJson(dir.File("plan.json"));
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["format"], "strata-placement-plan");
  EXPECT_EQ(json["counted_layers"], nlohmann::json({0, 1}));
  const GiniReport gini = GiniByLayer(file.counts);
  EXPECT_DOUBLE_EQ(json["gini"]["overall"].get<double>(), gini.overall);
  EXPECT_EQ(json["gini"]["per_layer"].size(), 2u);
  const ImbalanceReport plan = *ExpectedImbalance(file.counts, file.plan);
  EXPECT_DOUBLE_EQ(json["imbalance"]["plan"]["max"].get<double>(), plan.max);
  EXPECT_DOUBLE_EQ(json["imbalance"]["plan"]["mean"].get<double>(), plan.mean);
  // Contiguous: layer 0 puts 90 of 100 on worker 0 (imbalance 0.8), layer 1 puts 97 of 100 on
  // worker 1 (0.94).
  EXPECT_NEAR(json["imbalance"]["contiguous"]["per_layer"][0].get<double>(), 0.8, 1e-12);
  EXPECT_NEAR(json["imbalance"]["contiguous"]["max"].get<double>(), 0.94, 1e-12);
}

TEST(PlanFileTest, SavesAPlanWithoutCounts) {
  TempDir dir;
  PlanFile file;
  file.plan = PlacementPlan::Contiguous(2, 4, 2);
  ASSERT_TRUE(SavePlan(dir.File("plan.json"), file).ok());
  auto loaded = LoadPlan(dir.File("plan.json"), 2, 4, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->plan.owner, file.plan.owner);
  EXPECT_TRUE(loaded->counts.empty());
}

TEST(PlanFileTest, RejectsAPlanForAnotherModelOrCluster) {
  TempDir dir;
  ASSERT_TRUE(SavePlan(dir.File("plan.json"), Sample()).ok());
  EXPECT_THAT(LoadPlan(dir.File("plan.json"), 48, 128, 2).status().message(),
              HasSubstr("plan.json: the plan is for a model of 3 layers x 6 experts; this model "
                        "has 48 x 128"));
  EXPECT_THAT(LoadPlan(dir.File("plan.json"), 3, 6, 4).status().message(),
              HasSubstr("the plan is for 2 workers; this cluster has 4"));
}

TEST(PlanFileTest, SaveErrors) {
  TempDir dir;
  PlanFile file = Sample();
  file.counts.pop_back();
  EXPECT_FALSE(SavePlan(dir.File("plan.json"), file).ok());  // counts of another shape
  EXPECT_EQ(SavePlan(dir.File("no/such/dir/plan.json"), Sample()).code(),
            absl::StatusCode::kInternal);
}

TEST(PlanFileTest, LoadErrorsNameTheField) {
  TempDir dir;
  const std::string path = dir.File("plan.json");
  EXPECT_EQ(ReadPlan(dir.File("missing.json")).status().code(), absl::StatusCode::kNotFound);
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {"not json", "not a JSON object"},
      {R"({"format": "other", "version": 1})", "\"format\" must be"},
      {R"({"format": "strata-placement-plan", "version": 2})", "\"version\" must be 1"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 1, "num_experts": 2})",
       "\"workers\" is missing"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 1, "num_experts": 2,
           "workers": 0, "assignment": [[0, 0]]})",
       "\"workers\" must be an integer in [1,"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 2, "num_experts": 2,
           "workers": 2, "assignment": [[0, 1]]})",
       "\"assignment\" must be an array of 2 layers"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 1, "num_experts": 2,
           "workers": 2, "assignment": [[0, 2]]})",
       "\"assignment\" layer 0 expert 1 must be an integer in [0, 1]"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 1, "num_experts": 2,
           "workers": 2, "assignment": [[0, 1]], "counts": [[1]]})",
       "\"counts\" layer 0 must be an array of 2 experts"},
      {R"({"format": "strata-placement-plan", "version": 1, "num_layers": 1, "num_experts": 2,
           "workers": 2, "assignment": [[0, 1]], "counts": [[1, -1]]})",
       "\"counts\" layer 0 expert 1 must be an integer"},
  };
  for (const auto& c : cases) {
    WriteText(path, c.text);
    const absl::StatusOr<PlanFile> plan = ReadPlan(path);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(plan.status().message(), HasSubstr(path)) << c.text;
  }
}

}  // namespace
}  // namespace strata
