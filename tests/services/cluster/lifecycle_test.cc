// The cluster's life: health before and after workers register, draining on SIGTERM, a worker
// or strata-cache killed and restarted by the supervisor, a full queue, and a config file.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpc_health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/child_process.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/run_strata.h"

namespace strata {
namespace {

using ::strata::testing::ChildProcess;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::OracleDir;

const std::string kBin = STRATA_BIN_DIR;

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address,
                                                            const std::string& service = "") {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

bool WaitForHealth(const std::string& address,
                   grpc::health::v1::HealthCheckResponse::ServingStatus want, int timeout_s = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Health(address) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(LifecycleTest, NotServingUntilEveryWorkerRegisters) {
  const std::string model = OracleDir("qwen3_moe");
  const std::string prefix = absl::StrCat("strata-test-", ::getpid());
  ChildProcess router({kBin + "/strata-router", "--model=" + model, "--workers=1", "--threads=1",
                       "--channel-prefix=" + prefix});
  const std::string router_address = router.AwaitLine("LISTENING ");
  ASSERT_FALSE(router_address.empty());
  EXPECT_EQ(Health(router_address), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(router_address, "strata.v1.Generation"),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  // A worker started before its cache waits for it.
  ChildProcess worker({kBin + "/strata-worker", "--model=" + model, "--router=" + router_address,
                       "--cache=127.0.0.1:1", "--index=0", "--threads=1"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Health(router_address), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  worker.Stop();
  ChildProcess cache({kBin + "/strata-cache", "--model=" + model, "--segment-prefix=" + prefix});
  const std::string cache_address = cache.AwaitLine("READY ");
  ASSERT_FALSE(cache_address.empty());
  ChildProcess worker2({kBin + "/strata-worker", "--model=" + model, "--router=" + router_address,
                        "--cache=" + cache_address, "--index=0", "--threads=1"});
  EXPECT_TRUE(WaitForHealth(router_address, grpc::health::v1::HealthCheckResponse::SERVING));
  EXPECT_EQ(Health(router_address, "strata.v1.Generation"),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(router.AwaitLine("READY "), router_address);
  EXPECT_EQ(GenerateGreedy(router_address, {1, 2, 3}, 4).tokens.size(), 4u);
  EXPECT_EQ(router.Stop(), 0);
}

TEST(LifecycleTest, SigtermDrainsRequestsInFlight) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  std::promise<void> first;
  auto running = std::async(std::launch::async, [&] {
    return GenerateGreedy(cluster.address(), std::vector<uint32_t>(20, 5), 400,
                          [&] { first.set_value(); });
  });
  first.get_future().wait();
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
  std::ifstream in(OracleDir("mixtral") + "/oracle.json");
  const auto oracle = nlohmann::json::parse(in);
  const auto prompt = oracle["cases"][2]["prompt"].get<std::vector<uint32_t>>();
  const auto greedy = oracle["cases"][2]["greedy"].get<std::vector<uint32_t>>();
  ASSERT_EQ(GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size())).tokens,
            greedy);

  // Kill worker 1 (a child of the supervisor); a new one must take its place and register.
  const pid_t worker = ChildWithArgs(cluster.pid(), "strata-worker", "--index=1");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  // A request while the worker is gone may fail, but must not leave any channel out of step.
  GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size()));
  pid_t replacement = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    replacement = ChildWithArgs(cluster.pid(), "strata-worker", "--index=1");
    if (replacement > 0 && replacement != worker) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(replacement, 0);
  ASSERT_NE(replacement, worker);
  // Serving again once the replacement has registered (requests fail until then).
  bool served = false;
  const auto serve_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!served && std::chrono::steady_clock::now() < serve_deadline) {
    served = GenerateGreedy(cluster.address(), prompt, static_cast<int>(greedy.size())).status.ok();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(served);
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
  std::promise<void> first;
  std::atomic<bool> fired{false};
  std::vector<std::future<Generated>> running;
  for (const auto& p : prompts) {
    running.push_back(std::async(std::launch::async, [&, p] {
      return GenerateGreedy(cluster.address(), p, kNewTokens, [&] {
        if (!fired.exchange(true)) first.set_value();
      });
    }));
  }
  first.get_future().wait();
  const pid_t worker = ChildWithArgs(cluster.pid(), "strata-worker", "--index=1");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  for (size_t i = 0; i < running.size(); ++i) {
    const Generated g = running[i].get();
    ASSERT_TRUE(g.status.ok()) << "request " << i << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens, undisturbed[i]) << "request " << i;
  }
  // The replacement registers and serves.
  pid_t replacement = -1;
  for (int i = 0; i < 600 && (replacement <= 0 || replacement == worker); ++i) {
    replacement = ChildWithArgs(cluster.pid(), "strata-worker", "--index=1");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(replacement, 0);
  ASSERT_NE(replacement, worker);
  ASSERT_TRUE(WaitForHealth(cluster.address(), grpc::health::v1::HealthCheckResponse::SERVING, 60));
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompts[0], kNewTokens).tokens, undisturbed[0]);
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

// The generation of the expert store strata-cache at `address` serves; 0 if it does not answer.
uint64_t StoreGeneration(const std::string& address) {
  auto stub =
      v1::ExpertStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ExpertLayout layout;
  if (!stub->GetLayout(&context, v1::GetLayoutRequest(), &layout).ok()) return 0;
  return layout.generation();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// strata-cache killed with SIGKILL in the middle of generation: the workers keep serving from
// its shared memory, so the request completes with the tokens of an undisturbed run; the
// supervisor restarts the cache on the same address, it re-attaches to the store (same
// generation, nothing copied), and later requests are served.
TEST(LifecycleTest, KilledCacheRestartsAndReattaches) {
  const std::string log = ::testing::TempDir() + "/cache_restart_" + std::to_string(::getpid());
  std::remove(log.c_str());
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"},
                         120, log);
  ASSERT_FALSE(cluster.address().empty());
  const std::string segment_prefix = absl::StrCat("strata-", cluster.pid());
  const std::string cache_address =
      FlagOf(ChildWithArgs(cluster.pid(), "strata-worker", "--index=0"), "--cache=");
  ASSERT_FALSE(cache_address.empty());
  const uint64_t generation = StoreGeneration(cache_address);
  ASSERT_NE(generation, 0u);

  std::vector<uint32_t> prompt(12);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<uint32_t>(5 + 37 * j % 500);
  const int kNewTokens = 300;
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();

  std::promise<void> first;
  auto running = std::async(std::launch::async, [&] {
    return GenerateGreedy(cluster.address(), prompt, kNewTokens, [&] { first.set_value(); });
  });
  first.get_future().wait();
  const pid_t cache = ChildWithArgs(cluster.pid(), "strata-cache", "--segment-prefix=");
  ASSERT_GT(cache, 0);
  ASSERT_EQ(::kill(cache, SIGKILL), 0);
  const Generated g = running.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, undisturbed.tokens);

