#include "common/backend/cuda/cuda_expert_slots.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/staged_expert_backend.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

// Events of recent launches, reused in turn. A slot remembers the one of its last launch; once
// that event is recorded again for a later launch, waiting on it waits longer than needed but
// never too little (one stream, in order).
constexpr int kRunEvents = 16;
constexpr int kTableEntries = 9;  // ExpertDeviceLayout::Pointers

bool NeedsHostStaging(const FfnWeights& w) {
  return !IsRowMajorBf16(w.gate) || !IsRowMajorBf16(w.up) || !IsRowMajorBf16(w.down) ||
         w.gate_bias.present() || w.up_bias.present() || w.down_bias.present();
}

class CudaExpertSlots : public ExpertSlots, public ExpertBackend {
 public:
  CudaExpertSlots(const ModelConfig& config, CudaExpertSlotOptions options)
      : config_(config),
        options_(options),
        layout_(ExpertDeviceLayout::For(config.hidden_size, config.moe_intermediate_size,
                                        options.format, config.expert_bias)) {}
  ~CudaExpertSlots() override;

  absl::Status Init(int device);

  int num_slots() const override { return options_.num_slots; }
  uint64_t slot_bytes() const override { return layout_.bytes; }
  absl::Status Load(int slot, int layer, int expert, const FfnWeights& weights) override;
  void Release(int slot) override;
  ExpertBackend& backend() override { return *this; }

  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;

  absl::Status Register(absl::Span<const uint8_t> memory);
  absl::Status Unregister(absl::Span<const uint8_t> memory);
  absl::Status WaitForLoads();

 private:
  // One MoE layer's table: a host copy that Load and Release edit, and the device copy the
  // kernels read, refreshed from the host copy before a launch when it changed.
  struct Layer {
    std::vector<const void*> host;  // kTableEntries arrays of num_experts
    DeviceBuffer<const void*> device;
    ExpertWeightTable table;
    std::vector<int> slot_of;  // per expert; -1 when not loaded
    bool dirty = true;
  };
  struct Binding {
    int layer = -1;
    int expert = -1;
  };

  bool IsMoeLayer(int layer) const {
    return layer >= 0 && layer < config_.num_layers &&
           layer < static_cast<int>(config_.layer_is_moe.size()) && config_.layer_is_moe[layer];
  }
  uint8_t* SlotBase(int slot) { return storage_.data() + layout_.bytes * slot; }
  // Both with mu_ held.
  void Unbind(int slot);
  void Bind(int slot, int layer, int expert, const FfnWeights& weights);
  // Checks that every expert `routing` selects is loaded and collects their slots into
  // used_slots_ (mu_ held).
  absl::Status CollectSlots(int layer, const RoutingTable& routing);

  const ModelConfig& config_;
  const CudaExpertSlotOptions options_;
  const ExpertDeviceLayout layout_;
  int device_ = 0;
  std::unique_ptr<CudaContext> context_;  // the compute stream
  cudaStream_t copy_ = nullptr;
  DeviceBuffer<uint8_t> storage_;  // num_slots * layout_.bytes

  // Loads (load_mu_): the staging of repacked or quantized weights, registered host memory.
  std::mutex load_mu_;
  PinnedBuffer<uint16_t> host_staging_;    // allocated by the first Load that repacks
  DeviceBuffer<uint16_t> device_staging_;  // FP8: one bf16 matrix
  cudaEvent_t staging_free_ = nullptr;     // the copy stream is done reading host_staging_
  std::vector<absl::Span<const uint8_t>> registered_;

  // Bindings and the events that order the two streams (mu_).
  std::mutex mu_;
  std::vector<Layer> layers_;  // by layer; empty for dense layers
  std::vector<Binding> bound_;
  std::vector<cudaEvent_t> ready_;  // per slot: its last Load's copies are done
  std::vector<char> pending_;       // per slot: the compute stream has not waited on ready_
  std::vector<int> last_use_;       // per slot: index into run_events_, -1 when never used
  std::vector<cudaEvent_t> run_events_;
  int next_run_event_ = 0;

