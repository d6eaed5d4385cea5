// The kept prefix of a sampled row (common/util/token_cut.h), found on the device by a cluster
// of kCutBlocks blocks, for sampling_kernels.cu. Every block of the cluster scans its stripe of
// the row; sums and histograms meet in block 0's shared memory, so each pass over 150k logits
// runs on kCutBlocks SMs. A top-k or top-p cut is first looked for among the kept tokens of a
// band below the largest logit, the narrowest band that holds it with at most kMaxCandidates
// tokens: those are gathered into block 0 and ranked there. A wider nucleus (a nearly flat row)
// takes four radix passes over the row, as the host's Sampler does, or (draw_first) is drawn
// over first, every kept token, and the draw kept when the nucleus holds it.
#ifndef STRATA_COMMON_CUDA_KERNELS_ROW_CUT_CUH_
#define STRATA_COMMON_CUDA_KERNELS_ROW_CUT_CUH_

#include <cooperative_groups.h>

#include <climits>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/util/philox.h"
#include "common/util/token_cut.h"

namespace strata::gpu::row_cut {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kCutBlocks = 8;  // a row's cluster (the portable size)
constexpr int kStride = kThreads * kCutBlocks;
constexpr int kMaxCandidates = 4096;
// Bands: bin 0 holds the tokens within 2^-12 of the largest scaled logit x0, bin b in 1..17
// those with x0 - x in [2^(b-13), 2^(b-12)), bin 18 the rest; band j is bins 0..j.
constexpr int kBins = 19;
// A radix pass's amounts per digit are summed in kHistGroups copies, each shared by the warps
// of a group, so that threads do not all queue on the few digits a flat row's keys share.
constexpr int kHistGroups = 16;

struct Shared {
  float best_v[kWarps];
  int best_i[kWarps];
  unsigned long long values[256];  // what a ClusterSum adds and gets back
  unsigned long long total;
  int select_digit;
  unsigned long long select_left;
  // Block 0's: where the cluster's sums meet (three in turn: ClusterSum), the blocks' arg-max
  // candidates, the gathered tokens' count.
  unsigned long long meet[3][256];
  float arg_v[kCutBlocks];
  int arg_i[kCutBlocks];
  int n_candidates;
  int last;
  union {
    unsigned long long group_mass[kHistGroups][256];
    // Block 0's: (key << 32 | ~index) of a band's tokens; descending order is their ranking.
    unsigned long long candidates[kMaxCandidates];
  };
};

// A block's place in its row's cluster, and how many ClusterSums it has made.
struct Cluster {
  cg::cluster_group group;
  int rank;
  int sums = 0;
  __device__ int first() const { return rank * kThreads + static_cast<int>(threadIdx.x); }
};

// The sum of v over the lanes up to this one.
__device__ unsigned long long WarpInclusiveSum(unsigned long long v) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// The (best, idx) that ranks first over the block, to every thread (idx INT_MAX: none).
__device__ void BlockReduceArgmax(float& best, int& idx, Shared& s) {
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
}

// The (best, idx) that ranks first over the cluster, from each thread's own: its index, to
// every thread (0 when none ranks). Block 0's arg_v / arg_i are reused: calls must have a
// cluster sync between them (every ClusterSum has one).
__device__ int ClusterBest(float best, int idx, Shared& s, Cluster& c) {
  BlockReduceArgmax(best, idx, s);
  if (threadIdx.x == 0) {
    *c.group.map_shared_rank(&s.arg_v[c.rank], 0) = best;
    *c.group.map_shared_rank(&s.arg_i[c.rank], 0) = idx;
  }
  c.group.sync();
  best = -INFINITY;
  idx = INT_MAX;
  for (int b = 0; b < kCutBlocks; ++b) {
    const float v = *c.group.map_shared_rank(&s.arg_v[b], 0);
    const int i = *c.group.map_shared_rank(&s.arg_i[b], 0);
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  return idx == INT_MAX ? 0 : idx;
}

// The first index of the row's largest value(i) over the cluster, to every thread (0 when
// none ranks: all NaN).
template <typename ValueFn>
__device__ int ClusterArgmax(int vocab, Shared& s, Cluster& c, ValueFn&& value) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int i = c.first(); i < vocab; i += kStride) {
    const float v = value(i);
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  return ClusterBest(best, idx, s, c);
}

// s.values[0..n) summed over the cluster's blocks, in place (integers: the same in any order).
// Block 0's meet[k % 3] takes call k's sums: it is cleared during call k - 1, after every block
// has read it in call k - 2 (they all passed call k - 1's sync since).
__device__ void ClusterSum(int n, Shared& s, Cluster& c) {
  unsigned long long* meet = c.group.map_shared_rank(s.meet[c.sums % 3], 0);
  if (c.rank == 0) {
    for (int d = threadIdx.x; d < 256; d += kThreads) s.meet[(c.sums + 1) % 3][d] = 0;
  }
  __syncthreads();  // s.values complete
  for (int d = threadIdx.x; d < n; d += kThreads) {
    if (s.values[d] != 0) atomicAdd(&meet[d], s.values[d]);
  }
  c.group.sync();
  for (int d = threadIdx.x; d < n; d += kThreads) s.values[d] = meet[d];
  __syncthreads();
  ++c.sums;
}

// One value summed over the cluster, to every thread.
__device__ unsigned long long ClusterSum(unsigned long long v, Shared& s, Cluster& c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x == 0) s.values[0] = 0;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) atomicAdd(&s.values[0], v);
  ClusterSum(1, s, c);
  return s.values[0];
}

