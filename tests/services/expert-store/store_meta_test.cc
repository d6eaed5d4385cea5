#include "services/expert-store/store_meta.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

StoreMeta SampleMeta() {
  StoreMeta meta;
  meta.generation = 0x1234567890abcdefull;
  meta.model = {"/models/m", 11, 22};
  meta.segment_checksums = {33, 44};
  meta.layout.set_generation(meta.generation);
  meta.layout.set_model_dir("/models/m");
  for (int i = 0; i < 2; ++i) {
    auto* s = meta.layout.add_segments();
    s->set_name("p-experts-" + std::to_string(i));
    s->set_bytes(4096);
    s->set_numa_node(i);
  }
  auto* t = meta.layout.add_tensors();
  t->set_tensor("gate");
  t->add_shape(4);
  meta.owner_pid = 77;
  meta.owner_start_time = 88;
  return meta;
}

TEST(StoreMetaTest, RoundTrip) {
  const std::string bytes = EncodeMeta(SampleMeta());
  std::string shm(bytes.size() + 100, '\0');  // a segment may be longer than its meta
  CommitMeta(bytes, shm.data());
  auto meta = DecodeMeta(shm.data(), shm.size());
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->generation, 0x1234567890abcdefull);
  EXPECT_EQ(meta->model.dir, "/models/m");
  EXPECT_EQ(meta->model.config_checksum, 11u);
  EXPECT_EQ(meta->model.checkpoint_fingerprint, 22u);
  EXPECT_EQ(meta->segment_checksums, (std::vector<uint64_t>{33, 44}));
  EXPECT_EQ(meta->layout.SerializeAsString(), SampleMeta().layout.SerializeAsString());
  EXPECT_EQ(meta->owner_pid, 77);
  EXPECT_EQ(meta->owner_start_time, 88u);

  SetMetaOwner(shm.data(), 99, 100);
  meta = DecodeMeta(shm.data(), shm.size());
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->owner_pid, 99);
  EXPECT_EQ(meta->owner_start_time, 100u);
}

TEST(StoreMetaTest, DamageIsDataLoss) {
  const std::string bytes = EncodeMeta(SampleMeta());
  EXPECT_TRUE(absl::IsDataLoss(DecodeMeta(bytes.data(), 10).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeMeta(bytes.data(), bytes.size() - 1).status()));
  std::string no_magic = bytes;
  no_magic[0] = 0;  // killed before the magic was written
  EXPECT_TRUE(absl::IsDataLoss(DecodeMeta(no_magic.data(), no_magic.size()).status()));
  std::string version = bytes;
  version[8] ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(DecodeMeta(version.data(), version.size()).status()));
  std::string layout = bytes;
  layout[layout.size() - 3] ^= 1;
  const auto status = DecodeMeta(layout.data(), layout.size()).status();
  EXPECT_TRUE(absl::IsDataLoss(status));
  EXPECT_NE(status.message().find("checksum"), std::string::npos) << status;
}

TEST(StoreMetaTest, ModelIdentity) {
  testing::TempDir dir;
  std::ofstream(dir.File("config.json")) << "{\"a\": 1}";
  std::ofstream(dir.File("model.safetensors")) << "0123456789";
  auto a = IdentifyModel(dir.path());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dir, std::filesystem::canonical(dir.path()).string());
  auto same = IdentifyModel(dir.path() + "/.");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->dir, a->dir);
  EXPECT_EQ(same->config_checksum, a->config_checksum);
  EXPECT_EQ(same->checkpoint_fingerprint, a->checkpoint_fingerprint);

  std::ofstream(dir.File("config.json")) << "{\"a\": 2}";
  auto config = IdentifyModel(dir.path());
  ASSERT_TRUE(config.ok());
  EXPECT_NE(config->config_checksum, a->config_checksum);
  EXPECT_EQ(config->checkpoint_fingerprint, a->checkpoint_fingerprint);

  std::ofstream(dir.File("model.safetensors"), std::ios::app) << "more";
  auto weights = IdentifyModel(dir.path());
  ASSERT_TRUE(weights.ok());
  EXPECT_NE(weights->checkpoint_fingerprint, a->checkpoint_fingerprint);

  EXPECT_FALSE(IdentifyModel(dir.File("missing")).ok());
}

}  // namespace
}  // namespace strata
