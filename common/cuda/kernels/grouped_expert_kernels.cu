#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/cuda/grid_signal.cuh"
#include "common/cuda/kernels/expert_activation.cuh"
#include "common/cuda/kernels/gemv_core.cuh"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/cuda/kernels/grouped_expert_mma.h"
#include "common/util/tunables.h"

namespace strata::gpu {
namespace {

constexpr int kPlanThreads = 256;
constexpr int kPlanPerThread = kMaxGroupedExperts / kPlanThreads;

// Slots per work item, a token-count bucket the kernels are compiled for: twice the slots an
// active expert gets on average (n x top_k over the experts), at most 8 unless the average
// alone fills 16 (prefill). An expert's weights are then read about once for its tokens, and
// no item carries accumulators for tokens that never come: on the H200, 32 tokens of Qwen3's
// 128 experts (about 2 each) took 921 us in items of 16 against 453 in items of 4, and 32
// tokens of Mixtral's 8 experts (about 8 each) 3.5 ms in items of 16 against 2.6 ms in items
// of 8 (bench/profiles/grouped-experts-chunk-h200.txt). An expert is selected at most once per
// token, so it never has more than n slots.
// The slots an active expert gets on average (n x top_k over the experts that can be active),
// rounded up: what every choice of kernel and item size below goes by.
int64_t AverageSlots(int64_t n, int top_k, int num_experts) {
  const int64_t slots = n * top_k;
  const int64_t active = std::max<int64_t>(1, std::min<int64_t>(slots, num_experts));
  return (slots + active - 1) / active;
}

int ChunkTokens(int64_t n, int top_k, int num_experts) {
  const int64_t average = AverageSlots(n, top_k, num_experts);
  const int64_t want = std::min<int64_t>(n, 2 * average);
  if (want <= 1) return 1;
  if (want == 2) return 2;
  if (want <= 4) return 4;
  return average >= 16 ? 16 : 8;
}

// The tensor-core kernels take a work item's tokens as the MMA's N, 8 a tile: items of up to 8
// tokens, or 16 where an active expert averages more than 4 slots (fewer items, so fewer
// experts' weights read twice).
int MmaChunkTokens(int64_t n, int top_k, int num_experts) {
  return AverageSlots(n, top_k, num_experts) > 4 ? 16 : 8;
}

std::atomic<int> tensor_core_experts{-1};  // -1: not yet read from the environment
std::atomic<bool> tiled_experts{true};

bool UseMma(int64_t n, const ExpertWeightTable& w) {
  return n >= 2 && TensorCoreExperts() && MmaExpertShapesFit(w);
}

// Which kernels a step's stages run and the tokens a work item takes: the plan and both stages
// must agree on it, so a step reads the switch once (LaunchGroupedExperts).
struct ExpertKernels {
  bool mma;
  int chunk;
  bool tiled;  // the shared-memory tiles of kTiledChunkTokens tokens (mma too)
};

// Prefill-sized steps take the tiled kernels: an active expert averaging half their 64-token
// items or more, so few items run part-empty. They gather x in 16-byte pieces.
ExpertKernels ChooseKernels(int64_t n, int top_k, const ExpertWeightTable& w, bool x_aligned) {
  const bool mma = UseMma(n, w);
  if (mma && x_aligned && tiled_experts.load() && TiledExpertShapesFit(w) &&
      AverageSlots(n, top_k, w.num_experts) >= kTiledChunkTokens / 2) {
    return {true, kTiledChunkTokens, true};
  }
  return {mma, mma ? MmaChunkTokens(n, top_k, w.num_experts) : ChunkTokens(n, top_k, w.num_experts),
          false};
}

// Upper bound on work items: sum over experts of ceil(count / chunk).
int64_t MaxWork(int64_t slots, int num_experts, int chunk) {
  const int64_t active = slots < num_experts ? slots : num_experts;
  const int64_t bound = active + slots / chunk;
  return bound < slots ? bound : slots;
}

size_t RoundUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Exclusive prefix sum over the block of one int per thread; *total gets the block's sum.
__device__ int BlockExclusiveScan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  int inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == kWarpSize - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kPlanThreads / kWarpSize; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return before + inclusive - v;
}

// One block: counts slots per expert, lays the slots out grouped by expert (in slot order
// within an expert, so the plan is deterministic), and cuts each expert's run into items.
__global__ void __launch_bounds__(kPlanThreads)
    ExpertPlanKernel(const int32_t* __restrict__ expert_ids, int slots, int num_experts, int chunk,
                     ExpertWorkspace ws, uint32_t* use_counts) {
  __shared__ int count[kMaxGroupedExperts];
  __shared__ int offset[kMaxGroupedExperts];
  __shared__ int work_offset[kMaxGroupedExperts];
  __shared__ int fill[kMaxGroupedExperts];
  __shared__ int warp_sums[kPlanThreads / kWarpSize];
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) count[e] = fill[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += kPlanThreads) {
    const int32_t e = expert_ids[s];
    if (ValidExpert(e, num_experts)) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (use_counts != nullptr) {
    for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) {
      if (count[e] > 0) atomicAdd(use_counts + e, 1u);
    }
  }

