#include "common/backend/cuda/cuda_expert_backend.h"

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/expert_repack.h"
#include "common/backend/cuda/fp8_quant.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaExpertBackend>> CudaExpertBackend::Create(
    const ModelConfig& config, const ExpertWeightSource& experts, CudaContext* context,
    CudaExpertOptions options) {
  std::unique_ptr<CudaExpertBackend> b(new CudaExpertBackend(config, context, std::move(options)));
  b->layers_.resize(config.num_layers);
  const int64_t h = config.hidden_size, inter = config.moe_intermediate_size;
  if (b->options_.format == WeightFormat::kFp8E4M3) {
    ASSIGN_OR_RETURN(b->staging_, DeviceBuffer<uint16_t>::Allocate(static_cast<size_t>(h * inter)));
  }
  for (int layer = 0; layer < config.num_layers; ++layer) {
    if (!config.layer_is_moe[layer]) continue;
    RETURN_IF_ERROR(b->LoadLayer(layer, experts));
    if (b->options_.on_layer) b->options_.on_layer(layer, config.num_layers, b->bytes_);
  }
  b->staging_.Reset();
  ASSIGN_OR_RETURN(b->workspace_,
                   DeviceBuffer<uint8_t>::Allocate(ExpertWorkspaceBytes(
                       b->options_.max_tokens, std::max(config.top_k, 1), h, inter)));
  ASSIGN_OR_RETURN(b->out_,
                   DeviceBuffer<bf16>::Allocate(static_cast<size_t>(b->options_.max_tokens * h)));
  return b;
}

