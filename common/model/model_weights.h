// Typed views of a model's weights, bound by name from a checkpoint for each architecture.
// Nothing is copied: every view points into the memory-mapped checkpoint files.
#ifndef STRATA_COMMON_MODEL_MODEL_WEIGHTS_H_
#define STRATA_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "common/tensor/dtype.h"

namespace strata {

// DeepSeek's block-scaled FP8 layout: one float32 scale (`weight_scale_inv`) per block of
// block_rows x block_cols elements of the stored [rows, cols] row-major FP8 tensor, themselves
// row-major [ceil(rows / block_rows), ceil(cols / block_cols)]; the last block of a row or
// column is partial when rows or cols is not a multiple. A scale is found from the element's
// place in the stored tensor (`origin` is its element (0, 0)), so views into the tensor (a
// slice of rows, a transpose) keep their scales without being told.
struct Fp8BlockScales {
  const float* data = nullptr;
  const uint8_t* origin = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 0;
  int64_t block_cols = 0;

  bool present() const { return data != nullptr; }
  int64_t grid_rows() const { return (rows + block_rows - 1) / block_rows; }
  int64_t grid_cols() const { return (cols + block_cols - 1) / block_cols; }
  int64_t count() const { return grid_rows() * grid_cols(); }
  // The scale of stored element (row, col).
  float At(int64_t row, int64_t col) const {
    return data[(row / block_rows) * grid_cols() + col / block_cols];
  }
  // The scale of the element `offset` elements past `origin`.
  float AtOffset(int64_t offset) const { return At(offset / cols, offset % cols); }
};

// A linear map y = W x with W of shape [out, in], in any stored layout: element (o, i) sits at
// data[o * out_stride + i * in_stride]. Checkpoints that store W transposed or with gate and
// up interleaved (gpt-oss) are described by their strides instead of being repacked. FP8
// weights carry float32 scales, one per output row (`scale`, the per-channel layout) or one
// per block (`blocks`, DeepSeek's layout): W[o, i] = ScaleAt(o, i) * stored (o, i).
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t out = 0;
  int64_t in = 0;
  int64_t out_stride = 0;
  int64_t in_stride = 1;
  const float* scale = nullptr;  // [out], per-row FP8 only
  Fp8BlockScales blocks;         // block-scaled FP8 only

  bool present() const { return data != nullptr; }
  // Rows stored one after another, each packed: the layout a copy can take whole.
  bool row_major() const { return in_stride == 1 && out_stride == in; }
  bool scaled() const { return scale != nullptr || blocks.present(); }
  // FP8 E4M3 matrices carry scales of one layout, and only they.
  bool scales_match_dtype() const {
    return (dtype == DType::kF8E4M3) == scaled() && !(scale != nullptr && blocks.present());
  }
  // The whole stored tensor, row-major, with its block scales: what can be copied as it is
  // (codes, then count() scales) and described again over the copy.
  bool whole_block_scaled() const {
    return blocks.present() && row_major() && blocks.origin == data && blocks.rows == out &&
           blocks.cols == in;
  }
  // The one rule for which scale applies to element (o, i); 1 for unscaled weights.
  float ScaleAt(int64_t o, int64_t i) const {
    if (scale != nullptr) return scale[o];
    if (blocks.present()) {
      return blocks.AtOffset(static_cast<const uint8_t*>(data) - blocks.origin + o * out_stride +
                             i * in_stride);
    }
    return 1.0f;
  }
  float At(int64_t o, int64_t i) const {
    const float v = LoadAsFloat(data, dtype, o * out_stride + i * in_stride);
    return scaled() ? v * ScaleAt(o, i) : v;
  }
};

// A vector (bias, norm weight, sinks); element j at data[j * stride]. Absent when data is null.
struct WeightVector {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t size = 0;
  int64_t stride = 1;

  bool present() const { return data != nullptr; }
  float At(int64_t j) const { return LoadAsFloat(data, dtype, j * stride); }
};

// One SwiGLU feed-forward network: down(act(gate x + gate_bias, up x + up_bias)) + down_bias.
struct FfnWeights {
  WeightMatrix gate, up, down;
  WeightVector gate_bias, up_bias, down_bias;
};

struct AttentionWeights {
  WeightMatrix q, k, v, o;
  WeightVector q_bias, k_bias, v_bias, o_bias;
  WeightVector q_norm, k_norm;  // per-head RMSNorm (Qwen3)
  WeightVector sinks;           // one logit per head (gpt-oss)
  // Multi-head latent attention (DeepSeek-V3); k and v are absent. q is q_b_proj
  // [heads * head_dim, q_lora_rank] after q_a [q_lora_rank, hidden] and its norm, or q_proj.
  WeightMatrix q_a;
  WeightVector q_a_norm;
  WeightMatrix kv_a;  // kv_a_proj_with_mqa: [kv_lora_rank + rope dim, hidden]
  WeightVector kv_a_norm;
  // kv_b_proj: [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]; per head, its k_nope
  // rows then its v rows.
  WeightMatrix kv_b;
};

struct LayerWeights {
  WeightVector input_norm;
  WeightVector post_attention_norm;
  AttentionWeights attention;
  // MoE layers.
  WeightMatrix router;  // [num_experts, hidden]
  WeightVector router_bias;
  WeightVector router_correction_bias;  // [num_experts], added to scores for choosing only
  std::vector<FfnWeights> experts;
  std::optional<FfnWeights> shared_expert;  // added to every token's output
  WeightMatrix shared_expert_gate;          // [1, hidden]; absent when ungated
  // Dense layers.
  std::optional<FfnWeights> dense_mlp;
};

struct ModelWeights {
  WeightMatrix embedding;  // [vocab, hidden]; row t is token t's embedding
  WeightMatrix lm_head;    // [vocab, hidden]; the embedding when tied
  WeightVector final_norm;
  std::vector<LayerWeights> layers;
  // FP8 row scales a checkpoint stores in 16 bits, as float32 (the matrices point here).
  std::vector<std::unique_ptr<float[]>> converted_scales;
};

// Binds every tensor the architecture needs, checking names, shapes and dtypes.
absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config,
                                              const Checkpoint& checkpoint);

// Where an expert backend finds expert weights: a model's own checkpoint, or the shared
// memory of the expert store.
class ExpertWeightSource {
 public:
  virtual ~ExpertWeightSource() = default;
  // Null when the layer has no such expert.
  virtual const FfnWeights* Find(int layer, int expert) const = 0;
};

// The experts of a checkpoint bound in this process.
class ModelExpertSource : public ExpertWeightSource {
 public:
  explicit ModelExpertSource(const ModelWeights& weights) : weights_(weights) {}
  const FfnWeights* Find(int layer, int expert) const override {
    if (layer < 0 || layer >= static_cast<int>(weights_.layers.size())) return nullptr;
    const auto& experts = weights_.layers[layer].experts;
    if (expert < 0 || expert >= static_cast<int>(experts.size())) return nullptr;
    return &experts[expert];
  }

 private:
  const ModelWeights& weights_;
};

// A loaded model: its config, its mapped checkpoint and the views into it.
struct Model {
  std::string dir;
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  ModelWeights weights;
};

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_MODEL_WEIGHTS_H_
