// Whole files read into strings, bytes as they are (zeros and line ends included).
#include "common/util/read_file.h"

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

TEST(ReadFileTest, ReturnsEveryByte) {
  testing::TempDir dir;
  const std::string path = dir.File("bytes.bin");
  const std::string bytes("a\r\nb\0c", 6);
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(*ReadFileToString(path), bytes);
  std::ofstream(dir.File("empty"), std::ios::binary).close();
  EXPECT_EQ(*ReadFileToString(dir.File("empty")), "");
}

TEST(ReadFileTest, AMissingFileIsNotFoundAndNamed) {
  testing::TempDir dir;
  const absl::StatusOr<std::string> missing = ReadFileToString(dir.File("gone.json"));
  ASSERT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_EQ(missing.status().message(), dir.File("gone.json") + ": cannot open");
  EXPECT_TRUE(absl::IsInvalidArgument(ReadFileToString(dir.path()).status()));
}

}  // namespace
}  // namespace strata
