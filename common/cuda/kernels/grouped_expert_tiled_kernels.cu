// Grouped experts of prefill-sized steps on the tensor cores (grouped_expert_mma.h): a block of
// four warps computes 64 rows of one expert's matrix (gate and up together, or down) for the
// up to 64 tokens of a work item. Each k-slice of 64 passes through shared memory: the weight
// tile as stored (bf16, or FP8 bytes converted as fragments are built) and the token tile
// gathered from its sorted slots, three slices in flight.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/expert_activation.cuh"
#include "common/cuda/kernels/grouped_expert_mma.h"
#include "common/cuda/kernels/mma_dots.cuh"
#include "common/cuda/kernels/smem_tiles.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = kMmaWarps * kWarpSize;
constexpr int kTileRows = kMmaWarps * kMmaRows;  // 64 weight rows a block, 16 a warp
constexpr int kTileTokens = kTiledChunkTokens;   // 64: eight MMA n-tiles a warp
constexpr int kTileK = 64;
constexpr int kStages = 3;
// FP8 weight rows of a tile: 64 bytes padded to 80, so the 16-bit fragment loads of a warp's
// eight rows fall in different banks.
constexpr int kFp8RowBytes = kTileK + 16;
constexpr int kTokenTileBytes = kTileTokens * kTileK * 2;

template <typename WT>
constexpr int WeightTileBytes() {
  return sizeof(WT) == 2 ? kTileRows * kTileK * 2 : kTileRows * kFp8RowBytes;
}
template <typename WT, int kMats>
constexpr int StageBytes() {
  return kMats * WeightTileBytes<WT>() + kTokenTileBytes;
}
template <typename WT, int kMats>
constexpr int SmemBytes() {
  return kStages * StageBytes<WT, kMats>();
}

// Rows [0, 64) x columns [k0, k0 + 64) of a weight matrix (rows ld elements apart, from its
// block's first row) into a tile.
template <typename WT>
__device__ __forceinline__ void LoadWeightTile(uint8_t* tile, const WT* rows, int64_t ld,
                                               int64_t k0) {
  const int tid = static_cast<int>(threadIdx.x);
  if constexpr (sizeof(WT) == 2) {
#pragma unroll
    for (int j = 0; j < kTileRows * 8 / kThreads; ++j) {
      const int idx = tid + j * kThreads, row = idx / 8, c = idx % 8;
      CpAsync16(reinterpret_cast<bf16*>(tile) + SwizzledOffset<kTileK>(row, c),
                rows + row * ld + k0 + 8 * c);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTileRows * 4 / kThreads; ++j) {
      const int idx = tid + j * kThreads, row = idx / 4, c = idx % 4;
      CpAsync16(tile + row * kFp8RowBytes + 16 * c, rows + row * ld + k0 + 16 * c);
    }
  }
}

// The A fragment (16 rows from `row0`, k-step ks of the tile) of a weight tile.
template <typename WT>
__device__ __forceinline__ void WeightFragment(uint32_t (&a)[4], const uint8_t* tile, int row0,
                                               int ks) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if constexpr (sizeof(WT) == 2) {
    const int mi = lane / 8;
    LdMatrixX4(a, reinterpret_cast<const bf16*>(tile) +
                      SwizzledOffset<kTileK>(row0 + (mi & 1) * 8 + (lane & 7), 2 * ks + (mi >> 1)));
  } else {
    const uint8_t* p = tile + (row0 + lane / 4) * kFp8RowBytes + 16 * ks + 2 * (lane % 4);
    a[0] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p));
    a[1] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p + 8 * kFp8RowBytes));
    a[2] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p + 8));
    a[3] = Fp8x2ToBf16x2(*reinterpret_cast<const uint16_t*>(p + 8 * kFp8RowBytes + 8));
  }
}

// acc[m][n] += this warp's 16 rows of weight matrix m times tokens 8n..8n+7, over k_len
// inputs. weights[m]: the block's first row of matrix m (rows ld apart); token_rows[j]: the
// row of token tid / 8 + 16 j (the rows this thread copies).
template <typename WT, int kMats>
__device__ __forceinline__ void TiledDots(const WT* const (&weights)[kMats], int64_t ld,
                                          const bf16* const (&token_rows)[4], int64_t k_len,
                                          uint8_t* smem, float (&acc)[kMats][kTileTokens / 8][4]) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, mi = lane / 8;
  const int k_tiles = static_cast<int>(k_len / kTileK);
  auto load = [&](int stage, int kt) {
    uint8_t* base = smem + stage * StageBytes<WT, kMats>();
    const int64_t k0 = int64_t{kt} * kTileK;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      LoadWeightTile<WT>(base + m * WeightTileBytes<WT>(), weights[m], ld, k0);
    }
    bf16* tokens = reinterpret_cast<bf16*>(base + kMats * WeightTileBytes<WT>());
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      CpAsync16(tokens + SwizzledOffset<kTileK>(tid / 8 + 16 * j, tid % 8),
                token_rows[j] + k0 + 8 * (tid % 8));
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // slice kt landed for all threads; slice kt - 1's stage is free
    const uint8_t* base = smem + (kt % kStages) * StageBytes<WT, kMats>();
    const bf16* tokens = reinterpret_cast<const bf16*>(base + kMats * WeightTileBytes<WT>());
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t a[kMats][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        WeightFragment<WT>(a[m], base + m * WeightTileBytes<WT>(), warp * kMmaRows, ks);
      }
