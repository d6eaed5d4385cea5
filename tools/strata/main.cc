// strata: the command-line tool.
//   strata logits   --model DIR --ids 1,2,3
//   strata generate --model DIR --ids 1,2,3 [--max-new-tokens N] [--temperature T ...]
//   strata generate --server HOST:PORT (--ids 1,2,3 | --prompt TEXT) [...]
//   strata up       --model DIR [--workers N] [--device cpu] [--port P] [--config FILE]
//   strata bench    --server HOST:PORT [--input-len 128 --output-len 512 --runs 10 ...]
//   strata plan     --model DIR --calibration FILE.jsonl --workers N --out plan.json
//   strata quantize --model DIR --out DIR [--calibration FILE.jsonl --samples 512]
#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/engine/engine_flags.h"
#include "common/engine/sampling_request.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/flag_help.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "common/util/tunables.h"
#include "tools/strata/admin_target.h"
#include "tools/strata/bench_command.h"
#include "tools/strata/client_commands.h"
#include "tools/strata/commands.h"
#include "tools/strata/eval_command.h"
#include "tools/strata/id_list.h"
#include "tools/strata/make_model.h"
#include "tools/strata/plan_command.h"
#include "tools/strata/quantize_command.h"
#include "tools/strata/supervisor.h"

// Each flag's help here is true for every command that lists it in Commands(); a command that
// takes a flag in a sense of its own says so there. The engine's flags (threads, the gate's
// temperature, the KV cache's) are engine_flags.h's, shared with strata-router.
ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, ids, "", "Prompt token ids, comma-separated");
ABSL_FLAG(std::string, prompt, "",
          "Prompt text (the model needs a tokenizer.json or tiktoken.model)");
ABSL_FLAG(std::string, server, "", "A running cluster's client address, HOST:PORT");
ABSL_FLAG(std::string, admin, "",
          "The router's internal listener (unix:PATH or HOST:PORT); default: found from --server "
          "for a cluster this user started here");
ABSL_FLAG(std::string, cluster_token_file, "",
          "With --admin: the cluster token's file; empty: $STRATA_CLUSTER_TOKEN");
// Repeatable (--stop A --stop B): main() takes every occurrence out of argv before Abseil, which
// would keep only the last. Defined for its help and so that it is a known flag.
ABSL_FLAG(std::string, stop, "", "A stop string (with --server); repeat the flag for more");
ABSL_FLAG(bool, stream, false,
          "Print the text as it arrives, then [finish: REASON] on stderr (with --server)");
ABSL_FLAG(int, max_new_tokens, 16, "Tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 is greedy");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens; 0 keeps all");
ABSL_FLAG(double, top_p, 1.0, "Sample from the smallest set with this probability mass");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "Sampling seed: given (0 too), the same tokens each time; without it, a new seed "
          "each request");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the end-of-sequence token");
ABSL_FLAG(std::optional<double>, min_p, std::nullopt,
          "Sample only tokens with probability >= this x the most likely one's; 0 is off");
ABSL_FLAG(std::optional<double>, repetition_penalty, std::nullopt,
          "Divide positive (multiply negative) logits of tokens in the prompt or output by "
          "this; 1 is off");
ABSL_FLAG(std::optional<double>, presence_penalty, std::nullopt,
          "Subtract this from the logits of tokens the output holds, in [-2, 2]");
ABSL_FLAG(std::optional<double>, frequency_penalty, std::nullopt,
          "Subtract this x its count in the output from a token's logit, in [-2, 2]");
ABSL_FLAG(std::string, logit_bias, "",
          "Biases added to the logits of token ids: ID:BIAS pairs, comma-separated (e.g. "
          "5:10,7:-100)");
