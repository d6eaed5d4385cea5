// The whole cluster on GPUs (`strata up --device cuda`: router and workers on GPUs, activations
// shared by CUDA IPC) against the float32 references and the in-process GPU engine, with
// cuda_engine_test's tolerance: the greedy token on at least 95% of the rows whose reference
// top-two margin is clear (bf16 may flip closer calls, and the random oracle models amplify
// small differences). One worker per GPU, at most two. Skips without a GPU.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>

#include "common/cuda/cuda_context.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_eval.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"
#include "tests/testing/health_client.h"
#include "tests/testing/oracles.h"
#include "tests/testing/poll.h"
#include "tests/testing/tied_tokens.h"
#include "tools/strata/eval_command.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::AwaitReplacement;
using ::strata::testing::ChildWithArgs;
using ::strata::testing::ClusterProcess;
using ::strata::testing::ExpectSameOrTied;
using ::strata::testing::FirstTokens;
using ::strata::testing::GenerateAsync;
using ::strata::testing::Generated;
using ::strata::testing::GenerateGreedy;
using ::strata::testing::GenerateGreedyAsync;
using ::strata::testing::GreedyRequest;
using ::strata::testing::KillChild;
using ::strata::testing::kServing;
using ::strata::testing::LoadOracle;
using ::strata::testing::OracleDir;
using ::strata::testing::PollUntil;
using ::strata::testing::RouterStats;
using ::strata::testing::Serving;
using ::strata::testing::SignalChild;
using ::strata::testing::WaitForHealth;

int Workers() { return gpu::CudaDeviceCount() >= 2 ? 2 : 1; }

std::vector<std::string> GpuClusterArgs(const std::string& model, int max_batch_tokens = 256) {
  return {"--model=" + model,
          "--device=cuda",
          "--workers=" + std::to_string(Workers()),
          "--threads=2",
          "--max-batch-tokens=" + std::to_string(max_batch_tokens),
          "--max-running=16",
          "--kv-cache-mb=256"};
}

// Whether the reference's top two logits of `row` are apart by more than a tenth of the
// row's RMS (cuda_engine_test's rule: bf16 may flip closer calls), and its argmax.
std::pair<bool, uint32_t> ClearArgmax(const std::vector<float>& row) {
  size_t best = 0, second = 1;
  double norm = 0;
  for (size_t v = 0; v < row.size(); ++v) {
    norm += double{row[v]} * row[v];
    if (row[v] > row[best]) {
      second = best;
      best = v;
    } else if (v != best && row[v] > row[second]) {
      second = v;
    }
  }
  return {row[best] - row[second] > 0.1 * std::sqrt(norm / row.size()),
          static_cast<uint32_t>(best)};
}

int HeadDim(const std::string& name) {
  std::ifstream in(fs::path(OracleDir(name)) / "config.json");
  const auto config = nlohmann::json::parse(in);
  if (config.contains("head_dim") && !config["head_dim"].is_null()) return config["head_dim"];
  return config["hidden_size"].get<int>() / config["num_attention_heads"].get<int>();
}

// The oracle models the CUDA attention kernel takes (head_dim 64 and 128).
std::vector<std::string> GpuOracles() {
  std::vector<std::string> names;
  for (const std::string& name : ::strata::testing::OracleNames()) {
    const int head_dim = HeadDim(name);
    if (head_dim == 64 || head_dim == 128) names.push_back(name);
  }
  return names;
}

class CudaClusterOracleTest : public ::testing::TestWithParam<std::string> {};

