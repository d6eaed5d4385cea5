// What a client of the published port, another local user, or a stopped process can do to a
// running cluster (docs/security.md): internal services are off the client port and refuse
// calls without the cluster token; a worker that stops answering is declared failed within
// seconds, its experts rerouted, and is killed and restarted unless it recovers; a cluster
// leaves nothing in /dev/shm or its runtime directory when it stops.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_token.h"
#include "common/cluster/runtime_dir.h"
#include "common/shm/process_liveness.h"
#include "common/shm/shared_segment.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/health_client.h"
#include "tests/testing/oracles.h"
#include "tests/testing/poll.h"

namespace strata {
namespace {

using ::strata::testing::AwaitReplacement;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::FirstTokens;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::Health;
using ::strata::testing::OracleDir;
using ::strata::testing::PollUntil;
using ::strata::testing::RouterStats;
using ::strata::testing::WaitForHealth;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr auto kNotServing = grpc::health::v1::HealthCheckResponse::NOT_SERVING;
constexpr auto kServing = grpc::health::v1::HealthCheckResponse::SERVING;

std::pair<ClusterDir, ClusterInfo> FindCluster(const std::string& client) {
  auto found = FindClusterByClient(client);
  EXPECT_TRUE(found.ok()) << found.status();
  return found.ok() ? *found : std::pair<ClusterDir, ClusterInfo>{};
}

std::vector<uint32_t> Prompt(int n, int seed) {
  std::vector<uint32_t> prompt(n);
  for (int j = 0; j < n; ++j) prompt[j] = static_cast<uint32_t>(3 + (seed * 131 + j * 17) % 700);
  return prompt;
}

// A plain gRPC client of the published port reaches Generation, health and reflection only:
// Coordinator and Admin are not served there. On the internal listener they refuse a call
// without this cluster's token.
TEST(TrustTest, InternalServicesAreOffTheClientPortAndNeedTheToken) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=1", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  const auto [dir, info] = FindCluster(cluster.address());
  ASSERT_FALSE(info.internal.empty());
  EXPECT_TRUE(absl::StartsWith(info.internal, "unix:" + dir.path + "/")) << info.internal;
  struct stat st {};
  ASSERT_EQ(::stat(dir.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(dir.token_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  v1::RegisterWorkerRequest fake;  // the worker 0 a fake would become
  fake.set_worker_index(0);
  fake.set_device("cpu");
  fake.set_transport(v1::TRANSPORT_SHARED_MEMORY);
  auto register_at = [&](const std::string& address, const std::string& token) {
    auto stub =
        v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) context.AddMetadata(ClusterToken::kMetadataKey, token);
    v1::RegisterWorkerResponse response;
    return stub->RegisterWorker(&context, fake, &response).error_code();
  };
  auto stats_at = [&](const std::string& address, const std::string& token) {
    auto stub =
        v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) context.AddMetadata(ClusterToken::kMetadataKey, token);
    v1::StatsResponse response;
    return stub->Stats(&context, v1::StatsRequest(), &response).error_code();
  };
  auto hot_ratio_at = [&](const std::string& address) {
    auto stub =
        v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SetHotRatioRequest request;
    request.set_hot_ratio(0.0f);
    v1::SetHotRatioResponse response;
    return stub->SetHotRatio(&context, request, &response).error_code();
  };
  // The client port: no such services.
  EXPECT_EQ(register_at(cluster.address(), ""), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(stats_at(cluster.address(), ""), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(hot_ratio_at(cluster.address()), grpc::StatusCode::UNIMPLEMENTED);
  // The internal listener: the token or nothing.
  const std::string wrong(64, 'a');
  EXPECT_EQ(register_at(info.internal, ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(register_at(info.internal, wrong), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stats_at(info.internal, ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stats_at(info.internal, wrong), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(hot_ratio_at(info.internal), grpc::StatusCode::UNAUTHENTICATED);
  // strata-cache's listener too.
  {
    auto stub = v1::ExpertStore::NewStub(
        grpc::CreateChannel(dir.socket("cache"), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ExpertLayout layout;
    EXPECT_EQ(stub->GetLayout(&context, v1::GetLayoutRequest(), &layout).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Nothing of the cluster changed: its own worker still serves every request.
  const Generated g = GenerateGreedy(cluster.address(), {1, 2, 3}, 8);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(RouterStats(cluster.address()).workers(0).tiers().hot_hits() > 0, true);
  EXPECT_EQ(Health(cluster.address()), kServing);

  // An ordered stop leaves nothing behind: no segment of the cluster, no directory.
  EXPECT_EQ(cluster.Stop(), 0);
  EXPECT_THAT(SharedSegment::ListOwned(dir.shm_prefix()), IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(dir.path));
}

// A worker stopped with SIGSTOP mid-generation costs the running request its stalled layer and
// a second or two, not minutes: the router declares it failed once its heartbeat stands still
// (1.5 s), the other worker runs its experts, health and stats say so; strata up kills it after
// worker_kill_after_s and the replacement registers.
TEST(TrustTest, StoppedWorkerIsDeclaredFailedRoutedAroundAndRestarted) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1",
                          "--worker-kill-after-s=3"});
  ASSERT_FALSE(cluster.address().empty());
  const std::vector<uint32_t> prompt = Prompt(12, 2);
  const int kNewTokens = 300;
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, kNewTokens);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();

  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), prompt, kNewTokens, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  const pid_t worker = ChildWithArgs(cluster.pid(), "strata-worker", "--index=1");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(worker, SIGSTOP), 0);
  // A small request sent after the stop is answered within the bar too.
  const auto small_start = std::chrono::steady_clock::now();
  const Generated small = GenerateGreedy(cluster.address(), Prompt(6, 3), 4);
  const double small_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - small_start).count();
  EXPECT_TRUE(small.status.ok()) << small.status.error_message();
  EXPECT_LT(small_s, 3.0);

  const Generated g = running.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, undisturbed.tokens);
  EXPECT_LT(g.longest_gap_ms, 3000.0);
  std::printf("stopped worker: longest gap between tokens %.0f ms, small request %.2f s\n",
              g.longest_gap_ms, small_s);

  // Declared failed, and said so, until it is replaced.
  const v1::StatsResponse stats = RouterStats(cluster.address());
  ASSERT_EQ(stats.workers_size(), 2);
  if (!stats.workers(1).connected()) {
    EXPECT_TRUE(stats.workers(1).stalled());
    EXPECT_THAT(stats.workers(1).failure(), HasSubstr("stopped answering"));
    EXPECT_GE(stats.reroutes(), 1u);
  }
  const pid_t replacement =
      AwaitReplacement(cluster.pid(), "strata-worker", "--index=1", worker, 30);
  ASSERT_GT(replacement, 0);
  EXPECT_TRUE(WaitForHealth(cluster.address(), kServing, 60));
  EXPECT_TRUE(PollUntil([&] { return RouterStats(cluster.address()).workers(1).connected(); },
                        std::chrono::seconds(30)));
  EXPECT_EQ(RouterStats(cluster.address()).workers(1).failure(), "");
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompt, kNewTokens).tokens, undisturbed.tokens);
  EXPECT_EQ(cluster.Stop(), 0);
}

// A stopped worker that continues before strata up would kill it finds its channel closed and
// registers again by itself: the same process serves its experts again.
TEST(TrustTest, ContinuedWorkerRegistersAgain) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1",
                          "--worker-kill-after-s=600"});
  ASSERT_FALSE(cluster.address().empty());
  const std::vector<uint32_t> prompt = Prompt(9, 4);
  const Generated undisturbed = GenerateGreedy(cluster.address(), prompt, 16);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  const pid_t worker = ChildWithArgs(cluster.pid(), "strata-worker", "--index=0");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(worker, SIGSTOP), 0);
  // Noticed with no request running.
  EXPECT_TRUE(WaitForHealth(cluster.address(), kNotServing, 10));
  const v1::StatsResponse stats = RouterStats(cluster.address());
  EXPECT_FALSE(stats.workers(0).connected());
  EXPECT_TRUE(stats.workers(0).stalled());
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompt, 16).tokens, undisturbed.tokens);
  ASSERT_EQ(::kill(worker, SIGCONT), 0);
  EXPECT_TRUE(WaitForHealth(cluster.address(), kServing, 30));
  EXPECT_EQ(ChildWithArgs(cluster.pid(), "strata-worker", "--index=0"), worker);
  EXPECT_TRUE(RouterStats(cluster.address()).workers(0).connected());
  EXPECT_EQ(GenerateGreedy(cluster.address(), prompt, 16).tokens, undisturbed.tokens);
  EXPECT_EQ(cluster.Stop(), 0);
}