ABSL_FLAG(int, min_tokens, 0, "Tokens to generate before an end-of-sequence or stop token");
ABSL_FLAG(std::string, stop_token_ids, "", "Token ids that end generation, comma-separated");
ABSL_FLAG(int, prefill_chunk, 512, "Prompt tokens per forward step");
ABSL_FLAG(int, workers, 1, "Workers to place experts on");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model runs: cpu, or cuda / cuda:N (in-process commands)");
ABSL_FLAG(std::string, log_level, "warning", "debug, info, warning or error");
ABSL_FLAG(std::string, text, "", "The text file to score");
ABSL_FLAG(int, window, 256, "Tokens per scored window");
ABSL_FLAG(bool, expert_stats, false, "Per-layer expert activation counts and Gini");
ABSL_FLAG(std::string, hit_rates, "",
          "Shares of the (layer, expert) pairs, e.g. 0.25,0.5: hit rates of expert caches that "
          "size over the text's routing replayed as decode steps (in process)");
ABSL_FLAG(std::string, shape, "",
          "qwen3-30b-a3b, mixtral-8x7b, seed-125b, glm-4.5, glm-4.5-air, deepseek-v3, kimi-k2, "
          "tiny-qwen3, tiny-mixtral, tiny-glm4, tiny-deepseek");
ABSL_FLAG(std::string, dtype, "bf16",
          "bf16, f16, f32, or fp8 (FP8 E4M3 experts with F32 scales, the rest bf16; DeepSeek "
          "shapes: every linear but the gates and kv_b_proj)");
ABSL_FLAG(std::string, fp8_scaling, "channel",
          "FP8 scales: channel (one per output row, `<name>_scale`) or block (one per 128x128 "
          "block, `<name>_scale_inv`, as DeepSeek-V3 ships)");
ABSL_FLAG(std::string, skew, "none", "zipf:S, expert popularity ~ 1/rank^S");
ABSL_FLAG(int, layers, 0, "Layers instead of the shape's own (0 keeps them)");
ABSL_FLAG(bool, force, false, "Write --out even when it is not empty");
ABSL_FLAG(int, input_len, 128, "Prompt tokens per request (random ids, --seed)");
ABSL_FLAG(int, shared_prefix, 0,
          "Leading prompt tokens every request shares (a repeated system prompt)");
ABSL_FLAG(int, output_len, 512, "Tokens generated per request");
ABSL_FLAG(std::string, prompts, "",
          "Prompts from a JSON Lines file ({\"text\": ...} a line, encoded with --model's "
          "tokenizer), taken in turn and cut to --input-len; default: random ids");
ABSL_FLAG(int, runs, 10, "Measured rounds per concurrency");
ABSL_FLAG(int, warmup, 1, "Unmeasured rounds per concurrency first");
ABSL_FLAG(std::vector<std::string>, concurrency, {"1"}, "Requests per round, e.g. 1,8,32");
ABSL_FLAG(std::string, out, "", "Where the output is written");
ABSL_FLAG(int, kv_blocks, 0, "The router's KV pool in blocks");
ABSL_FLAG(std::string, hot_ratio, "auto",
          "Share of each worker's experts kept resident, or auto (by context length)");
ABSL_FLAG(std::string, calibration, "",
          "JSON Lines of prompts, {\"text\": ...} or {\"token_ids\": [...]} a line");
ABSL_FLAG(int, samples, 512, "Calibration prompts to score (the first N)");
ABSL_FLAG(bool, kv_scales, false,
          "With --calibration, also write FP8 KV-cache scales (k_scale, v_scale a layer) from "
          "the keys' and values' largest magnitudes on the prompts");
ABSL_FLAG(std::string, model_name, "", "Model recorded (default: --model's name)");
ABSL_FLAG(std::string, weights, "bf16", "Expert weights on a GPU, bf16 or fp8");
ABSL_FLAG(std::string, mode, "cluster", "Mode recorded: cluster|in-process|transformers");
ABSL_FLAG(int, gpus, 0, "GPUs recorded (0 for a CPU cluster)");
ABSL_FLAG(std::string, machine, "", "Machine recorded, e.g. \"NVIDIA H200\"");
ABSL_FLAG(std::string, commit, "", "The server build's commit, recorded as \"commit\"");
ABSL_FLAG(double, peak_tflops, 0,
          "The server GPU's dense bf16 tensor-core peak in TFLOP/s (H100 and H200 SXM: 989), "
          "recorded with the share of it a prefill reaches; 0: not recorded");
