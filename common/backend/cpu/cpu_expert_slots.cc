#include "common/backend/cpu/cpu_expert_slots.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

constexpr uint64_t kAlign = 64;
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct SlotLayout {
  uint64_t matrix, gate_bias, down_bias, total;
};

// Biases are never FP8: up to float32 room for FP8 weights' biases.
uint64_t BiasElementBytes(DType weights) {
  return weights == DType::kF8E4M3 ? sizeof(float) : DTypeSize(weights);
}

// The most float32 scales an FP8 expert matrix carries: a row's (max(h, inter) rows), or its
// blocks' when the model's FP8 is block-scaled.
uint64_t MaxScales(const ModelConfig& config) {
  const uint64_t h = config.hidden_size, inter = config.moe_intermediate_size;
  uint64_t most = std::max(h, inter);
  if (config.fp8_block_scaled()) {
    const uint64_t br = config.fp8_block_rows, bc = config.fp8_block_cols;
    const uint64_t blocks = std::max(((inter + br - 1) / br) * ((h + bc - 1) / bc),
                                     ((h + br - 1) / br) * ((inter + bc - 1) / bc));
    most = std::max(most, blocks);
  }
  return most;
}

// A matrix's bytes, then (FP8) its row or block scales.
SlotLayout LayoutOf(const ModelConfig& config, DType dtype, bool biased) {
  const uint64_t h = config.hidden_size, inter = config.moe_intermediate_size;
  const uint64_t size = DTypeSize(dtype);
  SlotLayout l;
  l.matrix = AlignUp(h * inter * size) +
             (dtype == DType::kF8E4M3 ? AlignUp(MaxScales(config) * sizeof(float)) : 0);
  l.gate_bias = biased ? AlignUp(inter * BiasElementBytes(dtype)) : 0;
  l.down_bias = biased ? AlignUp(h * BiasElementBytes(dtype)) : 0;
  l.total = 3 * l.matrix + 2 * l.gate_bias + l.down_bias;
  return l;
}

// Copies `src` into `dst` as a packed row-major matrix of the same dtype, its row or block
// scales (FP8) after it.
WeightMatrix CopyMatrix(const WeightMatrix& src, uint8_t* dst) {
  const size_t size = DTypeSize(src.dtype);
  if (src.row_major()) {
    std::memcpy(dst, src.data, static_cast<size_t>(src.out * src.in) * size);
  } else {  // strided views (interleaved gate/up) are packed row by row, element by element
    const uint8_t* base = static_cast<const uint8_t*>(src.data);
    for (int64_t o = 0; o < src.out; ++o) {
      for (int64_t i = 0; i < src.in; ++i) {
        std::memcpy(dst + (o * src.in + i) * size,
                    base + (o * src.out_stride + i * src.in_stride) * size, size);
      }
    }
  }
  WeightMatrix m{dst, src.dtype, src.out, src.in, src.in, 1};
  float* scale = reinterpret_cast<float*>(dst + AlignUp(src.out * src.in * size));
  if (src.scale != nullptr) {
    std::memcpy(scale, src.scale, static_cast<size_t>(src.out) * sizeof(float));
    m.scale = scale;
  } else if (src.blocks.present()) {  // whole_block_scaled(), checked by Load
    std::memcpy(scale, src.blocks.data, static_cast<size_t>(src.blocks.count()) * sizeof(float));
    m.blocks = src.blocks;
    m.blocks.data = scale;
    m.blocks.origin = dst;
  }
  return m;
}

WeightVector CopyVector(const WeightVector& src, uint8_t* dst) {
  const size_t size = DTypeSize(src.dtype);
  const uint8_t* base = static_cast<const uint8_t*>(src.data);
  for (int64_t j = 0; j < src.size; ++j)
    std::memcpy(dst + j * size, base + j * src.stride * size, size);
  return WeightVector{dst, src.dtype, src.size, 1};
}

}  // namespace

uint64_t CpuExpertSlotBytes(const ModelConfig& config, DType dtype, bool biased) {
  return LayoutOf(config, dtype, biased).total;
}

absl::StatusOr<std::unique_ptr<CpuExpertSlots>> CpuExpertSlots::Create(const ModelConfig& config,
                                                                       int num_slots, DType dtype,
                                                                       bool biased,
                                                                       ThreadPool& pool) {
  if (num_slots < 0) return absl::InvalidArgumentError("negative slot count");
  std::unique_ptr<CpuExpertSlots> s(new CpuExpertSlots(config, dtype, biased));
  s->slot_bytes_ = LayoutOf(config, dtype, biased).total;
  s->weights_.resize(num_slots);
  s->bound_.assign(num_slots, {-1, -1});
  s->memory_.resize(num_slots);
  RETURN_IF_ERROR(s->SetUsableSlots(num_slots));
  const ExpertWeightSource& bound = *s;  // private base: only the backend reads it
  s->backend_ = std::make_unique<CpuExpertBackend>(config, bound, pool);
  return s;
}

