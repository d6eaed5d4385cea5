#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/paged_attention_kernels.h"
#include "common/cuda/kernels/paged_kv_access.cuh"
#include "common/cuda/kernels/prefill_attention.h"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;  // query heads per block (sharing one kv head)
constexpr int kMaxSplits = 64;
constexpr int kMinTilesPerSplit = 2;
// Query tokens of one sequence from which a step's attention runs on the tensor cores: the
// kernel's 64-row blocks hold 64 / group tokens (8 for Qwen3's 32 / 4 heads).
constexpr int kMinTensorCoreQueries = 16;
constexpr float kLog2e = 1.4426950408889634f;

// Keys per tile: 16 KB of bf16 keys (and as much of values) in shared memory per tile.
template <int kD>
constexpr int TileKeys() {
  return 8192 / kD;
}

int TileKeysFor(int head_dim) { return 8192 / head_dim; }

struct Shape {
  int group;        // query heads per kv head
  int head_chunks;  // blocks per kv head, each taking at most heads_per_block query heads
  int chunk_heads;  // query heads per chunk (the last may have fewer)
};

// heads_per_block: at most this many query heads a block (0: kMaxGroup).
Shape MakeShape(const PagedAttentionParams& p, int heads_per_block = 0) {
  const int heads = heads_per_block > 0 ? heads_per_block : kMaxGroup;
  Shape s;
  s.group = p.num_heads / p.num_kv_heads;
  s.head_chunks = (s.group + heads - 1) / heads;
  s.chunk_heads = (s.group + s.head_chunks - 1) / s.head_chunks;
  return s;
}

// One block per (token, kv head chunk, split): up to kMaxGroup query heads of one kv head walk
// the split's keys tile by tile with an online softmax (scores in log2 units), so every key
// and value is read once per block for all its heads.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionKernel(const bf16* __restrict__ q, TokenBatch tokens, PagedKvLayer kv,
                         PagedAttentionParams p, Shape shape, int num_splits, int split_len,
                         float* __restrict__ ws_acc, float2* __restrict__ ws_ml,
                         bf16* __restrict__ out) {
  constexpr int kTile = TileKeys<kD>();
  constexpr int kKPad = 8;  // one 16-byte vector per key row: conflict-free row reads
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kHeadsPerThreadQk = kMaxGroup * kTile / kThreads;  // scores owned per thread
  constexpr int kHeadStrideQk = kThreads / kTile;
  constexpr int kPairsPerThread = kMaxGroup * kD / 2 / kThreads;  // output pairs per thread
  static_assert(kThreads % kTile == 0 && kTile % kWarpSize == 0, "tile shape");

  __shared__ __align__(16) float q_s[kMaxGroup][kD];
  __shared__ __align__(16) bf16 k_s[kTile][kD + kKPad];
  __shared__ __align__(16) bf16 v_s[kTile][kD];
  __shared__ float p_s[kMaxGroup][kTile];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], f_s[kMaxGroup];

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int64_t t = blockIdx.x;
  const int kv_head = blockIdx.y / shape.head_chunks;
  const int chunk = blockIdx.y % shape.head_chunks;
  const int head0 = kv_head * shape.group + chunk * shape.chunk_heads;
  const int num_g = min(shape.chunk_heads, shape.group - chunk * shape.chunk_heads);
  const int split = blockIdx.z;

  const int64_t pos = tokens.pos[t];
  const int32_t* table = kv.block_tables + int64_t{tokens.seq[t]} * kv.max_blocks_per_seq;
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kD;
  const int64_t first = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : 0;
  const int64_t begin = max(first, int64_t{split} * split_len);
  // The last split runs to the query's own key even if max_context understated it.
  const int64_t end =
      split == num_splits - 1 ? pos + 1 : min(pos + 1, int64_t{split + 1} * split_len);
  // FP8 codes are scaled to bf16 on their way into shared memory.
  const bool wide = KvRowIsWide(kv, table);
  const bool codes = kv.fp8 && !wide;
  const float k_scale = codes ? kv.k_scale[kv_head] : 1.0f;
  const float v_scale = codes ? kv.v_scale[kv_head] : 1.0f;

  const float q_scale = p.scale * kLog2e;
  for (int i = tid; i < kMaxGroup * kD; i += kThreads) {
    const int g = i / kD;
    const int d = i % kD;
    q_s[g][d] = g < num_g
                    ? __bfloat162float(q[t * p.q_stride + int64_t{head0 + g} * kD + d]) * q_scale
                    : 0.0f;
  }
  if (tid < kMaxGroup) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[kPairsPerThread][2];
