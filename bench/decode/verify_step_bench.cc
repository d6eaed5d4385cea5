// What a speculative-decoding verify step costs: one sequence, `k` tokens in one step after
// `context` cached ones (every row's logits to the host, as a verify needs), against k = 1.
// On a MoE model a k-token step reads the experts of all k tokens, so its cost grows with the
// distinct experts the tokens pick; speculation pays only when accepted tokens outrun that.
//   verify_step_bench --model DIR [--device cuda] [--weights fp8] [--contexts 128,2048]
//                     [--tokens 1,2,4,8] [--repeats 20] [--out FILE.json]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine/local_engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, device, "cuda", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, weights, "bf16", "bf16 or fp8 (on a GPU)");
ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"128", "2048"}),
          "Cached tokens before the step");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"1", "2", "4", "8"}),
          "Tokens in the step (k)");
ABSL_FLAG(int, repeats, 20, "Timed steps per (context, k), after 3 untimed");
ABSL_FLAG(int, threads, 0, "CPU threads for --device cpu");
ABSL_FLAG(std::string, machine, "", "Machine description for the record");
ABSL_FLAG(std::string, out, "", "JSON file to write");

namespace {

std::vector<int> Ints(const std::vector<std::string>& values) {
  std::vector<int> out;
  for (const std::string& v : values) out.push_back(std::stoi(v));
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string command = "verify_step_bench";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command, " ", argv[i]);
  strata::LocalEngineOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.device = absl::GetFlag(FLAGS_device);
  options.expert_weights = absl::GetFlag(FLAGS_weights);
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.kv.memory_mb = 8 << 10;
  auto engine = strata::LocalEngine::Create(options);
  if (!engine.ok()) {
    std::cerr << "verify_step_bench: " << engine.status().message() << "\n";
    return 1;
  }
  const int64_t vocab = (*engine)->config().vocab_size;
  std::mt19937_64 rng(7);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    return ids;
  };
  const int repeats = std::max(absl::GetFlag(FLAGS_repeats), 1);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::cout << "| context | k | step ms (median) | vs k = 1 | ms per token |\n|---|---|---|---|---|\n";
  for (int context : Ints(absl::GetFlag(FLAGS_contexts))) {
    const auto seq = (*engine)->AddSequence();
    const std::vector<int32_t> prompt = random_ids(context);
    for (int start = 0; start < context; start += 512) {
      const int len = std::min(512, context - start);
      auto step = (*engine)->RunStep(
          seq, absl::MakeConstSpan(prompt).subspan(start, len), start);
      if (!step.ok()) {
        std::cerr << "verify_step_bench: prefill: " << step.status().message() << "\n";
        return 1;
      }
    }
    double one_token_ms = 0;
    for (int k : Ints(absl::GetFlag(FLAGS_tokens))) {
      std::vector<double> ms;
      for (int r = 0; r < repeats + 3; ++r) {
        // The same positions each time: the step rewrites the keys it appended before.
        const std::vector<int32_t> ids = random_ids(k);
        const auto t0 = std::chrono::steady_clock::now();
        auto step = (*engine)->RunStep(seq, ids, context);
        const auto t1 = std::chrono::steady_clock::now();
        if (!step.ok()) {
          std::cerr << "verify_step_bench: " << step.status().message() << "\n";
          return 1;
        }
        if (r >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      const double median = Median(ms);
      if (k == 1) one_token_ms = median;
      const double ratio = one_token_ms > 0 ? median / one_token_ms : 0;
      std::cout << absl::StrFormat("| %d | %d | %.3f | %.2fx | %.3f |\n", context, k, median, ratio,
                                   median / k);
      rows.push_back({{"context", context}, {"k", k}, {"step_ms_median", median},
                      {"vs_one_token", ratio}, {"step_ms_min", *std::min_element(ms.begin(), ms.end())}});
    }
    (*engine)->ReleaseSequence(seq);
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    nlohmann::ordered_json record = {{"model", options.model_dir},
                                     {"device", options.device},
                                     {"weights", options.expert_weights},
                                     {"machine", absl::GetFlag(FLAGS_machine)},
                                     {"command", command},
                                     {"repeats", repeats},
                                     {"steps", rows}};
    std::ofstream(out) << record.dump(2) << "\n";
  }
  return 0;
}
