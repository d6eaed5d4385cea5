#include "common/model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

// Binds tensors from one checkpoint; each helper checks the exact shape it expects.
class Binder {
 public:
  // 16-bit row scales are converted into `converted` (a ModelWeights' storage).
  Binder(const ModelConfig& config, const Checkpoint& checkpoint,
         std::vector<std::unique_ptr<float[]>>* converted)
      : config_(config), checkpoint_(checkpoint), converted_(converted) {}

  // A row-major [out, in] matrix, as nn.Linear stores it. FP8 E4M3 weights need their scales
  // next to them: per row as `<name>_scale` of shape [out, 1] or [out] (the per-channel layout
  // of compressed-tensors checkpoints), or per block as `<name>_scale_inv` (DeepSeek's layout,
  // with the block size in config.json).
  absl::StatusOr<WeightMatrix> Linear(const std::string& name, int64_t out, int64_t in) const {
    ASSIGN_OR_RETURN(TensorRef t, checkpoint_.Get(name, {out, in}));
    WeightMatrix m{t.data, t.dtype, out, in, /*out_stride=*/in, /*in_stride=*/1};
    if (t.dtype == DType::kF8E4M3) {
      if (!checkpoint_.Has(name + "_scale") && checkpoint_.Has(name + "_scale_inv")) {
        ASSIGN_OR_RETURN(m.blocks, BlockScales(name, t, out, in));
      } else {
        ASSIGN_OR_RETURN(m.scale, RowScales(name, out));
      }
    }
    return m;
  }

  absl::StatusOr<WeightVector> Vector(const std::string& name, int64_t size) const {
    ASSIGN_OR_RETURN(TensorRef t, checkpoint_.Get(name, {size}));
    if (t.dtype == DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": FP8 vectors are not supported"));
    }
    return WeightVector{t.data, t.dtype, size, 1};
  }

  absl::StatusOr<TensorRef> Tensor(const std::string& name,
                                   std::initializer_list<int64_t> shape) const {
    ASSIGN_OR_RETURN(TensorRef t, checkpoint_.Get(name, shape));
    if (t.dtype == DType::kF8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": FP8 is supported for per-matrix [out, in] weights only"));
    }
    return t;
  }

 private:
  // Float32 [ceil(out / block rows), ceil(in / block cols)], as DeepSeek stores them; taken as
  // they are (no requantization).
  absl::StatusOr<Fp8BlockScales> BlockScales(const std::string& name, const TensorRef& weight,
                                             int64_t out, int64_t in) const {
    const std::string scale_name = name + "_scale_inv";
    if (!config_.fp8_block_scaled()) {
      return absl::InvalidArgumentError(absl::StrCat(
          scale_name,
          ": block-scaled FP8 needs the block size, quantization_config "
          "{\"quant_method\": \"fp8\", \"weight_block_size\": [rows, cols]} in config.json"));
    }
    Fp8BlockScales b;
    b.origin = static_cast<const uint8_t*>(weight.data);
    b.rows = out;
    b.cols = in;
    b.block_rows = config_.fp8_block_rows;
    b.block_cols = config_.fp8_block_cols;
    absl::StatusOr<TensorRef> s = checkpoint_.Get(scale_name, {b.grid_rows(), b.grid_cols()});
    if (!s.ok()) {
      return absl::Status(
          s.status().code(),
          absl::StrCat(scale_name, " must hold one scale per ", b.block_rows, "x", b.block_cols,
                       " block of ", name, " [", out, ", ", in, "]: ", s.status().message()));
    }
    if (s->dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat(scale_name, ": block scales must be F32, not ", DTypeName(s->dtype)));
    }
    b.data = static_cast<const float*>(s->data);
    return b;
  }

  absl::StatusOr<const float*> RowScales(const std::string& name, int64_t out) const {
    const std::string scale_name = name + "_scale";
    absl::StatusOr<TensorRef> s = checkpoint_.Get(scale_name, {out, 1});
    if (!s.ok() && checkpoint_.Has(scale_name)) s = checkpoint_.Get(scale_name, {out});
    if (!s.ok()) {
      return absl::Status(
          s.status().code(),
          absl::StrCat(name, " is FP8 E4M3 and needs per-row scales: ", s.status().message()));
    }
    if (s->dtype == DType::kF32) return static_cast<const float*>(s->data);
    if (s->dtype != DType::kBF16 && s->dtype != DType::kF16) {
      return absl::InvalidArgumentError(
          absl::StrCat(scale_name, ": FP8 scales must be F32, BF16 or F16"));
    }
    // 16-bit scales (as some quantizers save them) as float32, owned by the weights.
    auto scales = std::make_unique<float[]>(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) scales[o] = LoadAsFloat(s->data, s->dtype, o);
    converted_->push_back(std::move(scales));
    return converted_->back().get();
  }

  const ModelConfig& config_;
  const Checkpoint& checkpoint_;
  std::vector<std::unique_ptr<float[]>>* converted_;
};

