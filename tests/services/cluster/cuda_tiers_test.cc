// Tiered GPU workers in the GPU cluster (`strata up --device cuda --gpu-memory-budget`): the
// router on cuda:0, activations by CUDA IPC, decode steps replayed as CUDA graphs on both sides
// while each worker keeps a fraction of the demo model's experts in its slots and reads the rest
// in place from the expert store. Greedy tokens are compared with the resident cluster's, one
// request at a time (so that both run the same steps: the same kernels over the same bytes give
// the same bits). Skips without a GPU.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda/cuda_context.h"
#include "gtest/gtest.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/health_client.h"
#include "tests/testing/poll.h"
#include "tests/testing/tied_tokens.h"
#include "tests/testing/tier_stats.h"

namespace strata {
namespace {

using ::strata::testing::AdminClient;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::ExpectSameOrTied;
using ::strata::testing::FirstTokens;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::KillChild;
using ::strata::testing::PollUntil;
using ::strata::testing::PrintTiers;
using ::strata::testing::RouterStats;
using ::strata::testing::Serving;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
// Decode steps replay whenever they fit a graph (the default times eager steps against replays
// that read much from the host, which would change the tokens' last bits): the clusters here
// run the resident cluster's steps; one test turns the trials on for itself.
const bool kReplaysOnly = [] { return ::setenv("STRATA_STEP_TRIALS", "off", 1) == 0; }();
// 8 MoE layers x 16 experts of 240 KiB (bf16): 30 MiB. 12 MiB holds 43 slots after the step
// buffers, a third of them.
constexpr char kBudget[] = "--gpu-memory-budget=12MiB";
constexpr int kNewTokens = 32;

// `cold`: the tiered worker's --cold-experts; copy by default, so that eager steps (the
// prefills) copy their misses in as the resident cluster has them, rather than share them with
// the CPU tier (one rounding more).
std::vector<std::string> Args(const std::string& weights, bool tiered,
                              const std::string& cold = "copy") {
  std::vector<std::string> args = {
      "--model=" + kModel, "--device=cuda",    "--workers=1",          "--threads=2",
      "--max-running=8",   "--kv-cache-mb=64", "--weights=" + weights, "--max-batch-tokens=256"};
  if (tiered) {
    args.push_back(kBudget);
    args.push_back("--cold-experts=" + cold);
  }
  return args;
}

std::vector<std::vector<uint32_t>> Prompts() {
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<uint32_t> p;
    for (int j = 0; j < 10 + 3 * i; ++j) p.push_back(static_cast<uint32_t>(200 + 41 * i + j));
    prompts.push_back(p);
  }
  return prompts;
}

// Each prompt's greedy tokens, one request after another.
std::vector<std::vector<uint32_t>> OneAtATime(const std::string& address) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& prompt : Prompts()) {
    const Generated g = GenerateGreedy(address, prompt, kNewTokens);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    out.push_back(g.tokens);
  }
  return out;
}

// The resident cluster; `eager`: with every step run without graphs (attention is then planned
// for each step's context, not the graphs', which changes the last bits).
std::vector<std::string> ResidentArgs(const std::string& weights, bool eager) {
  std::vector<std::string> args = Args(weights, false);
  if (eager) args.push_back("--cuda-graph-max-batch=0");
  return args;
}

// The resident cluster's tokens.
std::vector<std::vector<uint32_t>> Resident(const std::string& weights, bool eager = false) {
  ClusterProcess cluster(ResidentArgs(weights, eager));
  EXPECT_FALSE(cluster.address().empty());
  auto tokens = OneAtATime(cluster.address());
  EXPECT_EQ(cluster.Stop(), 0);
  return tokens;
}

