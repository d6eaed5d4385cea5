#include "common/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model/config_reader.h"
#include "common/model/deepseek_config.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using config_internal::ConfigReader;
using config_internal::Json;
using config_internal::kMaxExperts;
using config_internal::kMaxHeadDim;
using config_internal::kMaxHeads;
using config_internal::kMaxHidden;
using config_internal::kMaxIntermediate;
using config_internal::kMaxLayers;
using config_internal::kMaxPositions;
using config_internal::kMaxTokenId;
using config_internal::kMaxTopK;
using config_internal::kMaxVocab;

absl::StatusOr<RopeConfig> ParseRope(const ConfigReader& config, absl::string_view file_name) {
  RopeConfig rope;
  // transformers 5 writes "rope_parameters" (theta inside); older configs write "rope_theta"
  // at the top and an optional "rope_scaling".
  const Json* params = config.Find("rope_parameters");
  if (params == nullptr) params = config.Find("rope_scaling");
  if (params != nullptr && !params->is_object()) {
    return config.Error("rope_parameters", "must be an object");
  }
  const Json empty = Json::object();
  const ConfigReader rope_reader(params ? *params : empty, file_name);
  ASSIGN_OR_RETURN(rope.theta, config.NumberAbove("rope_theta", 0.0, 10000.0));
  if (rope_reader.Has("rope_theta")) {
    ASSIGN_OR_RETURN(rope.theta, rope_reader.NumberAbove("rope_theta", 0.0));
  }
  std::string type = "default";
  if (rope_reader.Has("rope_type")) {
    ASSIGN_OR_RETURN(type, rope_reader.String("rope_type"));
  } else if (rope_reader.Has("type")) {
    ASSIGN_OR_RETURN(type, rope_reader.String("type"));
  }
  if (type == "default") return rope;
  if (type != "yarn") {
    return config.Error("rope_type",
                        absl::StrCat("\"", type, "\" is not supported (default, yarn)"));
  }
  rope.type = RopeConfig::Type::kYarn;
  ASSIGN_OR_RETURN(rope.factor, rope_reader.NumberAbove("factor", 0.0));
  ASSIGN_OR_RETURN(double max_pos, config.Number("max_position_embeddings"));
  ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                   rope_reader.Number("original_max_position_embeddings", max_pos));
  ASSIGN_OR_RETURN(rope.beta_fast, rope_reader.Number("beta_fast", 32.0));
  ASSIGN_OR_RETURN(rope.beta_slow, rope_reader.Number("beta_slow", 1.0));
  ASSIGN_OR_RETURN(rope.truncate, rope_reader.Bool("truncate", true));
  if (rope_reader.Has("attention_factor")) {
    ASSIGN_OR_RETURN(rope.attention_factor, rope_reader.Number("attention_factor"));
  }
  if (rope_reader.Has("mscale")) {
    ASSIGN_OR_RETURN(rope.mscale, rope_reader.Number("mscale"));
  }
  if (rope_reader.Has("mscale_all_dim")) {
    ASSIGN_OR_RETURN(rope.mscale_all_dim, rope_reader.Number("mscale_all_dim"));
  }
  if (rope.factor <= 0 || rope.original_max_position_embeddings <= 0) {
    return config.Error("rope_parameters", "needs a positive factor and original length");
  }
  return rope;
}

// How many dimensions of each head RoPE turns: transformers' int(head_dim * factor), the factor
// read from rope_parameters (or rope_scaling), else the top level (older GLM configs), else the
// architecture's default. Only GLM-4.5 applies a partial factor; elsewhere it must be 1.
absl::Status ParseRotaryDim(const ConfigReader& config, absl::string_view file_name,
                            ModelConfig& model) {
  const bool partial_allowed = model.arch == Architecture::kGlm4Moe;
  double factor = partial_allowed ? 0.5 : 1.0;
  const Json* params = config.Find("rope_parameters");
  if (params == nullptr) params = config.Find("rope_scaling");
  const Json empty = Json::object();
  const ConfigReader rope_reader(params != nullptr && params->is_object() ? *params : empty,
                                 file_name);
  if (rope_reader.Has("partial_rotary_factor")) {
    ASSIGN_OR_RETURN(factor, rope_reader.NumberAbove("partial_rotary_factor", 0.0));
  } else if (config.Has("partial_rotary_factor")) {
    ASSIGN_OR_RETURN(factor, config.NumberAbove("partial_rotary_factor", 0.0));
  }
  if (factor > 1.0) return config.Error("partial_rotary_factor", "must be at most 1");
  if (factor != 1.0 && !partial_allowed) {
    return config.Error(
        "partial_rotary_factor",
        absl::StrCat("other than 1.0 is not supported for ", ArchitectureName(model.arch)));
  }
  model.rotary_dim = static_cast<int>(model.head_dim * factor);
  if (model.rotary_dim < 2 || model.rotary_dim % 2 != 0) {
    return config.Error("partial_rotary_factor",
                        absl::StrCat("gives ", model.rotary_dim, " rotary dimensions of ",
                                     model.head_dim, "; RoPE needs a positive even count"));
  }
  return absl::OkStatus();
}

