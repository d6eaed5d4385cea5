#include "tools/strata/make_model.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/safetensors_writer.h"
#include "common/tensor/dtype.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/strata/eval_command.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// Hugging Face's initializer_range: every linear weight and the embedding are N(0, 0.02^2),
// norm weights are 1. With pre-norm layers this keeps activations sane at any depth.
constexpr double kInitStd = 0.02;
// The most a gate-row scale can give one expert: below 1/2 (see SolveZipfGateSkew).
constexpr double kMaxSelectionProbability = 0.45;

// splitmix64's output function. The generator is counter-based: element i of a tensor is
// 16-bit lane i % 4 of Mix(key + (i / 4 + 1) * golden) mapped through a table of normal
// quantiles, so any range of any tensor is produced independently, by any thread, in any
// order, with the same bytes; one hash makes four values.
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t KeyOf(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return Mix(Mix(seed + kGolden) ^ h);
}

// Calls put(i, u) with the 16-bit uniform u of every element i in [begin, end).
template <typename Put>
inline void ForEachUniform(uint64_t key, int64_t begin, int64_t end, Put put) {
  auto word = [key](int64_t i) { return Mix(key + static_cast<uint64_t>((i >> 2) + 1) * kGolden); };
  int64_t i = begin;
  if ((i & 3) != 0) {
    const uint64_t r = word(i);
    for (; i < end && (i & 3) != 0; ++i)
      put(i, static_cast<uint32_t>(r >> (16 * (i & 3))) & 0xffff);
  }
  for (; i + 4 <= end; i += 4) {
    const uint64_t r = word(i);
    put(i, static_cast<uint32_t>(r) & 0xffff);
    put(i + 1, static_cast<uint32_t>(r >> 16) & 0xffff);
    put(i + 2, static_cast<uint32_t>(r >> 32) & 0xffff);
    put(i + 3, static_cast<uint32_t>(r >> 48));
  }
  if (i < end) {
    const uint64_t r = word(i);
    for (; i < end; ++i) put(i, static_cast<uint32_t>(r >> (16 * (i & 3))) & 0xffff);
  }
}

// The standard normal's quantiles at (u + 1/2) / 65536 (|z| <= 4.33, exactly symmetric), and
// the same times kInitStd already encoded in each dtype, for the common case.
struct NormalTables {
  std::vector<float> z;
  std::vector<uint16_t> init_bf16, init_f16;
  // FP8 E4M3 codes of z * 448 / max|z| / f for the row factors f = 1 and 2: a row of std * z is
  // these codes times the row scale f * std * max|z| / 448 (every row's absmax is at most the
  // table's). The factor, picked per row from the tensor's key, makes the scales differ from
  // row to row and matrix to matrix, as a checkpoint's do.
  std::vector<uint8_t> fp8[2];
  float z_max = 0.0f;
};

const NormalTables& Tables() {
  static const NormalTables* tables = [] {
    auto* t = new NormalTables;
    t->z.resize(65536);
    double x = -4.5;  // Newton's method on the CDF, each quantile from the one before
    for (int u = 0; u < 32768; ++u) {
      const double p = (u + 0.5) / 65536.0;
      for (double dx = 1.0; std::abs(dx) > 1e-12;) {
        dx = (0.5 * std::erfc(-x / M_SQRT2) - p) / (std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI));
        x -= dx;
      }
      t->z[u] = static_cast<float>(x);
      t->z[65535 - u] = -t->z[u];
    }
    t->z_max = -t->z[0];
    for (float z : t->z) {
      const float v = static_cast<float>(kInitStd) * z;
      t->init_bf16.push_back(FloatToBf16(v));
      t->init_f16.push_back(FloatToF16(v));
      t->fp8[0].push_back(FloatToFp8E4M3(z * kFp8E4M3MaxValue / t->z_max));
      t->fp8[1].push_back(FloatToFp8E4M3(z * kFp8E4M3MaxValue / t->z_max / 2));
    }
    return t;
  }();
  return *tables;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool ones = false;  // a norm weight
  float std = 0.0f;
  std::vector<float> row_scale;  // per row of a 2-D tensor (a skewed gate); empty: none
  uint64_t key = 0;
  DType dtype = DType::kBF16;
  // F32 [rows], or [ceil(rows / b), ceil(cols / b)] blocks: the FP8 scales of the matrix whose
  // std this is (std * max|z| / 448 times its scale factor).
  bool fp8_scales = false;
  // FP8 codes: 0 for one scale per row, else the side of the square blocks sharing a scale.
  int64_t fp8_block = 0;
  bool zeros = false;     // a bias that starts at 0 (GLM's and DeepSeek's router correction bias)
  bool keep_f32 = false;  // float32 whatever the model's dtype (DeepSeek's correction bias)
  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  }
};

