// Sizes as configuration spells them.
#include "common/util/byte_size.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ByteSizeTest, UnitsAreBinaryAndCaseInsensitive) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("12B"), 12u);
  EXPECT_EQ(*ParseByteSize("1k"), 1024u);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("512 mb"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize(" 24GiB "), 24ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("2TB"), 2ull << 40);
  EXPECT_EQ(*ParseByteSize("0"), 0u);
}

TEST(ByteSizeTest, RejectsWithTheText) {
  for (const char* bad : {"", "GiB", "-1G", "12 parsecs", "1.2.3M", "1e3", "99999999999T"}) {
    const auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("\"") + bad), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace strata