// The next token after every prefix of each reference sequence (teacher forcing, as
// cuda_engine_test does in process): the argmax on at least 95% of the rows whose reference
// margin is clear. The prefixes go 16 at a time, so steps mix prefill chunks of several
// sequences. Then the free-running greedy continuations, which must be complete; how far they
// follow the reference is printed.
TEST_P(CudaClusterOracleTest, GreedyMatchesTheReference) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ClusterProcess cluster(GpuClusterArgs(OracleDir(GetParam())));
  ASSERT_FALSE(cluster.address().empty()) << "the GPU cluster did not become ready";
  const auto cases = LoadOracle(GetParam())["cases"];
  struct Row {
    std::vector<uint32_t> prefix;
    uint32_t argmax;
  };
  std::vector<Row> rows;
  for (const auto& c : cases) {
    const auto ids = c["all_ids"].get<std::vector<uint32_t>>();
    for (size_t r = 0; r < ids.size(); ++r) {
      const auto [clear, argmax] = ClearArgmax(c["logits"][r].get<std::vector<float>>());
      if (clear) rows.push_back({std::vector<uint32_t>(ids.begin(), ids.begin() + r + 1), argmax});
    }
  }
  int agreeing = 0;
  for (size_t begin = 0; begin < rows.size(); begin += 16) {
    std::vector<std::future<Generated>> running;
    for (size_t r = begin; r < std::min(rows.size(), begin + 16); ++r) {
      running.push_back(GenerateGreedyAsync(cluster.address(), rows[r].prefix, 1));
    }
    for (size_t i = 0; i < running.size(); ++i) {
      const Generated g = running[i].get();
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      ASSERT_EQ(g.tokens.size(), 1u);
      agreeing += g.tokens[0] == rows[begin + i].argmax;
    }
  }
  int free_running = 0, greedy_total = 0;
  for (const auto& c : cases) {
    const auto greedy = c["greedy"].get<std::vector<uint32_t>>();
    const Generated g = GenerateGreedy(cluster.address(), c["prompt"].get<std::vector<uint32_t>>(),
                                       static_cast<int>(greedy.size()));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    ASSERT_EQ(g.tokens.size(), greedy.size());
    size_t same = 0;
    while (same < greedy.size() && g.tokens[same] == greedy[same]) ++same;
    free_running += static_cast<int>(same);
    greedy_total += static_cast<int>(greedy.size());
  }
  std::cout << GetParam() << " on " << Workers() << " GPU worker(s): argmax " << agreeing << "/"
            << rows.size() << " on clear rows; free-running greedy " << free_running << "/"
            << greedy_total << " tokens before the first difference\n";
  EXPECT_GT(rows.size(), 0u);
  EXPECT_GE(agreeing, static_cast<int>(rows.size()) * 95 / 100);
  EXPECT_EQ(cluster.Stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(HeadDim64And128, CudaClusterOracleTest, ::testing::ValuesIn(GpuOracles()),
                         [](const auto& info) { return info.param; });

// Perplexity of the demo model's held-out text through the GPU cluster's Score RPC (`strata
// eval --server`) within 0.1% of the in-process GPU engine's.
TEST(CudaClusterTest, DemoPerplexityMatchesInProcess) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  EvalOptions options;
  options.engine.model_dir = model;
  options.engine.device = "cuda";
  options.text_file = std::string(STRATA_TEST_DATA_DIR) + "/heldout/strata-demo-valid.txt";
  options.window = 256;
  EvalResult local, remote;
  ASSERT_NO_FATAL_FAILURE(::strata::testing::EvaluateInProcessAndInCluster(
      options, GpuClusterArgs(model, /*max_batch_tokens=*/512), &local, &remote));
  std::cout << "held-out perplexity: in process " << local.perplexity << ", GPU cluster "
            << remote.perplexity << " (" << remote.tokens << " tokens)\n";
  EXPECT_EQ(remote.tokens, local.tokens);
  EXPECT_NEAR(remote.perplexity, local.perplexity, 1e-3 * local.perplexity);
}

// The demo model's prompts of these tests: sequence i has 12 + i tokens.
std::vector<uint32_t> DemoPrompt(int i) {
  std::vector<uint32_t> prompt;
  for (int j = 0; j < 12 + i; ++j) prompt.push_back(static_cast<uint32_t>(100 + 37 * i + j));
  return prompt;
}

