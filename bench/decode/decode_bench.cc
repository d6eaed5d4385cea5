// Not a test: batch-1 decode speed of a model in this process (`mode: in-process`), the way
// `strata bench` measures a cluster: random prompts of --input-len ids, --output-len greedy
// tokens with EOS ignored, --runs times after --warmup runs. Prints a table and writes one JSON
// object in the bench/results format.
//   decode_bench --model DIR --device cuda --weights bf16|fp8 --out FILE.json
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/local_engine.h"
#include "common/util/process.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, model_name, "", "Shape name for the record (default: the directory name)");
ABSL_FLAG(std::string, device, "cuda", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, weights, "bf16",
          "Weights on the GPU: bf16 or fp8 (experts and attention projections)");
ABSL_FLAG(std::string, attention_weights, "",
          "The attention projections' weights when they differ from --weights: bf16 or fp8");
ABSL_FLAG(int, input_len, 128, "Prompt tokens");
ABSL_FLAG(int, output_len, 512, "Generated tokens per run");
ABSL_FLAG(float, temperature, 0.0f, "Sampling temperature (0: greedy)");
ABSL_FLAG(float, top_p, 1.0f, "Nucleus mass kept when sampling");
ABSL_FLAG(int, top_k, 0, "Tokens kept when sampling (0: no limit)");
ABSL_FLAG(float, repetition_penalty, 1.0f, "Repetition penalty when sampling (1: off)");
ABSL_FLAG(int, runs, 10, "Measured runs");
ABSL_FLAG(int, warmup, 1, "Unmeasured runs first");
ABSL_FLAG(int, threads, 0, "CPU threads for --device cpu");
ABSL_FLAG(bool, overlap_steps, true,
          "Launch each decode step before the last one's token is read (its argmax on the GPU)");
ABSL_FLAG(std::string, machine, "", "Machine description for the record");
ABSL_FLAG(std::string, out, "", "JSON file to write");

namespace {

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  strata::DashedFlags flags(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(flags.argc(), flags.argv());
  std::string command = "decode_bench";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command, " ", argv[i]);
  strata::LocalEngineOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.device = absl::GetFlag(FLAGS_device);
  options.expert_weights = absl::GetFlag(FLAGS_weights);
  options.attention_weights = absl::GetFlag(FLAGS_attention_weights);
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.overlap_decode_steps = absl::GetFlag(FLAGS_overlap_steps);
  options.prefill_chunk_tokens = std::max(absl::GetFlag(FLAGS_input_len), 1);
  options.kv.memory_mb = 8 << 10;
  options.on_progress = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto load_start = std::chrono::steady_clock::now();
  auto engine = strata::LocalEngine::Create(options);
  if (!engine.ok()) {
    std::cerr << "decode_bench: " << engine.status().message() << "\n";
    return 1;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::cerr << "loaded in " << load_s << " s\n";
  const int64_t vocab = (*engine)->config().vocab_size;
  std::mt19937_64 rng(1234);
  std::vector<double> ttft_ms, decode_tps, prefill_tps;
  const int runs = absl::GetFlag(FLAGS_runs), warmup = absl::GetFlag(FLAGS_warmup);
  strata::DecodeGraphs::Timing after_warmup;  // the replays' timing counts measured runs only
  for (int run = 0; run < warmup + runs; ++run) {
    if (run == warmup) after_warmup = (*engine)->decode_graph_timing();
    std::vector<int32_t> prompt(absl::GetFlag(FLAGS_input_len));
    for (auto& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    strata::GenerateOptions g;
    g.max_new_tokens = absl::GetFlag(FLAGS_output_len);
    g.ignore_eos = true;
    g.sampling.temperature = absl::GetFlag(FLAGS_temperature);
    g.sampling.top_p = absl::GetFlag(FLAGS_top_p);
    g.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    g.sampling.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
    g.sampling.seed = 1 + static_cast<uint64_t>(run);
    std::chrono::steady_clock::time_point first, last;
    int count = 0;
    g.on_token = [&](int32_t) {
      last = std::chrono::steady_clock::now();
      if (count++ == 0) first = last;
    };
    const auto start = std::chrono::steady_clock::now();
    auto tokens = (*engine)->Generate(prompt, g);
    if (!tokens.ok()) {
      std::cerr << "decode_bench: " << tokens.status().message() << "\n";
      return 1;
    }
    if (run < warmup) continue;
    const double ttft = std::chrono::duration<double, std::milli>(first - start).count();
    const double decode_s = std::chrono::duration<double>(last - first).count();
    ttft_ms.push_back(ttft);
    prefill_tps.push_back(prompt.size() / (ttft / 1000.0));
    decode_tps.push_back((count - 1) / decode_s);
    std::cerr << "run " << run - warmup << ": ttft " << ttft << " ms, decode " << decode_tps.back()
              << " tok/s\n";
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  // Host time of the replayed steps (see DecodeGraphs::Timing): the GPU idles `between`.
  strata::DecodeGraphs::Timing timing = (*engine)->decode_graph_timing();
  timing.replays -= after_warmup.replays;
  timing.replay_us -= after_warmup.replay_us;
  timing.overlapped -= after_warmup.overlapped;
  timing.pairs -= after_warmup.pairs;
  timing.between_us -= after_warmup.between_us;
  std::string name = absl::GetFlag(FLAGS_model_name);
  if (name.empty()) name = options.model_dir.substr(options.model_dir.find_last_of('/') + 1);
  nlohmann::json record = {
      {"model", name},
      {"weights", options.expert_weights},
      {"attention_weights",
       options.attention_weights.empty() ? options.expert_weights : options.attention_weights},
      {"mode", "in-process"},
      {"device", options.device},
      {"gpus", options.device == "cpu" ? 0 : 1},
      {"concurrency", 1},
      {"input_len", absl::GetFlag(FLAGS_input_len)},
      {"output_len", absl::GetFlag(FLAGS_output_len)},
      {"runs", runs},
      {"decode_tok_s_mean", Mean(decode_tps)},
      {"decode_tok_s_p5", Percentile(decode_tps, 5)},
      {"decode_tok_s_p50", Percentile(decode_tps, 50)},
      {"decode_tok_s_p95", Percentile(decode_tps, 95)},
      {"prefill_tok_s", Mean(prefill_tps)},
      {"ttft_ms", Mean(ttft_ms)},
      {"load_s", load_s},
      {"graph_replay_us", timing.mean_replay_us()},
      {"graph_between_us", timing.mean_between_us()},
      {"graph_overlapped_steps", timing.overlapped},
      {"machine", absl::GetFlag(FLAGS_machine)},
      {"date", date},
      {"command", command},
  };
  std::cout << "model " << name << " | weights " << options.expert_weights << " | in-process | "
            << "decode tok/s mean " << record["decode_tok_s_mean"].get<double>() << " (P5 "
            << record["decode_tok_s_p5"].get<double>() << ", P95 "
            << record["decode_tok_s_p95"].get<double>() << ") | TTFT "
            << record["ttft_ms"].get<double>() << " ms | prefill "
            << record["prefill_tok_s"].get<double>() << " tok/s | replay "
            << record["graph_replay_us"].get<double>() << " us, between replays "
            << record["graph_between_us"].get<double>() << " us\n";
  if (!absl::GetFlag(FLAGS_out).empty())
    std::ofstream(absl::GetFlag(FLAGS_out)) << record.dump(2) << "\n";
  return 0;
}