// 0 or 1: scale `index` (a row's, or a block's in row-major block order) of an FP8 matrix with
// key `key` has the factor 1 or 2 (NormalTables).
int Fp8ScaleFactor(uint64_t key, int64_t index) {
  return static_cast<int>(Mix(key ^ (static_cast<uint64_t>(index) * kGolden)) & 1);
}

// Writes elements [begin, begin + n) of `t` into `out` as t.dtype.
void Fill(const TensorSpec& t, int64_t begin, int64_t n, uint8_t* out) {
  const NormalTables& tables = Tables();
  const DType dtype = t.dtype;
  uint16_t* out16 = reinterpret_cast<uint16_t*>(out);
  float* out32 = reinterpret_cast<float*>(out);
  const int64_t end = begin + n;
  if (t.fp8_scales) {  // element o: scale o (a row's or a block's)
    for (int64_t o = begin; o < end; ++o) {
      out32[o - begin] = (1 + Fp8ScaleFactor(t.key, o)) * t.std * tables.z_max / kFp8E4M3MaxValue;
    }
    return;
  }
  if (dtype == DType::kF8E4M3) {  // rows of std * z: the codes alone (see NormalTables::fp8)
    const int64_t row_len = t.shape[1];
    // Columns sharing a scale, and the scales a row of blocks holds.
    const int64_t span = t.fp8_block > 0 ? t.fp8_block : row_len;
    const int64_t grid_cols = (row_len + span - 1) / span;
    for (int64_t i = begin; i < end;) {
      const int64_t row = i / row_len, col = i % row_len;
      const int64_t seg_end =
          std::min(end, row * row_len + std::min(row_len, (col / span + 1) * span));
      const int64_t scale = t.fp8_block > 0 ? (row / t.fp8_block) * grid_cols + col / span : row;
      const uint8_t* codes = tables.fp8[Fp8ScaleFactor(t.key, scale)].data();
      ForEachUniform(t.key, i, seg_end, [&](int64_t k, uint32_t u) { out[k - begin] = codes[u]; });
      i = seg_end;
    }
    return;
  }
  if (t.ones || t.zeros) {
    const float v = t.ones ? 1.0f : 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      if (dtype == DType::kF32) {
        out32[i - begin] = v;
      } else {
        out16[i - begin] = dtype == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v);
      }
    }
    return;
  }
  const int64_t row_len = t.shape.size() == 2 ? t.shape[1] : t.numel();
  const float* z = tables.z.data();
  for (int64_t i = begin; i < end;) {
    // One row segment at a time, so the scale is constant inside the loop.
    const int64_t row = i / row_len;
    const int64_t seg_end = std::min(end, (row + 1) * row_len);
    const float scale = t.row_scale.empty() ? t.std : t.std * t.row_scale[row];
    const bool init = scale == static_cast<float>(kInitStd);
    if (init && dtype != DType::kF32) {
      const uint16_t* table = (dtype == DType::kBF16 ? tables.init_bf16 : tables.init_f16).data();
      ForEachUniform(t.key, i, seg_end,
                     [&](int64_t k, uint32_t u) { out16[k - begin] = table[u]; });
    } else if (dtype == DType::kBF16) {
      ForEachUniform(t.key, i, seg_end,
                     [&](int64_t k, uint32_t u) { out16[k - begin] = FloatToBf16(scale * z[u]); });
    } else if (dtype == DType::kF16) {
      ForEachUniform(t.key, i, seg_end,
                     [&](int64_t k, uint32_t u) { out16[k - begin] = FloatToF16(scale * z[u]); });
    } else {
      ForEachUniform(t.key, i, seg_end,
                     [&](int64_t k, uint32_t u) { out32[k - begin] = scale * z[u]; });
    }
    i = seg_end;
  }
}