ABSL_FLAG(int, interfering_prompt_len, 0,
          "In each round, a prompt this long (one token out, not counted) sent "
          "--interfering-after-s after the measured requests; the inter-token gaps during its "
          "prefill are reported apart; 0: none");
ABSL_FLAG(double, interfering_after_s, 1.0, "See --interfering-prompt-len");
ABSL_FLAG(std::string, note, "", "Free text recorded as \"note\", e.g. the server's settings");

namespace {

// A flag as a command takes it: its name (dashed) and, where the flag's own help is not true
// of this command, the command's.
struct CommandFlag {
  CommandFlag(const char* name, const char* help = "") : name(name), help(help) {}
  std::string name;
  std::string help;  // empty: the flag's own
};

// Each command: its synopsis, what it does, and its flags (for `strata <command> --help`).
struct Command {
  const char* name;
  const char* synopsis;
  const char* summary;
  std::vector<CommandFlag> flags;
};

const std::vector<CommandFlag> kEngineFlags = {"device",
                                               "weights",
                                               "threads",
                                               "kv-block-size",
                                               "kv-cache-mb",
                                               "kv-cache-dtype",
                                               "kv-cache-fp16-above-tokens",
                                               "kv-cache-calibration-tokens",
                                               "prefill-chunk",
                                               "gate-temperature",
                                               "router-temperature",
                                               "log-level"};

std::vector<CommandFlag> With(std::vector<CommandFlag> flags,
                              const std::vector<CommandFlag>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"generate", "--server HOST:PORT | --model DIR, --prompt TEXT | --ids 1,2,3 [flags]",
       "new tokens through a cluster (--server) or the model in this process (--model), as JSON",
       With({{"server", "Generate through a running cluster at HOST:PORT"},
             "model",
             "prompt",
             "ids",
             "max-new-tokens",
             "temperature",
             "top-k",
             "top-p",
             "seed",
             "stop",
             "stream",
             "ignore-eos",
             "min-p",
             "repetition-penalty",
             "presence-penalty",
             "frequency-penalty",
             "logit-bias",
             "min-tokens",
             "stop-token-ids"},
            kEngineFlags)},
      {"up",
       "--model DIR [--workers N] [--device cpu|cuda] [--port P] [--config FILE]",
       "start a cluster; prints READY <host>:<port>",
       {}},
      {"logits", "--model DIR --ids 1,2,3", "logits of every position, as JSON",
       With({"model", {"ids", "Token ids, comma-separated"}}, kEngineFlags)},
      {"eval", "--model DIR --text FILE [--server HOST:PORT] [--window 256] [--expert-stats]",
       "perplexity of the text, as JSON",
       With({"model",
             "text",
             {"server", "Score through a running cluster at HOST:PORT"},
             "window",
             "expert-stats",
             "hit-rates"},
            kEngineFlags)},
      {"bench",
       "--server HOST:PORT [--input-len 128] [--output-len 512] [--concurrency 1,8,32]",
       "serving benchmark of a cluster: a table, and bench/results JSON",
       {{"server", "The cluster to measure, HOST:PORT"},
        {"admin",
         "The router's internal listener (unix:PATH or HOST:PORT), for its counters; "
         "default: found from --server for a cluster this user started here"},
        "cluster-token-file",
        "input-len",
        "shared-prefix",
        "prompts",
        "output-len",
        "runs",
        "warmup",
        "concurrency",
        {"seed",
         "Seed of the random prompts and, with --temperature, of the requests' sampling "
         "seeds; 0 when not given"},
        "temperature",
        "top-k",
        "top-p",
        "min-p",
        "repetition-penalty",
        {"out", "JSON results file (bench/results/README.md)"},
        {"model",
         "The served model's directory: its tokenizer encodes --prompts, its name is "
         "recorded unless --model-name"},
        "model-name",
        {"weights", "The expert weights recorded, bf16 or fp8"},
        "mode",
        "gpus",
        "machine",
        "commit",
        "note",
        "peak-tflops",
        "interfering-prompt-len",
        "interfering-after-s",
        "log-level"}},
      {"stats",
       "--server HOST:PORT | --admin ADDRESS [--cluster-token-file FILE]",
       "the router's counters, request totals and latency, its workers and their tiers, as JSON",
       {"server", "admin", "cluster-token-file", "log-level"}},
      {"hot-ratio",
       "--server HOST:PORT | --admin ADDRESS, --hot-ratio (R | auto)",
       "set the workers' hot ratio now",
       {"server", "admin", "cluster-token-file", "hot-ratio", "log-level"}},
      {"kv-resize",
       "--server HOST:PORT | --admin ADDRESS, --kv-blocks N",
       "resize the router's KV pool between steps (shrinking compacts the blocks in use below "
       "the new end), as JSON",
       {"server", "admin", "cluster-token-file", "kv-blocks", "log-level"}},
      {"plan", "--model DIR --calibration FILE.jsonl --workers N --out plan.json",
       "count expert activations, place experts so every worker's load is equal",
       With({"model",
             {"calibration",
              "JSON Lines of prompts, {\"text\": ...} or {\"token_ids\": [...]} "
              "a line: the expert activations counted"},
             "workers",
             {"out", "The plan file to write"}},
            kEngineFlags)},
      {"make-model",
       "--shape NAME --out DIR [--dtype bf16|fp8 [--fp8-scaling channel|block]] [--skew zipf:S] "
       "[--layers L]",
       "a random-weight model in the Hugging Face format",
       {"shape",
        {"out", "The model directory to write"},
        "dtype",
        "fp8-scaling",
        "skew",
        {"seed", "Seed of the random weights; 0 when not given"},
        "layers",
        {"force", "Write into a non-empty --out"},
        "threads",
        "log-level"}},
      {"quantize",
       "--model DIR --out DIR [--fp8-scaling channel|block] [--calibration FILE.jsonl "
       "--samples 512 [--kv-scales]] [--force]",
       "FP8 E4M3 weights, per-channel in the compressed-tensors layout or per 128x128 block in "
       "DeepSeek's (a block-scaled FP8 model is requantized per channel, what CUDA loads); with "
       "--calibration, the perplexity of both models on the prompts (and with "
       "--kv-scales, FP8 KV-cache scales)",
       With({"model",
             {"out", "The directory of the quantized model"},
             "fp8-scaling",
             {"calibration",
              "JSON Lines of prompts, {\"text\": ...} or {\"token_ids\": [...]} "
              "a line: both models' perplexities on them are compared"},
             "samples",
             "kv-scales",
             {"force", "Replace a non-empty --out"}},
            kEngineFlags)},
  };
  return *commands;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::vector<std::string> FlagNames(const Command& c) {
  std::vector<std::string> names;
  for (const CommandFlag& flag : c.flags) names.push_back(flag.name);
  return names;
}

