// The architecture hyper-parameters of a Hugging Face MoE model, read from config.json.
#ifndef STRATA_COMMON_MODEL_MODEL_CONFIG_H_
#define STRATA_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class Architecture { kQwen3Moe, kMixtral, kQwen2Moe, kGptOss, kGlm4Moe, kDeepseekV3 };

absl::string_view ArchitectureName(Architecture arch);

// How gate logits become expert weights.
enum class GateScoring {
  kSoftmaxThenTopK,  // softmax over all experts, keep the top k (optionally renormalized)
  kTopKThenSoftmax,  // keep the top k logits, softmax over them (gpt-oss)
  // Sigmoid scores; experts are chosen by score + a correction bias within the best groups,
  // weighted by their unbiased scores (DeepSeek-V3 "noaux_tc", GLM-4.5). See routing.h.
  kSigmoidGrouped,
};

enum class ExpertActivation {
  kSwiGlu,         // down(silu(gate(x)) * up(x))
  kClampedSwiGlu,  // gpt-oss: clamped gate and up, gate * sigmoid(alpha * gate) * (up + 1)
};

struct RopeConfig {
  enum class Type { kDefault, kYarn };
  Type type = Type::kDefault;
  double theta = 10000.0;
  // YaRN only.
  double factor = 1.0;
  double original_max_position_embeddings = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  std::optional<double> attention_factor;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
};

struct ModelConfig {
  Architecture arch = Architecture::kQwen3Moe;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;

  // Attention.
  bool qkv_bias = false;  // q, k, v projections carry biases
  bool o_bias = false;    // the output projection carries a bias
  bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (Qwen3, GLM-4.5)
  // RoPE turns each head's first rotary_dim dimensions and passes the rest through (GLM-4.5
  // turns half); 0 means the whole head. Read it through RopeDim().
  int rotary_dim = 0;
  bool attention_sinks = false;
  std::vector<int> sliding_window;  // per layer; 0 means full causal attention

  // Multi-head latent attention (DeepSeek-V3); kv_lora_rank 0 means ordinary attention. A
  // head's query and key are head_dim = qk_nope_head_dim + rotary_dim wide (the RoPE part
  // last), its value v_head_dim. Keys and values come from one kv_lora_rank latent per token
  // (normalized) plus one rotary_dim k_pe shared by the heads, and that is what the KV cache
  // keeps: one "kv head" of KvHeadDim() floats, num_kv_heads 1.
  int q_lora_rank = 0;  // 0: q_proj straight from the hidden state
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
  // RoPE on pairs of adjacent dimensions (DeepSeek's layout: transformers moves the even
  // dimensions before the odd ones, then rotates halves).
  bool rope_interleave = false;
  // The softmax scale; 0 means head_dim^-0.5. DeepSeek-V3 multiplies it by YaRN's
  // mscale(factor, mscale_all_dim)^2.
  double softmax_scale = 0.0;

  // Mixture of experts.
  int num_experts = 0;
  int top_k = 0;
  bool norm_topk_prob = false;  // renormalize the kept weights to sum to 1
  int64_t moe_intermediate_size = 0;
  GateScoring gate_scoring = GateScoring::kSoftmaxThenTopK;
  bool router_bias = false;
  // kSigmoidGrouped only: experts split into num_expert_groups equal groups, of which the
  // top_k_groups best (by the sum of each group's two best biased scores) are eligible; the
  // kept weights (after norm_topk_prob) are multiplied by routed_scaling_factor.
  int num_expert_groups = 1;
  int top_k_groups = 1;
  double routed_scaling_factor = 1.0;
  bool router_correction_bias = false;  // per-expert bias added to scores for choosing only
  bool expert_bias = false;
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  std::vector<bool> layer_is_moe;  // per layer; false layers run a dense MLP
  int64_t dense_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool shared_expert_gate = false;  // a sigmoid gate scales the shared expert (Qwen2-MoE)

  // Block-scaled FP8 weights (quantization_config quant_method "fp8", DeepSeek's layout): an FP8
  // matrix's `weight_scale_inv` holds one scale per block of fp8_block_rows x fp8_block_cols
  // elements (weight_block_size). 0: no such config, FP8 matrices need per-row scales.
  int fp8_block_rows = 0;
  int fp8_block_cols = 0;

  bool tie_word_embeddings = false;
  std::vector<int> eos_token_ids;

  int RopeDim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  bool mla() const { return kv_lora_rank > 0; }
  bool fp8_block_scaled() const { return fp8_block_rows > 0; }
  // The width of one KV-cache row per kv head: the latent and k_pe under MLA, else a head.
  int KvHeadDim() const { return mla() ? kv_lora_rank + RopeDim() : head_dim; }
  // Whether values live in the key rows (MLA: the latent is both), so the cache keeps no
  // separate value rows.
  bool KvValuesInKeys() const { return mla(); }
};

// Parses config.json text; errors name `file_name` and the offending key.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view file_name);

// Reads `model_dir`/config.json, and EOS ids from generation_config.json when present.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Multiply-adds of a prompt, as 2 FLOPs each, for the share of a machine's tensor-core peak a
// prefill reaches: the matrices a token passes through in every layer (q/k/v/o, the gate,
// top_k routed experts, shared experts or the dense MLP; not the vocabulary projection, which a
// prompt takes for its last token only), and the attention of one query to one key in every
// layer (scores and values; sliding windows not subtracted). A prompt of n tokens costs
// n x LinearFlopsPerToken + n (n + 1) / 2 x AttentionFlopsPerPair.
double LinearFlopsPerToken(const ModelConfig& config);
double AttentionFlopsPerPair(const ModelConfig& config);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_MODEL_CONFIG_H_
