// Tests of what another local user can do to a cluster: code run in a forked child as the
// unprivileged user "nobody" (uid 65534). Needs root to switch users; tests skip without it.
#ifndef STRATA_TESTS_TESTING_OTHER_USER_H_
#define STRATA_TESTS_TESTING_OTHER_USER_H_

#include <dirent.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace strata::testing {

inline constexpr uid_t kOtherUid = 65534;
inline constexpr gid_t kOtherGid = 65534;
inline constexpr char kNoOtherUser[] = "switching to another user needs root";

inline bool CanRunAsOtherUser() { return ::geteuid() == 0; }

// Runs `body` in a child process as uid/gid 65534 and returns its exit status (what `body`
// returns; 126 if the switch failed, 127 if the child died of a signal).
inline int RunAsOtherUser(const std::function<int()>& body) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kOtherGid, kOtherGid, kOtherGid) != 0 ||
        ::setresuid(kOtherUid, kOtherUid, kOtherUid) != 0) {
      ::_exit(126);
    }
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 127;
}

// Lets the other user read everything under `path` (a test's own temporary directory).
inline bool MakeReadableByAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::permissions(
      path,
      std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
          std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
          std::filesystem::perms::others_exec,
      ec);
  if (ec) return false;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path, ec)) {
    const bool dir = entry.is_directory();
    ::chmod(entry.path().c_str(), dir ? 0755 : 0644);
  }
  return !ec;
}

// The /dev/shm names starting with `prefix` that belong to another user.
inline std::vector<std::string> SegmentsOfOtherUser(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    struct stat st {};
    if (name.rfind(prefix, 0) == 0 && ::fstatat(::dirfd(dir), entry->d_name, &st, 0) == 0 &&
        st.st_uid != ::geteuid()) {
      names.push_back(name);
    }
  }
  ::closedir(dir);
  return names;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_OTHER_USER_H_
