// The cluster's life: health before and after workers register, draining on SIGTERM, a worker
// or strata-expert-store killed and restarted by the supervisor, a full queue, and a config file.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster/cluster_token.h"
#include "common/cluster/runtime_dir.h"
#include "common/shm/shared_segment.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/child_process.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/health_client.h"
#include "tests/testing/oracles.h"
#include "tests/testing/poll.h"
#include "tests/testing/run_strata.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::AwaitReplacement;
using ::strata::testing::ChildProcess;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::FirstTokens;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::Health;
using ::strata::testing::KillChild;
using ::strata::testing::kNotServing;
using ::strata::testing::kServing;
using ::strata::testing::LoadOracle;
using ::strata::testing::OracleDir;
using ::strata::testing::PollUntil;
using ::strata::testing::TempDir;
using ::strata::testing::WaitForHealth;

const std::string kBin = STRATA_BIN_DIR;

TEST(LifecycleTest, NotServingUntilEveryWorkerRegisters) {
  const std::string model = OracleDir("qwen3_moe");
  const std::string prefix = absl::StrCat("strata-test-", ::getpid());
  // Processes started by hand share a token file (strata up makes one per cluster).
  const TempDir dir;
  ASSERT_TRUE(ClusterToken::Create(dir.File("token")).ok());
  const std::string token = "--cluster-token-file=" + dir.File("token");
  ChildProcess router({kBin + "/strata-router", "--model=" + model, "--workers=1", "--threads=1",
                       "--channel-prefix=" + prefix, token});
  const std::string internal = router.AwaitLine("INTERNAL ");
  ASSERT_TRUE(absl::StartsWith(internal, "unix:")) << internal;
  const std::string router_address = router.AwaitLine("LISTENING ");
  ASSERT_FALSE(router_address.empty());
  EXPECT_EQ(Health(router_address), kNotServing);
  EXPECT_EQ(Health(router_address, "strata.v1.Generation"), kNotServing);
  // A worker started before its expert store waits for it.
  ChildProcess worker({kBin + "/strata-worker", "--model=" + model, "--router=" + internal,
                       "--store-address=127.0.0.1:1", "--index=0", "--threads=1", token});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Health(router_address), kNotServing);
  worker.Stop();
  ChildProcess store(
      {kBin + "/strata-expert-store", "--model=" + model, "--segment-prefix=" + prefix, token});
  const std::string store_address = store.AwaitLine("READY ");
  ASSERT_FALSE(store_address.empty());
  // Under the address flag's older name, --cache, which scripts may still pass.
  ChildProcess worker2({kBin + "/strata-worker", "--model=" + model, "--router=" + internal,
                        "--cache=" + store_address, "--index=0", "--threads=1", token});
  EXPECT_TRUE(WaitForHealth(router_address, kServing));
  EXPECT_EQ(Health(router_address, "strata.v1.Generation"), kServing);
  EXPECT_EQ(router.AwaitLine("READY "), router_address);
  EXPECT_EQ(GenerateGreedy(router_address, {1, 2, 3}, 4).tokens.size(), 4u);
  EXPECT_EQ(router.Stop(), 0);
}

TEST(LifecycleTest, SigtermDrainsRequestsInFlight) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  FirstTokens first;
  auto running =
      GenerateGreedyAsync(cluster.address(), std::vector<uint32_t>(20, 5), 400, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  ::kill(cluster.pid(), SIGTERM);
  const Generated g = running.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 400u);
  EXPECT_EQ(g.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(LifecycleTest, SupervisorRestartsAKilledWorker) {
  ClusterProcess cluster({"--model=" + OracleDir("mixtral"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  const auto oracle = LoadOracle("mixtral");
  const auto prompt = oracle["cases"][2]["prompt"].get<std::vector<uint32_t>>();
  const auto greedy = oracle["cases"][2]["greedy"].get<std::vector<uint32_t>>();
  ASSERT_EQ(GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size())).tokens,
            greedy);

  // Kill worker 1 (a child of the supervisor); a new one must take its place and register.
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-worker", "--index=1", &worker));
  // A request while the worker is gone may fail, but must not leave any channel out of step.
  GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size()));
  const pid_t replacement = AwaitReplacement(cluster.pid(), "strata-worker", "--index=1", worker);
  ASSERT_GT(replacement, 0);
  ASSERT_NE(replacement, worker);
  // Serving again once the replacement has registered (requests fail until then).
  ASSERT_TRUE(PollUntil(
      [&] {
        return GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size()))
            .status.ok();
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100)));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size())).tokens,
              greedy);
  }
  EXPECT_EQ(cluster.Stop(), 0);
}