std::string Usage() {
  std::string out =
      "strata <command> [flags]   (`strata <command> --help`: its flags)\ncommands:\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(&out, "  ", absl::StrFormat("%-10s", c.name), " ", c.synopsis, "\n",
                    std::string(13, ' '), c.summary, "\n");
  }
  return out;
}

std::string CommandHelp(const Command& c) {
  std::vector<strata::FlagDoc> docs;
  for (const CommandFlag& flag : c.flags) {
    for (strata::FlagDoc& doc : strata::DocsOfFlags({flag.name})) {
      if (!flag.help.empty()) doc.help = flag.help;
      docs.push_back(std::move(doc));
    }
  }
  return absl::StrCat("strata ", c.name, " ", c.synopsis, "\n", c.summary, "\nflags:\n",
                      strata::FormatFlagDocs(docs));
}

absl::StatusOr<strata::LocalEngineOptions> EngineOptionsFromFlags() {
  strata::LocalEngineOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  if (options.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  options.num_threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(options.kv, strata::KvCacheOptionsFromFlags());
  options.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk);
  options.gate_temperature = static_cast<float>(strata::GateTemperatureFromFlags());
  options.device = absl::GetFlag(FLAGS_device);
  options.expert_weights = absl::GetFlag(FLAGS_weights);
  return options;
}

