// A fast, non-cryptographic 64-bit checksum for noticing when shared memory no longer holds
// what was written to it (a corrupted page, a store rebuilt under the same name).
#ifndef STRATA_SERVICES_EXPERT_STORE_FAST_HASH_H_
#define STRATA_SERVICES_EXPERT_STORE_FAST_HASH_H_

#include <cstddef>
#include <cstdint>

namespace strata {

// Eight independent multiply-rotate lanes over 8-byte words (one 64-byte stripe per round),
// so it runs at about memory speed on one core. Every step is a bijection of the lane state,
// so any change confined to one of the input's (aligned) 8-byte words, a single flipped byte
// included, always changes the result; the length is hashed too.
uint64_t FastHash64(const void* data, size_t bytes, uint64_t seed = 0);

// FastHash64 of every kChecksumChunkBytes chunk (seeded with its index), then of those
// hashes: the same value whatever `threads` (how many threads share the chunks).
inline constexpr size_t kChecksumChunkBytes = size_t{16} << 20;
uint64_t ChunkedChecksum(const void* data, size_t bytes, int threads);

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_STORE_FAST_HASH_H_