// A worker killed with SIGKILL in the middle of generation costs its in-flight layer, not the
// requests: the router runs that layer again on the other worker, and all 8 requests end with
// the tokens of an undisturbed run. The supervisor restarts the worker, which serves again.
TEST(LifecycleTest, KilledWorkerLosesNoRequest) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<uint32_t> prompt(10 + 7 * i);
    for (size_t j = 0; j < prompt.size(); ++j)
      prompt[j] = static_cast<uint32_t>(3 + (i * 131 + j * 17) % 700);
    prompts.push_back(prompt);
  }
  const int kNewTokens = 300;
  std::vector<std::vector<uint32_t>> undisturbed;
  for (const auto& p : prompts) {
    const Generated g = GenerateGreedy(cluster.address(), p, kNewTokens);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    undisturbed.push_back(g.tokens);
  }
  FirstTokens first;
  std::vector<std::future<Generated>> running;
  for (const auto& p : prompts) {
    running.push_back(GenerateGreedyAsync(cluster.address(), p, kNewTokens, first.Callback()));
  }
  ASSERT_TRUE(first.Wait()) << "no first token";
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-worker", "--index=1", &worker));
  for (size_t i = 0; i < running.size(); ++i) {
    const Generated g = running[i].get();
    ASSERT_TRUE(g.status.ok()) << "request " << i << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens, undisturbed[i]) << "request " << i;
  }
  // The replacement registers and serves.
  const pid_t replacement = AwaitReplacement(cluster.pid(), "strata-worker", "--index=1", worker);
  ASSERT_GT(replacement, 0);
  ASSERT_NE(replacement, worker);
  ASSERT_TRUE(WaitForHealth(cluster.address(), kServing, 60));
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompts[0], kNewTokens).tokens, undisturbed[0]);
  EXPECT_EQ(cluster.Stop(), 0);
}

// The same over the gRPC transport (workers that could be on other hosts): a worker killed
// mid-request breaks its stream, the router runs the layer on the other worker, the request
// ends with the undisturbed tokens, and the restarted worker registers on a new stream.
TEST(LifecycleTest, KilledGrpcWorkerLosesNoRequest) {
  ClusterProcess cluster(
      {"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1", "--transport=grpc"});
  ASSERT_FALSE(cluster.address().empty());
  std::vector<uint32_t> prompt(24);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<uint32_t>(3 + j * 29 % 700);
  const int kNewTokens = 400;
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  for (int round = 0; round < 2; ++round) {
    FirstTokens first;
    std::future<Generated> running =
        GenerateGreedyAsync(cluster.address(), prompt, kNewTokens, first.Callback());
    ASSERT_TRUE(first.Wait()) << "no first token";
    pid_t worker = -1;
    ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-worker", "--index=1", &worker));
    // The kill must land inside the request for the test to mean anything.
    ASSERT_EQ(running.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
        << "round " << round << ": the request ended before the kill";
    const Generated g = running.get();
    ASSERT_TRUE(g.status.ok()) << "round " << round << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens, undisturbed.tokens) << "round " << round;
    const pid_t replacement = AwaitReplacement(cluster.pid(), "strata-worker", "--index=1", worker);
    ASSERT_GT(replacement, 0);
    ASSERT_TRUE(WaitForHealth(cluster.address(), kServing, 60));
  }
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompt, kNewTokens).tokens, undisturbed.tokens);
  EXPECT_EQ(cluster.Stop(), 0);
}

// The value of `--flag=` on a live process's command line, or "".
std::string FlagOf(pid_t pid, const std::string& flag) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string arg;
  while (std::getline(in, arg, '\0')) {
    if (arg.rfind(flag, 0) == 0) return arg.substr(flag.size());
  }
  return "";
}

