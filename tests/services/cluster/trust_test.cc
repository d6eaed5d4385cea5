// What a client of the published port, another local user, or a stopped process can do to a
// running cluster (docs/security.md): internal services are off the client port and refuse
// calls without the cluster token; a worker that stops answering is declared failed within
// seconds, its experts rerouted, and is killed and restarted unless it recovers; a cluster
// leaves nothing in /dev/shm or its runtime directory when it stops.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_token.h"
#include "common/cluster/protocol_version.h"
#include "common/cluster/runtime_dir.h"
#include "common/shm/process_liveness.h"
#include "common/shm/shared_segment.h"
#include "common/util/read_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/health_client.h"
#include "tests/testing/http_post.h"
#include "tests/testing/oracles.h"
#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::AwaitReplacement;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::ConnectLoopback;
using ::strata::testing::FirstTokens;
using ::strata::testing::FreeTcpPort;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::Health;
using ::strata::testing::kNotServing;
using ::strata::testing::kServing;
using ::strata::testing::OracleDir;
using ::strata::testing::PollUntil;
using ::strata::testing::PostRaw;
using ::strata::testing::RouterStats;
using ::strata::testing::SignalChild;
using ::strata::testing::WaitForHealth;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const std::string kDemoModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";

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

// One call of `method` with `request` as its raw bytes, as a client that does not use the proto
// (or means harm) would send it; the status and, for unary calls, the response bytes.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& request, bool server_streaming = false) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  auto wait = [&] {
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);
    return ok;
  };
  grpc::Status status;
  if (!server_streaming) {
    grpc::ByteBuffer response;
    auto call = stub.PrepareUnaryCall(&context, method, buffer, &cq);
    call->StartCall();
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    wait();
  } else {
    auto call = stub.PrepareCall(&context, method, &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    wait();
    call->Write(buffer, reinterpret_cast<void*>(2));
    wait();
    call->WritesDone(reinterpret_cast<void*>(3));
    wait();
    grpc::ByteBuffer response;
    do {
      call->Read(&response, reinterpret_cast<void*>(4));
    } while (wait());
    call->Finish(&status, reinterpret_cast<void*>(5));
    wait();
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// A length-delimited protobuf field: tag, length, bytes.
std::string Field(int number, const std::string& bytes) {
  std::string out;
  out.push_back(static_cast<char>((number << 3) | 2));
  for (size_t n = bytes.size();; n >>= 7) {
    out.push_back(static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0)));
    if (n < 0x80) break;
  }
  return out + bytes;
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
  // With the token, a worker of a build that speaks another protocol version is refused.
  {
    const absl::StatusOr<std::string> file = ReadFileToString(dir.token_file());
    ASSERT_TRUE(file.ok()) << file.status();
    const std::string token(absl::StripAsciiWhitespace(*file));  // the file ends in a newline
    fake.set_protocol_version(kClusterProtocolVersion + 1);
    EXPECT_EQ(register_at(info.internal, token), grpc::StatusCode::FAILED_PRECONDITION);
    fake.clear_protocol_version();  // a build from before the field
    EXPECT_EQ(register_at(info.internal, token), grpc::StatusCode::FAILED_PRECONDITION);
  }
  // strata-expert-store's listener too.
  {
    auto stub = v1::ExpertStore::NewStub(
        grpc::CreateChannel(dir.socket("expert-store"), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ExpertLayout layout;
    EXPECT_EQ(stub->GetLayout(&context, v1::GetLayoutRequest(), &layout).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The workers took their channels: no channel name is left in /dev/shm to plant or leak.
  EXPECT_THAT(SharedSegment::ListOwned(dir.shm_prefix() + "-w"), IsEmpty());
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
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(
      SignalChild(cluster.pid(), "strata-worker", "--index=1", SIGSTOP, &worker));
  // A small request sent after the stop is answered within the bar too.
  const auto small_start = std::chrono::steady_clock::now();
  const Generated small = GenerateGreedy(cluster.address(), Prompt(6, 3), 4);
  const double small_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - small_start).count();
  EXPECT_TRUE(small.status.ok()) << small.status.error_message();
  EXPECT_LT(small_s, 3.0);
  // Declared failed (1.5 s) and said so in stats, well before it is killed (3 s later) and
  // replaced.
  v1::StatsResponse failed;
  EXPECT_TRUE(PollUntil(
      [&] {
        failed = RouterStats(cluster.address());
        return failed.workers_size() == 2 && !failed.workers(1).failure().empty();
      },
      std::chrono::seconds(4)));
  if (failed.workers_size() == 2) {
    EXPECT_TRUE(failed.workers(1).stalled());
    EXPECT_THAT(failed.workers(1).failure(), HasSubstr("stopped answering"));
  }

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

// Every request the router cannot use gets INVALID_ARGUMENT and a message saying why (text that
// is not UTF-8 names its field; bytes that are not the message say so), nothing in the log.
TEST(TrustTest, MalformedRequestsGetInvalidArgumentWithAMessage) {
  const testing::TempDir dir;
  const std::string log = dir.File("cluster.log");
  ClusterProcess cluster({"--model=" + kDemoModel, "--workers=1", "--threads=1"}, 120, log);
  ASSERT_FALSE(cluster.address().empty());
  const std::string bad = "caf\xc3 \xff\xfe";
  const std::string max_new = std::string("\x20\x04");  // max_new_tokens = 4
  struct Case {
    std::string method;
    std::string request;
    bool streaming;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"Generate", Field(2, bad) + max_new, true, "field prompt is not valid UTF-8"},
      {"Generate", Field(2, "hello") + Field(6, bad) + max_new, true,
       "field stop is not valid UTF-8"},
      {"Generate", Field(1, bad) + Field(2, "hello") + max_new, true,
       "field request_id is not valid UTF-8"},
      {"Tokenize", Field(1, bad), false, "field text is not valid UTF-8"},
      {"Score", Field(1, bad), false, "field text is not valid UTF-8"},
      {"Generate", "\xff\xff\xff\xff\x01garbage", true, "not a strata.v1.GenerateRequest message"},
      {"Tokenize", "\x0a\x7fshort", false, "not a strata.v1.TokenizeRequest message"},
      {"Detokenize", "\xff\xff", false, "not a strata.v1.DetokenizeRequest message"},
      {"Score", "\x0b", false, "not a strata.v1.ScoreRequest message"},
      {"ModelInfo", std::string("\x0a\x05") + "ab", false,
       "not a strata.v1.ModelInfoRequest message"},
  };
  for (int round = 0; round < 3; ++round) {  // again and again: still no log lines
    for (const Case& c : cases) {
      const grpc::Status s =
          RawCall(cluster.address(), "/strata.v1.Generation/" + c.method, c.request, c.streaming);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": " << c.says;
      EXPECT_THAT(s.error_message(), HasSubstr(c.says)) << c.method;
    }
  }
  // Well-formed ones still work.
  EXPECT_TRUE(
      RawCall(cluster.address(), "/strata.v1.Generation/Tokenize", Field(1, "caf\xc3\xa9")).ok());
  EXPECT_EQ(cluster.Stop(), 0);
  std::ifstream in(log);
  const std::string logged((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(logged, Not(HasSubstr("libprotobuf")));
  EXPECT_THAT(logged, Not(HasSubstr("UTF-8")));
}

// Prompts that cannot fit are refused by their size before they are tokenized: a 60 MB one by
// the request size limit, a 7 MB one by its length against the context. Four of them at once
// leave a small request's latency under a second; Tokenize is bounded the same way.
TEST(TrustTest, HugePromptsAreRefusedBeforeAnyWork) {
  ClusterProcess cluster({"--model=" + kDemoModel, "--workers=1", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto generate_text = [&](const std::string& text) {
    v1::GenerateRequest request;
    request.set_prompt(text);
    request.set_max_new_tokens(4);
    return testing::Generate(*testing::GenerationStub(cluster.address()), request);
  };
  const std::string huge(60 << 20, 'a');
  const std::string big = std::string(7 << 20, ' ') + "word";
  auto start = std::chrono::steady_clock::now();
  const Generated too_large = generate_text(huge);
  EXPECT_EQ(too_large.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << too_large.status.error_message();
  const Generated too_long = generate_text(big);
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("tokens; the context holds 2048"));
  const double refusals_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(refusals_s, 5.0);  // 67 MB sent on loopback, nothing tokenized

  std::vector<std::future<Generated>> flood;
  for (int i = 0; i < 4; ++i) {
    flood.push_back(
        std::async(std::launch::async, [&, i] { return generate_text(i % 2 == 0 ? huge : big); }));
  }
  start = std::chrono::steady_clock::now();
  v1::GenerateRequest small;
  small.set_prompt("In the beginning");
  small.set_max_new_tokens(2);
  const Generated answered = testing::Generate(*testing::GenerationStub(cluster.address()), small);
  const double small_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_LT(small_s, 1.0);
  std::printf("small request during four huge prompts: %.3f s\n", small_s);
  for (auto& f : flood) {
    const grpc::Status refused = f.get().status;
    EXPECT_TRUE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << refused.error_code() << " " << refused.error_message();
  }

  // Tokenize: the same bound.
  auto stub = testing::GenerationStub(cluster.address());
  grpc::ClientContext context;
  v1::TokenizeRequest tokenize;
  tokenize.set_text(big);
  v1::TokenizeResponse ids;
  const grpc::Status tokenized = stub->Tokenize(&context, tokenize, &ids);
  EXPECT_EQ(tokenized.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << tokenized.error_message();
  EXPECT_EQ(ids.token_ids_size(), 0);
  EXPECT_EQ(cluster.Stop(), 0);
}

// Fields whose size would cost every request engine time or the log its shape are bounded:
// stop strings (16 of at most 1 KiB: each token is checked against each), request ids (256
// bytes, no control characters), Detokenize (the context's tokens at once).
TEST(TrustTest, OversizedFieldsAreRefused) {
  ClusterProcess cluster({"--model=" + kDemoModel, "--workers=1", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = testing::GenerationStub(cluster.address());
  v1::GenerateRequest many_stops;
  many_stops.set_prompt("In the beginning");
  many_stops.set_max_new_tokens(4);
  for (int i = 0; i < 17; ++i) many_stops.add_stop(absl::StrCat("stop", i));
  Generated g = testing::Generate(*stub, many_stops);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(g.status.error_message(), HasSubstr("at most 16 stop strings"));
  v1::GenerateRequest long_stop = many_stops;
  long_stop.clear_stop();
  long_stop.add_stop(std::string(2000, 'x'));
  EXPECT_EQ(testing::Generate(*stub, long_stop).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest forged = long_stop;
  forged.clear_stop();
  forged.set_request_id("abc\n2026-12-06 strata-router [error]: forged");
  g = testing::Generate(*stub, forged);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(g.status.error_message(), HasSubstr("request_id"));
  grpc::ClientContext context;
  v1::DetokenizeRequest detokenize;
  for (int i = 0; i < 3000; ++i) detokenize.add_token_ids(0);
  v1::DetokenizeResponse text;
  const grpc::Status s = stub->Detokenize(&context, detokenize, &text);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(cluster.Stop(), 0);
}

// A burst into an idle server is not refused for waiting: only requests beyond the running
// batch's free places count against --max-queued-requests.
TEST(TrustTest, ABurstWithinTheRunningBatchIsAdmitted) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=1", "--threads=1",
                          "--max-queued-requests=4"});
  ASSERT_FALSE(cluster.address().empty());
  std::vector<std::future<Generated>> burst;
  for (int i = 0; i < 16; ++i) {
    burst.push_back(GenerateGreedyAsync(cluster.address(), Prompt(8, i), 8));
  }
  for (auto& f : burst) {
    const Generated g = f.get();
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  }
  EXPECT_EQ(cluster.Stop(), 0);
}

// A stop whose drain time runs out ends the requests it cuts off with UNAVAILABLE (retry), not
// with a CANCELLED reason under an OK status.
TEST(TrustTest, RequestsCutOffByADrainTimeoutEndUnavailable) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=1", "--threads=1",
                          "--drain-timeout-s=0.3"});
  ASSERT_FALSE(cluster.address().empty());
  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), Prompt(8, 5), 2000, first.Callback());
  ASSERT_TRUE(first.Wait());
  cluster.Stop();
  const Generated g = running.get();
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
  EXPECT_THAT(g.status.error_message(), HasSubstr("stopped before this request finished"));
}

// The HTTP API keeps serving while 520 connections sit idle on it (the oldest make room), and
// an 8 MB JSON prompt is refused by its size, before it is tokenized.
TEST(TrustTest, HttpSurvivesIdleConnectionsAndHugePrompts) {
  const int port = FreeTcpPort();
  ClusterProcess cluster({"--model=" + kDemoModel, "--workers=1", "--threads=1",
                          "--http-port=" + std::to_string(port)});
  ASSERT_FALSE(cluster.address().empty());
  const std::string ok_body =
      R"({"model": "strata-demo", "prompt": "In the beginning", "max_tokens": 2})";
  std::vector<int> idle;
  for (int i = 0; i < 520; ++i) idle.push_back(ConnectLoopback(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  int served = 0;
  for (int i = 0; i < 5; ++i) {
    served += absl::StrContains(PostRaw(port, "/v1/completions", ok_body), "200 OK") ? 1 : 0;
  }
  EXPECT_EQ(served, 5);
  for (int fd : idle) {
    if (fd >= 0) ::close(fd);
  }
  const std::string huge = R"({"model": "strata-demo", "max_tokens": 4, "prompt": ")" +
                           std::string(8000000, 'a') + R"("})";
  const auto start = std::chrono::steady_clock::now();
  const std::string refused = PostRaw(port, "/v1/completions", huge);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(refused, HasSubstr("400"));
  EXPECT_THAT(refused, HasSubstr("context_length_exceeded"));
  EXPECT_LT(seconds, 2.0);
  std::printf("HTTP: 8 MB prompt refused in %.3f s\n", seconds);
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
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(
      SignalChild(cluster.pid(), "strata-worker", "--index=0", SIGSTOP, &worker));
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
    for (const char* name : {"strata-router", "strata-worker", "strata-expert-store"}) {
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
