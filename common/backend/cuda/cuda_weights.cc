#include "common/backend/cuda/cuda_weights.h"

#include "common/backend/cuda/expert_repack.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

absl::StatusOr<DeviceWeight> DeviceWeightStore::Matrix(const WeightMatrix& w,
                                                       const WeightVector& bias) {
  DeviceWeight d;
  d.format = WeightFormat::kBf16;
  d.out = w.out;
  d.in = w.in;
  const size_t count = static_cast<size_t>(w.out * w.in);
  if (IsRowMajorBf16(w)) {
    ASSIGN_OR_RETURN(bf16 * ptr, Upload(static_cast<const bf16*>(w.data), count));
    d.data = ptr;
  } else {
    const std::vector<uint16_t> packed = RepackToRowMajorBf16(w);
    ASSIGN_OR_RETURN(uint16_t * ptr, Upload(packed.data(), packed.size()));
    d.data = ptr;
  }
  if (bias.present()) {
    ASSIGN_OR_RETURN(d.bias, Vector(bias));
  }
  return d;
}

absl::StatusOr<const bf16*> DeviceWeightStore::Vector(const WeightVector& v) {
  if (!v.present()) return nullptr;
  const std::vector<uint16_t> packed = RepackVectorBf16(v);
  ASSIGN_OR_RETURN(uint16_t * ptr, Upload(packed.data(), packed.size()));
  return reinterpret_cast<const bf16*>(ptr);
}

absl::StatusOr<const float*> DeviceWeightStore::FloatVector(const WeightVector& v) {
  if (!v.present()) return nullptr;
  std::vector<float> values(v.size);
  for (int64_t i = 0; i < v.size; ++i) values[i] = v.At(i);
  ASSIGN_OR_RETURN(float* ptr, Upload(values.data(), values.size()));
  return ptr;
}

absl::StatusOr<ExpertWeightTable> DeviceWeightStore::SingleExpert(const FfnWeights& ffn) {
  ASSIGN_OR_RETURN(DeviceWeight gate, Matrix(ffn.gate));
  ASSIGN_OR_RETURN(DeviceWeight up, Matrix(ffn.up));
  ASSIGN_OR_RETURN(DeviceWeight down, Matrix(ffn.down));
  ExpertWeightTable table;
  table.format = WeightFormat::kBf16;
  table.num_experts = 1;
  table.hidden = ffn.gate.in;
  table.intermediate = ffn.gate.out;
  const void* pointers[3] = {gate.data, up.data, down.data};
  ASSIGN_OR_RETURN(const void** device_pointers, Upload(pointers, 3));
  table.gate = device_pointers;
  table.up = device_pointers + 1;
  table.down = device_pointers + 2;
  if (ffn.gate_bias.present() || ffn.up_bias.present() || ffn.down_bias.present()) {
    ASSIGN_OR_RETURN(const bf16* gb, Vector(ffn.gate_bias));
    ASSIGN_OR_RETURN(const bf16* ub, Vector(ffn.up_bias));
    ASSIGN_OR_RETURN(const bf16* db, Vector(ffn.down_bias));
    const bf16* biases[3] = {gb, ub, db};
    ASSIGN_OR_RETURN(const bf16** device_biases, Upload(biases, 3));
    table.gate_bias = device_biases;
    table.up_bias = device_biases + 1;
    table.down_bias = device_biases + 2;
  }
  return table;
}

}  // namespace strata::gpu
