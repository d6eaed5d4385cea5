#include "services/expert-store/fast_hash.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace strata {
namespace {

constexpr uint64_t kLaneMul = 0x9E3779B97F4A7C15ull;  // odd, so multiplying is a bijection
constexpr uint64_t kMergeMul = 0xC2B2AE3D27D4EB4Full;
constexpr int kLanes = 8;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// MurmurHash3's finalizer: a bijection that spreads every input bit over the output.
inline uint64_t Avalanche(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// Bijective in `h` for a fixed `v` and in `v` for a fixed `h`.
inline uint64_t Merge(uint64_t h, uint64_t v) { return Rotl((h ^ Avalanche(v)) * kMergeMul, 31); }

}  // namespace

uint64_t FastHash64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[kLanes];
  for (int i = 0; i < kLanes; ++i) lane[i] = seed + kMergeMul * static_cast<uint64_t>(i + 1);
  const size_t stripes = bytes / (8 * kLanes);
  for (size_t s = 0; s < stripes; ++s, p += 8 * kLanes) {
    for (int i = 0; i < kLanes; ++i) lane[i] = Rotl((lane[i] ^ Load64(p + 8 * i)) * kLaneMul, 29);
  }
  uint64_t h = Avalanche(seed ^ (bytes * kLaneMul));
  for (int i = 0; i < kLanes; ++i) h = Merge(h, lane[i]);
  size_t rest = bytes % (8 * kLanes);
  for (; rest >= 8; rest -= 8, p += 8) h = Merge(h, Load64(p));
  if (rest > 0) {
    uint64_t last = 0;
    std::memcpy(&last, p, rest);
    h = Merge(h, last);
  }
  return Avalanche(h);
}

uint64_t ChunkedChecksum(const void* data, size_t bytes, int threads) {
  const auto* base = static_cast<const uint8_t*>(data);
  const size_t chunks =
      std::max<size_t>(1, (bytes + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
  std::vector<uint64_t> hashes(chunks);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c; (c = next.fetch_add(1)) < chunks;) {
      const size_t begin = c * kChecksumChunkBytes;
      const size_t len = std::min(kChecksumChunkBytes, bytes - std::min(bytes, begin));
      hashes[c] = FastHash64(base + begin, len, c);
    }
  };
  const size_t helpers = std::min<size_t>(std::max(threads, 1), chunks) - 1;
  std::vector<std::thread> pool;
  for (size_t i = 0; i < helpers; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return FastHash64(hashes.data(), hashes.size() * sizeof(uint64_t), bytes);
}

}  // namespace strata
