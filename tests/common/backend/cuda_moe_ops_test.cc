// The MoE kernels against the CPU reference: gate scoring and top-k, grouped experts (bf16 and
// FP8, SwiGLU and gpt-oss's clamped SwiGLU with biases and strided checkpoint layout), and the
// router's split of a layer among CUDA IPC workers.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cuda/expert_repack.h"
#include "common/backend/routing.h"
#include "common/cuda/flag_poll_kernels.h"
#include "common/cuda/kernels/expert_split_kernels.h"
#include "common/cuda/kernels/fp8_quant.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/norm_kernels.h"
#include "common/util/thread_pool.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool();
  return *pool;
}

// A host-to-device copy that a held stream's flag guards.
struct GuardedCopy {
  void* device;
  const void* host;
  size_t bytes;
};

// `stream` is held by a polling kernel on `flag`: after a while it must still be waiting. Then
// the copies land from a side stream, the flag goes up behind them, and both streams finish.
void ReleaseHeldStream(cudaStream_t stream, uint32_t* flag, std::vector<GuardedCopy> copies) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the stream did not wait for the flag";
  cudaStream_t side = nullptr;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  static const uint32_t kUp = 1;
  copies.push_back({flag, &kUp, sizeof(kUp)});
  for (const GuardedCopy& c : copies) {
    CUDA_ASSERT_OK(cudaMemcpyAsync(c.device, c.host, c.bytes, cudaMemcpyHostToDevice, side));
  }
  CUDA_ASSERT_OK(cudaStreamSynchronize(side));
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream));
  CUDA_ASSERT_OK(cudaStreamDestroy(side));
}

// The reference gate: the CPU backend's SelectExperts (routing.h) over each of n tokens'
// logits; ids and weights [n, top_k].
void SelectExpertsOnCpu(const ModelConfig& config, const std::vector<float>& logits, int64_t n,
                        float temperature, const float* correction_bias, std::vector<int32_t>& ids,
                        std::vector<float>& weights) {
  const int e = config.num_experts, k = config.top_k;
  ids.resize(n * k);
  weights.resize(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
    SelectExperts(config, row.data(), temperature, correction_bias, ids.data() + t * k,
                  weights.data() + t * k);
  }
}

struct GateCase {
  int64_t n;
  int experts, top_k;
  gpu::GateScoring scoring;
  bool renormalize;
  float temperature;
};

