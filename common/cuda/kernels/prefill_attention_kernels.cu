// Prefill attention on the tensor cores (prefill_attention.h), the FlashAttention way. A block
// takes 128 query rows, the (token, head) pairs of a run of tokens and the query heads of one
// kv head, so those heads share every key and value load. Each of its four warps owns 32 rows
// (two MMA row tiles), so every key or value fragment read from shared memory feeds two MMAs:
// with 16 rows a warp, the ldmatrix reads outran the tensor cores. The block's queries wait in
// shared memory (registers hold the two tiles' scores and outputs); it walks the kv head's
// keys 64 at a time through shared memory (two stages, the next loaded asynchronously while
// this one is used), scores them with bf16 MMAs (m16n8k16, f32 sums), keeps the softmax's
// running max and sum in registers and multiplies the probabilities into V with MMAs again.
// Keys past every row's position (or before every row's window) are never loaded; the causal
// and window masks are applied only on the tiles that straddle them.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/mma_dots.cuh"
#include "common/cuda/kernels/paged_kv_access.cuh"
#include "common/cuda/kernels/prefill_attention.h"
#include "common/cuda/kernels/smem_tiles.cuh"

namespace strata::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTiles = 2;                  // MMA row tiles (16 rows each) a warp
constexpr int kWarpRows = 16 * kTiles;     // rows a warp
constexpr int kRows = kWarpRows * kWarps;  // (token, head) rows a block
constexpr int kLaneRows = 2 * kTiles;      // rows a lane holds: g and g + 8 of each tile
constexpr int kKeys = 32;                  // keys a tile
constexpr float kLog2e = 1.4426950408889634f;

// The queries, then two stages of a key tile and a value tile.
template <int kD>
constexpr int SmemBytes() {
  return (kRows + 2 * 2 * kKeys) * kD * static_cast<int>(sizeof(bf16));
}

// The block's row of lane row i (tile i / 2, half i % 2) of warp `warp`.
__device__ __forceinline__ int LaneRow(int warp, int g, int i) {
  return warp * kWarpRows + (i / 2) * 16 + g + 8 * (i % 2);
}
// Keys [tile0, tile0 + count) of one kv head into k_s and v_s ([kKeys][kD] swizzled); rows
// past count are zeroed (their probabilities are 0, and 0 x garbage could be NaN). bf16 rows
// are copied asynchronously; FP8 codes go through registers, scaled to bf16.
template <int kD>
__device__ __forceinline__ void LoadKvTile(bf16* k_s, bf16* v_s, const PagedKvLayer& kv,
                                           const int32_t* table, bool wide, bool codes,
                                           float k_scale, float v_scale, int kv_head, int tile0,
                                           int count, int64_t kv_dim) {
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = 0; i < kKeys * kChunks / kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int j = idx / kChunks, c = idx % kChunks;
    bf16* dk = k_s + SwizzledOffset<kD>(j, c);
    bf16* dv = v_s + SwizzledOffset<kD>(j, c);
    if (j >= count) {
      *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const KvSlotPtrs at =
        KvSlotAt(kv, table, wide, tile0 + j, int64_t{kv_head} * kD + c * 8, kv_dim);
    if (!codes) {
      CpAsync16(dk, at.k);
      CpAsync16(dv, at.v);
    } else {
      float f[8];
      E4M3x8ToFloat(LoadKvChunk(at.k, true), k_scale, f);
      *reinterpret_cast<uint4*>(dk) = FloatX8ToBf16(f);
      E4M3x8ToFloat(LoadKvChunk(at.v, true), v_scale, f);
      *reinterpret_cast<uint4*>(dv) = FloatX8ToBf16(f);
    }
  }
}

