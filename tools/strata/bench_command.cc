#include "tools/strata/bench_command.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/util/counter_since.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  return absl::Status(
      code, absl::StrCat(what, " (", absl::StatusCodeToString(code), "): ", s.error_message()));
}

absl::Status CheckOptions(const BenchOptions& o) {
  if (o.server.empty()) return absl::InvalidArgumentError("--server HOST:PORT is required");
  if (o.input_len < 1) return absl::InvalidArgumentError("--input-len must be at least 1");
  if (o.shared_prefix < 0 || o.shared_prefix > o.input_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared-prefix must be in [0, --input-len = ", o.input_len, "]"));
  }
  if (o.output_len < 2) {
    return absl::InvalidArgumentError(
        "--output-len must be at least 2 (decode speed needs tokens after the first)");
  }
  if (o.runs < 1) return absl::InvalidArgumentError("--runs must be at least 1");
  if (o.warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  if (o.concurrency.empty()) return absl::InvalidArgumentError("--concurrency is empty");
  for (int c : o.concurrency) {
    if (c < 1) return absl::InvalidArgumentError("every --concurrency must be at least 1");
  }
  if (o.weights != "bf16" && o.weights != "fp8") {
    return absl::InvalidArgumentError("--weights must be bf16 or fp8");
  }
  if (o.mode != "cluster" && o.mode != "in-process" && o.mode != "transformers") {
    return absl::InvalidArgumentError("--mode must be cluster, in-process or transformers");
  }
  if (o.gpus < 0) return absl::InvalidArgumentError("--gpus must be >= 0");
  if (!(o.temperature >= 0 && o.temperature <= 100)) {
    return absl::InvalidArgumentError("--temperature must be in [0, 100] (0: greedy)");
  }
  return absl::OkStatus();
}

// The server's counters (Admin.Stats), or nothing when there is no admin address or it does
// not answer.
std::optional<v1::StatsResponse> ServerStats(const AdminTarget& admin, absl::Duration timeout) {
  if (admin.address.empty()) return std::nullopt;
  v1::StatsResponse stats;
  if (!admin.Stub()->Stats(admin.Context(timeout).get(), v1::StatsRequest(), &stats).ok()) {
    return std::nullopt;
  }
  return stats;
}

// Draws prompts of exactly `len` ids from [0, vocab) without the EOS ids, from one seeded
// generator, so the same options give the same prompts; the first `shared_prefix` ids are the
// same in every prompt.
class PromptSource {
 public:
  PromptSource(uint64_t seed, const BenchOptions& sampling, int shared_prefix,
               const v1::ModelInfoResponse& info,
               const std::vector<std::vector<int32_t>>& texts = {})
      : texts_(texts),
        sampling_(sampling),
        rng_(seed),
        vocab_(info.vocab_size()),
        eos_(info.eos_token_ids().begin(), info.eos_token_ids().end()) {
    while (std::ssize(prefix_) < shared_prefix) prefix_.push_back(NextId());
  }

  v1::GenerateRequest Next(int len, int max_new_tokens) {
    v1::GenerateRequest r;
    if (!texts_.empty()) {
      const std::vector<int32_t>& text = texts_[next_text_++ % texts_.size()];
      for (size_t i = 0; i < text.size() && static_cast<int>(i) < len; ++i) {
        r.add_prompt_token_ids(static_cast<uint32_t>(text[i]));
      }
    }
    for (uint32_t id : prefix_) {
      if (!texts_.empty()) break;
      r.add_prompt_token_ids(id);
    }
    while (texts_.empty() && r.prompt_token_ids_size() < len) r.add_prompt_token_ids(NextId());
    r.set_max_new_tokens(static_cast<uint32_t>(max_new_tokens));
    r.set_ignore_eos(true);
    v1::SamplingParams& s = *r.mutable_sampling();
    s.set_temperature(static_cast<float>(sampling_.temperature));
    if (sampling_.temperature > 0) {
      s.set_seed(rng_() | 1);
      if (sampling_.top_k > 0) s.set_top_k(static_cast<uint32_t>(sampling_.top_k));
      if (sampling_.top_p < 1.0f) s.set_top_p(sampling_.top_p);
      if (sampling_.min_p > 0.0f) s.set_min_p(sampling_.min_p);
    }
    if (sampling_.repetition_penalty != 1.0f) {
      s.set_repetition_penalty(sampling_.repetition_penalty);
    }
    return r;
  }

 private:
  uint32_t NextId() {
    std::uniform_int_distribution<uint32_t> dist(0, vocab_ - 1);
    while (true) {
      const uint32_t id = dist(rng_);
      if (std::find(eos_.begin(), eos_.end(), id) == eos_.end()) return id;
    }
  }

  const std::vector<std::vector<int32_t>>& texts_;
  size_t next_text_ = 0;
  const BenchOptions& sampling_;
  std::mt19937_64 rng_;
  uint32_t vocab_;
  std::vector<uint32_t> eos_;
  std::vector<uint32_t> prefix_;
};

struct RequestResult {
  absl::Status status;
  RequestTiming timing;
  Clock::time_point sent, done;
  struct Gap {
    Clock::time_point start, end;
    double ms_per_token;
  };
  std::vector<Gap> gaps;  // before each message with tokens after the first
};

// Sends `request` (sent: when) and hands each response to on_response; the call's status.
template <typename Fn>
grpc::Status StreamGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                            const BenchOptions& o, Clock::time_point& sent, Fn&& on_response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(o.request_timeout));
  sent = Clock::now();
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) on_response(response);
  return reader->Finish();
}