TEST_F(CudaOpsTest, MoeGate) {
  const GateCase cases[] = {
      {1, 8, 2, gpu::GateScoring::kSoftmaxThenTopK, false, 1.0f},
      {3, 128, 8, gpu::GateScoring::kSoftmaxThenTopK, true, 1.0f},
      {17, 64, 4, gpu::GateScoring::kTopKThenSoftmax, false, 0.7f},
      {17, 256, 8, gpu::GateScoring::kSoftmaxThenTopK, false, 1.3f},
      {33, 32, 4, gpu::GateScoring::kTopKThenSoftmax, false, 1.0f},
      {5, 60, 6, gpu::GateScoring::kSoftmaxThenTopK, true, 2.0f},
  };
  for (const GateCase& c : cases) {
    std::vector<float> logits = RandomFloats(c.n * c.experts, 3.0f);
    // Exact ties: the lower id must win on both sides.
    for (int64_t t = 0; t < c.n; t += 2) {
      const int a = RandomInt(0, c.experts - 1), b = RandomInt(0, c.experts - 1);
      float* row = &logits[t * c.experts];
      const int top = static_cast<int>(std::max_element(row, row + c.experts) - row);
      row[b] = row[a];
      if (t % 4 == 0 && top != a) row[a] = row[top];  // a tie at the very top
    }
    ModelConfig config;
    config.num_experts = c.experts;
    config.top_k = c.top_k;
    config.gate_scoring = c.scoring == gpu::GateScoring::kTopKThenSoftmax
                              ? GateScoring::kTopKThenSoftmax
                              : GateScoring::kSoftmaxThenTopK;
    config.norm_topk_prob = c.renormalize;
    const int64_t slots = c.n * c.top_k;
    std::vector<int32_t> ref_ids;
    std::vector<float> ref_w;
    SelectExpertsOnCpu(config, logits, c.n, c.temperature, /*correction_bias=*/nullptr, ref_ids,
                       ref_w);
    const float* d_logits = Put(logits);
    int32_t* d_ids = Poisoned<int32_t>(slots);
    float* d_w = Poisoned<float>(slots);
    ASSERT_FALSE(HasFailure());
    const gpu::MoeGateParams params{.num_experts = c.experts,
                                    .top_k = c.top_k,
                                    .temperature = c.temperature,
                                    .scoring = c.scoring,
                                    .renormalize = c.renormalize};
    LAUNCH_OK(gpu::LaunchMoeGate(d_logits, c.n, params, d_ids, d_w, stream()));
    const std::vector<int32_t> ids = Get(d_ids, slots);
    const std::vector<float> w = Get(d_w, slots);
    // Indices must match exactly unless two of the top k + 1 scaled logits are distinct but
    // within float rounding of each other (then the order is not well defined).
    int64_t compared = 0, mismatched = 0;
    std::vector<float> got_w, want_w;
    for (int64_t t = 0; t < c.n; ++t) {
      std::vector<float> sorted(logits.begin() + t * c.experts,
                                logits.begin() + (t + 1) * c.experts);
      std::sort(sorted.rbegin(), sorted.rend());
      bool clear = true;
      for (int i = 0; i < c.top_k && i + 1 < c.experts; ++i) {
        const float gap = sorted[i] - sorted[i + 1];
        if (gap != 0.0f && gap < 1e-5f * std::max(1.0f, std::fabs(sorted[i]))) clear = false;
      }
      if (!clear) continue;
      ++compared;
      for (int s = 0; s < c.top_k; ++s) {
        mismatched += ids[t * c.top_k + s] != ref_ids[t * c.top_k + s];
        got_w.push_back(w[t * c.top_k + s]);
        want_w.push_back(ref_w[t * c.top_k + s]);
      }
    }
    const std::string shape = absl::StrCat(
        "n=", c.n, " E=", c.experts, " k=", c.top_k,
        c.scoring == gpu::GateScoring::kTopKThenSoftmax ? " topk+softmax" : " softmax+topk",
        c.renormalize ? " renorm" : "", " T=", c.temperature);
    EXPECT_GE(compared, (c.n + 1) / 2) << shape;
    RecordResult("moe gate ids (mismatches)", shape, static_cast<double>(mismatched), 0.0);
    EXPECT_EQ(mismatched, 0) << shape;
    ExpectClose("moe gate weights", shape, got_w, want_w, 1e-5);
  }
}

// DeepSeek-V3 / GLM-4.5 routing against the CPU backend's SelectExperts (routing.h).
TEST_F(CudaOpsTest, MoeGateSigmoidGroupedMatchesSelectExperts) {
  struct Case {
    int64_t n;
    int experts, top_k, groups, top_k_groups;
    bool renormalize, bias;
    float scaling, temperature;
  };
  const Case cases[] = {
      {5, 16, 4, 4, 2, true, true, 2.5f, 1.0f},    // the glm4_moe oracle's shape
      {9, 256, 8, 8, 4, true, true, 2.5f, 1.0f},   // DeepSeek-V3's
      {3, 160, 8, 1, 1, true, true, 2.5f, 0.7f},   // GLM-4.5's (no group limit)
      {7, 64, 6, 8, 3, false, false, 1.0f, 1.0f},  // unnormalized, no bias
      {33, 128, 8, 1, 1, true, true, 1.0f, 1.3f},  // GLM-4.5-Air's
  };
  for (const Case& c : cases) {
    ModelConfig config;
    config.num_experts = c.experts;
    config.top_k = c.top_k;
    config.gate_scoring = GateScoring::kSigmoidGrouped;
    config.num_expert_groups = c.groups;
    config.top_k_groups = c.top_k_groups;
    config.norm_topk_prob = c.renormalize;
    config.routed_scaling_factor = c.scaling;
    const std::vector<float> logits = RandomFloats(c.n * c.experts, 3.0f);
    // Biases of the size of the scores' spread, so they change the choice.
    const std::vector<float> bias = c.bias ? RandomFloats(c.experts, 0.3f) : std::vector<float>();
    const int64_t slots = c.n * c.top_k;
    std::vector<int32_t> ref_ids;
    std::vector<float> ref_w;
    SelectExpertsOnCpu(config, logits, c.n, c.temperature, c.bias ? bias.data() : nullptr, ref_ids,
                       ref_w);
    const float* d_logits = Put(logits);
    const float* d_bias = c.bias ? Put(bias) : nullptr;
    int32_t* d_ids = Poisoned<int32_t>(slots);
    float* d_w = Poisoned<float>(slots);
    ASSERT_FALSE(HasFailure());
    gpu::MoeGateParams params{.num_experts = c.experts,
                              .top_k = c.top_k,
                              .temperature = c.temperature,
                              .scoring = gpu::GateScoring::kSigmoidGrouped,
                              .renormalize = c.renormalize};
    params.correction_bias = d_bias;
    params.num_groups = c.groups;
    params.top_k_groups = c.top_k_groups;
    params.scaling = c.scaling;
    LAUNCH_OK(gpu::LaunchMoeGate(d_logits, c.n, params, d_ids, d_w, stream()));
    const std::vector<int32_t> ids = Get(d_ids, slots);
    const std::vector<float> w = Get(d_w, slots);
    const std::string shape = absl::StrCat("n=", c.n, " E=", c.experts, " k=", c.top_k, " groups ",
                                           c.top_k_groups, "/", c.groups, " T=", c.temperature);
    // Random float logits leave no near-ties among sigmoid scores at this size: ids exact.
    int64_t mismatched = 0;
    for (int64_t s = 0; s < slots; ++s) mismatched += ids[s] != ref_ids[s];
    RecordResult("sigmoid grouped gate ids (mismatches)", shape, static_cast<double>(mismatched),
                 0.0);
    EXPECT_EQ(mismatched, 0) << shape;
    ExpectClose("sigmoid grouped gate weights", shape, w, ref_w, 1e-5);
  }
}