// The block's queries into q_s ([kRows][kD] swizzled), zeros for rows past the batch: 16-byte
// asynchronous copies where the rows allow them, 4-byte loads otherwise.
template <int kD>
__device__ __forceinline__ void LoadQueries(bf16* q_s, const bf16* q, const PagedAttentionParams& p,
                                            int64_t t0, int ntok, int group, int kv_head) {
  constexpr int kChunks = kD / 8;
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0 && p.q_stride % 8 == 0;
  for (int idx = static_cast<int>(threadIdx.x); idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    bf16* dst = q_s + SwizzledOffset<kD>(r, c);
    const int tok = r / group;
    if (tok >= ntok) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const bf16* src =
        q + (t0 + tok) * p.q_stride + int64_t{kv_head * group + r % group} * kD + 8 * c;
    if (aligned) {
      CpAsync16(dst, src);
    } else {
      const uint32_t* s4 = reinterpret_cast<const uint32_t*>(src);
      *reinterpret_cast<uint4*>(dst) =
          make_uint4(__ldg(s4), __ldg(s4 + 1), __ldg(s4 + 2), __ldg(s4 + 3));
    }
  }
}

// Grid: (query tiles, kv heads). Row r of a block is token r / group of its tile, query head
// r % group of the kv head; a tile holds tile_tokens = kRows / group tokens. A tile's tokens
// may belong to several sequences (runs of equal seq): each run walks its own keys, with the
// rows of the other runs masked.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    PrefillAttentionKernel(const bf16* __restrict__ q, TokenBatch tokens, PagedKvLayer kv,
                           PagedAttentionParams p, int group, int tile_tokens,
                           bf16* __restrict__ out) {
  extern __shared__ __align__(128) uint8_t smem[];
  bf16* const q_s = reinterpret_cast<bf16*>(smem);  // [kRows * kD]
  bf16* const k_s = q_s + kRows * kD;               // [stage][kKeys * kD]
  bf16* const v_s = k_s + 2 * kKeys * kD;
  __shared__ int32_t tok_seq[kRows], tok_pos[kRows];
  // Per row: its token in the tile (ntok past the batch), position and window start.
  __shared__ int32_t row_tok[kRows], row_pos[kRows], row_first[kRows];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;
  // The last tiles (the latest positions, most keys) start first.
  const int64_t t0 = (int64_t{gridDim.x} - 1 - blockIdx.x) * tile_tokens;
  const int kv_head = static_cast<int>(blockIdx.y);
  const int ntok = static_cast<int>(min(int64_t{tile_tokens}, tokens.n - t0));
  LoadQueries<kD>(q_s, q, p, t0, ntok, group, kv_head);
  if (tid < ntok) {
    tok_seq[tid] = tokens.seq[t0 + tid];
    tok_pos[tid] = tokens.pos[t0 + tid];
  }
  __syncthreads();
  if (tid < kRows) {
    const int tok = min(tid / group, ntok);
    const int pos = tok < ntok ? tok_pos[tok] : -1;
    row_tok[tid] = tok;
    row_pos[tid] = pos;
    row_first[tid] = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
  }

  float o[kTiles][kD / 8][4];
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt) {
#pragma unroll
    for (int nd = 0; nd < kD / 8; ++nd)
      o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0;
  }
  float m[kLaneRows], l[kLaneRows];  // log2 units; l per lane
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  const float qk_scale = p.scale * kLog2e;
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kD;
  const int mi = lane / 8;  // the 8x8 matrix this lane addresses in ldmatrix

  for (int seg_begin = 0; seg_begin < ntok;) {
    const int32_t seq = tok_seq[seg_begin];
    int seg_end = seg_begin + 1;
    while (seg_end < ntok && tok_seq[seg_end] == seq) ++seg_end;
    // The run's keys: [kmin, kend); every row sees [window_start, all_visible_end).
    int kmin = INT32_MAX, kend = 0, all_visible_end = INT32_MAX, window_start = 0;
    for (int i = seg_begin; i < seg_end; ++i) {
      const int pos = tok_pos[i];
      const int first = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
      kmin = min(kmin, first);
      kend = max(kend, pos + 1);
      all_visible_end = min(all_visible_end, pos + 1);
      window_start = max(window_start, first);
    }
    const bool partial = seg_begin > 0 || seg_end < ntok;
    const int32_t* table = kv.block_tables + int64_t{seq} * kv.max_blocks_per_seq;
    const bool wide = KvRowIsWide(kv, table);
    const bool codes = kv.fp8 && !wide;
    const float k_scale = codes ? kv.k_scale[kv_head] : 1.0f;
    const float v_scale = codes ? kv.v_scale[kv_head] : 1.0f;
    const int num_tiles = (kend - kmin + kKeys - 1) / kKeys;

    LoadKvTile<kD>(k_s, v_s, kv, table, wide, codes, k_scale, v_scale, kv_head, kmin,
                   min(kKeys, kend - kmin), kv_dim);
    CpAsyncCommit();
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it & 1;
      const int tile0 = kmin + it * kKeys;
      if (it + 1 < num_tiles) {
        const int next0 = tile0 + kKeys;
        LoadKvTile<kD>(k_s + (stage ^ 1) * kKeys * kD, v_s + (stage ^ 1) * kKeys * kD, kv, table,
                       wide, codes, k_scale, v_scale, kv_head, next0, min(kKeys, kend - next0),
                       kv_dim);
        CpAsyncCommit();
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      __syncthreads();
      const bf16* ks = k_s + stage * kKeys * kD;
      const bf16* vs = v_s + stage * kKeys * kD;

      // Scores: s[mt][n] holds keys 8n + 2 t4 (+1) of tile mt's rows g (i < 2) and g + 8.
      float s[kTiles][kKeys / 8][4];
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
          s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
      }
#pragma unroll
      for (int kd = 0; kd < kD / 16; ++kd) {
        uint32_t a[kTiles][4];
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          LdMatrixX4(a[mt], q_s + SwizzledOffset<kD>(
                                      warp * kWarpRows + mt * 16 + (mi & 1) * 8 + (lane & 7),
                                      2 * kd + (mi >> 1)));
        }
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t b[4];
          LdMatrixX4(
              b, ks + SwizzledOffset<kD>(np * 16 + (mi >> 1) * 8 + (lane & 7), 2 * kd + (mi & 1)));
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt) {
            Mma(s[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
            Mma(s[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
          }
        }
      }
      const bool mask = partial || tile0 < window_start || tile0 + kKeys > all_visible_end;
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mt][n][i] *= qk_scale;
        }
      }
      if (mask) {
#pragma unroll
        for (int ri = 0; ri < kLaneRows; ++ri) {
          const int r = LaneRow(warp, g, ri);
          const int tok = row_tok[r], pos = row_pos[r], first = row_first[r];
          const bool active = tok >= seg_begin && tok < seg_end;
#pragma unroll
          for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int key = tile0 + 8 * n + 2 * t4 + j;
              if (!active || key > pos || key < first) s[ri / 2][n][2 * (ri % 2) + j] = -INFINITY;
            }
          }
        }
      }

      // Online softmax over the tile, a row's keys spread over the 4 lanes of a quad.
      float corrs[kLaneRows];
