// Prefill attention on the tensor cores (prefill_attention.h), the FlashAttention way. A block
// takes 64 query rows, the (token, head) pairs of a run of tokens and the query heads of one kv
// head, so those heads share every key and value load. It walks the kv head's keys 64 at a
// time through shared memory (two stages, the next loaded asynchronously while this one is
// used), scores them with bf16 MMAs (m16n8k16, f32 sums), keeps the softmax's running max and
// sum in registers and multiplies the probabilities into V with MMAs again. Keys past every
// row's position (or before every row's window) are never loaded; the causal and window
// masks are applied only on the tiles that straddle them.
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
constexpr int kRows = 16 * kWarps;  // (token, head) rows a block: the MMA's 16 a warp
constexpr int kKeys = 64;           // keys a tile
constexpr float kLog2e = 1.4426950408889634f;

// Two stages of a key tile and a value tile.
template <int kD>
constexpr int SmemBytes() {
  return 2 * 2 * kKeys * kD * static_cast<int>(sizeof(bf16));
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
  bf16* const k_s = reinterpret_cast<bf16*>(smem);  // [stage][kKeys * kD]
  bf16* const v_s = k_s + 2 * kKeys * kD;
  __shared__ int32_t tok_seq[kRows], tok_pos[kRows];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;
  // The last tiles (the latest positions, most keys) start first.
  const int64_t t0 = (int64_t{gridDim.x} - 1 - blockIdx.x) * tile_tokens;
  const int kv_head = static_cast<int>(blockIdx.y);
  const int ntok = static_cast<int>(min(int64_t{tile_tokens}, tokens.n - t0));
  if (tid < ntok) {
    tok_seq[tid] = tokens.seq[t0 + tid];
    tok_pos[tid] = tokens.pos[t0 + tid];
  }
  __syncthreads();

  // This lane's rows: g and g + 8 of its warp's 16.
  int row_tok[2], row_head[2], row_pos[2], row_first[2];  // positions fit int32 (TokenBatch)
  bool row_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h;
    row_tok[h] = r / group;
    row_head[h] = kv_head * group + r % group;
    row_valid[h] = row_tok[h] < ntok;
    row_pos[h] = row_valid[h] ? tok_pos[row_tok[h]] : -1;
    row_first[h] = p.sliding_window > 0 ? max(0, row_pos[h] - p.sliding_window + 1) : 0;
  }
  // Query fragments (A of the MMA: rows g / g + 8, dims 2 t4 and 2 t4 + 8 of each 16).
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bf16* row = q + (t0 + row_tok[h]) * p.q_stride + int64_t{row_head[h]} * kD + 2 * t4;
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        qa[kd][h + 2 * half] =
            row_valid[h] ? __ldg(reinterpret_cast<const uint32_t*>(row + 16 * kd + 8 * half)) : 0u;
      }
    }
  }

  float o[kD / 8][4];
#pragma unroll
  for (int nd = 0; nd < kD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // log2 units; l per lane
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
    bool active[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      active[h] = row_valid[h] && row_tok[h] >= seg_begin && row_tok[h] < seg_end;
    }
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

      // Scores: s[n] holds keys 8n + 2 t4 (+1) of rows g (i < 2) and g + 8.
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kd = 0; kd < kD / 16; ++kd) {
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t b[4];
          LdMatrixX4(
              b, ks + SwizzledOffset<kD>(np * 16 + (mi >> 1) * 8 + (lane & 7), 2 * kd + (mi & 1)));
          Mma(s[2 * np], qa[kd][0], qa[kd][1], qa[kd][2], qa[kd][3], b[0], b[1]);
          Mma(s[2 * np + 1], qa[kd][0], qa[kd][1], qa[kd][2], qa[kd][3], b[2], b[3]);
        }
      }
      const bool mask = partial || tile0 < window_start || tile0 + kKeys > all_visible_end;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] *= qk_scale;
          if (mask) {
            const int h = i / 2;
            const int key = tile0 + 8 * n + 2 * t4 + (i & 1);
            if (!active[h] || key > row_pos[h] || key < row_first[h]) s[n][i] = -INFINITY;
          }
        }
      }

      // Online softmax over the tile, a row's 64 keys spread over the 4 lanes of a quad.
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
        const float m_new = fmaxf(m[h], mx);
        // A row with no visible key yet keeps m = -inf; its probabilities are 0.
        const float base = m_new == -INFINITY ? 0.0f : m_new;
        corr[h] = exp2f(m[h] - base);
        m[h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float e = exp2f(s[n][2 * h + j] - base);
            s[n][2 * h + j] = e;
            sum += e;
          }
        }
        l[h] = l[h] * corr[h] + sum;
      }
#pragma unroll
      for (int nd = 0; nd < kD / 8; ++nd) {
        o[nd][0] *= corr[0];
        o[nd][1] *= corr[0];
        o[nd][2] *= corr[1];
        o[nd][3] *= corr[1];
      }

      // o += P V: the score accumulators of two key n-tiles are one A fragment of 16 keys.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t a0 = PackBf16x2(s[2 * kk][0], s[2 * kk][1]);
        const uint32_t a1 = PackBf16x2(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const uint32_t a3 = PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          uint32_t b[4];
          LdMatrixX4Trans(
              b, vs + SwizzledOffset<kD>(16 * kk + (mi & 1) * 8 + (lane & 7), 2 * np + (mi >> 1)));
          Mma(o[2 * np], a0, a1, a2, a3, b[0], b[1]);
          Mma(o[2 * np + 1], a0, a1, a2, a3, b[2], b[3]);
        }
      }
      __syncthreads();  // the next load overwrites this stage
    }
    seg_begin = seg_end;
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(kFullMask, l[h], 1);
    l[h] += __shfl_xor_sync(kFullMask, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_valid[h]) continue;
    float inv;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[row_head[h]] * kLog2e;
      const float mx = fmaxf(m[h], sink);
      const float keep = exp2f(m[h] - mx);
      inv = keep / (l[h] * keep + exp2f(sink - mx));
    } else {
      inv = 1.0f / l[h];
    }
    bf16* row = out + (t0 + row_tok[h]) * p.out_stride + int64_t{row_head[h]} * kD + 2 * t4;
#pragma unroll
    for (int nd = 0; nd < kD / 8; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nd) =
          __floats2bfloat162_rn(o[nd][2 * h] * inv, o[nd][2 * h + 1] * inv);
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