absl::Status CudaExpertBackend::LoadLayer(int layer, const ExpertWeightSource& experts) {
  const int e_count = config_.num_experts;
  const int64_t h = config_.hidden_size, inter = config_.moe_intermediate_size;
  const bool fp8 = options_.format == WeightFormat::kFp8E4M3;
  const size_t elem = fp8 ? 1 : 2;
  const FfnWeights* first = experts.Find(layer, 0);
  if (first == nullptr) return absl::NotFoundError(absl::StrCat("no experts for layer ", layer));
  const bool biased = first->gate_bias.present();
  // Per expert: gate, up, down (+ scales when FP8, + biases when present), each 256-aligned.
  const size_t matrix = AlignUp(static_cast<size_t>(h * inter) * elem);
  const size_t scales = fp8 ? AlignUp(static_cast<size_t>(inter) * 4) * 2 + AlignUp(h * 4) : 0;
  const size_t biases = biased ? AlignUp(inter * 2) * 2 + AlignUp(h * 2) : 0;
  const size_t per_expert = 3 * matrix + scales + biases;
  Layer& l = layers_[layer];
  ASSIGN_OR_RETURN(l.storage, DeviceBuffer<uint8_t>::Allocate(per_expert * e_count));
  // Host copies of the pointer arrays: gate, up, down, 3 scales, 3 biases, E entries each.
  std::vector<const void*> ptrs(9 * static_cast<size_t>(e_count), nullptr);
  cudaStream_t stream = context_->stream();
  for (int e = 0; e < e_count; ++e) {
    const FfnWeights* ffn = experts.Find(layer, e);
    if (ffn == nullptr) return absl::NotFoundError(absl::StrCat("layer ", layer, " expert ", e));
    uint8_t* base = l.storage.data() + per_expert * e;
    const WeightMatrix* mats[3] = {&ffn->gate, &ffn->up, &ffn->down};
    for (int m = 0; m < 3; ++m) {
      const WeightMatrix& w = *mats[m];
      uint8_t* dst = base + m * matrix;
      ptrs[m * e_count + e] = dst;
      std::vector<uint16_t> packed;
      const void* src = w.data;
      if (!IsRowMajorBf16(w)) {
        packed = RepackToRowMajorBf16(w);
        src = packed.data();
      }
      const size_t count = static_cast<size_t>(w.out * w.in);
      if (!fp8) {
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, count * 2, cudaMemcpyHostToDevice, stream));
      } else {
        float* scale =
            reinterpret_cast<float*>(base + 3 * matrix) + (m == 0   ? 0
                                                           : m == 1 ? AlignUp(inter * 4) / 4
                                                                    : 2 * AlignUp(inter * 4) / 4);
        ptrs[(3 + m) * e_count + e] = scale;
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staging_.data(), src, count * 2, cudaMemcpyHostToDevice, stream));
        CUDA_RETURN_IF_ERROR(LaunchQuantizeFp8PerChannel(
            reinterpret_cast<const bf16*>(staging_.data()), w.out, w.in, dst, scale, stream));
      }
      // Pageable sources: the copy is staged before return, but `packed` and the staging
      // buffer are reused, so wait.
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    }
    if (biased) {
      uint8_t* bias_base = base + 3 * matrix + scales;
      const WeightVector* vecs[3] = {&ffn->gate_bias, &ffn->up_bias, &ffn->down_bias};
      size_t offset = 0;
      for (int m = 0; m < 3; ++m) {
        const std::vector<uint16_t> v = RepackVectorBf16(*vecs[m]);
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bias_base + offset, v.data(), v.size() * 2,
                                             cudaMemcpyHostToDevice, stream));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        ptrs[(6 + m) * e_count + e] = bias_base + offset;
        offset += AlignUp(v.size() * 2);
      }
    }
  }
  ASSIGN_OR_RETURN(l.pointers, DeviceBuffer<uint8_t>::Allocate(ptrs.size() * sizeof(void*)));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.pointers.data(), ptrs.data(), ptrs.size() * sizeof(void*),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  auto table_at = [&](int slot) {
    return reinterpret_cast<const void* const*>(l.pointers.data()) + slot * e_count;
  };
  ExpertWeightTable& t = l.table;
  t.format = options_.format;
  t.num_experts = e_count;
  t.hidden = h;
  t.intermediate = inter;
  t.gate = table_at(0);
  t.up = table_at(1);
  t.down = table_at(2);
  if (fp8) {
    t.gate_scale = reinterpret_cast<const float* const*>(table_at(3));
    t.up_scale = reinterpret_cast<const float* const*>(table_at(4));
    t.down_scale = reinterpret_cast<const float* const*>(table_at(5));
  }
  if (biased) {
    t.gate_bias = reinterpret_cast<const bf16* const*>(table_at(6));
    t.up_bias = reinterpret_cast<const bf16* const*>(table_at(7));
    t.down_bias = reinterpret_cast<const bf16* const*>(table_at(8));
  }
  bytes_ += per_expert * e_count;
  return absl::OkStatus();
}

absl::Status CudaExpertBackend::RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                           Tensor& out) {
  if (layer < 0 || layer >= config_.num_layers || !config_.layer_is_moe[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("run experts: layer ", layer, " has no experts"));
  }
  if (x.device() != Device::kCuda || !routing.on_device()) {
    return absl::InvalidArgumentError("cuda experts: input and routing must be on the device");
  }
  const int64_t n = x.rows();
  if (n > options_.max_tokens) return absl::InvalidArgumentError("cuda experts: step too large");
  const ExpertWeightTable& table = layers_[layer].table;
  const ExpertWorkspace ws =
      CarveExpertWorkspace(workspace_.data(), n, routing.top_k, table.hidden, table.intermediate);
  GluParams glu;
  if (config_.activation == ExpertActivation::kClampedSwiGlu) {
    glu.activation = GluActivation::kClampedSwiGlu;
    glu.alpha = config_.swiglu_alpha;
    glu.limit = config_.swiglu_limit;
  }
  CUDA_RETURN_IF_ERROR(LaunchGroupedExperts(
      static_cast<const bf16*>(x.device_data()), routing.device_expert, routing.device_weight, n,
      routing.top_k, table, glu, ws, out_.data(), context_->stream()));
  out = Tensor::DeviceView(out_.data(), n, config_.hidden_size, keep_alive_);
  return absl::OkStatus();
}

}  // namespace strata::gpu
