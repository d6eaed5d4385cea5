// Runs the `strata` command as a user would, for tests of its command line.
#ifndef STRATA_TESTS_TESTING_RUN_STRATA_H_
#define STRATA_TESTS_TESTING_RUN_STRATA_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace strata::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// A shell command line, its stderr with its stdout.
inline CommandResult RunCommand(const std::string& command_line) {
  const std::string command = command_line + " 2>&1";
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// `args` follow "strata " in a shell command line (STRATA_BIN_DIR/strata).
inline CommandResult RunStrata(const std::string& args) {
  return RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args);
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_RUN_STRATA_H_
