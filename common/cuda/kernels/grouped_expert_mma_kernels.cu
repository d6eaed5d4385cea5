// Grouped experts on the tensor cores (grouped_expert_mma.h), over the warp dot products of
// mma_dots.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/expert_activation.cuh"
#include "common/cuda/kernels/grouped_expert_mma.h"
#include "common/cuda/kernels/mma_dots.cuh"

namespace strata::gpu {
namespace {

// Grid: (row tiles of the intermediate dim, work items). h[slot] = act(gate . x, up . x).
template <typename WT, int kNt, int kWide>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    ExpertGateUpMmaKernel(const bf16* __restrict__ x, int top_k, ExpertWeightTable w, GluParams act,
                          ExpertWorkspace ws) {
  const Item it = ItemAt(ws);
  const int64_t r0 = (int64_t{blockIdx.x} * kMmaWarps + threadIdx.x / kWarpSize) * kMmaRows;
  if (it.count == 0 || r0 >= w.intermediate) return;  // the same for a whole warp
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int64_t hidden = w.hidden;
  const WT* gate = static_cast<const WT*>(w.gate[it.expert]);
  const WT* up = static_cast<const WT*>(w.up[it.expert]);
  const WT* rows[2][2] = {{gate + (r0 + g) * hidden, gate + (r0 + g + 8) * hidden},
                          {up + (r0 + g) * hidden, up + (r0 + g + 8) * hidden}};
  const bf16* tokens[kNt];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    const int slot = ws.sorted_slots[it.first + min(g + 8 * n, it.count - 1)];
    tokens[n] = x + int64_t{slot / top_k} * hidden;
  }
  float acc[2][kNt][4] = {};
  WarpDots<WT, 2, kNt, kWide>(rows, tokens, hidden, acc);
  StoreGateUp<WT, kNt>(acc, r0, it, w, act, ws);
}

// Grid: (row tiles of the hidden dim, work items). y[slot] = down . h[slot] + bias. With
// kSplitK a block's warps share 16 rows and each sums a quarter of the intermediate dim (the
// four partial sums meet in shared memory): four times the warps on the same bytes, for
// shapes whose down matrices are few and long (mixtral: 4,096 rows x 14,336).
template <typename WT, int kNt, int kWide, bool kSplitK>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    ExpertDownMmaKernel(ExpertWeightTable w, ExpertWorkspace ws) {
  const Item it = ItemAt(ws);
  const int warp = threadIdx.x / kWarpSize;
  const int64_t r0 =
      (kSplitK ? int64_t{blockIdx.x} : int64_t{blockIdx.x} * kMmaWarps + warp) * kMmaRows;
  if (it.count == 0 || r0 >= w.hidden) return;  // the same for a whole block under kSplitK
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int64_t inter = w.intermediate;
  const int64_t k_len = kSplitK ? inter / kMmaWarps : inter;
  const int64_t k0 = kSplitK ? warp * k_len : 0;
  const WT* down = static_cast<const WT*>(w.down[it.expert]);
  const WT* rows[1][2] = {{down + (r0 + g) * inter + k0, down + (r0 + g + 8) * inter + k0}};
  const bf16* tokens[kNt];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    const int slot = ws.sorted_slots[it.first + min(g + 8 * n, it.count - 1)];
    tokens[n] = ws.h + int64_t{slot} * inter + k0;
  }
  float acc[1][kNt][4] = {};
  WarpDots<WT, 1, kNt, kWide>(rows, tokens, k_len, acc);
  if constexpr (kSplitK) {
    if (!SumSplitK(acc)) return;
  }
  StoreDown<WT, kNt>(acc, r0, it, w, ws);
}

bool LaunchFits(int chunk, int64_t max_work, int64_t rows) {
  return (chunk == 8 || chunk == 16) && max_work > 0 && max_work <= 65535 &&
         rows / kMmaRows <= int64_t{0x7fffffff} * kMmaWarps;
}

dim3 GridFor(int64_t rows, int64_t max_work) {
  const int64_t tiles = (rows / kMmaRows + kMmaWarps - 1) / kMmaWarps;
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(max_work));
}