// bf16 slots over the bf16 store: misses are read in place, so decode steps replay graphs.
TEST(CudaTiersTest, TieredWorkersGiveTheResidentTokensAndReplayTheirSteps) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("bf16");
  ClusterProcess cluster(Args("bf16", true));
  ASSERT_FALSE(cluster.address().empty());
  const auto got = OneAtATime(cluster.address());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("tiered bf16", stats);
  ASSERT_EQ(stats.workers_size(), 1);
  const v1::TierCounters& t = stats.workers(0).tiers();
  EXPECT_GT(t.misses(), 0u);
  EXPECT_GT(t.hot_hits() + t.warm_hits(), 0u);
  EXPECT_GT(t.bytes_copied(), 0u);
  EXPECT_LT((t.hot_slots() + t.warm_slots()) * t.slot_bytes(), 12u << 20);
  EXPECT_GT(stats.graph_steps(), stats.steps() / 2);
  // The next layer's experts predicted on the device (eager steps: the prefills), and scored.
  std::printf("prefetch accuracy on the device: %.3f of %llu picks\n",
              static_cast<double>(stats.prefetch_correct()) /
                  std::max<uint64_t>(stats.prefetch_actual(), 1),
              static_cast<unsigned long long>(stats.prefetch_actual()));
  EXPECT_GT(stats.prefetch_actual(), 0u);
  EXPECT_EQ(stats.prefetch_predicted(), stats.prefetch_actual());
  EXPECT_GT(stats.prefetch_correct(), stats.prefetch_actual() / 2);
  EXPECT_EQ(cluster.Stop(), 0);
}

// FP8 slots over the bf16 store (quantized as they are copied in): a miss cannot be read in
// place, so the worker runs every layer eagerly, copying its misses first.
TEST(CudaTiersTest, Fp8SlotsOverABf16StoreRunEagerlyWithTheResidentTokens) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("fp8", /*eager=*/true);
  ClusterProcess cluster(Args("fp8", true));
  ASSERT_FALSE(cluster.address().empty());
  const auto got = OneAtATime(cluster.address());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("tiered fp8 eager", stats);
  EXPECT_EQ(stats.graph_steps(), 0u);
  ASSERT_EQ(stats.workers_size(), 1);
  EXPECT_GT(stats.workers(0).tiers().misses(), 0u);
  EXPECT_EQ(cluster.Stop(), 0);
}

// The same eager cluster with hints two layers ahead: the router reads its device predictions
// and the worker starts their copies before the layers' requests (which then wait for their
// own copies only). The tokens stay the resident cluster's; hinted experts are used.
TEST(CudaTiersTest, PrefetchHintsAheadOfEagerLayersKeepTheResidentTokens) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("fp8", /*eager=*/true);
  std::vector<std::string> args = Args("fp8", true);
  args.push_back("--prefetch-lookahead=2");
  ClusterProcess cluster(args);
  ASSERT_FALSE(cluster.address().empty());
  const auto got = OneAtATime(cluster.address());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("tiered fp8 eager, hints 2 layers ahead", stats);
  ASSERT_EQ(stats.workers_size(), 1);
  const v1::TierCounters& t = stats.workers(0).tiers();
  EXPECT_GT(t.prefetch_loads(), 0u);
  EXPECT_GT(t.prefetch_hits(), 0u);
  EXPECT_EQ(cluster.Stop(), 0);
}

// Cold experts on strata-expert-store's CPUs with the router on the GPU (`--cold-experts cpu`): the
// worker runs its layers eagerly, hands the CPU tier the rows of its cold experts and adds the
// CPU's float sums into its bf16 output, one rounding more than the resident cluster's (and the
// CPU's own order of sums), so a greedy sequence may part from the resident one where two tokens
// all but tie, as the resident cluster scores them (ExpectSameOrTied).
TEST(CudaTiersTest, ColdExpertsOnTheCpuTierThroughCudaIpc) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("bf16", /*eager=*/true);
  ClusterProcess cluster(Args("bf16", true, "cpu"));
  ASSERT_FALSE(cluster.address().empty());
  const auto got = OneAtATime(cluster.address());
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("tiered bf16, cold experts on the CPU tier", stats);
  EXPECT_EQ(stats.graph_steps(), 0u);
  ASSERT_EQ(stats.workers_size(), 1);
  EXPECT_GT(stats.workers(0).tiers().cpu_tier_experts(), 0u);
  EXPECT_EQ(cluster.Stop(), 0);
  const size_t shared = ExpectSameOrTied(ResidentArgs("bf16", true), Prompts(), got, want, 0.1f);
  std::printf("CPU tier through CUDA IPC: %zu of %d tokens before the first difference\n", shared,
              kNewTokens * static_cast<int>(want.size()));
}