  // Thread i owns experts [i * kPlanPerThread, (i + 1) * kPlanPerThread).
  const int e0 = threadIdx.x * kPlanPerThread;
  int my_slots = 0, my_items = 0;
#pragma unroll
  for (int j = 0; j < kPlanPerThread; ++j) {
    const int c = e0 + j < num_experts ? count[e0 + j] : 0;
    my_slots += c;
    my_items += (c + chunk - 1) / chunk;
  }
  int total_slots, total_items;
  int slot_base = BlockExclusiveScan(my_slots, warp_sums, &total_slots);
  int item_base = BlockExclusiveScan(my_items, warp_sums, &total_items);
#pragma unroll
  for (int j = 0; j < kPlanPerThread; ++j) {
    const int e = e0 + j;
    if (e >= num_experts) break;
    offset[e] = slot_base;
    work_offset[e] = item_base;
    slot_base += count[e];
    item_base += (count[e] + chunk - 1) / chunk;
  }
  __syncthreads();

  // Slots into their expert's run: one warp, 32 slots at a time, ranks by lane order.
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    for (int base = 0; base < slots; base += kWarpSize) {
      const int s = base + lane;
      int32_t e = s < slots ? expert_ids[s] : -1;
      if (!ValidExpert(e, num_experts)) e = -1;
      const unsigned peers = __match_any_sync(kFullMask, e);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (e >= 0) ws.sorted_slots[offset[e] + fill[e] + rank] = s;
      __syncwarp();
      if (e >= 0 && rank == 0) fill[e] += __popc(peers);
      __syncwarp();
    }
  }
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) {
    const int items = (count[e] + chunk - 1) / chunk;
    for (int j = 0; j < items; ++j) {
      int32_t* item = ws.work + 4 * (work_offset[e] + j);
      item[0] = e;
      item[1] = offset[e] + j * chunk;
      item[2] = min(chunk, count[e] - j * chunk);
      item[3] = 0;
    }
  }
  if (threadIdx.x == 0) *ws.num_work = total_items;
}

template <int kNT>
inline constexpr int kPairRowsFor = kNT <= 4 ? 2 : 1;  // gate (and up) rows per thread group