RequestResult TimeOneRequest(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                             const BenchOptions& o) {
  RequestResult result;
  v1::GenerateResponse last;
  Clock::time_point first_at, last_at;
  int tokens = 0, first_tokens = 0;
  absl::flat_hash_set<uint32_t> distinct;
  const grpc::Status status =
      StreamGenerate(stub, request, o, result.sent, [&](const v1::GenerateResponse& response) {
        distinct.insert(response.token_ids().begin(), response.token_ids().end());
        if (response.token_ids_size() > 0) {
          const Clock::time_point now = Clock::now();
          if (tokens == 0) {
            first_at = now;
            first_tokens = response.token_ids_size();
          } else {
            result.gaps.push_back(
                {last_at, now, Seconds(now - last_at) * 1e3 / response.token_ids_size()});
          }
          last_at = now;
          tokens += response.token_ids_size();
        }
        if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = response;
      });
  result.done = Clock::now();
  if (!status.ok()) {
    result.status = FromGrpc(status, absl::StrCat("a Generate request to ", o.server, " failed"));
    return result;
  }
  if (last.finish_reason() != v1::FINISH_REASON_LENGTH || tokens != o.output_len) {
    result.status = absl::DataLossError(absl::StrCat(
        "a Generate request to ", o.server, " returned ", tokens, " tokens with finish_reason ",
        v1::FinishReason_Name(last.finish_reason()), "; expected ", o.output_len,
        " tokens and FINISH_REASON_LENGTH (ignore_eos is set)"));
    return result;
  }
  if (last.usage().prompt_tokens() != static_cast<uint32_t>(o.input_len)) {
    result.status =
        absl::DataLossError(absl::StrCat("the server counted ", last.usage().prompt_tokens(),
                                         " prompt tokens; ", o.input_len, " were sent"));
    return result;
  }
  const double decode_s = Seconds(last_at - first_at);
  if (tokens == first_tokens || decode_s <= 0) {
    result.status = absl::DataLossError(
        "the server sent every token in its first message: decode speed cannot be timed");
    return result;
  }
  RequestTiming& t = result.timing;
  t.tokens = tokens;
  t.prompt_tokens = static_cast<int>(last.usage().prompt_tokens());
  t.ttft_ms = Seconds(first_at - result.sent) * 1e3;
  t.decode_tok_s = (tokens - first_tokens) / decode_s;
  t.prefill_tok_s = o.input_len / (t.ttft_ms / 1e3);
  t.server_ttft_ms = last.usage().time_to_first_token_ms();
  t.server_decode_tok_s = last.usage().decode_tokens_per_second();
  t.distinct_tokens = static_cast<double>(distinct.size()) / tokens;
  for (const RequestResult::Gap& gap : result.gaps) t.itl_ms.push_back(gap.ms_per_token);
  return result;
}

