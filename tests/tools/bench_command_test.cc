// `strata bench`: its statistics match hf-peer-bench.py's, and against a small two-worker
// cluster it writes one bench/results JSON file per concurrency with sane figures.
#include "tools/strata/bench_command.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster_process.h"
#include "tests/testing/run_strata.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::ClusterProcess;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

using ::strata::testing::RunStrata;
using Result = ::strata::testing::CommandResult;

std::vector<double> Range(int n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  std::reverse(v.begin(), v.end());  // unsorted on purpose
  return v;
}

// The values Python gives for statistics.median(r), r[int(0.05 (n-1))], r[round(0.95 (n-1))].
TEST(BenchStatisticsTest, MatchHfPeerBench) {
  struct Case {
    int n;
    double median, p5, p95;
  };
  for (const Case& c : {Case{1, 0, 0, 0}, Case{3, 1, 0, 2}, Case{10, 4.5, 0, 9}, Case{11, 5, 0, 10},
                        Case{31, 15, 1, 28}}) {
    EXPECT_EQ(Median(Range(c.n)), c.median) << c.n;
    EXPECT_EQ(PercentileP5(Range(c.n)), c.p5) << c.n;
    EXPECT_EQ(PercentileP95(Range(c.n)), c.p95) << c.n;  // 31: round(28.5) is 28, half to even
  }
}

