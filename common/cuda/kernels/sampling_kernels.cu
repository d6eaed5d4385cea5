#include <algorithm>
#include <climits>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/row_cut.cuh"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/cuda/pdl.cuh"
#include "common/util/philox.h"
#include "common/util/token_cut.h"

namespace strata::gpu {
namespace {

// Greedy tokens of a large vocabulary in two launches: each of `parts` blocks a row scans one
// slice (one block a row would scan 150k logits from a single SM), then a warp a row picks
// among the slices' winners.
constexpr int kSliceThreads = 256;
constexpr int kArgmaxSlice = 4096;  // logits a block scans, about
constexpr int kMaxArgmaxParts = 64;

struct ArgmaxPartial {
  float value;
  int index;  // INT_MAX: nothing in the slice ranks (all NaN)
};

// A slice block's (best, idx) over its threads, written by its first thread to `slot`.
__device__ void WriteSlicePartial(float best, int idx, ArgmaxPartial* warps, ArgmaxPartial& slot) {
  WarpArgmax(best, idx);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warps[warp] = {best, idx};
  __syncthreads();
  if (warp != 0) return;
  best = lane < kSliceThreads / kWarpSize ? warps[lane].value : -INFINITY;
  idx = lane < kSliceThreads / kWarpSize ? warps[lane].index : INT_MAX;
  WarpArgmax(best, idx);
  if (lane == 0) slot = {best, idx};
}

// The index that ranks first among a row's slice partials, to a warp (0 when none ranks: all
// NaN, or nothing kept).
__device__ int BestOfParts(const ArgmaxPartial* row, int parts) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int p = threadIdx.x; p < parts; p += kWarpSize) {
    if (RanksBefore(row[p].value, row[p].index, best, idx)) {
      best = row[p].value;
      idx = row[p].index;
    }
  }
  WarpArgmax(best, idx);
  return idx == INT_MAX ? 0 : idx;
}

__global__ void __launch_bounds__(kSliceThreads)
    ArgmaxSliceKernel(const float* __restrict__ logits, int vocab, int parts,
                      ArgmaxPartial* __restrict__ partial) {
  __shared__ ArgmaxPartial warps[kSliceThreads / kWarpSize];
  PdlLaunchDependents();
  PdlWait();
  const float* row = logits + int64_t{blockIdx.y} * vocab;
  const int per = (vocab + parts - 1) / parts;
  const int begin = static_cast<int>(blockIdx.x) * per;
  const int end = min(vocab, begin + per);
  float best = -INFINITY;
  int idx = INT_MAX;
#pragma unroll 4
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kSliceThreads) {
    const float v = row[i];
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  WriteSlicePartial(best, idx, warps, partial[int64_t{blockIdx.y} * parts + blockIdx.x]);
}

