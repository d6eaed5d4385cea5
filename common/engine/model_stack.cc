#include "common/engine/model_stack.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/cpu/cpu_router_backend.h"
#include "common/model/checkpoint.h"
#include "common/tensor/dtype.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_router_backend.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/cuda/cuda_status.h"
#endif
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  int index = -1;
  if (device.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", device, "\": use cpu, cuda or cuda:N"));
  }
  return index;
}

absl::StatusOr<std::unique_ptr<ModelStack>> ModelStack::Create(const std::string& model_dir,
                                                               const ModelStackOptions& options) {
  std::unique_ptr<ModelStack> s(new ModelStack());
  s->options_ = options;
  ASSIGN_OR_RETURN(s->device_index_, ParseDevice(options.device));
  auto format_ok = [](const std::string& f) { return f == "bf16" || f == "fp8"; };
  if (s->device_index_ >= 0 && !format_ok(options.expert_weights)) {
    return absl::InvalidArgumentError("expert weights must be bf16 or fp8");
  }
  if (!options.attention_weights.empty() && !format_ok(options.attention_weights)) {
    return absl::InvalidArgumentError("attention weights must be bf16 or fp8");
  }
  ASSIGN_OR_RETURN(s->model_, LoadModel(model_dir));
  RETURN_IF_ERROR(s->CreateKv());
  if (options.local_experts) {
    s->expert_source_ = std::make_unique<ModelExpertSource>(s->model_->weights);
  }
  if (s->device_index_ < 0) {
    RETURN_IF_ERROR(s->CreateCpuBackends());
  } else {
    RETURN_IF_ERROR(s->CreateCudaBackends());
  }
  return s;
}

absl::Status ModelStack::CreateKv() {
  const ModelConfig& c = model_->config;
  KvPoolOptions kv;
  kv.cache = options_.kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.KvHeadDim();
  kv.values_in_keys = c.KvValuesInKeys();
  if (kv.cache.block_size <= 0) {
    return absl::InvalidArgumentError("kv_cache.block_size must be positive");
  }
  // A GPU router keeps the keys and values on its device, in bf16; the host object keeps the
  // tables. The budget counts the bytes where the blocks live.
  kv.host_storage = device_index_ < 0;
  kv.element_bytes = kv.fp8() ? 1 : kv.host_storage ? sizeof(float) : sizeof(uint16_t);
  const int64_t block_bytes = KvBlockBytes(kv);
  const int64_t budget = kv.cache.memory_mb << 20;
  int64_t blocks = budget / block_bytes;
  if (options_.kv_blocks > 0) {
    blocks = options_.kv_blocks;
  } else if (options_.kv_within_context) {
    // One sequence of the longest context, 16-bit (two blocks a block) in an FP8 cache.
    blocks = std::min(blocks, (c.max_position_embeddings + kv.cache.block_size - 1) /
                                  kv.cache.block_size * (kv.fp8() ? 2 : 1));
  }
  if (blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV-cache budget of ", budget, " bytes holds no block; one block needs ", block_bytes));
  }
  kv.num_blocks = static_cast<int>(std::min<int64_t>(blocks, int64_t{1} << 30));
  if (options_.kv_growth_expert_share > 0.0f) {
    // Room to grow into (KvPoolOptions::initial_blocks): addresses only until it is used. The
    // experts as 16-bit, with a tenth more for the slots' scales and biases: no slot is larger.
    int64_t moe_layers = 0;
    for (bool moe : c.layer_is_moe) moe_layers += moe;
    const double expert_bytes = 3.0 * c.hidden_size * c.moe_intermediate_size * 2 * 1.1;
    const double growth =
        options_.kv_growth_expert_share * moe_layers * c.num_experts * expert_bytes;
    kv.initial_blocks = kv.num_blocks;
    kv.num_blocks = static_cast<int>(std::min<int64_t>(
        kv.num_blocks + static_cast<int64_t>(growth / block_bytes), int64_t{1} << 30));
  }
  const int64_t fp16_above = kv.cache.fp16_above_tokens;
  if (kv.fp8() && fp16_above > 0 && fp16_above < c.max_position_embeddings) {
    // A sequence just past the threshold, 16-bit, must fit the pool.
    const int64_t wide_blocks = (fp16_above + kv.cache.block_size) / kv.cache.block_size * 2;
    const int start_blocks = kv.initial_blocks > 0 ? kv.initial_blocks : kv.num_blocks;
    if (wide_blocks > start_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_cache.fp16_above_tokens (", fp16_above, ") cannot fit: a 16-bit sequence of ",
          fp16_above + 1, " tokens takes ", wide_blocks, " blocks, the pool has ", start_blocks,
          " (", block_bytes, " bytes each); raise the KV memory or the threshold"));
    }
  }
  ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(kv));
  kv_ = std::make_unique<PagedKvCache>(std::move(cache));
  if (kv.fp8()) RETURN_IF_ERROR(LoadKvScales());
  return absl::OkStatus();
}

