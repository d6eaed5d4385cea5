#include "tools/strata/quantize_command.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_writer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/strata/eval_command.h"
#include "tools/strata/plan_command.h"

namespace strata {
namespace {

// The summed negative log-likelihood of `prompts` under the model in `dir`.
absl::StatusOr<double> PromptsNll(const std::string& dir,
                                  const std::vector<CalibrationPrompt>& prompts,
                                  LocalEngineOptions engine_options, int64_t* tokens) {
  engine_options.model_dir = dir;
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(engine_options));
  const int64_t window = engine->max_sequence_tokens();
  double nll = 0.0;
  *tokens = 0;
  for (const CalibrationPrompt& prompt : prompts) {
    const absl::Span<const int32_t> ids(prompt.ids);
    for (size_t start = 0; start < ids.size(); start += window) {
      const absl::Span<const int32_t> part = ids.subspan(start, window);
      if (part.size() < 2) continue;
      ASSIGN_OR_RETURN(Tensor logits, engine->Logits(part));
      nll += WindowNll(logits, part);
      *tokens += static_cast<int64_t>(part.size()) - 1;
    }
  }
  return nll;
}

}  // namespace

absl::StatusOr<CalibrationPerplexity> ComparePerplexity(const std::string& original_dir,
                                                        const std::string& quantized_dir,
                                                        const std::string& calibration_file,
                                                        int samples,
                                                        const LocalEngineOptions& engine) {
  if (samples < 1) return absl::InvalidArgumentError("--samples must be at least 1");
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromModelDirIfAny(original_dir));
  ASSIGN_OR_RETURN(std::vector<CalibrationPrompt> prompts,
                   ReadCalibration(calibration_file, tokenizer.get()));
  if (static_cast<int>(prompts.size()) > samples) prompts.resize(samples);
  CalibrationPerplexity result;
  result.prompts = static_cast<int>(prompts.size());
  int64_t tokens = 0, quantized_tokens = 0;
  ASSIGN_OR_RETURN(const double original_nll, PromptsNll(original_dir, prompts, engine, &tokens));
  ASSIGN_OR_RETURN(const double quantized_nll,
                   PromptsNll(quantized_dir, prompts, engine, &quantized_tokens));
  if (tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(calibration_file, ": no prompt has two tokens to score"));
  }
  result.tokens = tokens;
  result.original = std::exp(original_nll / static_cast<double>(tokens));
  result.quantized = std::exp(quantized_nll / static_cast<double>(tokens));
  return result;
}

absl::StatusOr<KvScales> CalibrateKvScales(const std::string& dir,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           LocalEngineOptions engine) {
  int64_t total = 0;
  for (const auto& p : prompts) total += static_cast<int64_t>(p.size());
  if (total == 0) return absl::InvalidArgumentError("no calibration tokens for the KV scales");
  engine.model_dir = dir;
  engine.kv.dtype = KvDtype::kFp8;
  engine.kv.fp16_above_tokens = 0;
  engine.kv.calibration_tokens = total;  // the scales come once every token has been seen
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> e, LocalEngine::Create(engine));
  if (!e->kv().calibrating()) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " has KV-cache scales already"));
  }
  // Steps of the last row's logits only: a window's keys and values are what is observed.
  const int64_t window = e->max_sequence_tokens();
  for (const auto& prompt : prompts) {
    const absl::Span<const int32_t> ids(prompt);
    for (size_t start = 0; start < ids.size(); start += window) {
      const PagedKvCache::SequenceId seq = e->AddSequence();
      const absl::Status ran = e->RunChunked(seq, ids.subspan(start, window), 0).status();
      e->ReleaseSequence(seq);
      RETURN_IF_ERROR(ran);
    }
  }
  if (e->kv().calibrating()) {
    return absl::InternalError(
        absl::StrCat("KV scales: ", e->kv().observed_tokens(), " of ", total, " tokens observed"));
  }
  const ModelConfig& c = e->config();
  const KvScales& heads = e->kv().scales();  // [layer][kv head]
  KvScales layers;
  for (int l = 0; l < c.num_layers; ++l) {
    const auto first = heads.k.begin() + int64_t{l} * c.num_kv_heads;
    layers.k.push_back(*std::max_element(first, first + c.num_kv_heads));
    const auto v = heads.v.begin() + int64_t{l} * c.num_kv_heads;
    layers.v.push_back(*std::max_element(v, v + c.num_kv_heads));
  }
  return layers;
}