// The default (`--cold-experts auto`): replayed decode steps read cold experts in place, eager
// ones share them between copies and the CPU tier, and the router times the two ways now and
// then (here whatever the replays read: STRATA_STEP_TRIALS=always) and keeps the faster. Tokens
// as the resident cluster's, but where eager steps (attention planned for the step's context,
// the CPU's float sums) part from it at a tie.
TEST(CudaTiersTest, AutoColdExpertsTimeEagerStepsAgainstReplays) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(kReplaysOnly);
  const auto want = Resident("bf16");
  ASSERT_EQ(::setenv("STRATA_STEP_TRIALS", "always", 1), 0);
  ClusterProcess cluster(Args("bf16", true, "auto"));
  ASSERT_EQ(::setenv("STRATA_STEP_TRIALS", "off", 1), 0);
  ASSERT_FALSE(cluster.address().empty());
  const auto got = OneAtATime(cluster.address());
  const v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("tiered bf16, eager steps timed against replays", stats);
  std::printf(
      "%llu trials, %llu switches, eager preferred at the end: %d; %llu of %llu steps "
      "replayed\n",
      static_cast<unsigned long long>(stats.eager_step_trials()),
      static_cast<unsigned long long>(stats.eager_step_switches()), stats.eager_steps_preferred(),
      static_cast<unsigned long long>(stats.graph_steps()),
      static_cast<unsigned long long>(stats.steps()));
  // 4 x 31 decode steps of one token: the first trial (5 steps) after 32, the second 69 later.
  EXPECT_GE(stats.eager_step_trials(), 1u);
  EXPECT_GT(stats.graph_steps(), 0u);
  // Every decided trial ran its 5 decode steps eagerly, besides the 4 prefills (on the H100:
  // 2 trials, 114 of 128 steps replayed).
  EXPECT_GE(stats.steps() - stats.graph_steps(), Prompts().size() + 5 * stats.eager_step_trials());
  EXPECT_EQ(cluster.Stop(), 0);
  const size_t shared = ExpectSameOrTied(ResidentArgs("bf16", false), Prompts(), got, want, 0.1f);
  std::printf("eager steps timed against replays: %zu of %d tokens before the first difference\n",
              shared, kNewTokens * static_cast<int>(want.size()));
}

TEST(CudaTiersTest, HotRatioChangesWhileRequestsRun) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("bf16");
  ClusterProcess cluster(Args("bf16", true));
  ASSERT_FALSE(cluster.address().empty());
  std::atomic<bool> done{false};
  std::future<std::vector<std::vector<uint32_t>>> running = std::async(std::launch::async, [&] {
    auto tokens = OneAtATime(cluster.address());
    done = true;
    return tokens;
  });
  AdminClient admin(cluster.address());
  ASSERT_TRUE(admin.ok());
  int changes = 0;
  for (float ratio : {1.0f, 0.0f, 0.5f, -1.0f, 0.2f, -1.0f}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    v1::SetHotRatioRequest request;
    if (ratio < 0) {
      request.set_automatic(true);
    } else {
      request.set_hot_ratio(ratio);
    }
    v1::SetHotRatioResponse response;
    ASSERT_TRUE(admin->SetHotRatio(admin.Context().get(), request, &response).ok());
    changes += !done.load();
  }
  const auto got = running.get();
  std::printf("%d hot-ratio changes while requests ran\n", changes);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_GT(changes, 0);
  PrintTiers("hot ratio changes", RouterStats(cluster.address()));
  EXPECT_EQ(cluster.Stop(), 0);
}