#pragma unroll
      for (int ri = 0; ri < kLaneRows; ++ri) {
        float(&sr)[kKeys / 8][4] = s[ri / 2];
        const int c0 = 2 * (ri % 2);
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) mx = fmaxf(mx, fmaxf(sr[n][c0], sr[n][c0 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
        const float m_new = fmaxf(m[ri], mx);
        // A row with no visible key yet keeps m = -inf; its probabilities are 0.
        const float base = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m[ri] - base);
        m[ri] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float e = exp2f(sr[n][c0 + j] - base);
            sr[n][c0 + j] = e;
            sum += e;
          }
        }
        l[ri] = l[ri] * corr + sum;
        corrs[ri] = corr;
      }
      // Once a row's maximum settles, later tiles leave it unchanged (corr exactly 1): the
      // warp skips the rescale of its outputs (a multiply per MMA) when none of its rows moved.
      bool moved = false;
#pragma unroll
      for (int ri = 0; ri < kLaneRows; ++ri) moved |= corrs[ri] != 1.0f;
      if (__any_sync(kFullMask, moved)) {
#pragma unroll
        for (int ri = 0; ri < kLaneRows; ++ri) {
          const int c0 = 2 * (ri % 2);
#pragma unroll
          for (int nd = 0; nd < kD / 8; ++nd) {
            o[ri / 2][nd][c0] *= corrs[ri];
            o[ri / 2][nd][c0 + 1] *= corrs[ri];
          }
        }
      }

      // o += P V: the score accumulators of two key n-tiles are one A fragment of 16 keys.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t a[kTiles][4];
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          a[mt][0] = PackBf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = PackBf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = PackBf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = PackBf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          uint32_t b[4];
          LdMatrixX4Trans(
              b, vs + SwizzledOffset<kD>(16 * kk + (mi & 1) * 8 + (lane & 7), 2 * np + (mi >> 1)));
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt) {
            Mma(o[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
            Mma(o[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
          }
        }
      }
      __syncthreads();  // the next load overwrites this stage
    }
    seg_begin = seg_end;
  }

