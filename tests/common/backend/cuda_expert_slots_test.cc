// GPU expert slots (CreateCudaExpertSlots) against the CPU reference (bf16) and against
// CudaExpertBackend (FP8), over random qwen3_moe- and gpt-oss-like experts with fewer slots
// than experts, reloading different experts into the same slots between runs. Also: errors,
// Loads racing runs on another thread, and the Load bandwidth from registered and unregistered
// host memory (printed, not asserted). Skips without a GPU.
#include "common/backend/cuda/cuda_expert_slots.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/cuda/staged_expert_backend.h"
#include "common/cuda/virtual_device_memory.h"
#include "common/util/thread_pool.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool();
  return *pool;
}

struct Shape {
  const char* name;
  bool gpt_oss;  // clamped SwiGLU, biases, transposed and interleaved gate_up
  int experts, top_k;
  int64_t hidden, inter;
};

constexpr Shape kShapes[] = {
    {"qwen3_moe", false, 16, 4, 256, 128},
    {"gpt_oss", true, 8, 4, 128, 64},
};

// One expert's host weights as a loader describes them: storage and views into it.
// A random model of three layers (MoE, dense, MoE) whose experts live in host memory.
class RandomExperts : public ExpertWeightSource {
 public:
  const FfnWeights* Find(int layer, int expert) const override {
    if (layer < 0 || layer >= static_cast<int>(experts.size())) return nullptr;
    if (expert < 0 || expert >= static_cast<int>(experts[layer].size())) return nullptr;
    return &experts[layer][expert].ffn;
  }

  ModelConfig config;
  std::vector<std::vector<HostExpert>> experts;  // [layer][expert]; empty for the dense layer
};

class CudaExpertSlotsTest : public CudaOpsTest {
 protected:
  void MakeExpert(const Shape& s, HostExpert& e) {
    MakeRandomExpert(s.hidden, s.inter, s.gpt_oss, e);
  }

  std::unique_ptr<RandomExperts> MakeModel(const Shape& s) {
    auto model = std::make_unique<RandomExperts>();
    ModelConfig& c = model->config;
    c.arch = s.gpt_oss ? Architecture::kGptOss : Architecture::kQwen3Moe;
    c.hidden_size = s.hidden;
    c.num_layers = 3;
    c.layer_is_moe = {true, false, true};
    c.num_experts = s.experts;
    c.top_k = s.top_k;
    c.moe_intermediate_size = s.inter;
    c.expert_bias = s.gpt_oss;
    c.activation = s.gpt_oss ? ExpertActivation::kClampedSwiGlu : ExpertActivation::kSwiGlu;
    model->experts.resize(3);
    for (int layer : {0, 2}) {
      model->experts[layer].resize(s.experts);
      for (HostExpert& e : model->experts[layer]) MakeExpert(s, e);
    }
    return model;
  }

  // x rounded to bf16, so that the device's conversion loses nothing.
  Tensor RandomInput(int64_t n, int64_t hidden) {
    Tensor x;
    x.Resize(n, hidden);
    const std::vector<uint16_t> bits = RandomBf16(n * hidden, 1.0f);
    for (int64_t i = 0; i < n * hidden; ++i) x.data()[i] = F(bits[i]);
    return x;
  }

  // Up to top_k distinct experts from `allowed` per token (-1 for the rest), and every
  // fifth slot -1 (another worker's).
  RoutingTable RandomRouting(int64_t n, int top_k, std::vector<int> allowed) {
    RoutingTable r;
    r.Resize(n, top_k);
    for (int64_t t = 0; t < n; ++t) {
      std::shuffle(allowed.begin(), allowed.end(), rng());
      for (int s = 0; s < top_k && s < static_cast<int>(allowed.size()); ++s) {
        if ((t * top_k + s) % 5 == 4) continue;
        r.expert[t * top_k + s] = allowed[s];
        r.weight[t * top_k + s] = 0.1f + 0.9f * (RandomFloats(1, 0.5f)[0] + 0.5f);
      }
    }
    return r;
  }