// One budget for the KV pool on cuda:0 and the worker's slots there: a long context lowers the
// hot ratio, the worker gives the slots of the experts leaving its hot set back to the device
// and the pool grows into them; short contexts give them back. The tokens are those of the
// resident cluster with the same pool (the graphs are planned for the pool's largest context).
TEST(CudaTiersTest, LongContextsBorrowTheWorkersSlotsForTheKvPool) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<uint32_t> long_prompt;
  for (int j = 0; j < 600; ++j) long_prompt.push_back(static_cast<uint32_t>(100 + (j * 37) % 3000));
  const std::vector<uint32_t> short_prompt = Prompts()[1];
  // 4 MiB of bf16 KV: 32 blocks of 128 KiB. 20 MiB of slots: ~70 of 240 KiB; past 128 tokens
  // the ratio goes from 0.35 to 0.20 and 0.15 x 128 owned = 19 slots are lent.
  auto args = [](bool tiered) {
    std::vector<std::string> a = Args("bf16", false);
    a.insert(a.end(), {"--kv-cache-mb=4", "--hot-ratio-policy=128:0.35,0.2",
                       "--kv-cache-share-expert-memory"});
    if (tiered) a.push_back("--gpu-memory-budget=20MiB");
    return a;
  };
  std::vector<uint32_t> want_long, want_short;
  {
    ClusterProcess resident(args(false));
    ASSERT_FALSE(resident.address().empty());
    want_long = GenerateGreedy(resident.address(), long_prompt, kNewTokens).tokens;
    want_short = GenerateGreedy(resident.address(), short_prompt, kNewTokens).tokens;
    EXPECT_EQ(RouterStats(resident.address()).kv_blocks_borrowed(), 0u);  // nothing to lend
    EXPECT_EQ(resident.Stop(), 0);
  }
  ClusterProcess cluster(args(true));
  ASSERT_FALSE(cluster.address().empty());
  EXPECT_EQ(RouterStats(cluster.address()).total_kv_blocks(), 32u);
  const Generated g = GenerateGreedy(cluster.address(), long_prompt, kNewTokens);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, want_long);
  v1::StatsResponse stats = RouterStats(cluster.address());
  PrintTiers("lent", stats);
  ASSERT_EQ(stats.workers_size(), 1);
  const v1::TierCounters& lent = stats.workers(0).tiers();
  std::printf("KV pool %u blocks (%u borrowed); worker lent %u slots of %llu bytes\n",
              stats.total_kv_blocks(), stats.kv_blocks_borrowed(), lent.lent_slots(),
              static_cast<unsigned long long>(lent.slot_bytes()));
  EXPECT_EQ(lent.lent_slots(), 19u);
  EXPECT_EQ(stats.kv_blocks_borrowed(), uint64_t{lent.lent_slots()} * lent.slot_bytes() >> 17);
  EXPECT_EQ(stats.total_kv_blocks(), 32u + stats.kv_blocks_borrowed());

  for (int i = 0; i < 3; ++i) {
    const Generated s = GenerateGreedy(cluster.address(), short_prompt, kNewTokens);
    EXPECT_EQ(s.tokens, want_short);
  }
  stats = RouterStats(cluster.address());
  EXPECT_EQ(stats.total_kv_blocks(), 32u);
  EXPECT_EQ(stats.workers(0).tiers().lent_slots(), 0u);
  EXPECT_GT(stats.graph_steps(), 0u);
  EXPECT_EQ(cluster.Stop(), 0);
}

// A tiered worker SIGKILLed while its steps run (replays in flight): the request ends
// UNAVAILABLE (its only worker) or completes, never hangs; the restarted worker registers
// again over CUDA IPC and serves the resident cluster's tokens.
TEST(CudaTiersTest, KilledTieredWorkerWithAStepInFlight) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto want = Resident("bf16");
  ClusterProcess cluster(Args("bf16", true));
  ASSERT_FALSE(cluster.address().empty());
  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), Prompts()[0], 400, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-worker", "--index=0", &worker));
  ASSERT_EQ(running.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the request hangs after its worker died";
  const Generated g = running.get();
  if (!g.status.ok()) {
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
  } else {
    EXPECT_EQ(g.tokens.size(), 400u);
  }
  const bool back = PollUntil(
      [&] {
        const pid_t replacement = ChildWithArgs(cluster.pid(), "strata-worker", "--index=0");
        return replacement > 0 && replacement != worker && Serving(cluster.address());
      },
      std::chrono::seconds(90), std::chrono::milliseconds(100));
  ASSERT_TRUE(back) << "the restarted worker did not register";
  const auto got = OneAtATime(cluster.address());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace strata