// The interfering prompt of a round: sent, and its first token's arrival.
struct Interference {
  absl::Status status;
  Clock::time_point sent, first;
};

Interference TimeFirstToken(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                            const BenchOptions& o) {
  Interference result;
  bool seen = false;
  const grpc::Status status =
      StreamGenerate(stub, request, o, result.sent, [&](const v1::GenerateResponse& response) {
        if (!seen && response.token_ids_size() > 0) {
          result.first = Clock::now();
          seen = true;
        }
      });
  if (!status.ok()) {
    result.status = FromGrpc(status, "the interfering prompt failed");
  } else if (!seen) {
    result.status = absl::DataLossError("the interfering prompt got no token");
  }
  return result;
}

// Sends `requests` at once, one thread each; returns their timings and the round's throughput.
// With `interfering`, it goes out o.interfering_after after them; its TTFT is returned in
// interfering_ttft_ms and the gaps during its prefill land in the timings' interfered_itl_ms.
absl::Status RunRound(v1::Generation::Stub& stub, const std::vector<v1::GenerateRequest>& requests,
                      const v1::GenerateRequest* interfering, const BenchOptions& o,
                      std::vector<RequestTiming>& timings, double& throughput_tok_s,
                      double& interfering_ttft_ms) {
  std::vector<RequestResult> results(requests.size());
  Interference interference;
  std::latch start(static_cast<std::ptrdiff_t>(requests.size()) + (interfering ? 1 : 0));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      results[i] = TimeOneRequest(stub, requests[i], o);
    });
  }
  if (interfering != nullptr) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      absl::SleepFor(o.interfering_after);
      interference = TimeFirstToken(stub, *interfering, o);
    });
  }
  for (std::thread& t : threads) t.join();
  if (interfering != nullptr) {
    if (!interference.status.ok()) return interference.status;
    interfering_ttft_ms = Seconds(interference.first - interference.sent) * 1e3;
    for (RequestResult& r : results) {
      for (const RequestResult::Gap& gap : r.gaps) {
        if (gap.end > interference.sent && gap.start < interference.first) {
          r.timing.interfered_itl_ms.push_back(gap.ms_per_token);
        }
      }
    }
  }
  Clock::time_point begin = Clock::time_point::max(), end = Clock::time_point::min();
  int64_t tokens = 0;
  for (const RequestResult& r : results) {
    if (!r.status.ok()) return r.status;
    begin = std::min(begin, r.sent);
    end = std::max(end, r.done);
    tokens += r.timing.tokens;
    timings.push_back(r.timing);
  }
  throughput_tok_s = static_cast<double>(tokens) / Seconds(end - begin);
  return absl::OkStatus();
}

std::string Row(const BenchSummary& s) {
  char line[256];
  std::snprintf(
      line, sizeof(line),
      "| %11d | %12.1f | %8.1f | %8.1f | %13.1f | %17.2f | %9.2f | %10.2f | %10.2f | %16.2f |\n",
      s.concurrency, s.ttft_ms_mean, s.ttft_ms, s.ttft_ms_p95, s.prefill_tok_s_mean,
      s.decode_tok_s_mean, s.decode_tok_s_p5, s.decode_tok_s_p50, s.decode_tok_s_p95,
      s.throughput_tok_s);
  return line;
}

// Whether the router timed eager decode steps against replays during the rounds, or ran them
// eagerly at their end (ReplayOrEager): the record and the tier line say so only then.
bool EagerStepsTried(const ServerCounters& c) {
  return c.known && (c.eager_step_trials > 0 || c.eager_steps_preferred);
}

