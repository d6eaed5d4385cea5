// Runs `strata up` as a child process for integration tests: waits for its READY line and
// stops it (SIGTERM) when the object dies.
#ifndef STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_
#define STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_

#include <string>
#include <vector>

#include "tests/testing/child_process.h"

namespace strata::testing {

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