struct ExpertCase {
  int experts, top_k;
  int64_t hidden, inter, n;
  bool gpt_oss;       // clamped SwiGLU, biases, checkpoint strides
  bool concentrated;  // route all tokens to a few experts (work items of > 16 tokens)
  int skip_every;     // every skip_every-th slot gets id -1 (0: none)
};

// One expert's host weights, as the loader would describe them.
class GroupedExpertTest : public CudaOpsTest {
 protected:
  void MakeExpert(const ExpertCase& c, HostExpert& e) {
    MakeRandomExpert(c.hidden, c.inter, c.gpt_oss, e);
  }

  void RunCase(const ExpertCase& c, bool fp8) {
    const int64_t h = c.hidden, m = c.inter, n = c.n;
    std::vector<HostExpert> experts(c.experts);
    for (HostExpert& e : experts) MakeExpert(c, e);

    // Routing: k distinct experts per token (from the first few when concentrated).
    const int64_t slots = n * c.top_k;
    std::vector<int32_t> ids(slots);
    std::vector<float> weights(slots);
    const int pool_size = c.concentrated ? std::max(c.top_k, 2) : c.experts;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int> choice(pool_size);
      std::iota(choice.begin(), choice.end(), 0);
      std::shuffle(choice.begin(), choice.end(), rng());
      for (int s = 0; s < c.top_k; ++s) {
        ids[t * c.top_k + s] = choice[s];
        weights[t * c.top_k + s] = 0.1f + 0.9f * (RandomFloats(1, 0.5f)[0] + 0.5f);
      }
    }
    if (c.skip_every > 0) {
      for (int64_t s = 0; s < slots; s += c.skip_every) ids[s] = -1;
    }
    const std::vector<uint16_t> x = RandomBf16(n * h, 1.0f);

