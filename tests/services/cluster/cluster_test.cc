// The cluster as separate processes (`strata up`: expert store, workers, router) on loopback,
// driven through the public gRPC API.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "common/engine/local_engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_eval.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/oracles.h"
#include "tests/testing/run_strata.h"
#include "tests/testing/temp_dir.h"
#include "tools/strata/eval_command.h"
#include "tools/strata/make_model.h"

namespace strata {
namespace {

using ::strata::testing::ClusterProcess;
using ::strata::testing::Generate;
using ::strata::testing::Generated;
using ::strata::testing::GenerationStub;
using ::strata::testing::GreedyRequest;
using ::strata::testing::LoadOracle;
using ::strata::testing::OracleDir;

// A greedy request for an oracle case's prompt, as long as its greedy continuation.
v1::GenerateRequest GreedyRequestFor(const nlohmann::json& oracle_case) {
  return GreedyRequest(oracle_case["prompt"].get<std::vector<uint32_t>>(),
                       static_cast<int>(oracle_case["greedy"].size()));
}

class OracleClusterTest : public ::testing::TestWithParam<std::string> {};

// Greedy Generate through a two-worker cluster gives transformers' greedy tokens.
TEST_P(OracleClusterTest, TwoWorkersMatchTheOracle) {
  ClusterProcess cluster({"--model=" + OracleDir(GetParam()), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty()) << "the cluster did not become ready";
  auto stub = GenerationStub(cluster.address());
  const auto oracle = LoadOracle(GetParam());
  for (const auto& c : oracle["cases"]) {
    const Generated g = Generate(*stub, GreedyRequestFor(c));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, c["greedy"].get<std::vector<uint32_t>>());
    EXPECT_EQ(g.finish, v1::FINISH_REASON_LENGTH);
  }
  EXPECT_EQ(cluster.Stop(), 0);
}

// Every oracle model (tests/data/oracles): every architecture and its variants.
INSTANTIATE_TEST_SUITE_P(AllOracles, OracleClusterTest,
                         ::testing::ValuesIn(::strata::testing::OracleNames()),
                         [](const auto& info) { return info.param; });

// A checkpoint with FP8 E4M3 experts (`strata make-model --dtype fp8`): the store carries
// their scales to the workers, per row (tiny-qwen3) or per 128 x 128 block (tiny-deepseek
// with --fp8-scaling block, DeepSeek's layout), and the cluster gives the in-process engine's
// greedy tokens.
class Fp8ClusterTest : public ::testing::TestWithParam<std::pair<std::string, Fp8Scaling>> {};

TEST_P(Fp8ClusterTest, CheckpointMatchesInProcess) {
  testing::TempDir tmp;
  MakeModelOptions make;
  make.shape = GetParam().first;
  make.out_dir = tmp.File("fp8");
  make.dtype = "fp8";
  make.fp8_scaling = GetParam().second;
  make.num_threads = 2;
  auto made = MakeModel(make);
  ASSERT_TRUE(made.ok()) << made.status();
  const std::vector<int32_t> prompt = {5, 17, 3, 99, 42};
  LocalEngineOptions options;
  options.model_dir = make.out_dir;
  options.num_threads = 1;
  auto engine = LocalEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateOptions greedy;
  greedy.max_new_tokens = 8;
  greedy.ignore_eos = true;
  auto want = (*engine)->Generate(prompt, greedy);
  ASSERT_TRUE(want.ok()) << want.status();

  // Workers that hold every expert, and workers whose memory budget holds only some of them
  // (copied into slots as needed, scales with them).
  // And strata-expert-store mapping the checkpoint in place.
  for (const std::string extra : {"", "--gpu-memory-budget=1MiB", "--expert-store=in-place"}) {
    std::vector<std::string> args = {"--model=" + make.out_dir, "--workers=2", "--threads=1"};
    if (!extra.empty()) args.push_back(extra);
    ClusterProcess cluster(args);
    ASSERT_FALSE(cluster.address().empty()) << "the cluster did not become ready " << extra;
    auto stub = GenerationStub(cluster.address());
    const Generated g =
        Generate(*stub, GreedyRequest(std::vector<uint32_t>(prompt.begin(), prompt.end()), 8));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, std::vector<uint32_t>(want->begin(), want->end())) << extra;
    EXPECT_EQ(cluster.Stop(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Fp8ClusterTest,
    ::testing::Values(std::pair<std::string, Fp8Scaling>{"tiny-qwen3", Fp8Scaling::kChannel},
                      std::pair<std::string, Fp8Scaling>{"tiny-deepseek", Fp8Scaling::kBlock}),
    [](const auto& info) { return info.param.second == Fp8Scaling::kBlock ? "Block" : "Channel"; });

TEST(ClusterTest, GrpcTransportMatchesTheOracle) {
  ClusterProcess cluster(
      {"--model=" + OracleDir("mixtral_long"), "--workers=2", "--threads=1", "--transport=grpc"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  const auto oracle = LoadOracle("mixtral_long");
  const auto& c = oracle["cases"][0];
  const Generated g = Generate(*stub, GreedyRequestFor(c));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, c["greedy"].get<std::vector<uint32_t>>());
}

// What one greedy request per prompt gives over the gRPC transport with `activations`
// (f32 or fp8), the perplexity of held-out text through it, and the expert bytes the router
// counted per token it handled.
struct GrpcRun {
  std::vector<std::vector<uint32_t>> tokens;
  double perplexity = 0;
  double bytes_per_token = 0;
};

GrpcRun RunOverGrpc(const std::string& activations,
                    const std::vector<std::vector<uint32_t>>& prompts, int new_tokens) {
  GrpcRun run;
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  ClusterProcess cluster({"--model=" + model, "--workers=2", "--threads=1", "--transport=grpc",
                          "--expert-activations=" + activations});
  EXPECT_FALSE(cluster.address().empty()) << activations;
  if (cluster.address().empty()) return run;
  auto stub = GenerationStub(cluster.address());
  for (const auto& prompt : prompts) {
    const Generated g = Generate(*stub, GreedyRequest(prompt, new_tokens));
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    run.tokens.push_back(g.tokens);
  }
  const auto eval =
      strata::testing::RunStrata("eval --model " + model + " --text " + STRATA_TEST_DATA_DIR +
                                 "/heldout/strata-demo-valid.txt --server " + cluster.address());
  EXPECT_EQ(eval.exit_code, 0) << eval.out;
  // The JSON is the last line (progress may come before it, on stderr).
  const std::string out = eval.out.substr(0, eval.out.find_last_not_of('\n') + 1);
  if (eval.exit_code == 0) {
    run.perplexity = nlohmann::json::parse(out.substr(out.find_last_of('\n') + 1))["perplexity"];
  }
  const auto result = strata::testing::RunStrata("stats --server " + cluster.address());
  EXPECT_EQ(result.exit_code, 0) << result.out;
  if (result.exit_code == 0) {
    const auto stats = nlohmann::json::parse(result.out);
    EXPECT_EQ(stats["expert_activations"].get<std::string>(), activations);
    const double bytes = stats["expert_wire_bytes_sent"].get<double>() +
                         stats["expert_wire_bytes_received"].get<double>();
    run.bytes_per_token =
        bytes / (stats["generated_tokens"].get<double>() + stats["prompt_tokens"].get<double>());
  }
  EXPECT_EQ(cluster.Stop(), 0);
  return run;
}

// FP8 activations over gRPC (E4M3, a scale per token) move about a quarter of the bytes and
// leave the held-out perplexity within 0.5% of float32 activations. They are not exact: on the
// demo model's three reference prompts the greedy tokens agree for the first 6, 15 and 64 (all)
// of 64 (near-ties between logits go the other way), so only the first token is required equal.
TEST(ClusterTest, GrpcFp8ActivationsStayClose) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/models/strata-demo/reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<std::vector<uint32_t>> prompts;
  for (const auto& p : reference["generation"]["prompts"]) {
    prompts.push_back(p["input_ids"].get<std::vector<uint32_t>>());
  }
  ASSERT_GE(prompts.size(), 2u);
  const int kNewTokens = 64;
  const GrpcRun f32 = RunOverGrpc("f32", prompts, kNewTokens);
  const GrpcRun fp8 = RunOverGrpc("fp8", prompts, kNewTokens);
  ASSERT_EQ(f32.tokens.size(), prompts.size());
  ASSERT_EQ(fp8.tokens.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_FALSE(f32.tokens[i].empty());
    ASSERT_EQ(fp8.tokens[i].size(), f32.tokens[i].size());
    EXPECT_EQ(fp8.tokens[i][0], f32.tokens[i][0]) << "prompt " << i;
    size_t agree = 0;
    while (agree < f32.tokens[i].size() && fp8.tokens[i][agree] == f32.tokens[i][agree]) ++agree;
    std::cout << "prompt " << i << ": fp8 agrees with f32 for " << agree << " of "
              << f32.tokens[i].size() << " greedy tokens\n";
  }
  ASSERT_GT(f32.perplexity, 1.0);
  EXPECT_NEAR(fp8.perplexity / f32.perplexity, 1.0, 0.005)
      << fp8.perplexity << " against " << f32.perplexity;
  ASSERT_GT(f32.bytes_per_token, 0);
  // Hidden rows and partial sums shrink 4x; routing, scales and headers do not.
  EXPECT_LT(fp8.bytes_per_token, 0.35 * f32.bytes_per_token)
      << fp8.bytes_per_token << " against " << f32.bytes_per_token;
  EXPECT_GT(fp8.bytes_per_token, 0.2 * f32.bytes_per_token);
}

TEST(ClusterTest, ConcurrentRequestsMatchSequential) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  std::mt19937 rng(5);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 32; ++i) {
    std::vector<uint32_t> prompt(1 + rng() % 70);
    for (auto& id : prompt) id = 3 + rng() % 700;
    v1::GenerateRequest r = GreedyRequest(prompt, 1 + static_cast<int>(rng() % 10));
    if (i % 4 == 1) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_seed(1000 + i);
      r.mutable_sampling()->set_top_k(50);
    }
    requests.push_back(r);
  }
  std::vector<Generated> sequential;
  for (const auto& r : requests) sequential.push_back(Generate(*stub, r));
  std::vector<std::future<Generated>> concurrent;
  for (const auto& r : requests) {
    concurrent.push_back(std::async(std::launch::async, [&, r] { return Generate(*stub, r); }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Generated c = concurrent[i].get();
    ASSERT_TRUE(sequential[i].status.ok()) << sequential[i].status.error_message();
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    EXPECT_EQ(c.tokens, sequential[i].tokens) << "request " << i;
    EXPECT_EQ(c.tokens.size(), requests[i].max_new_tokens());
  }
}

TEST(ClusterTest, BadInputGetsInvalidArgument) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=1", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  auto expect_invalid = [&](const v1::GenerateRequest& r, const std::string& what) {
    const Generated g = Generate(*stub, r);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_FALSE(g.status.error_message().empty()) << what;
  };
  expect_invalid(GreedyRequest(std::vector<uint32_t>(2048, 7), 4),
                 "prompt longer than the context");
  expect_invalid(GreedyRequest({1, 2, 3}, 0), "max_new_tokens 0");
  expect_invalid(GreedyRequest({1, 2, 3}, 100000), "max_new_tokens over the limit");
  expect_invalid(GreedyRequest({1, 512}, 4), "token id outside the vocabulary");
  expect_invalid(GreedyRequest({}, 4), "empty prompt");
  v1::GenerateRequest both = GreedyRequest({1, 2}, 4);
  both.set_prompt("hello");
  expect_invalid(both, "prompt and prompt_token_ids");
  v1::GenerateRequest text;
  text.set_prompt("hello");
  text.set_max_new_tokens(4);
  expect_invalid(text, "text prompt for a model without a tokenizer");
  v1::GenerateRequest hot = GreedyRequest({1, 2}, 4);
  hot.mutable_sampling()->set_temperature(2.5f);
  expect_invalid(hot, "temperature above 2");
  v1::GenerateRequest no_mass = GreedyRequest({1, 2}, 4);
  no_mass.mutable_sampling()->set_top_p(0.0f);
  expect_invalid(no_mass, "top_p 0, set");
}

// The sampling rules every front end shares (NormalizeSampling): an explicit seed of 0 repeats
// like any other, no seed draws anew, and top_k at or above the vocabulary keeps all of it.
TEST(ClusterTest, SamplingFollowsTheSharedRules) {
  ClusterProcess cluster({"--model=" + OracleDir("qwen3_moe"), "--workers=1", "--threads=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  auto sampled = [&](std::optional<uint64_t> seed, uint32_t top_k) {
    v1::GenerateRequest r = GreedyRequest({5, 6, 7}, 24);
    r.mutable_sampling()->set_temperature(1.5f);
    if (seed) r.mutable_sampling()->set_seed(*seed);
    if (top_k > 0) r.mutable_sampling()->set_top_k(top_k);
    const Generated g = Generate(*stub, r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    return g.tokens;
  };
  EXPECT_EQ(sampled(0, 0), sampled(0, 0));
  EXPECT_EQ(sampled(0, 0), sampled(0, 100000));  // a limit beyond the vocabulary is none
  // Unseeded: 24 tokens at temperature 1.5 over a 512-token vocabulary repeat by chance
  // about never.
  EXPECT_NE(sampled(std::nullopt, 0), sampled(std::nullopt, 0));
}

TEST(ClusterTest, DeadlineCancelsAndFreesTheBlocks) {
  // 1 MiB of KV cache holds 32 blocks of 32 tokens for this model: a 1024-token context.
  ClusterProcess cluster(
      {"--model=" + OracleDir("qwen3_moe_long"), "--workers=2", "--threads=1", "--kv-cache-mb=1"});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  const Generated cut = Generate(*stub, GreedyRequest(std::vector<uint32_t>(100, 9), 900), nullptr,
                                 std::chrono::milliseconds(300));
  EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Only if the cancelled request gave its blocks back can one that needs every block run.
  const Generated after = Generate(*stub, GreedyRequest(std::vector<uint32_t>(1000, 9), 24),
                                   nullptr, std::chrono::seconds(60));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 24u);
  EXPECT_EQ(cluster.Stop(), 0) << "every request should have been finished or cancelled";
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Perplexity through the cluster's Score RPC equals the in-process figure.
TEST(ClusterTest, ScoreMatchesInProcessPerplexity) {
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  // The first 3 KB of the held-out text, a few windows' worth.
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.txt");
  std::string text(3000, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const std::string path = ::testing::TempDir() + "/score_text.txt";
  std::ofstream(path) << text;

  EvalOptions options;
  options.engine.model_dir = model;
  options.engine.num_threads = 2;
  options.text_file = path;
  options.window = 128;
  EvalResult local, remote;
  ASSERT_NO_FATAL_FAILURE(::strata::testing::EvaluateInProcessAndInCluster(
      options, {"--model=" + model, "--workers=2", "--threads=1"}, &local, &remote));
  EXPECT_EQ(remote.tokens, local.tokens);
  EXPECT_NEAR(remote.perplexity, local.perplexity, 1e-4 * local.perplexity);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A placement made by `strata plan` from calibration counts: the cluster follows it and still
// gives the oracle's tokens; a plan for another worker count stops the router at start-up.
TEST(ClusterTest, PlacementFromStrataPlan) {
  const std::string model = OracleDir("qwen3_moe_long");
  const auto oracle = LoadOracle("qwen3_moe_long");
  const std::string calibration = ::testing::TempDir() + "/calibration.jsonl";
  {
    std::ofstream out(calibration);
    for (const auto& c : oracle["cases"])
      out << nlohmann::json{{"token_ids", c["all_ids"]}}.dump() << "\n";
  }
  const std::string plan = ::testing::TempDir() + "/plan.json";
  const auto planned = strata::testing::RunStrata("plan --model " + model + " --calibration " +
                                                  calibration + " --workers 2 --out " + plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.out;

  ClusterProcess cluster({"--model=" + model, "--workers=2", "--threads=1", "--plan=" + plan});
  ASSERT_FALSE(cluster.address().empty());
  auto stub = GenerationStub(cluster.address());
  for (const auto& c : oracle["cases"]) {
    const Generated g = Generate(*stub, GreedyRequestFor(c));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, c["greedy"].get<std::vector<uint32_t>>());
  }
  EXPECT_EQ(cluster.Stop(), 0);

  ClusterProcess mismatched({"--model=" + model, "--workers=3", "--threads=1", "--plan=" + plan},
                            /*ready_timeout_s=*/30);
  EXPECT_TRUE(mismatched.address().empty());
}

}  // namespace
}  // namespace strata