absl::Status AddKvScales(const std::string& dir, const KvScales& scales) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const size_t layers = scales.k.size();
  std::vector<SafetensorsTensorHeader> headers;
  std::vector<float> values;
  for (size_t l = 0; l < layers; ++l) {
    for (const char* which : {"k_scale", "v_scale"}) {
      headers.push_back({absl::StrCat("model.layers.", l, ".self_attn.", which), DType::kF32, {}});
      values.push_back(which[0] == 'k' ? scales.k[l] : scales.v[l]);
    }
  }
  constexpr char kFile[] = "kv_scales.safetensors";
  RETURN_IF_ERROR(WriteSafetensorsFile(
      (root / kFile).string(), headers,
      [&](size_t i, uint64_t begin, uint64_t n, uint8_t* out) {
        std::memcpy(out, reinterpret_cast<const uint8_t*>(&values[i]) + begin, n);
      },
      1));
  // The index lists every tensor: made from the single file when the checkpoint had none.
  const fs::path index_path = root / "model.safetensors.index.json";
  nlohmann::ordered_json index;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    index = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.contains("weight_map")) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": no weight_map"));
    }
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file,
                     MappedFile::Open((root / "model.safetensors").string()));
    ASSIGN_OR_RETURN(const std::vector<SafetensorsEntry> entries,
                     ParseSafetensors(file->bytes(), "model.safetensors"));
    uint64_t total = 0;
    index["metadata"] = nlohmann::ordered_json::object();
    index["weight_map"] = nlohmann::ordered_json::object();
    for (const SafetensorsEntry& e : entries) {
      index["weight_map"][e.name] = "model.safetensors";
      total += e.end - e.begin;
    }
    index["metadata"]["total_size"] = total;
  }
  for (const SafetensorsTensorHeader& h : headers) index["weight_map"][h.name] = kFile;
  if (index["metadata"].contains("total_size")) {
    index["metadata"]["total_size"] =
        index["metadata"]["total_size"].get<uint64_t>() + values.size() * sizeof(float);
  }
  RETURN_IF_ERROR(WriteTextFile(index_path.string(), index.dump(2) + "\n"));

  std::ifstream config_in(root / "config.json");
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: not a JSON object"));
  }
  if (config.contains("quantization_config")) {
    config["quantization_config"]["kv_cache_scheme"] = {{"num_bits", 8},
                                                        {"type", "float"},
                                                        {"symmetric", true},
                                                        {"strategy", "tensor"},
                                                        {"dynamic", false}};
  }
  return WriteTextFile((root / "config.json").string(), config.dump(2) + "\n");
}

absl::Status RunQuantizeCommand(const QuantizeCommandOptions& options, std::ostream& out) {
  if (options.kv_scales && options.calibration_file.empty()) {
    return absl::InvalidArgumentError("--kv-scales needs --calibration prompts");
  }
  ASSIGN_OR_RETURN(const QuantizeResult result, Quantize(options.quantize));
  StatusLine(absl::StrFormat(
      "quantized %d tensors to FP8 E4M3 (per-channel scales), kept %d; %.2f MB -> %.2f MB in "
      "%d file(s), %.2f s",
      result.quantized_tensors, result.kept_tensors, result.bytes_before / 1e6,
      result.bytes_after / 1e6, result.shards, result.seconds));
  nlohmann::ordered_json json;
  json["quantized_tensors"] = result.quantized_tensors;
  json["kept_tensors"] = result.kept_tensors;
  json["bytes_before"] = result.bytes_before;
  json["bytes_after"] = result.bytes_after;
  json["shards"] = result.shards;
  json["seconds"] = result.seconds;
  if (!options.calibration_file.empty()) {
    ASSIGN_OR_RETURN(const CalibrationPerplexity ppl,
                     ComparePerplexity(options.quantize.model_dir, options.quantize.out_dir,
                                       options.calibration_file, options.samples, options.engine));
    const double delta = ppl.quantized / ppl.original - 1.0;
    StatusLine(absl::StrFormat(
        "perplexity on %d calibration prompts (%d tokens): original %.4f, quantized %.4f (%+.2f%%)",
        ppl.prompts, ppl.tokens, ppl.original, ppl.quantized, 100.0 * delta));
    json["perplexity_original"] = ppl.original;
    json["perplexity_quantized"] = ppl.quantized;
    json["perplexity_delta"] = delta;
    json["calibration_prompts"] = ppl.prompts;
    json["calibration_tokens"] = ppl.tokens;
  }
  if (options.kv_scales) {
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                     Tokenizer::FromModelDirIfAny(options.quantize.model_dir));
    ASSIGN_OR_RETURN(std::vector<CalibrationPrompt> read,
                     ReadCalibration(options.calibration_file, tokenizer.get()));
    if (static_cast<int>(read.size()) > options.samples) read.resize(options.samples);
    std::vector<std::vector<int32_t>> prompts;
    int64_t tokens = 0;
    for (CalibrationPrompt& p : read) {
      tokens += static_cast<int64_t>(p.ids.size());
      prompts.push_back(std::move(p.ids));
    }
    // On the quantized model: the keys and values it will serve with.
    ASSIGN_OR_RETURN(const KvScales scales,
                     CalibrateKvScales(options.quantize.out_dir, prompts, options.engine));
    RETURN_IF_ERROR(AddKvScales(options.quantize.out_dir, scales));
    StatusLine(absl::StrFormat("FP8 KV-cache scales of %d layers from %d tokens",
                               static_cast<int>(scales.k.size()), tokens));
    json["kv_scales_tokens"] = tokens;
  }
  out << json.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace strata