// What a SIGKILLed strata up leaves (its directory, its segments) goes when the next cluster of
// the same user starts.
TEST(TrustTest, AKilledClusterIsSweptByTheNextOne) {
  ClusterDir dead;
  {
    ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=1", "--threads=1"});
    ASSERT_FALSE(cluster.address().empty());
    dead = FindCluster(cluster.address()).first;
    ASSERT_FALSE(SharedSegment::ListOwned(dead.shm_prefix()).empty());
    // strata up and all its children killed, as the OOM killer would: the supervisor first
    // held (it would restart them), its children killed, then it.
    ASSERT_EQ(::kill(cluster.pid(), SIGSTOP), 0);
    for (const char* name : {"strata-router", "strata-worker", "strata-cache"}) {
      for (pid_t child; (child = ChildWithArgs(cluster.pid(), name, "--")) > 0;) {
        ::kill(child, SIGKILL);
        PollUntil([&] { return ChildWithArgs(cluster.pid(), name, "--") != child; },
                  std::chrono::seconds(5));
      }
    }
    ASSERT_EQ(::kill(cluster.pid(), SIGKILL), 0);
    ASSERT_TRUE(
        PollUntil([&] { return !ProcessAlive(cluster.pid(), 0); }, std::chrono::seconds(10)));
  }
  ClusterProcess next({"--model=" + OracleDir("qwen3_moe"), "--workers=1", "--threads=1"});
  ASSERT_FALSE(next.address().empty());
  EXPECT_FALSE(std::filesystem::exists(dead.path));
  EXPECT_THAT(SharedSegment::ListOwned(dead.shm_prefix()), IsEmpty());
  EXPECT_EQ(next.Stop(), 0);
}

}  // namespace
}  // namespace strata
