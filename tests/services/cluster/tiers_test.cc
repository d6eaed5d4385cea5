// Expert tiers through the whole cluster (`strata up` with a memory budget smaller than the
// model's experts): the same greedy tokens as the model in one process, through cold loads
// and prefetch; the CPU tier of strata-expert-store; the hot ratio changed at run time.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/run_strata.h"
#include "tests/testing/tier_stats.h"

namespace strata {
namespace {

using ::strata::testing::AdminClient;
using ::strata::testing::ClusterProcess;
using ::strata::testing::FirstTokens;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::PrintTiers;
using ::strata::testing::RouterStats;
using ::strata::testing::RunStrata;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
// strata-demo's experts: 8 layers x 16 experts x 240 KiB = 30 MiB, 15 MiB per worker of two.
// 8 MiB holds 18 slots after the step buffers: the hot set and one layer's experts.
constexpr char kBudget[] = "--gpu-memory-budget=8MiB";

// Prompts cut from the held-out text's token ids.
std::vector<std::vector<uint32_t>> Prompts() {
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.ids.json");
  const auto ids = nlohmann::json::parse(in).get<std::vector<uint32_t>>();
  std::vector<std::vector<uint32_t>> prompts;
  for (size_t start : {0, 700, 2100}) {
    const size_t len = 12 + start % 40;
    prompts.emplace_back(ids.begin() + start, ids.begin() + start + len);
  }
  return prompts;
}

std::string IdList(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// Greedy tokens of the model in this process (no cluster, no tiers).
std::vector<uint32_t> InProcess(const std::vector<uint32_t>& prompt, int n) {
  const auto r = RunStrata("generate --model " + kModel + " --threads 1 --ignore-eos --ids " +
                           IdList(prompt) + " --max-new-tokens " + std::to_string(n));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return nlohmann::json::parse(r.out)["token_ids"].get<std::vector<uint32_t>>();
}

std::vector<uint32_t> Generate(const std::string& address, const std::vector<uint32_t>& prompt,
                               int n) {
  const auto g = ::strata::testing::GenerateGreedy(address, prompt, n);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  return g.tokens;
}

TEST(TiersTest, ModelLargerThanTheBudgetGivesTheSameTokens) {
  ClusterProcess cluster({"--model=" + kModel, "--workers=2", "--threads=1", kBudget});
  ASSERT_FALSE(cluster.address().empty());
  for (const auto& prompt : Prompts()) {
    EXPECT_EQ(Generate(cluster.address(), prompt, 24), InProcess(prompt, 24));
  }
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("budget 8MiB", stats);
  ASSERT_EQ(stats.workers_size(), 2);
  for (const v1::WorkerStats& w : stats.workers()) {
    const v1::TierCounters& t = w.tiers();
    EXPECT_GT(t.misses(), 0u);
    EXPECT_GT(t.evictions(), 0u);
    EXPECT_GT(t.warm_hits() + t.hot_hits(), 0u);
    EXPECT_GT(t.prefetch_hits(), 0u);
    EXPECT_EQ(t.slot_bytes(), 245760u);
    EXPECT_LT((t.hot_slots() + t.warm_slots()) * t.slot_bytes(), 8u << 20);
  }
  // The next layer's gate on this layer's output is a good guess on this model.
  EXPECT_GT(stats.prefetch_correct(), stats.prefetch_actual() / 2);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(TiersTest, CpuTierComputesColdExperts) {
  ClusterProcess cluster({"--model=" + kModel, "--workers=1", "--threads=1", kBudget,
                          "--cold-experts=cpu", "--prefetch=false"});
  ASSERT_FALSE(cluster.address().empty());
  const auto prompt = Prompts()[1];
  EXPECT_EQ(Generate(cluster.address(), prompt, 16), InProcess(prompt, 16));
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("cpu tier", stats);
  ASSERT_EQ(stats.workers_size(), 1);
  EXPECT_GT(stats.workers(0).tiers().cpu_tier_experts(), 0u);
  EXPECT_EQ(stats.prefetch_actual(), 0u);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(TiersTest, HotRatioChangesWhileRequestsRun) {
  ClusterProcess cluster(
      {"--model=" + kModel, "--workers=2", "--threads=1", kBudget, "--hot-ratio=0"});
  ASSERT_FALSE(cluster.address().empty());
  const auto prompts = Prompts();
  std::vector<std::future<Generated>> running;
  FirstTokens first;
  for (const auto& p : prompts) {
    running.push_back(GenerateGreedyAsync(cluster.address(), p, 48, first.Callback()));
  }
  ASSERT_TRUE(first.Wait()) << "no request produced a token";  // generation is under way
  AdminClient admin(cluster.address());
  ASSERT_TRUE(admin.ok());
  for (float ratio : {1.0f, 0.1f, -1.0f}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v1::SetHotRatioRequest request;
    if (ratio < 0) {
      request.set_automatic(true);
    } else {
      request.set_hot_ratio(ratio);
    }
    v1::SetHotRatioResponse response;
    ASSERT_TRUE(admin->SetHotRatio(admin.Context().get(), request, &response).ok());
    EXPECT_EQ(response.automatic(), ratio < 0);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generated g = running[i].get();
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, InProcess(prompts[i], 48));
  }
  v1::SetHotRatioRequest bad;
  bad.set_hot_ratio(1.5f);
  v1::SetHotRatioResponse response;
  EXPECT_EQ(admin->SetHotRatio(admin.Context().get(), bad, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Short contexts under the default policy: 0.35 of 64 owned experts, capped by the slots.
  Generate(cluster.address(), prompts[0], 2);
  const v1::StatsResponse stats = RouterStats(cluster.address());
  EXPECT_TRUE(stats.hot_ratio_automatic());
  EXPECT_FLOAT_EQ(stats.hot_ratio(), 0.35f);
  ASSERT_EQ(stats.workers_size(), 2);
  for (const v1::WorkerStats& w : stats.workers()) EXPECT_EQ(w.tiers().hot_slots(), 2u);
  EXPECT_EQ(cluster.Stop(), 0);
}

// One budget for the KV pool and the workers' slots: a context past the policy's step lowers
// the hot ratio, the workers lend the slots of the experts leaving their hot sets, and the pool
// grows by them, so a prompt longer than the pool's start is served (the same tokens); short
// contexts give the memory back to the workers.
TEST(TiersTest, LongContextsBorrowExpertMemoryForTheKvPool) {
  // 12 MiB a worker: 47 slots of 240 KiB. A 256 KiB block: 4 MiB of KV is 16 blocks, 512
  // tokens. Past 128 tokens the ratio drops from 0.35 to 0.20: 64 owned x 0.15 = 10 slots lent
  // by each worker (13 hot and 24 warm stay): 20 slots, 18 blocks.
  ClusterProcess cluster({"--model=" + kModel, "--workers=2", "--threads=1",
                          "--gpu-memory-budget=12MiB", "--kv-cache-mb=4", "--max-batch-tokens=128",
                          "--hot-ratio-policy=128:0.35,0.2", "--kv-cache-share-expert-memory"});
  ASSERT_FALSE(cluster.address().empty());
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.ids.json");
  const auto ids = nlohmann::json::parse(in).get<std::vector<uint32_t>>();
  const std::vector<uint32_t> long_prompt(ids.begin(), ids.begin() + 600);
  v1::StatsResponse stats = RouterStats(cluster.address());
  EXPECT_EQ(stats.total_kv_blocks(), 16u);
  EXPECT_EQ(Generate(cluster.address(), long_prompt, 40), InProcess(long_prompt, 40));
  stats = RouterStats(cluster.address());
  PrintTiers("lent", stats);
  EXPECT_GT(stats.total_kv_blocks(), 16u);
  EXPECT_EQ(stats.kv_blocks_borrowed(), stats.total_kv_blocks() - 16);
  ASSERT_EQ(stats.workers_size(), 2);
  uint64_t lent_bytes = 0;
  for (const v1::WorkerStats& w : stats.workers()) {
    EXPECT_EQ(w.tiers().lent_slots(), 10u);
    lent_bytes += uint64_t{w.tiers().lent_slots()} * w.tiers().slot_bytes();
  }
  EXPECT_EQ(stats.kv_blocks_borrowed(), lent_bytes / (256 << 10));

  // Short contexts: the pool shrinks back, then the workers take their slots again.
  const std::vector<uint32_t> short_prompt(ids.begin() + 1000, ids.begin() + 1020);
  for (int i = 0; i < 3; ++i) Generate(cluster.address(), short_prompt, 8);
  stats = RouterStats(cluster.address());
  EXPECT_EQ(stats.total_kv_blocks(), 16u);
  EXPECT_EQ(stats.kv_blocks_borrowed(), 0u);
  for (const v1::WorkerStats& w : stats.workers()) EXPECT_EQ(w.tiers().lent_slots(), 0u);
  EXPECT_EQ(Generate(cluster.address(), short_prompt, 8), InProcess(short_prompt, 8));
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(TiersTest, BudgetTooSmallStopsTheClusterWithAClearError) {
  const auto r =
      RunStrata("up --model " + kModel + " --workers 1 --threads 1 " + "--gpu-memory-budget 1MiB");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("at least 16 are needed"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace strata