// A random order of the experts of one layer: order[r] is the expert ranked r.
std::vector<int> ExpertOrder(uint64_t seed, int layer, int experts) {
  std::vector<int> order(experts);
  std::iota(order.begin(), order.end(), 0);
  uint64_t state = KeyOf(seed, absl::StrCat("expert_order.", layer));
  for (int i = experts - 1; i > 0; --i) {
    state += kGolden;
    std::swap(order[i], order[Mix(state) % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

// DeepSeek-V3's multi-head latent attention: the q latent (or q_proj), the kv latent with the
// shared RoPE key, kv_b_proj (per head its k_nope rows, then its v rows) and o_proj.
void PlanLatentAttention(
    const ModelShape& s, const std::string& p,
    const std::function<TensorSpec&(std::string, std::vector<int64_t>)>& normal,
    const std::function<void(std::string, int64_t)>& ones) {
  const int64_t h = s.hidden, heads = s.heads;
  const int64_t q_dim = heads * (s.qk_nope_head_dim + s.qk_rope_head_dim);
  if (s.q_lora_rank > 0) {
    normal(p + "self_attn.q_a_proj.weight", {s.q_lora_rank, h});
    ones(p + "self_attn.q_a_layernorm.weight", s.q_lora_rank);
    normal(p + "self_attn.q_b_proj.weight", {q_dim, s.q_lora_rank});
  } else {
    normal(p + "self_attn.q_proj.weight", {q_dim, h});
  }
  normal(p + "self_attn.kv_a_proj_with_mqa.weight", {s.kv_lora_rank + s.qk_rope_head_dim, h});
  ones(p + "self_attn.kv_a_layernorm.weight", s.kv_lora_rank);
  normal(p + "self_attn.kv_b_proj.weight",
         {heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank});
  normal(p + "self_attn.o_proj.weight", {h, heads * s.v_head_dim});
}

// Every tensor the architecture needs (names and shapes as common/model/model_weights.cc binds
// them), in module order as transformers saves them.
std::vector<TensorSpec> PlanTensors(const ModelShape& s, int layers, uint64_t seed,
                                    const ZipfGateSkew* skew,
                                    std::vector<std::vector<int>>* orders) {
  std::vector<TensorSpec> plan;
  const float std = static_cast<float>(kInitStd);
  auto normal = [&](std::string name, std::vector<int64_t> shape) -> TensorSpec& {
    plan.push_back({std::move(name), std::move(shape), false, std, {}, 0});
    return plan.back();
  };
  auto ones = [&](std::string name, int64_t size) {
    plan.push_back({std::move(name), {size}, true, 1.0f, {}, 0});
  };
  auto zeros = [&](std::string name, int64_t size) {
    plan.push_back({std::move(name), {size}, false, 0.0f, {}, 0});
    plan.back().zeros = true;
  };
  auto swiglu = [&](const std::string& x, int64_t width) {
    normal(x + "gate_proj.weight", {width, s.hidden});
    normal(x + "up_proj.weight", {width, s.hidden});
    normal(x + "down_proj.weight", {s.hidden, width});
  };
  const bool glm = s.model_type == "glm4_moe";
  const bool mla = s.latent_attention();
  const bool qwen = s.model_type == "qwen3_moe" || glm || mla;  // Qwen's module names
  const int64_t h = s.hidden, q_dim = int64_t{s.heads} * s.head_dim;
  const int64_t kv_dim = int64_t{s.kv_heads} * s.head_dim;
  const int dense = DenseLayersOf(s, layers);
  normal("model.embed_tokens.weight", {s.vocab, h});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    ones(p + "input_layernorm.weight", h);
    if (mla) {
      PlanLatentAttention(s, p, normal, ones);
    } else {
      normal(p + "self_attn.q_proj.weight", {q_dim, h});
      if (glm) normal(p + "self_attn.q_proj.bias", {q_dim});
      normal(p + "self_attn.k_proj.weight", {kv_dim, h});
      if (glm) normal(p + "self_attn.k_proj.bias", {kv_dim});
      normal(p + "self_attn.v_proj.weight", {kv_dim, h});
      if (glm) normal(p + "self_attn.v_proj.bias", {kv_dim});
      normal(p + "self_attn.o_proj.weight", {h, q_dim});
      if (glm ? s.qk_norm : qwen) {
        ones(p + "self_attn.q_norm.weight", s.head_dim);
        ones(p + "self_attn.k_norm.weight", s.head_dim);
      }
    }
    ones(p + "post_attention_layernorm.weight", h);
    if (l < dense) {
      swiglu(p + "mlp.", s.dense_ffn);
      if (skew != nullptr) orders->push_back({});  // expert_order stays indexed by layer
      continue;
    }
    const std::string moe = p + (qwen ? "mlp." : "block_sparse_moe.");
    TensorSpec& gate = normal(moe + "gate.weight", {s.experts, h});
    // With one group and a zero correction bias the sigmoid router ranks experts by logit,
    // as the skew's construction assumes (with several groups, see the sidecar). DeepSeek
    // stores the bias in float32.
    if (s.grouped_router()) {
      zeros(moe + "gate.e_score_correction_bias", s.experts);
      plan.back().keep_f32 = mla;
    }
    if (skew != nullptr) {
      orders->push_back(ExpertOrder(seed, l, s.experts));
      gate.row_scale.resize(s.experts);
      for (int r = 0; r < s.experts; ++r) {
        gate.row_scale[orders->back()[r]] = static_cast<float>(skew->scale[r]);
      }
    }
    for (int e = 0; e < s.experts; ++e) {
      const std::string x = absl::StrCat(moe, "experts.", e, ".");
      normal(x + (qwen ? "gate_proj" : "w1") + ".weight", {s.expert_ffn, h});
      normal(x + (qwen ? "up_proj" : "w3") + ".weight", {s.expert_ffn, h});
      normal(x + (qwen ? "down_proj" : "w2") + ".weight", {h, s.expert_ffn});
    }
    if (s.grouped_router()) swiglu(moe + "shared_experts.", s.expert_ffn);
  }
  ones("model.norm.weight", h);
  normal("lm_head.weight", {s.vocab, h});
  for (TensorSpec& t : plan) t.key = KeyOf(seed, t.name);
  return plan;
}

// Whether tensor `t` is FP8 in a --dtype fp8 model: the routed experts' matrices, or for the
// DeepSeek shapes, which ship FP8 throughout, every linear `strata quantize` makes FP8
// (attention and every MLP; the gates and kv_b_proj stay 16-bit).
bool IsFp8Tensor(const ModelShape& s, const TensorSpec& t) {
  if (s.latent_attention()) return IsFp8Linear(t.name, t.shape);
  return t.name.find(".experts.") != std::string::npos && t.shape.size() == 2;
}

// The FP8 matrices, each followed by its F32 scales: `<name>_scale` [rows] per row, or
// `<name>_scale_inv` [ceil(rows / 128), ceil(cols / 128)] per block. `ignore` gets the module
// of every linear left 16-bit (the quantization_config's list).
std::vector<TensorSpec> WithFp8(const ModelShape& s, std::vector<TensorSpec> plan,
                                Fp8Scaling scaling, std::vector<std::string>* ignore) {
  std::vector<TensorSpec> out;
  out.reserve(plan.size() * 2);
  const bool block = scaling == Fp8Scaling::kBlock;
  for (TensorSpec& t : plan) {
    if (!IsFp8Tensor(s, t)) {
      if (t.shape.size() == 2 && t.name.rfind("model.layers.", 0) == 0) {
        ignore->push_back(ModuleOf(t.name));
      }
      out.push_back(std::move(t));
      continue;
    }
    t.dtype = DType::kF8E4M3;
    TensorSpec scales{t.name + "_scale", {t.shape[0]}, false, t.std, {}, t.key};
    if (block) {
      t.fp8_block = kFp8Block;
      scales.name = t.name + "_scale_inv";
      scales.shape = {(t.shape[0] + kFp8Block - 1) / kFp8Block,
                      (t.shape[1] + kFp8Block - 1) / kFp8Block};
    }
    scales.dtype = DType::kF32;
    scales.fp8_scales = true;
    out.push_back(std::move(t));
    out.push_back(std::move(scales));
  }
  return out;
}

struct Shard {
  std::vector<const TensorSpec*> tensors;
  std::vector<uint64_t> offsets;  // of each tensor in the data area; last entry: data size
};

absl::Status WriteText(const fs::path& path, const std::string& text) {
  return WriteTextFile(path.string(), text);
}

absl::Status WriteShard(const Shard& shard, const fs::path& path, int threads) {
  std::vector<SafetensorsTensorHeader> headers;
  for (const TensorSpec* t : shard.tensors) headers.push_back({t->name, t->dtype, t->shape});
  return WriteSafetensorsFile(
      path.string(), headers,
      [&](size_t i, uint64_t begin, uint64_t n, uint8_t* out) {
        const size_t elem = DTypeSize(shard.tensors[i]->dtype);
        Fill(*shard.tensors[i], static_cast<int64_t>(begin / elem), static_cast<int64_t>(n / elem),
             out);
      },
      threads);
}

// The output directory: created if missing, refused if it holds anything unless `force`, in
// which case old weight files (that an index might otherwise mix with ours) are removed.
absl::Status PrepareOutDir(const fs::path& dir, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), " exists and is not a directory"));
    }
    if (!fs::is_empty(dir, ec)) {
      if (!force) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir.string(), " exists and is not empty (--force writes into it anyway)"));
      }
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("model", 0) == 0 &&
            (absl::EndsWith(name, ".safetensors") || name == "model.safetensors.index.json")) {
          fs::remove(entry.path(), ec);
        }
      }
    }
  } else if (!fs::create_directories(dir, ec) || ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(dir.string(), " is not writable"));
  }
  return absl::OkStatus();
}

