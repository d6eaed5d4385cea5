#include "common/backend/cuda/cuda_expert_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/expert_repack.h"
#include "common/backend/cuda_model_support.h"
#include "common/cuda/kernels/fp8_quant.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

GluParams ExpertGluParams(const ModelConfig& config) {
  GluParams glu;
  if (config.activation == ExpertActivation::kClampedSwiGlu) {
    glu.activation = GluActivation::kClampedSwiGlu;
    glu.alpha = config.swiglu_alpha;
    glu.limit = config.swiglu_limit;
  }
  return glu;
}

absl::StatusOr<std::unique_ptr<CudaExpertBackend>> CudaExpertBackend::Create(
    const ModelConfig& config, const ExpertWeightSource& experts, CudaContext* context,
    CudaExpertOptions options) {
  RETURN_IF_ERROR(CudaExpertsSupport(config));
  std::unique_ptr<CudaExpertBackend> b(new CudaExpertBackend(config, context, std::move(options)));
  b->layers_.resize(config.num_layers);
  const int64_t h = config.hidden_size, inter = config.moe_intermediate_size;
  if (b->options_.format == WeightFormat::kFp8E4M3) {
    ASSIGN_OR_RETURN(b->staging_, DeviceBuffer<uint16_t>::Allocate(static_cast<size_t>(h * inter)));
  }
  // Room for a whole repacked expert and its biases.
  ASSIGN_OR_RETURN(
      b->host_staging_,
      PinnedBuffer<uint16_t>::Allocate(
          ExpertDeviceLayout::For(h, inter, b->options_.format, true).host_staging_elements()));
  for (int layer = 0; layer < config.num_layers; ++layer) {
    if (!config.layer_is_moe[layer]) continue;
    RETURN_IF_ERROR(b->LoadLayer(layer, experts));
    if (b->options_.on_layer) b->options_.on_layer(layer, config.num_layers, b->bytes_);
  }
  b->staging_.Reset();
  b->host_staging_ = PinnedBuffer<uint16_t>();
  ASSIGN_OR_RETURN(b->workspace_,
                   DeviceBuffer<uint8_t>::Allocate(ExpertWorkspaceBytes(
                       b->options_.max_tokens, std::max(config.top_k, 1), h, inter)));
  ASSIGN_OR_RETURN(b->out_,
                   DeviceBuffer<bf16>::Allocate(static_cast<size_t>(b->options_.max_tokens * h)));
  return b;
}

absl::Status CudaExpertBackend::LoadLayer(int layer, const ExpertWeightSource& experts) {
  const int e_count = config_.num_experts;
  const FfnWeights* first = experts.Find(layer, 0);
  if (first == nullptr) return absl::NotFoundError(absl::StrCat("no experts for layer ", layer));
  const ExpertDeviceLayout layout =
      ExpertDeviceLayout::For(config_.hidden_size, config_.moe_intermediate_size, options_.format,
                              first->gate_bias.present());
  Layer& l = layers_[layer];
  ASSIGN_OR_RETURN(l.storage, DeviceBuffer<uint8_t>::Allocate(layout.bytes * e_count));
  // Host copies of the pointer arrays: 9 arrays (ExpertDeviceLayout::Pointers order) of E.
  std::vector<const void*> ptrs(9 * static_cast<size_t>(e_count), nullptr);
  cudaStream_t stream = context_->stream();
  for (int e = 0; e < e_count; ++e) {
    const FfnWeights* ffn = experts.Find(layer, e);
    if (ffn == nullptr) return absl::NotFoundError(absl::StrCat("layer ", layer, " expert ", e));
    uint8_t* base = l.storage.data() + layout.bytes * e;
    RETURN_IF_ERROR(EnqueueExpertUpload(*ffn, layout, base, host_staging_.data(),
                                        reinterpret_cast<bf16*>(staging_.data()), stream));
    // The staging buffers are reused by the next expert.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const std::array<const void*, 9> p = layout.Pointers(base, *ffn);
    for (int j = 0; j < 9; ++j) ptrs[j * e_count + e] = p[j];
  }
  ASSIGN_OR_RETURN(l.pointers, DeviceBuffer<uint8_t>::Allocate(ptrs.size() * sizeof(void*)));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.pointers.data(), ptrs.data(), ptrs.size() * sizeof(void*),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  l.table =
      ExpertTableOver(layout, e_count, reinterpret_cast<const void* const*>(l.pointers.data()));
  bytes_ += layout.bytes * e_count;
  return absl::OkStatus();
}

absl::Status CudaExpertBackend::RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                           Tensor& out) {
  if (x.device() != Device::kCuda || !routing.on_device()) {
    return absl::InvalidArgumentError("cuda experts: input and routing must be on the device");
  }
  const int64_t n = x.rows();
  RETURN_IF_ERROR(RunExpertsInto(layer, static_cast<const bf16*>(x.device_data()),
                                 routing.device_expert, routing.device_weight, n, routing.top_k,
                                 out_.data()));
  out = Tensor::DeviceView(out_.data(), n, config_.hidden_size, keep_alive_);
  return absl::OkStatus();
}

absl::Status CudaExpertBackend::RunExpertsInto(int layer, const bf16* x, const int32_t* ids,
                                               const float* weights, int64_t n, int top_k,
                                               bf16* out, const GridSignal& signal) {
  if (layer < 0 || layer >= config_.num_layers || !config_.layer_is_moe[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("run experts: layer ", layer, " has no experts"));
  }
  if (n > options_.max_tokens) return absl::InvalidArgumentError("cuda experts: step too large");
  if (top_k > std::max(config_.top_k, 1)) {
    return absl::InvalidArgumentError("cuda experts: more slots a token than the model's top_k");
  }
  const ExpertWeightTable& table = layers_[layer].table;
  const ExpertWorkspace ws =
      CarveExpertWorkspace(workspace_.data(), n, top_k, table.hidden, table.intermediate);
  CUDA_RETURN_IF_ERROR(LaunchGroupedExperts(x, ids, weights, n, top_k, table,
                                            ExpertGluParams(config_), ws, out, context_->stream(),
                                            signal));
  return absl::OkStatus();
}

}  // namespace strata::gpu