#pragma unroll
      for (int np = 0; np < kTileTokens / 16; ++np) {
        uint32_t b[4];
        LdMatrixX4(b, tokens + SwizzledOffset<kTileK>(16 * np + (mi >> 1) * 8 + (lane & 7),
                                                      2 * ks + (mi & 1)));
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
          Mma(acc[m][2 * np], a[m][0], a[m][1], a[m][2], a[m][3], b[0], b[1]);
          Mma(acc[m][2 * np + 1], a[m][0], a[m][1], a[m][2], a[m][3], b[2], b[3]);
        }
      }
    }
    if (kt + kStages - 1 < k_tiles) load((kt + kStages - 1) % kStages, kt + kStages - 1);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();
}

// The rows of the item's tokens this thread copies (tid / 8 + 16 j); tokens past the item's
// count repeat its last (their results are dropped).
__device__ __forceinline__ int SlotOfCopiedRow(const ExpertWorkspace& ws, const Item& it, int j) {
  const int token = static_cast<int>(threadIdx.x) / 8 + 16 * j;
  return ws.sorted_slots[it.first + min(token, it.count - 1)];
}

// Grid: (64-row tiles of the intermediate dim, work items). h[slot] = act(gate . x, up . x).
template <typename WT>
__global__ void __launch_bounds__(kThreads)
    ExpertGateUpTiledKernel(const bf16* __restrict__ x, int top_k, ExpertWeightTable w,
                            GluParams act, ExpertWorkspace ws) {
  extern __shared__ __align__(128) uint8_t smem[];
  const Item it = ItemAt(ws);
  if (it.count == 0) return;
  const int64_t r0 = int64_t{blockIdx.x} * kTileRows;
  const int64_t hidden = w.hidden;
  const WT* weights[2] = {static_cast<const WT*>(w.gate[it.expert]) + r0 * hidden,
                          static_cast<const WT*>(w.up[it.expert]) + r0 * hidden};
  const bf16* token_rows[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    token_rows[j] = x + int64_t{SlotOfCopiedRow(ws, it, j) / top_k} * hidden;
  float acc[2][kTileTokens / 8][4] = {};
  TiledDots<WT, 2>(weights, hidden, token_rows, hidden, smem, acc);
  StoreGateUp<WT, kTileTokens / 8>(acc, r0 + threadIdx.x / kWarpSize * kMmaRows, it, w, act, ws);
}

// Grid: (64-row tiles of the hidden dim, work items). y[slot] = down . h[slot] + bias.
template <typename WT>
__global__ void __launch_bounds__(kThreads)
    ExpertDownTiledKernel(ExpertWeightTable w, ExpertWorkspace ws) {
  extern __shared__ __align__(128) uint8_t smem[];
  const Item it = ItemAt(ws);
  if (it.count == 0) return;
  const int64_t r0 = int64_t{blockIdx.x} * kTileRows;
  const int64_t inter = w.intermediate;
  const WT* weights[1] = {static_cast<const WT*>(w.down[it.expert]) + r0 * inter};
  const bf16* token_rows[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) token_rows[j] = ws.h + int64_t{SlotOfCopiedRow(ws, it, j)} * inter;
  float acc[1][kTileTokens / 8][4] = {};
  TiledDots<WT, 1>(weights, inter, token_rows, inter, smem, acc);
  StoreDown<WT, kTileTokens / 8>(acc, r0 + threadIdx.x / kWarpSize * kMmaRows, it, w, ws);
}

// kKernel with its shared memory allowed, launched.
template <auto kKernel, typename... Args>
cudaError_t LaunchTiled(int smem_bytes, dim3 grid, cudaStream_t stream, Args... args) {
  const cudaError_t attribute = AllowDynamicSmem<kKernel>(smem_bytes);
  if (attribute != cudaSuccess) return attribute;
  kKernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

bool GridFits(int64_t rows, int64_t max_work) {
  return max_work > 0 && max_work <= 65535 && rows / kTileRows <= 0x7fffffff;
}

}  // namespace

bool TiledExpertShapesFit(const ExpertWeightTable& w) {
  return w.hidden > 0 && w.intermediate > 0 && w.hidden % kTileK == 0 &&
         w.intermediate % kTileK == 0 && w.hidden % kTileRows == 0 &&
         w.intermediate % kTileRows == 0;
}

cudaError_t LaunchExpertGateUpTiled(const bf16* x, int top_k, int64_t max_work,
                                    const ExpertWeightTable& w, const GluParams& act,
                                    const ExpertWorkspace& ws, cudaStream_t stream) {
  if (!TiledExpertShapesFit(w) || !GridFits(w.intermediate, max_work) || top_k <= 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(w.intermediate / kTileRows),
                  static_cast<unsigned>(max_work));
  if (w.format == WeightFormat::kFp8E4M3) {
    return LaunchTiled<ExpertGateUpTiledKernel<uint8_t>>(SmemBytes<uint8_t, 2>(), grid, stream, x,
                                                         top_k, w, act, ws);
  }
  return LaunchTiled<ExpertGateUpTiledKernel<bf16>>(SmemBytes<bf16, 2>(), grid, stream, x, top_k, w,
                                                    act, ws);
}

cudaError_t LaunchExpertDownTiled(int64_t max_work, const ExpertWeightTable& w,
                                  const ExpertWorkspace& ws, cudaStream_t stream) {
  if (!TiledExpertShapesFit(w) || !GridFits(w.hidden, max_work)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(w.hidden / kTileRows), static_cast<unsigned>(max_work));
  if (w.format == WeightFormat::kFp8E4M3) {
    return LaunchTiled<ExpertDownTiledKernel<uint8_t>>(SmemBytes<uint8_t, 1>(), grid, stream, w,
                                                       ws);
  }
  return LaunchTiled<ExpertDownTiledKernel<bf16>>(SmemBytes<bf16, 1>(), grid, stream, w, ws);
}

}  // namespace strata::gpu