// The generation of the expert store strata-expert-store at `address` serves (the call carries the
// cluster's `token`); 0 if it does not answer.
uint64_t StoreGeneration(const std::string& address, const ClusterToken& token) {
  auto stub =
      v1::ExpertStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  token.Attach(context);
  v1::ExpertLayout layout;
  if (!stub->GetLayout(&context, v1::GetLayoutRequest(), &layout).ok()) return 0;
  return layout.generation();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// strata-expert-store killed with SIGKILL in the middle of generation: the workers keep serving
// from its shared memory, so the request completes with the tokens of an undisturbed run; the
// supervisor restarts the expert store on the same address, it re-attaches to the store (same
// generation, nothing copied), and later requests are served.
TEST(LifecycleTest, KilledExpertStoreRestartsAndReattaches) {
  const TempDir dir;
  const std::string log = dir.File("cluster.log");
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"},
                         120, log);
  ASSERT_FALSE(cluster.address().empty());
  auto found = FindClusterByClient(cluster.address());
  ASSERT_TRUE(found.ok()) << found.status();
  const ClusterDir cluster_dir = found->first;
  const std::string segment_prefix = cluster_dir.shm_prefix();
  auto token = ClusterToken::FromFile(cluster_dir.token_file());
  ASSERT_TRUE(token.ok()) << token.status();
  const std::string store_address =
      FlagOf(ChildWithArgs(cluster.pid(), "strata-worker", "--index=0"), "--store-address=");
  ASSERT_EQ(store_address, cluster_dir.socket("expert-store"));
  const uint64_t generation = StoreGeneration(store_address, *token);
  // The store serves the cluster's own processes only.
  EXPECT_EQ(StoreGeneration(store_address, ClusterToken()), 0u);
  ASSERT_NE(generation, 0u);

  std::vector<uint32_t> prompt(12);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<uint32_t>(5 + 37 * j % 500);
  const int kNewTokens = 300;
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();

  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), prompt, kNewTokens, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  pid_t store = -1;
  ASSERT_NO_FATAL_FAILURE(
      KillChild(cluster.pid(), "strata-expert-store", "--segment-prefix=", &store));
  const Generated g = running.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, undisturbed.tokens);

  // Back on the same address with the same store.
  uint64_t restarted = 0;
  EXPECT_TRUE(PollUntil([&] { return (restarted = StoreGeneration(store_address, *token)) != 0; },
                        std::chrono::seconds(30)));
  EXPECT_EQ(restarted, generation);
  const pid_t replacement =
      ChildWithArgs(cluster.pid(), "strata-expert-store", "--segment-prefix=");
  EXPECT_GT(replacement, 0);
  EXPECT_NE(replacement, store);
  EXPECT_EQ(FlagOf(replacement, "--listen="), store_address);
  std::string logged;
  const std::string back = "strata-expert-store is back at " + store_address;
  EXPECT_TRUE(PollUntil([&] { return (logged = ReadFile(log)).find(back) != std::string::npos; },
                        std::chrono::seconds(5)));
  EXPECT_NE(logged.find(absl::StrFormat(
                "strata-expert-store: re-attached to 1 segment(s), generation %016x", generation)),
            std::string::npos)
      << logged;
  EXPECT_NE(logged.find(back), std::string::npos) << logged;

  const Generated later = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(later.status.ok()) << later.status.error_message();
  EXPECT_EQ(later.tokens, undisturbed.tokens);
  // An ordered stop still removes the store, and the cluster's directory.
  EXPECT_EQ(cluster.Stop(), 0);
  EXPECT_THAT(SharedSegment::ListOwned(segment_prefix), ::testing::IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(cluster_dir.path));
}

// A router killed mid-generation loses only its in-flight request, which ends UNAVAILABLE; the
// supervisor restarts it on the same address, the workers register again, and it serves.
TEST(LifecycleTest, KilledRouterLosesOnlyItsInFlightRequests) {
  const TempDir dir;
  const std::string log = dir.File("cluster.log");
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"},
                         120, log);
  ASSERT_FALSE(cluster.address().empty());
  std::vector<uint32_t> prompt(10);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<uint32_t>(9 + 53 * j % 400);
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, 40);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();

  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), prompt, 2000, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  pid_t router = -1;
  ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-router", "--channel-prefix=", &router));
  const Generated lost = running.get();
  EXPECT_EQ(lost.status.error_code(), grpc::StatusCode::UNAVAILABLE) << lost.status.error_message();

  ASSERT_TRUE(WaitForHealth(cluster.address(), kServing));
  const pid_t replacement = ChildWithArgs(cluster.pid(), "strata-router", "--channel-prefix=");
  EXPECT_GT(replacement, 0);
  EXPECT_NE(replacement, router);
  EXPECT_EQ(FlagOf(replacement, "--listen="), cluster.address());
  const Generated later = GenerateGreedy(cluster.address(), prompt, 40);
  ASSERT_TRUE(later.status.ok()) << later.status.error_message();
  EXPECT_EQ(later.tokens, undisturbed.tokens);
  EXPECT_NE(ReadFile(log).find("strata-router is back"), std::string::npos) << ReadFile(log);
  EXPECT_EQ(cluster.Stop(), 0);
}

