// GPU expert slots as a tiered CUDA IPC worker uses them (gpu::DeviceExperts over the slots):
// cold experts read in place from registered host memory give the same bits as resident ones;
// a replayed graph keeps reading the tables as loads land between replays (queued, copied
// behind the replays, bound once copied); replays count their uses for the tier manager; eager
// runs ask the tier manager first, and share cold experts with a host tier when it says so.
// The reference is CudaExpertBackend over the same weights with every expert resident. Skips
// without a GPU.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_expert_slots.h"
#include "common/backend/cuda/device_experts.h"
#include "common/tensor/dtype.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

constexpr int kExperts = 8, kTopK = 2, kTokens = 3;
constexpr int64_t kHidden = 256, kInter = 128;

// One MoE layer of experts in an anonymous read-only mapping, as the expert store's shared
// memory is mapped: bf16, or FP8 E4M3 with float row scales (the slots' formats, so that they
// can be read in place).
class MappedStore : public ExpertWeightSource {
 public:
  MappedStore(bool fp8, const std::vector<std::vector<uint16_t>>& matrices) : fp8_(fp8) {
    const size_t elem = fp8 ? 1 : 2;
    auto rows = [](int m) { return m == 2 ? kHidden : kInter; };
    auto cols = [](int m) { return m == 2 ? kInter : kHidden; };
    size_t bytes = 0;
    for (int e = 0; e < kExperts; ++e) {
      for (int m = 0; m < 3; ++m) bytes += rows(m) * cols(m) * elem + (fp8 ? rows(m) * 4 : 0);
    }
    size_ = (bytes + 4095) / 4096 * 4096;
    base_ = static_cast<uint8_t*>(
        mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    uint8_t* p = base_;
    weights_.resize(kExperts);
    for (int e = 0; e < kExperts; ++e) {
      WeightMatrix* mats[3] = {&weights_[e].gate, &weights_[e].up, &weights_[e].down};
      for (int m = 0; m < 3; ++m) {
        const std::vector<uint16_t>& bf16 = matrices[3 * e + m];
        WeightMatrix& w = *mats[m];
        w.data = p;
        w.out = rows(m);
        w.in = cols(m);
        w.out_stride = w.in;
        if (fp8) {
          w.dtype = DType::kF8E4M3;
          auto* scales = reinterpret_cast<float*>(p + w.out * w.in);
          QuantizeBf16RowsToFp8E4M3(bf16.data(), w.out, w.in, p, scales);
          w.scale = scales;
          p += w.out * w.in + w.out * 4;
        } else {
          w.dtype = DType::kBF16;
          std::memcpy(p, bf16.data(), bf16.size() * 2);
          p += w.out * w.in * 2;
        }
      }
    }
    mprotect(base_, size_, PROT_READ);
  }
  ~MappedStore() override { munmap(base_, size_); }
  const FfnWeights* Find(int layer, int expert) const override {
    return layer == 0 && expert >= 0 && expert < kExperts ? &weights_[expert] : nullptr;
  }
  absl::Span<const uint8_t> memory() const { return {base_, size_}; }

 private:
  bool fp8_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<FfnWeights> weights_;
};

// Records what the slots tell the tier manager, and loads what it is told to.
class RecordingResidency : public SlotResidency {
 public:
  absl::Status BeforeLayer(int layer, absl::Span<const int> experts,
                           absl::Span<const int64_t> tokens, std::vector<int>* host) override {
    before.assign(experts.begin(), experts.end());
    offered_host = host != nullptr;
    if (host != nullptr) {
      host->clear();
      for (int e : experts) {
        if (std::count(to_host.begin(), to_host.end(), e) > 0) host->push_back(e);
      }
    }
    return absl::OkStatus();
  }
  absl::Status EnsureResident(int layer, absl::Span<const int> experts,
                              absl::Span<const int> keep) override {
    made_resident.assign(experts.begin(), experts.end());
    return absl::OkStatus();
  }
  absl::Status AfterReplays(absl::Span<const ExpertUse> uses) override {
    for (const ExpertUse& u : uses) counts[u.expert] += u.count;
    return absl::OkStatus();
  }
  std::vector<int> before;
  std::vector<uint32_t> counts = std::vector<uint32_t>(kExperts, 0);
  std::vector<int> to_host;  // misses BeforeLayer sends to a host tier when it may
  bool offered_host = false;
  std::vector<int> made_resident;
};

// strata-expert-store's CPU tier in miniature: the CPU backend over the same store, or a tier that
// fails its answers.
class CpuHostTier : public HostExpertTier {
 public:
  CpuHostTier(const ModelConfig& config, const ExpertWeightSource& store)
      : backend_(config, store, pool_), hidden_(config.hidden_size) {}
  absl::Status Submit(int layer, int64_t n, int top_k, absl::Span<const float> x,
                      absl::Span<const int32_t> ids, absl::Span<const float> weights) override {
    ++submitted;
    x_ = Tensor::Host(n, hidden_);
    std::copy(x.begin(), x.end(), x_.data());
    routing_.Resize(n, top_k);
    std::copy(ids.begin(), ids.end(), routing_.expert.begin());
    std::copy(weights.begin(), weights.end(), routing_.weight.begin());
    seen_ids.assign(ids.begin(), ids.end());
    layer_ = layer;
    return absl::OkStatus();
  }
  absl::Status Collect(Tensor& partial) override {
    if (fail) return absl::UnavailableError("the expert store went away");
    return backend_.RunExperts(layer_, x_, routing_, partial);
  }
  void Abandon() override { abandoned = true; }
  bool abandoned = false;
  int submitted = 0;
  bool fail = false;
  std::vector<int32_t> seen_ids;

