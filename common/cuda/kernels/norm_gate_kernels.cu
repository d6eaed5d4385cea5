#include <cstdlib>
#include <cstring>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/grid_signal.cuh"
#include "common/cuda/kernels/expert_split.cuh"
#include "common/cuda/kernels/moe_gate_select.cuh"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;  // one gate row (expert) a warp
constexpr int64_t kMaxTokens = 4;
constexpr int64_t kMaxHidden = 4096;
constexpr int kMaxExperts = 256;  // the fused gate's score array
// A block's shared memory without opting in: 48 KB, the static arrays' share included.
constexpr int64_t kStaticSharedBytes = 2048;  // checked against the arrays below
constexpr int64_t kMaxDynamicSharedBytes = 48 * 1024 - kStaticSharedBytes;

// The dynamic part: the step's new residual and normed rows, bf16.
int64_t DynamicSharedBytes(int64_t n, int64_t hidden) { return 2 * n * hidden * 2; }

// The fixed-size shared arrays of a block.
struct GateShared {
  float scratch[kWarps];
  float score[kMaxExperts];
  float kept[kMaxGateTopK];
  int kept_id[kMaxGateTopK];
  int32_t route_id[kMaxTokens * kMaxGateTopK];  // the selection, for the hand-off
  float route_w[kMaxTokens * kMaxGateTopK];
  bool last;
};
static_assert(sizeof(GateShared) <= kStaticSharedBytes, "the static shared budget is too small");

// Activations the kernels before wrote: read through L2, never a stale line of this SM's L1.
__device__ __forceinline__ void LoadActivation(const bf16* p, float (&v)[8]) {
  UnpackBf16x8(__ldcg(reinterpret_cast<const uint4*>(p)), v);
}

// kNT: tokens the accumulators are compiled for (n <= kNT); kCL: 16-byte chunks of a gate row
// per lane (hidden <= kCL * 32 * 8).
template <int kNT, int kCL>
__global__ void __launch_bounds__(kThreads)
    AddNormGateKernel(const __grid_constant__ AddNormGateArgs a, const MoeGateParams p) {
  extern __shared__ uint4 shared_vectors[];
  bf16* s_sum = reinterpret_cast<bf16*>(shared_vectors);  // [n][hidden]: the new residual
  bf16* s_normed = s_sum + a.n * a.hidden;                // [n][hidden]
  __shared__ GateShared sh;
  float* scratch = sh.scratch;
  PdlLaunchDependents();
  const int lane = threadIdx.x % kWarpSize;
  const int e = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  const bool has_row = e < p.num_experts;
  const int n = static_cast<int>(a.n);
  const int64_t hidden = a.hidden;
  const int64_t chunks = hidden / 8;

  // The gate's weights do not come from the kernels before: loaded ahead of the wait.
  uint4 w[kCL];
  const uint4* row = reinterpret_cast<const uint4*>(a.gate + int64_t{has_row ? e : 0} * hidden);
#pragma unroll
  for (int j = 0; j < kCL; ++j) {
    const int64_t c = lane + int64_t{j} * kWarpSize;
    w[j] = has_row && c < chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
  }
  const float bias = has_row && a.gate_bias != nullptr ? __bfloat162float(a.gate_bias[e]) : 0.0f;
  PdlWait();

  // Every block normalizes the whole step (a few KB from L2), with LaunchAddRmsNorm's per-thread
  // sums and reduction, so its outputs are that kernel's bit for bit.
  for (int t = 0; t < n; ++t) {
    const bf16* src = a.x + t * hidden;
    const bf16* res = a.residual + t * hidden;
    bf16* sum_row = s_sum + t * hidden;
    float sum_sq = 0.0f;
    for (int64_t i = int64_t{threadIdx.x} * 8; i < hidden; i += int64_t{kThreads} * 8) {
      float v[8], r[8];
      LoadActivation(src + i, v);
      LoadActivation(res + i, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[j] = __bfloat162float(__float2bfloat16(v[j] + r[j]));
        sum_sq += v[j] * v[j];
      }
      StoreBf16x8(sum_row + i, v);
    }
    sum_sq = BlockSum(sum_sq, scratch);
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + a.eps);
    for (int64_t i = int64_t{threadIdx.x} * 8; i < hidden; i += int64_t{kThreads} * 8) {
      float v[8], nw[8];
      UnpackBf16x8(*reinterpret_cast<const uint4*>(sum_row + i), v);  // this thread's own store
      LoadAsFloat<8>(a.norm_weight + i, nw);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = nw[j] * (v[j] * inv);
      StoreBf16x8(s_normed + t * hidden + i, v);
    }
  }
  __syncthreads();

  // This warp's gate row against every token.
  float acc[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) acc[t] = 0.0f;
