#include "common/shm/shared_segment.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/shm/shm_test_util.h"
#include "tests/testing/other_user.h"

namespace strata {
namespace {

using shm_test::ScopedShmName;

TEST(ShmSegmentTest, CreateIsZeroedPageAlignedAndSharedWithOpeners) {
  ScopedShmName name("seg");
  auto created = SharedSegment::Create(name.str(), 3 * 4096 + 100);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->is_creator());
  EXPECT_EQ(created->size(), 3u * 4096 + 100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(created->data()) % 4096, 0u);
  for (size_t i = 0; i < created->size(); ++i) ASSERT_EQ(created->data()[i], 0) << i;

  std::memcpy(created->data() + 5000, "strata", 6);
  auto opened = SharedSegment::Open(name.str());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(opened->is_creator());
  EXPECT_EQ(opened->size(), created->size());
  EXPECT_NE(opened->data(), created->data());  // a second mapping of the same pages
  EXPECT_EQ(std::memcmp(opened->data() + 5000, "strata", 6), 0);
  opened->data()[0] = 42;
  EXPECT_EQ(created->data()[0], 42);
}

TEST(ShmSegmentTest, ReadOnlyOpen) {
  ScopedShmName name("ro");
  auto created = SharedSegment::Create(name.str(), 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  created->data()[7] = 9;
  auto ro = SharedSegment::Open(name.str(), /*read_only=*/true);
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_TRUE(ro->read_only());
  EXPECT_EQ(std::as_const(*ro).data()[7], 9);
}

TEST(ShmSegmentTest, ErrorCodes) {
  ScopedShmName name("err");
  EXPECT_EQ(SharedSegment::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SharedSegment::Remove(name.str()).code(), absl::StatusCode::kNotFound);
  auto created = SharedSegment::Create(name.str(), 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(SharedSegment::Create(name.str(), 4096).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(SharedSegment::Create("x", 0).status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& bad : {std::string(), std::string("a/b"), std::string(300, 'n')}) {
    EXPECT_EQ(SharedSegment::Create(bad, 4096).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(SharedSegment::Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ShmSegmentTest, CreateLargerThanShmFailsWithoutLeakingTheName) {
  // Only where /dev/shm has a size limit: larger than the whole limit, the kernel refuses
  // the reservation at once (under it, it would fill /dev/shm page by page first).
  struct statvfs fs;
  if (::statvfs("/dev/shm", &fs) != 0 || fs.f_blocks == 0) GTEST_SKIP() << "no /dev/shm limit";
  const size_t too_big = 2 * static_cast<size_t>(fs.f_blocks) * fs.f_frsize;
  ScopedShmName name("huge");
  auto created = SharedSegment::Create(name.str(), too_big);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted) << created.status();
  EXPECT_EQ(SharedSegment::Open(name.str()).status().code(), absl::StatusCode::kNotFound)
      << created.status();
}

TEST(ShmSegmentTest, CreatorRemovesNameOnDestruction) {
  ScopedShmName name("raii");
  {
    auto created = SharedSegment::Create(name.str(), 4096);
    ASSERT_TRUE(created.ok()) << created.status();
    auto opened = SharedSegment::Open(name.str());
    ASSERT_TRUE(opened.ok());
    // An opener going away does not remove it.
    opened = SharedSegment::Open(name.str());
    ASSERT_TRUE(opened.ok());
  }
  EXPECT_EQ(SharedSegment::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmSegmentTest, CreatorCanKeepTheName) {
  ScopedShmName name("keep");
  {
    auto created = SharedSegment::Create(name.str(), 4096);
    ASSERT_TRUE(created.ok()) << created.status();
    created->data()[1] = 7;
    created->set_remove_on_destroy(false);
  }
  auto opened = SharedSegment::Open(name.str());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->data()[1], 7);
  EXPECT_TRUE(SharedSegment::Remove(name.str()).ok());
}

TEST(ShmSegmentTest, UnlinkKeepsMappingsValid) {
  ScopedShmName name("unlink");
  auto created = SharedSegment::Create(name.str(), 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = SharedSegment::Open(name.str());
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened->Unlink().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(created->Unlink().ok());
  EXPECT_TRUE(created->Unlink().ok());  // idempotent
  EXPECT_EQ(SharedSegment::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
  created->data()[100] = 3;
  EXPECT_EQ(opened->data()[100], 3);
}

TEST(ShmSegmentTest, MoveTransfersTheMapping) {
  ScopedShmName name("move");
  auto created = SharedSegment::Create(name.str(), 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  uint8_t* base = created->data();
  SharedSegment moved = std::move(*created);
  EXPECT_EQ(moved.data(), base);
  EXPECT_EQ(moved.size(), 4096u);
  EXPECT_EQ(created->data(), nullptr);
  EXPECT_TRUE(SharedSegment::Open(name.str()).ok());  // the moved-from one did not remove it
  ScopedShmName name2("move2");
  auto second = SharedSegment::Create(name2.str(), 4096);
  ASSERT_TRUE(second.ok()) << second.status();
  SharedSegment other = std::move(*second);
  other = std::move(moved);  // drops, and so removes, name2
  EXPECT_EQ(other.data(), base);
  EXPECT_EQ(SharedSegment::Open(name2.str()).status().code(), absl::StatusCode::kNotFound);
}

// Only this user's own segments, that nobody else may read or write, are used: one of ours
// made readable by others is refused, as is any of another user's, even one open to all.
// Checked on the opened descriptor; nothing is removed that is not ours.
TEST(ShmSegmentTest, SegmentsNotPrivateToThisUserAreRefused) {
  ScopedShmName open_to_all("wide");
  {
    auto created = SharedSegment::Create(open_to_all.str(), 4096);
    ASSERT_TRUE(created.ok()) << created.status();
    created->set_remove_on_destroy(false);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm/" + open_to_all.str()).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);  // whatever the umask
  }
  ASSERT_EQ(::chmod(("/dev/shm/" + open_to_all.str()).c_str(), 0644), 0);
  const auto refused = SharedSegment::Open(open_to_all.str(), /*read_only=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("mode 0644"));
  ASSERT_EQ(::chmod(("/dev/shm/" + open_to_all.str()).c_str(), 0600), 0);
  EXPECT_TRUE(SharedSegment::Open(open_to_all.str()).ok());
  EXPECT_EQ(SharedSegment::ListOwned(open_to_all.str()).size(), 1u);

  // A FIFO under the name neither blocks the open (as a plain open for reading would, until a
  // writer came) nor is used.
  ScopedShmName fifo("fifo");
  ASSERT_EQ(::mkfifo(("/dev/shm/" + fifo.str()).c_str(), 0600), 0);
  for (bool read_only : {true, false}) {
    EXPECT_EQ(SharedSegment::Open(fifo.str(), read_only).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(SharedSegment::Remove(fifo.str()).code(), absl::StatusCode::kPermissionDenied);
  ::unlink(("/dev/shm/" + fifo.str()).c_str());

  if (!testing::CanRunAsOtherUser()) GTEST_SKIP() << testing::kNoOtherUser;
  ScopedShmName planted("planted");
  ASSERT_EQ(testing::RunAsOtherUser([&] {
              auto created = SharedSegment::Create(planted.str(), 4096);
              if (!created.ok()) return 2;
              created->set_remove_on_destroy(false);
              return ::chmod(("/dev/shm/" + planted.str()).c_str(), 0666) == 0 ? 0 : 3;
            }),
            0);
  for (bool read_only : {true, false}) {
    EXPECT_EQ(SharedSegment::Open(planted.str(), read_only).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(SharedSegment::Remove(planted.str()).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(SharedSegment::ListOwned(planted.str()).empty());
  EXPECT_EQ(SharedSegment::Create(planted.str(), 4096).status().code(),
            absl::StatusCode::kAlreadyExists);
  ::unlink(("/dev/shm/" + planted.str()).c_str());  // as root, this test's own clean-up
}

}  // namespace
}  // namespace strata
