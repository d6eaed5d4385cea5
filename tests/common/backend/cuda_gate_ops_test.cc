// The fused post-attention add + norm, gate and top-k (LaunchAddNormGate) against the three
// launches it replaces: LaunchAddRmsNorm, a float GEMV of the gate and LaunchMoeGate.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/cuda/kernels/norm_kernels.h"
#include "tests/common/backend/cuda_test_util.h"

namespace strata::testing_cuda {
namespace {

struct NormGateCase {
  int64_t n, hidden;
  int experts, top_k;
  gpu::GateScoring scoring;
  bool renormalize, bias;
  float temperature;
};

// What each side of one case produced.
struct GateOutputs {
  std::vector<uint16_t> residual, normed;
  std::vector<float> logits, weights;
  std::vector<int32_t> ids;
};

class AddNormGateTest : public CudaOpsTest {
 protected:
  void SetUpCase(const NormGateCase& c) {
    c_ = c;
    residual_ = RandomBf16(c.n * c.hidden, 3.0f);
    x_ = RandomBf16(c.n * c.hidden, 1.0f);
    norm_ = RandomBf16(c.hidden, 1.5f);
    // Logits of a few units, so the softmax is neither flat nor one-hot.
    gate_ = RandomBf16(c.experts * c.hidden, 4.0f / std::sqrt(static_cast<float>(c.hidden)));
    bias_ = c.bias ? RandomBf16(c.experts, 0.5f) : std::vector<uint16_t>();
  }

  gpu::MoeGateParams Params() const {
    return {.num_experts = c_.experts,
            .top_k = c_.top_k,
            .temperature = c_.temperature,
            .scoring = c_.scoring,
            .renormalize = c_.renormalize};
  }

  // The three launches (fused = false) or the one, on fresh device copies of the inputs.
  // `launches` > 1 runs the fused kernel that many times on the same inputs (its block counter
  // must be back at zero after each).
  void Run(bool fused, GateOutputs& out, int launches = 1,
           const gpu::GateHandOff& hand_off = gpu::GateHandOff()) {
    const int64_t nh = c_.n * c_.hidden, slots = c_.n * c_.top_k;
    const uint16_t* d_x = Put(x_);
    const uint16_t* d_norm = Put(norm_);
    const uint16_t* d_gate = Put(gate_);
    const uint16_t* d_bias = c_.bias ? Put(bias_) : nullptr;
    uint16_t* d_normed = Poisoned<uint16_t>(nh);
    float* d_logits = Poisoned<float>(c_.n * c_.experts);
    int32_t* d_ids = Poisoned<int32_t>(slots);
    float* d_w = Poisoned<float>(slots);
    uint32_t* d_done = Put(std::vector<uint32_t>{0});
    uint16_t* d_res = nullptr;
    ASSERT_TRUE(d_x && d_norm && d_gate && d_normed && d_logits && d_ids && d_w && d_done);
    const float eps = 1e-6f;
    if (!fused) {
      d_res = Put(residual_);
      ASSERT_NE(d_res, nullptr);
      LAUNCH_OK(gpu::LaunchAddRmsNorm(AsBf16(d_res), AsBf16(d_x), AsBf16(d_norm), c_.n, c_.hidden,
                                      eps, AsBf16(d_normed), stream()));
      gpu::DeviceWeight w;
      w.data = d_gate;
      w.out = c_.experts;
      w.in = c_.hidden;
      w.bias = c_.bias ? AsBf16(d_bias) : nullptr;
      LAUNCH_OK(gpu::LaunchGemv(w, AsBf16(d_normed), c_.hidden, c_.n, d_logits, gpu::OutType::kF32,
                                c_.experts, stream()));
      LAUNCH_OK(gpu::LaunchMoeGate(d_logits, c_.n, Params(), d_ids, d_w, stream()));
    } else {
      for (int i = 0; i < launches; ++i) {
        d_res = Put(residual_);  // each launch adds x to the original residual
        ASSERT_NE(d_res, nullptr);
        gpu::AddNormGateArgs a;
        a.residual = AsBf16(d_res);
        a.x = AsBf16(d_x);
        a.norm_weight = AsBf16(d_norm);
        a.eps = eps;
        a.normed = AsBf16(d_normed);
        a.gate = AsBf16(d_gate);
        a.gate_bias = c_.bias ? AsBf16(d_bias) : nullptr;
        a.logits = d_logits;
        a.expert_ids = d_ids;
        a.weights = d_w;
        a.blocks_done = d_done;
        a.n = c_.n;
        a.hidden = c_.hidden;
        a.hand_off = hand_off;
        LAUNCH_OK(gpu::LaunchAddNormGate(a, Params(), stream()));
        EXPECT_EQ(Get(d_done, 1)[0], 0u) << "the block counter is left at zero";
      }
    }
    out.residual = Get(d_res, nh);
    out.normed = Get(d_normed, nh);
    out.logits = Get(d_logits, c_.n * c_.experts);
    out.ids = Get(d_ids, slots);
    out.weights = Get(d_w, slots);
  }

