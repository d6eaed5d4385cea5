#include "common/backend/cuda/cuda_expert_slots.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/device_experts.h"
#include "common/backend/cuda/host_regions.h"
#include "common/backend/cuda/host_tier_split.h"
#include "common/backend/cuda/staged_expert_backend.h"
#include "common/backend/cuda_model_support.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/cuda/virtual_device_memory.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

constexpr int kTableEntries = 9;  // ExpertDeviceLayout::Pointers
// Snapshots of the tables on their way to the device, reused in turn: one is rewritten only once
// its copy has run, which with at most two replays in flight is long done.
constexpr int kSnapshots = 8;
using Entries = std::array<const void*, kTableEntries>;

bool NeedsHostStaging(const FfnWeights& w) {
  return !IsRowMajorBf16(w.gate) || !IsRowMajorBf16(w.up) || !IsRowMajorBf16(w.down) ||
         w.gate_bias.present() || w.up_bias.present() || w.down_bias.present();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether `event` has completed: kDone, kPending, or an error (left to the caller to report). The
// runtime's last error is cleared either way, so that no later launch check sees it.
enum class EventState { kDone, kPending, kFailed };
EventState Query(cudaEvent_t event) {
  const cudaError_t state = cudaEventQuery(event);
  cudaGetLastError();
  if (state == cudaSuccess) return EventState::kDone;
  return state == cudaErrorNotReady ? EventState::kPending : EventState::kFailed;
}

class CudaExpertSlots : public ExpertSlots, public ExpertBackend, public DeviceExperts {
 public:
  CudaExpertSlots(const ModelConfig& config, CudaExpertSlotOptions options, int device)
      : config_(config),
        options_(options),
        layout_(ExpertDeviceLayout::For(config.hidden_size, config.moe_intermediate_size,
                                        options.format, config.expert_bias)),
        regions_(device),
        device_(device) {}
  ~CudaExpertSlots() override;

  absl::Status Init();

  // ExpertSlots.
  int num_slots() const override { return options_.num_slots; }
  uint64_t slot_bytes() const override { return layout_.bytes; }
  absl::Status SetUsableSlots(int n) override;
  int usable_slots() const override { return usable_.load(); }
  absl::Status Load(int slot, int layer, int expert, const FfnWeights& weights) override;
  void Release(int slot) override;
  absl::Status SetCold(int layer, int expert, const FfnWeights& weights) override;
  bool cold_readable_in_place() const override;
  ExpertBackend& backend() override { return *this; }
  DeviceExperts* device_experts() override { return this; }
  void SetResidency(SlotResidency* residency) override { residency_ = residency; }
  void SetHostTier(HostExpertTier* tier) override { host_tier_ = tier; }

  // ExpertBackend: host activations staged through pinned buffers.
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;

  // DeviceExperts.
  CudaContext* context() const override { return context_.get(); }
  absl::Status RunExpertsInto(int layer, const bf16* x, const int32_t* ids, const float* weights,
                              int64_t n, int top_k, bf16* out, const GridSignal& signal) override;
  absl::Status PrepareLayer(int layer, const int32_t* ids, int64_t n, int top_k) override;
  absl::Status PrepareReplay() override;
  absl::Status AfterReply() override;

  absl::Status RegisterHostMemory(absl::Span<const uint8_t> memory) override {
    return regions_.Register(memory);
  }
  absl::Status UnregisterHostMemory(absl::Span<const uint8_t> memory) override;
  absl::Status StartLoads() override;
  absl::Status WaitForLoads() override;

 private:
  // A slot's weights: none; a load queued (copied at the next Sync); being copied; bound (the
  // tables point at it once uploaded).
  enum class Phase { kEmpty, kQueued, kCopying, kBound };
  struct Slot {
    Phase phase = Phase::kEmpty;
    int layer = -1;
    int expert = -1;
    FfnWeights weights;  // what a queued load copies
  };
  // One MoE layer's table: a host copy that Load, Release and SetCold edit, and the device copy
  // the kernels read, refreshed from a snapshot of the host copy at Sync when it changed.
  struct Layer {
    std::vector<const void*> host;      // kTableEntries arrays of num_experts
    std::vector<const void*> in_place;  // the same, for each expert's weights where they are
    std::vector<char> cold;             // SetCold named the expert
    DeviceBuffer<const void*> device;
    ExpertWeightTable table;    // eager launches
    ExpertWeightTable counted;  // captured launches: with the layer's use counts
    std::vector<int> slot_of;   // per expert: the slot holding or loading it, or -1
    bool dirty = true;
  };

  bool IsMoeLayer(int layer) const {
    return layer >= 0 && layer < config_.num_layers &&
           layer < static_cast<int>(config_.layer_is_moe.size()) && config_.layer_is_moe[layer];
  }
  uint8_t* SlotBase(int slot) { return storage_.data() + layout_.bytes * slot; }
  bool ReadableInPlace(const Layer& l, int expert) const {
    return l.in_place[expert] != nullptr;  // entry 0: the gate matrix
  }
  // The rest with mu_ held.
  void SetEntries(Layer& l, int expert, const Entries& p);
  Entries InPlaceEntries(const Layer& l, int expert) const;
  void Unbind(int slot);
  void Bind(int slot);
  // Makes the device tables what the host ones say, in stream order: loads whose copies are
  // done are bound; the tables go up (so an evicted expert is read in place from here on); the
  // queued loads' copies start behind everything queued so far; then, with `wait`, or for an
  // expert that cannot be read in place, the compute stream waits for its copy and the tables
  // go up again. `layer` >= 0: an eager run of that layer, which reads its own table only, so
  // the copies of other layers' loads (prefetches) go on behind it.
  absl::Status Sync(bool wait, int layer = -1);
  absl::Status UploadDirty();
  absl::Status IssueQueued();
  // Uses counted by replays that finished since the last call (their reads landed).
  void CollectUses(std::vector<ExpertUse>& uses);
  // A read of the counts queued behind the replays queued so far (unless two are pending).
  absl::Status QueueUsesRead();
  // The distinct experts of [count] device ids, and the tokens of each (reads the ids).
  absl::Status ReadExperts(const int32_t* ids, int64_t count);
  // The grouped expert kernels on the compute stream, with mu_ held.
  absl::Status Launch(int layer, const bf16* x, const int32_t* ids, const float* weights, int64_t n,
                      int top_k, bf16* out, const GridSignal& signal, bool capturing);
  // Logs why, abandons the host tier and stops using it (its experts are loaded from here on).
  void DropHostTier(const absl::Status& why);
  // An eager run whose PrepareLayer sent some experts to the host tier.
  absl::Status RunSplit(int layer, const bf16* x, const int32_t* ids, const float* weights,
                        int64_t n, int top_k, bf16* out);

  const ModelConfig& config_;
  const CudaExpertSlotOptions options_;
  const ExpertDeviceLayout layout_;
  HostRegions regions_;
  const int device_;
  std::unique_ptr<CudaContext> context_;  // the compute stream
  cudaStream_t copy_ = nullptr;
  // num_slots * layout_.bytes of addresses, backed for the first usable_ slots.
  VirtualDeviceMemory storage_;
  std::atomic<int> usable_{0};
  SlotResidency* residency_ = nullptr;

  std::mutex mu_;              // everything below
  std::vector<Layer> layers_;  // by layer; empty for dense layers
  std::vector<Slot> slots_;
  std::vector<int> queued_, copying_;      // slots in those phases
  std::vector<cudaEvent_t> ready_;         // per slot: its last copy is done
  cudaEvent_t tables_up_ = nullptr;        // recorded after an upload; copies wait for it
  PinnedBuffer<uint16_t> host_staging_;    // allocated by the first load that repacks
  DeviceBuffer<uint16_t> device_staging_;  // FP8: one bf16 matrix
  cudaEvent_t staging_free_ = nullptr;     // the copy stream is done reading host_staging_
  PinnedBuffer<const void*> snapshots_;    // kSnapshots x layers x entries
  cudaEvent_t snapshot_done_[kSnapshots] = {};
  int next_snapshot_ = 0;
  // Use counts: [layer][expert] on the device, read back in turn into two pinned copies.
  DeviceBuffer<uint32_t> uses_;
  PinnedBuffer<uint32_t> uses_read_[2];
  cudaEvent_t uses_ready_[2] = {};
  bool uses_pending_[2] = {false, false};
  int uses_next_ = 0;                // the copy the next read goes to (and the oldest pending)
  std::vector<uint32_t> uses_seen_;  // the counts already handed out

  // Runs (one call at a time).
  HostExpertStaging io_;
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<bf16> out_;
  PinnedBuffer<int32_t> ids_host_;
  std::vector<int> used_experts_;
  std::vector<int64_t> used_tokens_;
  std::vector<int> position_;  // per expert; -1 between calls
  // The host tier (null: none) and the experts BeforeLayer sent there for the eager run of
  // host_layer_ (-1: none pending).
  HostExpertTier* host_tier_ = nullptr;
  std::unique_ptr<HostTierSplit> split_;
  int host_layer_ = -1;
  std::vector<int> host_experts_;
  int64_t host_slots_ = 0;  // n * top_k of the routing in ids_host_
};

absl::Status CudaExpertSlots::Init() {
  const int e_count = config_.num_experts;
  ASSIGN_OR_RETURN(context_, CudaContext::Create({.device = device_, .cublas_workspace_bytes = 0}));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  const int usable = options_.usable_slots < 0
                         ? options_.num_slots
                         : std::min(options_.usable_slots, options_.num_slots);
  ASSIGN_OR_RETURN(storage_,
                   VirtualDeviceMemory::Create(device_, layout_.bytes * options_.num_slots,
                                               layout_.bytes * usable));
  usable_.store(usable);
  if (options_.format == WeightFormat::kFp8E4M3) {
    ASSIGN_OR_RETURN(device_staging_, DeviceBuffer<uint16_t>::Allocate(static_cast<size_t>(
                                          config_.hidden_size * config_.moe_intermediate_size)));
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&tables_up_, cudaEventDisableTiming));
  slots_.assign(options_.num_slots, Slot{});
  ready_.assign(options_.num_slots, nullptr);
  for (cudaEvent_t& e : ready_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  const size_t entries = static_cast<size_t>(kTableEntries) * e_count;
  const size_t uses = static_cast<size_t>(config_.num_layers) * e_count;
  ASSIGN_OR_RETURN(uses_, DeviceBuffer<uint32_t>::Allocate(uses));
  CUDA_RETURN_IF_ERROR(cudaMemset(uses_.data(), 0, uses * sizeof(uint32_t)));
  uses_seen_.assign(uses, 0);
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(uses_read_[i], PinnedBuffer<uint32_t>::Allocate(uses));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&uses_ready_[i], cudaEventDisableTiming));
  }
  layers_.resize(config_.num_layers);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (!IsMoeLayer(layer)) continue;
    Layer& l = layers_[layer];
    l.host.assign(entries, nullptr);
    l.in_place.assign(entries, nullptr);
    l.cold.assign(e_count, 0);
    l.slot_of.assign(e_count, -1);
    ASSIGN_OR_RETURN(l.device, DeviceBuffer<const void*>::Allocate(entries));
    CUDA_RETURN_IF_ERROR(cudaMemset(l.device.data(), 0, entries * sizeof(void*)));
    l.table = ExpertTableOver(layout_, e_count, l.device.data());
    l.counted = l.table;
    l.counted.use_counts = uses_.data() + static_cast<size_t>(layer) * e_count;
  }
  ASSIGN_OR_RETURN(snapshots_, PinnedBuffer<const void*>::Allocate(static_cast<size_t>(kSnapshots) *
                                                                   config_.num_layers * entries));
  for (cudaEvent_t& e : snapshot_done_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ASSIGN_OR_RETURN(
      io_, HostExpertStaging::Create(options_.max_tokens, config_.top_k, config_.hidden_size));
  ASSIGN_OR_RETURN(workspace_, DeviceBuffer<uint8_t>::Allocate(ExpertWorkspaceBytes(
                                   options_.max_tokens, std::max(config_.top_k, 1),
                                   config_.hidden_size, config_.moe_intermediate_size)));
  ASSIGN_OR_RETURN(out_, DeviceBuffer<bf16>::Allocate(static_cast<size_t>(options_.max_tokens) *
                                                      config_.hidden_size));
  ASSIGN_OR_RETURN(ids_host_,
                   PinnedBuffer<int32_t>::Allocate(static_cast<size_t>(options_.max_tokens) *
                                                   std::max(config_.top_k, 1)));
  position_.assign(e_count, -1);
  return absl::OkStatus();
}