    // Device weights in the standard layout (repacked), bf16 or quantized.
    ModelConfig config;
    config.activation = c.gpt_oss ? ExpertActivation::kClampedSwiGlu : ExpertActivation::kSwiGlu;
    std::vector<const void*> gate_ptrs, up_ptrs, down_ptrs;
    std::vector<const float*> gs_ptrs, us_ptrs, ds_ptrs;
    std::vector<const gpu::bf16*> gb_ptrs, ub_ptrs, db_ptrs;
    std::vector<std::vector<float>> deq_store;  // keeps the FP8 reference matrices alive
    std::vector<FfnWeights> ref_ffn(c.experts);
    for (int e = 0; e < c.experts; ++e) {
      const FfnWeights& f = experts[e].ffn;
      ref_ffn[e] = f;
      const WeightMatrix* mats[3] = {&f.gate, &f.up, &f.down};
      WeightMatrix* ref_mats[3] = {&ref_ffn[e].gate, &ref_ffn[e].up, &ref_ffn[e].down};
      std::vector<const void*>* ptrs[3] = {&gate_ptrs, &up_ptrs, &down_ptrs};
      std::vector<const float*>* sptrs[3] = {&gs_ptrs, &us_ptrs, &ds_ptrs};
      for (int j = 0; j < 3; ++j) {
        const std::vector<uint16_t> std_layout = gpu::RepackToRowMajorBf16(*mats[j]);
        if (!fp8) {
          ptrs[j]->push_back(Put(std_layout));
          continue;
        }
        std::vector<uint8_t> q(std_layout.size());
        std::vector<float> scale(mats[j]->out);
        QuantizeBf16RowsToFp8E4M3(std_layout.data(), mats[j]->out, mats[j]->in, q.data(),
                                  scale.data());
        ptrs[j]->push_back(Put(q));
        sptrs[j]->push_back(Put(scale));
        std::vector<float>& deq = deq_store.emplace_back(q.size());
        for (int64_t o = 0; o < mats[j]->out; ++o) {
          for (int64_t i = 0; i < mats[j]->in; ++i) {
            const __half_raw hr = __nv_cvt_fp8_to_halfraw(q[o * mats[j]->in + i], __NV_E4M3);
            deq[o * mats[j]->in + i] = __half2float(__half(hr)) * scale[o];
          }
        }
        *ref_mats[j] = WeightMatrix{.data = deq.data(),
                                    .dtype = DType::kF32,
                                    .out = mats[j]->out,
                                    .in = mats[j]->in,
                                    .out_stride = mats[j]->in,
                                    .in_stride = 1};
      }
      if (c.gpt_oss) {
        gb_ptrs.push_back(AsBf16(Put(gpu::RepackVectorBf16(f.gate_bias))));
        ub_ptrs.push_back(AsBf16(Put(gpu::RepackVectorBf16(f.up_bias))));
        db_ptrs.push_back(AsBf16(Put(gpu::RepackVectorBf16(f.down_bias))));
      }
    }

    // CPU reference (CpuExpertBackend's sum), once with the FP8 weights' exact values and
    // once with the bf16 originals.
    auto reference = [&](const std::vector<FfnWeights>& ffns) {
      std::vector<float> out(n * h, 0.0f), scratch(2 * m), row(h);
      const std::vector<float> xf = ToFloat(x);
      for (int64_t t = 0; t < n; ++t) {
        for (int s = 0; s < c.top_k; ++s) {
          const int32_t e = ids[t * c.top_k + s];
          if (e < 0) continue;
          cpu::Ffn(Pool(), config, ffns[e], xf.data() + t * h, 1, scratch.data(), row.data());
          for (int64_t i = 0; i < h; ++i) out[t * h + i] += weights[t * c.top_k + s] * row[i];
        }
      }
      return out;
    };
    const std::vector<float> ref = reference(ref_ffn);