#pragma unroll
  for (int j = 0; j < kCL; ++j) {
    const int64_t c = lane + int64_t{j} * kWarpSize;
    if (c >= chunks) continue;
    float wv[8];
    UnpackBf16x8(w[j], wv);
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      if (t >= n) continue;
      float xv[8];
      UnpackBf16x8(*reinterpret_cast<const uint4*>(s_normed + t * hidden + c * 8), xv);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t] = fmaf(wv[k], xv[k], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    if (t >= n) continue;
    const float v = WarpSum(acc[t]);
    if (lane == 0 && has_row) a.logits[t * p.num_experts + e] = v + bias;
  }
  if (lane == 0 && has_row) __threadfence();  // the logits before this block's count
  __syncthreads();

  // The last block to finish selects (the others' logits are visible through its count).
  if (gridDim.x > 1) {
    if (threadIdx.x == 0) {
      sh.last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
      if (sh.last) atomicExch(a.blocks_done, 0u);
    }
    __syncthreads();
    if (!sh.last) return;
    __threadfence();
  }
  // Every other block has read the residual by now: the new one goes out.
  for (int t = 0; t < n; ++t) {
    const uint4* sum_row = reinterpret_cast<const uint4*>(s_sum + t * hidden);
    const uint4* normed_row = reinterpret_cast<const uint4*>(s_normed + t * hidden);
    uint4* residual = reinterpret_cast<uint4*>(a.residual + t * hidden);
    uint4* normed = reinterpret_cast<uint4*>(a.normed + t * hidden);
    uint4* input =
        a.hand_off.active ? reinterpret_cast<uint4*>(a.hand_off.input + t * hidden) : nullptr;
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
      residual[c] = sum_row[c];
      normed[c] = normed_row[c];
      if (input != nullptr) input[c] = normed_row[c];
    }
  }

  // Selection by rank: expert x's rank is the number of experts that rank before it (score,
  // then lower id); NaN scores count as -inf so that every rank is taken exactly once. A
  // softmax renormalized over the kept experts is the softmax of their logits alone (the full
  // sum cancels): selected on the logits, with no pass over all of them.
  MoeGateParams select = p;
  if (p.scoring == GateScoring::kSoftmaxThenTopK && p.renormalize) {
    select.scoring = GateScoring::kTopKThenSoftmax;
  }
  const int x = threadIdx.x;
  const bool is_expert = x < p.num_experts;
  for (int t = 0; t < n; ++t) {
    float v = is_expert ? __ldcg(a.logits + t * p.num_experts + x) / p.temperature : -INFINITY;
    if (select.scoring == GateScoring::kSoftmaxThenTopK) {
      const float m = BlockMax(v, scratch);
      const float ev = is_expert ? expf(v - m) : 0.0f;
      const float sum = BlockSum(ev, scratch);
      v = is_expert ? ev / sum : -INFINITY;
    }
    if (v != v) v = -INFINITY;
    if (is_expert) sh.score[x] = v;
    __syncthreads();
    if (is_expert) {
      int rank = 0;
#pragma unroll 8
      for (int j = 0; j < p.num_experts; ++j) rank += RanksBefore(sh.score[j], j, v, x) ? 1 : 0;
      if (rank < p.top_k) {
        sh.kept[rank] = v;
        sh.kept_id[rank] = x;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float kept[kMaxGateTopK];
      int kept_id[kMaxGateTopK];
#pragma unroll
      for (int i = 0; i < kMaxGateTopK; ++i) {
        kept[i] = i < p.top_k ? sh.kept[i] : 0.0f;
        kept_id[i] = i < p.top_k ? sh.kept_id[i] : -1;
      }
      WriteGateSelection(kept, kept_id, select, a.expert_ids + t * p.top_k,
                         a.weights + t * p.top_k);
      for (int i = 0; i < p.top_k; ++i) {
        sh.route_id[t * p.top_k + i] = kept_id[i];
        sh.route_w[t * p.top_k + i] = kept[i];
      }
    }
  }
  if (!a.hand_off.active) return;

  // The hand-off: each worker's routing (LaunchSplitRouting's), then the flags.
  __syncthreads();
  const GateHandOff& h = a.hand_off;
  for (int s = threadIdx.x; s < n * p.top_k; s += kThreads) {
    const int32_t e = sh.route_id[s];
    WriteSplitSlot(h.split, s, e, sh.route_w[s],
                   e >= 0 && e < p.num_experts ? __ldcg(h.owner + e) : -1);
  }
  __syncthreads();
  if (threadIdx.x == 0) RaiseSignal(h.signal);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int kNT>
cudaError_t LaunchForTokens(const AddNormGateArgs& a, const MoeGateParams& p, unsigned blocks,
                            size_t shared_bytes, cudaStream_t stream) {
  if (a.hidden / 8 <= 8 * kWarpSize) {
    return LaunchPdl(AddNormGateKernel<kNT, 8>, dim3(blocks), dim3(kThreads), shared_bytes, stream,
                     a, p);
  }
  return LaunchPdl(AddNormGateKernel<kNT, 16>, dim3(blocks), dim3(kThreads), shared_bytes, stream,
                   a, p);
}

}  // namespace