// The sampling flags as a request: --seed only when given (else each run draws its own).
absl::StatusOr<strata::SamplingRequest> SamplingFromFlags() {
  strata::SamplingRequest s;
  s.temperature = absl::GetFlag(FLAGS_temperature);
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = absl::GetFlag(FLAGS_top_p);
  s.seed = absl::GetFlag(FLAGS_seed);
  s.min_p = absl::GetFlag(FLAGS_min_p);
  s.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  s.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  s.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  for (absl::string_view entry :
       absl::StrSplit(absl::GetFlag(FLAGS_logit_bias), ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    int64_t id = 0;
    double bias = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id) ||
        !absl::SimpleAtod(parts[1], &bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit_bias takes ID:BIAS pairs, not \"", entry, "\""));
    }
    s.logit_bias.emplace_back(id, bias);
  }
  s.min_tokens = absl::GetFlag(FLAGS_min_tokens);
  if (!absl::GetFlag(FLAGS_stop_token_ids).empty()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     strata::ParseIdList(absl::GetFlag(FLAGS_stop_token_ids)));
    s.stop_token_ids.assign(ids.begin(), ids.end());
  }
  return s;
}

absl::Status RemoteGenerate(const std::vector<std::string>& stops) {
  strata::RemoteGenerateOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.stream_text = absl::GetFlag(FLAGS_stream);
  strata::v1::GenerateRequest& r = options.request;
  r.set_prompt(absl::GetFlag(FLAGS_prompt));
  if (!absl::GetFlag(FLAGS_ids).empty()) {
    auto ids = strata::ParseIdList(absl::GetFlag(FLAGS_ids));
    if (!ids.ok()) return ids.status();
    for (int32_t id : *ids) r.add_prompt_token_ids(static_cast<uint32_t>(id));
  }
  r.set_max_new_tokens(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_max_new_tokens))));
  // Checked here by the server's rules, sent as given: the server applies them again.
  ASSIGN_OR_RETURN(const strata::SamplingRequest s, SamplingFromFlags());
  RETURN_IF_ERROR(strata::CheckSampling(s, 0.0));
  strata::v1::SamplingParams& sampling = *r.mutable_sampling();
  sampling.set_temperature(static_cast<float>(*s.temperature));
  sampling.set_top_k(static_cast<uint32_t>(std::max<int64_t>(0, *s.top_k)));
  sampling.set_top_p(static_cast<float>(*s.top_p));
  if (s.seed) sampling.set_seed(*s.seed);
  if (s.min_p) sampling.set_min_p(static_cast<float>(*s.min_p));
  if (s.repetition_penalty)
    sampling.set_repetition_penalty(static_cast<float>(*s.repetition_penalty));
  if (s.presence_penalty) sampling.set_presence_penalty(static_cast<float>(*s.presence_penalty));
  if (s.frequency_penalty) sampling.set_frequency_penalty(static_cast<float>(*s.frequency_penalty));
  for (const auto& [id, bias] : s.logit_bias) {
    (*sampling.mutable_logit_bias())[static_cast<uint32_t>(id)] = static_cast<float>(bias);
  }
  for (int64_t id : s.stop_token_ids) r.add_stop_token_ids(static_cast<uint32_t>(id));
  r.set_min_tokens(static_cast<uint32_t>(*s.min_tokens));
  for (const std::string& stop : stops) r.add_stop(stop);
  r.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  return strata::RunRemoteGenerate(options, std::cout, std::cerr);
}