    gpu::ExpertWeightTable table{
        .format = fp8 ? gpu::WeightFormat::kFp8E4M3 : gpu::WeightFormat::kBf16,
        .num_experts = c.experts,
        .hidden = h,
        .intermediate = m,
        .gate = Put(gate_ptrs),
        .up = Put(up_ptrs),
        .down = Put(down_ptrs)};
    if (fp8) {
      table.gate_scale = Put(gs_ptrs);
      table.up_scale = Put(us_ptrs);
      table.down_scale = Put(ds_ptrs);
    }
    if (c.gpt_oss) {
      table.gate_bias = Put(gb_ptrs);
      table.up_bias = Put(ub_ptrs);
      table.down_bias = Put(db_ptrs);
    }
    const gpu::GluParams act{
        .activation = c.gpt_oss ? gpu::GluActivation::kClampedSwiGlu : gpu::GluActivation::kSwiGlu,
        .alpha = config.swiglu_alpha,
        .limit = config.swiglu_limit};
    const uint16_t* d_x = Put(x);
    const int32_t* d_ids = Put(ids);
    const float* d_weights = Put(weights);
    uint8_t* d_ws = Poisoned<uint8_t>(gpu::ExpertWorkspaceBytes(n, c.top_k, h, m));
    uint16_t* d_out = Poisoned<uint16_t>(n * h);
    ASSERT_FALSE(HasFailure());
    const gpu::ExpertWorkspace ws = gpu::CarveExpertWorkspace(d_ws, n, c.top_k, h, m);
    LAUNCH_OK(gpu::LaunchGroupedExperts(AsBf16(d_x), d_ids, d_weights, n, c.top_k, table, act, ws,
                                        AsBf16(d_out), stream()));
    const std::vector<float> out = GetBf16(AsBf16(d_out), n * h);
    const std::string shape =
        absl::StrCat("n=", n, " E=", c.experts, " k=", c.top_k, " H=", h, " I=", m,
                     c.gpt_oss ? " gpt-oss" : "", c.concentrated ? " concentrated" : "",
                     c.skip_every ? " skips" : "", gpu::TensorCoreExperts() ? "" : " cuda-cores");
    ExpectClose(fp8 ? "grouped experts fp8" : "grouped experts bf16", shape, out, ref, 1e-2);
    if (fp8) {
      std::vector<FfnWeights> bf16_ffn;
      for (const HostExpert& e : experts) bf16_ffn.push_back(e.ffn);
      // Three E4M3 matrices in series (about 2.6% rms each, gate and up multiplied): about
      // 4.5% from the bf16 result for random weights, measured on the host. Over a few outputs
      // that figure scatters: at one token of H=64, one draw in ten passed 6% and the largest
      // of 4000 was 10.3%; at 3 x 2048 outputs all stayed under 4.7%.
      const double tol = n * h >= 4096 ? 6e-2 : 1.5e-1;
      ExpectClose("grouped experts fp8 vs bf16", shape, out, reference(bf16_ffn), tol);
    }
    // Deterministic: a second run gives the same bits, this time with a signal as a worker's
    // replayed step has: its last kernel lowers one flag and raises the other.
    uint32_t* d_flags = Put(std::vector<uint32_t>{1, 0, 0});  // clear, raise, blocks done
    gpu::GridSignal signal;
    signal.count = 1;
    signal.clear[0] = d_flags;
    signal.raise[0] = d_flags + 1;
    signal.done = d_flags + 2;
    LAUNCH_OK(gpu::LaunchGroupedExperts(AsBf16(d_x), d_ids, d_weights, n, c.top_k, table, act, ws,
                                        AsBf16(d_out), stream(), signal));
    const std::vector<float> again = GetBf16(AsBf16(d_out), n * h);
    EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0) << shape;
    EXPECT_EQ(Get(d_flags, 3), (std::vector<uint32_t>{0, 1, 0})) << shape;
  }

  // Each case in bf16 and FP8, on the tensor cores and on the CUDA cores.
  void RunCasesOnBothKernels(absl::Span<const ExpertCase> cases) {
    for (bool tensor_cores : {true, false}) {
      gpu::SetTensorCoreExperts(tensor_cores);
      for (const ExpertCase& c : cases) {
        RunCase(c, /*fp8=*/false);
        RunCase(c, /*fp8=*/true);
      }
    }
    gpu::SetTensorCoreExperts(true);
  }
};

// Steps of two tokens or more whose dims are multiples of 64 run on the tensor cores (in
// shared-memory tiles once experts average 32 tokens); each case runs with them and with the
// CUDA-core kernels (the same plan, other chunk sizes).
TEST_F(GroupedExpertTest, SwiGlu) {
  const ExpertCase cases[] = {
      {8, 2, 64, 32, 1, false, false, 0},
      {8, 2, 64, 32, 3, false, false, 0},
      {16, 8, 2048, 768, 3, false, false, 0},
      {4, 2, 128, 64, 40, false, true, 5},      // > 16 tokens per expert, skipped slots
      {5, 2, 100, 36, 3, false, false, 0},      // dims off the vector width: scalar path
      {32, 4, 1024, 512, 32, false, false, 0},  // items of up to 8 tokens on the tensor cores
      {8, 2, 256, 512, 32, false, false, 0},    // items of up to 16
      // Prefill-sized: 64-token items through shared-memory tiles, partial and full.
      {8, 2, 256, 128, 200, false, false, 0},
      {16, 4, 1024, 256, 300, false, false, 7},
      {32, 4, 128, 64, 80, false, true, 3},  // 4 experts take every slot: two items each
  };
  RunCasesOnBothKernels(cases);
}

TEST_F(GroupedExpertTest, GptOssClampedSwiGluWithBiases) {
  const ExpertCase cases[] = {
      {8, 4, 64, 64, 17, true, false, 0},
      {8, 4, 256, 128, 1, true, false, 0},
      {32, 4, 128, 64, 17, true, true, 3},
      {8, 4, 128, 64, 100, true, false, 0},  // tiled
  };
  RunCasesOnBothKernels(cases);
}