 private:
  ThreadPool pool_{2};
  CpuExpertBackend backend_;
  const int64_t hidden_;
  Tensor x_;
  RoutingTable routing_;
  int layer_ = 0;
};

class CudaTieredSlotsTest : public CudaOpsTest {
 protected:
  ModelConfig Config() const {
    ModelConfig c;
    c.hidden_size = kHidden;
    c.num_layers = 1;
    c.layer_is_moe = {true};
    c.num_experts = kExperts;
    c.top_k = kTopK;
    c.moe_intermediate_size = kInter;
    return c;
  }

  void Build(bool fp8) {
    slots_.reset();  // before the memory it registered goes
    reference_.reset();
    std::vector<std::vector<uint16_t>> matrices;
    for (int e = 0; e < kExperts; ++e) {
      matrices.push_back(RandomBf16(kInter * kHidden, 3.0f / 16));
      matrices.push_back(RandomBf16(kInter * kHidden, 3.0f / 16));
      matrices.push_back(RandomBf16(kHidden * kInter, 3.0f / 11));
    }
    config_ = Config();
    store_ = std::make_unique<MappedStore>(fp8, matrices);
    const gpu::WeightFormat format = fp8 ? gpu::WeightFormat::kFp8E4M3 : gpu::WeightFormat::kBf16;
    auto reference = gpu::CudaExpertBackend::Create(config_, *store_, &context(),
                                                    {.format = format, .max_tokens = kTokens});
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = *std::move(reference);
    auto slots = gpu::CreateCudaExpertSlots(
        config_, 0, {.format = format, .max_tokens = kTokens, .num_slots = 3});
    ASSERT_TRUE(slots.ok()) << slots.status();
    slots_ = *std::move(slots);
    STATUS_ASSERT_OK(slots_->RegisterHostMemory(store_->memory()));
    for (int e = 0; e < kExperts; ++e) STATUS_ASSERT_OK(slots_->SetCold(0, e, *store_->Find(0, e)));
    ASSERT_TRUE(slots_->cold_readable_in_place());
    device_ = slots_->device_experts();
    ASSERT_NE(device_, nullptr);
    x_ = Put(RandomBf16(kTokens * kHidden));
    // Token t uses experts 2t and 2t + 1: all six of 0-5 in one step.
    std::vector<int32_t> ids;
    for (int t = 0; t < kTokens; ++t) ids.insert(ids.end(), {2 * t, 2 * t + 1});
    ids_ = Put(ids);
    weights_ = Put(std::vector<float>{0.7f, 0.3f, 0.6f, 0.4f, 0.5f, 0.5f});
    out_ = Poisoned<uint16_t>(kTokens * kHidden);
    want_ = Poisoned<uint16_t>(kTokens * kHidden);
    ASSERT_FALSE(HasFailure());
    STATUS_ASSERT_OK(
        reference_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(want_)));
    CUDA_ASSERT_OK(cudaStreamSynchronize(stream()));
  }