absl::Status ModelStack::LoadKvScales() {
  const Checkpoint& checkpoint = *model_->checkpoint;
  const ModelConfig& c = model_->config;
  KvScales scales;
  int found = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const std::string name =
          absl::StrCat("model.layers.", l, ".self_attn.", which == 0 ? "k_scale" : "v_scale");
      if (!checkpoint.Has(name)) continue;
      ++found;
      absl::StatusOr<TensorRef> t = checkpoint.Get(name, {});
      if (!t.ok()) t = checkpoint.Get(name, {1});
      if (!t.ok()) t = checkpoint.Get(name, {c.num_kv_heads});
      if (!t.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": one scale for the layer or one per KV head (", c.num_kv_heads, ") expected"));
      }
      std::vector<float>& out = which == 0 ? scales.k : scales.v;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        out.push_back(LoadAsFloat(t->data, t->dtype, t->numel() == 1 ? 0 : h));
      }
    }
  }
  if (found == 0) return absl::OkStatus();  // calibrated at run time
  if (found != 2 * c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint has ", found, " of the ", 2 * c.num_layers,
                     " self_attn.k_scale / v_scale tensors: FP8 keys and values need all or none"));
  }
  return kv_->SetScales(std::move(scales));
}

absl::Status ModelStack::CreateCpuBackends() {
  pool_ = std::make_unique<ThreadPool>(options_.num_threads);
  router_ = std::make_unique<CpuRouterBackend>(*model_, *pool_);
  if (options_.local_experts) {
    experts_ = std::make_unique<CpuExpertBackend>(model_->config, *expert_source_, *pool_);
  }
  return absl::OkStatus();
}

absl::Status ModelStack::CreateCudaBackends() {
#if STRATA_HAVE_CUDA
  const ModelConfig& c = model_->config;
  gpu::CudaContext::Options context_options;
  context_options.device = device_index_;
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaContext> context,
                   gpu::CudaContext::Create(context_options));
  gpu::CudaContext* raw = context.get();
  device_context_ = std::shared_ptr<gpu::CudaContext>(std::move(context));
  const int max_tokens = std::max(options_.max_step_tokens, 1);
  const std::string& attention_weights =
      options_.attention_weights.empty() ? options_.expert_weights : options_.attention_weights;
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaRouterBackend> cuda_router,
                   gpu::CudaRouterBackend::Create(
                       *model_, kv_->options(), raw,
                       {.max_tokens = max_tokens,
                        .max_sequences = std::max(options_.max_sequences, 1),
                        .attention_format = gpu::WeightFormatNamed(attention_weights)}));
  router_ = std::move(cuda_router);
  if (!options_.local_experts) return absl::OkStatus();
  gpu::CudaExpertOptions expert_options;
  expert_options.format = gpu::WeightFormatNamed(options_.expert_weights);
  expert_options.max_tokens = max_tokens;
  if (options_.on_progress) {
    expert_options.on_layer = [progress = options_.on_progress](int layer, int layers,
                                                                uint64_t bytes) {
      progress(absl::StrCat("experts of layer ", layer + 1, "/", layers, " on the GPU (",
                            bytes >> 20, " MiB)"));
    };
  }
  ASSIGN_OR_RETURN(
      experts_, gpu::CudaExpertBackend::Create(c, *expert_source_, raw, std::move(expert_options)));
  return absl::OkStatus();
#else
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
#endif
}

absl::Status ModelStack::BindThread() const {
#if STRATA_HAVE_CUDA
  if (device_index_ >= 0) CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index_));
#endif
  return absl::OkStatus();
}

ModelStack::~ModelStack() = default;

}  // namespace strata
