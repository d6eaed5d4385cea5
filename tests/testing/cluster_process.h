// Runs `strata up` as a child process for integration tests: waits for its READY line and
// stops it (SIGTERM) when the object dies. Finds, kills and awaits the replacement of the
// processes it supervises.
#ifndef STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_
#define STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/child_process.h"
#include "tests/testing/poll.h"

namespace strata::testing {

// The pid of a live child of `parent` (e.g. a cluster's strata-worker) whose command line
// holds both strings, or -1.
inline pid_t ChildWithArgs(pid_t parent, const std::string& a, const std::string& b) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), {});
    std::ifstream stat(entry.path() / "stat");
    std::string pid_field, comm, state;
    pid_t ppid = 0;
    stat >> pid_field >> comm >> state >> ppid;
    if (ppid == parent && state != "Z" && args.find(a) != std::string::npos &&
        args.find(b) != std::string::npos) {
      return std::stoi(pid_field);
    }
  }
  return -1;
}

// Sends `signal` to the live child of `parent` whose command line holds `a` and `b`, its pid
// into `*child`. Fails the test if there is none or the signal fails: call it inside
// ASSERT_NO_FATAL_FAILURE.
inline void SignalChild(pid_t parent, const std::string& a, const std::string& b, int signal,
                        pid_t* child) {
  *child = ChildWithArgs(parent, a, b);
  ASSERT_GT(*child, 0) << "no child of " << parent << " with " << a << " and " << b;
  ASSERT_EQ(::kill(*child, signal), 0);
}

// SignalChild with SIGKILL.
inline void KillChild(pid_t parent, const std::string& a, const std::string& b, pid_t* killed) {
  SignalChild(parent, a, b, SIGKILL, killed);
}

// The child of `parent` with `a` and `b` on its command line that took the place of `old` (a
// process the supervisor restarted), looked for every 50 ms for `timeout_s`; -1 if none came.
inline pid_t AwaitReplacement(pid_t parent, const std::string& a, const std::string& b, pid_t old,
                              int timeout_s = 30) {
  pid_t replacement = -1;
  const bool came = PollUntil(
      [&] {
        replacement = ChildWithArgs(parent, a, b);
        return replacement > 0 && replacement != old;
      },
      std::chrono::seconds(timeout_s));
  return came ? replacement : -1;
}

class ClusterProcess {
 public:
  // `args` follow "strata up"; e.g. {"--model=DIR", "--workers=2"}. With `stderr_path`, the
  // cluster's stderr (every process's log) goes to that file.
  explicit ClusterProcess(const std::vector<std::string>& args, int ready_timeout_s = 120,
                          const std::string& stderr_path = "")
      : process_(Argv(args), stderr_path) {
    address_ = process_.AwaitLine("READY ", ready_timeout_s);
  }

  // Empty if the cluster never became ready.
  const std::string& address() const { return address_; }
  pid_t pid() const { return process_.pid(); }
  // SIGTERM and wait; returns the exit status (-1 if killed or not running).
  int Stop(int timeout_s = 60) { return process_.Stop(timeout_s); }

 private:
  static std::vector<std::string> Argv(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {std::string(STRATA_BIN_DIR) + "/strata", "up"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  ChildProcess process_;
  std::string address_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_