// At one token the experts' down kernel reads the routing before its PDL wait: the gate/up
// kernel lets it in only after its own wait, by which time the routing is final. Two chains hold
// the routing back behind a polling kernel that lets everything after it launch at once: a
// worker's (poll -> experts; the host copies the routing in, then raises the flag) and the
// router's in process (poll -> gate -> experts; the host copies the logits in). The routing
// starts as another valid one with NaN weights, the workspace as NaN; the output must equal, bit
// for bit, the experts' on the final routing launched plainly. A down kernel let in early reads
// experts 0-3 and NaN weights.
TEST_F(CudaOpsTest, OneTokenExpertsReadTheRoutingOnlyOnceItIsFinal) {
  constexpr int kExperts = 16, kTopK = 4;
  constexpr int64_t h = 512, m = 256;
  std::vector<float> logits = RandomFloats(kExperts);
  for (int e = 8; e < 12; ++e) logits[e] = 4.0f + e;  // experts 11, 10, 9, 8 on top
  const gpu::MoeGateParams gate{.num_experts = kExperts, .top_k = kTopK};
  const uint16_t* d_x = Put(RandomBf16(h));
  for (const bool fp8 : {false, true}) {
    std::vector<const void*> mats[3];  // gate, up, down
    std::vector<const float*> scales[3];
    for (int e = 0; e < kExperts; ++e) {
      for (int j = 0; j < 3; ++j) {
        const int64_t out = j == 2 ? h : m, width = j == 2 ? m : h;
        const std::vector<uint16_t> w = RandomBf16(out * width, 0.1f);
        if (!fp8) {
          mats[j].push_back(Put(w));
          continue;
        }
        std::vector<uint8_t> q(w.size());
        std::vector<float> scale(out);
        QuantizeBf16RowsToFp8E4M3(w.data(), out, width, q.data(), scale.data());
        mats[j].push_back(Put(q));
        scales[j].push_back(Put(scale));
      }
    }
    gpu::ExpertWeightTable table{
        .format = fp8 ? gpu::WeightFormat::kFp8E4M3 : gpu::WeightFormat::kBf16,
        .num_experts = kExperts,
        .hidden = h,
        .intermediate = m,
        .gate = Put(mats[0]),
        .up = Put(mats[1]),
        .down = Put(mats[2])};
    if (fp8) {
      table.gate_scale = Put(scales[0]);
      table.up_scale = Put(scales[1]);
      table.down_scale = Put(scales[2]);
    }
    const gpu::GluParams act;
    const size_t ws_bytes = gpu::ExpertWorkspaceBytes(1, kTopK, h, m);
    int32_t* want_ids = Poisoned<int32_t>(kTopK);
    float* want_weights = Poisoned<float>(kTopK);
    uint16_t* want = Poisoned<uint16_t>(h);
    uint8_t* want_ws = Poisoned<uint8_t>(ws_bytes);
    CUDA_ASSERT_OK(cudaDeviceSynchronize());  // the plain copies above: the legacy stream
    ASSERT_FALSE(HasFailure());
    LAUNCH_OK(gpu::LaunchMoeGate(Put(logits), 1, gate, want_ids, want_weights, stream()));
    LAUNCH_OK(gpu::LaunchGroupedExperts(AsBf16(d_x), want_ids, want_weights, 1, kTopK, table, act,
                                        gpu::CarveExpertWorkspace(want_ws, 1, kTopK, h, m),
                                        AsBf16(want), stream()));
    const std::vector<int32_t> final_ids = Get(want_ids, kTopK);
    const std::vector<float> final_weights = Get(want_weights, kTopK);
    ASSERT_EQ(final_ids, (std::vector<int32_t>{11, 10, 9, 8}));

    for (const bool in_process : {false, true}) {
      const std::string what = absl::StrCat(fp8 ? "fp8" : "bf16", in_process ? ", gate" : "");
      int32_t* ids = Put(std::vector<int32_t>{0, 1, 2, 3});
      float* weights = Poisoned<float>(kTopK);
      float* d_logits = Put(std::vector<float>(kExperts, 0.0f));
      uint32_t* d_flag = Put(std::vector<uint32_t>{0});
      uint8_t* d_ws = Poisoned<uint8_t>(ws_bytes);
      uint16_t* got = Poisoned<uint16_t>(h);
      CUDA_ASSERT_OK(cudaDeviceSynchronize());
      ASSERT_FALSE(HasFailure());
      CUDA_ASSERT_OK(gpu::LaunchFlagPoll(d_flag, 1, stream(), /*trigger_early=*/true));
      if (in_process) {
        CUDA_ASSERT_OK(gpu::LaunchMoeGate(d_logits, 1, gate, ids, weights, stream()));
      }
      CUDA_ASSERT_OK(gpu::LaunchGroupedExperts(AsBf16(d_x), ids, weights, 1, kTopK, table, act,
                                               gpu::CarveExpertWorkspace(d_ws, 1, kTopK, h, m),
                                               AsBf16(got), stream()));
      {
        SCOPED_TRACE(what);
        if (in_process) {
          ReleaseHeldStream(stream(), d_flag,
                            {{d_logits, logits.data(), kExperts * sizeof(float)}});
        } else {
          ReleaseHeldStream(stream(), d_flag,
                            {{ids, final_ids.data(), kTopK * sizeof(int32_t)},
                             {weights, final_weights.data(), kTopK * sizeof(float)}});
        }
      }
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_EQ(Get(ids, kTopK), final_ids) << what;
      EXPECT_EQ(Get(got, h), Get(want, h)) << what << ": the experts read the routing early";
    }
  }
}