#pragma unroll
  for (int r = 0; r < kPairsPerThread; ++r) acc[r][0] = acc[r][1] = 0.0f;
  __syncthreads();  // q_s, m_s, l_s visible even when the split is empty

  for (int64_t tile0 = begin; tile0 < end; tile0 += kTile) {
    const int count = static_cast<int>(min(int64_t{kTile}, end - tile0));
    // Keys and values of the tile into shared memory; rows past `count` are zeroed.
#pragma unroll
    for (int i = 0; i < kTile * kChunksPerRow / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int j = idx / kChunksPerRow;
      const int c = idx % kChunksPerRow;
      uint4 kval = make_uint4(0, 0, 0, 0), vval = make_uint4(0, 0, 0, 0);
      if (j < count) {
        const KvSlotPtrs at =
            KvSlotAt(kv, table, wide, tile0 + j, int64_t{kv_head} * kD + c * 8, kv_dim);
        kval = LoadKvChunk(at.k, codes);
        vval = LoadKvChunk(at.v, codes);
        if (codes) {
          float f[8];
          E4M3x8ToFloat(kval, k_scale, f);
          kval = FloatX8ToBf16(f);
          E4M3x8ToFloat(vval, v_scale, f);
          vval = FloatX8ToBf16(f);
        }
      }
      *reinterpret_cast<uint4*>(&k_s[j][c * 8]) = kval;
      *reinterpret_cast<uint4*>(&v_s[j][c * 8]) = vval;
    }
    __syncthreads();

    // Scores: this thread owns key j for heads g0, g0 + stride, ...
    {
      const int j = tid % kTile;
      const int g0 = tid / kTile;
      float s[kHeadsPerThreadQk];
#pragma unroll
      for (int h = 0; h < kHeadsPerThreadQk; ++h) s[h] = 0.0f;
#pragma unroll 4
      for (int c = 0; c < kChunksPerRow; ++c) {
        float kf[8];
        const uint4 raw = *reinterpret_cast<const uint4*>(&k_s[j][c * 8]);
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(k2[e]);
          kf[2 * e] = f.x;
          kf[2 * e + 1] = f.y;
        }
#pragma unroll
        for (int h = 0; h < kHeadsPerThreadQk; ++h) {
          const int g = g0 + h * kHeadStrideQk;
          if (g < num_g) {
            const float4 qa = *reinterpret_cast<const float4*>(&q_s[g][c * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&q_s[g][c * 8 + 4]);
            s[h] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                    qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
          }
        }
      }
#pragma unroll
      for (int h = 0; h < kHeadsPerThreadQk; ++h) {
        const int g = g0 + h * kHeadStrideQk;
        if (g < num_g) p_s[g][j] = j < count ? s[h] : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax, one warp per head.
    for (int g = warp; g < num_g; g += kThreads / kWarpSize) {
      float tile_max = -INFINITY;
      for (int j = lane; j < kTile; j += kWarpSize) tile_max = fmaxf(tile_max, p_s[g][j]);
      tile_max = WarpMax(tile_max);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int j = lane; j < kTile; j += kWarpSize) {
        const float s = p_s[g][j];
        const float e = s == -INFINITY ? 0.0f : exp2f(s - m_new);
        p_s[g][j] = e;
        sum += e;
      }
      sum = WarpSum(sum);
      if (lane == 0) {
        const float factor = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
        f_s[g] = factor;
        m_s[g] = m_new;
        l_s[g] = l_s[g] * factor + sum;
      }
    }
    __syncthreads();

    // acc = acc * factor + P V for the (head, dim pair) entries this thread owns.
#pragma unroll
    for (int r = 0; r < kPairsPerThread; ++r) {
      const int pair = tid + r * kThreads;
      const int g = pair / (kD / 2);
      const int d2 = pair % (kD / 2);
      if (g < num_g) {
        const float factor = f_s[g];
        float a0 = acc[r][0] * factor, a1 = acc[r][1] * factor;
        const float* prob = p_s[g];
        for (int j = 0; j < count; ++j) {
          const float2 v =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v_s[j][2 * d2]));
          a0 += prob[j] * v.x;
          a1 += prob[j] * v.y;
        }
        acc[r][0] = a0;
        acc[r][1] = a1;
      }
    }
    __syncthreads();  // the next tile overwrites k_s, v_s and p_s
  }

  // Write the normalized output, or this split's unnormalized partial for the merge kernel.
#pragma unroll
  for (int r = 0; r < kPairsPerThread; ++r) {
    const int pair = tid + r * kThreads;
    const int g = pair / (kD / 2);
    const int d2 = pair % (kD / 2);
    if (g >= num_g) continue;
    const int head = head0 + g;
    const float m = m_s[g];
    const float l = l_s[g];
    if (num_splits == 1) {
      float scale_out;
      if (p.sinks != nullptr) {
        const float sink = p.sinks[head] * kLog2e;
        const float mx = fmaxf(m, sink);
        const float keep = exp2f(m - mx);
        scale_out = keep / (l * keep + exp2f(sink - mx));
      } else {
        scale_out = 1.0f / l;
      }
      bf16* o = out + t * p.out_stride + int64_t{head} * kD + 2 * d2;
      *reinterpret_cast<__nv_bfloat162*>(o) =
          __floats2bfloat162_rn(acc[r][0] * scale_out, acc[r][1] * scale_out);
    } else {
      const int64_t part = (t * p.num_heads + head) * num_splits + split;
      *reinterpret_cast<float2*>(ws_acc + part * kD + 2 * d2) = make_float2(acc[r][0], acc[r][1]);
      if (d2 == 0) ws_ml[part] = make_float2(m, l);
    }
  }
}

// Merges the splits of one (token, head): rescale each partial to the common maximum and
// divide by the total mass, the sink's included.
template <int kD>
__global__ void __launch_bounds__(kD)
    MergeSplitsKernel(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml,
                      int num_heads, int num_splits, const float* __restrict__ sinks,
                      int64_t out_stride, bf16* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y;
  const int64_t part0 = (t * num_heads + head) * num_splits;
  float mx = sinks != nullptr ? sinks[head] * kLog2e : -INFINITY;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, ws_ml[part0 + s].x);
  float denom = sinks != nullptr ? exp2f(sinks[head] * kLog2e - mx) : 0.0f;
  float value = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float2 ml = ws_ml[part0 + s];
    if (ml.x == -INFINITY) continue;  // an empty split
    const float w = exp2f(ml.x - mx);
    denom += ml.y * w;
    value += ws_acc[(part0 + s) * kD + threadIdx.x] * w;
  }
  out[t * out_stride + int64_t{head} * kD + threadIdx.x] = __float2bfloat16(value / denom);
}