TEST(BenchStatisticsTest, SummaryUsesTheMedianTtftForPrefill) {
  ConcurrencyRun run;
  run.concurrency = 2;
  for (double ttft : {10.0, 20.0, 40.0}) {
    RequestTiming t;
    t.ttft_ms = ttft;
    t.prefill_tok_s = 100 / (ttft / 1e3);
    t.decode_tok_s = 1000 / ttft;
    t.tokens = 8;
    run.requests.push_back(t);
  }
  run.round_throughput_tok_s = {30, 50};
  const BenchSummary s = Summarize(run, 100);
  EXPECT_EQ(s.requests, 3);
  EXPECT_DOUBLE_EQ(s.ttft_ms, 20);
  EXPECT_DOUBLE_EQ(s.ttft_ms_p95, 40);
  EXPECT_DOUBLE_EQ(s.prefill_tok_s, 5000);  // 100 tokens / 20 ms
  EXPECT_DOUBLE_EQ(s.prefill_tok_s_mean, (10000 + 5000 + 2500) / 3.0);
  EXPECT_DOUBLE_EQ(s.decode_tok_s_mean, (100 + 50 + 25) / 3.0);
  EXPECT_DOUBLE_EQ(s.decode_tok_s_p5, 25);
  EXPECT_DOUBLE_EQ(s.decode_tok_s_p50, 50);
  EXPECT_DOUBLE_EQ(s.throughput_tok_s, 40);
  EXPECT_EQ(s.prefill_tflops, 0);               // the server told no FLOPs
  EXPECT_EQ(Percentile({4, 1, 3, 2}, 0.5), 3);  // sorted[round(1.5)] = sorted[2]
  EXPECT_EQ(Percentile({4, 1, 3, 2}, 1.0), 4);
  EXPECT_EQ(Percentile({}, 0.99), 0);

  // 2e12 FLOPs a prompt in the median 20 ms: 100 TFLOP/s, a tenth of a 1000 TFLOP/s peak.
  run.prompt_flops = 2e12;
  const BenchSummary f = Summarize(run, 100);
  EXPECT_DOUBLE_EQ(f.prefill_tflops, 100);
  BenchOptions o;
  o.peak_tflops = 1000;
  const nlohmann::json j = nlohmann::json::parse(BenchResultJson(o, "m", f, absl::UnixEpoch()));
  EXPECT_DOUBLE_EQ(j["prefill_tflops"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(j["prefill_peak_share"].get<double>(), 0.1);
  EXPECT_FALSE(nlohmann::json::parse(BenchResultJson(BenchOptions(), "m", f, absl::UnixEpoch()))
                   .contains("prefill_peak_share"));
}

v1::WorkerStats* AddWorker(v1::StatsResponse& stats, uint32_t index, uint64_t hot,
                           uint64_t misses) {
  v1::WorkerStats* w = stats.add_workers();
  w->set_index(index);
  w->mutable_tiers()->set_hot_hits(hot);
  w->mutable_tiers()->set_misses(misses);
  return w;
}

// The tiers' figures of a record: the measured rounds' counters (after minus before), summed over
// the workers, a restarted worker's from zero, and one that joined during the rounds from zero.
TEST(BenchCountersTest, TierFiguresAreTheRoundsCountersSummedOverTheWorkers) {
  v1::StatsResponse before, after;
  before.set_generated_tokens(100);
  after.set_generated_tokens(164);
  before.set_steps(10);
  after.set_steps(74);
  after.set_graph_steps(48);
  after.set_prefetch_actual(40);
  after.set_prefetch_correct(30);
  AddWorker(before, 0, 10, 5)->mutable_tiers()->set_bytes_copied(1000);
  v1::WorkerStats* w0 = AddWorker(after, 0, 50, 25);
  w0->mutable_tiers()->set_bytes_copied(5000);
  w0->mutable_tiers()->set_warm_hits(8);
  AddWorker(before, 1, 100, 0);
  AddWorker(after, 1, 20, 4)->mutable_tiers()->set_cpu_tier_experts(16);  // restarted
  AddWorker(after, 2, 6, 0);
  const ServerCounters c = CounterDeltas(before, after);
  EXPECT_EQ(c.generated_tokens, 64u);
  EXPECT_EQ(c.hot_hits, 40u + 20u + 6u);
  EXPECT_EQ(c.warm_hits, 8u);
  EXPECT_EQ(c.misses, 20u + 4u);
  EXPECT_EQ(c.bytes_copied, 4000u);
  EXPECT_EQ(c.cpu_tier_experts, 16u);

  BenchSummary s;
  s.server = c;
  const nlohmann::json j =
      nlohmann::json::parse(BenchResultJson(BenchOptions(), "m", s, absl::UnixEpoch()));
  const nlohmann::json& t = j["tiers"];
  EXPECT_DOUBLE_EQ(t["hot_hit_rate"].get<double>(), 66.0 / 98);
  EXPECT_DOUBLE_EQ(t["miss_rate"].get<double>(), 24.0 / 98);
  EXPECT_DOUBLE_EQ(t["expert_uses_per_token"].get<double>(), 98.0 / 64);
  EXPECT_DOUBLE_EQ(t["bytes_copied_per_token"].get<double>(), 4000.0 / 64);
  EXPECT_DOUBLE_EQ(t["cpu_tier_experts_per_token"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["prefetch_accuracy"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["graph_steps_fraction"].get<double>(), 0.75);
  // No eager-step trial in the rounds: no such fields.
  EXPECT_FALSE(j.contains("eager_step_trials"));

  // Eager steps tried during the rounds and preferred at their end.
  before.set_eager_step_trials(1);
  after.set_eager_step_trials(3);
  after.set_eager_steps_preferred(true);
  s.server = CounterDeltas(before, after);
  const nlohmann::json e =
      nlohmann::json::parse(BenchResultJson(BenchOptions(), "m", s, absl::UnixEpoch()));
  EXPECT_EQ(e["eager_step_trials"].get<uint64_t>(), 2u);
  EXPECT_TRUE(e["eager_steps_preferred"].get<bool>());

  // No Stats answer, or no expert counted: no tier figures.
  s.server = ServerCounters();
  EXPECT_FALSE(nlohmann::json::parse(BenchResultJson(BenchOptions(), "m", s, absl::UnixEpoch()))
                   .contains("tiers"));
}

TEST(BenchOutputPathTest, AppendsTheConcurrencyOnlyWhenThereAreSeveral) {
  EXPECT_EQ(BenchOutputPath("bench/results/x.json", 8, false), "bench/results/x.json");
  EXPECT_EQ(BenchOutputPath("bench/results/x.json", 8, true), "bench/results/x-c8.json");
  EXPECT_EQ(BenchOutputPath("x", 32, true), "x-c32");
}

TEST(BenchFlagsTest, ParseConcurrency) {
  EXPECT_EQ(*ParseConcurrency({"1", "8", "32"}), (std::vector<int>{1, 8, 32}));
  EXPECT_FALSE(ParseConcurrency({"1", "x"}).ok());
  EXPECT_FALSE(ParseConcurrency({"0"}).ok());
  EXPECT_FALSE(ParseConcurrency({}).ok());
}

TEST(BenchCommandTest, ErrorsExitNonZeroWithAMessage) {
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"bench", "--server HOST:PORT is required"},
      {"bench --server 127.0.0.1:1 --runs 1", "cannot reach a Strata cluster at 127.0.0.1:1"},
      {"bench --server 127.0.0.1:1 --concurrency 1,x", "\"x\" is not a positive integer"},
      {"bench --server 127.0.0.1:1 --weights fp16", "--weights must be bf16 or fp8"},
      {"bench --server 127.0.0.1:1 --output-len 1", "--output-len must be at least 2"},
      // Checked before any round runs (no server is reached first).
      {"bench --server 127.0.0.1:1 --out /nonexistent-dir/r.json",
       "/nonexistent-dir is not a writable directory"},
  };
  for (const Case& c : cases) {
    const Result r = RunStrata(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.out, HasSubstr(c.message)) << c.args;
  }
}

class BenchClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new ClusterProcess(
        {"--model=" + std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_long", "--workers=2",
         "--threads=1"});
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static ClusterProcess* cluster_;
};
ClusterProcess* BenchClusterTest::cluster_ = nullptr;

// In process: every request got exactly output_len tokens for its input_len-token prompt.
TEST_F(BenchClusterTest, CountsEveryRequestsTokens) {
  ASSERT_FALSE(cluster_->address().empty()) << "the cluster did not become ready";
  BenchOptions o;
  o.server = cluster_->address();
  auto admin = ResolveAdmin(o.server, "", "");  // the counters come from Admin
  ASSERT_TRUE(admin.ok()) << admin.status();
  o.admin = *std::move(admin);
  o.input_len = 16;
  o.output_len = 8;
  o.runs = 2;
  o.concurrency = {1, 4};
  std::ostringstream progress;
  const absl::StatusOr<BenchReport> report = RunBench(o, progress);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->model, "qwen3_moe");  // model_type, with no --model-name
  ASSERT_EQ(report->runs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ConcurrencyRun& run = report->runs[i];
    EXPECT_EQ(run.concurrency, o.concurrency[i]);
    ASSERT_EQ(run.requests.size(), static_cast<size_t>(o.runs * run.concurrency));
    EXPECT_EQ(run.round_throughput_tok_s.size(), static_cast<size_t>(o.runs));
    for (const RequestTiming& t : run.requests) {
      EXPECT_EQ(t.tokens, 8);
      EXPECT_EQ(t.prompt_tokens, 16);
      EXPECT_GT(t.ttft_ms, 0);
      EXPECT_GT(t.decode_tok_s, 0);
      EXPECT_GT(t.server_ttft_ms, 0);
    }
    EXPECT_TRUE(run.server.known);
    EXPECT_EQ(run.server.preemptions, 0u);
  }
  EXPECT_THAT(progress.str(), HasSubstr("concurrency 4, warmup round 1/1"));
}

