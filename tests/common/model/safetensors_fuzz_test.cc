// Randomized robustness test of the safetensors parser: mutated and random files must be
// parsed or rejected with INVALID_ARGUMENT, never crash, and every accepted entry must lie
// inside the file. Bounded in iterations so it runs in CI on every build.
#include <random>
#include <string>

#include "common/model/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/safetensors_builder.h"

namespace strata {
namespace {

using ::strata::testing::SafetensorsBuilder;

void CheckParse(const std::string& file) {
  auto result = ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()),
      "fuzz.safetensors");
  if (!result.ok()) {
    ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    return;
  }
  for (const auto& e : *result) {
    ASSERT_LE(e.begin, e.end);
    ASSERT_LE(e.end, file.size());
  }
}

std::string Seed() {
  return SafetensorsBuilder()
      .AddBf16("model.layers.0.mlp.gate.weight", {4, 8})
      .AddBf16("model.norm.weight", {8})
      .Add("x", "F32", {2, 2}, std::vector<uint8_t>(16, 1))
      .Build();
}

TEST(SafetensorsFuzzTest, ByteMutations) {
  std::mt19937_64 rng(1234);
  const std::string seed = Seed();
  for (int iter = 0; iter < 20000; ++iter) {
    std::string file = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % file.size();
      switch (rng() % 4) {
        case 0:  // flip a byte
          file[pos] = static_cast<char>(rng());
          break;
        case 1:  // set a digit, the likeliest way to produce a different valid number
          file[pos] = static_cast<char>('0' + rng() % 10);
          break;
        case 2:  // truncate
          file.resize(pos);
          break;
        case 3:  // insert a JSON-significant character
          file.insert(pos, 1, "{}[],:\"-0e9"[rng() % 11]);
          break;
      }
      if (file.empty()) break;
    }
    CheckParse(file);
  }
}

TEST(SafetensorsFuzzTest, RandomHeaders) {
  std::mt19937_64 rng(99);
  const char* pieces[] = {"{",
                          "}",
                          "[",
                          "]",
                          ",",
                          ":",
                          "\"dtype\"",
                          "\"BF16\"",
                          "\"F32\"",
                          "\"shape\"",
                          "\"data_offsets\"",
                          "0",
                          "8",
                          "18446744073709551615",
                          "-1",
                          "1e308",
                          "\"w\"",
                          "null",
                          "true",
                          "\"__metadata__\""};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string header;
    const int count = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < count; ++i) header += pieces[rng() % std::size(pieces)];
    CheckParse(SafetensorsBuilder::Assemble(header, std::string(rng() % 64, '\0')));
  }
}

}  // namespace
}  // namespace strata