// Grid: (row tiles of the intermediate dim, work items). Each thread group computes kP rows
// of gate and the same kP rows of up for the item's slots, then applies the activation.
// kDirect (one token, no plan): work item y is slot y, its expert read from the routing.
template <typename WT, int kE, int kNT, bool kDirect = false>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<kNT, WT>)
    ExpertGateUpKernel(const bf16* __restrict__ x, int top_k, ExpertWeightTable w, GluParams act,
                       ExpertWorkspace ws, int num_parts,
                       const int32_t* __restrict__ expert_ids = nullptr) {
  constexpr int kP = kPairRowsFor<kNT>;
  constexpr int kRows = 2 * kP;
  __shared__ float red[kGemvThreads / kWarpSize * kRows * kNT];
  __shared__ float totals[kGemvThreads / kWarpSize][kRows * kNT];
  PdlWait();  // the routing and x come from the kernels before
  // Only now: the down kernel reads the routing before its own wait (its weights' addresses).
  PdlLaunchDependents();
  int e, first, count;
  if constexpr (kDirect) {
    e = expert_ids[blockIdx.y];
    if (!ValidExpert(e, w.num_experts)) return;  // the down pass skips this slot too
    first = static_cast<int>(blockIdx.y);
    count = 1;
  } else {
    if (static_cast<int>(blockIdx.y) >= *ws.num_work) return;
    const int32_t* item = ws.work + 4 * blockIdx.y;
    e = item[0];
    first = item[1];
    count = item[2];
  }
  // Slot of the item's t-th token: sorted by the plan, or the block's own slot.
  auto slot_at = [&](int t) { return kDirect ? first : ws.sorted_slots[first + t]; };
  const int group = threadIdx.x / num_parts;
  const int part = threadIdx.x % num_parts;
  const int64_t i0 = (int64_t{blockIdx.x} * (kGemvThreads / num_parts) + group) * kP;
  const int64_t inter = w.intermediate;
  const WT* gate = static_cast<const WT*>(w.gate[e]);
  const WT* up = static_cast<const WT*>(w.up[e]);
  const WT* wr[kRows];
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const int64_t i = min(i0 + p, inter - 1);
    wr[p] = gate + i * w.hidden;
    wr[kP + p] = up + i * w.hidden;
  }
  const bf16* xr[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) xr[t] = x + int64_t{slot_at(min(t, count - 1)) / top_k} * w.hidden;
  float acc[kRows][kNT];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;
  }
  // Part idx < kP * kNT applies the activation to (row i0 + idx / kNT, token idx % kNT)
  // below: its scales and biases are loaded now, with the weights, rather than as a DRAM
  // round trip after the reduction.
  static_assert(kP * kNT <= kWarpSize, "one pass of the activation loop");
  const bool emits = part < kP * kNT;
  const int64_t my_i = min(i0 + part / kNT, inter - 1);
  const bool fp8 = emits && w.format == WeightFormat::kFp8E4M3;
  const float g_scale = fp8 ? w.gate_scale[e][my_i] : 1.0f;
  const float u_scale = fp8 ? w.up_scale[e][my_i] : 1.0f;
  const bool g_biased = emits && w.gate_bias != nullptr && w.gate_bias[e] != nullptr;
  const bool u_biased = emits && w.up_bias != nullptr && w.up_bias[e] != nullptr;
  const float g_bias = g_biased ? __bfloat162float(w.gate_bias[e][my_i]) : 0.0f;
  const float u_bias = u_biased ? __bfloat162float(w.up_bias[e][my_i]) : 0.0f;
  AccumulateDots<WT, kE, kRows, kNT>(wr, xr, count, w.hidden, part, num_parts, acc);
  GroupReduce<kRows, kNT>(acc, num_parts, red,
                          [&](int r, int t, float v) { totals[group][r * kNT + t] = v; });
  __syncthreads();
  if (emits) {
    const int p = part / kNT;
    const int t = part % kNT;
    const int64_t i = i0 + p;
    if (i < inter && t < count) {
      const float g = totals[group][p * kNT + t] * g_scale + g_bias;
      const float u = totals[group][(kP + p) * kNT + t] * u_scale + u_bias;
      ws.h[int64_t{slot_at(t)} * inter + i] = __float2bfloat16(Activate(g, u, act));
    }
  }
}

// Grid: (row tiles of the hidden dim, work items): y[slot] = down_e h[slot] + bias.
template <typename WT, int kE, int kNT>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<kNT, WT>)
    ExpertDownKernel(ExpertWeightTable w, ExpertWorkspace ws, int num_parts) {
  constexpr int kRows = kNT <= 4 ? 4 : 2;
  __shared__ float red[kGemvThreads / kWarpSize * kRows * kNT];
  if (static_cast<int>(blockIdx.y) >= *ws.num_work) return;
  const int32_t* item = ws.work + 4 * blockIdx.y;
  const int e = item[0];
  const int first = item[1];
  const int count = item[2];
  const int group = threadIdx.x / num_parts;
  const int64_t o0 = (int64_t{blockIdx.x} * (kGemvThreads / num_parts) + group) * kRows;
  const WT* down = static_cast<const WT*>(w.down[e]);
  const WT* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = down + min(o0 + r, w.hidden - 1) * w.intermediate;
  const bf16* xr[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    xr[t] = ws.h + int64_t{ws.sorted_slots[first + min(t, count - 1)]} * w.intermediate;
  }
  float acc[kRows][kNT];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;
  }
  AccumulateDots<WT, kE, kRows, kNT>(wr, xr, count, w.intermediate, threadIdx.x % num_parts,
                                     num_parts, acc);
  GroupReduce<kRows, kNT>(acc, num_parts, red, [&](int r, int t, float v) {
    const int64_t o = o0 + r;
    if (o >= w.hidden || t >= count) return;
    if (w.format == WeightFormat::kFp8E4M3) v *= w.down_scale[e][o];
    if (w.down_bias != nullptr && w.down_bias[e] != nullptr)
      v += __bfloat162float(w.down_bias[e][o]);
    ws.y[int64_t{ws.sorted_slots[first + t]} * w.hidden + o] = v;
  });
}