// The expert tiers' figures of one concurrency, in words; empty without tiers.
std::string TierLine(const BenchSummary& s) {
  const std::optional<TierFigures> t = TierFiguresOf(s.server);
  if (!t) return "";
  std::string line = absl::StrFormat(
      "concurrency %d: expert uses %.1f%% hot, %.1f%% warm, %.1f%% cold; %.1f MB copied a token",
      s.concurrency, 100 * t->hot_hit_rate, 100 * t->warm_hit_rate, 100 * t->miss_rate,
      t->bytes_copied_per_token / 1e6);
  if (t->cpu_tier_experts_per_token > 0) {
    absl::StrAppendFormat(&line, ", %.1f experts a token on the CPU tier",
                          t->cpu_tier_experts_per_token);
  }
  if (const std::optional<double> accuracy = PrefetchAccuracyOf(s.server)) {
    absl::StrAppendFormat(&line, "; next-layer prediction %.1f%% correct", 100 * *accuracy);
  }
  const ServerCounters& c = s.server;
  if (c.steps > 0 && EagerStepsTried(c)) {
    absl::StrAppendFormat(&line, "; %.0f%% of steps replayed, eager steps %s",
                          100.0 * c.graph_steps / c.steps,
                          c.eager_steps_preferred ? "preferred" : "tried, replays kept");
  }
  return line + "\n";
}

}  // namespace

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

double PercentileP5(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(0.05 * static_cast<double>(values.size() - 1))];
}

double PercentileP95(std::vector<double> values) { return Percentile(std::move(values), 0.95); }

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  // Python's round(): half to even, which nearbyint does in the default rounding mode.
  return values[static_cast<size_t>(std::nearbyint(q * static_cast<double>(values.size() - 1)))];
}

absl::StatusOr<std::vector<int>> ParseConcurrency(const std::vector<std::string>& values) {
  std::vector<int> out;
  for (const std::string& v : values) {
    int c = 0;
    if (!absl::SimpleAtoi(v, &c) || c < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency: \"", v, "\" is not a positive integer"));
    }
    out.push_back(c);
  }
  if (out.empty()) return absl::InvalidArgumentError("--concurrency is empty");
  return out;
}

std::string CurrentCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg, line;
  for (bool first = true; std::getline(in, arg, '\0'); first = false) {
    if (first) arg = std::filesystem::path(arg).filename().string();
    const bool quote = arg.empty() || arg.find_first_of(" \t'\"\\$") != std::string::npos;
    if (quote) arg = absl::StrCat("'", absl::StrReplaceAll(arg, {{"'", "'\\''"}}), "'");
    absl::StrAppend(&line, first ? "" : " ", arg);
  }
  return line;
}

ServerCounters CounterDeltas(const v1::StatsResponse& before, const v1::StatsResponse& after) {
  ServerCounters c;
  c.known = true;
  c.generated_tokens = CounterSince(before.generated_tokens(), after.generated_tokens());
  c.preemptions = CounterSince(before.preemptions(), after.preemptions());
  c.prefix_cache_hit_tokens =
      CounterSince(before.prefix_cache_hit_tokens(), after.prefix_cache_hit_tokens());
  c.draft_tokens = CounterSince(before.draft_tokens(), after.draft_tokens());
  c.accepted_draft_tokens =
      CounterSince(before.accepted_draft_tokens(), after.accepted_draft_tokens());
  c.steps = CounterSince(before.steps(), after.steps());
  c.graph_steps = CounterSince(before.graph_steps(), after.graph_steps());
  c.prefetch_correct = CounterSince(before.prefetch_correct(), after.prefetch_correct());
  c.prefetch_actual = CounterSince(before.prefetch_actual(), after.prefetch_actual());
  c.eager_step_trials = CounterSince(before.eager_step_trials(), after.eager_step_trials());
  c.eager_steps_preferred = after.eager_steps_preferred();
  for (const v1::WorkerStats& w : after.workers()) {
    v1::TierCounters b;  // zeros for a worker that registered during the rounds
    for (const v1::WorkerStats& w0 : before.workers()) {
      if (w0.index() == w.index()) b = w0.tiers();
    }
    const v1::TierCounters& a = w.tiers();
    c.hot_hits += CounterSince(b.hot_hits(), a.hot_hits());
    c.warm_hits += CounterSince(b.warm_hits(), a.warm_hits());
    c.misses += CounterSince(b.misses(), a.misses());
    c.bytes_copied += CounterSince(b.bytes_copied(), a.bytes_copied());
    c.cpu_tier_experts += CounterSince(b.cpu_tier_experts(), a.cpu_tier_experts());
    c.prefetch_loads += CounterSince(b.prefetch_loads(), a.prefetch_loads());
    c.prefetch_hits += CounterSince(b.prefetch_hits(), a.prefetch_hits());
  }
  return c;
}