absl::Status Bench() {
  strata::BenchOptions o;
  o.server = absl::GetFlag(FLAGS_server);
  // The server's counters come from Admin; a bench of a cluster it cannot reach goes without.
  absl::StatusOr<strata::AdminTarget> admin = strata::ResolveAdmin(
      o.server, absl::GetFlag(FLAGS_admin), absl::GetFlag(FLAGS_cluster_token_file));
  if (admin.ok()) {
    o.admin = *std::move(admin);
  } else {
    std::cerr << "bench: no server counters (" << admin.status().message() << ")\n";
  }
  o.input_len = absl::GetFlag(FLAGS_input_len);
  o.output_len = absl::GetFlag(FLAGS_output_len);
  o.runs = absl::GetFlag(FLAGS_runs);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  auto concurrency = strata::ParseConcurrency(absl::GetFlag(FLAGS_concurrency));
  if (!concurrency.ok()) return concurrency.status();
  o.concurrency = *concurrency;
  o.seed = absl::GetFlag(FLAGS_seed).value_or(0);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  o.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  o.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p).value_or(0.0));
  o.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty).value_or(1.0));
  o.shared_prefix = absl::GetFlag(FLAGS_shared_prefix);
  o.out = absl::GetFlag(FLAGS_out);
  o.model_name = absl::GetFlag(FLAGS_model_name);
  std::string model = absl::GetFlag(FLAGS_model);  // its directory name, unless --model-name
  while (model.size() > 1 && model.back() == '/') model.pop_back();
  if (o.model_name.empty()) o.model_name = model.substr(model.rfind('/') + 1);
  o.weights = absl::GetFlag(FLAGS_weights);
  o.mode = absl::GetFlag(FLAGS_mode);
  o.gpus = absl::GetFlag(FLAGS_gpus);
  o.machine = absl::GetFlag(FLAGS_machine);
  o.note = absl::GetFlag(FLAGS_note);
  o.commit = absl::GetFlag(FLAGS_commit);
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  o.interfering_prompt_len = absl::GetFlag(FLAGS_interfering_prompt_len);
  o.interfering_after = absl::Seconds(absl::GetFlag(FLAGS_interfering_after_s));
  if (o.interfering_prompt_len < 0 || o.interfering_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--interfering-prompt-len and --interfering-after-s must not be negative");
  }
  o.command = strata::CurrentCommandLine();
  if (const std::string prompts = absl::GetFlag(FLAGS_prompts); !prompts.empty()) {
    if (model.empty()) return absl::InvalidArgumentError("--prompts needs --model (its tokenizer)");
    ASSIGN_OR_RETURN(std::unique_ptr<strata::Tokenizer> tokenizer,
                     strata::Tokenizer::FromModelDir(model));
    ASSIGN_OR_RETURN(std::vector<strata::CalibrationPrompt> texts,
                     strata::ReadCalibration(prompts, tokenizer.get()));
    for (strata::CalibrationPrompt& t : texts) o.prompts.push_back(std::move(t.ids));
  }
  return strata::RunBenchCommand(o, std::cout, std::cerr);
}

// `strata up`: its flags come from the config keys' table (cluster_config.h), not from the flags
// above: --config FILE first, then every flag overrides the file.
absl::Status Up(const std::vector<std::string>& args, const std::string& self) {
  strata::SupervisorOptions options;
  strata::ClusterConfig& c = options.cluster;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::cout
          << "strata up [--config FILE] [flags]: starts strata-expert-store, strata-router and "
             "the workers; prints READY <host>:<port>\n"
             "  --config FILE  YAML or JSON with the keys below; flags override it\n"
          << strata::ClusterFlagsHelp();
      return absl::OkStatus();
    }
    if (args[i] == "--config" && i + 1 < args.size()) {
      RETURN_IF_ERROR(strata::LoadClusterConfig(args[++i], c));
    } else if (args[i].rfind("--config=", 0) == 0) {
      RETURN_IF_ERROR(strata::LoadClusterConfig(args[i].substr(9), c));
    } else {
      rest.push_back(args[i]);
    }
  }
  RETURN_IF_ERROR(strata::ApplyClusterFlags(rest, c));
  if (c.model.empty())
    return absl::InvalidArgumentError("--model (or model: in --config) is required");
  // One set of rules for the file's values and the flags' (a bad value stops here, not in a
  // child process).
  RETURN_IF_ERROR(strata::CheckClusterConfig(c));
  if (!strata::SetLogLevel(c.log_level)) return absl::InvalidArgumentError("bad --log-level");
  options.bin_dir = self.substr(0, self.rfind('/'));
  return strata::RunCluster(options, std::cout);
}