  std::string Shape() const {
    return absl::StrCat(
        "n=", c_.n, " H=", c_.hidden, " E=", c_.experts, " k=", c_.top_k,
        c_.scoring == gpu::GateScoring::kTopKThenSoftmax ? " topk+softmax" : " softmax+topk",
        c_.renormalize ? " renorm" : "", c_.bias ? " bias" : "", " T=", c_.temperature);
  }

  // The selections agree except for tokens whose top k + 1 scores hold two values within float
  // rounding of each other (the order is not defined there). Returns the tokens compared.
  int64_t ExpectSameSelection(const GateOutputs& ref, const GateOutputs& got) {
    int64_t compared = 0, mismatched = 0;
    std::vector<float> got_w, want_w;
    for (int64_t t = 0; t < c_.n; ++t) {
      std::vector<float> sorted(ref.logits.begin() + t * c_.experts,
                                ref.logits.begin() + (t + 1) * c_.experts);
      std::sort(sorted.rbegin(), sorted.rend());
      bool clear = true;
      for (int i = 0; i < c_.top_k && i + 1 < c_.experts; ++i) {
        const float gap = sorted[i] - sorted[i + 1];
        if (gap < 1e-5f * std::max(1.0f, std::fabs(sorted[i]))) clear = false;
      }
      if (!clear) continue;
      ++compared;
      for (int s = 0; s < c_.top_k; ++s) {
        mismatched += got.ids[t * c_.top_k + s] != ref.ids[t * c_.top_k + s];
        got_w.push_back(got.weights[t * c_.top_k + s]);
        want_w.push_back(ref.weights[t * c_.top_k + s]);
      }
    }
    RecordResult("add+norm+gate ids (mismatches)", Shape(), static_cast<double>(mismatched), 0.0);
    EXPECT_EQ(mismatched, 0) << Shape();
    if (!got_w.empty()) ExpectClose("add+norm+gate weights", Shape(), got_w, want_w, 1e-5);
    return compared;
  }