// Decodes beside a long prompt: one interfering prompt a round, its TTFT kept apart; every
// request's inter-token gaps recorded; the server tells the prompt's FLOPs.
TEST_F(BenchClusterTest, ReportsInterTokenLatencyBesideAnInterferingPrompt) {
  ASSERT_FALSE(cluster_->address().empty()) << "the cluster did not become ready";
  BenchOptions o;
  o.server = cluster_->address();
  o.input_len = 16;
  o.output_len = 40;
  o.runs = 2;
  o.warmup = 0;
  o.concurrency = {2};
  o.interfering_prompt_len = 300;
  o.interfering_after = absl::Milliseconds(20);  // the measured requests decode by then
  std::ostringstream progress;
  const absl::StatusOr<BenchReport> report = RunBench(o, progress);
  ASSERT_TRUE(report.ok()) << report.status();
  const ConcurrencyRun& run = report->runs[0];
  EXPECT_EQ(run.interfering_ttft_ms.size(), 2u);
  for (double ttft : run.interfering_ttft_ms) EXPECT_GT(ttft, 0);
  EXPECT_GT(run.prompt_flops, 0);
  size_t interfered = 0;
  for (const RequestTiming& t : run.requests) {
    EXPECT_GE(t.itl_ms.size(), 1u);
    EXPECT_LE(t.itl_ms.size(), 39u);
    EXPECT_LE(t.interfered_itl_ms.size(), t.itl_ms.size());
    interfered += t.interfered_itl_ms.size();
  }
  // The prefill ran between decode steps of requests still decoding: some gaps spanned it.
  EXPECT_GT(interfered, 0u);
  const BenchSummary s = Summarize(run, o.input_len);
  EXPECT_GT(s.itl_ms_p95, 0);
  EXPECT_GE(s.itl_ms_max, s.itl_ms_p99);
  EXPECT_GT(s.interfering_ttft_ms, 0);
  EXPECT_GT(s.prefill_tflops, 0);
}

uint64_t PrefixHitTokens(const std::string& server) {
  const Result r = RunStrata("stats --server " + server);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return nlohmann::json::parse(r.out)["prefix_cache_hit_tokens"].get<uint64_t>();
}

