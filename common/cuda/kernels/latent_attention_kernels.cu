#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/latent_attention_kernels.h"
#include "common/cuda/kernels/paged_kv_access.cuh"

namespace strata::gpu {
namespace {

constexpr int kMaxRank = 512;  // DeepSeek-V3's and Kimi-K2's kv_lora_rank
constexpr int kMaxNope = 256;  // qk_nope_head_dim (128 in both)
constexpr int kTokens = 16;    // tokens a block of the absorbing kernels takes
constexpr int kHeads = 8;      // query heads an attention block takes, a warp each
constexpr int kKeys = 16;      // cached rows staged per round of the attention
constexpr int kThreads = 256;

__device__ __forceinline__ float F(bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ int RowWidth(const LatentShape& s) { return s.rank + s.rope; }
__host__ __device__ __forceinline__ int QueryWidth(const LatentShape& s) { return s.nope + s.rope; }

// Rotates pair i < rope / 2 of the rope part x (interleaved or not) at `pos`, writing it to
// out[i] and out[i + rope / 2] as the CPU's ApplyLatentRope does.
__device__ __forceinline__ void RotatePair(const bf16* x, const LatentShape& s, float pos, int i,
                                           bf16* out) {
  const int half = s.rope / 2;
  const float a = F(s.interleave ? x[2 * i] : x[i]);
  const float b = F(s.interleave ? x[2 * i + 1] : x[i + half]);
  float sn, cs;
  sincosf(pos * s.inv_freq[i], &sn, &cs);
  cs *= s.attention_scaling;
  sn *= s.attention_scaling;
  out[i] = __float2bfloat16(a * cs - b * sn);
  out[i + half] = __float2bfloat16(b * cs + a * sn);
}

// One block a token.
__global__ void __launch_bounds__(kThreads)
    LatentKvAppendKernel(const bf16* __restrict__ kv_a, const bf16* __restrict__ norm, float eps,
                         LatentShape s, TokenBatch tokens, PagedKvLayer kv) {
  __shared__ float scratch[kThreads / kWarpSize];
  const int64_t t = blockIdx.x;
  const int width = RowWidth(s);
  const bf16* x = kv_a + t * width;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < s.rank; c += kThreads) sum_sq += F(x[c]) * F(x[c]);
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(s.rank) + eps);
  const int32_t* table = kv.block_tables + int64_t{tokens.seq[t]} * kv.max_blocks_per_seq;
  const int pos = tokens.pos[t];
  bf16* row = reinterpret_cast<bf16*>(KvSlotAt(kv, table, false, pos, 0, width).k);
  for (int c = threadIdx.x; c < s.rank; c += kThreads) {
    row[c] = __float2bfloat16(F(norm[c]) * (F(x[c]) * inv));
  }
  for (int i = threadIdx.x; i < s.rope / 2; i += kThreads) {
    RotatePair(x + s.rank, s, static_cast<float>(pos), i, row + s.rank);
  }
}

// Block (head, 16 tokens): W_UK^T q_nope with each weight read once for the 16 tokens.
__global__ void __launch_bounds__(kThreads)
    LatentQueriesKernel(const bf16* __restrict__ q, const bf16* __restrict__ kv_b, LatentShape s,
                        const int32_t* __restrict__ positions, int64_t n,
                        bf16* __restrict__ queries) {
  __shared__ float q_nope[kTokens][kMaxNope];
  const int h = blockIdx.x;
  const int64_t t0 = int64_t{blockIdx.y} * kTokens;
  const int count = static_cast<int>(n - t0 < kTokens ? n - t0 : kTokens);
  const int64_t q_row = int64_t{s.num_heads} * QueryWidth(s);
  const int64_t out_row = int64_t{s.num_heads} * RowWidth(s);
  for (int i = threadIdx.x; i < kTokens * s.nope; i += kThreads) {
    const int tt = i / s.nope, d = i % s.nope;
    q_nope[tt][d] = tt < count ? F(q[(t0 + tt) * q_row + int64_t{h} * QueryWidth(s) + d]) : 0.0f;
  }
  __syncthreads();
  const bf16* w_uk = kv_b + int64_t{h} * (s.nope + s.v_dim) * s.rank;
  for (int c = threadIdx.x; c < s.rank; c += kThreads) {
    float acc[kTokens] = {};
    for (int d = 0; d < s.nope; ++d) {
      const float w = F(w_uk[int64_t{d} * s.rank + c]);
#pragma unroll
      for (int tt = 0; tt < kTokens; ++tt) acc[tt] += q_nope[tt][d] * w;
    }
    for (int tt = 0; tt < count; ++tt) {
      queries[(t0 + tt) * out_row + int64_t{h} * RowWidth(s) + c] = __float2bfloat16(acc[tt]);
    }
  }
  const int half = s.rope / 2;
  for (int i = threadIdx.x; i < count * half; i += kThreads) {
    const int64_t t = t0 + i / half;
    RotatePair(q + t * q_row + int64_t{h} * QueryWidth(s) + s.nope, s,
               static_cast<float>(positions[t]), i % half,
               queries + t * out_row + int64_t{h} * RowWidth(s) + s.rank);
  }
}

// Rows of a staged tile are `stride` bf16 apart: an odd number of 32-bit words, so the 16 lanes
// reading 16 rows at one column hit 16 banks.
__host__ __device__ constexpr int TileStride(int width) {
  return (width / 2) % 2 == 0 ? width + 2 : width + 4;
}

// Block (token, 8 heads), a warp a head; the block's heads share each staged tile of rows.
// Online softmax over tiles of 16 rows; lane l scores row l % 16 over half l / 16 of the width.
__global__ void __launch_bounds__(kThreads)
    LatentAttentionKernel(const bf16* __restrict__ queries, LatentShape s, float scale,
                          TokenBatch tokens, PagedKvLayer kv, bf16* __restrict__ latent_out) {
  extern __shared__ float4 shared_raw[];
  const int width = RowWidth(s);
  const int stride = TileStride(width);
  float* q_shared = reinterpret_cast<float*>(shared_raw);
  bf16* tile = reinterpret_cast<bf16*>(q_shared + kHeads * width);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * kHeads;
  const int heads_here = s.num_heads - h0 < kHeads ? s.num_heads - h0 : kHeads;
  const int64_t q_row = int64_t{s.num_heads} * width;
  for (int i = threadIdx.x; i < kHeads * width; i += kThreads) {
    const int hh = i / width;
    q_shared[i] =
        hh < heads_here ? F(queries[t * q_row + int64_t{h0 + hh} * width + i % width]) : 0.0f;
  }
  const int pos = tokens.pos[t];
  const int32_t* table = kv.block_tables + int64_t{tokens.seq[t]} * kv.max_blocks_per_seq;
  const int per_lane = s.rank / kWarpSize;
  const int half_width = width / 2;  // lanes 16-31 score the second half
  const float* qh = q_shared + warp * width;
  float m = -INFINITY, l = 0.0f;
  float acc[kMaxRank / kWarpSize] = {};
  for (int j0 = 0; j0 <= pos; j0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and q_shared written, the first time)
    const int words = width / 2;
    for (int i = threadIdx.x; i < kKeys * words; i += kThreads) {
      const int jj = i / words, w = i % words;
      __nv_bfloat162 value = __floats2bfloat162_rn(0.0f, 0.0f);  // rows past pos: zeros
      if (j0 + jj <= pos) {
        value = reinterpret_cast<const __nv_bfloat162*>(
            KvSlotAt(kv, table, false, j0 + jj, 0, width).k)[w];
      }
      reinterpret_cast<__nv_bfloat162*>(tile + jj * stride)[w] = value;
    }
    __syncthreads();
    if (warp >= heads_here) continue;
    const int jj = lane % kKeys;
    const int first = (lane / kKeys) * half_width;
    const __nv_bfloat162* krow = reinterpret_cast<const __nv_bfloat162*>(tile + jj * stride);
    float dot = 0.0f;
    for (int d = first; d < first + half_width; d += 2) {
      const float2 k2 = __bfloat1622float2(krow[d / 2]);
      dot += qh[d] * k2.x + qh[d + 1] * k2.y;
    }
    dot += __shfl_xor_sync(kFullMask, dot, kKeys);
    const bool valid = j0 + jj <= pos;
    const float score = valid ? dot * scale : -INFINITY;
    const float m_new = fmaxf(m, WarpMax(score));  // row j0 <= pos is valid: finite
    const float correction = expf(m - m_new);
    const float p = valid ? expf(score - m_new) : 0.0f;
    l = l * correction + WarpSum(lane < kKeys ? p : 0.0f);
    m = m_new;
#pragma unroll
    for (int i = 0; i < kMaxRank / kWarpSize; ++i) acc[i] *= correction;
    for (int r = 0; r < kKeys; ++r) {
      const float pr = __shfl_sync(kFullMask, p, r);
      const bf16* row = tile + r * stride;
#pragma unroll
      for (int i = 0; i < kMaxRank / kWarpSize; ++i) {
        if (i < per_lane) acc[i] += pr * F(row[lane + i * kWarpSize]);
      }
    }
  }
  if (warp >= heads_here) return;
  bf16* out = latent_out + t * int64_t{s.num_heads} * s.rank + int64_t{h0 + warp} * s.rank;
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kMaxRank / kWarpSize; ++i) {
    if (i < per_lane) out[lane + i * kWarpSize] = __float2bfloat16(acc[i] * inv_l);
  }
}