  NormGateCase c_;
  std::vector<uint16_t> residual_, x_, norm_, gate_, bias_;
};

TEST_F(AddNormGateTest, MatchesTheThreeLaunches) {
  using gpu::GateScoring;
  const NormGateCase cases[] = {
      {1, 2048, 128, 8, GateScoring::kSoftmaxThenTopK, true, false, 1.0f},  // qwen3-30b-a3b
      {2, 4096, 8, 2, GateScoring::kSoftmaxThenTopK, false, false, 1.0f},   // mixtral, 1 block
      {3, 64, 60, 4, GateScoring::kSoftmaxThenTopK, true, false, 0.7f},     // 60 experts
      {4, 2880, 32, 4, GateScoring::kTopKThenSoftmax, false, true, 1.0f},   // gpt-oss, 46 KB
      {1, 1024, 256, 8, GateScoring::kSoftmaxThenTopK, false, true, 1.3f},  // 256 experts
      {4, 2048, 128, 8, GateScoring::kSoftmaxThenTopK, true, false, 2.0f},
  };
  int64_t tokens = 0, compared = 0;  // near ties are skipped: most tokens must be compared
  for (const NormGateCase& c : cases) {
    SetUpCase(c);
    ASSERT_TRUE(gpu::AddNormGateFits(c.n, c.hidden, Params())) << Shape();
    GateOutputs ref, got;
    Run(/*fused=*/false, ref);
    Run(/*fused=*/true, got, /*launches=*/2);
    ASSERT_FALSE(HasFatalFailure()) << Shape();
    // Same per-thread sums and reduction as LaunchAddRmsNorm: identical bits.
    EXPECT_EQ(got.residual, ref.residual) << Shape();
    EXPECT_EQ(got.normed, ref.normed) << Shape();
    ExpectClose("add+norm+gate logits", Shape(), got.logits, ref.logits, 1e-5);
    tokens += c.n;
    compared += ExpectSameSelection(ref, got);
  }
  EXPECT_GE(compared, tokens / 2) << "too many near ties to compare the selections";
}

// With a hand-off the last block also does LaunchSplitRouting's work: the normed rows in the
// workers' input, each target's routing (other workers' experts -1), then the flags.
TEST_F(AddNormGateTest, HandOffCopiesSplitsAndSignals) {
  using gpu::GateScoring;
  const NormGateCase cases[] = {
      {1, 2048, 128, 8, GateScoring::kSoftmaxThenTopK, true, false, 1.0f},
      {3, 64, 60, 4, GateScoring::kTopKThenSoftmax, false, true, 1.0f},
  };
  for (const NormGateCase& c : cases) {
    SetUpCase(c);
    const int64_t slots = c.n * c.top_k;
    std::vector<int32_t> owner(c.experts);
    for (int32_t& o : owner) o = RandomInt(0, 2);  // three workers; workers 0 and 2 take part
    const int targets[] = {0, 2};
    gpu::GateHandOff h;
    h.active = true;
    h.input = AsBf16(Poisoned<uint16_t>(c.n * c.hidden));
    h.owner = Put(owner);
    for (int i = 0; i < 2; ++i) {
      h.split.worker[i] = targets[i];
      h.split.ids[i] = Poisoned<int32_t>(slots);
      h.split.weights[i] = Poisoned<float>(slots);
    }
    h.split.count = 2;
    // Each target's output flag is still up from a last step, its input flag down.
    uint32_t* flags = Put(std::vector<uint32_t>{1, 0, 1, 0});
    for (int i = 0; i < 2; ++i) {
      h.signal.clear[i] = flags + 2 * i;
      h.signal.raise[i] = flags + 2 * i + 1;
    }
    h.signal.count = 2;
    h.signal.done = Put(std::vector<uint32_t>{0});
    h.signal.system = false;
    ASSERT_FALSE(HasFailure());
    GateOutputs got;
    Run(/*fused=*/true, got, /*launches=*/1, h);
    ASSERT_FALSE(HasFatalFailure()) << Shape();
    EXPECT_EQ(Get(reinterpret_cast<const uint16_t*>(h.input), c.n * c.hidden), got.normed)
        << Shape();
    for (int i = 0; i < 2; ++i) {
      const std::vector<int32_t> ids = Get(h.split.ids[i], slots);
      const std::vector<float> w = Get(h.split.weights[i], slots);
      for (int64_t s = 0; s < slots; ++s) {
        const bool mine = owner[got.ids[s]] == targets[i];
        EXPECT_EQ(ids[s], mine ? got.ids[s] : -1) << Shape() << " target " << i << " slot " << s;
        EXPECT_EQ(w[s], mine ? got.weights[s] : 0.0f) << Shape() << " target " << i;
      }
    }
    EXPECT_EQ(Get(flags, 4), (std::vector<uint32_t>{0, 1, 0, 1})) << Shape();
  }
}

// Host checks only: runs without a GPU too.
TEST(AddNormGateLimitsTest, RefusesWhatDoesNotFit) {
  const gpu::MoeGateParams p{.num_experts = 128, .top_k = 8, .renormalize = true};
  EXPECT_TRUE(gpu::AddNormGateFits(4, 2048, p));
  EXPECT_TRUE(gpu::AddNormGateFits(2, 4096, p));
  EXPECT_TRUE(gpu::AddNormGateFits(4, 2944, p));   // 46 KB: the last that fits
  EXPECT_FALSE(gpu::AddNormGateFits(4, 2952, p));  // 8 bytes a token more
  EXPECT_FALSE(gpu::AddNormGateFits(5, 2048, p));  // too many tokens
  EXPECT_FALSE(gpu::AddNormGateFits(1, 2052, p));  // not a multiple of 8
  EXPECT_FALSE(gpu::AddNormGateFits(1, 8192, p));  // a gate row too long
  EXPECT_FALSE(gpu::AddNormGateFits(4, 4096, p));  // 64 KB of shared memory
  EXPECT_FALSE(gpu::AddNormGateFits(3, 4096, p));  // 48 KB, with the static arrays past it
  gpu::MoeGateParams bad = p;
  bad.top_k = 9;
  EXPECT_FALSE(gpu::AddNormGateFits(1, 2048, bad));
  gpu::AddNormGateArgs a;  // null pointers: refused before anything is launched
  a.n = 1;
  a.hidden = 2048;
  EXPECT_FALSE(gpu::AddNormGateAccepts(a, p));
  EXPECT_EQ(gpu::LaunchAddNormGate(a, p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace strata::testing_cuda