absl::StatusOr<FfnWeights> BindSwiGlu(const Binder& b, const std::string& prefix,
                                      const std::string& gate, const std::string& up,
                                      const std::string& down, int64_t hidden,
                                      int64_t intermediate) {
  FfnWeights ffn;
  ASSIGN_OR_RETURN(ffn.gate, b.Linear(prefix + gate + ".weight", intermediate, hidden));
  ASSIGN_OR_RETURN(ffn.up, b.Linear(prefix + up + ".weight", intermediate, hidden));
  ASSIGN_OR_RETURN(ffn.down, b.Linear(prefix + down + ".weight", hidden, intermediate));
  return ffn;
}

// gpt-oss stores all experts of a layer in two 3-D tensors, transposed relative to nn.Linear
// and with gate and up interleaved along the last axis: gate_up_proj[e, i, 2j] is gate row j,
// gate_up_proj[e, i, 2j + 1] is up row j.
absl::StatusOr<std::vector<FfnWeights>> BindGptOssExperts(const Binder& b,
                                                          const std::string& prefix,
                                                          const ModelConfig& c) {
  const int64_t e_count = c.num_experts, h = c.hidden_size, inter = c.moe_intermediate_size;
  ASSIGN_OR_RETURN(TensorRef gate_up, b.Tensor(prefix + "gate_up_proj", {e_count, h, 2 * inter}));
  ASSIGN_OR_RETURN(TensorRef gate_up_bias,
                   b.Tensor(prefix + "gate_up_proj_bias", {e_count, 2 * inter}));
  ASSIGN_OR_RETURN(TensorRef down, b.Tensor(prefix + "down_proj", {e_count, inter, h}));
  ASSIGN_OR_RETURN(TensorRef down_bias, b.Tensor(prefix + "down_proj_bias", {e_count, h}));
  std::vector<FfnWeights> experts(e_count);
  for (int64_t e = 0; e < e_count; ++e) {
    const size_t elem = DTypeSize(gate_up.dtype);
    auto at = [](const TensorRef& t, int64_t offset) {
      return static_cast<const uint8_t*>(t.data) + offset * DTypeSize(t.dtype);
    };
    const uint8_t* gu = at(gate_up, e * h * 2 * inter);
    FfnWeights& ffn = experts[e];
    ffn.gate = {gu, gate_up.dtype, inter, h, /*out_stride=*/2, /*in_stride=*/2 * inter};
    ffn.up = {gu + elem, gate_up.dtype, inter, h, 2, 2 * inter};
    ffn.down = {at(down, e * inter * h), down.dtype, h, inter, /*out_stride=*/1, /*in_stride=*/h};
    const uint8_t* gub = at(gate_up_bias, e * 2 * inter);
    ffn.gate_bias = {gub, gate_up_bias.dtype, inter, 2};
    ffn.up_bias = {gub + DTypeSize(gate_up_bias.dtype), gate_up_bias.dtype, inter, 2};
    ffn.down_bias = {at(down_bias, e * h), down_bias.dtype, h, 1};
  }
  return experts;
}