// The key at which the amounts of the tokens key_of accepts, summed from the largest key down,
// reach `target` (at most their total): four 8-bit radix passes from the top digit, as the
// host's Sampler finds it. *left: the amount still needed from the tokens on that key;
// *on_key: their whole amount. A thread adds a run of equal digits at once (the top digits of
// 150k logits are mostly one).
template <typename KeyFn, typename AmountFn>
__device__ uint32_t RadixSelect(int vocab, unsigned long long target, Shared& s, Cluster& c,
                                KeyFn&& key_of, AmountFn&& amount, unsigned long long* left,
                                unsigned long long* on_key) {
  const int lane = threadIdx.x % kWarpSize;
  unsigned long long* const group = s.group_mass[(threadIdx.x / kWarpSize) % kHistGroups];
  uint32_t prefix = 0, mask = 0;
  unsigned long long need = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < kHistGroups * 256; d += kThreads) {
      s.group_mass[d / 256][d % 256] = 0;
    }
    __syncthreads();
    int run_digit = -1;
    unsigned long long run_mass = 0;
    for (int i = c.first(); i < vocab; i += kStride) {
      uint32_t key;
      if (!key_of(i, &key) || (key & mask) != prefix) continue;
      const int digit = (key >> shift) & 255;
      if (digit != run_digit) {
        if (run_digit >= 0) atomicAdd(&group[run_digit], run_mass);
        run_digit = digit;
        run_mass = 0;
      }
      run_mass += amount(i, key);
    }
    if (run_digit >= 0) atomicAdd(&group[run_digit], run_mass);
    __syncthreads();
    for (int d = threadIdx.x; d < 256; d += kThreads) {
      unsigned long long sum = 0;
#pragma unroll
      for (int g = 0; g < kHistGroups; ++g) sum += s.group_mass[g][d];
      s.values[d] = sum;
    }
    ClusterSum(256, s, c);
    if (threadIdx.x < kWarpSize) {
      // Lane l holds digits 255 - 8 l - j, j < 8: amounts from the top down.
      unsigned long long m[8], local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        m[j] = s.values[255 - 8 * lane - j];
        local += m[j];
      }
      const unsigned long long inclusive = WarpInclusiveSum(local);
      unsigned long long cum = inclusive - local;
      if (cum < need && need <= inclusive) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum < need && cum + m[j] >= need) {
            s.select_digit = 255 - 8 * lane - j;
            s.select_left = need - cum;
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
  *on_key = s.values[s.select_digit];
  __syncthreads();  // read before the next pass may write them
  return prefix;
}