  // RunExperts (one call at a time).
  HostExpertStaging io_;
  PinnedBuffer<const void*> table_upload_;  // a snapshot of one layer's host table
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<bf16> out_;
  std::vector<int> used_stamp_;  // per slot: the call that last collected it
  std::vector<int> used_slots_;
  int stamp_ = 0;
};

absl::Status CudaExpertSlots::Init(int device) {
  device_ = device;
  const int e_count = config_.num_experts;
  ASSIGN_OR_RETURN(context_, CudaContext::Create({.device = device, .cublas_workspace_bytes = 0}));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(storage_, DeviceBuffer<uint8_t>::Allocate(layout_.bytes * options_.num_slots));
  if (options_.format == WeightFormat::kFp8E4M3) {
    ASSIGN_OR_RETURN(device_staging_, DeviceBuffer<uint16_t>::Allocate(static_cast<size_t>(
                                          config_.hidden_size * config_.moe_intermediate_size)));
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming));
  const int n = options_.num_slots;
  bound_.assign(n, Binding{});
  pending_.assign(n, 0);
  last_use_.assign(n, -1);
  used_stamp_.assign(n, -1);
  ready_.assign(n, nullptr);
  for (cudaEvent_t& e : ready_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  run_events_.assign(kRunEvents, nullptr);
  for (cudaEvent_t& e : run_events_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  const size_t entries = static_cast<size_t>(kTableEntries) * e_count;
  layers_.resize(config_.num_layers);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (!IsMoeLayer(layer)) continue;
    Layer& l = layers_[layer];
    l.host.assign(entries, nullptr);
    l.slot_of.assign(e_count, -1);
    ASSIGN_OR_RETURN(l.device, DeviceBuffer<const void*>::Allocate(entries));
    l.table = ExpertTableOver(layout_, e_count, l.device.data());
  }
  ASSIGN_OR_RETURN(table_upload_, PinnedBuffer<const void*>::Allocate(entries));
  ASSIGN_OR_RETURN(
      io_, HostExpertStaging::Create(options_.max_tokens, config_.top_k, config_.hidden_size));
  ASSIGN_OR_RETURN(workspace_, DeviceBuffer<uint8_t>::Allocate(ExpertWorkspaceBytes(
                                   options_.max_tokens, std::max(config_.top_k, 1),
                                   config_.hidden_size, config_.moe_intermediate_size)));
  ASSIGN_OR_RETURN(out_, DeviceBuffer<bf16>::Allocate(static_cast<size_t>(options_.max_tokens) *
                                                      config_.hidden_size));
  return absl::OkStatus();
}