std::optional<TierFigures> TierFiguresOf(const ServerCounters& c) {
  const double uses = static_cast<double>(c.hot_hits + c.warm_hits + c.misses);
  if (!c.known || uses == 0) return std::nullopt;
  const double tokens = std::max<double>(static_cast<double>(c.generated_tokens), 1);
  return TierFigures{.hot_hit_rate = c.hot_hits / uses,
                     .warm_hit_rate = c.warm_hits / uses,
                     .miss_rate = c.misses / uses,
                     .expert_uses_per_token = uses / tokens,
                     .bytes_copied_per_token = c.bytes_copied / tokens,
                     .cpu_tier_experts_per_token = c.cpu_tier_experts / tokens};
}

std::optional<double> PrefetchAccuracyOf(const ServerCounters& c) {
  if (!c.known || c.prefetch_actual == 0) return std::nullopt;
  return static_cast<double>(c.prefetch_correct) / static_cast<double>(c.prefetch_actual);
}

BenchSummary Summarize(const ConcurrencyRun& run, int input_len) {
  std::vector<double> ttft, prefill, decode, server_ttft, server_decode, distinct;
  for (const RequestTiming& t : run.requests) {
    distinct.push_back(t.distinct_tokens);
    ttft.push_back(t.ttft_ms);
    prefill.push_back(t.prefill_tok_s);
    decode.push_back(t.decode_tok_s);
    server_ttft.push_back(t.server_ttft_ms);
    server_decode.push_back(t.server_decode_tok_s);
  }
  BenchSummary s;
  s.concurrency = run.concurrency;
  s.requests = static_cast<int>(run.requests.size());
  s.ttft_ms = Median(ttft);
  s.ttft_ms_mean = Mean(ttft);
  s.ttft_ms_p95 = PercentileP95(ttft);
  s.prefill_tok_s = s.ttft_ms > 0 ? input_len / (s.ttft_ms / 1e3) : 0.0;
  s.prefill_tok_s_mean = Mean(prefill);
  s.decode_tok_s_mean = Mean(decode);
  s.decode_tok_s_p5 = PercentileP5(decode);
  s.decode_tok_s_p50 = Median(decode);
  s.decode_tok_s_p95 = PercentileP95(decode);
  s.throughput_tok_s = Mean(run.round_throughput_tok_s);
  s.server_ttft_ms = Median(server_ttft);
  s.server_decode_tok_s_mean = Mean(server_decode);
  s.distinct_tokens = Mean(distinct);
  s.server = run.server;
  if (run.prompt_flops > 0 && s.ttft_ms > 0) s.prefill_tflops = run.prompt_flops / s.ttft_ms / 1e9;
  std::vector<double> itl, interfered;
  for (const RequestTiming& t : run.requests) {
    itl.insert(itl.end(), t.itl_ms.begin(), t.itl_ms.end());
    interfered.insert(interfered.end(), t.interfered_itl_ms.begin(), t.interfered_itl_ms.end());
  }
  s.itl_ms_p50 = Percentile(itl, 0.5);
  s.itl_ms_p95 = Percentile(itl, 0.95);
  s.itl_ms_p99 = Percentile(itl, 0.99);
  s.itl_ms_max = itl.empty() ? 0.0 : *std::max_element(itl.begin(), itl.end());
  s.interfered_gaps = static_cast<int>(interfered.size());
  s.interfered_itl_ms_p95 = Percentile(interfered, 0.95);
  s.interfered_itl_ms_max =
      interfered.empty() ? 0.0 : *std::max_element(interfered.begin(), interfered.end());
  s.interfering_ttft_ms = Median(run.interfering_ttft_ms);
  return s;
}

std::string BenchOutputPath(const std::string& out, int concurrency, bool several) {
  if (!several) return out;
  const std::filesystem::path path(out);
  std::filesystem::path result = path.parent_path() / path.stem();
  result += absl::StrCat("-c", concurrency);
  result += path.extension();
  return result.string();
}