// quantization_config with quant_method "fp8" (DeepSeek-V3's, transformers' fine-grained FP8):
// E4M3 weights scaled per weight_block_size block. Other methods (compressed-tensors' per-row
// scales) describe nothing the binder needs and are left to it.
absl::Status ParseQuantization(const ConfigReader& config, absl::string_view file_name,
                               ModelConfig& model) {
  const Json* quantization = config.Find("quantization_config");
  if (quantization == nullptr) return absl::OkStatus();
  if (!quantization->is_object()) return config.Error("quantization_config", "must be an object");
  const ConfigReader q(*quantization, file_name);
  if (!q.Has("quant_method")) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string method, q.String("quant_method"));
  if (method != "fp8") return absl::OkStatus();
  auto error = [&](absl::string_view key, absl::string_view what) {
    return config.Error(absl::StrCat("quantization_config.", key), what);
  };
  if (q.Has("fmt")) {
    ASSIGN_OR_RETURN(std::string fmt, q.String("fmt"));
    if (fmt != "e4m3") return error("fmt", absl::StrCat("\"", fmt, "\" is not supported (e4m3)"));
  }
  if (q.Has("activation_scheme")) {
    // Activations stay float32 on the CPU (bf16 on a GPU) either way; static schemes come with
    // input scales this loader does not read.
    ASSIGN_OR_RETURN(std::string scheme, q.String("activation_scheme"));
    if (scheme != "dynamic") {
      return error("activation_scheme",
                   absl::StrCat("\"", scheme, "\" is not supported (dynamic)"));
    }
  }
  const Json* block = q.Find("weight_block_size");
  if (block == nullptr) {
    return error("weight_block_size",
                 "is missing: fp8 weights are supported with block scales (e.g. [128, 128])");
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() < 1 ||
      (*block)[1].get<int64_t>() < 1 || (*block)[0].get<int64_t>() > kMaxHidden ||
      (*block)[1].get<int64_t>() > kMaxHidden) {
    return error("weight_block_size", "must be two positive integers, [rows, columns]");
  }
  model.fp8_block_rows = static_cast<int>((*block)[0].get<int64_t>());
  model.fp8_block_cols = static_cast<int>((*block)[1].get<int64_t>());
  return absl::OkStatus();
}

// Layers that run a dense MLP instead of experts (Qwen2-MoE and Qwen3-MoE rule).
absl::Status ParseSparseLayers(const ConfigReader& config, ModelConfig& model) {
  ASSIGN_OR_RETURN(int64_t step, config.Int("decoder_sparse_step", 1, 1, kMaxLayers));
  std::vector<bool> mlp_only(model.num_layers, false);
  if (const Json* list = config.Find("mlp_only_layers")) {
    if (!list->is_array()) return config.Error("mlp_only_layers", "must be a list of layer ids");
    for (const Json& v : *list) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= model.num_layers) {
        return config.Error("mlp_only_layers", "holds an id outside [0, num_hidden_layers)");
      }
      mlp_only[v.get<int64_t>()] = true;
    }
  }
  model.layer_is_moe.assign(model.num_layers, false);
  for (int i = 0; i < model.num_layers; ++i) {
    model.layer_is_moe[i] = !mlp_only[i] && model.num_experts > 0 && (i + 1) % step == 0;
  }
  return absl::OkStatus();
}