// The cut that keeps the first tokens of `within` (by key, then index) whose amounts reach
// `target`, as the host's PrefixReaching finds it; amount(x) of a token of scaled logit x.
template <typename AmountFn>
__device__ TokenCut PrefixReaching(const float* row, int vocab, float temperature,
                                   const TokenCut& within, unsigned long long target, Shared& s,
                                   Cluster& c, AmountFn&& amount) {
  unsigned long long left, on_key;
  TokenCut cut = within;
  cut.key = RadixSelect(
      vocab, target, s, c,
      [&](int i, uint32_t* key) {
        const float x = row[i] / temperature;
        *key = OrderedKey(x);
        return Kept(x, i, within);
      },
      [&](int i, uint32_t key) { return amount(FromOrderedKey(key)); }, &left, &on_key);
  // Tokens on the cut key weigh the same (each > 0: the key reached the target): the first n
  // of them by index, of on_key / each.
  const unsigned long long each = amount(FromOrderedKey(cut.key));
  const unsigned long long n = (left + each - 1) / each;
  if (n < on_key / each) {
    unsigned long long unused_left, unused_on_key;
    // The n-th lowest index: the n-th largest of 0xffffffff - index.
    const uint32_t index_key = RadixSelect(
        vocab, n, s, c,
        [&](int i, uint32_t* key) {
          const float x = row[i] / temperature;
          *key = 0xffffffffu - static_cast<uint32_t>(i);
          return OrderedKey(x) == cut.key && Kept(x, i, within);
        },
        [](int, uint32_t) { return 1ull; }, &unused_left, &unused_on_key);
    cut.last_index = static_cast<int32_t>(0xffffffffu - index_key);
  } else if (cut.key != within.key) {
    cut.last_index = INT32_MAX;
  }
  return cut;
}

// Ranked candidates: token key and index in and out of (key << 32 | ~index).
__device__ __forceinline__ unsigned long long RankWord(uint32_t key, int i) {
  return static_cast<unsigned long long>(key) << 32 | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ uint32_t WordKey(unsigned long long w) {
  return static_cast<uint32_t>(w >> 32);
}
__device__ __forceinline__ int WordIndex(unsigned long long w) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(w));
}
__device__ __forceinline__ unsigned long long WordMass(unsigned long long w, float x0) {
  return FixedMass(expf(FromOrderedKey(WordKey(w)) - x0));
}

// The bin of a token of scaled logit x (x0 - x >= 0): monotone in x, so every band is a prefix
// of the tokens' ranking.
__device__ __forceinline__ int BinOf(float x, float x0) {
  const float d = x0 - x;
  if (!(d >= 0x1p-12f)) return 0;
  const int exponent = static_cast<int>((__float_as_uint(d) >> 23) & 0xff) - 127;  // d normal
  return min(kBins - 1, exponent + 13);
}