std::string BenchResultJson(const BenchOptions& o, const std::string& model, const BenchSummary& s,
                            absl::Time now) {
  // hf-peer-bench.py's fields in its order, then the ones it does not have.
  nlohmann::ordered_json row;
  row["model"] = model;
  row["weights"] = o.weights;
  row["mode"] = o.mode;
  row["gpus"] = o.gpus;
  row["concurrency"] = s.concurrency;
  row["input_len"] = o.input_len;
  row["output_len"] = o.output_len;
  row["decode_tok_s_mean"] = s.decode_tok_s_mean;
  row["decode_tok_s_p5"] = s.decode_tok_s_p5;
  row["decode_tok_s_p95"] = s.decode_tok_s_p95;
  row["prefill_tok_s"] = s.prefill_tok_s;
  row["ttft_ms"] = s.ttft_ms;
  row["machine"] = o.machine.empty() ? "unspecified" : o.machine;
  row["date"] = absl::FormatTime("%Y-%m-%d", now, absl::LocalTimeZone());
  row["command"] = o.command;
  if (!o.note.empty()) row["note"] = o.note;
  if (!o.commit.empty()) row["commit"] = o.commit;
  row["decode_tok_s_p50"] = s.decode_tok_s_p50;
  row["ttft_ms_mean"] = s.ttft_ms_mean;
  row["ttft_ms_p95"] = s.ttft_ms_p95;
  row["prefill_tok_s_mean"] = s.prefill_tok_s_mean;
  row["throughput_tok_s"] = s.throughput_tok_s;
  row["runs"] = o.runs;
  row["warmup"] = o.warmup;
  row["requests"] = s.requests;
  row["seed"] = o.seed;
  if (o.shared_prefix > 0) row["shared_prefix"] = o.shared_prefix;
  if (s.prefill_tflops > 0) row["prefill_tflops"] = s.prefill_tflops;
  if (s.prefill_tflops > 0 && o.peak_tflops > 0) {
    row["peak_tflops"] = o.peak_tflops;
    row["prefill_peak_share"] = s.prefill_tflops / o.peak_tflops;
  }
  row["itl_ms_p50"] = s.itl_ms_p50;
  row["itl_ms_p95"] = s.itl_ms_p95;
  row["itl_ms_p99"] = s.itl_ms_p99;
  row["itl_ms_max"] = s.itl_ms_max;
  if (o.interfering_prompt_len > 0) {
    row["interfering_prompt_len"] = o.interfering_prompt_len;
    row["interfering_after_s"] = absl::ToDoubleSeconds(o.interfering_after);
    row["interfering_ttft_ms"] = s.interfering_ttft_ms;
    row["interfered_gaps"] = s.interfered_gaps;
    row["interfered_itl_ms_p95"] = s.interfered_itl_ms_p95;
    row["interfered_itl_ms_max"] = s.interfered_itl_ms_max;
  }
  row["server_ttft_ms"] = s.server_ttft_ms;
  row["server_decode_tok_s_mean"] = s.server_decode_tok_s_mean;
  const ServerCounters& c = s.server;
  if (c.known) row["server_preemptions"] = c.preemptions;
  if (c.known) row["server_prefix_cache_hit_tokens"] = c.prefix_cache_hit_tokens;
  if (c.known && c.draft_tokens > 0) {
    row["server_draft_tokens"] = c.draft_tokens;
    row["server_accepted_draft_tokens"] = c.accepted_draft_tokens;
    row["draft_acceptance"] = static_cast<double>(c.accepted_draft_tokens) / c.draft_tokens;
  }
  row["temperature"] = o.temperature;
  if (o.temperature > 0 && o.top_k > 0) row["top_k"] = o.top_k;
  if (o.temperature > 0 && o.top_p < 1.0f) row["top_p"] = o.top_p;
  if (o.temperature > 0 && o.min_p > 0.0f) row["min_p"] = o.min_p;
  if (o.repetition_penalty != 1.0f) row["repetition_penalty"] = o.repetition_penalty;
  row["distinct_output_tokens"] = s.distinct_tokens;
  if (c.known && c.steps > 0) {
    row["graph_steps_fraction"] = static_cast<double>(c.graph_steps) / c.steps;
  }
  if (EagerStepsTried(c)) {
    row["eager_step_trials"] = c.eager_step_trials;
    row["eager_steps_preferred"] = c.eager_steps_preferred;
  }
  if (const std::optional<TierFigures> t = TierFiguresOf(c)) {
    nlohmann::ordered_json tiers;
    tiers["hot_hit_rate"] = t->hot_hit_rate;
    tiers["warm_hit_rate"] = t->warm_hit_rate;
    tiers["miss_rate"] = t->miss_rate;
    tiers["expert_uses_per_token"] = t->expert_uses_per_token;
    tiers["bytes_copied_per_token"] = t->bytes_copied_per_token;
    tiers["cpu_tier_experts_per_token"] = t->cpu_tier_experts_per_token;
    tiers["prefetch_loads"] = c.prefetch_loads;
    tiers["prefetch_hits"] = c.prefetch_hits;
    row["tiers"] = tiers;
  }
  if (const std::optional<double> accuracy = PrefetchAccuracyOf(c)) {
    row["prefetch_accuracy"] = *accuracy;
  }
  return row.dump(1);
}