TEST_F(CudaOpsTest, RepackGptOssLayout) {
  const int64_t hidden = 48, inter = 40;
  const std::vector<uint16_t> gate_up = RandomBf16(hidden * 2 * inter);
  const WeightMatrix up{.data = gate_up.data() + 1,
                        .dtype = DType::kBF16,
                        .out = inter,
                        .in = hidden,
                        .out_stride = 2,
                        .in_stride = 2 * inter};
  const std::vector<uint16_t> packed = gpu::RepackToRowMajorBf16(up);
  int64_t mismatches = 0;
  for (int64_t o = 0; o < inter; ++o) {
    for (int64_t i = 0; i < hidden; ++i) mismatches += F(packed[o * hidden + i]) != up.At(o, i);
  }
  RecordResult("repack strided -> row-major", "mismatches", static_cast<double>(mismatches), 0.0);
  EXPECT_EQ(mismatches, 0);
}

TEST_F(CudaOpsTest, SplitRoutingCopiesInputAndSignals) {
  const int64_t n = 5, h = 64;
  const int k = 4, experts = 16;
  std::vector<int32_t> ids(n * k);
  for (int32_t& e : ids) e = RandomInt(-1, experts);  // -1 and `experts` go to no worker
  const std::vector<float> weights = RandomFloats(n * k);
  std::vector<int32_t> owner(experts);
  for (int32_t& o : owner) o = RandomInt(0, 2);  // worker 2 is not among the targets
  const std::vector<uint16_t> x = RandomBf16(n * h);
  const uint16_t* d_x = Put(x);
  uint16_t* d_input = Poisoned<uint16_t>(n * h);
  const int32_t* d_ids = Put(ids);
  const float* d_weights = Put(weights);
  const int32_t* d_owner = Put(owner);
  // System scope (a worker on another GPU) and device scope (every reader on this GPU).
  for (const bool system : {true, false}) {
    SCOPED_TRACE(system ? "system scope" : "device scope");
    gpu::RoutingSplit split;
    gpu::GridSignal signal;
    signal.system = system;
    // Per target: [clear, raise]; then the blocks-done counter. The second target's flag was
    // released for good (its worker is gone): lowering leaves it up.
    uint32_t* d_flags = Put(std::vector<uint32_t>{1, 0, gpu::kFlagReleased, 0, 0});
    for (int w = 0; w < 2; ++w) {
      split.worker[w] = w;
      split.ids[w] = Poisoned<int32_t>(n * k);
      split.weights[w] = Poisoned<float>(n * k);
      signal.clear[w] = d_flags + 2 * w;
      signal.raise[w] = d_flags + 2 * w + 1;
    }
    split.count = signal.count = 2;
    signal.done = d_flags + 4;
    ASSERT_FALSE(HasFailure());
    LAUNCH_OK(gpu::LaunchSplitRouting({AsBf16(d_x), AsBf16(d_input), h}, d_ids, d_weights, n, k,
                                      d_owner, experts, split, signal, stream()));
    EXPECT_EQ(Get(d_input, n * h), x);
    for (int w = 0; w < 2; ++w) {
      const std::vector<int32_t> got_ids = Get(split.ids[w], n * k);
      const std::vector<float> got_weights = Get(split.weights[w], n * k);
      for (int64_t s = 0; s < n * k; ++s) {
        const bool mine = ids[s] >= 0 && ids[s] < experts && owner[ids[s]] == w;
        EXPECT_EQ(got_ids[s], mine ? ids[s] : -1) << "worker " << w << " slot " << s;
        EXPECT_EQ(got_weights[s], mine ? weights[s] : 0.0f) << "worker " << w << " slot " << s;
      }
    }
    EXPECT_EQ(Get(d_flags, 5), (std::vector<uint32_t>{0, 1, gpu::kFlagReleased, 1, 0}));

    // The signal alone (a run-out step): the raised flag goes down again, the other goes up.
    gpu::GridSignal alone;
    alone.system = system;
    alone.count = 1;
    alone.clear[0] = d_flags + 1;
    alone.raise[0] = d_flags;
    alone.done = d_flags + 4;
    LAUNCH_OK(gpu::LaunchSignal(alone, stream()));
    EXPECT_EQ(Get(d_flags, 5), (std::vector<uint32_t>{1, 0, gpu::kFlagReleased, 1, 0}));
  }
}

