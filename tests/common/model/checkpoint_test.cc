#include "common/model/checkpoint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/safetensors_builder.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::strata::testing::SafetensorsBuilder;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

std::string MessageOf(const absl::Status& status) { return std::string(status.message()); }

TEST(CheckpointTest, SingleFile) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(
      dir.File("model.safetensors"),
      SafetensorsBuilder().AddBf16("w", {2, 3}, 1.0f, 1.0f).AddBf16("b", {3}).Build());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->num_tensors(), 2u);
  EXPECT_EQ((*checkpoint)->total_bytes(), 18u);
  auto w = (*checkpoint)->Get("w", {2, 3});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, DType::kBF16);
  EXPECT_EQ(LoadAsFloat(w->data, w->dtype, 0), 1.0f);
  EXPECT_EQ(LoadAsFloat(w->data, w->dtype, 5), 6.0f);
}

TEST(CheckpointTest, WrongShapeNamesFileAndTensor) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors"),
                                SafetensorsBuilder().AddBf16("w", {2, 3}).Build());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok());
  auto w = (*checkpoint)->Get("w", {3, 2});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(MessageOf(w.status()),
              HasSubstr("model.safetensors: tensor 'w': expected shape [3, 2], found [2, 3]"));
  auto missing = (*checkpoint)->Get("nope", {1});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(MessageOf(missing.status()), HasSubstr("missing tensor 'nope'"));
}

TEST(CheckpointTest, UnsupportedDtypeIsRejectedWhenUsed) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(
      dir.File("model.safetensors"),
      SafetensorsBuilder().Add("blocks", "U8", {4}, {1, 2, 3, 4}).AddBf16("w", {2}).Build());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto blocks = (*checkpoint)->Get("blocks", {4});
  ASSERT_FALSE(blocks.ok());
  EXPECT_THAT(MessageOf(blocks.status()), HasSubstr("tensor 'blocks': unsupported dtype \"U8\""));
}

TEST(CheckpointTest, Shards) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(dir.File("model-00001-of-00002.safetensors"),
                                SafetensorsBuilder().AddBf16("a", {2}).Build());
  SafetensorsBuilder::WriteFile(dir.File("model-00002-of-00002.safetensors"),
                                SafetensorsBuilder().AddBf16("b", {3}, 7.0f).Build());
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 10},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "b": "model-00002-of-00002.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto b = (*checkpoint)->Get("b", {3});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(LoadAsFloat(b->data, b->dtype, 0), 7.0f);
}

TEST(CheckpointTest, ShardErrors) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(dir.File("s1.safetensors"),
                                SafetensorsBuilder().AddBf16("a", {2}).Build());
  // The index claims a tensor that its shard does not hold.
  SafetensorsBuilder::WriteFile(
      dir.File("model.safetensors.index.json"),
      R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("'b' is listed in shard s1.safetensors"));

  SafetensorsBuilder::WriteFile(dir.File("model.safetensors.index.json"),
                                R"({"weight_map": {"a": "../s1.safetensors"}})");
  checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("invalid shard name"));

  SafetensorsBuilder::WriteFile(dir.File("model.safetensors.index.json"),
                                R"({"weight_map": {"a": "gone.safetensors"}})");
  checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("gone.safetensors: cannot open"));

  SafetensorsBuilder::WriteFile(dir.File("model.safetensors.index.json"), "{\"weight_map\": 3}");
  checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("weight_map"));
}

TEST(CheckpointTest, DuplicateTensorAcrossShards) {
  TempDir dir;
  SafetensorsBuilder::WriteFile(dir.File("s1.safetensors"),
                                SafetensorsBuilder().AddBf16("a", {2}).Build());
  SafetensorsBuilder::WriteFile(dir.File("s2.safetensors"),
                                SafetensorsBuilder().AddBf16("a", {2}).AddBf16("b", {2}).Build());
  SafetensorsBuilder::WriteFile(
      dir.File("model.safetensors.index.json"),
      R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("also appears in s1.safetensors"));
}

TEST(CheckpointTest, TruncatedFileNamesTheFile) {
  TempDir dir;
  std::string file = SafetensorsBuilder().AddBf16("w", {64}).Build();
  file.resize(file.size() - 10);
  SafetensorsBuilder::WriteFile(dir.File("model.safetensors"), file);
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(MessageOf(checkpoint.status()),
              HasSubstr("model.safetensors: tensor 'w': data_offsets [0, 128) run past the end"));
}

TEST(CheckpointTest, EmptyDirectory) {
  TempDir dir;
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(MessageOf(checkpoint.status()), HasSubstr("no model.safetensors"));
}

}  // namespace
}  // namespace strata