// The kept tokens of each band: s.values[j] their count, s.values[kBins + j] their mass (with
// `with_mass`), over the cluster. `copies` (1 or kHistGroups) sums them in that many copies, as
// RadixSelect's digits are: a flat row's tokens nearly all fall in one or two bins, so one copy
// queues every thread's atomics on them.
__device__ void WeighBands(const float* row, int vocab, float t, const TokenCut& cut,
                           bool with_mass, int copies, Shared& s, Cluster& c) {
  for (int d = threadIdx.x; d < copies * 2 * kBins; d += kThreads) {
    s.group_mass[d / (2 * kBins)][d % (2 * kBins)] = 0;
  }
  __syncthreads();
  unsigned long long* const group = s.group_mass[(threadIdx.x / kWarpSize) % copies];
  int run_bin = -1;
  unsigned long long run_count = 0, run_mass = 0;
  for (int i = c.first(); i < vocab; i += kStride) {
    const float x = row[i] / t;
    if (!Kept(x, i, cut)) continue;
    const int bin = BinOf(x, cut.x0);
    if (bin != run_bin) {
      if (run_bin >= 0) {
        atomicAdd(&group[run_bin], run_count);
        atomicAdd(&group[kBins + run_bin], run_mass);
      }
      run_bin = bin;
      run_count = 0;
      run_mass = 0;
    }
    ++run_count;
    if (with_mass) run_mass += FixedMass(expf(x - cut.x0));
  }
  if (run_bin >= 0) {
    atomicAdd(&group[run_bin], run_count);
    atomicAdd(&group[kBins + run_bin], run_mass);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < 2 * kBins; d += kThreads) {
    unsigned long long sum = 0;
    for (int g = 0; g < copies; ++g) sum += s.group_mass[g][d];
    s.values[d] = sum;
  }
  ClusterSum(2 * kBins, s, c);
  if (threadIdx.x == 0) {  // bins to bands
    for (int j = 1; j < kBins; ++j) {
      s.values[j] += s.values[j - 1];
      s.values[kBins + j] += s.values[kBins + j - 1];
    }
  }
  __syncthreads();
}

// Folds the Gumbel scores of the tokens `cut` keeps among base .. base + 3 (those below `end`)
// into (best, idx), with the host Sampler's draws: token i's uniform is draw i of the (seed,
// step) stream, four tokens to a Philox block (base a multiple of four).
__device__ __forceinline__ void FoldGumbelFour(const float* row, int base, int end, float t,
                                               const TokenCut& cut, const SampleParams& p,
                                               float& best, int& idx) {
  float x[4];
  bool kept[4], any = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[j] = base + j < end ? row[base + j] / t : NAN;
    kept[j] = base + j < end && Kept(x[j], base + j, cut);
    any |= kept[j];
  }
  if (!any) return;
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

// Gumbel max over every token `cut` keeps, to every thread.
__device__ int ClusterGumbelMax(const float* row, int vocab, float t, const TokenCut& cut,
                                const SampleParams& p, Shared& s, Cluster& c) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int base = 4 * c.first(); base < vocab; base += 4 * kStride) {
    FoldGumbelFour(row, base, vocab, t, cut, p, best, idx);
  }
  return ClusterBest(best, idx, s, c);
}

// The mass of the tokens `cut` keeps that rank before token d (a larger key, or the same key
// and a lower index), to every thread.
__device__ unsigned long long MassRankedBefore(const float* row, int vocab, float t,
                                               const TokenCut& cut, int d, Shared& s, Cluster& c) {
  const uint32_t d_key = OrderedKey(row[d] / t);
  unsigned long long part = 0;
  for (int i = c.first(); i < vocab; i += kStride) {
    const float x = row[i] / t;
    if (!Kept(x, i, cut)) continue;
    const uint32_t key = OrderedKey(x);
    if (key > d_key || (key == d_key && i < d)) part += FixedMass(expf(x - cut.x0));
  }
  return ClusterSum(part, s, c);
}