absl::StatusOr<BenchReport> RunBench(
    const BenchOptions& o, std::ostream& progress,
    std::function<absl::Status(const std::string& model, const ConcurrencyRun& run)> on_run) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  v1::ModelInfoResponse info;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(o.connect_timeout));
    const grpc::Status s = stub->ModelInfo(&context, v1::ModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach a Strata cluster at ", o.server, ": ", s.error_message()));
    }
  }
  if (info.vocab_size() <= static_cast<uint32_t>(info.eos_token_ids_size())) {
    return absl::FailedPreconditionError("the model's vocabulary has no ids besides EOS");
  }
  const int64_t context_needed = static_cast<int64_t>(o.input_len) + o.output_len;
  if (info.max_context_tokens() > 0 && context_needed > info.max_context_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("--input-len + --output-len = ", context_needed,
                                                   " exceeds the model's ",
                                                   info.max_context_tokens(), "-token context"));
  }
  BenchReport report;
  report.model = o.model_name.empty() ? info.model_type() : o.model_name;
  PromptSource prompts(o.seed, o, o.shared_prefix, info, o.prompts);
  for (int c : o.concurrency) {
    ConcurrencyRun run;
    run.concurrency = c;
    const double n = o.input_len;
    run.prompt_flops =
        n * info.linear_flops_per_token() + n * (n + 1) / 2 * info.attention_flops_per_pair();
    std::optional<v1::StatsResponse> before;
    for (int round = 0; round < o.warmup + o.runs; ++round) {
      const bool warmup = round < o.warmup;
      if (round == o.warmup) before = ServerStats(o.admin, o.connect_timeout);
      const std::string name =
          absl::StrCat("concurrency ", c, ", ", warmup ? "warmup " : "", "round ",
                       warmup ? round + 1 : round - o.warmup + 1, "/", warmup ? o.warmup : o.runs);
      progress << "strata bench: " << name << std::endl;
      std::vector<v1::GenerateRequest> requests;
      for (int i = 0; i < c; ++i) requests.push_back(prompts.Next(o.input_len, o.output_len));
      std::optional<v1::GenerateRequest> interfering;
      if (o.interfering_prompt_len > 0) interfering = prompts.Next(o.interfering_prompt_len, 1);
      std::vector<RequestTiming> timings;
      double throughput = 0, interfering_ttft_ms = 0;
      if (absl::Status s = RunRound(*stub, requests, interfering ? &*interfering : nullptr, o,
                                    timings, throughput, interfering_ttft_ms);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
      }
      if (warmup) continue;
      run.requests.insert(run.requests.end(), timings.begin(), timings.end());
      run.round_throughput_tok_s.push_back(throughput);
      if (interfering) run.interfering_ttft_ms.push_back(interfering_ttft_ms);
    }
    const std::optional<v1::StatsResponse> after = ServerStats(o.admin, o.connect_timeout);
    if (before && after) run.server = CounterDeltas(*before, *after);
    if (run.server.prefix_cache_hit_tokens > 0 && o.shared_prefix == 0) {
      progress << "strata bench: concurrency " << c << ": " << run.server.prefix_cache_hit_tokens
               << " prompt tokens came from the prefix cache (a prompt sent before, e.g. by an "
                  "earlier bench with the same --seed), so these TTFTs are not all prefills"
               << std::endl;
    }
    if (run.server.preemptions > 0) {
      progress << "strata bench: concurrency " << c << ": the server preempted "
               << run.server.preemptions
               << " sequences for KV blocks during the measured rounds, so these figures "
                  "include recomputation (a larger --kv-cache-mb avoids it)"
               << std::endl;
    }
    if (on_run) RETURN_IF_ERROR(on_run(report.model, run));
    report.runs.push_back(std::move(run));
  }
  return report;
}