// One token (n == 1), down and combine in one pass: out[o] = sum over the valid slots s of
// weight_s * (scale_e[o] * (down_e[o] . h_s) + bias_e[o]). A thread group owns kDownRows output
// rows and strides over the chunks of all valid slots' rows as one long row, so the 8 experts'
// reads spread over every block instead of one expert per block; y and the combine kernel
// are skipped. coef[v][row] holds weight_v * scale_e[row] for the block's rows.
constexpr int kMaxDirectSlots = 32;  // top_k limit of this path (one warp builds the slot list)
constexpr int kDownRows = 2;

template <typename WT, int kE>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<1, WT>)
    ExpertDownCombineKernel(const int32_t* __restrict__ expert_ids,
                            const float* __restrict__ weights, int top_k, ExpertWeightTable w,
                            const bf16* __restrict__ h, bf16* __restrict__ out, int num_parts,
                            GridSignal signal) {
  constexpr int kMaxBlockRows = kGemvThreads / kWarpSize * kDownRows;
  __shared__ float red[kGemvThreads / kWarpSize * kDownRows];
  __shared__ const WT* base[kMaxDirectSlots];
  __shared__ int expert_of[kMaxDirectSlots];
  __shared__ int slot_of[kMaxDirectSlots];
  __shared__ float coef[kMaxDirectSlots][kMaxBlockRows];
  __shared__ int num_valid;
  // The routing was final before the gate/up kernel passed its wait, which it did before
  // letting this kernel in: the slot list, the coefficients and the first weight loads go
  // ahead of the wait for h, over the gate/up kernel's tail. The routing is read through L2
  // (__ldcg): an earlier layer's routing at the same address may sit in this SM's L1.
  PdlLaunchDependents();
  const int groups = kGemvThreads / num_parts;
  const int64_t block_row0 = int64_t{blockIdx.x} * groups * kDownRows;
  const int block_rows = groups * kDownRows;
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    const int32_t e = lane < top_k ? __ldcg(expert_ids + lane) : -1;
    const bool valid = ValidExpert(e, w.num_experts);
    const unsigned mask = __ballot_sync(kFullMask, valid);
    const int v = __popc(mask & ((1u << lane) - 1u));
    if (valid) {
      base[v] = static_cast<const WT*>(w.down[e]);
      expert_of[v] = e;
      slot_of[v] = lane;
      // One token: its top-k are distinct experts, each one use of the step.
      if (blockIdx.x == 0 && w.use_counts != nullptr) atomicAdd(w.use_counts + e, 1u);
    }
    if (lane == 0) num_valid = __popc(mask);
  }
  __syncthreads();
  const int nv = num_valid;
  for (int i = threadIdx.x; i < nv * block_rows; i += kGemvThreads) {
    const int v = i / block_rows;
    const int64_t o = min(block_row0 + i % block_rows, w.hidden - 1);
    float c = __ldcg(weights + slot_of[v]);
    if (w.format == WeightFormat::kFp8E4M3) c *= w.down_scale[expert_of[v]][o];
    coef[v][i % block_rows] = c;
  }
  __syncthreads();

  const int group = threadIdx.x / num_parts;
  const int part = threadIdx.x % num_parts;
  const int row_in_block = group * kDownRows;
  const int64_t o0 = block_row0 + row_in_block;
  int64_t orow[kDownRows];
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) orow[r] = min(o0 + r, w.hidden - 1);
  const int64_t inter = w.intermediate;
  const int64_t per_slot = inter / kE;
  const int64_t chunks = nv * per_slot;
  constexpr int kU = 4;
  float acc[kDownRows] = {};
  for (int64_t c0 = part; c0 < chunks; c0 += int64_t{num_parts} * kU) {
    RawChunk<WT, kE> raw[kU][kDownRows];
    int vs[kU];
    int64_t cs[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = min(c0 + int64_t{u} * num_parts, chunks - 1);
      vs[u] = static_cast<int>(c / per_slot);
      cs[u] = c % per_slot;
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) {
        raw[u][r] = LoadChunk<WT, kE>(base[vs[u]] + orow[r] * inter + cs[u] * kE);
      }
    }
    if (c0 == part) PdlWait();  // h is needed now
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (c0 + int64_t{u} * num_parts < chunks) {
        const bf16* hx[1] = {h + int64_t{slot_of[vs[u]]} * inter};
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) {
          float dot[1] = {0.0f};
          DotChunk<WT, kE, 1>(raw[u][r], hx, cs[u], 1, dot);
          acc[r] = fmaf(coef[vs[u]][row_in_block + r], dot[0], acc[r]);
        }
      }
    }
  }
  PdlWait();  // threads with no chunks; out is written below
  float acc2[kDownRows][1];
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) acc2[r][0] = acc[r];
  GroupReduce<kDownRows, 1>(acc2, num_parts, red, [&](int r, int, float v) {
    const int64_t o = o0 + r;
    if (o >= w.hidden) return;
    if (w.down_bias != nullptr) {
      for (int i = 0; i < nv; ++i) {
        const bf16* b = w.down_bias[expert_of[i]];
        if (b != nullptr) v += weights[slot_of[i]] * __bfloat162float(b[o]);
      }
    }
    out[o] = __float2bfloat16(v);
  });
  SignalGridDone(signal);
}