// Decode (few queries): one cluster of kBlocks blocks (8, the portable size, or 16) per
// (token, kv head chunk), each block taking an equal share of that token's keys, found from its
// position at run time (so a graph captured for a long context still spreads a short one over
// all blocks). One warp per query head: lane j scores key j of a 32-key tile, the softmax stays
// in the warp, and lane l accumulates P V for dims [l * kD / 32, (l + 1) * kD / 32). The blocks
// merge their partial softmax sums through distributed shared memory: no workspace and no
// second launch. A tile's work is a chain of dependent steps in each warp, so at one token the
// time goes with the tiles a block walks: more blocks per cluster and fewer heads per block
// (more clusters) shorten it while SMs are idle.
constexpr int kDecodeThreads = kMaxGroup * kWarpSize;
constexpr int kDecodeTile = kWarpSize;
constexpr int kMaxDecodeBlocks = 16;  // the largest cluster Hopper allows (non-portable)

// Long contexts: each token's keys also split over up to `groups` clusters (each a share of
// kBlocks shares), as many as give every block at least kGroupKeys keys. A cluster writes its
// partial sums to the workspace; the last of a token's clusters to finish (a counter per
// (token, head), left at zero) merges them. groups 1: no workspace.
constexpr int kGroupKeys = 128;
constexpr int kMaxGroups = 8;
struct DecodeGroups {
  int groups = 1;
  float* acc = nullptr;          // [token][head][group][kD]
  float2* ml = nullptr;          // [token][head][group]: (max, sum), log2 units
  unsigned* counters = nullptr;  // [token][head]
};

// Workspace bytes of `groups` groups for n tokens: partial sums, then the counters.
size_t DecodeGroupsBytes(int64_t n, int num_heads, int head_dim, int groups) {
  if (groups <= 1) return 0;
  const size_t parts = static_cast<size_t>(n) * num_heads * groups;
  return parts * (head_dim * sizeof(float) + sizeof(float2)) +
         static_cast<size_t>(n) * num_heads * sizeof(unsigned);
}

DecodeGroups MakeDecodeGroups(void* workspace, int64_t n, int num_heads, int head_dim, int groups) {
  DecodeGroups g;
  g.groups = groups;
  if (groups <= 1) return g;
  const size_t parts = static_cast<size_t>(n) * num_heads * groups;
  g.acc = static_cast<float*>(workspace);
  g.ml = reinterpret_cast<float2*>(g.acc + parts * head_dim);
  g.counters = reinterpret_cast<unsigned*>(g.ml + parts);
  return g;
}

// The step's raw k and v rows and the q/k norm and rotary embedding, for the fused decode.
struct DecodeRope {
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  int64_t kv_stride = 0;
  QkRopeParams rope;
};

// Lane l's rotation of the pairs (j, j + kD / 2) for j = l + 32 i at position `pos`, scaled
// as QkNormRopeKernel scales it.
template <int kD>
__device__ __forceinline__ void RopeAngles(const QkRopeParams& r, float pos, float (&cs)[kD / 64],
                                           float (&sn)[kD / 64]) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int i = 0; i < kD / 64; ++i) {
    sincosf(pos * r.inv_freq[lane + i * kWarpSize], &sn[i], &cs[i]);
    cs[i] *= r.attention_scaling;
    sn[i] *= r.attention_scaling;
  }
}

// One warp normalizes (when `norm` is given) and rotates the head vector x[kD] exactly as
// QkNormRopeKernel does, rounding to bf16 as its stores do: lane l gets the pairs
// (x[j], x[j + kD / 2]) for j = l + 32 i, rotated by RopeAngles' cs and sn.
template <int kD>
__device__ __forceinline__ void NormRopeHead(const bf16* x, const bf16* norm, const QkRopeParams& r,
                                             const float (&cs)[kD / 64], const float (&sn)[kD / 64],
                                             float (&a)[kD / 64], float (&b)[kD / 64]) {
  constexpr int kPairs = kD / 64;
  constexpr int kHalf = kD / 2;
  const int lane = threadIdx.x % kWarpSize;
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = lane + i * kWarpSize;
    a[i] = __bfloat162float(x[j]);
    b[i] = __bfloat162float(x[j + kHalf]);
    sum_sq += a[i] * a[i] + b[i] * b[i];
  }
  if (norm != nullptr) {
    sum_sq = WarpSum(sum_sq);
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(kD) + r.eps);
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int j = lane + i * kWarpSize;
      a[i] = __bfloat162float(norm[j]) * (a[i] * inv);
      b[i] = __bfloat162float(norm[j + kHalf]) * (b[i] * inv);
    }
  }
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const float ra = a[i] * cs[i] - b[i] * sn[i];
    const float rb = b[i] * cs[i] + a[i] * sn[i];
    a[i] = __bfloat162float(__float2bfloat16(ra));
    b[i] = __bfloat162float(__float2bfloat16(rb));
  }
}

// kFused: q, k and v are the step's raw projections. Each block normalizes and rotates its
// query heads itself; the block whose share holds the token's own key computes that key,
// writes it and the value to the cache and uses them from shared memory, so the norm + rope
// and append launches disappear. Valid when no two tokens of the step share a sequence.
__device__ __forceinline__ void Bf16x8ToFloat(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 v = __bfloat1622float2(h[j]);
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}