absl::Status ParseSlidingWindow(const ConfigReader& config, ModelConfig& model) {
  model.sliding_window.assign(model.num_layers, 0);
  int64_t window = 0;
  if (config.Has("sliding_window")) {
    ASSIGN_OR_RETURN(window, config.Int("sliding_window", {}, 0, kMaxPositions));
  }
  switch (model.arch) {
    case Architecture::kMixtral:
      model.sliding_window.assign(model.num_layers, static_cast<int>(window));
      return absl::OkStatus();
    case Architecture::kQwen3Moe:
    case Architecture::kQwen2Moe:
    case Architecture::kGlm4Moe:
    case Architecture::kDeepseekV3: {
      ASSIGN_OR_RETURN(bool use, config.Bool("use_sliding_window", false));
      if (use && window > 0) return config.Error("use_sliding_window", "true is not supported");
      return absl::OkStatus();
    }
    case Architecture::kGptOss: {
      const Json* types = config.Find("layer_types");
      if (types == nullptr) {
        // gpt-oss alternates sliding and full attention, starting with sliding.
        for (int i = 0; i < model.num_layers; ++i) {
          model.sliding_window[i] = i % 2 == 0 ? static_cast<int>(window) : 0;
        }
        return absl::OkStatus();
      }
      if (!types->is_array() || static_cast<int>(types->size()) != model.num_layers) {
        return config.Error("layer_types", "must list one type per layer");
      }
      for (int i = 0; i < model.num_layers; ++i) {
        const Json& t = (*types)[i];
        if (t == "sliding_attention") {
          if (window <= 0) return config.Error("sliding_window", "must be set for sliding layers");
          model.sliding_window[i] = static_cast<int>(window);
        } else if (t != "full_attention") {
          return config.Error("layer_types", "holds a type other than sliding/full_attention");
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status ParseEosIds(const Json* eos, std::vector<int>& out, absl::string_view file_name) {
  if (eos == nullptr) return absl::OkStatus();
  out.clear();
  auto add = [&](const Json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_name,
                       ": \"eos_token_id\" must be a token id (an integer in [0, 2^31)) or a list "
                       "of them"));
    }
    out.push_back(static_cast<int>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (eos->is_array()) {
    for (const Json& v : *eos) RETURN_IF_ERROR(add(v));
    return absl::OkStatus();
  }
  return add(*eos);
}

}  // namespace

absl::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kMixtral:
      return "mixtral";
    case Architecture::kQwen2Moe:
      return "qwen2_moe";
    case Architecture::kGptOss:
      return "gpt_oss";
    case Architecture::kGlm4Moe:
      return "glm4_moe";
    case Architecture::kDeepseekV3:
      return "deepseek_v3";
  }
  return "?";
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view file_name) {
  const Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": not a JSON object"));
  }
  const ConfigReader config(json, file_name);
  ModelConfig model;
  ASSIGN_OR_RETURN(std::string model_type, config.String("model_type"));
  if (model_type == "qwen3_moe") {
    model.arch = Architecture::kQwen3Moe;
  } else if (model_type == "mixtral") {
    model.arch = Architecture::kMixtral;
  } else if (model_type == "qwen2_moe") {
    model.arch = Architecture::kQwen2Moe;
  } else if (model_type == "gpt_oss") {
    model.arch = Architecture::kGptOss;
  } else if (model_type == "glm4_moe") {
    model.arch = Architecture::kGlm4Moe;
  } else if (model_type == "deepseek_v3" || model_type == "kimi_k2") {
    model.arch = Architecture::kDeepseekV3;
  } else {
    return config.Error("model_type", absl::StrCat("\"", model_type,
                                                   "\" is not a supported architecture "
                                                   "(qwen3_moe, mixtral, qwen2_moe, gpt_oss, "
                                                   "glm4_moe, deepseek_v3)"));
  }

  ASSIGN_OR_RETURN(model.vocab_size, config.Int("vocab_size", {}, 1, kMaxVocab));
  ASSIGN_OR_RETURN(model.hidden_size, config.Int("hidden_size", {}, 1, kMaxHidden));
  ASSIGN_OR_RETURN(int64_t layers, config.Int("num_hidden_layers", {}, 1, kMaxLayers));
  ASSIGN_OR_RETURN(int64_t heads, config.Int("num_attention_heads", {}, 1, kMaxHeads));
  ASSIGN_OR_RETURN(int64_t kv_heads, config.Int("num_key_value_heads", heads, 1, heads));
  model.num_layers = static_cast<int>(layers);
  model.num_heads = static_cast<int>(heads);
  model.num_kv_heads = static_cast<int>(kv_heads);
  if (model.num_heads % model.num_kv_heads != 0) {
    return config.Error("num_key_value_heads", "must divide num_attention_heads");
  }
  if (model.arch == Architecture::kGlm4Moe && !config.Has("head_dim")) {
    // GLM heads are not hidden/heads wide, and transformers' default has changed over time.
    return config.Error("head_dim", "is missing");
  }
  if (model.arch == Architecture::kDeepseekV3) {
    // config.json's head_dim is the RoPE width there; the MLA dimensions set the heads.
    RETURN_IF_ERROR(config_internal::ParseDeepseekV3Attention(config, model));
  } else if (config.Has("head_dim")) {
    ASSIGN_OR_RETURN(int64_t head_dim, config.Int("head_dim", {}, 1, kMaxHeadDim));
    model.head_dim = static_cast<int>(head_dim);
  } else {
    if (model.hidden_size % heads != 0) {
      return config.Error("num_attention_heads", "must divide hidden_size when head_dim is unset");
    }
    if (model.hidden_size / heads > kMaxHeadDim) {
      return config.Error("num_attention_heads",
                          absl::StrCat("gives heads of ", model.hidden_size / heads,
                                       " dimensions; at most ", kMaxHeadDim, " are supported"));
    }
    model.head_dim = static_cast<int>(model.hidden_size / heads);
  }
  if (model.head_dim % 2 != 0) return config.Error("head_dim", "must be even for RoPE");
  ASSIGN_OR_RETURN(model.rms_norm_eps, config.NumberAbove("rms_norm_eps", 0.0, 1e-6, 1.0));
  ASSIGN_OR_RETURN(model.max_position_embeddings,
                   config.Int("max_position_embeddings", {}, 1, kMaxPositions));
  ASSIGN_OR_RETURN(model.rope, ParseRope(config, file_name));
  if (model.mla()) {
    config_internal::SetDeepseekSoftmaxScale(model);
  } else {
    RETURN_IF_ERROR(ParseRotaryDim(config, file_name, model));
  }
  ASSIGN_OR_RETURN(model.tie_word_embeddings, config.Bool("tie_word_embeddings", false));
  RETURN_IF_ERROR(ParseEosIds(config.Find("eos_token_id"), model.eos_token_ids, file_name));
  if (config.Has("hidden_act")) {
    ASSIGN_OR_RETURN(std::string act, config.String("hidden_act"));
    if (act != "silu") return config.Error("hidden_act", "other than \"silu\" is not supported");
  }

  const char* experts_key = config.Has("num_local_experts") ? "num_local_experts" : "num_experts";
  switch (model.arch) {
    case Architecture::kQwen3Moe:
    case Architecture::kQwen2Moe: {
      ASSIGN_OR_RETURN(int64_t experts, config.Int(experts_key, {}, 1, kMaxExperts));
      model.num_experts = static_cast<int>(experts);
      ASSIGN_OR_RETURN(model.moe_intermediate_size,
                       config.Int("moe_intermediate_size", {}, 1, kMaxIntermediate));
      ASSIGN_OR_RETURN(model.dense_intermediate_size,
                       config.Int("intermediate_size", {}, 1, kMaxIntermediate));
      ASSIGN_OR_RETURN(model.norm_topk_prob, config.Bool("norm_topk_prob", false));
      RETURN_IF_ERROR(ParseSparseLayers(config, model));
      if (model.arch == Architecture::kQwen3Moe) {
        model.qk_norm = true;
        ASSIGN_OR_RETURN(model.qkv_bias, config.Bool("attention_bias", false));
        model.o_bias = model.qkv_bias;
      } else {
        ASSIGN_OR_RETURN(model.qkv_bias, config.Bool("qkv_bias", true));
        ASSIGN_OR_RETURN(model.shared_expert_intermediate_size,
                         config.Int("shared_expert_intermediate_size", 0, 0, kMaxIntermediate));
        model.shared_expert_gate = model.shared_expert_intermediate_size > 0;
      }
      break;
    }
    case Architecture::kMixtral: {
      ASSIGN_OR_RETURN(int64_t experts, config.Int(experts_key, {}, 1, kMaxExperts));
      model.num_experts = static_cast<int>(experts);
      ASSIGN_OR_RETURN(model.moe_intermediate_size,
                       config.Int("intermediate_size", {}, 1, kMaxIntermediate));
      model.norm_topk_prob = true;
      model.layer_is_moe.assign(model.num_layers, true);
      break;
    }
    case Architecture::kGptOss: {
      ASSIGN_OR_RETURN(int64_t experts, config.Int(experts_key, {}, 1, kMaxExperts));
      model.num_experts = static_cast<int>(experts);
      ASSIGN_OR_RETURN(model.moe_intermediate_size,
                       config.Int("intermediate_size", {}, 1, kMaxIntermediate));
      model.gate_scoring = GateScoring::kTopKThenSoftmax;
      model.router_bias = true;
      model.expert_bias = true;
      model.attention_sinks = true;
      model.activation = ExpertActivation::kClampedSwiGlu;
      ASSIGN_OR_RETURN(double limit, config.NumberAbove("swiglu_limit", 0.0, 7.0));
      model.swiglu_limit = static_cast<float>(limit);
      ASSIGN_OR_RETURN(model.qkv_bias, config.Bool("attention_bias", true));
      model.o_bias = model.qkv_bias;
      model.layer_is_moe.assign(model.num_layers, true);
      break;
    }
    case Architecture::kGlm4Moe:
      RETURN_IF_ERROR(config_internal::ParseGlm4Moe(config, model));
      break;
    case Architecture::kDeepseekV3:
      // transformers' DeepseekV3Config defaults to three dense layers.
      RETURN_IF_ERROR(config_internal::ParseDenseThenMoe(config, 3, model));
      break;
  }
  const char* top_k_key =
      config.Has("num_experts_per_tok") ? "num_experts_per_tok" : "experts_per_token";
  ASSIGN_OR_RETURN(int64_t top_k, config.Int(top_k_key, {}, 1, kMaxTopK));
  model.top_k = static_cast<int>(top_k);
  if (model.top_k > model.num_experts) {
    return config.Error(top_k_key, "exceeds the number of experts");
  }
  if (model.gate_scoring == GateScoring::kSigmoidGrouped &&
      model.top_k > model.top_k_groups * (model.num_experts / model.num_expert_groups)) {
    return config.Error(top_k_key, "exceeds the experts of the topk_group groups kept");
  }
  RETURN_IF_ERROR(ParseSlidingWindow(config, model));
  RETURN_IF_ERROR(ParseQuantization(config, file_name, model));
  return model;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(model_dir) / "config.json").string();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, path));
  const std::string generation_path = (fs::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (fs::exists(generation_path, ec)) {
    ASSIGN_OR_RETURN(std::string generation_text, ReadFileToString(generation_path));
    const Json generation = Json::parse(generation_text, nullptr, false);
    if (generation.is_discarded() || !generation.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(generation_path, ": not a JSON object"));
    }
    auto it = generation.find("eos_token_id");
    if (it != generation.end() && !it->is_null()) {
      RETURN_IF_ERROR(ParseEosIds(&*it, config.eos_token_ids, generation_path));
    }
  }
  return config;
}