absl::Status RunBenchCommand(const BenchOptions& o, std::ostream& out, std::ostream& progress) {
  const absl::Time now = absl::Now();
  const bool several = o.concurrency.size() > 1;
  // Where the files go is checked before the rounds run, not after minutes of them.
  if (!o.out.empty()) {
    const std::filesystem::path dir =
        std::filesystem::absolute(std::filesystem::path(o.out)).parent_path();
    if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--out ", o.out, ": ", dir.string(), " is not a writable directory"));
    }
  }
  std::vector<BenchSummary> summaries;
  std::vector<std::string> rows;  // each concurrency's JSON object
  auto record = [&](const std::string& model, const ConcurrencyRun& run) -> absl::Status {
    summaries.push_back(Summarize(run, o.input_len));
    rows.push_back(BenchResultJson(o, model, summaries.back(), now));
    if (o.out.empty()) return absl::OkStatus();
    const std::string path = BenchOutputPath(o.out, summaries.back().concurrency, several);
    std::ofstream file(path);
    file << rows.back() << "\n";
    file.close();
    if (!file) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
    progress << "strata bench: wrote " << path << std::endl;
    return absl::OkStatus();
  };
  absl::StatusOr<BenchReport> report = RunBench(o, progress, record);
  if (!report.ok()) return report.status();

  out << report->model << " at " << o.server << ": input " << o.input_len << ", output "
      << o.output_len << ", " << o.runs << " rounds per concurrency after " << o.warmup
      << " warmup; greedy, ignore_eos; per-request figures over rounds x concurrency requests\n\n";
  out << "| concurrency | TTFT ms mean | TTFT P50 | TTFT P95 | prefill tok/s | decode tok/s mean "
         "| decode P5 | decode P50 | decode P95 | throughput tok/s |\n";
  out << "|------------:|-------------:|---------:|---------:|--------------:|------------------:"
         "|----------:|-----------:|-----------:|-----------------:|\n";
  for (const BenchSummary& s : summaries) out << Row(s);
  out << "\n";
  for (const BenchSummary& s : summaries) {
    out << absl::StrFormat(
        "inter-token latency at concurrency %d: P50 %.1f ms, P95 %.1f, P99 %.1f, "
        "max %.1f\n",
        s.concurrency, s.itl_ms_p50, s.itl_ms_p95, s.itl_ms_p99, s.itl_ms_max);
    if (o.interfering_prompt_len > 0) {
      out << absl::StrFormat(
          "  during a %d-token prompt's prefill (TTFT %.0f ms): %d gaps, P95 %.1f ms, max %.1f\n",
          o.interfering_prompt_len, s.interfering_ttft_ms, s.interfered_gaps,
          s.interfered_itl_ms_p95, s.interfered_itl_ms_max);
    }
  }
  for (const BenchSummary& s : summaries) {
    if (s.prefill_tflops <= 0) continue;
    out << "prefill at concurrency " << s.concurrency << ": "
        << absl::StrFormat("%.1f TFLOP/s", s.prefill_tflops);
    if (o.peak_tflops > 0) {
      out << absl::StrFormat(", %.1f%% of the %.0f TFLOP/s peak assumed",
                             100 * s.prefill_tflops / o.peak_tflops, o.peak_tflops);
    }
    out << "\n";
  }
  for (const BenchSummary& s : summaries) out << TierLine(s);
  for (const std::string& row : rows) out << nlohmann::ordered_json::parse(row).dump() << "\n";
  return absl::OkStatus();
}

}  // namespace strata