  // Back on the same address with the same store.
  uint64_t restarted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (restarted == 0 && std::chrono::steady_clock::now() < deadline) {
    restarted = StoreGeneration(cache_address);
    if (restarted == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(restarted, generation);
  const pid_t replacement = ChildWithArgs(cluster.pid(), "strata-cache", "--segment-prefix=");
  EXPECT_GT(replacement, 0);
  EXPECT_NE(replacement, cache);
  EXPECT_EQ(FlagOf(replacement, "--listen="), cache_address);
  std::string logged;
  const std::string back = "strata-cache is back at " + cache_address;
  for (int i = 0; i < 100 && logged.find(back) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    logged = ReadFile(log);
  }
  EXPECT_NE(logged.find(absl::StrFormat(
                "strata-cache: re-attached to 1 segment(s), generation %016x", generation)),
            std::string::npos)
      << logged;
  EXPECT_NE(logged.find(back), std::string::npos) << logged;

  const Generated later = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(later.status.ok()) << later.status.error_message();
  EXPECT_EQ(later.tokens, undisturbed.tokens);
  // An ordered stop still removes the store.
  EXPECT_EQ(cluster.Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + segment_prefix + "-experts-meta"));
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + segment_prefix + "-experts-0"));
  std::remove(log.c_str());
}