// Gathers the kept tokens of bins 0..band (at most kMaxCandidates) into block 0's candidates;
// block 0 then ranks them. Returns how many (in block 0).
__device__ int GatherRanked(const float* row, int vocab, float t, const TokenCut& cut, int band,
                            Shared& s, Cluster& c) {
  const int lane = threadIdx.x % kWarpSize;
  int* const count = c.group.map_shared_rank(&s.n_candidates, 0);
  unsigned long long* const to = c.group.map_shared_rank(s.candidates, 0);
  for (int base = c.rank * kThreads; base < vocab; base += kStride) {
    const int i = base + static_cast<int>(threadIdx.x);
    const float x = i < vocab ? row[i] / t : NAN;
    const bool take = i < vocab && Kept(x, i, cut) && BinOf(x, cut.x0) <= band;
    const unsigned taking = __ballot_sync(kFullMask, take);
    if (taking == 0) continue;
    int first = 0;
    if (lane == 0) first = atomicAdd(count, __popc(taking));
    first = __shfl_sync(kFullMask, first, 0);
    if (take) to[first + __popc(taking & ((1u << lane) - 1))] = RankWord(OrderedKey(x), i);
  }
  c.group.sync();
  if (c.rank != 0) return 0;
  const int n = s.n_candidates;
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += kThreads) s.candidates[i] = 0;
  __syncthreads();
  // Bitonic sort, descending.
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += kThreads) {
        const int partner = i ^ j;
        if (partner <= i) continue;
        const unsigned long long a = s.candidates[i], b = s.candidates[partner];
        if ((i & k) == 0 ? a < b : a > b) {
          s.candidates[i] = b;
          s.candidates[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  return n;
}

// Block 0: the first position among the ranked candidates 0..n-1 at which their masses,
// summed from the first, reach `target` (at most their total).
__device__ int PositionReaching(int n, float x0, unsigned long long target, Shared& s) {
  static_assert(kMaxCandidates <= 4 * kThreads);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int begin = 4 * static_cast<int>(threadIdx.x);
  unsigned long long m[4], local = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = begin + r < n ? WordMass(s.candidates[begin + r], x0) : 0;
    local += m[r];
  }
  const unsigned long long inclusive = WarpInclusiveSum(local);
  if (lane == kWarpSize - 1) s.values[warp] = inclusive;  // the warps' totals
  __syncthreads();
  if (warp == 0) {
    const unsigned long long total = s.values[lane];
    s.values[kWarps + lane] = WarpInclusiveSum(total) - total;
  }
  __syncthreads();
  unsigned long long cum = s.values[kWarps + warp] + inclusive - local;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    if (cum < target && cum + m[r] >= target) s.last = begin + r;
    cum += m[r];
  }
  __syncthreads();
  return s.last;
}

// Block 0: the sum of the masses of the ranked candidates 0..n-1, to every thread.
__device__ unsigned long long RankedMass(int n, float x0, Shared& s) {
  unsigned long long v = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) v += WordMass(s.candidates[i], x0);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x == 0) s.total = 0;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) atomicAdd(&s.total, v);
  __syncthreads();
  return s.total;
}

// Block 0: Gumbel max over the ranked candidates 0..last, with the draws the host's Sampler
// makes for them (token i: uniform i of the (seed, step) stream).
__device__ int GumbelMaxRanked(int last, const SampleParams& p, Shared& s) {
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int r = threadIdx.x; r <= last; r += kThreads) {
    const unsigned long long w = s.candidates[r];
    const int i = WordIndex(w);
    const float u = PhiloxUniform(p.seed, p.step, kPhiloxSample, static_cast<uint32_t>(i));
    const float v = GumbelScore(FromOrderedKey(WordKey(w)), u);
    if (RanksBefore(v, i, best, idx)) {
      best = v;
      idx = i;
    }
  }
  BlockReduceArgmax(best, idx, s);
  return idx == INT_MAX ? 0 : idx;
}

// A sampled row's outcome: a token drawn already (from a band's ranked tokens, or 0 when
// nothing is drawable), or the cut a Gumbel max over the whole row draws under.
struct RowDraw {
  TokenCut cut;
  int32_t token = -1;  // -1: draw over the row under `cut`
};

