// Re-attaching to the store a killed strata-expert-store left behind: adopted when intact, rebuilt
// (with a new generation) when anything about it does not match.
#include "services/expert-store/expert_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "boost/interprocess/mapped_region.hpp"
#include "boost/interprocess/shared_memory_object.hpp"
#include "common/shm/shared_segment.h"
#include "common/transport/mapped_experts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/expert-store/store_meta.h"
#include "tests/testing/other_user.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace bip = boost::interprocess;
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// A copy of an oracle model, so that the test can change its files.
std::string CopyOracle(const std::string& name, const std::string& dir) {
  const fs::path from = fs::path(STRATA_TEST_DATA_DIR) / "oracles" / name;
  const fs::path to = fs::path(dir) / name;
  fs::create_directories(to);
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"}) {
    if (fs::exists(from / file)) fs::copy_file(from / file, to / file);
  }
  return to.string();
}

class ExpertStoreTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& name : SharedSegment::ListOwned(prefix_ + "-")) {
      bip::shared_memory_object::remove(name.c_str());
    }
  }

  ExpertStoreOptions Options() {
    ExpertStoreOptions options;
    options.segment_prefix = prefix_;
    options.bind_numa = false;
    options.log = [this](const std::string& m) { log_.push_back(m); };
    return options;
  }

  std::string Log() const {
    std::string all;
    for (const auto& m : log_) absl::StrAppend(&all, m, "\n");
    return all;
  }

  // Builds the store in a child process that then dies without removing it, as a SIGKILLed
  // strata-expert-store does; returns the layout it built.
  v1::ExpertLayout BuildAndDie(const std::string& model_dir) {
    const std::string layout_file = temp_.File("layout.pb");
    const pid_t child = ::fork();
    if (child == 0) {
      auto model = LoadModel(model_dir);
      if (!model.ok()) ::_exit(2);
      auto store = ExpertStore::Build(**model, Options());
      if (!store.ok()) ::_exit(3);
      std::ofstream(layout_file, std::ios::binary) << (*store)->layout().SerializeAsString();
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    std::ifstream in(layout_file, std::ios::binary);
    v1::ExpertLayout layout;
    EXPECT_TRUE(layout.ParseFromIstream(&in));
    return layout;
  }

  static bool SegmentExists(const std::string& name) {
    try {
      bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_only);
      return true;
    } catch (const bip::interprocess_exception&) {
      return false;
    }
  }

  // Flips one byte of a shared-memory segment.
  static void FlipByte(const std::string& name, uint64_t offset) {
    bip::shared_memory_object object(bip::open_only, name.c_str(), bip::read_write);
    bip::mapped_region region(object, bip::read_write);
    static_cast<uint8_t*>(region.get_address())[offset] ^= 0x40;
  }

  static uint8_t ByteAt(const std::string& name, uint64_t offset) {
    bip::shared_memory_object object(bip::open_only, name.c_str(), bip::read_only);
    bip::mapped_region region(object, bip::read_only);
    return static_cast<const uint8_t*>(region.get_address())[offset];
  }

  testing::TempDir temp_;
  std::string prefix_ = absl::StrCat("strata-test-", ::getpid());
  std::vector<std::string> log_;
};

TEST_F(ExpertStoreTest, ReattachesWithoutCopying) {
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  const v1::ExpertLayout built = BuildAndDie(dir);
  ASSERT_GT(built.tensors_size(), 0);
  ASSERT_TRUE(SegmentExists(prefix_ + "-experts-meta"));

  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->reattached());
  EXPECT_EQ((*store)->bytes_copied(), 0u);
  EXPECT_EQ((*store)->layout().generation(), built.generation());
  EXPECT_EQ((*store)->layout().SerializeAsString(), built.SerializeAsString());
  EXPECT_THAT(Log(), HasSubstr(absl::StrFormat("re-attached to 1 segment(s), generation %016x",
                                               built.generation())));
  EXPECT_THAT(Log(), Not(HasSubstr("not re-attaching")));

  // A second strata-expert-store must not adopt a store its owner is still serving.
  auto second = ExpertStore::Attach(**model, Options());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(ExpertStore::Build(**model, Options()).status()));

  // An ordered stop removes the store.
  store->reset();
  EXPECT_FALSE(SegmentExists(built.segments(0).name()));
  EXPECT_FALSE(SegmentExists(prefix_ + "-experts-meta"));
  EXPECT_THAT(SharedSegment::ListOwned(prefix_), ::testing::IsEmpty());
}

