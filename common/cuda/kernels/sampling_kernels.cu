#include <algorithm>
#include <climits>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/cuda/pdl.cuh"
#include "common/util/philox.h"
#include "common/util/token_cut.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 1024;  // one block per row
constexpr int kWarps = kThreads / kWarpSize;

struct Shared {
  float best_v[kWarps];
  int best_i[kWarps];
  int count[256];                // tokens per digit of a radix pass
  unsigned long long mass[256];  // their amounts
  int select_digit;
  int select_equal;
  unsigned long long select_left;
  unsigned long long total;
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

// The sum over the block, to every thread (integers: the same in any order).
__device__ unsigned long long BlockSum(unsigned long long v, Shared& s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x == 0) s.total = 0;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) atomicAdd(&s.total, v);
  __syncthreads();
  const unsigned long long total = s.total;
  __syncthreads();
  return total;
}

// Gumbel max over the kept tokens (token_cut.h): token i's uniform is draw i of the (seed,
// step) stream, four tokens to a Philox block, as the host's Sampler draws them; blocks with
// no token kept draw nothing.
__device__ int GumbelMax(const float* row, int vocab, const SampleParams& p, const TokenCut& cut,
                         Shared& s) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int base = 4 * static_cast<int>(threadIdx.x); base < vocab; base += 4 * kThreads) {
    float x[4];
    bool kept[4], any = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = base + j;
      x[j] = i < vocab ? row[i] / p.temperature : NAN;
      kept[j] = i < vocab && Kept(x[j], i, cut);
      any |= kept[j];
    }
    if (!any) continue;
    const Philox4 bits = PhiloxBlock(p.seed, p.step, kPhiloxSample, static_cast<uint32_t>(base));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (!kept[j]) continue;
      const float v = GumbelScore(x[j], UniformFromBits(bits.v[j]));
      if (RanksBefore(v, base + j, best, idx)) {
        best = v;
        idx = base + j;
      }
    }
  }
  return BlockReduceArgmax(best, idx, s);
}

// The key at which the amounts of the tokens key_of accepts, summed from the largest key down,
// reach `target` (at most their total): four 8-bit radix passes from the top digit, as the
// host's Sampler finds it. *left: the amount still needed from the tokens on that key;
// *equal: how many tokens are on it. A thread adds a run of equal digits at once (the top
// digits of 150k logits are mostly one).
template <typename KeyFn, typename AmountFn>
__device__ uint32_t RadixSelect(int vocab, unsigned long long target, Shared& s, KeyFn&& key_of,
                                AmountFn&& amount, unsigned long long* left, int* equal) {
  const int lane = threadIdx.x % kWarpSize;
  uint32_t prefix = 0, mask = 0;
  unsigned long long need = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) {
      s.count[d] = 0;
      s.mass[d] = 0;
    }
    __syncthreads();
    int run_digit = -1, run_count = 0;
    unsigned long long run_mass = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      uint32_t key;
      if (!key_of(i, &key) || (key & mask) != prefix) continue;
      const int digit = (key >> shift) & 255;
      if (digit != run_digit) {
        if (run_count > 0) {
          atomicAdd(&s.count[run_digit], run_count);
          atomicAdd(&s.mass[run_digit], run_mass);
        }
        run_digit = digit;
        run_count = 0;
        run_mass = 0;
      }
      ++run_count;
      run_mass += amount(i, key);
    }
    if (run_count > 0) {
      atomicAdd(&s.count[run_digit], run_count);
      atomicAdd(&s.mass[run_digit], run_mass);
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
      // Lane l holds digits 255 - 8 l - j, j < 8: amounts from the top down.
      unsigned long long m[8], local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        m[j] = s.mass[255 - 8 * lane - j];
        local += m[j];
      }
      unsigned long long inclusive = local;
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset <<= 1) {
        const unsigned long long other = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      unsigned long long cum = inclusive - local;
      if (cum < need && need <= inclusive) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum < need && cum + m[j] >= need) {
            s.select_digit = 255 - 8 * lane - j;
            s.select_left = need - cum;
            s.select_equal = s.count[255 - 8 * lane - j];
          }
          cum += m[j];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.select_digit) << shift;
    mask |= 255u << shift;
    need = s.select_left;
  }
  *left = need;
  *equal = s.select_equal;
  return prefix;
}

