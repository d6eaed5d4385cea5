#include "common/backend/cuda/cuda_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/expert_repack.h"
#include "common/cuda/kernels/fp8_quant.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::StatusOr<DeviceWeight> DeviceWeightStore::Matrix(const WeightMatrix& w,
                                                       const WeightVector& bias,
                                                       WeightFormat format) {
  if (w.blocks.present()) {  // CudaRouterSupports names them; this guards other callers
    return absl::UnimplementedError("the CUDA backend takes per-row FP8 scales, not block scales");
  }
  DeviceWeight d;
  d.format = format;
  d.out = w.out;
  d.in = w.in;
  const size_t count = static_cast<size_t>(w.out * w.in);
  if (format == WeightFormat::kFp8E4M3 && w.dtype == DType::kF8E4M3 && w.scale != nullptr &&
      w.row_major()) {
    // An FP8 checkpoint's codes and row scales go up as they are: exact, and nothing staged.
    ASSIGN_OR_RETURN(uint8_t * q, Upload(static_cast<const uint8_t*>(w.data), count));
    ASSIGN_OR_RETURN(d.scale, Upload(w.scale, static_cast<size_t>(w.out)));
    d.data = q;
  } else {
    std::vector<uint16_t> packed;
    if (!IsRowMajorBf16(w)) packed = RepackToRowMajorBf16(w);
    const void* host = packed.empty() ? w.data : packed.data();
    if (format == WeightFormat::kFp8E4M3) {
      // The bf16 copy only lives until it is quantized.
      ASSIGN_OR_RETURN(DeviceBuffer<bf16> staging, DeviceBuffer<bf16>::Allocate(count));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging.data(), host, count * sizeof(bf16),
                                           cudaMemcpyHostToDevice, stream_));
      ASSIGN_OR_RETURN(uint8_t * q, Allocate<uint8_t>(count));
      ASSIGN_OR_RETURN(float* scales, Allocate<float>(static_cast<size_t>(w.out)));
      CUDA_RETURN_IF_ERROR(
          LaunchQuantizeFp8PerChannel(staging.data(), w.out, w.in, q, scales, stream_));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      d.data = q;
      d.scale = scales;
    } else {
      ASSIGN_OR_RETURN(uint16_t * ptr, Upload(static_cast<const uint16_t*>(host), count));
      d.data = ptr;
    }
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

ExpertDeviceLayout ExpertDeviceLayout::For(int64_t hidden, int64_t intermediate,
                                           WeightFormat format, bool biased) {
  ExpertDeviceLayout l;
  l.format = format;
  l.hidden = hidden;
  l.intermediate = intermediate;
  l.biased = biased;
  const bool fp8 = format == WeightFormat::kFp8E4M3;
  const size_t h = static_cast<size_t>(hidden), inter = static_cast<size_t>(intermediate);
  l.matrix_bytes = AlignUp(h * inter * (fp8 ? 1 : 2));
  l.scales_offset = 3 * l.matrix_bytes;
  const size_t scales = fp8 ? 2 * AlignUp(inter * 4) + AlignUp(h * 4) : 0;
  l.biases_offset = l.scales_offset + scales;
  const size_t biases = biased ? 2 * AlignUp(inter * 2) + AlignUp(h * 2) : 0;
  l.bytes = l.biases_offset + biases;
  return l;
}

std::array<const void*, 9> ExpertDeviceLayout::Pointers(const uint8_t* base,
                                                        const FfnWeights& weights) const {
  std::array<const void*, 9> p{};
  const size_t inter_floats = AlignUp(static_cast<size_t>(intermediate) * 4);
  const size_t inter_bf16 = AlignUp(static_cast<size_t>(intermediate) * 2);
  for (int m = 0; m < 3; ++m) p[m] = base + m * matrix_bytes;
  if (format == WeightFormat::kFp8E4M3) {
    for (int m = 0; m < 3; ++m) p[3 + m] = base + scales_offset + m * inter_floats;
  }
  if (biased) {
    const WeightVector* vecs[3] = {&weights.gate_bias, &weights.up_bias, &weights.down_bias};
    for (int m = 0; m < 3; ++m) {
      if (vecs[m]->present()) p[6 + m] = base + biases_offset + m * inter_bf16;
    }
  }
  return p;
}

size_t ExpertDeviceLayout::host_staging_elements() const {
  const size_t biases = biased ? 2 * static_cast<size_t>(intermediate) + hidden : 0;
  return 3 * static_cast<size_t>(hidden * intermediate) + biases;
}