CudaExpertSlots::~CudaExpertSlots() {
  // Best effort: nothing may still read the slots, the staging or registered memory.
  cudaSetDevice(device_);
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  if (context_ != nullptr) context_->Synchronize().IgnoreError();
  for (absl::Span<const uint8_t> m : registered_) {
    cudaHostUnregister(const_cast<uint8_t*>(m.data()));
  }
  for (cudaEvent_t e : ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : run_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (staging_free_ != nullptr) cudaEventDestroy(staging_free_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
}

void CudaExpertSlots::Unbind(int slot) {
  Binding& b = bound_[slot];
  if (b.layer < 0) return;
  Layer& l = layers_[b.layer];
  l.slot_of[b.expert] = -1;
  for (int j = 0; j < kTableEntries; ++j) {
    l.host[static_cast<size_t>(j) * config_.num_experts + b.expert] = nullptr;
  }
  l.dirty = true;
  b = Binding{};
}

void CudaExpertSlots::Bind(int slot, int layer, int expert, const FfnWeights& weights) {
  Layer& l = layers_[layer];
  const std::array<const void*, 9> p = layout_.Pointers(SlotBase(slot), weights);
  for (int j = 0; j < kTableEntries; ++j) {
    l.host[static_cast<size_t>(j) * config_.num_experts + expert] = p[j];
  }
  l.slot_of[expert] = slot;
  l.dirty = true;
  bound_[slot] = Binding{layer, expert};
  pending_[slot] = 1;
}

absl::Status CudaExpertSlots::Load(int slot, int layer, int expert, const FfnWeights& weights) {
  if (slot < 0 || slot >= options_.num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: slot ", slot, " of ", options_.num_slots));
  }
  if (!IsMoeLayer(layer) || expert < 0 || expert >= config_.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: layer ", layer, " has no expert ", expert));
  }
  RETURN_IF_ERROR(layout_.Check(weights));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> load_lock(load_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int other = layers_[layer].slot_of[expert];
    if (other >= 0 && other != slot) {
      return absl::AlreadyExistsError(absl::StrCat("expert slots: layer ", layer, " expert ",
                                                   expert, " is already in slot ", other));
    }
    Unbind(slot);
    // Not over weights a queued launch still reads.
    if (last_use_[slot] >= 0) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, run_events_[last_use_[slot]], 0));
    }
  }
  if (NeedsHostStaging(weights)) {
    if (host_staging_.data() == nullptr) {
      ASSIGN_OR_RETURN(host_staging_,
                       PinnedBuffer<uint16_t>::Allocate(layout_.host_staging_elements()));
    }
    // The previous Load's copies out of the staging must be done before it is rewritten.
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_free_));
  }
  bool used_staging = false;
  const absl::Status queued =
      EnqueueExpertUpload(weights, layout_, SlotBase(slot), host_staging_.data(),
                          reinterpret_cast<bf16*>(device_staging_.data()), copy_, &used_staging);
  if (!queued.ok()) {
    cudaStreamSynchronize(copy_);  // the slot stays unbound; leave no copy in flight
    return queued;
  }
  if (used_staging) CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_free_, copy_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[slot], copy_));
  std::lock_guard<std::mutex> lock(mu_);
  Bind(slot, layer, expert, weights);
  return absl::OkStatus();
}

void CudaExpertSlots::Release(int slot) {
  if (slot < 0 || slot >= options_.num_slots) return;
  std::lock_guard<std::mutex> lock(mu_);
  Unbind(slot);
}

absl::Status CudaExpertSlots::CollectSlots(int layer, const RoutingTable& routing) {
  const Layer& l = layers_[layer];
  ++stamp_;
  used_slots_.clear();
  for (const int32_t e : routing.expert) {
    if (e < 0) continue;
    if (e >= config_.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert slots: expert id ", e, " of ", config_.num_experts));
    }
    const int slot = l.slot_of[e];
    if (slot < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert slots: layer ", layer, " expert ", e, " is not loaded"));
    }
    if (used_stamp_[slot] != stamp_) {
      used_stamp_[slot] = stamp_;
      used_slots_.push_back(slot);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                         Tensor& out) {
  if (!IsMoeLayer(layer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run experts: layer ", layer, " has no experts"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaStream_t stream = context_->stream();
  RETURN_IF_ERROR(io_.Upload(x, routing, stream));
  const int64_t n = x.rows();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CollectSlots(layer, routing); !s.ok()) {
      cudaStreamSynchronize(stream);  // the staged input's copies; nothing else was queued
      return s;
    }
    if (n == 0) {
      out.Resize(0, config_.hidden_size);
      return absl::OkStatus();
    }
    for (const int slot : used_slots_) {
      if (!pending_[slot]) continue;
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, ready_[slot], 0));
      pending_[slot] = 0;
    }
    Layer& l = layers_[layer];
    if (l.dirty) {
      // From a snapshot: Loads may edit the host table while the copy is still queued.
      std::memcpy(table_upload_.data(), l.host.data(), l.host.size() * sizeof(void*));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.device.data(), table_upload_.data(),
                                           l.host.size() * sizeof(void*), cudaMemcpyHostToDevice,
                                           stream));
      l.dirty = false;
    }
    const RoutingTable device_routing = io_.device_routing();
    const ExpertWorkspace ws = CarveExpertWorkspace(workspace_.data(), n, routing.top_k,
                                                    layout_.hidden, layout_.intermediate);
    CUDA_RETURN_IF_ERROR(LaunchGroupedExperts(
        static_cast<const bf16*>(io_.device_x().device_data()), device_routing.device_expert,
        device_routing.device_weight, n, routing.top_k, l.table, ExpertGluParams(config_), ws,
        out_.data(), stream));
    const int event = next_run_event_;
    next_run_event_ = (next_run_event_ + 1) % kRunEvents;
    CUDA_RETURN_IF_ERROR(cudaEventRecord(run_events_[event], stream));
    for (const int slot : used_slots_) last_use_[slot] = event;
  }
  return io_.Download(out_.data(), stream, out);
}