TEST_F(ExpertStoreTest, CorruptedByteRebuilds) {
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  const v1::ExpertLayout built = BuildAndDie(dir);
  const std::string segment = built.segments(0).name();
  const uint64_t offset = built.tensors(built.tensors_size() / 2).offset() + 3;
  const uint8_t original = ByteAt(segment, offset);
  FlipByte(segment, offset);

  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok());
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_GT((*store)->bytes_copied(), 0u);
  EXPECT_NE((*store)->layout().generation(), built.generation());
  EXPECT_THAT(Log(), HasSubstr("does not match its checksum"));
  // A new generation, new names: the damaged segment is gone, the new one holds the byte.
  EXPECT_FALSE(SegmentExists(segment));
  EXPECT_EQ(ByteAt((*store)->layout().segments(0).name(), offset), original);
}

TEST_F(ExpertStoreTest, DifferentModelRebuilds) {
  const std::string qwen = CopyOracle("qwen3_moe", temp_.path());
  const std::string mixtral = CopyOracle("mixtral", temp_.path());
  const v1::ExpertLayout built = BuildAndDie(qwen);
  auto model = LoadModel(mixtral);
  ASSERT_TRUE(model.ok());
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_NE((*store)->layout().generation(), built.generation());
  EXPECT_EQ((*store)->layout().model_dir(), mixtral);
  EXPECT_THAT(Log(), HasSubstr("it holds the model in " + fs::canonical(qwen).string()));
}

TEST_F(ExpertStoreTest, ChangedModelFilesRebuild) {
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok());

  BuildAndDie(dir);
  std::ofstream(dir + "/config.json", std::ios::app) << "\n";
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_THAT(Log(), HasSubstr("config.json changed"));
  store->reset();

  BuildAndDie(dir);
  fs::last_write_time(dir + "/model.safetensors",
                      fs::last_write_time(dir + "/model.safetensors") + std::chrono::seconds(5));
  store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_THAT(Log(), HasSubstr("the checkpoint files changed"));
}

// A store killed before its meta was complete, or missing a data segment, is not adopted.
TEST_F(ExpertStoreTest, IncompleteStoreRebuilds) {
  const std::string dir = CopyOracle("mixtral", temp_.path());
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok());

  const v1::ExpertLayout first = BuildAndDie(dir);
  FlipByte(prefix_ + "-experts-meta", 0);  // the magic
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_NE((*store)->layout().generation(), first.generation());
  EXPECT_THAT(Log(), HasSubstr("incomplete"));
  store->reset();

  const v1::ExpertLayout second = BuildAndDie(dir);
  bip::shared_memory_object::remove(second.segments(0).name().c_str());
  store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_THAT(Log(), HasSubstr("cannot map it"));
  EXPECT_TRUE(SegmentExists((*store)->layout().segments(0).name()));
}

// A meta rewritten to list another segment of this user (here a "victim" outside the store's
// names) is never followed: the store does not open it, and does not remove it when it
// replaces the store.
TEST_F(ExpertStoreTest, NamesInTheMetaAreNeverFollowed) {
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  const v1::ExpertLayout built = BuildAndDie(dir);
  const std::string victim = prefix_ + "-victim";
  auto victim_segment = SharedSegment::Create(victim, 4096);
  ASSERT_TRUE(victim_segment.ok()) << victim_segment.status();
  victim_segment->set_remove_on_destroy(false);
  {
    auto meta_segment = SharedSegment::Open(prefix_ + "-experts-meta", /*read_only=*/true);
    ASSERT_TRUE(meta_segment.ok()) << meta_segment.status();
    auto meta = DecodeMeta(meta_segment->data(), meta_segment->size());
    ASSERT_TRUE(meta.ok()) << meta.status();
    meta->layout.mutable_segments(0)->set_name(victim);
    meta->owner_pid = 0;
    const std::string encoded = EncodeMeta(*meta);
    ASSERT_TRUE(SharedSegment::Remove(prefix_ + "-experts-meta").ok());
    auto rewritten = SharedSegment::Create(prefix_ + "-experts-meta", encoded.size());
    ASSERT_TRUE(rewritten.ok()) << rewritten.status();
    rewritten->set_remove_on_destroy(false);
    CommitMeta(encoded, rewritten->data());
  }
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok());
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_THAT(Log(), HasSubstr("is not this model's"));
  EXPECT_TRUE(SegmentExists(victim));
  EXPECT_FALSE(SegmentExists(built.segments(0).name()));  // the store's own old segment went
  store->reset();
  EXPECT_TRUE(SegmentExists(victim));
  EXPECT_TRUE(SharedSegment::Remove(victim).ok());
}