absl::Status ExpertDeviceLayout::Check(const FfnWeights& weights) const {
  const WeightMatrix* mats[3] = {&weights.gate, &weights.up, &weights.down};
  for (int m = 0; m < 3; ++m) {
    const WeightMatrix& w = *mats[m];
    const int64_t want_out = m == 2 ? hidden : intermediate;
    const int64_t want_in = m == 2 ? intermediate : hidden;
    if (!w.present() || w.out != want_out || w.in != want_in) {
      return absl::InvalidArgumentError(absl::StrCat("expert weights: matrix ", m, " is [", w.out,
                                                     ", ", w.in, "], expected [", want_out, ", ",
                                                     want_in, "]"));
    }
  }
  const WeightVector* vecs[3] = {&weights.gate_bias, &weights.up_bias, &weights.down_bias};
  const int64_t sizes[3] = {intermediate, intermediate, hidden};
  for (int m = 0; m < 3; ++m) {
    if (!vecs[m]->present()) continue;
    if (!biased) {
      return absl::InvalidArgumentError("expert weights: biases, but the model has none");
    }
    if (vecs[m]->size != sizes[m]) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert weights: bias ", m, " has ", vecs[m]->size, " elements"));
    }
  }
  return absl::OkStatus();
}

absl::Status EnqueueExpertUpload(const FfnWeights& weights, const ExpertDeviceLayout& layout,
                                 uint8_t* base, uint16_t* host_staging, bf16* device_staging,
                                 cudaStream_t stream, bool* used_host_staging) {
  const bool fp8 = layout.format == WeightFormat::kFp8E4M3;
  const std::array<const void*, 9> dst = layout.Pointers(base, weights);
  const WeightMatrix* mats[3] = {&weights.gate, &weights.up, &weights.down};
  const size_t count = static_cast<size_t>(layout.hidden * layout.intermediate);
  RETURN_IF_ERROR(layout.Check(weights));
  bool staged = false;
  for (int m = 0; m < 3; ++m) {
    const WeightMatrix& w = *mats[m];
    if (w.blocks.present()) {  // CudaExpertsSupport names them; this guards other callers
      return absl::UnimplementedError("CUDA expert uploads take per-row FP8 scales, not blocks");
    }
    void* out = const_cast<void*>(dst[m]);
    if (fp8 && w.dtype == DType::kF8E4M3 && w.scale != nullptr && w.row_major()) {
      // An FP8 checkpoint's codes and row scales go up as they are: exact, and no staging.
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, w.data, count, cudaMemcpyHostToDevice, stream));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<void*>(dst[3 + m]), w.scale,
                                           static_cast<size_t>(w.out) * sizeof(float),
                                           cudaMemcpyHostToDevice, stream));
      continue;
    }
    const void* src = w.data;
    if (!IsRowMajorBf16(w)) {
      if (host_staging == nullptr) return absl::InternalError("expert upload: no host staging");
      uint16_t* packed = host_staging + m * count;
      RepackToRowMajorBf16(w, packed);
      src = packed;
      staged = true;
    }
    if (!fp8) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, src, count * 2, cudaMemcpyHostToDevice, stream));
      continue;
    }
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device_staging, src, count * 2, cudaMemcpyHostToDevice, stream));
    CUDA_RETURN_IF_ERROR(
        LaunchQuantizeFp8PerChannel(device_staging, w.out, w.in, static_cast<uint8_t*>(out),
                                    static_cast<float*>(const_cast<void*>(dst[3 + m])), stream));
  }
  if (layout.biased) {
    // Biases are small and often strided (gpt-oss interleaves gate and up): always staged.
    uint16_t* next = host_staging + 3 * count;
    const WeightVector* vecs[3] = {&weights.gate_bias, &weights.up_bias, &weights.down_bias};
    for (int m = 0; m < 3; ++m) {
      if (!vecs[m]->present()) continue;
      if (host_staging == nullptr) return absl::InternalError("expert upload: no host staging");
      const std::vector<uint16_t> v = RepackVectorBf16(*vecs[m]);
      std::copy(v.begin(), v.end(), next);
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<void*>(dst[6 + m]), next, v.size() * 2,
                                           cudaMemcpyHostToDevice, stream));
      next += v.size();
      staged = true;
    }
  }
  if (used_host_staging != nullptr) *used_host_staging = staged;
  return absl::OkStatus();
}

ExpertWeightTable ExpertTableOver(const ExpertDeviceLayout& layout, int num_experts,
                                  const void* const* device_pointers) {
  auto at = [&](int entry) { return device_pointers + static_cast<size_t>(entry) * num_experts; };
  ExpertWeightTable t;
  t.format = layout.format;
  t.num_experts = num_experts;
  t.hidden = layout.hidden;
  t.intermediate = layout.intermediate;
  t.gate = at(0);
  t.up = at(1);
  t.down = at(2);
  if (layout.format == WeightFormat::kFp8E4M3) {
    t.gate_scale = reinterpret_cast<const float* const*>(at(3));
    t.up_scale = reinterpret_cast<const float* const*>(at(4));
    t.down_scale = reinterpret_cast<const float* const*>(at(5));
  }
  if (layout.biased) {
    t.gate_bias = reinterpret_cast<const bf16* const*>(at(6));
    t.up_bias = reinterpret_cast<const bf16* const*>(at(7));
    t.down_bias = reinterpret_cast<const bf16* const*>(at(8));
  }
  return t;
}

}  // namespace strata::gpu
