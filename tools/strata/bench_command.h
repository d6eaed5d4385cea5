// `strata bench --server HOST:PORT`: serving benchmark of a running cluster through the public
// Generation API, in the manner of vLLM's and SGLang's serving benchmarks. For each concurrency
// c it runs `warmup` unrecorded rounds, then `runs` rounds of c simultaneous greedy requests
// (random prompts of exactly input_len ids, output_len new tokens with ignore_eos), times every
// request from the client side, prints a table and writes the bench/results JSON format of
// ../shared/tools/hf-peer-bench.py (bench/results/README.md describes it).
#ifndef STRATA_TOOLS_STRATA_BENCH_COMMAND_H_
#define STRATA_TOOLS_STRATA_BENCH_COMMAND_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/v1/cluster.pb.h"
#include "tools/strata/admin_target.h"

namespace strata {

struct BenchOptions {
  std::string server;  // HOST:PORT
  // The router's internal listener, for its counters before and after (empty address: none).
  AdminTarget admin;
  int input_len = 128;
  int output_len = 512;
  int runs = 10;   // recorded rounds per concurrency
  int warmup = 1;  // unrecorded rounds per concurrency, before the recorded ones
  std::vector<int> concurrency = {1};
  uint64_t seed = 0;  // of the random prompts
  // 0: greedy decoding. Above 0, every request samples at this temperature (its own seed, drawn
  // from `seed`): on a random-weight model greedy output tends to repeat a few tokens, so that
  // consecutive decode steps route to the same experts; sampled tokens vary the steps' inputs.
  double temperature = 0;
  // With a temperature, the rest of the requests' sampling (as the generate command's flags).
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  // Every prompt starts with the same this many ids (drawn once), the rest drawn per request:
  // the case of a shared system prompt or a document asked about again (prefix caching).
  int shared_prefix = 0;
  // Prompts from text (--prompts, ReadCalibration), taken in turn and cut to input_len; empty:
  // random ids.
  std::vector<std::vector<int32_t>> prompts;
  std::string out;  // JSON file; see BenchOutputPath for several concurrencies
  // Labels recorded in the JSON, as hf-peer-bench.py records them.
  std::string model_name;        // empty: the server's model_type
  std::string weights = "bf16";  // bf16 | fp8
  std::string mode = "cluster";  // cluster | in-process | transformers
  int gpus = 0;                  // 0 for a CPU cluster
  std::string machine;           // e.g. "NVIDIA H200"; empty records "unspecified"
  std::string command;           // the command line, recorded as is
  std::string note;              // free text recorded as "note" when set (e.g. the server's env)
  std::string commit;            // the build's commit, recorded as "commit" when set
  // The server GPU's dense bf16 tensor-core peak, TFLOP/s: recorded with the share of it a
  // prefill reaches (0: none).
  double peak_tflops = 0;
  // Decodes beside a long prefill: in each round, this long a prompt (one token out, not counted
  // in the figures) is sent `interfering_after` after the measured requests, and the
  // inter-token gaps that overlap its prefill are reported apart. 0: none.
  int interfering_prompt_len = 0;
  absl::Duration interfering_after = absl::Seconds(1);
  absl::Duration request_timeout = absl::Minutes(30);
  absl::Duration connect_timeout = absl::Seconds(10);
};

// One request, timed on the client.
struct RequestTiming {
  double ttft_ms = 0;          // send -> first message with tokens
  double decode_tok_s = 0;     // tokens after the first message / (last token time - first)
  double prefill_tok_s = 0;    // input_len / TTFT
  int tokens = 0;              // generated tokens received
  int prompt_tokens = 0;       // the server's Usage.prompt_tokens
  double distinct_tokens = 0;  // distinct generated ids / generated tokens
  // What the server reported in Usage, for comparison with the client's view.
  double server_ttft_ms = 0;
  double server_decode_tok_s = 0;
  // Inter-token latency: the gap before each message after the first, over its tokens.
  std::vector<double> itl_ms;
  // The gaps that overlapped the interfering prompt's prefill (BenchOptions).
  std::vector<double> interfered_itl_ms;
};

// What the cluster's Admin.Stats counted during the measured rounds (after minus before; a
// worker whose counters went back, restarted, counts from zero), summed over the workers: the
// expert tiers, the next-layer prediction and the decode graph replays.
struct ServerCounters {
  bool known = false;  // both Stats calls answered
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;  // sequences preempted for KV blocks (and recomputed)
  // Prompt tokens the prefix cache served: TTFTs that include them are not a prefill's.
  uint64_t prefix_cache_hit_tokens = 0;
  // Speculative decoding: tokens drafted, and drafted tokens accepted.
  uint64_t draft_tokens = 0;
  uint64_t accepted_draft_tokens = 0;
  uint64_t steps = 0;
  uint64_t graph_steps = 0;
  uint64_t hot_hits = 0;
  uint64_t warm_hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_copied = 0;
  uint64_t cpu_tier_experts = 0;
  uint64_t prefetch_loads = 0;
  uint64_t prefetch_hits = 0;
  uint64_t prefetch_correct = 0;
  uint64_t prefetch_actual = 0;
  // Decode steps timed eagerly against replays over the rounds, and the faster way at the end.
  uint64_t eager_step_trials = 0;
  bool eager_steps_preferred = false;
};
ServerCounters CounterDeltas(const v1::StatsResponse& before, const v1::StatsResponse& after);

// The tiers' figures of ServerCounters: shares of the expert uses, and per generated token.
struct TierFigures {
  double hot_hit_rate = 0;
  double warm_hit_rate = 0;
  double miss_rate = 0;
  double expert_uses_per_token = 0;
  double bytes_copied_per_token = 0;
  double cpu_tier_experts_per_token = 0;
};
// Empty when no expert use was counted (no tiers, or a Stats call unanswered).
std::optional<TierFigures> TierFiguresOf(const ServerCounters& c);
// Correct next-layer picks / picks in layers that had a prediction; empty without predictions.
std::optional<double> PrefetchAccuracyOf(const ServerCounters& c);

// The recorded rounds of one concurrency.
struct ConcurrencyRun {
  int concurrency = 1;
  std::vector<RequestTiming> requests;         // runs x concurrency
  std::vector<double> round_throughput_tok_s;  // generated tokens / round wall time, per round
  // What the server counted during the measured rounds (its Admin.Stats before and after).
  ServerCounters server;
  double prompt_flops = 0;  // one prompt's, from the server's ModelInfo (0: not told)
  std::vector<double> interfering_ttft_ms;  // per round, with an interfering prompt
};

// The figures reported for one concurrency. Statistics follow hf-peer-bench.py: the median is
// statistics.median, P5 = sorted[int(0.05 (n-1))], P95 = sorted[round(0.95 (n-1))] (half to
// even); ttft_ms is the median TTFT and prefill_tok_s = input_len / median TTFT.
struct BenchSummary {
  int concurrency = 1;
  int requests = 0;
  double ttft_ms = 0;  // median
  double ttft_ms_mean = 0;
  double ttft_ms_p95 = 0;
  double prefill_tok_s = 0;       // input_len / median TTFT (hf-peer-bench.py's definition)
  double prefill_tok_s_mean = 0;  // mean of the per-request input_len / TTFT
  double decode_tok_s_mean = 0;
  double decode_tok_s_p5 = 0;
  double decode_tok_s_p50 = 0;
  double decode_tok_s_p95 = 0;
  double throughput_tok_s = 0;  // mean over rounds of all generated tokens / round wall time
  double server_ttft_ms = 0;    // median of the server's Usage.time_to_first_token_ms
  double server_decode_tok_s_mean = 0;
  double distinct_tokens = 0;  // mean over the requests
  ServerCounters server;       // ConcurrencyRun's
  double prefill_tflops = 0;   // one prompt's FLOPs / median TTFT (0: FLOPs unknown)
  // Inter-token latency over every gap of every request (hf-peer-bench.py's percentiles).
  double itl_ms_p50 = 0, itl_ms_p95 = 0, itl_ms_p99 = 0, itl_ms_max = 0;
  // With an interfering prompt: the gaps during its prefill, and its TTFT (median of rounds).
  int interfered_gaps = 0;
  double interfered_itl_ms_p95 = 0, interfered_itl_ms_max = 0, interfering_ttft_ms = 0;
};

struct BenchReport {
  std::string model;  // options.model_name, or the server's model_type
  std::vector<ConcurrencyRun> runs;
};

double Median(std::vector<double> values);
double PercentileP5(std::vector<double> values);
double PercentileP95(std::vector<double> values);
// sorted[round(q (n - 1))], half to even (P95's rule at any q in [0, 1]).
double Percentile(std::vector<double> values, double q);
BenchSummary Summarize(const ConcurrencyRun& run, int input_len);

// The file one concurrency's JSON goes to: `out` itself when only one concurrency is measured,
// else `out` with "-c<concurrency>" inserted before its extension (a.json -> a-c8.json).
std::string BenchOutputPath(const std::string& out, int concurrency, bool several);

// One bench/results object (the JSON text, indent 1, hf-peer-bench.py's field order first).
std::string BenchResultJson(const BenchOptions& options, const std::string& model,
                            const BenchSummary& summary, absl::Time now);

// "1,8,32" as the flag library splits it: {"1", "8", "32"}; each must be a positive integer.
absl::StatusOr<std::vector<int>> ParseConcurrency(const std::vector<std::string>& values);

// This process's command line from /proc/self/cmdline, argv[0] cut to its file name, arguments
// with spaces or quotes single-quoted: what the JSON records as "command".
std::string CurrentCommandLine();

// Checks the options, then measures; progress lines go to `progress`. `on_run`, when set, sees
// each concurrency's measurements as soon as they are complete (with the model's name); its
// error stops the benchmark.
absl::StatusOr<BenchReport> RunBench(
    const BenchOptions& options, std::ostream& progress,
    std::function<absl::Status(const std::string& model, const ConcurrencyRun& run)> on_run =
        nullptr);

// RunBench, writing each concurrency's file (--out) as soon as it is measured (a later failure
// keeps the earlier ones), then the table and one JSON line per concurrency on `out`.
absl::Status RunBenchCommand(const BenchOptions& options, std::ostream& out,
                             std::ostream& progress);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_BENCH_COMMAND_H_
