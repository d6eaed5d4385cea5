// The runtime directory and the cluster token: used only when they are this user's own and out of
// other users' reach; dead clusters swept.
#include "common/cluster/runtime_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_token.h"
#include "common/shm/shared_segment.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/other_user.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// $STRATA_RUNTIME_DIR set for one test.
class RuntimeDirTest : public ::testing::Test {
 protected:
  void SetUp() override { Use(temp_.File("run")); }
  void TearDown() override { ::unsetenv("STRATA_RUNTIME_DIR"); }
  void Use(const std::string& path) { ::setenv("STRATA_RUNTIME_DIR", path.c_str(), 1); }

  testing::TempDir temp_;
};

TEST_F(RuntimeDirTest, MadePrivateAndReused) {
  auto base = UserRuntimeDir();
  ASSERT_TRUE(base.ok()) << base.status();
  struct stat st {};
  ASSERT_EQ(::stat(base->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Use(temp_.File("run") + "//");  // a trailing slash names the same directory
  auto again = UserRuntimeDir();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *base);
}

TEST_F(RuntimeDirTest, OthersMayEnterOrItIsALink) {
  ASSERT_EQ(::mkdir(temp_.File("open").c_str(), 0755), 0);
  Use(temp_.File("open"));
  EXPECT_THAT(std::string(UserRuntimeDir().status().message()), HasSubstr("mode 0755"));
  ASSERT_EQ(::mkdir(temp_.File("target").c_str(), 0700), 0);
  ASSERT_EQ(::symlink(temp_.File("target").c_str(), temp_.File("link").c_str()), 0);
  Use(temp_.File("link"));
  EXPECT_TRUE(absl::IsPermissionDenied(UserRuntimeDir().status()));
}

// A directory of ours inside another user's could be renamed away and replaced: refused, and not
// even made.
TEST_F(RuntimeDirTest, InsideAnotherUsersDirectoryIsRefused) {
  if (!testing::CanRunAsOtherUser()) GTEST_SKIP() << testing::kNoOtherUser;
  const std::string theirs = temp_.File("theirs");
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), testing::kOtherUid, testing::kOtherGid), 0);
  Use(theirs + "/run");
  const absl::Status refused = UserRuntimeDir().status();
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("another user could rename"));
  EXPECT_FALSE(fs::exists(theirs + "/run"));
}

TEST_F(RuntimeDirTest, ClustersAreMadeRemovedAndSweptWhenTheirOwnerIsGone) {
  auto dir = CreateClusterDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(absl::StartsWith(dir->id, absl::StrCat(::getpid(), "-")));
  ASSERT_TRUE(
      WriteClusterInfo(*dir, {.client = "127.0.0.1:5", .internal = dir->socket("router")}).ok());
  auto found = FindClusterByClient("localhost:5");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->second.internal, dir->socket("router"));
  EXPECT_TRUE(SweepDeadClusters().empty());  // ours runs
  // A cluster whose maker is gone: its directory and segments go.
  const std::string dead = "999999999-1-0123456789abcdef";
  const std::string dead_path = temp_.File("run") + "/" + dead;
  ASSERT_EQ(::mkdir(dead_path.c_str(), 0700), 0);
  auto segment = SharedSegment::Create("strata-" + dead + "-experts-meta", 4096);
  ASSERT_TRUE(segment.ok()) << segment.status();
  segment->set_remove_on_destroy(false);
  EXPECT_THAT(SweepDeadClusters(), ::testing::Contains(dead));
  EXPECT_FALSE(fs::exists(dead_path));
  EXPECT_TRUE(SharedSegment::ListOwned("strata-" + dead).empty());
  RemoveCluster(*dir);
  EXPECT_FALSE(fs::exists(dir->path));
}

TEST_F(RuntimeDirTest, TokenFilesArePrivateAndTokensChecked) {
  const std::string path = temp_.File("token");
  auto token = ClusterToken::Create(path);
  ASSERT_TRUE(token.ok()) << token.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(ClusterToken::Create(path).ok());  // never over an existing file
  EXPECT_TRUE(ClusterToken::FromFile(path).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(std::string(ClusterToken::FromFile(path).status().message()), HasSubstr("0644"));
  EXPECT_FALSE(ClusterToken::FromSecret("short").ok());
  EXPECT_FALSE(ClusterToken::FromSecret(std::string(40, ' ')).ok());
  EXPECT_TRUE(CheckInternalListener("x", "unix:/a", ClusterToken()).ok());
  EXPECT_FALSE(CheckInternalListener("x", "0.0.0.0:1", ClusterToken()).ok());
  EXPECT_TRUE(CheckInternalListener("x", "0.0.0.0:1", *token).ok());
}

}  // namespace
}  // namespace strata