// out[t] = the weighted sum of token t's valid slots' rows of y, in slot order. A thread owns
// kVec consecutive elements of one token (grid: tokens x element tiles) and issues its slots'
// loads before it sums: one block per token looping over slots one load at a time was bound by
// load latency (29 us for 8 tokens of 2048 on an H100, as long as for 128).
constexpr int kCombineThreads = 128;
constexpr int kCombineSlotsAtOnce = 8;

template <int kVec>
__global__ void __launch_bounds__(kCombineThreads)
    ExpertCombineKernel(const int32_t* __restrict__ expert_ids, const float* __restrict__ weights,
                        int top_k, int num_experts, int64_t hidden, const float* __restrict__ y,
                        bf16* __restrict__ out, GridSignal signal) {
  using Vec = std::conditional_t<kVec == 4, float4, float>;
  const int64_t t = blockIdx.x;
  const int64_t j = (int64_t{blockIdx.y} * kCombineThreads + threadIdx.x) * kVec;
  if (j < hidden) {
    float sum[kVec] = {};
    for (int s0 = 0; s0 < top_k; s0 += kCombineSlotsAtOnce) {
      Vec v[kCombineSlotsAtOnce];
      float wt[kCombineSlotsAtOnce];
      bool valid[kCombineSlotsAtOnce];
#pragma unroll
      for (int u = 0; u < kCombineSlotsAtOnce; ++u) {
        const int64_t slot = t * top_k + s0 + u;
        valid[u] = s0 + u < top_k && ValidExpert(expert_ids[slot], num_experts);
        if (valid[u]) {
          wt[u] = weights[slot];
          v[u] = *reinterpret_cast<const Vec*>(y + slot * hidden + j);
        }
      }
#pragma unroll
      for (int u = 0; u < kCombineSlotsAtOnce; ++u) {
        if (!valid[u]) continue;
        if constexpr (kVec == 4) {
          sum[0] += wt[u] * v[u].x;
          sum[1] += wt[u] * v[u].y;
          sum[2] += wt[u] * v[u].z;
          sum[3] += wt[u] * v[u].w;
        } else {
          sum[0] += wt[u] * v[u];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[t * hidden + j + i] = __float2bfloat16(sum[i]);
  }
  SignalGridDone(signal);
}

bool ValidTable(const ExpertWeightTable& w) {
  return w.num_experts > 0 && w.num_experts <= kMaxGroupedExperts && w.hidden > 0 &&
         w.intermediate > 0 && w.gate != nullptr && w.up != nullptr && w.down != nullptr &&
         (w.format == WeightFormat::kBf16 ||
          (w.gate_scale != nullptr && w.up_scale != nullptr && w.down_scale != nullptr));
}

template <typename WT, int kE, int kNT>
cudaError_t GateUpTyped(const bf16* x, int64_t n, int top_k, const ExpertWeightTable& w,
                        const GluParams& act, const ExpertWorkspace& ws, cudaStream_t stream) {
  constexpr int kP = kPairRowsFor<kNT>;
  const int64_t max_work = MaxWork(n * top_k, w.num_experts, kNT);
  const int64_t row_groups = (w.intermediate + kP - 1) / kP;
  const int parts = GemvPartsFor(w.hidden / kE, row_groups * max_work, kNT);
  const int64_t tiles = (row_groups + kGemvThreads / parts - 1) / (kGemvThreads / parts);
  if (max_work > 65535 || tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(max_work));
  ExpertGateUpKernel<WT, kE, kNT><<<grid, kGemvThreads, 0, stream>>>(x, top_k, w, act, ws, parts);
  return cudaGetLastError();
}

template <typename WT, int kE, int kNT>
cudaError_t DownTyped(int64_t n, int top_k, const ExpertWeightTable& w, const ExpertWorkspace& ws,
                      cudaStream_t stream) {
  constexpr int kRows = kNT <= 4 ? 4 : 2;
  const int64_t max_work = MaxWork(n * top_k, w.num_experts, kNT);
  const int64_t row_groups = (w.hidden + kRows - 1) / kRows;
  const int parts = GemvPartsFor(w.intermediate / kE, row_groups * max_work, kNT);
  const int64_t tiles = (row_groups + kGemvThreads / parts - 1) / (kGemvThreads / parts);
  if (max_work > 65535 || tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(max_work));
  ExpertDownKernel<WT, kE, kNT><<<grid, kGemvThreads, 0, stream>>>(w, ws, parts);
  return cudaGetLastError();
}

// Blocks of a one-token FP8 expert kernel resident at once on the current device (3 an SM,
// their launch bounds). Asked once per process: the experts of a process run on one device. It
// counts the whole device, as if the kernel had it alone (an MPS limit on a client's SMs, or the
// router's kernels running beside a worker's, leave fewer; the widths below were measured so).
int64_t Fp8OneWaveBlocks() {
  static const int64_t blocks = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return int64_t{0};  // no halving below
    }
    return int64_t{sms} * kGemvMinBlocks<1, uint8_t>;
  }();
  return blocks;
}

// n == 1: gate/up with one work item per slot (no plan), then down and combine fused.
//
// FP8 grids that fit in one wave with half the thread groups (each thread then takes twice the
// chunks of a row) take them: one wave leaves no SM idle at the tail. Grids of several waves
// either way (Mixtral's) and bf16 lose by the halving (docs/cuda-ops.md).
template <typename WT, int kE>
cudaError_t GateUpDirect(const bf16* x, const int32_t* expert_ids, int top_k,
                         const ExpertWeightTable& w, const GluParams& act,
                         const ExpertWorkspace& ws, cudaStream_t stream) {
  constexpr int kP = kPairRowsFor<1>;
  const int64_t row_groups = (w.intermediate + kP - 1) / kP;
  auto tiles_for = [&](int p) { return (row_groups + kGemvThreads / p - 1) / (kGemvThreads / p); };
  int parts = GemvPartsFor(w.hidden / kE, row_groups * top_k, 1);
  if (sizeof(WT) == 1 && parts > kWarpSize && tiles_for(parts / 2) * top_k <= Fp8OneWaveBlocks()) {
    parts /= 2;
  }
  const int64_t tiles = tiles_for(parts);
  if (tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(top_k));
  return LaunchPdl(ExpertGateUpKernel<WT, kE, 1, true>, grid, dim3(kGemvThreads), 0, stream, x,
                   top_k, w, act, ws, parts, expert_ids);
}

template <typename WT, int kE>
cudaError_t DownCombineDirect(const int32_t* expert_ids, const float* weights, int top_k,
                              const ExpertWeightTable& w, const ExpertWorkspace& ws, bf16* out,
                              const GridSignal& signal, cudaStream_t stream) {
  // 128 threads per pair of rows: 4 rows a block, 512 blocks for hidden 2048 (in bf16 4 an
  // SM, all resident at once); each thread streams top_k * inter / kE / 128 chunks of both
  // rows (6 for Qwen3's 8 x 768 in bf16). FP8 (3 blocks an SM) halves them as gate/up does.
  auto blocks_for = [&](int p) {
    const int64_t rows_per_block = kGemvThreads / p * kDownRows;
    return (w.hidden + rows_per_block - 1) / rows_per_block;
  };
  int parts = 128;
  if (sizeof(WT) == 1 && blocks_for(parts / 2) <= Fp8OneWaveBlocks()) parts /= 2;
  const int64_t blocks = blocks_for(parts);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchPdl(ExpertDownCombineKernel<WT, kE>, dim3(static_cast<unsigned>(blocks)),
                   dim3(kGemvThreads), 0, stream, expert_ids, weights, top_k, w, ws.h, out, parts,
                   signal);
}

// Picks the instantiation: weight type, vector width (16-byte when both dims allow), and the
// token bucket (the plan's chunk). `Fn` is GateUpTyped or DownTyped via a generic lambda.
template <typename Fn>
cudaError_t Dispatch(int chunk, const ExpertWeightTable& w, bool x_aligned, Fn&& fn) {
  auto by_tokens = [&](auto wt, auto ke) -> cudaError_t {
    using WT = decltype(wt);
    constexpr int kE = decltype(ke)::value;
    switch (chunk) {
      case 1:
        return fn.template operator()<WT, kE, 1>();
      case 2:
        return fn.template operator()<WT, kE, 2>();
      case 4:
        return fn.template operator()<WT, kE, 4>();
      case 8:
        return fn.template operator()<WT, kE, 8>();
      default:
        return fn.template operator()<WT, kE, 16>();
    }
  };
  if (w.format == WeightFormat::kBf16) {
    constexpr int kE = kVecElems<bf16>;
    if (x_aligned && w.hidden % kE == 0 && w.intermediate % kE == 0) {
      return by_tokens(bf16{}, std::integral_constant<int, kE>{});
    }
    return by_tokens(bf16{}, std::integral_constant<int, 1>{});
  }
  constexpr int kE = kVecElems<uint8_t>;
  if (x_aligned && w.hidden % kE == 0 && w.intermediate % kE == 0) {
    return by_tokens(uint8_t{}, std::integral_constant<int, kE>{});
  }
  return by_tokens(uint8_t{}, std::integral_constant<int, 1>{});
}

}  // namespace