absl::Status Run(const std::string& command, const std::vector<std::string>& stops) {
  if (command == "stats" || command == "hot-ratio" || command == "kv-resize") {
    ASSIGN_OR_RETURN(const strata::AdminTarget admin,
                     strata::ResolveAdmin(absl::GetFlag(FLAGS_server), absl::GetFlag(FLAGS_admin),
                                          absl::GetFlag(FLAGS_cluster_token_file)));
    if (command == "stats") return strata::RunStats(admin, std::cout);
    if (command == "hot-ratio") {
      return strata::RunSetHotRatio(admin, absl::GetFlag(FLAGS_hot_ratio), std::cout);
    }
    return strata::RunResizeKvCache(admin, absl::GetFlag(FLAGS_kv_blocks), std::cout);
  }
  if (command == "bench") return Bench();
  if (command == "eval") {
    strata::EvalOptions options;
    auto engine = EngineOptionsFromFlags();
    if (!engine.ok()) return engine.status();
    options.engine = *engine;
    options.server = absl::GetFlag(FLAGS_server);
    options.text_file = absl::GetFlag(FLAGS_text);
    options.window = absl::GetFlag(FLAGS_window);
    options.expert_stats = absl::GetFlag(FLAGS_expert_stats);
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_hit_rates), ',', absl::SkipEmpty())) {
      double share = 0;
      if (!absl::SimpleAtod(part, &share) || !(share > 0 && share <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--hit-rates: \"", part, "\" is not a share in (0, 1]"));
      }
      options.hit_rate_shares.push_back(share);
    }
    if (options.text_file.empty()) return absl::InvalidArgumentError("--text is required");
    return strata::RunEvalCommand(options, std::cout);
  }
  if (command == "plan") {
    strata::PlanOptions options;
    auto engine = EngineOptionsFromFlags();
    if (!engine.ok()) return engine.status();
    options.engine = *engine;
    options.calibration_file = absl::GetFlag(FLAGS_calibration);
    options.workers = absl::GetFlag(FLAGS_workers);
    options.out = absl::GetFlag(FLAGS_out);
    return strata::RunPlanCommand(options, std::cout);
  }
  if (command == "quantize") {
    strata::QuantizeCommandOptions options;
    options.quantize.model_dir = absl::GetFlag(FLAGS_model);
    options.quantize.out_dir = absl::GetFlag(FLAGS_out);
    options.quantize.force = absl::GetFlag(FLAGS_force);
    ASSIGN_OR_RETURN(options.quantize.scaling,
                     strata::ParseFp8Scaling(absl::GetFlag(FLAGS_fp8_scaling)));
    options.quantize.num_threads = absl::GetFlag(FLAGS_threads);
    options.quantize.progress = true;
    options.calibration_file = absl::GetFlag(FLAGS_calibration);
    options.samples = absl::GetFlag(FLAGS_samples);
    options.kv_scales = absl::GetFlag(FLAGS_kv_scales);
    auto engine = EngineOptionsFromFlags();
    if (!engine.ok()) return engine.status();
    options.engine = *engine;
    return strata::RunQuantizeCommand(options, std::cout);
  }
  if (command == "make-model") {
    strata::MakeModelOptions options;
    options.shape = absl::GetFlag(FLAGS_shape);
    options.out_dir = absl::GetFlag(FLAGS_out);
    options.dtype = absl::GetFlag(FLAGS_dtype);
    ASSIGN_OR_RETURN(options.fp8_scaling,
                     strata::ParseFp8Scaling(absl::GetFlag(FLAGS_fp8_scaling)));
    options.skew = absl::GetFlag(FLAGS_skew);
    options.seed = absl::GetFlag(FLAGS_seed).value_or(0);
    options.layers = absl::GetFlag(FLAGS_layers);
    options.force = absl::GetFlag(FLAGS_force);
    options.num_threads = absl::GetFlag(FLAGS_threads);
    options.progress = true;
    auto result = strata::MakeModel(options);
    if (!result.ok()) return result.status();
    std::cout << absl::StrFormat(
        "{\"params\": %d, \"bytes\": %d, \"shards\": %d, \"seconds\": %.3f}\n", result->params,
        result->bytes, result->shards, result->seconds);
    return absl::OkStatus();
  }
  if (command == "generate" && !absl::GetFlag(FLAGS_server).empty()) return RemoteGenerate(stops);
  if (!stops.empty()) return absl::InvalidArgumentError("--stop needs --server");
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return engine.status();
  std::vector<int32_t> ids;
  if (command == "logits" || !absl::GetFlag(FLAGS_ids).empty()) {
    auto parsed = strata::ParseIdList(absl::GetFlag(FLAGS_ids));
    if (!parsed.ok()) return parsed.status();
    ids = *std::move(parsed);
  }
  if (command == "logits") return strata::RunLogitsCommand({*engine, ids}, std::cout);
  strata::GenerateCommandOptions options;
  options.engine = *engine;
  options.ids = ids;
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.generate.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.generate.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  ASSIGN_OR_RETURN(const strata::SamplingRequest sampling, SamplingFromFlags());
  ASSIGN_OR_RETURN(options.generate.sampling, strata::NormalizeSampling(sampling, INT64_MAX, 0.0));
  return strata::RunGenerateCommand(options, std::cout);
}