// Eight sequences, half of them sampled (top 1), decoding together (batches of one to eight as they
// start and finish) by CUDA graph replay on both sides of the process split, against the same
// cluster with graphs off: the same tokens on the demo model, and the graph cluster ran most
// steps by replay. How the prompts are batched depends on when they arrive (runs take 40 or 41
// steps), and a token's logits depend on its batch in the last bits, so a sequence may part ways
// where two tokens all but tie (ExpectSameOrTied).
TEST(CudaClusterTest, GraphStepsGiveTheEagerTokens) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  constexpr int kSequences = 8;
  constexpr int kNewTokens = 40;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kSequences; ++i) prompts.push_back(DemoPrompt(i));
  auto run = [&](int max_graph_batch, int64_t* graph_steps, int64_t* steps) {
    std::vector<std::string> args = GpuClusterArgs(model);
    args.push_back("--cuda-graph-max-batch=" + std::to_string(max_graph_batch));
    ClusterProcess cluster(args);
    EXPECT_FALSE(cluster.address().empty());
    std::vector<std::future<Generated>> running;
    for (int i = 0; i < kSequences; ++i) {
      // Odd sequences sample from their top 1 (as robust to rounding as greedy): their rows'
      // logits come to the host, the greedy rows of the same replays take the device's argmax.
      v1::GenerateRequest request = GreedyRequest(prompts[i], kNewTokens - 2 * i);
      if (i % 2 == 1) {
        request.mutable_sampling()->set_temperature(0.8f);
        request.mutable_sampling()->set_top_k(1);
        request.mutable_sampling()->set_seed(static_cast<uint64_t>(i));
      }
      running.push_back(GenerateAsync(cluster.address(), std::move(request)));
    }
    std::vector<std::vector<uint32_t>> tokens;
    for (auto& r : running) {
      const Generated g = r.get();
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      tokens.push_back(g.tokens);
    }
    const v1::StatsResponse stats = RouterStats(cluster.address());
    *graph_steps = static_cast<int64_t>(stats.graph_steps());
    *steps = static_cast<int64_t>(stats.steps());
    EXPECT_EQ(cluster.Stop(), 0);
    return tokens;
  };
  int64_t graph_steps = 0, steps = 0, eager_graph_steps = 0, eager_steps = 0;
  const auto replayed = run(32, &graph_steps, &steps);
  const auto eager = run(0, &eager_graph_steps, &eager_steps);
  std::cout << "graph cluster: " << graph_steps << " of " << steps
            << " steps by replay; eager cluster: " << eager_steps << " steps\n";
  for (int i = 0; i < kSequences; ++i) {
    EXPECT_EQ(replayed[i].size(), static_cast<size_t>(kNewTokens - 2 * i));
  }
  ExpectSameOrTied(GpuClusterArgs(model), prompts, replayed, eager, 0.1f);
  EXPECT_EQ(eager_graph_steps, 0);
  EXPECT_GT(graph_steps, steps / 2);
}

// Greedy decode steps launched before the step before them is read (their tokens still on the
// GPU), against the same cluster launching each step after reading the last: one sequence alone
// gives the same tokens bit for bit (the same graphs run the same steps); then seven together,
// of different lengths, and an eighth that its client cancels, so that rows end while a step
// runs behind them: the same tokens, tied where batching differs (ExpectSameOrTied), none of
// them longer or shorter than the other run's.
TEST(CudaClusterTest, OverlappedStepsGiveTheTokensOfStepsOneByOne) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  constexpr int kSequences = 7;
  constexpr int kNewTokens = 48;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kSequences; ++i) prompts.push_back(DemoPrompt(i));
  auto run = [&](bool overlap, int64_t* overlapped_steps) {
    std::vector<std::string> args = GpuClusterArgs(model);
    args.push_back(std::string("--overlap-steps=") + (overlap ? "true" : "false"));
    ClusterProcess cluster(args);
    EXPECT_FALSE(cluster.address().empty());
    std::vector<std::vector<uint32_t>> tokens;
    const Generated alone = GenerateGreedy(cluster.address(), prompts[0], kNewTokens);
    EXPECT_TRUE(alone.status.ok()) << alone.status.error_message();
    tokens.push_back(alone.tokens);
    std::vector<std::future<Generated>> running;
    for (int i = 0; i < kSequences; ++i) {
      running.push_back(GenerateGreedyAsync(cluster.address(), prompts[i], kNewTokens - 5 * i));
    }
    // One more, cancelled by its client after ten tokens: it ends while steps run behind it.
    std::future<grpc::Status> cancelled = std::async(std::launch::async, [&] {
      grpc::ClientContext context;
      auto stub = strata::testing::GenerationStub(cluster.address());
      auto reader = stub->Generate(&context, GreedyRequest(DemoPrompt(kSequences), 4 * kNewTokens));
      v1::GenerateResponse response;
      int received = 0;
      while (reader->Read(&response)) {
        received += response.token_ids_size();
        if (received >= 10) context.TryCancel();
      }
      return reader->Finish();
    });
    for (auto& r : running) {
      const Generated g = r.get();
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      tokens.push_back(g.tokens);
    }
    EXPECT_EQ(cancelled.get().error_code(), grpc::StatusCode::CANCELLED);
    *overlapped_steps =
        static_cast<int64_t>(RouterStats(cluster.address()).graph_overlapped_steps());
    EXPECT_EQ(cluster.Stop(), 0);
    return tokens;
  };
  int64_t overlapped = 0, one_by_one_overlapped = 0;
  const auto ahead = run(true, &overlapped);
  const auto one_by_one = run(false, &one_by_one_overlapped);
  std::cout << "overlapped cluster: " << overlapped << " steps launched ahead\n";
  EXPECT_GT(overlapped, kNewTokens / 2);
  EXPECT_EQ(one_by_one_overlapped, 0);
  ASSERT_EQ(ahead.size(), one_by_one.size());
  EXPECT_EQ(ahead[0], one_by_one[0]) << "one sequence alone";
  for (int i = 0; i < kSequences; ++i) {
    EXPECT_EQ(ahead[i + 1].size(), one_by_one[i + 1].size()) << "sequence " << i;
  }
  ExpectSameOrTied(GpuClusterArgs(model), prompts,
                   std::vector<std::vector<uint32_t>>(ahead.begin() + 1, ahead.end()),
                   std::vector<std::vector<uint32_t>>(one_by_one.begin() + 1, one_by_one.end()),
                   0.1f);
}

