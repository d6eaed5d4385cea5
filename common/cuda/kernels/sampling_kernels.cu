#include <algorithm>
#include <climits>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/cuda/pdl.cuh"
#include "common/util/philox.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 1024;  // one block per row
constexpr int kWarps = kThreads / kWarpSize;
static_assert(kMaxSampleTopK == kThreads, "one candidate per thread");

// Monotone map of floats to unsigned keys (larger float, larger key); NaN sorts lowest.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (isnan(f)) return 0;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct Shared {
  float best_v[kWarps];
  int best_i[kWarps];
  int hist[256];
  int select[3];  // chosen digit, remaining count, count of the chosen digit
  int count;
  float scan[kWarps];
  float bcast[2];
  unsigned long long cand[kThreads];
};

// The (best, idx) that ranks first over the block, its index returned to every thread (0 when
// no thread holds one: all NaN).
__device__ int BlockReduceArgmax(float best, int idx, Shared& s) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  WarpArgmax(best, idx);
  __syncthreads();
  if (lane == 0) {
    s.best_v[warp] = best;
    s.best_i[warp] = idx;
  }
  __syncthreads();
  best = s.best_v[lane];
  idx = s.best_i[lane];
  WarpArgmax(best, idx);
  return idx == INT_MAX ? 0 : idx;
}

// Arg-max over i < vocab of value(i), returned to every thread.
template <typename ValueFn>
__device__ int BlockArgmax(int vocab, Shared& s, ValueFn&& value) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = value(i);
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  return BlockReduceArgmax(best, idx, s);
}

// Gumbel max: the arg-max of logit / T - log(-log(u)) is an exact draw from softmax(logit / T).
// Token i's uniform is draw i of the (seed, step) stream, four tokens to a Philox block, as the
// host's Sampler draws them. Tokens whose probability is below min_p x the largest (x0: the
// largest logit / T) are left out.
__device__ int GumbelMax(const float* row, int vocab, const SampleParams& p, float x0, Shared& s) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int base = 4 * static_cast<int>(threadIdx.x); base < vocab; base += 4 * kThreads) {
    const Philox4 bits = PhiloxBlock(p.seed, p.step, kPhiloxSample, static_cast<uint32_t>(base));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = base + j;
      if (i >= vocab) break;
      const float x = row[i] / p.temperature;
      if (p.min_p > 0.0f && !(expf(x - x0) >= p.min_p)) continue;
      const float v = x - logf(-logf(UniformFromBits(bits.v[j])));
      if (RanksBefore(v, i, best, idx)) {
        best = v;
        idx = i;
      }
    }
  }
  return BlockReduceArgmax(best, idx, s);
}

// The k-th largest key among the i < vocab that key_of(i, &key) accepts (at least k do), by
// 8-bit radix passes from the top. *take_equal: how many elements equal to it belong to the
// top k; *equal: how many equal it in all.
template <typename KeyFn>
__device__ uint32_t RadixSelect(int vocab, int k, Shared& s, KeyFn&& key_of, int* take_equal,
                                int* equal) {
  const int lane = threadIdx.x % kWarpSize;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) s.hist[d] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      uint32_t key;
      if (key_of(i, &key) && (key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
      // Lane l holds digits 255 - 8 l - j, j < 8: counts from the top down.
      int c[8], local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = s.hist[255 - 8 * lane - j];
        local += c[j];
      }
      int inclusive = local;
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset <<= 1) {
        const int other = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      int cum = inclusive - local;
      if (cum < remaining && remaining <= inclusive) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum < remaining && cum + c[j] >= remaining) {
            s.select[0] = 255 - 8 * lane - j;
            s.select[1] = remaining - cum;
            s.select[2] = c[j];
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.select[0]) << shift;
    mask |= 255u << shift;
    remaining = s.select[1];
  }
  *take_equal = remaining;
  *equal = s.select[2];
  return prefix;
}