absl::Status CudaExpertSlots::Register(absl::Span<const uint8_t> memory) {
  if (memory.empty()) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(load_mu_);
  for (absl::Span<const uint8_t> m : registered_) {
    if (m.data() == memory.data()) return absl::OkStatus();
  }
  // The store's segments are mapped read-only; such pages can only be registered read-only.
  int read_only = 0;
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device_));
  const cudaError_t err =
      cudaHostRegister(const_cast<uint8_t*>(memory.data()), memory.size(),
                       read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for the next call's checks
    if (err != cudaErrorHostMemoryAlreadyRegistered) {
      Log(LogLevel::kWarning,
          absl::StrCat("cuda expert slots: cannot pin ", memory.size() >> 20,
                       " MiB of expert memory (", cudaGetErrorString(err),
                       "); loads from it go through the driver's staging copies"));
    }
    return absl::OkStatus();
  }
  registered_.push_back(memory);
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::Unregister(absl::Span<const uint8_t> memory) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(load_mu_);
  auto it = std::find_if(registered_.begin(), registered_.end(),
                         [&](absl::Span<const uint8_t> m) { return m.data() == memory.data(); });
  if (it == registered_.end()) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));  // copies from it must be done
  CUDA_RETURN_IF_ERROR(cudaHostUnregister(const_cast<uint8_t*>(it->data())));
  registered_.erase(it);
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::WaitForLoads() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  return absl::OkStatus();
}

absl::StatusOr<CudaExpertSlots*> AsCuda(ExpertSlots& slots) {
  auto* cuda = dynamic_cast<CudaExpertSlots*>(&slots);
  if (cuda == nullptr) return absl::InvalidArgumentError("expert slots: not CUDA expert slots");
  return cuda;
}

}  // namespace

uint64_t CudaExpertSlotBytes(const ModelConfig& config, WeightFormat format) {
  return ExpertDeviceLayout::For(config.hidden_size, config.moe_intermediate_size, format,
                                 config.expert_bias)
      .bytes;
}

absl::StatusOr<std::unique_ptr<ExpertSlots>> CreateCudaExpertSlots(const ModelConfig& config,
                                                                   int device,
                                                                   CudaExpertSlotOptions options) {
  if (options.num_slots < 1 || options.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cuda expert slots: ", options.num_slots,
                                                   " slots, ", options.max_tokens, " tokens"));
  }
  if (config.num_experts < 1 || config.num_experts > kMaxGroupedExperts || config.hidden_size < 1 ||
      config.moe_intermediate_size < 1) {
    return absl::InvalidArgumentError("cuda expert slots: the model has no usable experts");
  }
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, " does not exist (", CudaDeviceCount(), " CUDA devices)"));
  }
  auto slots = std::make_unique<CudaExpertSlots>(config, options);
  RETURN_IF_ERROR(slots->Init(device));
  return slots;
}

absl::Status RegisterHostMemory(ExpertSlots& slots, absl::Span<const uint8_t> memory) {
  ASSIGN_OR_RETURN(CudaExpertSlots * cuda, AsCuda(slots));
  return cuda->Register(memory);
}

absl::Status UnregisterHostMemory(ExpertSlots& slots, absl::Span<const uint8_t> memory) {
  ASSIGN_OR_RETURN(CudaExpertSlots * cuda, AsCuda(slots));
  return cuda->Unregister(memory);
}

absl::Status WaitForLoads(ExpertSlots& slots) {
  ASSIGN_OR_RETURN(CudaExpertSlots * cuda, AsCuda(slots));
  return cuda->WaitForLoads();
}

}  // namespace strata::gpu