template <int kD, bool kFused, int kBlocks>
__global__ void __launch_bounds__(kDecodeThreads)
    PagedDecodeKernel(const bf16* __restrict__ q, TokenBatch tokens, PagedKvLayer kv,
                      PagedAttentionParams p, Shape shape, DecodeRope fuse, DecodeGroups split,
                      bf16* __restrict__ out) {
  PdlLaunchDependents();
  static_assert(kMaxGroup <= kBlocks, "block r of a cluster merges head r of its chunk");
  constexpr int kDL = kD / kWarpSize;  // output dims per lane
  constexpr int kKPad = 4;             // floats: row starts 16 bytes apart mod 128 bytes
  constexpr int kChunks = kD / 8;      // 16-byte chunks per key row
  constexpr int kLoads = kDecodeTile * kChunks / kDecodeThreads;
  static_assert(kLoads >= 1 && kDL % 2 == 0, "tile shape");
  __shared__ __align__(16) float q_s[kMaxGroup][kD];
  __shared__ __align__(16) float k_s[kDecodeTile][kD + kKPad];
  __shared__ __align__(16) float v_s[kDecodeTile][kD];
  __shared__ __align__(16) float o_s[kMaxGroup][kD];
  __shared__ float2 ml_s[kMaxGroup];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int g = tid / kWarpSize;  // this warp's query head within the chunk
  const int64_t cluster_id = blockIdx.x / kBlocks;
  const int64_t t = cluster_id / split.groups;
  const int group = static_cast<int>(cluster_id % split.groups);
  const int kv_head = blockIdx.y / shape.head_chunks;
  const int chunk = blockIdx.y % shape.head_chunks;
  const int head0 = kv_head * shape.group + chunk * shape.chunk_heads;
  const int num_g = min(shape.chunk_heads, shape.group - chunk * shape.chunk_heads);
  const bool active = g < num_g;

  // Positions and block tables are never written by a kernel (TokenBatch), and the cache's
  // older keys were written by earlier steps, each ended by a host sync: all of it can be read
  // before PdlWait.
  const int pos = tokens.pos[t];
  const int32_t* table = kv.block_tables + int64_t{tokens.seq[t]} * kv.max_blocks_per_seq;
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kD;
  const int first = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
  // This token's keys in active_groups x kBlocks shares; clusters of groups past those exit.
  const int len = pos + 1 - first;
  const int active_groups =
      min(split.groups, max(1, (len + kBlocks * kGroupKeys - 1) / (kBlocks * kGroupKeys)));
  if (group >= active_groups) return;  // the whole cluster: no cluster.sync is owed
  const int part = group * kBlocks + rank;
  const int share = (len + active_groups * kBlocks - 1) / (active_groups * kBlocks);
  const int begin = first + part * share;
  const int end = min(pos + 1, begin + share);

  // The block table entries of this block's keys, read once (a share of up to kMaxTable
  // cache blocks; longer shares read the table per key). Read before the wait in both paths;
  // a barrier before the first tile's addresses are computed makes them visible.
  // A wide row of an FP8 cache has two entries a block; narrow rows hold scaled codes.
  const bool wide = KvRowIsWide(kv, table);
  const bool codes = kv.fp8 && !wide;
  const int per = wide ? 2 : 1;
  const float k_scale = codes ? kv.k_scale[kv_head] : 1.0f;
  const float v_scale = codes ? kv.v_scale[kv_head] : 1.0f;
  constexpr int kMaxTable = 64;
  __shared__ int32_t table_s[kMaxTable];
  const int blk0 = begin / kv.block_size;
  const int nblk = end > begin ? (end - 1) / kv.block_size - blk0 + 1 : 0;
  const bool table_in_smem = nblk * per <= kMaxTable;
  if (table_in_smem) {
    for (int i = tid; i < nblk * per; i += kDecodeThreads) table_s[i] = table[blk0 * per + i];
  }

  // Tile loads go to registers one tile ahead, so a tile's DRAM latency overlaps the math of
  // the previous one.
  uint4 k_raw[kLoads], v_raw[kLoads];
  auto issue = [&](int tile0) {
    const int count = min(kDecodeTile, end - tile0);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kDecodeThreads;
      const int j = idx / kChunks;
      const int c = idx % kChunks;
      const int key = tile0 + j;
      k_raw[i] = v_raw[i] = make_uint4(0, 0, 0, 0);
      if (j < count && !(kFused && key == pos)) {
        const int b = key / kv.block_size;
        const int32_t* entries = table_in_smem ? table_s + (b - blk0) * per : table + b * per;
        const KvSlotPtrs at =
            KvSlotFromEntries(kv, wide, entries[0], wide ? entries[1] : 0, key % kv.block_size,
                              int64_t{kv_head} * kD + c * 8, kv_dim);
        k_raw[i] = LoadKvChunk(at.k, codes);
        v_raw[i] = LoadKvChunk(at.v, codes);
      }
    }
  };

  const float q_scale = p.scale * kLog2e;
  __shared__ __align__(16) float knew_s[kFused ? kD : 1];
  __shared__ __align__(16) float vnew_s[kFused ? kD : 1];
  if constexpr (kFused) {
    // Fused: the step's own key is not read from the cache (it is computed below), so the
    // first tile's loads and the rotation's angles go ahead of the wait for q, k and v.
    __syncthreads();  // table_s written
    if (begin < end) issue(begin);
    constexpr int kPairs = kD / 64;
    const float fpos = static_cast<float>(pos);
    float cs[kPairs], sn[kPairs];
    RopeAngles<kD>(fuse.rope, fpos, cs, sn);
    PdlWait();
    if (active) {
      float a[kPairs], b[kPairs];
      NormRopeHead<kD>(q + t * p.q_stride + int64_t{head0 + g} * kD, fuse.rope.q_norm, fuse.rope,
                       cs, sn, a, b);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        q_s[g][lane + i * kWarpSize] = a[i] * q_scale;
        q_s[g][lane + i * kWarpSize + kD / 2] = b[i] * q_scale;
      }
    }
    if (g == 0 && share > 0 && part == (pos - first) / share) {
      // This block's share ends with the token's own key.
      const int64_t row = t * fuse.kv_stride + int64_t{kv_head} * kD;
      float a[kPairs], b[kPairs];
      NormRopeHead<kD>(fuse.k + row, fuse.rope.k_norm, fuse.rope, cs, sn, a, b);
      const KvSlotPtrs at = KvSlotAt(kv, table, wide, pos, int64_t{kv_head} * kD, kv_dim);
      if (codes) {
        // The key and value as the cache holds them: later steps read these codes.
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          const int j = lane + i * kWarpSize;
          const uint8_t qa = FloatToE4M3(a[i] / k_scale);
          const uint8_t qb = FloatToE4M3(b[i] / k_scale);
          at.k[j] = qa;
          at.k[j + kD / 2] = qb;
          knew_s[j] = E4M3ToFloat(qa) * k_scale;
          knew_s[j + kD / 2] = E4M3ToFloat(qb) * k_scale;
        }
        for (int d = lane; d < kD; d += kWarpSize) {
          const uint8_t qv = FloatToE4M3(__bfloat162float(fuse.v[row + d]) / v_scale);
          at.v[d] = qv;
          vnew_s[d] = E4M3ToFloat(qv) * v_scale;
        }
      } else {
        bf16* k_dst = reinterpret_cast<bf16*>(at.k);
        bf16* v_dst = reinterpret_cast<bf16*>(at.v);
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          const int j = lane + i * kWarpSize;
          knew_s[j] = a[i];
          knew_s[j + kD / 2] = b[i];
          k_dst[j] = __float2bfloat16(a[i]);
          k_dst[j + kD / 2] = __float2bfloat16(b[i]);
        }
        for (int d = lane; d < kD; d += kWarpSize) {
          const bf16 vv = fuse.v[row + d];
          vnew_s[d] = __bfloat162float(vv);
          v_dst[d] = vv;
        }
      }
    }
    __syncthreads();  // q_s (and knew_s, vnew_s) written
  } else {
    // The keys the step appended are in the cache once the kernels before are done.
    PdlWait();
    for (int i = tid; i < kMaxGroup * kD; i += kDecodeThreads) {
      const int qg = i / kD;
      const int d = i % kD;
      q_s[qg][d] =
          qg < num_g ? __bfloat162float(q[t * p.q_stride + int64_t{head0 + qg} * kD + d]) * q_scale
                     : 0.0f;
    }
    __syncthreads();  // q_s, table_s written
    if (begin < end) issue(begin);
  }

  float m = -INFINITY, l = 0.0f;
  float acc[kDL] = {};
  for (int tile0 = begin; tile0 < end; tile0 += kDecodeTile) {
    const int count = min(kDecodeTile, end - tile0);
    if (tile0 != begin) __syncthreads();  // the previous tile's k_s and v_s are read
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kDecodeThreads;
      const int j = idx / kChunks;
      const int c = idx % kChunks;
      float kf[8], vf[8];
      if (kFused && j < count && tile0 + j == pos) {  // the key this block just computed
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          kf[e] = knew_s[c * 8 + e];
          vf[e] = vnew_s[c * 8 + e];
        }
      } else if (codes) {
        E4M3x8ToFloat(k_raw[i], k_scale, kf);
        E4M3x8ToFloat(v_raw[i], v_scale, vf);
      } else {
        Bf16x8ToFloat(k_raw[i], kf);
        Bf16x8ToFloat(v_raw[i], vf);
      }
      *reinterpret_cast<float4*>(&k_s[j][c * 8]) = make_float4(kf[0], kf[1], kf[2], kf[3]);
      *reinterpret_cast<float4*>(&k_s[j][c * 8 + 4]) = make_float4(kf[4], kf[5], kf[6], kf[7]);
      *reinterpret_cast<float4*>(&v_s[j][c * 8]) = make_float4(vf[0], vf[1], vf[2], vf[3]);
      *reinterpret_cast<float4*>(&v_s[j][c * 8 + 4]) = make_float4(vf[4], vf[5], vf[6], vf[7]);
    }
    __syncthreads();
    if (tile0 + kDecodeTile < end) issue(tile0 + kDecodeTile);
    if (active) {
      float s = -INFINITY;
      if (lane < count) {
        float dot[4] = {};  // four chains, not one of kD dependent FMAs
#pragma unroll 8
        for (int d = 0; d < kD; d += 4) {
          const float4 kk = *reinterpret_cast<const float4*>(&k_s[lane][d]);
          const float4 qq = *reinterpret_cast<const float4*>(&q_s[g][d]);
          dot[0] = fmaf(kk.x, qq.x, dot[0]);
          dot[1] = fmaf(kk.y, qq.y, dot[1]);
          dot[2] = fmaf(kk.z, qq.z, dot[2]);
          dot[3] = fmaf(kk.w, qq.w, dot[3]);
        }
        s = (dot[0] + dot[1]) + (dot[2] + dot[3]);
      }
      const float m_new = fmaxf(m, WarpMax(s));  // finite: the tile has a key
      const float pj = lane < count ? exp2f(s - m_new) : 0.0f;
      const float factor = exp2f(m - m_new);
      l = l * factor + WarpSum(pj);
#pragma unroll
      for (int d = 0; d < kDL; ++d) acc[d] *= factor;
#pragma unroll
      for (int j = 0; j < kDecodeTile; ++j) {
        const float w = __shfl_sync(kFullMask, pj, j);
        const float* v = &v_s[j][lane * kDL];
#pragma unroll
        for (int d = 0; d < kDL; d += 2) {
          const float2 vv = *reinterpret_cast<const float2*>(v + d);
          acc[d] = fmaf(w, vv.x, acc[d]);
          acc[d + 1] = fmaf(w, vv.y, acc[d + 1]);
        }
      }
      m = m_new;
    }
  }
  if (active) {
#pragma unroll
    for (int d = 0; d < kDL; ++d) o_s[g][lane * kDL + d] = acc[d];
    if (lane == 0) ml_s[g] = make_float2(m, l);
  }
  cluster.sync();  // every block's partial sums are visible to the cluster

  // Block r merges head r of the chunk over the cluster's blocks, the sink included (one
  // group), or into the group's partial sums for the last group to finish to merge.
  if (rank < num_g) {  // uniform in the block
    const int head = head0 + rank;
    const bool final = active_groups == 1;
    const float sink = p.sinks != nullptr && final ? p.sinks[head] * kLog2e : -INFINITY;
    if (tid < kD) {
      float2 ml[kBlocks];
      float mx = sink;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        ml[b] = *cluster.map_shared_rank(&ml_s[rank], b);
        mx = fmaxf(mx, ml[b].x);
      }
      float denom = sink != -INFINITY ? exp2f(sink - mx) : 0.0f;
      float value = 0.0f;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        if (ml[b].x == -INFINITY) continue;  // a block with no keys
        const float w = exp2f(ml[b].x - mx);
        denom += ml[b].y * w;
        value += *cluster.map_shared_rank(&o_s[rank][tid], b) * w;
      }
      if (final) {
        out[t * p.out_stride + int64_t{head} * kD + tid] = __float2bfloat16(value / denom);
      } else {
        const int64_t at = (t * p.num_heads + head) * split.groups + group;
        split.acc[at * kD + tid] = value;
        if (tid == 0) split.ml[at] = make_float2(mx, denom);
      }
    }
    if (!final) {
      __shared__ bool last;
      __threadfence();  // this group's partial, before the count says it is there
      __syncthreads();
      unsigned* counter = split.counters + t * p.num_heads + head;
      if (tid == 0) last = atomicAdd(counter, 1u) == static_cast<unsigned>(active_groups - 1);
      __syncthreads();
      if (last) {
        __threadfence();  // the other groups' partials
        if (tid < kD) {
          const int64_t at0 = (t * p.num_heads + head) * split.groups;
          float mx = p.sinks != nullptr ? p.sinks[head] * kLog2e : -INFINITY;
          for (int gr = 0; gr < active_groups; ++gr) {
            mx = fmaxf(mx, __ldcg(&split.ml[at0 + gr].x));
          }
          float denom = p.sinks != nullptr ? exp2f(p.sinks[head] * kLog2e - mx) : 0.0f;
          float value = 0.0f;
          for (int gr = 0; gr < active_groups; ++gr) {
            const float2 ml = __ldcg(&split.ml[at0 + gr]);
            if (ml.x == -INFINITY) continue;
            const float w = exp2f(ml.x - mx);
            denom += ml.y * w;
            value += __ldcg(&split.acc[(at0 + gr) * kD + tid]) * w;
          }
          out[t * p.out_stride + int64_t{head} * kD + tid] = __float2bfloat16(value / denom);
        }
        if (tid == 0) *counter = 0;  // for the next launch (graph replays reuse the workspace)
      }
    }
  }
  cluster.sync();  // the other blocks' shared memory was read: now they may exit
}