CudaExpertSlots::~CudaExpertSlots() {
  // Best effort: nothing may still read the slots, the staging or registered memory.
  cudaSetDevice(device_);
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  if (context_ != nullptr) context_->Synchronize().IgnoreError();
  for (cudaEvent_t e : ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : snapshot_done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : uses_ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : {staging_free_, tables_up_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
}

void CudaExpertSlots::SetEntries(Layer& l, int expert, const Entries& p) {
  for (int j = 0; j < kTableEntries; ++j) {
    l.host[static_cast<size_t>(j) * config_.num_experts + expert] = p[j];
  }
  l.dirty = true;
}

Entries CudaExpertSlots::InPlaceEntries(const Layer& l, int expert) const {
  Entries p{};
  for (int j = 0; j < kTableEntries; ++j) {
    p[j] = l.in_place[static_cast<size_t>(j) * config_.num_experts + expert];
  }
  return p;
}

void CudaExpertSlots::Unbind(int slot) {
  Slot& s = slots_[slot];
  if (s.phase == Phase::kEmpty) return;
  Layer& l = layers_[s.layer];
  l.slot_of[s.expert] = -1;
  SetEntries(l, s.expert, InPlaceEntries(l, s.expert));  // null where not readable in place
  auto drop = [slot](std::vector<int>& list) {
    list.erase(std::remove(list.begin(), list.end(), slot), list.end());
  };
  // A copy already under way runs on into a slot nobody reads; a later load's copy queues
  // behind it on the copy stream.
  if (s.phase == Phase::kQueued) drop(queued_);
  if (s.phase == Phase::kCopying) drop(copying_);
  s = Slot{};
}

void CudaExpertSlots::Bind(int slot) {
  Slot& s = slots_[slot];
  SetEntries(layers_[s.layer], s.expert, layout_.Pointers(SlotBase(slot), s.weights));
  s.phase = Phase::kBound;
  copying_.erase(std::remove(copying_.begin(), copying_.end(), slot), copying_.end());
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
  std::lock_guard<std::mutex> lock(mu_);
  if (slot >= usable_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert slots: slot ", slot, " is past the ", usable_.load(), " in use"));
  }
  Layer& l = layers_[layer];
  const int other = l.slot_of[expert];
  if (other >= 0 && other != slot) {
    return absl::AlreadyExistsError(absl::StrCat("expert slots: layer ", layer, " expert ", expert,
                                                 " is already in slot ", other));
  }
  Unbind(slot);
  Slot& s = slots_[slot];
  s.phase = Phase::kQueued;
  s.layer = layer;
  s.expert = expert;
  s.weights = weights;
  l.slot_of[expert] = slot;
  queued_.push_back(slot);
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::SetUsableSlots(int n) {
  if (n < 0 || n > options_.num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: ", n, " in use of ", options_.num_slots));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(mu_);
  const int usable = usable_.load();
  for (int slot = n; slot < usable; ++slot) {
    if (slots_[slot].phase != Phase::kEmpty) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert slots: slot ", slot, " still holds an expert"));
    }
  }
  if (n > usable) {
    RETURN_IF_ERROR(storage_.Commit(layout_.bytes * n));
    usable_.store(n);
    return absl::OkStatus();
  }
  if (n == usable) return absl::OkStatus();
  // The tables stop pointing into the slots given back (their experts were released), then
  // every launch queued so far and every copy into them must be done before the memory goes.
  RETURN_IF_ERROR(UploadDirty());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->stream()));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  RETURN_IF_ERROR(storage_.Commit(layout_.bytes * n));
  usable_.store(n);
  return absl::OkStatus();
}

void CudaExpertSlots::Release(int slot) {
  if (slot < 0 || slot >= options_.num_slots) return;
  std::lock_guard<std::mutex> lock(mu_);
  Unbind(slot);
}

absl::Status CudaExpertSlots::SetCold(int layer, int expert, const FfnWeights& weights) {
  if (!IsMoeLayer(layer) || expert < 0 || expert >= config_.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: layer ", layer, " has no expert ", expert));
  }
  RETURN_IF_ERROR(layout_.Check(weights));
  // Readable in place only as the kernels read a slot: row-major matrices of the slots' type
  // (FP8 with float row scales), bf16 biases, 16-byte aligned, inside registered memory.
  const bool fp8 = layout_.format == WeightFormat::kFp8E4M3;
  const DType type = fp8 ? DType::kF8E4M3 : DType::kBF16;
  const size_t elem = fp8 ? 1 : 2;
  Entries p{};
  bool readable = true;
  const WeightMatrix* mats[3] = {&weights.gate, &weights.up, &weights.down};
  for (int m = 0; m < 3 && readable; ++m) {
    const WeightMatrix& w = *mats[m];
    readable = w.dtype == type && w.row_major() && Aligned16(w.data) && (!fp8 || w.scale);
    if (!readable) break;
    p[m] = regions_.DeviceAddress(w.data, static_cast<size_t>(w.out * w.in) * elem);
    if (fp8) p[3 + m] = regions_.DeviceAddress(w.scale, static_cast<size_t>(w.out) * 4);
    readable = p[m] != nullptr && (!fp8 || p[3 + m] != nullptr);
  }
  const WeightVector* biases[3] = {&weights.gate_bias, &weights.up_bias, &weights.down_bias};
  for (int m = 0; m < 3 && readable && layout_.biased; ++m) {
    const WeightVector& b = *biases[m];
    if (!b.present()) continue;
    readable = b.dtype == DType::kBF16 && b.stride == 1;
    if (readable) p[6 + m] = regions_.DeviceAddress(b.data, static_cast<size_t>(b.size) * 2);
    readable = readable && p[6 + m] != nullptr;
  }
  if (!readable) p = Entries{};
  std::lock_guard<std::mutex> lock(mu_);
  Layer& l = layers_[layer];
  for (int j = 0; j < kTableEntries; ++j) {
    l.in_place[static_cast<size_t>(j) * config_.num_experts + expert] = p[j];
  }
  l.cold[expert] = 1;
  if (l.slot_of[expert] < 0) SetEntries(l, expert, p);
  return absl::OkStatus();
}

bool CudaExpertSlots::cold_readable_in_place() const {
  for (const Layer& l : layers_) {
    for (size_t e = 0; e < l.cold.size(); ++e) {
      if (l.cold[e] && !ReadableInPlace(l, static_cast<int>(e))) return false;
    }
  }
  return true;
}

absl::Status CudaExpertSlots::UploadDirty() {
  cudaStream_t stream = context_->stream();
  const size_t entries = static_cast<size_t>(kTableEntries) * config_.num_experts;
  bool any = false;
  for (const Layer& l : layers_) any = any || (l.dirty && !l.host.empty());
  if (!any) return absl::OkStatus();
  const int gen = next_snapshot_;
  next_snapshot_ = (next_snapshot_ + 1) % kSnapshots;
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(snapshot_done_[gen]));  // its last copy has run
  const void** base = snapshots_.data() + static_cast<size_t>(gen) * config_.num_layers * entries;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    Layer& l = layers_[layer];
    if (!l.dirty || l.host.empty()) continue;
    // From a snapshot: the host table may change again before the copy runs.
    const void** snapshot = base + static_cast<size_t>(layer) * entries;
    std::memcpy(snapshot, l.host.data(), entries * sizeof(void*));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.device.data(), snapshot, entries * sizeof(void*),
                                         cudaMemcpyHostToDevice, stream));
    l.dirty = false;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(snapshot_done_[gen], stream));
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::IssueQueued() {
  if (queued_.empty()) return absl::OkStatus();
  // Behind every launch queued so far, which may still read what the slots held.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(tables_up_, context_->stream()));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, tables_up_, 0));
  const std::vector<int> queued = std::move(queued_);
  queued_.clear();
  for (const int slot : queued) {
    Slot& s = slots_[slot];
    if (NeedsHostStaging(s.weights)) {
      if (host_staging_.data() == nullptr) {
        ASSIGN_OR_RETURN(host_staging_,
                         PinnedBuffer<uint16_t>::Allocate(layout_.host_staging_elements()));
      }
      // The previous load's copies out of the staging must be done before it is rewritten.
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_free_));
    }
    bool used_staging = false;
    const absl::Status queued_copy =
        EnqueueExpertUpload(s.weights, layout_, SlotBase(slot), host_staging_.data(),
                            reinterpret_cast<bf16*>(device_staging_.data()), copy_, &used_staging);
    if (!queued_copy.ok()) {
      cudaStreamSynchronize(copy_);  // leave no copy in flight
      Unbind(slot);
      return queued_copy;
    }
    if (used_staging) CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_free_, copy_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[slot], copy_));
    s.phase = Phase::kCopying;
    copying_.push_back(slot);
  }
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::Sync(bool wait, int layer) {
  for (const int slot : std::vector<int>(copying_)) {
    const EventState state = Query(ready_[slot]);
    if (state == EventState::kDone) Bind(slot);
    if (state == EventState::kFailed)
      return absl::InternalError("expert slots: a load's copy failed");
  }
  RETURN_IF_ERROR(UploadDirty());
  RETURN_IF_ERROR(IssueQueued());
  bool bound = false;
  for (const int slot : std::vector<int>(copying_)) {
    const Slot& s = slots_[slot];
    if (layer >= 0 && s.layer != layer) continue;
    if (!wait && ReadableInPlace(layers_[s.layer], s.expert)) continue;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(context_->stream(), ready_[slot], 0));
    Bind(slot);
    bound = true;
  }
  if (bound) RETURN_IF_ERROR(UploadDirty());
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
    const Layer& l = layers_[layer];
    for (const int32_t e : routing.expert) {
      if (e < 0) continue;
      absl::Status bad;
      if (e >= config_.num_experts) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("expert slots: expert id ", e, " of ", config_.num_experts));
      } else if (l.slot_of[e] < 0) {
        bad = absl::FailedPreconditionError(
            absl::StrCat("expert slots: layer ", layer, " expert ", e, " is not loaded"));
      }
      if (!bad.ok()) {
        cudaStreamSynchronize(stream);  // the staged input's copies; nothing else was queued
        return bad;
      }
    }
    if (n == 0) {
      out.Resize(0, config_.hidden_size);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(Sync(/*wait=*/true, layer));
    const RoutingTable device_routing = io_.device_routing();
    const ExpertWorkspace ws = CarveExpertWorkspace(workspace_.data(), n, routing.top_k,
                                                    layout_.hidden, layout_.intermediate);
    CUDA_RETURN_IF_ERROR(LaunchGroupedExperts(
        static_cast<const bf16*>(io_.device_x().device_data()), device_routing.device_expert,
        device_routing.device_weight, n, routing.top_k, l.table, ExpertGluParams(config_), ws,
        out_.data(), stream));
  }
  return io_.Download(out_.data(), stream, out);
}