bool AddNormGateFits(int64_t n, int64_t hidden, const MoeGateParams& params) {
  return n >= 1 && n <= kMaxTokens && hidden > 0 && hidden % 8 == 0 && hidden <= kMaxHidden &&
         DynamicSharedBytes(n, hidden) <= kMaxDynamicSharedBytes && ValidMoeGateParams(params) &&
         params.num_experts <= kMaxExperts &&
         params.scoring != GateScoring::kSigmoidGrouped;  // LaunchMoeGate's alone
}

bool AddNormGateAccepts(const AddNormGateArgs& a, const MoeGateParams& p) {
  if (!AddNormGateFits(a.n, a.hidden, p) || a.residual == nullptr || a.x == nullptr ||
      a.norm_weight == nullptr || a.normed == nullptr || a.gate == nullptr || a.logits == nullptr ||
      a.expert_ids == nullptr || a.weights == nullptr || a.blocks_done == nullptr ||
      a.normed == a.residual || !Aligned16(a.residual) || !Aligned16(a.x) ||
      !Aligned16(a.norm_weight) || !Aligned16(a.normed) || !Aligned16(a.gate)) {
    return false;
  }
  const GateHandOff& h = a.hand_off;
  if (!h.active) return true;
  if (h.input == nullptr || !Aligned16(h.input) || h.owner == nullptr || h.split.count < 0 ||
      h.split.count > kMaxSplitTargets || !ValidSignal(h.signal)) {
    return false;
  }
  for (int i = 0; i < h.split.count; ++i) {
    if (h.split.ids[i] == nullptr || h.split.weights[i] == nullptr) return false;
  }
  return true;
}

cudaError_t LaunchAddNormGate(const AddNormGateArgs& a, const MoeGateParams& p,
                              cudaStream_t stream) {
  if (!AddNormGateAccepts(a, p)) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((p.num_experts + kWarps - 1) / kWarps);
  const size_t shared_bytes = static_cast<size_t>(DynamicSharedBytes(a.n, a.hidden));
  if (a.n == 1) return LaunchForTokens<1>(a, p, blocks, shared_bytes, stream);
  if (a.n == 2) return LaunchForTokens<2>(a, p, blocks, shared_bytes, stream);
  return LaunchForTokens<4>(a, p, blocks, shared_bytes, stream);
}

}  // namespace strata::gpu