// The largest cluster is non-portable: a 16-block kernel must ask for it (MaxDecodeClusterBlocks
// does, once a process).
template <int kD, bool kFused>
cudaError_t AllowLargeClusters() {
  return cudaFuncSetAttribute(PagedDecodeKernel<kD, kFused, kMaxDecodeBlocks>,
                              cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

template <int kD, bool kFused, int kBlocks>
cudaError_t LaunchDecodeClusters(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                                 const PagedAttentionParams& p, const Shape& shape,
                                 const DecodeRope& fuse, const DecodeGroups& split, bf16* out,
                                 cudaStream_t stream) {
  // 16-block kernels were allowed their size by MaxDecodeClusterBlocks, which every such plan
  // passed (ClusterDecodePlan).
  constexpr auto kernel = PagedDecodeKernel<kD, kFused, kBlocks>;
  const dim3 grid(static_cast<unsigned>(tokens.n * kBlocks * split.groups),
                  static_cast<unsigned>(p.num_kv_heads * shape.head_chunks));
  return LaunchPdlInClusters(kernel, grid, dim3(kDecodeThreads), kBlocks, 0, stream, q, tokens, kv,
                             p, shape, fuse, split, out);
}

template <int kD, bool kFused>
cudaError_t LaunchDecodeForDim(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                               const PagedAttentionParams& p, const PagedAttentionPlan& plan,
                               const DecodeRope& fuse, void* workspace, bf16* out,
                               cudaStream_t stream) {
  const Shape shape = MakeShape(p, plan.heads_per_block);
  const DecodeGroups split =
      MakeDecodeGroups(workspace, tokens.n, p.num_heads, kD, std::max(plan.groups, 1));
  if (plan.num_splits == 16) {
    return LaunchDecodeClusters<kD, kFused, 16>(q, tokens, kv, p, shape, fuse, split, out, stream);
  }
  return LaunchDecodeClusters<kD, kFused, 8>(q, tokens, kv, p, shape, fuse, split, out, stream);
}

template <int kD>
cudaError_t LaunchForDim(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                         const PagedAttentionParams& p, const PagedAttentionPlan& plan,
                         void* workspace, bf16* out, cudaStream_t stream) {
  const Shape shape = MakeShape(p);
  const dim3 grid(static_cast<unsigned>(tokens.n),
                  static_cast<unsigned>(p.num_kv_heads * shape.head_chunks),
                  static_cast<unsigned>(plan.num_splits));
  float* ws_acc = nullptr;
  float2* ws_ml = nullptr;
  if (plan.num_splits > 1) {
    const int64_t parts = tokens.n * p.num_heads * plan.num_splits;
    ws_acc = static_cast<float*>(workspace);
    ws_ml = reinterpret_cast<float2*>(ws_acc + parts * kD);
  }
  PagedAttentionKernel<kD><<<grid, kThreads, 0, stream>>>(q, tokens, kv, p, shape, plan.num_splits,
                                                          plan.split_len, ws_acc, ws_ml, out);
  if (plan.num_splits > 1) {
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
    const dim3 merge_grid(static_cast<unsigned>(tokens.n), static_cast<unsigned>(p.num_heads));
    MergeSplitsKernel<kD><<<merge_grid, kD, 0, stream>>>(
        ws_acc, ws_ml, p.num_heads, plan.num_splits, p.sinks, p.out_stride, out);
  }
  return cudaGetLastError();
}

bool ValidClusterPlan(const PagedAttentionPlan& plan) {
  return (plan.num_splits == 8 || plan.num_splits == 16) && plan.heads_per_block >= 0 &&
         plan.heads_per_block <= kMaxGroup && plan.groups >= 1 && plan.groups <= kMaxGroups;
}

bool ValidParams(const PagedAttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.num_kv_heads > 0 &&
         p.num_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.max_context > 0 &&
         p.sliding_window >= 0;
}

}  // namespace

// Asked once a process, for the device current then: the router runs attention on one device.
int MaxDecodeClusterBlocks() {
  static const int blocks = [] {
    // Every 16-block kernel is allowed here, ahead of any capture of a graph that launches it.
    constexpr auto kernel = PagedDecodeKernel<128, true, kMaxDecodeBlocks>;
    if (AllowLargeClusters<64, false>() != cudaSuccess ||
        AllowLargeClusters<64, true>() != cudaSuccess ||
        AllowLargeClusters<128, false>() != cudaSuccess ||
        AllowLargeClusters<128, true>() != cudaSuccess) {
      cudaGetLastError();
      return 8;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kMaxDecodeBlocks);
    config.blockDim = dim3(kDecodeThreads);
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kMaxDecodeBlocks;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();
      return 8;
    }
    return clusters > 0 ? kMaxDecodeBlocks : 8;
  }();
  return blocks;
}