// DeepSeek-V3's multi-head latent attention (no biases).
absl::StatusOr<AttentionWeights> BindLatentAttention(const Binder& b, const std::string& prefix,
                                                     const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_heads;
  AttentionWeights a;
  if (c.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(a.q_a, b.Linear(prefix + "q_a_proj.weight", c.q_lora_rank, h));
    ASSIGN_OR_RETURN(a.q_a_norm, b.Vector(prefix + "q_a_layernorm.weight", c.q_lora_rank));
    ASSIGN_OR_RETURN(a.q, b.Linear(prefix + "q_b_proj.weight", heads * c.head_dim, c.q_lora_rank));
  } else {
    ASSIGN_OR_RETURN(a.q, b.Linear(prefix + "q_proj.weight", heads * c.head_dim, h));
  }
  ASSIGN_OR_RETURN(a.kv_a, b.Linear(prefix + "kv_a_proj_with_mqa.weight", c.KvHeadDim(), h));
  ASSIGN_OR_RETURN(a.kv_a_norm, b.Vector(prefix + "kv_a_layernorm.weight", c.kv_lora_rank));
  ASSIGN_OR_RETURN(a.kv_b, b.Linear(prefix + "kv_b_proj.weight",
                                    heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank));
  // Attention reads kv_b_proj transposed (queries into latent space); per-row FP8 scales do
  // not follow a transpose, block scales do (DeepSeek ships kv_b_proj so).
  if (a.kv_b.scale != nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        prefix, "kv_b_proj.weight: FP8 with per-row scales is not supported (block scales are)"));
  }
  ASSIGN_OR_RETURN(a.o, b.Linear(prefix + "o_proj.weight", h, heads * c.v_head_dim));
  return a;
}

absl::StatusOr<AttentionWeights> BindAttention(const Binder& b, const std::string& prefix,
                                               const ModelConfig& c) {
  if (c.mla()) return BindLatentAttention(b, prefix, c);
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  AttentionWeights a;
  ASSIGN_OR_RETURN(a.q, b.Linear(prefix + "q_proj.weight", q_dim, h));
  ASSIGN_OR_RETURN(a.k, b.Linear(prefix + "k_proj.weight", kv_dim, h));
  ASSIGN_OR_RETURN(a.v, b.Linear(prefix + "v_proj.weight", kv_dim, h));
  ASSIGN_OR_RETURN(a.o, b.Linear(prefix + "o_proj.weight", h, q_dim));
  if (c.qkv_bias) {
    ASSIGN_OR_RETURN(a.q_bias, b.Vector(prefix + "q_proj.bias", q_dim));
    ASSIGN_OR_RETURN(a.k_bias, b.Vector(prefix + "k_proj.bias", kv_dim));
    ASSIGN_OR_RETURN(a.v_bias, b.Vector(prefix + "v_proj.bias", kv_dim));
  }
  if (c.o_bias) {
    ASSIGN_OR_RETURN(a.o_bias, b.Vector(prefix + "o_proj.bias", h));
  }
  if (c.qk_norm) {
    ASSIGN_OR_RETURN(a.q_norm, b.Vector(prefix + "q_norm.weight", c.head_dim));
    ASSIGN_OR_RETURN(a.k_norm, b.Vector(prefix + "k_norm.weight", c.head_dim));
  }
  if (c.attention_sinks) {
    ASSIGN_OR_RETURN(a.sinks, b.Vector(prefix + "sinks", c.num_heads));
  }
  return a;
}