__global__ void __launch_bounds__(kWarpSize)
    ArgmaxFinishKernel(const ArgmaxPartial* __restrict__ partial, int parts,
                       int32_t* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const int idx = BestOfParts(partial + int64_t{blockIdx.x} * parts, parts);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

int ArgmaxParts(int64_t vocab) {
  return static_cast<int>(
      std::clamp<int64_t>((vocab + kArgmaxSlice - 1) / kArgmaxSlice, 1, kMaxArgmaxParts));
}

// A sampled row's state between its kernels.
struct RowCut {
  TokenCut cut;
  int32_t draw;  // 1: GumbelSliceKernel draws over the row under `cut`; 0: out[r] is final
};

// Each row's token or cut, on a cluster of row_cut::kCutBlocks blocks: greedy rows their
// arg-max (or nothing when `keep_greedy_rows`: LaunchArgmax wrote out[r], for every row),
// sampled rows row_cut::SampleRow's outcome.
__global__ void __cluster_dims__(row_cut::kCutBlocks, 1, 1) __launch_bounds__(row_cut::kThreads)
    SampleCutKernel(const float* __restrict__ logits, int vocab,
                    const SampleParams* __restrict__ params, int32_t* __restrict__ out,
                    bool keep_greedy_rows, bool draw_first, RowCut* __restrict__ cuts) {
  __shared__ row_cut::Shared s;
  row_cut::Cluster c{.group = cooperative_groups::this_cluster()};
  c.rank = static_cast<int>(c.group.block_rank());
  const int r = static_cast<int>(blockIdx.x) / row_cut::kCutBlocks;
  const float* row = logits + int64_t{r} * vocab;
  const SampleParams p = params[r];
  if (c.rank == 0) {
    for (int d = threadIdx.x; d < 256; d += row_cut::kThreads) s.meet[0][d] = 0;
    if (threadIdx.x == 0) s.n_candidates = 0;
  }
  c.group.sync();  // every block runs, block 0's meeting places are clear
  int32_t token;
  row_cut::RowDraw draw;
  if (!(p.temperature > 0.0f)) {
    token =
        keep_greedy_rows ? -2 : row_cut::ClusterArgmax(vocab, s, c, [&](int i) { return row[i]; });
  } else {
    draw = row_cut::SampleRow(row, vocab, p, keep_greedy_rows ? out[r] : -1, draw_first, s, c);
    token = draw.token;
  }
  c.group.sync();  // nothing reads block 0's shared memory any more: it may exit
  if (c.rank != 0 || threadIdx.x != 0) return;
  cuts[r] = {draw.cut, token == -1};
  if (token >= 0) out[r] = token;
}

// Gumbel max over the kept tokens of one slice of a row (ArgmaxParts slices, each a multiple
// of four tokens): token i's uniform is draw i of the (seed, step) stream, four tokens to a
// Philox block, as the host's Sampler draws them; blocks with no token kept draw nothing.
__global__ void __launch_bounds__(kSliceThreads)
    GumbelSliceKernel(const float* __restrict__ logits, int vocab, int parts,
                      const SampleParams* __restrict__ params, const RowCut* __restrict__ cuts,
                      ArgmaxPartial* __restrict__ partial) {
  __shared__ ArgmaxPartial warps[kSliceThreads / kWarpSize];
  const RowCut rc = cuts[blockIdx.y];
  if (!rc.draw) return;
  const SampleParams p = params[blockIdx.y];
  const float* row = logits + int64_t{blockIdx.y} * vocab;
  const int per = ((vocab + parts - 1) / parts + 3) / 4 * 4;
  const int begin = static_cast<int>(blockIdx.x) * per;
  const int end = min(vocab, begin + per);
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int base = begin + 4 * static_cast<int>(threadIdx.x); base < end;
       base += 4 * kSliceThreads) {
    row_cut::FoldGumbelFour(row, base, end, p.temperature, rc.cut, p, best, idx);
  }
  WriteSlicePartial(best, idx, warps, partial[int64_t{blockIdx.y} * parts + blockIdx.x]);
}

// The rows GumbelSliceKernel drew over: the best of their slices' draws (0: none kept).
__global__ void __launch_bounds__(kWarpSize)
    GumbelFinishKernel(const ArgmaxPartial* __restrict__ partial, int parts,
                       const RowCut* __restrict__ cuts, int32_t* __restrict__ out) {
  if (!cuts[blockIdx.x].draw) return;
  const int idx = BestOfParts(partial + int64_t{blockIdx.x} * parts, parts);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

constexpr int kTransformThreads = 256;

__device__ __forceinline__ bool HasTransforms(const SampleParams& p) {
  return p.list_size > 0 || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f;
}

// The penalties of a token `count` times in the output (seen: in the prompt or output), as
// logits_transforms.h defines them.
__device__ __forceinline__ float Penalized(float x, bool seen, int count, const SampleParams& p) {
  if (p.repetition_penalty != 1.0f && (seen || count > 0)) {
    x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
  }
  if (count > 0) x -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
  return x;
}

__global__ void __launch_bounds__(kTransformThreads)
    ApplyLogitTransformsKernel(float* __restrict__ logits, int vocab,
                               const SampleParams* __restrict__ params,
                               const LogitEntry* __restrict__ entries,
                               const int32_t* __restrict__ history) {
  const SampleParams p = params[blockIdx.x];
  if (!HasTransforms(p)) return;
  float* row = logits + int64_t{blockIdx.x} * vocab;
  // The outputs after the list was made: this row's last steps, still only on the device.
  int recent[kTokenHistory];
  const uint64_t lag = p.step > p.list_step ? p.step - p.list_step : 0;
  const int n_recent = lag < kTokenHistory ? static_cast<int>(lag) : kTokenHistory;
  for (int h = 0; h < n_recent; ++h) {
    const uint64_t step = p.list_step + static_cast<uint64_t>(h);
    recent[h] = history[blockIdx.x * kTokenHistory + static_cast<int>(step % kTokenHistory)];
  }
  const LogitEntry* list = entries + p.list_offset;
  for (int i = threadIdx.x; i < p.list_size; i += kTransformThreads) {
    const LogitEntry e = list[i];
    if (e.token < 0 || e.token >= vocab) continue;
    int count = e.output_count;
    for (int h = 0; h < n_recent; ++h) count += recent[h] == e.token;
    float x = row[e.token] + e.bias;
    if ((e.flags & LogitEntry::kHeldBack) && p.step < static_cast<uint64_t>(p.min_tokens)) {
      x = -INFINITY;
    }
    row[e.token] = Penalized(x, (e.flags & LogitEntry::kSeen) != 0, count, p);
  }
  if (threadIdx.x != 0) return;
  // Recent tokens the list does not hold (new in the output): penalized by their count there.
  for (int h = 0; h < n_recent; ++h) {
    const int token = recent[h];
    bool first = token >= 0 && token < vocab;
    for (int g = 0; g < h; ++g) first &= recent[g] != token;
    if (!first) continue;
    int lo = 0, hi = p.list_size;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (list[mid].token < token) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo < p.list_size && list[lo].token == token) continue;
    int count = 0;
    for (int g = 0; g < n_recent; ++g) count += recent[g] == token;
    row[token] = Penalized(row[token], false, count, p);
  }
}

