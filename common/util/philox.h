// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), a counter-based
// generator: a draw is a pure function of (seed, step, index), so the host's Sampler and the
// device's sampling kernel draw the same uniforms for a request's token `step` whichever of
// them picks it, and no generator state travels between them.
#ifndef STRATA_COMMON_UTIL_PHILOX_H_
#define STRATA_COMMON_UTIL_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STRATA_HOST_DEVICE inline
#endif

namespace strata {

// The streams a request's draws come from, apart for each use (the counter's third word).
enum PhiloxStream : uint32_t {
  kPhiloxSample = 0,       // the token drawn at a step (index 0), or Gumbel noise (index = token)
  kPhiloxDraftAccept = 1,  // speculative decoding: whether a drafted token stands
  kPhiloxDraftRedraw = 2,  // and the token drawn in its place when it does not
};

struct Philox4 {
  uint32_t v[4];
};

// Four 32-bit outputs for counter (c0, c1, c2, c3) under the 64-bit key.
STRATA_HOST_DEVICE Philox4 Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                      uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = static_cast<uint32_t>(p1);
    c2 = n2;
    c3 = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// 32 random bits to a float in (0, 1): 24 bits and half a step, so neither 0 nor 1 comes out
// (a Gumbel draw takes log(-log(u))).
STRATA_HOST_DEVICE float UniformFromBits(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// Draws index / 4 of the (seed, step, stream) sequence: the four uniforms of indexes
// 4 (index / 4) .. + 3, so that a loop over a vocabulary runs the rounds once per four tokens.
STRATA_HOST_DEVICE Philox4 PhiloxBlock(uint64_t seed, uint64_t step, uint32_t stream,
                                       uint32_t index) {
  return Philox4x32(index / 4, static_cast<uint32_t>(step),
                    static_cast<uint32_t>(step >> 32) ^ (stream << 24), 0x5354u, seed);
}

// The uniform in (0, 1) for draw `index` of token `step` of a request seeded `seed`.
STRATA_HOST_DEVICE float PhiloxUniform(uint64_t seed, uint64_t step, uint32_t stream,
                                       uint32_t index) {
  return UniformFromBits(PhiloxBlock(seed, step, stream, index).v[index % 4]);
}

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_PHILOX_H_