// Block (head, 16 tokens): a warp a row of W_UV at a time, each weight read once for the 16.
__global__ void __launch_bounds__(kThreads)
    LatentValuesKernel(const bf16* __restrict__ latent_out, const bf16* __restrict__ kv_b,
                       LatentShape s, int64_t n, bf16* __restrict__ out) {
  __shared__ float o[kTokens][kMaxRank];
  const int h = blockIdx.x;
  const int64_t t0 = int64_t{blockIdx.y} * kTokens;
  const int count = static_cast<int>(n - t0 < kTokens ? n - t0 : kTokens);
  const int64_t in_row = int64_t{s.num_heads} * s.rank;
  for (int i = threadIdx.x; i < kTokens * s.rank; i += kThreads) {
    const int tt = i / s.rank, c = i % s.rank;
    o[tt][c] = tt < count ? F(latent_out[(t0 + tt) * in_row + int64_t{h} * s.rank + c]) : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const bf16* w_uv = kv_b + (int64_t{h} * (s.nope + s.v_dim) + s.nope) * s.rank;
  const int64_t out_row = int64_t{s.num_heads} * s.v_dim;
  for (int r = warp; r < s.v_dim; r += kThreads / kWarpSize) {
    const bf16* w = w_uv + int64_t{r} * s.rank;
    float acc[kTokens] = {};
    for (int c = lane; c < s.rank; c += kWarpSize) {
      const float wc = F(w[c]);
#pragma unroll
      for (int tt = 0; tt < kTokens; ++tt) acc[tt] += wc * o[tt][c];
    }
#pragma unroll
    for (int tt = 0; tt < kTokens; ++tt) acc[tt] = WarpSum(acc[tt]);
    if (lane == 0) {
      for (int tt = 0; tt < count; ++tt) {
        out[(t0 + tt) * out_row + int64_t{h} * s.v_dim + r] = __float2bfloat16(acc[tt]);
      }
    }
  }
}

size_t AttentionSharedBytes(const LatentShape& s) {
  return sizeof(float) * kHeads * RowWidth(s) + sizeof(bf16) * kKeys * TileStride(RowWidth(s));
}

dim3 HeadTokenGrid(const LatentShape& s, int64_t n) {
  return dim3(static_cast<unsigned>(s.num_heads),
              static_cast<unsigned>((n + kTokens - 1) / kTokens));
}

}  // namespace