// Prompts sharing their first 64 ids: after the first request, every one finds the shared
// prefix's two full blocks of 32 cached.
TEST_F(BenchClusterTest, SharedPrefixesHitThePrefixCache) {
  ASSERT_FALSE(cluster_->address().empty()) << "the cluster did not become ready";
  const uint64_t before = PrefixHitTokens(cluster_->address());
  BenchOptions o;
  o.server = cluster_->address();
  o.input_len = 80;
  o.shared_prefix = 64;
  o.output_len = 4;
  o.runs = 2;
  o.warmup = 1;
  o.seed = 5;
  std::ostringstream progress;
  const absl::StatusOr<BenchReport> report = RunBench(o, progress);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(PrefixHitTokens(cluster_->address()) - before, 2u * 64u);

  o.shared_prefix = 81;
  EXPECT_FALSE(RunBench(o, progress).ok());
}

// The command as a user runs it: a table, and one JSON file per concurrency.
TEST_F(BenchClusterTest, WritesOneResultFilePerConcurrency) {
  ASSERT_FALSE(cluster_->address().empty()) << "the cluster did not become ready";
  TempDir dir;
  const std::string out = dir.File("tiny-bf16-cluster.json");
  const Result r = RunStrata(
      absl::StrCat("bench --server ", cluster_->address(),
                   " --input-len 16 --output-len 8 --runs 2 --concurrency 1,4 --out ", out,
                   " --model-name tiny-qwen3 --machine 'test VM' --note STRATA_PDL=0"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("| concurrency | TTFT ms mean |"));
  EXPECT_FALSE(std::filesystem::exists(out));
  for (int c : {1, 4}) {
    const std::string path = dir.File(absl::StrCat("tiny-bf16-cluster-c", c, ".json"));
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["model"], "tiny-qwen3");
    EXPECT_EQ(j["weights"], "bf16");
    EXPECT_EQ(j["mode"], "cluster");
    EXPECT_EQ(j["gpus"], 0);
    EXPECT_EQ(j["concurrency"], c);
    EXPECT_EQ(j["input_len"], 16);
    EXPECT_EQ(j["output_len"], 8);
    EXPECT_EQ(j["runs"], 2);
    EXPECT_EQ(j["warmup"], 1);
    EXPECT_EQ(j["requests"], 2 * c);
    EXPECT_EQ(j["machine"], "test VM");
    EXPECT_EQ(j["note"], "STRATA_PDL=0");
    EXPECT_THAT(j["date"].get<std::string>(), MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}"));
    EXPECT_THAT(j["command"].get<std::string>(), HasSubstr("strata bench --server"));
    EXPECT_THAT(j["command"].get<std::string>(), HasSubstr("'test VM'"));
    for (const char* key :
         {"decode_tok_s_mean", "decode_tok_s_p5", "decode_tok_s_p50", "decode_tok_s_p95",
          "prefill_tok_s", "prefill_tok_s_mean", "ttft_ms", "ttft_ms_mean", "ttft_ms_p95",
          "throughput_tok_s", "server_ttft_ms", "server_decode_tok_s_mean"}) {
      ASSERT_TRUE(j[key].is_number()) << key;
      EXPECT_GT(j[key].get<double>(), 0) << key;
    }
    EXPECT_EQ(j["server_preemptions"], 0);  // the pool holds every request
    EXPECT_LE(j["decode_tok_s_p5"].get<double>(), j["decode_tok_s_p95"].get<double>());
    EXPECT_NEAR(j["prefill_tok_s"].get<double>(), 16 / (j["ttft_ms"].get<double>() / 1e3), 1e-6);
    // A round of c requests of 8 tokens lasts at least as long as any request's 7 decode
    // steps, so its throughput is at most c x 8/7 x that request's decode speed.
    EXPECT_LT(j["throughput_tok_s"].get<double>(),
              c * 8.0 / 7.0 * j["decode_tok_s_p95"].get<double>() * 1.01);
  }
}

// A request the cluster refuses (its queue is full) fails the bench with the server's reason.
TEST(BenchFailureTest, ARefusedRequestFailsTheBench) {
  ClusterProcess cluster(
      {"--model=" + std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_long", "--workers=1",
       "--threads=1", "--max-running=1", "--max-queued-requests=1"});
  ASSERT_FALSE(cluster.address().empty()) << "the cluster did not become ready";
  // Concurrency 1 is measured and its file written before concurrency 8 is refused.
  TempDir dir;
  const std::string out = dir.File("refused.json");
  const Result r = RunStrata(absl::StrCat("bench --server ", cluster.address(),
                                          " --input-len 16 --output-len 64 --runs 1",
                                          " --concurrency 1,8 --out ", out));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("concurrency 8, warmup round 1/1: a Generate request to"));
  EXPECT_THAT(r.out, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_TRUE(std::filesystem::exists(dir.File("refused-c1.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("refused-c8.json")));
}

}  // namespace
}  // namespace strata