absl::Status CudaExpertSlots::RunExpertsInto(int layer, const bf16* x, const int32_t* ids,
                                             const float* weights, int64_t n, int top_k, bf16* out,
                                             const GridSignal& signal) {
  if (!IsMoeLayer(layer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run experts: layer ", layer, " has no experts"));
  }
  if (n > options_.max_tokens || top_k <= 0 || top_k > std::max(config_.top_k, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert slots: ", n, " tokens x ", top_k, " do not fit the workspace"));
  }
  cudaStream_t stream = context_->stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  // Eager runs raise no signal: the link records an event after them.
  const bool split = !capturing && signal.count == 0 && host_layer_ == layer &&
                     host_slots_ == n * top_k && host_tier_ != nullptr;
  host_layer_ = -1;
  if (split) return RunSplit(layer, x, ids, weights, n, top_k, out);
  std::lock_guard<std::mutex> lock(mu_);
  // A replay reads the tables as PrepareReplay left them; an eager run brings them up to date.
  if (!capturing) RETURN_IF_ERROR(Sync(/*wait=*/true, layer));
  return Launch(layer, x, ids, weights, n, top_k, out, signal, capturing);
}

absl::Status CudaExpertSlots::Launch(int layer, const bf16* x, const int32_t* ids,
                                     const float* weights, int64_t n, int top_k, bf16* out,
                                     const GridSignal& signal, bool capturing) {
  const Layer& l = layers_[layer];
  const ExpertWorkspace ws =
      CarveExpertWorkspace(workspace_.data(), n, top_k, layout_.hidden, layout_.intermediate);
  CUDA_RETURN_IF_ERROR(
      LaunchGroupedExperts(x, ids, weights, n, top_k, capturing ? l.counted : l.table,
                           ExpertGluParams(config_), ws, out, context_->stream(), signal));
  return absl::OkStatus();
}

void CudaExpertSlots::DropHostTier(const absl::Status& why) {
  Log(LogLevel::kWarning, absl::StrCat("CPU tier failed (", why.message(),
                                       "); its experts are loaded into slots instead"));
  host_tier_->Abandon();
  host_tier_ = nullptr;
}

absl::Status CudaExpertSlots::RunSplit(int layer, const bf16* x, const int32_t* ids,
                                       const float* weights, int64_t n, int top_k, bf16* out) {
  cudaStream_t stream = context_->stream();
  absl::StatusOr<const int32_t*> device_ids =
      split_->Begin(layer, absl::MakeConstSpan(ids_host_.data(), n * top_k), host_experts_, x,
                    weights, n, top_k, *host_tier_, stream);
  absl::Status status = device_ids.status();
  if (status.ok()) {
    absl::Status launched;
    {
      std::lock_guard<std::mutex> lock(mu_);
      launched = Sync(/*wait=*/true, layer);
      if (launched.ok()) {
        launched = Launch(layer, x, *device_ids, weights, n, top_k, out, {}, false);
      }
    }
    if (!launched.ok()) {
      DropHostTier(launched);  // its answer to this layer will not be collected
      return launched;
    }
    status = split_->Finish(out, n, *host_tier_, stream);
    if (status.ok()) return absl::OkStatus();
  }
  // The host tier failed or went away: load those experts and run the whole layer here.
  DropHostTier(status);
  RETURN_IF_ERROR(residency_->EnsureResident(layer, host_experts_, used_experts_));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Sync(/*wait=*/true, layer));
  return Launch(layer, x, ids, weights, n, top_k, out, {}, false);
}

absl::Status CudaExpertSlots::ReadExperts(const int32_t* ids, int64_t count) {
  cudaStream_t stream = context_->stream();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_host_.data(), ids, count * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // Ids out of range run nothing (the kernels skip them): they need no slot either.
  DistinctExperts(absl::MakeConstSpan(ids_host_.data(), count), config_.num_experts, used_experts_,
                  used_tokens_, position_)
      .IgnoreError();
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::PrepareLayer(int layer, const int32_t* ids, int64_t n, int top_k) {
  if (residency_ == nullptr || !IsMoeLayer(layer)) return absl::OkStatus();
  if (n * top_k > static_cast<int64_t>(ids_host_.size())) {
    return absl::InvalidArgumentError("expert slots: routing larger than a step");
  }
  RETURN_IF_ERROR(ReadExperts(ids, n * top_k));
  // Loads and releases come back here (mu_ is not held); RunExpertsInto then syncs.
  host_layer_ = -1;
  if (host_tier_ == nullptr)
    return residency_->BeforeLayer(layer, used_experts_, used_tokens_, nullptr);
  RETURN_IF_ERROR(residency_->BeforeLayer(layer, used_experts_, used_tokens_, &host_experts_));
  if (host_experts_.empty()) return absl::OkStatus();
  if (split_ == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    absl::StatusOr<std::unique_ptr<HostTierSplit>> split = HostTierSplit::Create(
        options_.max_tokens, std::max(config_.top_k, 1), config_.hidden_size, config_.num_experts);
    if (!split.ok()) {  // no buffers for the host's share
      DropHostTier(split.status());
      return residency_->EnsureResident(layer, host_experts_, used_experts_);
    }
    split_ = *std::move(split);
  }
  host_layer_ = layer;
  host_slots_ = n * top_k;
  return absl::OkStatus();
}

void CudaExpertSlots::CollectUses(std::vector<ExpertUse>& uses) {
  const int e_count = config_.num_experts;
  // The oldest read first: reads land in the order they were queued.
  for (int i = 0; i < 2; ++i) {
    const int k = (uses_next_ + i) % 2;
    if (!uses_pending_[k] || Query(uses_ready_[k]) != EventState::kDone) continue;
    const uint32_t* now = uses_read_[k].data();
    for (size_t j = 0; j < uses_seen_.size(); ++j) {
      const uint32_t delta = now[j] - uses_seen_[j];  // counts wrap; deltas do not
      if (delta == 0) continue;
      uses.push_back({static_cast<int>(j / e_count), static_cast<int>(j % e_count), delta});
      uses_seen_[j] = now[j];
    }
    uses_pending_[k] = false;
  }
}

absl::Status CudaExpertSlots::QueueUsesRead() {
  const int k = uses_next_;
  if (uses_pending_[k]) return absl::OkStatus();  // two in flight already
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(uses_read_[k].data(), uses_.data(),
                                       uses_seen_.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                       context_->stream()));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(uses_ready_[k], context_->stream()));
  uses_pending_[k] = true;
  uses_next_ = (k + 1) % 2;
  return absl::OkStatus();
}

absl::Status CudaExpertSlots::PrepareReplay() {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Sync(/*wait=*/false));
  return QueueUsesRead();  // behind the replays before this one
}

absl::Status CudaExpertSlots::AfterReply() {
  std::vector<ExpertUse> uses;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CollectUses(uses);
  }
  // Loads and releases come back here (mu_ is not held); they land at the next PrepareReplay.
  if (residency_ == nullptr || uses.empty()) return absl::OkStatus();
  return residency_->AfterReplays(uses);
}

absl::Status CudaExpertSlots::UnregisterHostMemory(absl::Span<const uint8_t> memory) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));               // copies from it must be done
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->stream()));  // and reads in place
  return regions_.Unregister(memory);
}

absl::Status CudaExpertSlots::StartLoads() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(UploadDirty());
  return IssueQueued();
}

absl::Status CudaExpertSlots::WaitForLoads() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Sync(/*wait=*/true));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->stream()));
  return absl::OkStatus();
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
  RETURN_IF_ERROR(CudaExpertsSupport(config));
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
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  auto slots = std::make_unique<CudaExpertSlots>(config, options, device);
  RETURN_IF_ERROR(slots->Init());
  return slots;
}

}  // namespace strata::gpu