void SetTensorCoreExperts(bool on) { tensor_core_experts.store(on ? 1 : 0); }
void SetTiledExperts(bool on) { tiled_experts.store(on); }

bool TensorCoreExperts() {
  int on = tensor_core_experts.load();
  if (on < 0) {
    on = GetTunables().tensor_core_experts ? 1 : 0;
    tensor_core_experts.store(on);
  }
  return on == 1;
}

size_t ExpertWorkspaceBytes(int64_t n, int top_k, int64_t hidden, int64_t intermediate) {
  const int64_t slots = n * top_k;
  return RoundUp(slots * sizeof(int32_t)) + RoundUp(slots * 4 * sizeof(int32_t)) +
         RoundUp(sizeof(int32_t)) + RoundUp(slots * intermediate * sizeof(bf16)) +
         RoundUp(slots * hidden * sizeof(float));
}

ExpertWorkspace CarveExpertWorkspace(void* base, int64_t n, int top_k, int64_t hidden,
                                     int64_t intermediate) {
  const int64_t slots = n * top_k;
  char* p = static_cast<char*>(base);
  ExpertWorkspace ws;
  ws.sorted_slots = reinterpret_cast<int32_t*>(p);
  p += RoundUp(slots * sizeof(int32_t));
  ws.work = reinterpret_cast<int32_t*>(p);
  p += RoundUp(slots * 4 * sizeof(int32_t));
  ws.num_work = reinterpret_cast<int32_t*>(p);
  p += RoundUp(sizeof(int32_t));
  ws.h = reinterpret_cast<bf16*>(p);
  p += RoundUp(slots * intermediate * sizeof(bf16));
  ws.y = reinterpret_cast<float*>(p);
  return ws;
}

