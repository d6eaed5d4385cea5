#include "common/model/safetensors.h"

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/safetensors_builder.h"

namespace strata {
namespace {

using ::strata::testing::SafetensorsBuilder;
using ::testing::HasSubstr;

absl::StatusOr<std::vector<SafetensorsEntry>> Parse(const std::string& file) {
  return ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()),
      "model.safetensors");
}

// The error's message, which must name the file.
std::string ErrorOf(const std::string& file) {
  auto result = Parse(file);
  EXPECT_FALSE(result.ok());
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("model.safetensors"));
  return std::string(result.status().message());
}

std::string Header(const std::string& json, const std::string& data = std::string(16, '\0')) {
  return SafetensorsBuilder::Assemble(json, data);
}

TEST(SafetensorsTest, ParsesWellFormedFile) {
  const std::string file = SafetensorsBuilder()
                               .AddBf16("a", {2, 3})
                               .AddBf16("b", {4})
                               .Add("empty", "F32", {0, 5}, {})
                               .Add("ids", "I64", {2}, std::vector<uint8_t>(16))
                               .Build();
  auto entries = Parse(file);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  const uint64_t data_begin = file.size() - 12 - 8 - 16;
  for (const auto& e : *entries) {
    if (e.name == "a") {
      EXPECT_EQ(e.dtype, "BF16");
      EXPECT_EQ(e.shape, (std::vector<int64_t>{2, 3}));
      EXPECT_EQ(e.begin, data_begin);
      EXPECT_EQ(e.end, data_begin + 12);
    }
    if (e.name == "b") {
      EXPECT_EQ(e.begin, data_begin + 12);
    }
  }
}

TEST(SafetensorsTest, TruncatedFile) {
  EXPECT_THAT(ErrorOf("abc"), HasSubstr("truncated"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("truncated"));
}

TEST(SafetensorsTest, HeaderLengthPastEnd) {
  std::string file = Header("{}");
  file[0] = static_cast<char>(200);
  EXPECT_THAT(ErrorOf(file), HasSubstr("runs past the end"));
  std::string huge(8, '\xff');
  EXPECT_THAT(ErrorOf(huge + "{}"), HasSubstr("exceeds the limit"));
}

TEST(SafetensorsTest, BadJson) {
  EXPECT_THAT(ErrorOf(Header("{\"a\": ")), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf(Header("[1, 2]")), HasSubstr("not a JSON object"));
  EXPECT_THAT(ErrorOf(Header("{\"__metadata__\": 3}")), HasSubstr("__metadata__"));
}

TEST(SafetensorsTest, BadEntries) {
  EXPECT_THAT(ErrorOf(Header(R"({"w": 3})")), HasSubstr("'w'"));
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"shape": [2], "data_offsets": [0, 4]}})")),
              HasSubstr("dtype"));
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 4]}})")),
              HasSubstr("unknown dtype Q9"));
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [-2], "data_offsets": [0, 4]}})")),
              HasSubstr("shape"));
  EXPECT_THAT(
      ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [2.5], "data_offsets": [0, 4]}})")),
      HasSubstr("shape"));
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0]}})")),
              HasSubstr("data_offsets"));
}

TEST(SafetensorsTest, OffsetsOutOfRange) {
  EXPECT_THAT(
      ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [16], "data_offsets": [0, 32]}})")),
      HasSubstr("past the end of the data"));
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 4]}})")),
              HasSubstr("begin after they end"));
}

TEST(SafetensorsTest, SizeDoesNotMatchShape) {
  EXPECT_THAT(ErrorOf(Header(R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}})")),
              HasSubstr("needs 6"));
  // A shape whose element count overflows 64 bits.
  EXPECT_THAT(
      ErrorOf(Header(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})")),
      HasSubstr("more data than the file holds"));
}

TEST(SafetensorsTest, OverlappingTensors) {
  const std::string json =
      R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}})";
  const std::string message = ErrorOf(Header(json));
  EXPECT_THAT(message, HasSubstr("overlaps"));
}

}  // namespace
}  // namespace strata