// The path of this executable, to find the server binaries beside it.
std::string SelfPath(const char* argv0) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = Usage();
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] == "--help" || args[1] == "-h" || args[1] == "help") {
    std::cout << usage;
    return args.size() < 2 ? 2 : 0;
  }
  const Command* command = FindCommand(args[1]);
  if (command == nullptr) {
    std::cerr << "strata: unknown command \"" << args[1] << "\"\n" << usage;
    return 2;
  }
  // `strata up` parses its own flags, from the config keys' table.
  if (args[1] == "up") {
    strata::SetProgramName("strata up");
    if (const auto tunables = strata::LoadAndLogTunables(); !tunables.ok()) {
      std::cerr << "strata up: " << tunables.status().message() << "\n";
      return 2;
    }
    absl::Status status =
        Up(std::vector<std::string>(args.begin() + 2, args.end()), SelfPath(argv[0]));
    if (!status.ok()) {
      std::cerr << "strata up: " << status.message() << "\n";
      return 1;
    }
    return 0;
  }
  const std::string program = absl::StrCat("strata ", args[1]);
  if (strata::AsksForHelp(args)) {
    std::cout << CommandHelp(*command);
    return 0;
  }
  auto stops = strata::TakeRepeatedFlag(args, "stop");
  absl::Status known = stops.status();
  if (known.ok()) known = strata::CheckFlagsKnown(args, FlagNames(*command), program);
  if (!known.ok()) {
    std::cerr << program << ": " << known.message() << "\n";
    return 2;
  }
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  strata::DashedFlags flags(static_cast<int>(pointers.size()), pointers.data());
  std::vector<char*> positional = absl::ParseCommandLine(flags.argc(), flags.argv());
  if (positional.size() != 2) {
    std::cerr << program << ": unexpected argument \"" << positional[2] << "\"\n";
    return 2;
  }
  strata::SetProgramName(program);
  if (!strata::SetLogLevel(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << program << ": --log-level must be debug, info, warning or error\n";
    return 2;
  }
  if (const auto tunables = strata::LoadAndLogTunables(); !tunables.ok()) {
    std::cerr << program << ": " << tunables.status().message() << "\n";
    return 2;
  }
  absl::Status status = Run(args[1], *stops);
  if (!status.ok()) {
    std::cerr << program << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}