absl::Status BindMoe(const Binder& b, const std::string& layer_prefix, const ModelConfig& c,
                     LayerWeights& layer) {
  const int64_t h = c.hidden_size;
  switch (c.arch) {
    case Architecture::kQwen3Moe:
    case Architecture::kQwen2Moe:
    case Architecture::kGlm4Moe:
    case Architecture::kDeepseekV3: {
      const std::string p = layer_prefix + "mlp.";
      // GLM-4.5's and DeepSeek-V3's gate carries the bias that picks experts, and their shared
      // experts are named in the plural.
      const bool grouped = c.arch == Architecture::kGlm4Moe || c.arch == Architecture::kDeepseekV3;
      ASSIGN_OR_RETURN(layer.router, b.Linear(p + "gate.weight", c.num_experts, h));
      if (grouped) {
        ASSIGN_OR_RETURN(layer.router_correction_bias,
                         b.Vector(p + "gate.e_score_correction_bias", c.num_experts));
      }
      for (int e = 0; e < c.num_experts; ++e) {
        ASSIGN_OR_RETURN(FfnWeights ffn,
                         BindSwiGlu(b, absl::StrCat(p, "experts.", e, "."), "gate_proj", "up_proj",
                                    "down_proj", h, c.moe_intermediate_size));
        layer.experts.push_back(ffn);
      }
      if (c.shared_expert_intermediate_size > 0) {
        ASSIGN_OR_RETURN(
            layer.shared_expert,
            BindSwiGlu(b, p + (grouped ? "shared_experts." : "shared_expert."), "gate_proj",
                       "up_proj", "down_proj", h, c.shared_expert_intermediate_size));
      }
      if (c.shared_expert_gate) {
        ASSIGN_OR_RETURN(layer.shared_expert_gate, b.Linear(p + "shared_expert_gate.weight", 1, h));
      }
      return absl::OkStatus();
    }
    case Architecture::kMixtral: {
      const std::string p = layer_prefix + "block_sparse_moe.";
      ASSIGN_OR_RETURN(layer.router, b.Linear(p + "gate.weight", c.num_experts, h));
      for (int e = 0; e < c.num_experts; ++e) {
        ASSIGN_OR_RETURN(FfnWeights ffn, BindSwiGlu(b, absl::StrCat(p, "experts.", e, "."), "w1",
                                                    "w3", "w2", h, c.moe_intermediate_size));
        layer.experts.push_back(ffn);
      }
      return absl::OkStatus();
    }
    case Architecture::kGptOss: {
      const std::string p = layer_prefix + "mlp.";
      ASSIGN_OR_RETURN(layer.router, b.Linear(p + "router.weight", c.num_experts, h));
      ASSIGN_OR_RETURN(layer.router_bias, b.Vector(p + "router.bias", c.num_experts));
      ASSIGN_OR_RETURN(layer.experts, BindGptOssExperts(b, p + "experts.", c));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& c, const Checkpoint& checkpoint) {
  ModelWeights w;
  const Binder b(c, checkpoint, &w.converted_scales);
  const int64_t h = c.hidden_size;
  ASSIGN_OR_RETURN(w.embedding, b.Linear("model.embed_tokens.weight", c.vocab_size, h));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embedding;
  } else {
    ASSIGN_OR_RETURN(w.lm_head, b.Linear("lm_head.weight", c.vocab_size, h));
  }
  ASSIGN_OR_RETURN(w.final_norm, b.Vector("model.norm.weight", h));
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& layer = w.layers[i];
    ASSIGN_OR_RETURN(layer.input_norm, b.Vector(p + "input_layernorm.weight", h));
    ASSIGN_OR_RETURN(layer.post_attention_norm, b.Vector(p + "post_attention_layernorm.weight", h));
    ASSIGN_OR_RETURN(layer.attention, BindAttention(b, p + "self_attn.", c));
    if (c.layer_is_moe[i]) {
      RETURN_IF_ERROR(BindMoe(b, p, c, layer));
    } else {
      ASSIGN_OR_RETURN(layer.dense_mlp, BindSwiGlu(b, p + "mlp.", "gate_proj", "up_proj",
                                                   "down_proj", h, c.dense_intermediate_size));
    }
  }
  return w;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir) {
  auto model = std::make_unique<Model>();
  model->dir = dir;
  ASSIGN_OR_RETURN(model->config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(model->checkpoint, Checkpoint::Open(dir));
  ASSIGN_OR_RETURN(model->weights, BindModelWeights(model->config, *model->checkpoint));
  return model;
}

}  // namespace strata