namespace {

cudaError_t PlanStage(const int32_t* expert_ids, int64_t n, int top_k,
                      const ExpertWeightTable& experts, const ExpertKernels& k,
                      const ExpertWorkspace& ws, cudaStream_t stream) {
  const int num_experts = experts.num_experts;
  if (n < 0 || top_k <= 0 || num_experts <= 0 || num_experts > kMaxGroupedExperts ||
      n * top_k > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  ExpertPlanKernel<<<1, kPlanThreads, 0, stream>>>(expert_ids, static_cast<int>(n * top_k),
                                                   num_experts, k.chunk, ws, experts.use_counts);
  return cudaGetLastError();
}

cudaError_t GateUpStage(const bf16* x, int64_t n, int top_k, const ExpertWeightTable& experts,
                        const ExpertKernels& k, const GluParams& act, const ExpertWorkspace& ws,
                        cudaStream_t stream) {
  if (!ValidTable(experts) || n < 0 || top_k <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (k.tiled) {
    if (!aligned) return cudaErrorInvalidValue;  // ChooseKernels was told otherwise
    return LaunchExpertGateUpTiled(x, top_k, MaxWork(n * top_k, experts.num_experts, k.chunk),
                                   experts, act, ws, stream);
  }
  if (k.mma && aligned) {
    return LaunchExpertGateUpMma(x, top_k, k.chunk,
                                 MaxWork(n * top_k, experts.num_experts, k.chunk), experts, act, ws,
                                 stream);
  }
  return Dispatch(k.chunk, experts, aligned, [&]<typename WT, int kE, int kNT>() {
    return GateUpTyped<WT, kE, kNT>(x, n, top_k, experts, act, ws, stream);
  });
}

cudaError_t DownStage(int64_t n, int top_k, const ExpertWeightTable& experts,
                      const ExpertKernels& k, const ExpertWorkspace& ws, cudaStream_t stream) {
  if (!ValidTable(experts) || n < 0 || top_k <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (k.tiled) {
    return LaunchExpertDownTiled(MaxWork(n * top_k, experts.num_experts, k.chunk), experts, ws,
                                 stream);
  }
  if (k.mma) {
    return LaunchExpertDownMma(k.chunk, MaxWork(n * top_k, experts.num_experts, k.chunk), experts,
                               ws, stream);
  }
  return Dispatch(k.chunk, experts, true, [&]<typename WT, int kE, int kNT>() {
    return DownTyped<WT, kE, kNT>(n, top_k, experts, ws, stream);
  });
}

}  // namespace

cudaError_t LaunchExpertPlan(const int32_t* expert_ids, int64_t n, int top_k,
                             const ExpertWeightTable& experts, const ExpertWorkspace& ws,
                             cudaStream_t stream) {
  return PlanStage(expert_ids, n, top_k, experts, ChooseKernels(n, top_k, experts, true), ws,
                   stream);
}

cudaError_t LaunchExpertGateUp(const bf16* x, int64_t n, int top_k,
                               const ExpertWeightTable& experts, const GluParams& act,
                               const ExpertWorkspace& ws, cudaStream_t stream) {
  return GateUpStage(x, n, top_k, experts, ChooseKernels(n, top_k, experts, true), act, ws, stream);
}

cudaError_t LaunchExpertDown(int64_t n, int top_k, const ExpertWeightTable& experts,
                             const ExpertWorkspace& ws, cudaStream_t stream) {
  return DownStage(n, top_k, experts, ChooseKernels(n, top_k, experts, true), ws, stream);
}

cudaError_t LaunchExpertCombine(const int32_t* expert_ids, const float* weights, int64_t n,
                                int top_k, int num_experts, int64_t hidden,
                                const ExpertWorkspace& ws, bf16* out, cudaStream_t stream,
                                const GridSignal& signal) {
  if (n < 0 || top_k <= 0 || hidden <= 0 || n > 0x7fffffff || !ValidSignal(signal) ||
      (signal.count > 0 && n == 0)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  // Four floats a thread where every row of y starts 16-byte aligned (out is stored a bf16 at
  // a time).
  const bool vec = hidden % 4 == 0 && reinterpret_cast<uintptr_t>(ws.y) % 16 == 0;
  const int64_t per_block = kCombineThreads * (vec ? 4 : 1);
  const int64_t tiles = (hidden + per_block - 1) / per_block;
  if (tiles > 65535) return cudaErrorInvalidValue;
  auto* kernel = vec ? ExpertCombineKernel<4> : ExpertCombineKernel<1>;
  kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(tiles)), kCombineThreads, 0,
           stream>>>(expert_ids, weights, top_k, num_experts, hidden, ws.y, out, signal);
  return cudaGetLastError();
}

cudaError_t LaunchGroupedExperts(const bf16* x, const int32_t* expert_ids, const float* weights,
                                 int64_t n, int top_k, const ExpertWeightTable& experts,
                                 const GluParams& act, const ExpertWorkspace& ws, bf16* out,
                                 cudaStream_t stream, const GridSignal& signal) {
  if (!ValidSignal(signal) || (signal.count > 0 && n == 0)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (n == 1 && top_k > 0 && top_k <= kMaxDirectSlots && ValidTable(experts)) {
    // Decode: each selected expert is one work item, so no plan; no y, no combine launch.
    const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
    return Dispatch(1, experts, aligned, [&]<typename WT, int kE, int>() {
      cudaError_t err = GateUpDirect<WT, kE>(x, expert_ids, top_k, experts, act, ws, stream);
      if (err == cudaSuccess) {
        err =
            DownCombineDirect<WT, kE>(expert_ids, weights, top_k, experts, ws, out, signal, stream);
      }
      return err;
    });
  }
  const ExpertKernels kernels =
      ChooseKernels(n, top_k, experts, reinterpret_cast<uintptr_t>(x) % 16 == 0);
  cudaError_t err = PlanStage(expert_ids, n, top_k, experts, kernels, ws, stream);
  if (err == cudaSuccess) err = GateUpStage(x, n, top_k, experts, kernels, act, ws, stream);
  if (err == cudaSuccess) err = DownStage(n, top_k, experts, kernels, ws, stream);
  if (err == cudaSuccess) {
    err = LaunchExpertCombine(expert_ids, weights, n, top_k, experts.num_experts, experts.hidden,
                              ws, out, stream, signal);
  }
  return err;
}

}  // namespace strata::gpu