double LinearFlopsPerToken(const ModelConfig& c) {
  const double hidden = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_heads) * c.head_dim;
  const double kv = static_cast<double>(c.num_kv_heads) * c.head_dim;
  double attention = hidden * (2 * q + 2 * kv);
  if (c.mla()) {
    // The absorbed form: q (through the q latent when there is one), the kv latent and k_pe,
    // each head's q_nope into the latent and its latent output to v, then o.
    const double heads = c.num_heads;
    const double q_in = c.q_lora_rank > 0 ? hidden * c.q_lora_rank + c.q_lora_rank * q : hidden * q;
    attention = q_in + hidden * c.KvHeadDim() +
                heads * c.kv_lora_rank * (c.qk_nope_head_dim + c.v_head_dim) +
                heads * c.v_head_dim * hidden;
  }
  double per_token = 0.0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    per_token += attention;
    const bool moe =
        layer < static_cast<int>(c.layer_is_moe.size()) ? c.layer_is_moe[layer] : c.num_experts > 0;
    if (moe) {
      per_token +=
          hidden * c.num_experts + 3.0 * hidden *
                                       (static_cast<double>(c.top_k) * c.moe_intermediate_size +
                                        static_cast<double>(c.shared_expert_intermediate_size));
    } else {
      per_token += 3.0 * hidden * static_cast<double>(c.dense_intermediate_size);
    }
  }
  return 2.0 * per_token;
}

double AttentionFlopsPerPair(const ModelConfig& c) {
  if (c.mla()) {
    // Scores over [latent; k_pe], values over the latent, per head.
    return 2.0 * c.num_layers * static_cast<double>(c.num_heads) * (c.KvHeadDim() + c.kv_lora_rank);
  }
  return 4.0 * c.num_layers * static_cast<double>(c.num_heads) * c.head_dim;
}

}  // namespace strata