size_t ClusterDecodeWorkspaceBytes(int64_t max_tokens, const PagedAttentionParams& params) {
  return DecodeGroupsBytes(std::max<int64_t>(max_tokens, 1), params.num_heads, params.head_dim,
                           kMaxGroups);
}

PagedAttentionPlan ClusterDecodePlan(const PagedAttentionParams& params, int blocks,
                                     int heads_per_block, int64_t n, int groups) {
  PagedAttentionPlan plan;
  plan.cluster = true;
  plan.num_splits = blocks;
  plan.heads_per_block = heads_per_block;
  plan.groups = groups;
  if (!ValidParams(params) || params.head_dim > 128 || heads_per_block < 1 || n < 1 ||
      !ValidClusterPlan(plan) || blocks > MaxDecodeClusterBlocks()) {
    return PagedAttentionPlan();  // the one-split plan: no cluster
  }
  plan.split_len = static_cast<int>((params.max_context + blocks - 1) / blocks);
  plan.workspace_bytes = DecodeGroupsBytes(n, params.num_heads, params.head_dim, groups);
  return plan;
}

PagedAttentionPlan PrefillPlan(const PagedAttentionParams& params) {
  PagedAttentionPlan plan;
  plan.split_len = std::max(params.max_context, 1);
  plan.tensor_cores = ValidParams(params) && PrefillAttentionFits(params);
  return plan;
}