// A draw under temperature, top-k, min_p and top-p: the kept prefix, found among a band's
// ranked tokens (then drawn here, by block 0) or by radix passes. top: the row's arg-max when
// known (LaunchArgmax wrote it), else -1. draw_first: a nucleus too wide to rank is drawn over
// first (below). Block 0's outcome is the row's.
__device__ RowDraw SampleRow(const float* row, int vocab, const SampleParams& p, int top,
                             bool draw_first, Shared& s, Cluster& c) {
  const float t = p.temperature;
  RowDraw draw{.cut = {.min_p = p.min_p}};
  TokenCut& cut = draw.cut;
  const bool limited = p.top_k > 0 && p.top_k < vocab;
  const bool nucleus = p.top_p < 1.0f;
  if (!limited && !nucleus && !(p.min_p > 0.0f)) return draw;
  // The arg-max of row / t is the row's: dividing by t > 0 keeps the order.
  if (top < 0) top = ClusterArgmax(vocab, s, c, [&](int i) { return row[i]; });
  cut.x0 = row[top] / t;
  if (!(cut.x0 > -INFINITY)) return {.token = 0};  // every logit NaN or -inf
  if (!limited && !nucleus) return draw;
  WeighBands(row, vocab, t, cut, nucleus, draw_first ? kHistGroups : 1, s, c);
  const unsigned long long kept = s.values[kBins - 1], total = s.values[2 * kBins - 1];
  const bool top_k_cuts = limited && static_cast<unsigned long long>(p.top_k) < kept;
  if (!top_k_cuts && !nucleus) return draw;
  const unsigned long long target = nucleus ? NucleusTarget(p.top_p, total) : 0;
  int band = -1;
  for (int j = 0; j < kBins && band < 0; ++j) {
    const bool holds = top_k_cuts ? s.values[j] >= static_cast<unsigned long long>(p.top_k)
                                  : s.values[kBins + j] >= target;
    if (s.values[j] <= kMaxCandidates && holds) band = j;
  }
  __syncthreads();  // s.values read
  if (band >= 0) {
    const int n = GatherRanked(row, vocab, t, cut, band, s, c);
    if (c.rank != 0) return draw;
    int last = top_k_cuts ? p.top_k - 1 : n - 1;
    if (nucleus) {
      const unsigned long long want =
          top_k_cuts ? NucleusTarget(p.top_p, RankedMass(last + 1, cut.x0, s)) : target;
      last = PositionReaching(last + 1, cut.x0, want, s);
    }
    return {.token = GumbelMaxRanked(last, p, s)};
  }
  if (!top_k_cuts && draw_first) {
    // A nucleus too wide to rank: draw over every kept token first. The draw is the nucleus's
    // own whenever the nucleus holds it (the Gumbel max of a set is that of any subset holding
    // it), that is when the tokens ranked before it weigh less than the target: about top_p of
    // the time, two passes instead of the radix passes and the draw after them.
    const int drawn = ClusterGumbelMax(row, vocab, t, cut, p, s, c);
    if (MassRankedBefore(row, vocab, t, cut, drawn, s, c) < target) return {.token = drawn};
  }
  if (top_k_cuts) {
    cut = PrefixReaching(row, vocab, t, cut, p.top_k, s, c, [](float) { return 1ull; });
  }
  if (nucleus) {
    const float x0 = cut.x0;
    unsigned long long want = target;
    if (top_k_cuts) {  // top_p of what top-k kept
      unsigned long long part = 0;
      for (int i = c.first(); i < vocab; i += kStride) {
        const float x = row[i] / t;
        if (Kept(x, i, cut)) part += FixedMass(expf(x - x0));
      }
      want = NucleusTarget(p.top_p, ClusterSum(part, s, c));
    }
    cut = PrefixReaching(row, vocab, t, cut, want, s, c,
                         [x0](float x) { return FixedMass(expf(x - x0)); });
  }
  return draw;
}

}  // namespace strata::gpu::row_cut

#endif  // STRATA_COMMON_CUDA_KERNELS_ROW_CUT_CUH_