  static std::vector<float> Values(const Tensor& t) {
    return std::vector<float>(t.data(), t.data() + t.rows() * t.cols());
  }

  // Runs `layer` over `allowed` experts on the slots and on the CPU and compares.
  void ExpectMatchesCpu(ExpertSlots& slots, const RandomExperts& model, int layer,
                        const std::vector<int>& allowed, const std::string& label, int64_t n = 13) {
    const ModelConfig& c = model.config;
    CpuExpertBackend cpu(c, model, Pool());
    const Tensor x = RandomInput(n, c.hidden_size);
    const RoutingTable routing = RandomRouting(n, c.top_k, allowed);
    Tensor got, want;
    STATUS_ASSERT_OK(slots.backend().RunExperts(layer, x, routing, got));
    STATUS_ASSERT_OK(cpu.RunExperts(layer, x, routing, want));
    ExpectClose("slots bf16 vs cpu", label, Values(got), Values(want), 1e-2);
  }
};

void LoadAll(ExpertSlots& slots, const RandomExperts& model,
             const std::vector<std::array<int, 3>>& loads) {  // slot, layer, expert
  for (const auto& [slot, layer, expert] : loads) {
    const absl::Status s = slots.Load(slot, layer, expert, *model.Find(layer, expert));
    ASSERT_TRUE(s.ok()) << "slot " << slot << " layer " << layer << " expert " << expert << ": "
                        << s;
  }
}

TEST_F(CudaExpertSlotsTest, Bf16MatchesCpuAcrossReloads) {
  for (const Shape& s : kShapes) {
    std::unique_ptr<RandomExperts> model = MakeModel(s);
    auto made = gpu::CreateCudaExpertSlots(model->config, 0, {.max_tokens = 32, .num_slots = 6});
    ASSERT_TRUE(made.ok()) << made.status();
    ExpertSlots& slots = **made;
    EXPECT_EQ(slots.slot_bytes(),
              gpu::CudaExpertSlotBytes(model->config, gpu::WeightFormat::kBf16));
    const std::string name = s.name;

    // Round 1: four experts of layer 0 and two of layer 2.
    LoadAll(slots, *model, {{0, 0, 0}, {1, 0, 1}, {2, 0, 2}, {3, 0, 3}, {4, 2, 4}, {5, 2, 5}});
    ExpectMatchesCpu(slots, *model, 0, {0, 1, 2, 3}, name + " round 1 layer 0");
    ExpectMatchesCpu(slots, *model, 2, {4, 5}, name + " round 1 layer 2");

    // Round 2: released, then other experts in the same slots (layer 0's slots 0-3 now hold
    // experts 4-7; a stale table or a late copy would read the old weights).
    for (int slot = 0; slot < 6; ++slot) slots.Release(slot);
    LoadAll(slots, *model, {{0, 0, 4}, {1, 0, 5}, {2, 0, 6}, {3, 0, 7}, {4, 2, 0}, {5, 2, 1}});
    ExpectMatchesCpu(slots, *model, 0, {4, 5, 6, 7}, name + " round 2 layer 0");
    ExpectMatchesCpu(slots, *model, 2, {0, 1}, name + " round 2 layer 2");

    // The old experts are gone.
    Tensor x = RandomInput(2, s.hidden), out;
    RoutingTable routing = RandomRouting(2, s.top_k, {4, 5, 6, 7});
    routing.expert[0] = 0;
    const absl::Status unbound = slots.backend().RunExperts(0, x, routing, out);
    EXPECT_TRUE(absl::IsFailedPrecondition(unbound)) << unbound;
    EXPECT_NE(unbound.message().find("layer 0 expert 0"), std::string::npos) << unbound;

    // Round 3: Load over a bound slot without a Release; slot 0 moves from expert 4 to 0.
    LoadAll(slots, *model, {{0, 0, 0}, {4, 2, 7}});
    ExpectMatchesCpu(slots, *model, 0, {0, 5, 6, 7}, name + " round 3 layer 0");
    ExpectMatchesCpu(slots, *model, 2, {7, 1}, name + " round 3 layer 2");
    routing = RandomRouting(2, s.top_k, {0, 5, 6, 7});
    routing.expert[1] = 4;
    EXPECT_TRUE(absl::IsFailedPrecondition(slots.backend().RunExperts(0, x, routing, out)));

    // Releasing one expert of the set: runs that avoid it still work, runs that need it fail.
    slots.Release(1);  // layer 0 expert 5
    ExpectMatchesCpu(slots, *model, 0, {0, 6, 7}, name + " after release");
    routing = RandomRouting(2, s.top_k, {0, 6, 7});
    routing.expert[0] = 5;
    EXPECT_TRUE(absl::IsFailedPrecondition(slots.backend().RunExperts(0, x, routing, out)));
  }
}