  std::vector<uint16_t> Want() { return Get(want_, kTokens * kHidden); }
  std::vector<uint16_t> Got() {
    CUDA_EXPECT_SYNC(device_->context()->stream());
    return Get(out_, kTokens * kHidden);
  }
  static void CUDA_EXPECT_SYNC(cudaStream_t s) { EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess); }

  ModelConfig config_;
  std::unique_ptr<MappedStore> store_;
  std::unique_ptr<gpu::CudaExpertBackend> reference_;
  std::unique_ptr<ExpertSlots> slots_;
  gpu::DeviceExperts* device_ = nullptr;
  uint16_t* x_ = nullptr;
  int32_t* ids_ = nullptr;
  float* weights_ = nullptr;
  uint16_t* out_ = nullptr;
  uint16_t* want_ = nullptr;
};

TEST_F(CudaTieredSlotsTest, ColdExpertsReadInPlaceGiveTheResidentBits) {
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    Build(fp8);
    ASSERT_FALSE(HasFailure());
    // Nothing loaded: all six experts are read from host memory over the bus.
    STATUS_ASSERT_OK(
        device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_)));
    EXPECT_EQ(Got(), Want());
    // Three of them in slots, the rest still in place.
    for (int slot = 0; slot < 3; ++slot) {
      STATUS_ASSERT_OK(slots_->Load(slot, 0, 2 * slot, *store_->Find(0, 2 * slot)));
    }
    STATUS_ASSERT_OK(
        device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_)));
    EXPECT_EQ(Got(), Want());
  }
}

TEST_F(CudaTieredSlotsTest, AReplayedStepSeesLoadsLandAndCountsItsUses) {
  Build(/*fp8=*/false);
  ASSERT_FALSE(HasFailure());
  RecordingResidency residency;
  slots_->SetResidency(&residency);
  cudaStream_t stream = device_->context()->stream();
  STATUS_ASSERT_OK(device_->PrepareReplay());
  CUDA_ASSERT_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured =
      device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_));
  cudaGraph_t graph = nullptr;
  CUDA_ASSERT_OK(cudaStreamEndCapture(stream, &graph));
  STATUS_ASSERT_OK(captured);
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  // As the worker's serving loop does: prepare, launch, answer, then AfterReply.
  auto replay = [&] {
    EXPECT_TRUE(device_->PrepareReplay().ok());
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    std::vector<uint16_t> out = Got();
    EXPECT_TRUE(device_->AfterReply().ok());
    return out;
  };
  EXPECT_EQ(replay(), Want());  // all in place
  // Loads queue; the next PrepareReplay starts their copies behind the replays, the graph still
  // reads in place meanwhile, and a later one binds them once copied.
  for (int slot = 0; slot < 3; ++slot) {
    STATUS_ASSERT_OK(slots_->Load(slot, 0, slot, *store_->Find(0, slot)));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(replay(), Want()) << "replay " << i;
  // Evicting a bound expert sends the graph back to reading it in place.
  slots_->Release(1);
  STATUS_ASSERT_OK(slots_->Load(1, 0, 5, *store_->Find(0, 5)));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(replay(), Want()) << "after the swap, replay " << i;
  // Uses come back a replay late (each PrepareReplay queues a read of the counts behind the
  // replays before it, AfterReply hands out the reads that landed): one more read for the last.
  // Every replay used experts 0-5 once, 6 and 7 never.
  STATUS_ASSERT_OK(device_->PrepareReplay());
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream));
  STATUS_ASSERT_OK(device_->AfterReply());
  for (int e = 0; e < 6; ++e) EXPECT_EQ(residency.counts[e], 8u) << "expert " << e;
  EXPECT_EQ(residency.counts[6] + residency.counts[7], 0u);
  slots_->SetResidency(nullptr);
  cudaGraphExecDestroy(exec);
}