#pragma unroll
  for (int ri = 0; ri < kLaneRows; ++ri) {
    l[ri] += __shfl_xor_sync(kFullMask, l[ri], 1);
    l[ri] += __shfl_xor_sync(kFullMask, l[ri], 2);
  }
#pragma unroll
  for (int ri = 0; ri < kLaneRows; ++ri) {
    const int r = LaneRow(warp, g, ri);
    const int tok = row_tok[r];
    if (tok >= ntok) continue;
    const int head = kv_head * group + r % group;
    float inv;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[head] * kLog2e;
      const float mx = fmaxf(m[ri], sink);
      const float keep = exp2f(m[ri] - mx);
      inv = keep / (l[ri] * keep + exp2f(sink - mx));
    } else {
      inv = 1.0f / l[ri];
    }
    const int c0 = 2 * (ri % 2);
    bf16* row = out + (t0 + tok) * p.out_stride + int64_t{head} * kD + 2 * t4;
#pragma unroll
    for (int nd = 0; nd < kD / 8; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nd) =
          __floats2bfloat162_rn(o[ri / 2][nd][c0] * inv, o[ri / 2][nd][c0 + 1] * inv);
    }
  }
}

template <int kD>
cudaError_t LaunchForDim(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                         const PagedAttentionParams& p, bf16* out, cudaStream_t stream) {
  const cudaError_t attribute = AllowDynamicSmem<PrefillAttentionKernel<kD>>(SmemBytes<kD>());
  if (attribute != cudaSuccess) return attribute;
  const int group = p.num_heads / p.num_kv_heads;
  const int tile_tokens = kRows / group;
  const int64_t tiles = (tokens.n + tile_tokens - 1) / tile_tokens;
  if (tiles > 0x7fffffff || p.num_kv_heads > 65535) return cudaErrorInvalidValue;
  PrefillAttentionKernel<kD>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_kv_heads)), kThreads,
         SmemBytes<kD>(), stream>>>(q, tokens, kv, p, group, tile_tokens, out);
  return cudaGetLastError();
}

}  // namespace

bool PrefillAttentionFits(const PagedAttentionParams& params) {
  return (params.head_dim == 64 || params.head_dim == 128) && params.num_kv_heads > 0 &&
         params.num_heads % params.num_kv_heads == 0 &&
         params.num_heads / params.num_kv_heads <= kRows;
}

cudaError_t LaunchPrefillAttention(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                                   const PagedAttentionParams& params, bf16* out,
                                   cudaStream_t stream) {
  if (!PrefillAttentionFits(params) || reinterpret_cast<uintptr_t>(q) % 4 != 0 ||
      params.q_stride % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  return params.head_dim == 64 ? LaunchForDim<64>(q, tokens, kv, params, out, stream)
                               : LaunchForDim<128>(q, tokens, kv, params, out, stream);
}

}  // namespace strata::gpu