// The Gini coefficient of a probability vector (eval's, on counts per billion).
double GiniOf(const std::vector<double>& p) {
  std::vector<int64_t> counts;
  for (double x : p) counts.push_back(std::llround(x * 1e9));
  return Gini(counts);
}

// 61.07 GB, 314.1 kB; 30.53B, 157.1K.
std::string Gb(uint64_t bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.1f kB", bytes / 1e3);
}
std::string Count(int64_t n) {
  if (n >= 1e9) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1fM", n / 1e6);
  return absl::StrFormat("%.1fK", n / 1e3);
}

}  // namespace

absl::StatusOr<double> ParseSkew(absl::string_view spec) {
  if (spec.empty() || spec == "none") return 0.0;
  double exponent = 0.0;
  if (!absl::ConsumePrefix(&spec, "zipf:") || !absl::SimpleAtod(spec, &exponent) ||
      !std::isfinite(exponent) || exponent < 0.0 || exponent > 10.0) {
    return absl::InvalidArgumentError(
        "--skew must be zipf:S with an exponent 0 <= S <= 10 (e.g. zipf:1.0), or none");
  }
  return exponent;
}

// P(e in top k) = integral over e's logit t of density_e(t) * P(fewer than k others exceed t),
// where other j exceeds t with probability Q_j(t) = P(N(0, scale_j^2) > t). The count of
// others above t is Poisson-binomial: prefix and suffix dynamic programs over the experts
// (truncated at k) give it without expert e. The trapezoid rule runs on a grid symmetric about
// 0 and geometric in |t|, which resolves every scale from the smallest to the largest.
std::vector<double> TopKSelectionProbability(const std::vector<double>& scale, int top_k) {
  const int n = static_cast<int>(scale.size()), k = top_k;
  const double lo = *std::min_element(scale.begin(), scale.end());
  const double hi = *std::max_element(scale.begin(), scale.end());
  constexpr int kHalf = 240;
  std::vector<double> t;
  for (int i = kHalf - 1; i >= 0; --i) {
    t.push_back(
        -std::exp(std::log(1e-4 * lo) + i * std::log(9.0 * hi / (1e-4 * lo)) / (kHalf - 1)));
  }
  t.push_back(0.0);
  for (int i = kHalf - 1; i >= 0; --i) t.push_back(-t[i]);
  const int m = static_cast<int>(t.size());
  // q[j * m + i] = Q_j(t_i); pre/suf[(j * k + c) * m + i] = P(c of experts < j / >= j exceed t_i).
  std::vector<double> q(static_cast<size_t>(n) * m);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) q[j * m + i] = 0.5 * std::erfc(t[i] / (scale[j] * M_SQRT2));
  }
  std::vector<double> pre(static_cast<size_t>(n + 1) * k * m, 0.0), suf(pre.size(), 0.0);
  auto at = [&](std::vector<double>& v, int j, int c) {
    return &v[(static_cast<size_t>(j) * k + c) * m];
  };
  // One step of either program: counts with expert j in from counts without it.
  auto add = [&](std::vector<double>& v, int to, int from, int j) {
    for (int c = 0; c < k; ++c) {
      double *dst = at(v, to, c), *same = at(v, from, c), *one_less = at(v, from, c - (c > 0));
      for (int i = 0; i < m; ++i) {
        dst[i] = same[i] * (1.0 - q[j * m + i]) + (c > 0 ? one_less[i] * q[j * m + i] : 0.0);
      }
    }
  };
  std::fill(at(pre, 0, 0), at(pre, 0, 0) + m, 1.0);
  std::fill(at(suf, n, 0), at(suf, n, 0) + m, 1.0);
  for (int j = 0; j < n; ++j) add(pre, j + 1, j, j);
  for (int j = n - 1; j >= 0; --j) add(suf, j, j + 1, j);
  std::vector<double> p(n, 0.0), g(m);
  for (int e = 0; e < n; ++e) {
    std::fill(g.begin(), g.end(), 0.0);
    for (int a = 0; a < k; ++a) {
      for (int b = 0; a + b < k; ++b) {
        const double *x = at(pre, e, a), *y = at(suf, e + 1, b);
        for (int i = 0; i < m; ++i) g[i] += x[i] * y[i];
      }
    }
    auto f = [&](int i) {
      const double u = t[i] / scale[e];
      return std::exp(-0.5 * u * u) / (scale[e] * std::sqrt(2.0 * M_PI)) * g[i];
    };
    for (int i = 0; i + 1 < m; ++i) p[e] += 0.5 * (f(i) + f(i + 1)) * (t[i + 1] - t[i]);
  }
  return p;
}