// The polling wait (the default under MPS): what follows it on the stream waits until another
// stream raises the flag; a flag the kernel before lowered is not taken for raised; a released
// flag passes.
TEST_F(CudaOpsTest, FlagPollWaitsForTheFlag) {
  cudaStream_t side = nullptr;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  // [out flag (left up by a last step), marker, in flag, blocks done]
  uint32_t* d_flags = Put(std::vector<uint32_t>{1, 0, 0, 0});
  auto read = [&] {
    std::vector<uint32_t> host(4);
    EXPECT_EQ(
        cudaMemcpyAsync(host.data(), d_flags, 4 * sizeof(uint32_t), cudaMemcpyDeviceToHost, side),
        cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(side), cudaSuccess);
    return host;
  };
  auto raise = [&](uint32_t* flag, uint32_t value) {
    EXPECT_EQ(cudaMemcpyAsync(flag, &value, sizeof(value), cudaMemcpyHostToDevice, side),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  };
  // As a step's split kernel: lower the out flag, raise the in flag; then wait on the out flag.
  gpu::GridSignal signal;
  signal.count = 1;
  signal.clear[0] = d_flags;
  signal.raise[0] = d_flags + 2;
  signal.done = d_flags + 3;
  CUDA_ASSERT_OK(gpu::LaunchSignal(signal, stream()));
  CUDA_ASSERT_OK(gpu::LaunchFlagPoll(d_flags, 1, stream()));
  CUDA_ASSERT_OK(cudaMemsetAsync(d_flags + 1, 0x01, 1, stream()));  // the marker: 1
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(stream()), cudaErrorNotReady);
  EXPECT_EQ(read(), (std::vector<uint32_t>{0, 0, 1, 0}));
  raise(d_flags, 1);  // the worker's answer
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream()));
  EXPECT_EQ(read(), (std::vector<uint32_t>{1, 1, 1, 0}));
  // Released for good: every later wait passes.
  raise(d_flags, gpu::kFlagReleased);
  LAUNCH_OK(gpu::LaunchFlagPoll(d_flags, 1, stream()));
  CUDA_ASSERT_OK(cudaStreamDestroy(side));
}

// The combine that waits for the worker's flag itself (the one-token combine): launched ahead of
// the flag, it still reads what was written before the flag went up.
TEST_F(CudaOpsTest, ACombineWaitingOnTheFlagSeesWhatItGuards) {
  const int64_t h = 2048;
  const std::vector<uint16_t> residual = RandomBf16(h), weight = RandomBf16(h),
                              fresh = RandomBf16(h);
  uint16_t* d_residual = Put(residual);
  uint16_t* d_x = Put(std::vector<uint16_t>(h, 0));  // stale until the "worker" writes it
  const uint16_t* d_weight = Put(weight);
  uint16_t* d_out = Poisoned<uint16_t>(h);
  uint32_t* d_flag = Put(std::vector<uint32_t>{0});
  ASSERT_FALSE(HasFailure());
  CUDA_ASSERT_OK(gpu::LaunchAddRmsNorm(AsBf16(d_residual), AsBf16(d_x), AsBf16(d_weight), 1, h,
                                       1e-6f, AsBf16(d_out), stream(), /*ready_flag=*/d_flag));
  ReleaseHeldStream(stream(), d_flag, {{d_x, fresh.data(), h * sizeof(uint16_t)}});
  ASSERT_FALSE(HasFatalFailure());
  // The same add + norm on the fresh data, by the plain launch.
  uint16_t* d_residual2 = Put(residual);
  const uint16_t* d_fresh = Put(fresh);
  uint16_t* d_out2 = Poisoned<uint16_t>(h);
  ASSERT_FALSE(HasFailure());
  LAUNCH_OK(gpu::LaunchAddRmsNorm(AsBf16(d_residual2), AsBf16(d_fresh), AsBf16(d_weight), 1, h,
                                  1e-6f, AsBf16(d_out2), stream()));
  EXPECT_EQ(Get(d_out, h), Get(d_out2, h));
  EXPECT_EQ(Get(d_residual, h), Get(d_residual2, h));
}

}  // namespace
}  // namespace strata::testing_cuda