absl::Status CpuExpertSlots::Load(int slot, int layer, int expert, const FfnWeights& weights) {
  if (slot < 0 || slot >= num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " out of range"));
  }
  if (layer < 0 || layer >= config_.num_layers || !config_.layer_is_moe[layer] || expert < 0 ||
      expert >= config_.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: layer ", layer, " has no expert ", expert));
  }
  // The slot's regions are sized by the model: weights of another shape would overrun them.
  const int64_t h = config_.hidden_size, inter = config_.moe_intermediate_size;
  const std::pair<const WeightMatrix*, std::pair<int64_t, int64_t>> shapes[] = {
      {&weights.gate, {inter, h}}, {&weights.up, {inter, h}}, {&weights.down, {h, inter}}};
  for (const auto& [m, shape] : shapes) {
    if (m->dtype != dtype_) {
      return absl::InvalidArgumentError("expert weights are not in the slots' dtype");
    }
    if (!m->scales_match_dtype()) {
      return absl::InvalidArgumentError("FP8 expert weights need scales (and only they)");
    }
    if (m->blocks.present() && (!m->whole_block_scaled() ||
                                static_cast<uint64_t>(m->blocks.count()) > MaxScales(config_))) {
      return absl::InvalidArgumentError(
          "block-scaled FP8 expert weights must be whole tensors in the model's blocks");
    }
    if (m->out != shape.first || m->in != shape.second) {
      return absl::InvalidArgumentError(absl::StrCat("expert weights of shape [", m->out, ", ",
                                                     m->in, "], not the model's [", shape.first,
                                                     ", ", shape.second, "]"));
    }
  }
  for (const WeightVector* b : {&weights.gate_bias, &weights.up_bias, &weights.down_bias}) {
    if (b->present() && DTypeSize(b->dtype) > BiasElementBytes(dtype_)) {
      return absl::InvalidArgumentError("expert biases wider than the slots' layout");
    }
  }
  if (weights.gate_bias.present() != biased_ ||
      (biased_ && (weights.gate_bias.size != inter || weights.up_bias.size != inter ||
                   weights.down_bias.size != h))) {
    return absl::InvalidArgumentError("expert biases do not match the slots' layout");
  }
  // One slot per expert: a second would be dropped from the index when the first is released.
  if (const auto it = slot_of_.find({layer, expert}); it != slot_of_.end() && it->second != slot) {
    return absl::AlreadyExistsError(absl::StrCat("expert slots: layer ", layer, " expert ", expert,
                                                 " is already in slot ", it->second));
  }
  if (slot >= usable_) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert slots: slot ", slot, " is past the ", usable_, " in use"));
  }
  Release(slot);
  const SlotLayout l = LayoutOf(config_, dtype_, biased_);
  uint8_t* base =
      reinterpret_cast<uint8_t*>(AlignUp(reinterpret_cast<uintptr_t>(memory_[slot].get())));
  FfnWeights& w = weights_[slot];
  w = FfnWeights();
  w.gate = CopyMatrix(weights.gate, base);
  w.up = CopyMatrix(weights.up, base + l.matrix);
  w.down = CopyMatrix(weights.down, base + 2 * l.matrix);
  if (biased_) {
    uint8_t* b = base + 3 * l.matrix;
    w.gate_bias = CopyVector(weights.gate_bias, b);
    w.up_bias = CopyVector(weights.up_bias, b + l.gate_bias);
    w.down_bias = CopyVector(weights.down_bias, b + 2 * l.gate_bias);
  }
  bound_[slot] = {layer, expert};
  slot_of_[{layer, expert}] = slot;
  return absl::OkStatus();
}

absl::Status CpuExpertSlots::SetUsableSlots(int n) {
  if (n < 0 || n > num_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: ", n, " in use of ", num_slots()));
  }
  for (int slot = n; slot < usable_; ++slot) {
    if (bound_[slot].first >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert slots: slot ", slot, " still holds an expert"));
    }
  }
  // One allocation a slot, so that a slot given back is memory the process gives back.
  for (int slot = usable_; slot < n; ++slot) {
    memory_[slot].reset(new (std::nothrow) uint8_t[slot_bytes_ + kAlign]);
    if (memory_[slot] == nullptr) {
      for (int s = usable_; s < slot; ++s) memory_[s].reset();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", (n - usable_) * slot_bytes_ >> 20, " MiB of expert slots"));
    }
  }
  for (int slot = n; slot < usable_; ++slot) memory_[slot].reset();
  usable_ = n;
  return absl::OkStatus();
}

void CpuExpertSlots::Release(int slot) {
  if (slot < 0 || slot >= num_slots() || bound_[slot].first < 0) return;
  slot_of_.erase(bound_[slot]);
  bound_[slot] = {-1, -1};
  weights_[slot] = FfnWeights();
}

const FfnWeights* CpuExpertSlots::Find(int layer, int expert) const {
  const auto it = slot_of_.find({layer, expert});
  return it == slot_of_.end() ? nullptr : &weights_[it->second];
}

}  // namespace strata