bool LatentShapeFits(const LatentShape& s) {
  return s.num_heads > 0 && s.nope > 0 && s.nope <= kMaxNope && s.rope > 0 && s.rope % 2 == 0 &&
         s.rank > 0 && s.rank % kWarpSize == 0 && s.rank <= kMaxRank && s.v_dim > 0 &&
         RowWidth(s) % 4 == 0 && AttentionSharedBytes(s) <= 48 * 1024;
}

cudaError_t LaunchLatentKvAppend(const bf16* kv_a, const bf16* norm, float eps,
                                 const LatentShape& shape, const TokenBatch& tokens,
                                 const PagedKvLayer& kv, cudaStream_t stream) {
  if (!LatentShapeFits(shape) || shape.inv_freq == nullptr || kv.fp8 ||
      kv.head_dim != RowWidth(shape) || tokens.n < 0 || tokens.n > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  LatentKvAppendKernel<<<static_cast<unsigned>(tokens.n), kThreads, 0, stream>>>(kv_a, norm, eps,
                                                                                 shape, tokens, kv);
  return cudaGetLastError();
}

cudaError_t LaunchLatentQueries(const bf16* q, const bf16* kv_b, const LatentShape& shape,
                                const int32_t* positions, int64_t n, bf16* queries,
                                cudaStream_t stream) {
  if (!LatentShapeFits(shape) || shape.inv_freq == nullptr || n < 0 ||
      (n + kTokens - 1) / kTokens > 65535) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  LatentQueriesKernel<<<HeadTokenGrid(shape, n), kThreads, 0, stream>>>(q, kv_b, shape, positions,
                                                                        n, queries);
  return cudaGetLastError();
}

cudaError_t LaunchLatentAttention(const bf16* queries, const LatentShape& shape, float scale,
                                  const TokenBatch& tokens, const PagedKvLayer& kv,
                                  bf16* latent_out, cudaStream_t stream) {
  if (!LatentShapeFits(shape) || kv.fp8 || kv.head_dim != RowWidth(shape) || tokens.n < 0 ||
      tokens.n > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(tokens.n),
                  static_cast<unsigned>((shape.num_heads + kHeads - 1) / kHeads));
  LatentAttentionKernel<<<grid, kThreads, AttentionSharedBytes(shape), stream>>>(
      queries, shape, scale, tokens, kv, latent_out);
  return cudaGetLastError();
}

cudaError_t LaunchLatentValues(const bf16* latent_out, const bf16* kv_b, const LatentShape& shape,
                               int64_t n, bf16* out, cudaStream_t stream) {
  if (!LatentShapeFits(shape) || n < 0 || (n + kTokens - 1) / kTokens > 65535) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  LatentValuesKernel<<<HeadTokenGrid(shape, n), kThreads, 0, stream>>>(latent_out, kv_b, shape, n,
                                                                       out);
  return cudaGetLastError();
}

}  // namespace strata::gpu