// Why the clamp: a logit scale[r] * z with z symmetric cannot be in the top k more than half
// the time (flip the sign of x and the order reverses), and a scale near 0 still wins whenever
// fewer than k others are positive, P(Binomial(n - 1, 1/2) < k).
absl::StatusOr<ZipfGateSkew> SolveZipfGateSkew(int experts, int top_k, double exponent) {
  ZipfGateSkew skew;
  skew.exponent = exponent;
  const int n = experts, k = top_k;
  for (int c = 0; c < k; ++c) {
    skew.min_probability += std::exp(std::lgamma(n) - std::lgamma(c + 1) - std::lgamma(n - c) -
                                     (n - 1) * std::log(2.0));
  }
  const double lo = std::max(1.25 * skew.min_probability, 1e-4), hi = kMaxSelectionProbability;
  skew.lower = lo;
  skew.upper = hi;
  if (lo * n > k || hi * n < k) {
    return absl::InvalidArgumentError(absl::StrCat("--skew needs top_k / experts between ", lo,
                                                   " and ", hi, "; this shape has ", k, "/", n));
  }
  // target[r] = clamp(c / (r + 1)^S, lo, hi) with c set by bisection so the targets sum to k.
  auto targets = [&](double log_c) {
    std::vector<double> p(n);
    for (int r = 0; r < n; ++r) {
      p[r] = std::clamp(std::exp(log_c - exponent * std::log(r + 1.0)), lo, hi);
    }
    return p;
  };
  double a = -60.0, b = 60.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (a + b);
    const auto p = targets(mid);
    (std::accumulate(p.begin(), p.end(), 0.0) < k ? a : b) = mid;
  }
  skew.target = targets(0.5 * (a + b));
  const double sum = std::accumulate(skew.target.begin(), skew.target.end(), 0.0);
  for (double& p : skew.target) p *= k / sum;
  // Damped fixed point in log space: scale[r] *= (target[r] / achieved[r])^eta, eta halved
  // whenever the worst relative error grows. Each achieved[r] rises with its own scale.
  std::vector<double> s(n, 1.0), best = s;
  double best_err = INFINITY, prev_err = INFINITY, eta = 0.3;
  for (int it = 0; it < 3000 && best_err > 2e-3; ++it) {
    const std::vector<double> p = TopKSelectionProbability(s, k);
    double err = 0.0;
    for (int r = 0; r < n; ++r) err = std::max(err, std::abs(std::log(p[r] / skew.target[r])));
    if (err < best_err) best_err = err, best = s;
    eta = err > prev_err ? std::max(0.02, eta * 0.5) : std::min(0.5, eta * 1.1);
    prev_err = err;
    double ms = 0.0;
    for (int r = 0; r < n; ++r) {
      s[r] *= std::exp(eta * std::clamp(std::log(skew.target[r] / p[r]), -1.0, 1.0));
      ms += s[r] * s[r];
    }
    for (double& x : s) x /= std::sqrt(ms / n);
  }
  skew.scale = best;
  skew.achieved = TopKSelectionProbability(best, k);
  return skew;
}

