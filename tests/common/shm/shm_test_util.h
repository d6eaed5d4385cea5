// Helpers shared by the shared-memory tests: unique segment names and forked children.
#ifndef STRATA_TESTS_COMMON_SHM_SHM_TEST_UTIL_H_
#define STRATA_TESTS_COMMON_SHM_SHM_TEST_UTIL_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/shm/shared_segment.h"

namespace strata::shm_test {

// Unique per process and call, so parallel ctest runs never collide; removed (if still
// there) when it goes out of scope, so a failing test leaves nothing in /dev/shm.
class ScopedShmName {
 public:
  explicit ScopedShmName(const char* tag) {
    static std::atomic<int> counter{0};
    name_ = absl::StrCat("strata_test_", tag, "_", ::getpid(), "_", counter.fetch_add(1));
  }
  ~ScopedShmName() { SharedSegment::Remove(name_).IgnoreError(); }
  ScopedShmName(const ScopedShmName&) = delete;
  ScopedShmName& operator=(const ScopedShmName&) = delete;
  const std::string& str() const { return name_; }

 private:
  std::string name_;
};

// A fork()ed child running `body`; its return value is the exit code. The child must not
// use gtest assertions (they would report in the wrong process): it returns distinct
// nonzero codes instead. Killed and reaped on destruction if still running.
class ForkedChild {
 public:
  template <typename Body>
  explicit ForkedChild(Body body) {
    pid_ = ::fork();
    if (pid_ == 0) ::_exit(body());  // _exit: skip the parent's copied destructors
  }
  ~ForkedChild() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }

  // Exit code if it exited, 1000 + signal if a signal killed it, -1 if it is still running
  // after `timeout` (it is then killed).
  int Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);
        return -2;
      }
      if (r < 0 || absl::Now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        reaped_ = true;
        return -1;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace strata::shm_test

#endif  // STRATA_TESTS_COMMON_SHM_SHM_TEST_UTIL_H_