// A worker killed in the middle of generation: with a second worker the request completes
// (its layers run on the survivor); alone, it ends UNAVAILABLE, not in a hang. The supervisor
// restarts the worker, which registers again over CUDA IPC and serves.
TEST(CudaClusterTest, KilledWorkerGivesUnavailableOrReroutes) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string model = OracleDir("qwen3_moe_hd64");
  ClusterProcess cluster(GpuClusterArgs(model));
  ASSERT_FALSE(cluster.address().empty());
  const std::vector<uint32_t> prompt(20, 7);
  const int kNewTokens = 400;
  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), prompt, kNewTokens, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  const std::string index = "--index=" + std::to_string(Workers() - 1);
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(KillChild(cluster.pid(), "strata-worker", index, &worker));
  ASSERT_EQ(running.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the request hangs after its worker died";
  const Generated g = running.get();
  if (Workers() == 1) {
    // Unless the kill landed after the last step: then the request is complete.
    if (!g.status.ok()) {
      EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
    } else {
      EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kNewTokens));
    }
  } else {
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kNewTokens));
  }
  std::cout << "request with a killed worker: "
            << (g.status.ok() ? std::string("OK") : g.status.error_message()) << "\n";
  // The replacement registers and serves.
  const bool back = PollUntil(
      [&] {
        const pid_t replacement = ChildWithArgs(cluster.pid(), "strata-worker", index);
        return replacement > 0 && replacement != worker && Serving(cluster.address());
      },
      std::chrono::seconds(90), std::chrono::milliseconds(100));
  ASSERT_TRUE(back) << "the restarted worker did not register";
  const Generated after = GenerateGreedy(cluster.address(), prompt, 16);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 16u);
  EXPECT_EQ(cluster.Stop(), 0);
}

// A worker stopped (SIGSTOP) while decode steps replay CUDA graphs: the router declares it failed
// when its heartbeat stands still (1.5 s), releases what its stream waits on of it, and runs the
// step again on the other worker; the request completes with a gap of about that, and strata up
// kills the stopped worker and restarts it. Two workers, on two GPUs or sharing one.
TEST(CudaClusterTest, StoppedWorkerIsRoutedAroundDuringReplayedSteps) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<std::string> args = GpuClusterArgs(OracleDir("qwen3_moe_hd64"));
  args.erase(std::remove_if(args.begin(), args.end(),
                            [](const std::string& a) { return a.rfind("--workers=", 0) == 0; }),
             args.end());
  args.insert(args.end(),
              {"--workers=2", "--gpus=" + std::to_string(std::min(2, gpu::CudaDeviceCount())),
               "--worker-kill-after-s=3"});
  ClusterProcess cluster(args);
  ASSERT_FALSE(cluster.address().empty());
  const std::vector<uint32_t> prompt(20, 7);
  const int kNewTokens = 600;
  FirstTokens first;
  auto running = GenerateGreedyAsync(cluster.address(), prompt, kNewTokens, first.Callback());
  ASSERT_TRUE(first.Wait()) << "no first token";
  pid_t worker = -1;
  ASSERT_NO_FATAL_FAILURE(
      SignalChild(cluster.pid(), "strata-worker", "--index=1", SIGSTOP, &worker));
  ASSERT_EQ(running.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the request hangs after its worker stopped";
  const Generated g = running.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kNewTokens));
  EXPECT_LT(g.longest_gap_ms, 3000.0);
  std::cout << "request with a stopped worker: longest gap " << g.longest_gap_ms << " ms\n";
  ASSERT_GT(AwaitReplacement(cluster.pid(), "strata-worker", "--index=1", worker, 90), 0)
      << "the stopped worker was not replaced";
  ASSERT_TRUE(WaitForHealth(cluster.address(), kServing, 90)) << "no replacement registered";
  const Generated after = GenerateGreedy(cluster.address(), prompt, 16);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace strata