// `strata stats` reports the router's counters and which workers are connected.
TEST(LifecycleTest, StatsReportWorkersAndCounters) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_EQ(GenerateGreedy(cluster.address(), {1, 2, 3}, 5).tokens.size(), 5u);
  const auto result = strata::testing::RunStrata("stats --server " + cluster.address());
  ASSERT_EQ(result.exit_code, 0) << result.out;
  const auto stats = nlohmann::json::parse(result.out);
  // Counters are numbers (protobuf's own JSON mapping writes 64-bit ones as strings).
  EXPECT_GE(stats["steps"].get<uint64_t>(), 5u);
  EXPECT_EQ(stats["requests_finished"].get<uint64_t>(), 1u);
  EXPECT_EQ(stats["prompt_tokens"].get<uint64_t>(), 3u);
  EXPECT_EQ(stats["generated_tokens"].get<uint64_t>(), 5u);
  EXPECT_GT(stats["mean_ttft_ms"].get<double>(), 0.0);
  EXPECT_GT(stats["mean_inter_token_ms"].get<double>(), 0.0);
  EXPECT_GT(stats["uptime_s"].get<double>(), 0.0);
  EXPECT_EQ(stats["running_requests"].get<uint32_t>(), 0u);
  EXPECT_EQ(stats["free_kv_blocks"], stats["total_kv_blocks"]);
  ASSERT_EQ(stats["workers"].size(), 2u);
  for (const auto& w : stats["workers"]) EXPECT_TRUE(w["connected"].get<bool>());
  // Every expert is resident without a budget: the router predicts nothing.
  EXPECT_EQ(stats["prefetch_actual"].get<uint64_t>(), 0u);
  // Streamed text ends with the finish reason on stderr.
  const auto streamed = strata::testing::RunStrata("generate --server " + cluster.address() +
                                                   " --ids 1,2,3 --max-new-tokens 4 --stream");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.out;
  EXPECT_THAT(streamed.out, ::testing::HasSubstr("[finish: length]"));
  EXPECT_NE(strata::testing::RunStrata("stats --server 127.0.0.1:1").exit_code, 0);
}

TEST(LifecycleTest, FullQueueGivesResourceExhausted) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=1", "--threads=1",
                          "--max-running=1", "--max-queued-requests=1", "--max-batch-tokens=8"});
  ASSERT_FALSE(cluster.address().empty());
  std::vector<std::future<Generated>> calls;
  for (int i = 0; i < 6; ++i) {
    calls.push_back(GenerateGreedyAsync(cluster.address(), std::vector<uint32_t>(100, 7), 100));
  }
  int exhausted = 0, completed = 0;
  for (auto& call : calls) {
    const Generated g = call.get();
    if (g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
    if (g.status.ok() && g.tokens.size() == 100u) ++completed;
  }
  // One runs and at most one waits; how many of the burst get in depends on timing.
  EXPECT_GE(exhausted, 1);
  EXPECT_GE(completed, 1);
  EXPECT_EQ(exhausted + completed, 6);
}

TEST(LifecycleTest, ConfigFileWithFlagOverrides) {
  const std::string path = ::testing::TempDir() + "/cluster.yaml";
  std::ofstream(path) << "model: " << OracleDir("qwen2_moe") << "\n"
                      << "workers: 2\nthreads: 1\ngate_temperature: 1.0\n"
                      << "kv_cache:\n  block_size: 16\n  memory_mb: 64\n";
  // The flag overrides the file's worker count.
  ClusterProcess cluster({"--config=" + path, "--workers=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = ::strata::testing::GenerationStub(cluster.address());
  grpc::ClientContext context;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(stub->ModelInfo(&context, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_type(), "qwen2_moe");
  EXPECT_EQ(info.num_workers(), 1u);
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace strata