// Slots given back return their memory to the device (cudaMemGetInfo sees it free) and come
// back on demand; the experts below stay bound and correct throughout, and a slot past the
// usable ones refuses loads.
TEST_F(CudaExpertSlotsTest, SlotsGivenBackFreeDeviceMemory) {
  const Shape& s = kShapes[0];
  std::unique_ptr<RandomExperts> model = MakeModel(s);
  // Enough slots that their memory dwarfs the driver's chunk granularity.
  const int n = static_cast<int>(std::max<uint64_t>(
      64, (256ull << 20) / gpu::CudaExpertSlotBytes(model->config, gpu::WeightFormat::kBf16)));
  auto made = gpu::CreateCudaExpertSlots(model->config, 0, {.max_tokens = 32, .num_slots = n});
  ASSERT_TRUE(made.ok()) << made.status();
  ExpertSlots& slots = **made;
  LoadAll(slots, *model, {{0, 0, 0}, {1, 0, 1}, {2, 2, 2}, {n - 1, 0, 3}});
  ExpectMatchesCpu(slots, *model, 0, {0, 1, 3}, "all slots");

  EXPECT_TRUE(absl::IsFailedPrecondition(slots.SetUsableSlots(4)));  // slot n - 1 holds one
  slots.Release(n - 1);
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  STATUS_ASSERT_OK(slots.SetUsableSlots(4));
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(slots.usable_slots(), 4);
  const uint64_t given = (n - 4) * slots.slot_bytes();
  std::printf("%d slots of %llu bytes: %.1f MiB given back, %.1f MiB more free on the device\n", n,
              static_cast<unsigned long long>(slots.slot_bytes()), given / 1048576.0,
              (static_cast<double>(free_after) - free_before) / 1048576.0);
  // Whole chunks only: up to one chunk (of at most 1/1024 of the slots, or 2 MiB) stays.
  EXPECT_GE(free_after, free_before + given - std::max<uint64_t>(given / 512, 4 << 20));
  ExpectMatchesCpu(slots, *model, 0, {0, 1}, "4 slots");
  ExpectMatchesCpu(slots, *model, 2, {2}, "4 slots layer 2");
  EXPECT_TRUE(absl::IsFailedPrecondition(slots.Load(5, 0, 5, *model->Find(0, 5))));
  EXPECT_TRUE(absl::IsInvalidArgument(slots.SetUsableSlots(n + 1)));

  STATUS_ASSERT_OK(slots.SetUsableSlots(n));
  LoadAll(slots, *model, {{n - 1, 0, 5}, {n / 2, 2, 6}});
  ExpectMatchesCpu(slots, *model, 0, {0, 1, 5}, "grown again");
  ExpectMatchesCpu(slots, *model, 2, {2, 6}, "grown again layer 2");
}