// A router killed mid-generation loses only its in-flight request, which ends UNAVAILABLE; the
// supervisor restarts it on the same address, the workers register again, and it serves.
TEST(LifecycleTest, KilledRouterLosesOnlyItsInFlightRequests) {
  const std::string log = ::testing::TempDir() + "/router_restart_" + std::to_string(::getpid());
  std::remove(log.c_str());
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"},
                         120, log);
  ASSERT_FALSE(cluster.address().empty());
  std::vector<uint32_t> prompt(10);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<uint32_t>(9 + 53 * j % 400);
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, 40);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();

  std::promise<void> first;
  auto running = std::async(std::launch::async, [&] {
    return GenerateGreedy(cluster.address(), prompt, 2000, [&] { first.set_value(); });
  });
  first.get_future().wait();
  const pid_t router = ChildWithArgs(cluster.pid(), "strata-router", "--channel-prefix=");
  ASSERT_GT(router, 0);
  ASSERT_EQ(::kill(router, SIGKILL), 0);
  const Generated lost = running.get();
  EXPECT_EQ(lost.status.error_code(), grpc::StatusCode::UNAVAILABLE) << lost.status.error_message();

  ASSERT_TRUE(WaitForHealth(cluster.address(), grpc::health::v1::HealthCheckResponse::SERVING));
  const pid_t replacement = ChildWithArgs(cluster.pid(), "strata-router", "--channel-prefix=");
  EXPECT_GT(replacement, 0);
  EXPECT_NE(replacement, router);
  EXPECT_EQ(FlagOf(replacement, "--listen="), cluster.address());
  const Generated later = GenerateGreedy(cluster.address(), prompt, 40);
  ASSERT_TRUE(later.status.ok()) << later.status.error_message();
  EXPECT_EQ(later.tokens, undisturbed.tokens);
  EXPECT_NE(ReadFile(log).find("strata-router is back"), std::string::npos) << ReadFile(log);
  EXPECT_EQ(cluster.Stop(), 0);
  std::remove(log.c_str());
}

// `strata stats` reports the router's counters and which workers are connected.
TEST(LifecycleTest, StatsReportWorkersAndCounters) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_EQ(GenerateGreedy(cluster.address(), {1, 2, 3}, 5).tokens.size(), 5u);
  const auto result = strata::testing::RunStrata("stats --server " + cluster.address());
  ASSERT_EQ(result.exit_code, 0) << result.out;
  const auto stats = nlohmann::json::parse(result.out);
  // 64-bit counters are strings in protobuf's JSON mapping.
  EXPECT_GE(std::stoull(stats["steps"].get<std::string>()), 5u);
  EXPECT_EQ(stats["running_requests"].get<uint32_t>(), 0u);
  EXPECT_EQ(stats["free_kv_blocks"], stats["total_kv_blocks"]);
  ASSERT_EQ(stats["workers"].size(), 2u);
  for (const auto& w : stats["workers"]) EXPECT_TRUE(w["connected"].get<bool>());
  // Every expert is resident without a budget: the router predicts nothing.
  EXPECT_EQ(stats["prefetch_actual"].get<std::string>(), "0");
  EXPECT_NE(strata::testing::RunStrata("stats --server 127.0.0.1:1").exit_code, 0);
}

TEST(LifecycleTest, FullQueueGivesResourceExhausted) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=1", "--threads=1",
                          "--max-running=1", "--max-queued-requests=1", "--max-batch-tokens=8"});
  ASSERT_FALSE(cluster.address().empty());
  std::vector<std::future<Generated>> calls;
  for (int i = 0; i < 6; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      return GenerateGreedy(cluster.address(), std::vector<uint32_t>(100, 7), 100);
    }));
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
                      << "workers: 2\nthreads: 1\nrouter_temperature: 1.0\n"
                      << "kv_cache:\n  block_size: 16\n  memory_mb: 64\n";
  // The flag overrides the file's worker count.
  ClusterProcess cluster({"--config=" + path, "--workers=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(stub->ModelInfo(&context, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_type(), "qwen2_moe");
  EXPECT_EQ(info.num_workers(), 1u);
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace strata