TEST_F(CudaTieredSlotsTest, AnEagerLayerTellsTheTierManagerItsExpertsFirst) {
  Build(/*fp8=*/false);
  ASSERT_FALSE(HasFailure());
  RecordingResidency residency;
  slots_->SetResidency(&residency);
  STATUS_ASSERT_OK(device_->PrepareLayer(0, ids_, kTokens, kTopK));
  std::sort(residency.before.begin(), residency.before.end());
  EXPECT_EQ(residency.before, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  STATUS_ASSERT_OK(
      device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_)));
  EXPECT_EQ(Got(), Want());
  // Eager runs are counted by the tier manager, not on the device.
  STATUS_ASSERT_OK(device_->PrepareReplay());
  CUDA_ASSERT_OK(cudaStreamSynchronize(device_->context()->stream()));
  STATUS_ASSERT_OK(device_->AfterReply());
  for (uint32_t c : residency.counts) EXPECT_EQ(c, 0u);
  slots_->SetResidency(nullptr);
}

// Cold experts sent to a host tier: the device runs the others meanwhile and adds the host's
// float sums into its bf16 output (one rounding more than the resident run, so compared
// within bf16's precision); a host tier that fails has its experts loaded and the layer run
// whole on the device (the resident bits), and is not offered again.
TEST_F(CudaTieredSlotsTest, AnEagerLayerSharesColdExpertsWithAHostTier) {
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    Build(fp8);
    ASSERT_FALSE(HasFailure());
    RecordingResidency residency;
    residency.to_host = {1, 4};
    CpuHostTier host(config_, *store_);
    slots_->SetResidency(&residency);
    slots_->SetHostTier(&host);
    STATUS_ASSERT_OK(device_->PrepareLayer(0, ids_, kTokens, kTopK));
    EXPECT_TRUE(residency.offered_host);
    STATUS_ASSERT_OK(
        device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_)));
    EXPECT_EQ(host.submitted, 1);
    EXPECT_EQ(host.seen_ids, (std::vector<int32_t>{-1, 1, -1, -1, 4, -1}));
    const std::vector<uint16_t> got = Got(), want = Want();
    for (size_t i = 0; i < want.size(); ++i) {
      const float g = Bf16ToFloat(got[i]), w = Bf16ToFloat(want[i]);
      ASSERT_NEAR(g, w, 0.02f * std::max(1.0f, std::fabs(w))) << "element " << i;
    }
    // The host tier fails: its experts are made resident and the whole layer runs here.
    host.fail = true;
    STATUS_ASSERT_OK(device_->PrepareLayer(0, ids_, kTokens, kTopK));
    STATUS_ASSERT_OK(
        device_->RunExpertsInto(0, AsBf16(x_), ids_, weights_, kTokens, kTopK, AsBf16(out_)));
    EXPECT_EQ(Got(), Want());
    std::sort(residency.made_resident.begin(), residency.made_resident.end());
    EXPECT_EQ(residency.made_resident, (std::vector<int>{1, 4}));
    STATUS_ASSERT_OK(device_->PrepareLayer(0, ids_, kTokens, kTopK));
    EXPECT_FALSE(residency.offered_host);
    EXPECT_EQ(host.submitted, 2);
    EXPECT_TRUE(host.abandoned);
    slots_->SetHostTier(nullptr);
    slots_->SetResidency(nullptr);
  }
}

}  // namespace
}  // namespace strata::testing_cuda