// Inclusive prefix sum over the block of one float per thread.
__device__ float BlockInclusiveScan(float v, Shared& s) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  float inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const float other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncthreads();
  if (lane == kWarpSize - 1) s.scan[warp] = inclusive;
  __syncthreads();
  float before = 0.0f;
  for (int w = 0; w < warp; ++w) before += s.scan[w];
  return before + inclusive;
}

__device__ float BlockTotal(float v, Shared& s) {
  const float inclusive = BlockInclusiveScan(v, s);
  __syncthreads();
  if (threadIdx.x == kThreads - 1) s.bcast[0] = inclusive;
  __syncthreads();
  return s.bcast[0];
}

// Top-k candidates (sorted), softmax, top-p cut, one uniform draw.
__device__ int SampleFromCandidates(const float* row, int vocab, const SampleParams& p, Shared& s) {
  const bool limited = p.top_k > 0 && p.top_k < vocab;
  const int k = min(limited ? p.top_k : kMaxSampleTopK, min(vocab, kMaxSampleTopK));
  int take_equal, equal;
  const uint32_t threshold = RadixSelect(
      vocab, k, s,
      [&](int i, uint32_t* key) {
        *key = OrderedKey(row[i]);
        return true;
      },
      &take_equal, &equal);
  // Among logits equal to the threshold keep the lowest indices: select on the index too.
  uint32_t min_index_key = 0;
  if (take_equal < equal) {
    int unused_take, unused_equal;
    min_index_key = RadixSelect(
        vocab, take_equal, s,
        [&](int i, uint32_t* key) {
          *key = 0xffffffffu - static_cast<uint32_t>(i);
          return OrderedKey(row[i]) == threshold;
        },
        &unused_take, &unused_equal);
  }
  if (threadIdx.x == 0) s.count = 0;
  s.cand[threadIdx.x] = 0;  // padding sorts last
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint32_t key = OrderedKey(row[i]);
    const uint32_t index_key = 0xffffffffu - static_cast<uint32_t>(i);
    if (key > threshold || (key == threshold && index_key >= min_index_key)) {
      const int slot = atomicAdd(&s.count, 1);
      if (slot < kThreads) s.cand[slot] = (static_cast<unsigned long long>(key) << 32) | index_key;
    }
  }
  __syncthreads();
  // Bitonic sort, descending: by logit, then by lower index.
  for (int size = 2; size <= kThreads; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int i = threadIdx.x;
      const int partner = i ^ stride;
      if (partner > i) {
        const unsigned long long a = s.cand[i], b = s.cand[partner];
        const bool descending = (i & size) == 0;
        if (descending ? a < b : a > b) {
          s.cand[i] = b;
          s.cand[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  const int i = threadIdx.x;
  const int index = static_cast<int>(0xffffffffu - static_cast<uint32_t>(s.cand[i]));
  const float x0 =
      row[static_cast<int>(0xffffffffu - static_cast<uint32_t>(s.cand[0]))] / p.temperature;
  // Weights p / p_max; those below min_p go before the top-p cut (vLLM's order).
  float e = i < k ? expf(row[index] / p.temperature - x0) : 0.0f;
  if (e < p.min_p) e = 0.0f;
  float z;
  if (limited) {
    z = BlockTotal(e, s);
  } else {
    float part = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += kThreads) {
      const float w = expf(row[j] / p.temperature - x0);
      if (w >= p.min_p) part += w;
    }
    z = BlockTotal(part, s);
  }
  const float inclusive = BlockInclusiveScan(e, s);
  int keep = k;
  if (p.top_p < 1.0f) {
    keep = min(k, 1 + __syncthreads_count(i < k && inclusive / z < p.top_p));
  }
  if (i == keep - 1) s.bcast[1] = inclusive;
  __syncthreads();
  const float total = s.bcast[1];
  const float draw = PhiloxUniform(p.seed, p.step, kPhiloxSample, 0) * total;  // in (0, total)
  const int below = __syncthreads_count(i < keep && inclusive <= draw);
  const int choice = min(below, keep - 1);
  __syncthreads();
  if (i == choice) s.best_i[0] = index;
  __syncthreads();
  return s.best_i[0];
}

// Greedy tokens of a large vocabulary in two launches: each of `parts` blocks a row scans one
// slice (one block a row would scan 150k logits from a single SM), then a warp a row picks
// among the slices' winners.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxSlice = 4096;  // logits a block scans, about
constexpr int kMaxArgmaxParts = 64;

struct ArgmaxPartial {
  float value;
  int index;  // INT_MAX: nothing in the slice ranks (all NaN)
};

__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxSliceKernel(const float* __restrict__ logits, int vocab, int parts,
                      ArgmaxPartial* __restrict__ partial) {
  __shared__ ArgmaxPartial warps[kArgmaxThreads / kWarpSize];
  PdlLaunchDependents();
  PdlWait();
  const float* row = logits + int64_t{blockIdx.y} * vocab;
  const int per = (vocab + parts - 1) / parts;
  const int begin = static_cast<int>(blockIdx.x) * per;
  const int end = min(vocab, begin + per);
  float best = -INFINITY;
  int idx = INT_MAX;
#pragma unroll 4
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kArgmaxThreads) {
    const float v = row[i];
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  WarpArgmax(best, idx);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warps[warp] = {best, idx};
  __syncthreads();
  if (warp != 0) return;
  best = lane < kArgmaxThreads / kWarpSize ? warps[lane].value : -INFINITY;
  idx = lane < kArgmaxThreads / kWarpSize ? warps[lane].index : INT_MAX;
  WarpArgmax(best, idx);
  if (lane == 0) partial[int64_t{blockIdx.y} * parts + blockIdx.x] = {best, idx};
}

__global__ void __launch_bounds__(kWarpSize)
    ArgmaxFinishKernel(const ArgmaxPartial* __restrict__ partial, int parts,
                       int32_t* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const ArgmaxPartial* row = partial + int64_t{blockIdx.x} * parts;
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int p = threadIdx.x; p < parts; p += kWarpSize) {
    if (RanksBefore(row[p].value, row[p].index, best, idx)) {
      best = row[p].value;
      idx = row[p].index;
    }
  }
  WarpArgmax(best, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx == INT_MAX ? 0 : idx;  // all NaN: token 0
}

int ArgmaxParts(int64_t vocab) {
  return static_cast<int>(
      std::clamp<int64_t>((vocab + kArgmaxSlice - 1) / kArgmaxSlice, 1, kMaxArgmaxParts));
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab,
                 const SampleParams* __restrict__ params, int32_t* __restrict__ out,
                 bool keep_greedy_rows) {
  __shared__ Shared s;
  const float* row = logits + int64_t{blockIdx.x} * vocab;
  const SampleParams p = params[blockIdx.x];
  const bool greedy = !(p.temperature > 0.0f);
  if (greedy && keep_greedy_rows) return;
  int token;
  if (greedy) {
    token = BlockArgmax(vocab, s, [&](int i) { return row[i]; });
  } else if ((p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.0f) {
    float x0 = 0.0f;
    if (p.min_p > 0.0f) {
      const int top = BlockArgmax(vocab, s, [&](int i) { return row[i]; });
      x0 = row[top] / p.temperature;
    }
    token = GumbelMax(row, vocab, p, x0, s);
  } else {
    token = SampleFromCandidates(row, vocab, p, s);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = token;
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
      LaunchPdl(ArgmaxSliceKernel, dim3(parts, static_cast<unsigned>(n)), dim3(kArgmaxThreads), 0,
                stream, logits, static_cast<int>(vocab), parts, partial);
  if (sliced != cudaSuccess) return sliced;
  return LaunchPdl(ArgmaxFinishKernel, dim3(static_cast<unsigned>(n)), dim3(kWarpSize), 0, stream,
                   static_cast<const ArgmaxPartial*>(partial), parts, out);
}

cudaError_t LaunchSample(const float* logits, int64_t n, int64_t vocab, const SampleParams* params,
                         int32_t* out, cudaStream_t stream, bool keep_greedy_rows) {
  if (n < 0 || n > 0x7fffffff || vocab <= 0 || vocab > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  SampleKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, static_cast<int>(vocab),
                                                                  params, out, keep_greedy_rows);
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