// The cut that keeps the first tokens of `within` (by key, then index) whose amounts reach
// `target`, as the host's PrefixReaching finds it; amount(i, x) of token i, scaled logit x.
template <typename AmountFn>
__device__ TokenCut PrefixReaching(const float* row, int vocab, float temperature,
                                   const TokenCut& within, unsigned long long target, Shared& s,
                                   AmountFn&& amount) {
  unsigned long long left;
  int equal;
  TokenCut cut = within;
  cut.key = RadixSelect(
      vocab, target, s,
      [&](int i, uint32_t* key) {
        const float x = row[i] / temperature;
        *key = OrderedKey(x);
        return Kept(x, i, within);
      },
      [&](int i, uint32_t key) { return amount(FromOrderedKey(key)); }, &left, &equal);
  // Tokens on the cut key weigh the same: the first n of them by index, n of `equal`.
  const unsigned long long each = amount(FromOrderedKey(cut.key));
  const unsigned long long n = (left + each - 1) / each;
  if (n < static_cast<unsigned long long>(equal)) {
    unsigned long long unused_left;
    int unused_equal;
    // The n-th lowest index: the n-th largest of 0xffffffff - index.
    const uint32_t index_key = RadixSelect(
        vocab, n, s,
        [&](int i, uint32_t* key) {
          const float x = row[i] / temperature;
          *key = 0xffffffffu - static_cast<uint32_t>(i);
          return OrderedKey(x) == cut.key && Kept(x, i, within);
        },
        [](int, uint32_t) { return 1ull; }, &unused_left, &unused_equal);
    cut.last_index = static_cast<int32_t>(0xffffffffu - index_key);
  } else if (cut.key != within.key) {
    cut.last_index = INT32_MAX;
  }
  return cut;
}

// A draw under temperature, top-k, min_p and top-p: the kept prefix (token_cut.h) found by
// radix passes, then Gumbel max over it. Returns 0 when no token is drawable.
__device__ int SampleRow(const float* row, int vocab, const SampleParams& p, Shared& s) {
  const float t = p.temperature;
  TokenCut cut{.min_p = p.min_p};
  const bool limited = p.top_k > 0 && p.top_k < vocab;
  if (limited || p.min_p > 0.0f || p.top_p < 1.0f) {
    const int top = BlockArgmax(vocab, s, [&](int i) { return row[i] / t; });
    cut.x0 = row[top] / t;
    if (!(cut.x0 > -INFINITY)) return 0;  // every logit NaN or -inf
  }
  if (limited) {
    unsigned long long candidates = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) candidates += Kept(row[i] / t, i, cut);
    if (static_cast<unsigned long long>(p.top_k) < BlockSum(candidates, s)) {
      cut = PrefixReaching(row, vocab, t, cut, p.top_k, s, [](float) { return 1ull; });
    }
  }
  if (p.top_p < 1.0f) {
    const float x0 = cut.x0;
    unsigned long long part = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = row[i] / t;
      if (Kept(x, i, cut)) part += FixedMass(expf(x - x0));
    }
    const unsigned long long total = BlockSum(part, s);
    cut = PrefixReaching(row, vocab, t, cut, NucleusTarget(p.top_p, total), s,
                         [x0](float x) { return FixedMass(expf(x - x0)); });
  }
  return GumbelMax(row, vocab, p, cut, s);
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
  const int token =
      greedy ? BlockArgmax(vocab, s, [&](int i) { return row[i]; }) : SampleRow(row, vocab, p, s);
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