absl::StatusOr<MakeModelResult> MakeModel(const MakeModelOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const ModelShape shape, FindModelShape(options.shape));
  ASSIGN_OR_RETURN(const double exponent, ParseSkew(options.skew));
  DType dtype;
  std::string torch_dtype;
  if (options.dtype == "bf16") {
    dtype = DType::kBF16, torch_dtype = "bfloat16";
  } else if (options.dtype == "f16") {
    dtype = DType::kF16, torch_dtype = "float16";
  } else if (options.dtype == "f32") {
    dtype = DType::kF32, torch_dtype = "float32";
  } else if (options.dtype == "fp8") {
    // FP8 E4M3 matrices (IsFp8Tensor) with F32 scales per row or per block; the rest bf16.
    dtype = DType::kBF16, torch_dtype = "bfloat16";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be bf16, f16, f32 or fp8, not \"", options.dtype, "\""));
  }
  if (options.layers < 0 || options.layers > 1000) {
    return absl::InvalidArgumentError("--layers must be between 1 and 1000 (0: the shape's own)");
  }
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  const int layers = options.layers > 0 ? options.layers : shape.layers;

  std::optional<ZipfGateSkew> skew;
  if (exponent > 0.0) {
    ASSIGN_OR_RETURN(skew, SolveZipfGateSkew(shape.experts, shape.top_k, exponent));
  }
  std::vector<std::vector<int>> orders;
  std::vector<TensorSpec> plan =
      PlanTensors(shape, layers, options.seed, skew ? &*skew : nullptr, &orders);
  for (TensorSpec& t : plan) t.dtype = t.keep_f32 ? DType::kF32 : dtype;
  const bool fp8 = options.dtype == "fp8";
  std::vector<std::string> ignore;
  if (fp8) plan = WithFp8(shape, std::move(plan), options.fp8_scaling, &ignore);

  // Shards of at most max_shard_bytes of tensor data, in order, as transformers cuts them.
  MakeModelResult result;
  std::vector<Shard> shards;
  for (const TensorSpec& t : plan) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype);
    if (shards.empty() || (shards.back().offsets.back() + bytes > options.max_shard_bytes &&
                           !shards.back().tensors.empty())) {
      shards.emplace_back();
      shards.back().offsets.push_back(0);
    }
    shards.back().tensors.push_back(&t);
    shards.back().offsets.push_back(shards.back().offsets.back() + bytes);
    if (!t.fp8_scales) result.params += t.numel();
    result.bytes += bytes;
  }
  result.shards = static_cast<int>(shards.size());
  const auto shard_name = [&](int i) {
    return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, result.shards);
  };

  const fs::path dir(options.out_dir);
  RETURN_IF_ERROR(PrepareOutDir(dir, options.force));
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (options.write_tensors && !ec && space.available < result.bytes + (64ull << 20)) {
    return absl::ResourceExhaustedError(absl::StrCat(shape.name, " with ", layers, " layers needs ",
                                                     Gb(result.bytes), "; ", dir.string(), " has ",
                                                     Gb(space.available), " free"));
  }
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (options.progress) {
    StatusLine(absl::StrFormat("%s, %d layers, %s: %s parameters, %s in %d shard(s), %d threads",
                               shape.name, layers, options.dtype, Count(result.params),
                               Gb(result.bytes), result.shards, threads));
  }
  if (skew && options.progress) {
    std::vector<std::string> p;
    for (size_t r = 0; r < skew->target.size(); ++r) {
      if (r < 8 || r + 1 == skew->target.size()) {
        p.push_back(absl::StrFormat("%s%.3g", r == 8 ? "... " : "", skew->target[r]));
      }
    }
    StatusLine(absl::StrFormat(
        "skew zipf:%g: per MoE layer a random order ranks the experts and the gate row of rank r "
        "is scaled by scale[r], solved so rank r is in the top %d with probability target[r] = "
        "clamp(c/(r+1)^%g, %.3g, %.3g): %s (Gini %.3f); orders and scales in "
        "strata_make_model.json",
        exponent, shape.top_k, exponent, skew->lower, skew->upper, absl::StrJoin(p, " "),
        GiniOf(skew->target)));
  }

  OrderedJson weight_map;
  uint64_t written = 0;
  for (int i = 0; i < result.shards; ++i) {
    const std::string name = shard_name(i);
    for (const TensorSpec* t : shards[i].tensors) weight_map[t->name] = name;
    if (!options.write_tensors) continue;
    const auto shard_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(WriteShard(shards[i], dir / name, threads));
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - shard_start).count();
    written += shards[i].offsets.back();
    if (options.progress) {
      StatusLine(absl::StrFormat("shard %d/%d %s: %s in %.2f s (%.2f GB/s); %s of %s", i + 1,
                                 result.shards, name, Gb(shards[i].offsets.back()), sec,
                                 shards[i].offsets.back() / 1e9 / std::max(sec, 1e-9), Gb(written),
                                 Gb(result.bytes)));
    }
  }

  OrderedJson index;
  index["metadata"] = {{"total_size", result.bytes}};
  index["weight_map"] = std::move(weight_map);
  RETURN_IF_ERROR(WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  nlohmann::json config = ShapeConfigJson(shape, layers, torch_dtype);
  // Block scales need their block size from the config; the per-row layout has always been
  // read from the tensors alone.
  if (fp8 && options.fp8_scaling == Fp8Scaling::kBlock) {
    config["quantization_config"] = BlockQuantizationConfigJson(std::move(ignore));
  }
  RETURN_IF_ERROR(WriteText(dir / "config.json", config.dump(2) + "\n"));
  const nlohmann::json generation = {
      {"_from_model_config", true},
      {"bos_token_id", shape.bos_token_id >= 0 ? nlohmann::json(shape.bos_token_id) : nullptr},
      {"eos_token_id", shape.eos_token_id},
      {"transformers_version", "4.51.0"}};
  RETURN_IF_ERROR(WriteText(dir / "generation_config.json", generation.dump(2) + "\n"));

  OrderedJson sidecar;
  sidecar["generator"] = "strata make-model";
  sidecar["shape"] = shape.name;
  sidecar["layers"] = layers;
  sidecar["dtype"] = options.dtype;
  if (fp8) sidecar["fp8_scaling"] = options.fp8_scaling == Fp8Scaling::kBlock ? "block" : "channel";
  sidecar["dense_layers"] = DenseLayersOf(shape, layers);
  sidecar["seed"] = options.seed;
  sidecar["init"] = {
      {"linear_std", kInitStd},
      {"embedding_std", kInitStd},
      {"norm_weights", 1.0},
      {"values",
       "element i of tensor T: 16-bit lane i % 4 of splitmix64 output i / 4 from key "
       "hash(seed, T), taken as the normal quantile at (u + 1/2) / 65536, times the std"}};
  if (skew) {
    OrderedJson s;
    s["spec"] = absl::StrFormat("zipf:%g", exponent);
    s["exponent"] = exponent;
    s["construction"] = absl::StrCat(
        "In every MoE layer, expert_order[layer][r] is the expert ranked r (a random order from "
        "the seed). Its gate row is the usual N(0, 0.02^2) row times gate_row_scale[r]. For any "
        "gate input x the logits are then independent N(0, (0.02 gate_row_scale[r] |x|)^2), so "
        "the chance that rank r is in the top k depends on the scales alone (and not on the "
        "router temperature); the scales are solved (quadrature, damped fixed point) so that "
        "it equals selection_probability[r] = clamp(c / (r + 1)^S, lo, hi), c making them sum "
        "to top_k: Zipf's law where this construction can reach it (hi < 1/2; lo above "
        "P(Binomial(experts - 1, 1/2) < top_k)).");
    if (shape.n_group > 1) {
      // The router first keeps the topk_group groups of the best two biased scores, which the
      // construction does not model: popular experts still win, but not at these rates.
      s["groups"] = absl::StrCat(
          "This router chooses within the best ", shape.topk_group, " of ", shape.n_group,
          " expert groups; the construction assumes one group, so the achieved probabilities "
          "only approximate selection_probability (measure them, e.g. strata eval "
          "--expert-stats).");
    }
    s["selection_probability"] = skew->target;
    s["achieved_selection_probability"] = skew->achieved;
    s["gate_row_scale"] = skew->scale;
    s["clamp"] = {skew->lower, skew->upper};
    s["expected_gini"] = GiniOf(skew->target);
    s["expert_order"] = orders;
    sidecar["skew"] = std::move(s);
  } else {
    sidecar["skew"] = "none";
  }
  RETURN_IF_ERROR(WriteText(dir / "strata_make_model.json", sidecar.dump(2) + "\n"));

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) {
    StatusLine(absl::StrFormat(
        "wrote %s to %s: %s parameters, %s in %d shard(s), %.2f s (%.2f GB/s)", shape.name,
        dir.string(), Count(result.params), Gb(result.bytes), result.shards, result.seconds,
        result.bytes / 1e9 / std::max(result.seconds, 1e-9)));
  }
  return result;
}

}  // namespace strata