// The memory under the slots (and the GPU KV pool): a range of any size, chunks that are not a
// power of two, committed in and out with the device's free memory following.
TEST(VirtualDeviceMemoryTest, CommitsAndReleasesChunksOfAnySize) {
  if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // 6000 MiB of addresses: ~6 MiB chunks (the driver's 2 MiB granules, 1024 chunks at most).
  auto made = gpu::VirtualDeviceMemory::Create(0, size_t{6000} << 20, 100 << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  gpu::VirtualDeviceMemory memory = *std::move(made);
  EXPECT_GE(memory.committed(), size_t{100} << 20);
  EXPECT_LT(memory.committed(), (size_t{100} << 20) + memory.chunk_bytes());
  ASSERT_EQ(cudaMemset(memory.data(), 1, memory.committed()), cudaSuccess);
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  STATUS_ASSERT_OK(memory.Commit(size_t{1} << 30));
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_before - free_after,
            (size_t{1} << 30) - (size_t{100} << 20) - memory.chunk_bytes());
  // What was written stays across growth.
  uint8_t first = 0;
  ASSERT_EQ(cudaMemcpy(&first, memory.data() + (50 << 20), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first, 1);
  ASSERT_EQ(cudaMemset(memory.data(), 2, memory.committed()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  STATUS_ASSERT_OK(memory.Commit(0));
  EXPECT_EQ(memory.committed(), 0u);
  size_t free_released = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_released, &total), cudaSuccess);
  EXPECT_GE(free_released, free_before);
  EXPECT_TRUE(absl::IsInvalidArgument(memory.Commit(memory.capacity() + 1)));
}

// Slots in either format against CudaExpertBackend (all experts resident, same kernels, same
// FP8 quantization): bit-identical or within 1e-3; both against the CPU over the bf16 weights.
TEST_F(CudaExpertSlotsTest, MatchesCudaExpertBackend) {
  for (const gpu::WeightFormat format : {gpu::WeightFormat::kFp8E4M3, gpu::WeightFormat::kBf16}) {
    const bool fp8 = format == gpu::WeightFormat::kFp8E4M3;
    const std::string fmt = fp8 ? "fp8" : "bf16";
    for (const Shape& s : kShapes) {
      std::unique_ptr<RandomExperts> model = MakeModel(s);
      const ModelConfig& c = model->config;
      auto made =
          gpu::CreateCudaExpertSlots(c, 0, {.format = format, .max_tokens = 32, .num_slots = 5});
      ASSERT_TRUE(made.ok()) << made.status();
      ExpertSlots& slots = **made;
      EXPECT_EQ(slots.slot_bytes(), gpu::CudaExpertSlotBytes(c, format));
      gpu::CudaExpertOptions full_options;
      full_options.format = format;
      full_options.max_tokens = 32;
      auto full = gpu::StagedCudaExpertBackend::Create(c, *model, 0, full_options);
      ASSERT_TRUE(full.ok()) << full.status();
      CpuExpertBackend cpu(c, *model, Pool());

      auto compare = [&](int layer, const std::vector<int>& allowed, const std::string& label) {
        const Tensor x = RandomInput(17, c.hidden_size);
        const RoutingTable routing = RandomRouting(17, c.top_k, allowed);
        Tensor got, want, bf16_ref;
        STATUS_ASSERT_OK(slots.backend().RunExperts(layer, x, routing, got));
        STATUS_ASSERT_OK((*full)->RunExperts(layer, x, routing, want));
        STATUS_ASSERT_OK(cpu.RunExperts(layer, x, routing, bf16_ref));
        int64_t differing = 0;
        double max_diff = 0.0, max_ref = 0.0;
        for (int64_t i = 0; i < got.rows() * got.cols(); ++i) {
          differing += std::memcmp(&got.data()[i], &want.data()[i], sizeof(float)) != 0;
          max_diff = std::max(max_diff, std::fabs(double{got.data()[i]} - want.data()[i]));
          max_ref = std::max(max_ref, std::fabs(double{want.data()[i]}));
        }
        RecordResult("slots vs backend (bits differ)", label, static_cast<double>(differing), 0.0);
        RecordResult("slots vs backend max|d|/max", label, max_diff / max_ref, 1e-3);
        EXPECT_LE(max_diff, 1e-3 * max_ref) << label << ": " << differing << " values differ";
        // FP8: three E4M3 matrices in series against the bf16 originals.
        ExpectClose(fp8 ? "slots fp8 vs cpu bf16" : "slots bf16 vs cpu", label, Values(got),
                    Values(bf16_ref), fp8 ? 6e-2 : 1e-2);
        ExpectClose(fp8 ? "backend fp8 vs cpu bf16" : "backend bf16 vs cpu", label, Values(want),
                    Values(bf16_ref), fp8 ? 6e-2 : 1e-2);
      };
      const std::string name = absl::StrCat(s.name, " ", fmt);
      LoadAll(slots, *model, {{0, 0, 1}, {1, 0, 3}, {2, 0, 5}, {3, 0, 7}, {4, 2, 2}});
      compare(0, {1, 3, 5, 7}, name + " round 1");
      compare(2, {2}, name + " round 1 layer 2");
      for (int slot = 0; slot < 5; ++slot) slots.Release(slot);
      LoadAll(slots, *model, {{0, 0, 0}, {1, 0, 2}, {2, 0, 4}, {3, 0, 6}, {4, 2, 3}});
      compare(0, {0, 2, 4, 6}, name + " round 2");
      compare(2, {3}, name + " round 2 layer 2");
    }
  }
}

TEST_F(CudaExpertSlotsTest, Errors) {
  const Shape& s = kShapes[1];  // gpt-oss: biases
  std::unique_ptr<RandomExperts> model = MakeModel(s);
  auto made = gpu::CreateCudaExpertSlots(model->config, 0, {.max_tokens = 8, .num_slots = 2});
  ASSERT_TRUE(made.ok()) << made.status();
  ExpertSlots& slots = **made;
  const FfnWeights& w = *model->Find(0, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(slots.Load(2, 0, 0, w)));
  EXPECT_TRUE(absl::IsInvalidArgument(slots.Load(-1, 0, 0, w)));
  EXPECT_TRUE(absl::IsInvalidArgument(slots.Load(0, 1, 0, w)));  // the dense layer
  EXPECT_TRUE(absl::IsInvalidArgument(slots.Load(0, 0, s.experts, w)));
  FfnWeights wrong = w;
  wrong.down.out = 7;
  EXPECT_TRUE(absl::IsInvalidArgument(slots.Load(0, 0, 0, wrong)));
  STATUS_ASSERT_OK(slots.Load(0, 0, 0, w));
  EXPECT_TRUE(absl::IsAlreadyExists(slots.Load(1, 0, 0, w)));
  STATUS_ASSERT_OK(slots.Load(0, 0, 0, w));  // the same expert again into its own slot
  STATUS_ASSERT_OK(slots.Load(1, 2, 3, *model->Find(2, 3)));
  slots.Release(5);  // out of range: a no-op

  Tensor x = RandomInput(2, s.hidden), out;
  RoutingTable routing = RandomRouting(2, s.top_k, {0});
  EXPECT_TRUE(absl::IsInvalidArgument(slots.backend().RunExperts(1, x, routing, out)));
  routing.expert[0] = s.experts;
  EXPECT_TRUE(absl::IsInvalidArgument(slots.backend().RunExperts(0, x, routing, out)));
  const Tensor big = RandomInput(9, s.hidden);
  EXPECT_TRUE(absl::IsInvalidArgument(
      slots.backend().RunExperts(0, big, RandomRouting(9, s.top_k, {0}), out)));
  // Still usable after the errors.
  ExpectMatchesCpu(slots, *model, 0, {0}, "gpt_oss after errors", 8);
  ExpectMatchesCpu(slots, *model, 2, {3}, "gpt_oss after errors layer 2", 8);

  // A model without biases refuses biased weights.
  std::unique_ptr<RandomExperts> plain = MakeModel(kShapes[0]);
  auto plain_slots = gpu::CreateCudaExpertSlots(plain->config, 0, {.num_slots = 1});
  ASSERT_TRUE(plain_slots.ok()) << plain_slots.status();
  FfnWeights biased = *plain->Find(0, 0);
  const std::vector<uint16_t> bias(kShapes[0].inter, Bf16(1.0f));
  biased.gate_bias = HostVector(bias);
  EXPECT_TRUE(absl::IsInvalidArgument((*plain_slots)->Load(0, 0, 0, biased)));

  EXPECT_TRUE(absl::IsInvalidArgument(gpu::CreateCudaExpertSlots(model->config, 0, {}).status()));
}

// Loads and Releases on one thread while another runs layer 0 over experts that stay loaded:
// the runs must not change (the kernels are deterministic) and must not fail.
TEST_F(CudaExpertSlotsTest, LoadsRacingRuns) {
  const Shape& s = kShapes[0];
  std::unique_ptr<RandomExperts> model = MakeModel(s);
  auto made = gpu::CreateCudaExpertSlots(model->config, 0, {.max_tokens = 32, .num_slots = 4});
  ASSERT_TRUE(made.ok()) << made.status();
  ExpertSlots& slots = **made;
  LoadAll(slots, *model, {{0, 0, 0}, {1, 0, 1}});
  const Tensor x = RandomInput(16, s.hidden);
  RoutingTable routing = RandomRouting(16, s.top_k, {0, 1});
  Tensor first;
  STATUS_ASSERT_OK(slots.backend().RunExperts(0, x, routing, first));
  std::atomic<bool> stop{false};
  std::atomic<int> runs{0}, mismatches{0}, failures{0};
  std::thread runner([&] {
    Tensor out;
    while (!stop.load()) {
      if (!slots.backend().RunExperts(0, x, routing, out).ok()) ++failures;
      if (std::memcmp(out.data(), first.data(), sizeof(float) * x.rows() * x.cols()) != 0) {
        ++mismatches;
      }
      ++runs;
    }
  });
  int loads = 0;
  // Loads only queue; every tenth waits for the copies, which then run while the other thread
  // runs (and the runs' syncs issue the rest).
  for (int i = 0; i < 200 || (runs.load() < 20 && i < 20000); ++i) {
    const int slot = 2 + i % 2, layer = (i % 3 == 0) ? 2 : 0, expert = 2 + i % 14;
    if (!slots.Load(slot, layer, expert, *model->Find(layer, expert)).ok()) ++failures;
    ++loads;
    if (i % 5 == 0) slots.Release(slot);
    if (i % 10 == 9 && !slots.WaitForLoads().ok()) ++failures;
  }
  stop = true;
  runner.join();
  std::printf("loads racing runs: %d loads, %d runs, %d mismatches, %d failures\n", loads,
              runs.load(), mismatches.load(), failures.load());
  EXPECT_GT(runs.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  ExpectMatchesCpu(slots, *model, 0, {0, 1}, "qwen3_moe after racing loads");
}

// Two qwen3-30B-sized experts (9 MiB each in bf16) in an anonymous read-only mapping, as the
// expert store's shared memory is mapped: Load bandwidth before and after registering it, then
// Loads that swap the two slots' experts followed at once by a run (the run must wait for the
// copies).
TEST_F(CudaExpertSlotsTest, LoadBandwidthRegisteredVsNot) {
  const int64_t h = 2048, inter = 768;
  const size_t expert_elems = 3 * h * inter;
  const size_t bytes = 2 * expert_elems * sizeof(uint16_t);
  void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* bits = static_cast<uint16_t*>(region);
  for (int e = 0; e < 2; ++e) {
    const std::vector<uint16_t> gate_up =
        RandomBf16(2 * h * inter, 3.0f / std::sqrt(static_cast<float>(h)));
    const std::vector<uint16_t> down =
        RandomBf16(h * inter, 3.0f / std::sqrt(static_cast<float>(inter)));
    std::copy(gate_up.begin(), gate_up.end(), bits + e * expert_elems);
    std::copy(down.begin(), down.end(), bits + e * expert_elems + 2 * h * inter);
  }
  ASSERT_EQ(mprotect(region, bytes, PROT_READ), 0);
  RandomExperts model;
  ModelConfig& c = model.config;
  c.hidden_size = h;
  c.num_layers = 1;
  c.layer_is_moe = {true};
  c.num_experts = 2;
  c.top_k = 2;
  c.moe_intermediate_size = inter;
  model.experts.resize(1);
  model.experts[0].resize(2);
  for (int e = 0; e < 2; ++e) {
    const uint16_t* base = bits + e * expert_elems;
    FfnWeights& f = model.experts[0][e].ffn;
    f.gate = WeightMatrix{.data = base, .out = inter, .in = h, .out_stride = h};
    f.up = WeightMatrix{.data = base + h * inter, .out = inter, .in = h, .out_stride = h};
    f.down = WeightMatrix{.data = base + 2 * h * inter, .out = h, .in = inter, .out_stride = inter};
  }
  const absl::Span<const uint8_t> segment(static_cast<const uint8_t*>(region), bytes);
  for (const gpu::WeightFormat format : {gpu::WeightFormat::kBf16, gpu::WeightFormat::kFp8E4M3}) {
    const char* format_name = format == gpu::WeightFormat::kBf16 ? "bf16" : "fp8";
    auto made = gpu::CreateCudaExpertSlots(c, 0, {.format = format, .num_slots = 2});
    ASSERT_TRUE(made.ok()) << made.status();
    ExpertSlots& slots = **made;
    auto measure = [&] {
      constexpr int kLoads = 16;
      for (int i = 0; i < 2; ++i) EXPECT_TRUE(slots.Load(i, 0, i, *model.Find(0, i)).ok());
      EXPECT_TRUE(slots.WaitForLoads().ok());
      const auto start = std::chrono::steady_clock::now();
      // Loads queue until the slots sync: each waited for, or only the last two would copy.
      for (int i = 0; i < kLoads; ++i) {
        EXPECT_TRUE(slots.Load(i % 2, 0, i % 2, *model.Find(0, i % 2)).ok());
        EXPECT_TRUE(slots.WaitForLoads().ok());
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return kLoads * expert_elems * 2.0 / seconds / 1e9;  // bf16 bytes read from the host
    };
    const double unregistered = measure();
    STATUS_ASSERT_OK(slots.RegisterHostMemory(segment));
    unsigned flags = 0;
    const bool pinned = cudaHostGetFlags(&flags, region) == cudaSuccess;
    cudaGetLastError();
    const double registered = measure();
    std::printf("Load of a %.1f MiB expert (%s slots): unregistered %.1f GB/s, %s %.1f GB/s\n",
                expert_elems * 2.0 / (1 << 20), format_name, unregistered,
                pinned ? "registered" : "registration refused,", registered);

    // Swap the experts between the slots and run at once.
    slots.Release(0);
    slots.Release(1);
    LoadAll(slots, model, {{0, 0, 1}, {1, 0, 0}});
    const Tensor x = RandomInput(4, h);
    RoutingTable routing;
    routing.Resize(4, 2);
    for (int64_t i = 0; i < 8; ++i) {
      routing.expert[i] = static_cast<int32_t>(i % 2);
      routing.weight[i] = 0.25f + 0.125f * static_cast<float>(i);
    }
    Tensor got, want;
    STATUS_ASSERT_OK(slots.backend().RunExperts(0, x, routing, got));
    CpuExpertBackend cpu(c, model, Pool());
    STATUS_ASSERT_OK(cpu.RunExperts(0, x, routing, want));
    ExpectClose(format == gpu::WeightFormat::kBf16 ? "slots bf16 vs cpu" : "slots fp8 vs cpu bf16",
                absl::StrCat(format_name, " H=2048 I=768 load then run"), Values(got), Values(want),
                format == gpu::WeightFormat::kBf16 ? 1e-2 : 6e-2);
    STATUS_ASSERT_OK(slots.UnregisterHostMemory(segment));
  }
  munmap(region, bytes);
}

}  // namespace
}  // namespace strata::testing_cuda