template <int kNt, int kWide>
void GateUpAs(bool fp8, dim3 grid, dim3 block, const bf16* x, int top_k, const ExpertWeightTable& w,
              const GluParams& act, const ExpertWorkspace& ws, cudaStream_t stream) {
  if (fp8) {
    ExpertGateUpMmaKernel<uint8_t, kNt, kWide><<<grid, block, 0, stream>>>(x, top_k, w, act, ws);
  } else {
    ExpertGateUpMmaKernel<bf16, kNt, 16><<<grid, block, 0, stream>>>(x, top_k, w, act, ws);
  }
}

template <int kNt, int kWide, bool kSplitK>
void DownAs(bool fp8, dim3 grid, dim3 block, const ExpertWeightTable& w, const ExpertWorkspace& ws,
            cudaStream_t stream) {
  if (fp8) {
    ExpertDownMmaKernel<uint8_t, kNt, kWide, kSplitK><<<grid, block, 0, stream>>>(w, ws);
  } else {
    ExpertDownMmaKernel<bf16, kNt, 16, kSplitK><<<grid, block, 0, stream>>>(w, ws);
  }
}

}  // namespace

bool MmaExpertShapesFit(const ExpertWeightTable& w) {
  return w.hidden > 0 && w.intermediate > 0 && w.hidden % kMmaSlab == 0 &&
         w.intermediate % kMmaSlab == 0;
}

cudaError_t LaunchExpertGateUpMma(const bf16* x, int top_k, int chunk, int64_t max_work,
                                  const ExpertWeightTable& w, const GluParams& act,
                                  const ExpertWorkspace& ws, cudaStream_t stream) {
  if (!MmaExpertShapesFit(w) || !LaunchFits(chunk, max_work, w.intermediate) || top_k <= 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid = GridFor(w.intermediate, max_work);
  const dim3 block(kMmaWarps * kWarpSize);
  const bool fp8 = w.format == WeightFormat::kFp8E4M3;
  const bool wide = WideFp8Slabs(fp8, w.hidden);
  if (chunk == 8) {
    wide ? GateUpAs<1, 32>(fp8, grid, block, x, top_k, w, act, ws, stream)
         : GateUpAs<1, 16>(fp8, grid, block, x, top_k, w, act, ws, stream);
  } else {
    wide ? GateUpAs<2, 32>(fp8, grid, block, x, top_k, w, act, ws, stream)
         : GateUpAs<2, 16>(fp8, grid, block, x, top_k, w, act, ws, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchExpertDownMma(int chunk, int64_t max_work, const ExpertWeightTable& w,
                                const ExpertWorkspace& ws, cudaStream_t stream) {
  if (!MmaExpertShapesFit(w) || !LaunchFits(chunk, max_work, w.hidden)) {
    return cudaErrorInvalidValue;
  }
  const bool fp8 = w.format == WeightFormat::kFp8E4M3;
  const bool wide = WideFp8Slabs(fp8, w.intermediate / kMmaWarps);
  const bool split = w.intermediate % (kMmaWarps * (wide ? kMmaWideSlab : kMmaSlab)) == 0;
  const dim3 grid =
      split ? dim3(static_cast<unsigned>(w.hidden / kMmaRows), static_cast<unsigned>(max_work))
            : GridFor(w.hidden, max_work);
  const dim3 block(kMmaWarps * kWarpSize);
  if (chunk == 8) {
    if (split) {
      wide ? DownAs<1, 32, true>(fp8, grid, block, w, ws, stream)
           : DownAs<1, 16, true>(fp8, grid, block, w, ws, stream);
    } else {
      DownAs<1, 16, false>(fp8, grid, block, w, ws, stream);
    }
  } else if (split) {
    wide ? DownAs<2, 32, true>(fp8, grid, block, w, ws, stream)
         : DownAs<2, 16, true>(fp8, grid, block, w, ws, stream);
  } else {
    DownAs<2, 16, false>(fp8, grid, block, w, ws, stream);
  }
  return cudaGetLastError();
}

}  // namespace strata::gpu