// Another local user who creates the store's names first (a complete, consistent store of the
// same model, as an attacker would) is refused: its segments are never served or removed.
TEST_F(ExpertStoreTest, AStorePlantedByAnotherUserIsRefused) {
  if (!testing::CanRunAsOtherUser()) GTEST_SKIP() << testing::kNoOtherUser;
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  ASSERT_TRUE(testing::MakeReadableByAll(temp_.path()));
  const int planted = testing::RunAsOtherUser([&] {
    auto model = LoadModel(dir);
    if (!model.ok()) return 2;
    auto store = ExpertStore::Build(**model, Options());
    if (!store.ok()) return 3;
    // Even a store made readable and writable by all is not taken.
    for (const v1::SharedSegmentInfo& s : (*store)->layout().segments()) {
      ::chmod(("/dev/shm/" + s.name()).c_str(), 0666);
    }
    ::chmod(("/dev/shm/" + prefix_ + "-experts-meta").c_str(), 0666);
    ::_exit(0);  // dies without removing it
  });
  ASSERT_EQ(planted, 0);
  ASSERT_TRUE(SegmentExists(prefix_ + "-experts-meta"));
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok());
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not to this user"));
  // A worker handed such a segment's name refuses to map it too.
  const std::vector<std::string> foreign = testing::SegmentsOfOtherUser(prefix_);
  ASSERT_FALSE(foreign.empty());
  for (const std::string& name : foreign) {
    EXPECT_TRUE(absl::IsPermissionDenied(SharedSegment::Open(name, true).status())) << name;
    EXPECT_TRUE(absl::IsPermissionDenied(SharedSegment::Remove(name))) << name;
  }
  for (const std::string& name : foreign) bip::shared_memory_object::remove(name.c_str());
}

TEST_F(ExpertStoreTest, NothingToReattachBuildsQuietly) {
  auto model = LoadModel(CopyOracle("qwen3_moe", temp_.path()));
  ASSERT_TRUE(model.ok());
  auto store = ExpertStore::Attach(**model, Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->reattached());
  EXPECT_GT((*store)->bytes_copied(), 0u);
  EXPECT_THAT(Log(), Not(HasSubstr("not re-attaching")));
  EXPECT_THAT(Log(), HasSubstr("built 1 segment(s)"));
}

// --expert-store in-place: the layout points into the checkpoint's own file, nothing is copied
// and no shared memory is made; the workers' mapping reads the model's very bytes; the same
// checkpoint keeps its generation across a restart.
TEST_F(ExpertStoreTest, InPlaceMapsTheCheckpointFile) {
  const std::string dir = CopyOracle("qwen3_moe", temp_.path());
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpertStoreOptions options = Options();
  options.in_place = true;
  auto store = ExpertStore::Attach(**model, options);
  ASSERT_TRUE(store.ok()) << store.status();
  const v1::ExpertLayout& layout = (*store)->layout();
  ASSERT_EQ(layout.segments_size(), 1);
  EXPECT_EQ(layout.segments(0).file_path(), (fs::path(dir) / "model.safetensors").string());
  EXPECT_EQ(layout.segments(0).bytes(), fs::file_size(fs::path(dir) / "model.safetensors"));
  EXPECT_EQ((*store)->bytes_copied(), 0u);
  EXPECT_THAT(Log(), HasSubstr("in place"));
  EXPECT_THROW(
      bip::shared_memory_object(bip::open_only, (prefix_ + "-experts-0").c_str(), bip::read_only),
      bip::interprocess_exception);

  auto mapped = MappedExperts::Map(layout, (*model)->config);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const ModelConfig& c = (*model)->config;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int e = 0; e < c.num_experts; ++e) {
      const FfnWeights& want = (*model)->weights.layers[layer].experts[e];
      const FfnWeights* got = (*mapped)->Find(layer, e);
      ASSERT_NE(got, nullptr);
      for (const auto& [a, b] :
           {std::pair{&want.gate, &got->gate}, {&want.up, &got->up}, {&want.down, &got->down}}) {
        ASSERT_EQ(std::memcmp(a->data, b->data, a->out * a->in * DTypeSize(a->dtype)), 0)
            << layer << " " << e;
      }
    }
  }
  const uint64_t generation = layout.generation();
  store->reset();
  auto again = ExpertStore::Attach(**model, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->layout().generation(), generation);

  // A checkpoint file touched after the layout was made is refused, not mapped stale.
  const fs::path file = fs::path(dir) / "model.safetensors";
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(1));
  auto stale = MappedExperts::Map(layout, (*model)->config);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("changed"));

  // gpt-oss interleaves gate and up in one tensor: nothing contiguous to map.
  auto gpt_oss = LoadModel(CopyOracle("gpt_oss", temp_.path()));
  ASSERT_TRUE(gpt_oss.ok()) << gpt_oss.status();
  auto refused = ExpertStore::Build(**gpt_oss, options);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("contiguous"));
}

}  // namespace
}  // namespace strata
