#include "services/expert-store/fast_hash.h"

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(FastHashTest, DeterministicAndSeeded) {
  const auto data = RandomBytes(1000, 1);
  EXPECT_EQ(FastHash64(data.data(), data.size()), FastHash64(data.data(), data.size()));
  EXPECT_NE(FastHash64(data.data(), data.size(), 0), FastHash64(data.data(), data.size(), 1));
  EXPECT_NE(FastHash64(nullptr, 0), FastHash64(nullptr, 0, 1));
}

// Every single-byte change, in the 64-byte stripes and in the tail words and bytes alike,
// changes the hash (guaranteed by construction, not just likely).
TEST(FastHashTest, EveryByteFlipChangesTheHash) {
  for (size_t size : {1u, 7u, 8u, 63u, 64u, 200u, 1000u}) {
    auto data = RandomBytes(size, static_cast<uint32_t>(size));
    const uint64_t original = FastHash64(data.data(), data.size());
    for (size_t i = 0; i < size; ++i) {
      for (uint8_t flip : {0x01, 0x80, 0xFF}) {
        data[i] ^= flip;
        EXPECT_NE(FastHash64(data.data(), data.size()), original)
            << "size " << size << " byte " << i;
        data[i] ^= flip;
      }
    }
  }
}

TEST(FastHashTest, LengthMatters) {
  std::vector<uint8_t> zeros(129, 0);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= zeros.size(); ++n) seen.insert(FastHash64(zeros.data(), n));
  EXPECT_EQ(seen.size(), zeros.size() + 1);
}

TEST(FastHashTest, SwappedWordsChangeTheHash) {
  auto data = RandomBytes(256, 3);
  const uint64_t original = FastHash64(data.data(), data.size());
  std::swap_ranges(data.begin(), data.begin() + 8, data.begin() + 8);
  EXPECT_NE(FastHash64(data.data(), data.size()), original);
}

// The value does not depend on how many threads share the chunks; a byte changed in any
// chunk changes it.
TEST(FastHashTest, ChunkedChecksumIndependentOfThreads) {
  auto data = RandomBytes(2 * kChecksumChunkBytes + 12345, 4);
  const uint64_t one = ChunkedChecksum(data.data(), data.size(), 1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(ChunkedChecksum(data.data(), data.size(), threads), one);
  for (size_t at : {size_t{0}, kChecksumChunkBytes + 5, data.size() - 1}) {
    data[at] ^= 0x10;
    EXPECT_NE(ChunkedChecksum(data.data(), data.size(), 4), one) << at;
    data[at] ^= 0x10;
  }
  EXPECT_NE(ChunkedChecksum(data.data(), data.size() - 1, 2), one);
  EXPECT_EQ(ChunkedChecksum(nullptr, 0, 4), ChunkedChecksum(nullptr, 0, 1));
}

}  // namespace
}  // namespace strata