PagedAttentionPlan PlanPagedAttention(int64_t n, const PagedAttentionParams& params, int num_sms) {
  PagedAttentionPlan plan;
  if (!ValidParams(params) || n <= 0) return plan;
  if (params.max_queries_per_seq >= kMinTensorCoreQueries && PrefillAttentionFits(params)) {
    return PrefillPlan(params);
  }
  const int tile = TileKeysFor(params.head_dim);
  const int64_t tiles = (params.max_context + tile - 1) / tile;
  const int64_t items = n * params.num_kv_heads * MakeShape(params).head_chunks;
  const int64_t target_blocks = 2 * int64_t{std::max(num_sms, 1)};
  if (items < target_blocks && params.head_dim <= 128) {
    // Too few (token, head) items to fill the GPU: the decode kernel's clusters split each
    // token's keys by its own position. While the clusters fit the SMs once over, 16 blocks a
    // cluster (half the tiles each block walks), then fewer heads a block (more clusters, fewer
    // warps sharing each SM): the latter measured faster in place though not in isolation.
    const int64_t sms = target_blocks / 2;
    const int group = params.num_heads / params.num_kv_heads;
    int blocks = 8, heads = std::min(group, kMaxGroup);
    if (items * kMaxDecodeBlocks <= sms) blocks = MaxDecodeClusterBlocks();
    while (heads > 1 &&
           n * params.num_kv_heads * MakeShape(params, heads / 2).head_chunks * blocks <= sms) {
      heads /= 2;
    }
    // Contexts longer than a cluster's blocks walk in kGroupKeys each also split over more
    // clusters (as many as the token's own length asks for, at run time).
    const int64_t groups = std::clamp<int64_t>(
        (params.max_context + int64_t{blocks} * kGroupKeys - 1) / (int64_t{blocks} * kGroupKeys), 1,
        kMaxGroups);
    return ClusterDecodePlan(params, blocks, heads, n, static_cast<int>(groups));
  }
  int64_t splits = 1;
  if (items < target_blocks) {
    splits = std::min<int64_t>((target_blocks + items - 1) / items,
                               (tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit);
    splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  }
  // Whole tiles per split, then drop splits the rounding left empty.
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  plan.split_len = static_cast<int>(tiles_per_split * tile);
  plan.num_splits = static_cast<int>((params.max_context + plan.split_len - 1) / plan.split_len);
  if (plan.num_splits > 1) {
    const int64_t parts = n * params.num_heads * plan.num_splits;
    plan.workspace_bytes =
        static_cast<size_t>(parts) * (params.head_dim * sizeof(float) + sizeof(float2));
  }
  return plan;
}

cudaError_t LaunchPagedAttention(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                                 const PagedAttentionParams& params, const PagedAttentionPlan& plan,
                                 void* workspace, bf16* out, cudaStream_t stream) {
  PagedAttentionParams p = params;
  if (!ValidParams(p) || kv.num_kv_heads != p.num_kv_heads || kv.head_dim != p.head_dim ||
      kv.block_size <= 0 || tokens.n < 0 || tokens.n > 0x7fffffff || plan.num_splits < 1 ||
      plan.num_splits > 65535 || plan.split_len <= 0 ||
      int64_t{plan.num_splits} * plan.split_len < p.max_context ||
      (plan.num_splits > 1 && !plan.cluster && workspace == nullptr) ||
      (plan.cluster && plan.groups > 1 && workspace == nullptr) ||
      reinterpret_cast<uintptr_t>(kv.data) % 16 != 0 ||  // 16-byte key/value loads
      (kv.fp8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) ||
      reinterpret_cast<uintptr_t>(out) % 4 != 0 || p.out_stride % 2 != 0 ||  // bf16 pairs
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      (plan.cluster && (!ValidClusterPlan(plan) || tokens.n * plan.num_splits > 0x7fffffff)) ||
      int64_t{p.num_kv_heads} * MakeShape(p, plan.cluster ? plan.heads_per_block : 0).head_chunks >
          65535) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  if (p.scale == 0.0f) p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (plan.tensor_cores) {
    if (plan.cluster || plan.num_splits != 1) return cudaErrorInvalidValue;
    return LaunchPrefillAttention(q, tokens, kv, p, out, stream);
  }
  if (plan.cluster) {
    if (p.head_dim == 64)
      return LaunchDecodeForDim<64, false>(q, tokens, kv, p, plan, {}, workspace, out, stream);
    if (p.head_dim == 128) {
      return LaunchDecodeForDim<128, false>(q, tokens, kv, p, plan, {}, workspace, out, stream);
    }
    return cudaErrorInvalidValue;
  }
  switch (p.head_dim) {
    case 64:
      return LaunchForDim<64>(q, tokens, kv, p, plan, workspace, out, stream);
    case 128:
      return LaunchForDim<128>(q, tokens, kv, p, plan, workspace, out, stream);
    default:
      return LaunchForDim<256>(q, tokens, kv, p, plan, workspace, out, stream);
  }
}

cudaError_t LaunchPagedDecodeWithRope(const bf16* q, const bf16* k, const bf16* v,
                                      int64_t kv_stride, const TokenBatch& tokens,
                                      const PagedKvLayer& kv, const PagedAttentionParams& params,
                                      const QkRopeParams& rope, const PagedAttentionPlan& plan,
                                      void* workspace, bf16* out, cudaStream_t stream) {
  PagedAttentionParams p = params;
  if (!plan.cluster || !ValidParams(p) || kv.num_kv_heads != p.num_kv_heads ||
      kv.head_dim != p.head_dim || kv.block_size <= 0 || tokens.n < 0 || !ValidClusterPlan(plan) ||
      tokens.n * plan.num_splits > 0x7fffffff || rope.head_dim != p.head_dim ||
      (rope.rope_dim != 0 && rope.rope_dim != rope.head_dim) || rope.num_heads != p.num_heads ||
      rope.num_kv_heads != p.num_kv_heads || rope.inv_freq == nullptr || k == nullptr ||
      v == nullptr || (plan.groups > 1 && workspace == nullptr) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      (kv.fp8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) ||
      reinterpret_cast<uintptr_t>(kv.data) % 16 != 0 ||
      int64_t{p.num_kv_heads} * MakeShape(p, plan.heads_per_block).head_chunks > 65535) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  if (p.scale == 0.0f) p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  DecodeRope fuse;
  fuse.k = k;
  fuse.v = v;
  fuse.kv_stride = kv_stride;
  fuse.rope = rope;
  if (p.head_dim == 64) {
    return LaunchDecodeForDim<64, true>(q, tokens, kv, p, plan, fuse, workspace, out, stream);
  }
  if (p.head_dim == 128) {
    return LaunchDecodeForDim<128, true>(q, tokens, kv, p, plan, fuse, workspace, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace strata::gpu