__global__ void RecordTokensKernel(const int32_t* __restrict__ tokens, int n,
                                   const SampleParams* __restrict__ params,
                                   int32_t* __restrict__ history) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  history[r * kTokenHistory + static_cast<int>(params[r].step % kTokenHistory)] = tokens[r];
}

}  // namespace

int64_t ArgmaxScratchBytes(int64_t n, int64_t vocab) {
  return n * ArgmaxParts(vocab) * static_cast<int64_t>(sizeof(ArgmaxPartial));
}

cudaError_t LaunchArgmax(const float* logits, int64_t n, int64_t vocab, void* scratch, int32_t* out,
                         cudaStream_t stream) {
  if (n < 0 || n > 0xffff || vocab <= 0 || vocab > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int parts = ArgmaxParts(vocab);
  auto* partial = static_cast<ArgmaxPartial*>(scratch);
  const cudaError_t sliced =
      LaunchPdl(ArgmaxSliceKernel, dim3(parts, static_cast<unsigned>(n)), dim3(kSliceThreads), 0,
                stream, logits, static_cast<int>(vocab), parts, partial);
  if (sliced != cudaSuccess) return sliced;
  return LaunchPdl(ArgmaxFinishKernel, dim3(static_cast<unsigned>(n)), dim3(kWarpSize), 0, stream,
                   static_cast<const ArgmaxPartial*>(partial), parts, out);
}

int64_t SampleScratchBytes(int64_t n, int64_t vocab) {
  return n * (static_cast<int64_t>(sizeof(RowCut)) +
              ArgmaxParts(vocab) * static_cast<int64_t>(sizeof(ArgmaxPartial)));
}

cudaError_t LaunchSample(const float* logits, int64_t n, int64_t vocab, const SampleParams* params,
                         void* scratch, int32_t* out, cudaStream_t stream, bool keep_greedy_rows,
                         bool draw_first) {
  if (n < 0 || n > 0xffff || vocab <= 0 || vocab > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int parts = ArgmaxParts(vocab);
  auto* cuts = static_cast<RowCut*>(scratch);
  auto* partial = reinterpret_cast<ArgmaxPartial*>(cuts + n);
  const unsigned rows = static_cast<unsigned>(n);
  SampleCutKernel<<<rows * row_cut::kCutBlocks, row_cut::kThreads, 0, stream>>>(
      logits, static_cast<int>(vocab), params, out, keep_greedy_rows, draw_first, cuts);
  GumbelSliceKernel<<<dim3(parts, rows), kSliceThreads, 0, stream>>>(
      logits, static_cast<int>(vocab), parts, params, cuts, partial);
  GumbelFinishKernel<<<rows, kWarpSize, 0, stream>>>(partial, parts, cuts, out);
  return cudaGetLastError();
}

cudaError_t LaunchApplyLogitTransforms(float* logits, int64_t n, int64_t vocab,
                                       const SampleParams* params, const LogitEntry* entries,
                                       const int32_t* history, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || vocab <= 0 || vocab > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ApplyLogitTransformsKernel<<<static_cast<unsigned>(n), kTransformThreads, 0, stream>>>(
      logits, static_cast<int>(vocab), params, entries, history);
  return cudaGetLastError();
}

cudaError_t LaunchRecordTokens(const int32_t* tokens, int64_t n, const SampleParams* params,
                               int32_t* history, cudaStream_t stream) {
  if (n < 0 || n > 0xffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  RecordTokensKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      tokens, static_cast<int>(n), params, history);
  return cudaGetLastError();
}

}  // namespace strata::gpu
