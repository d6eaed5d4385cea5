// Runs `strata up` as a child process for integration tests: waits for its READY line and
// stops it (SIGTERM) when the object dies.
#ifndef STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_
#define STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace strata::testing {

class ClusterProcess {
 public:
  // `args` follow "strata up"; e.g. {"--model=DIR", "--workers=2"}.
  explicit ClusterProcess(const std::vector<std::string>& args, int ready_timeout_s = 120) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      std::vector<std::string> argv = {std::string(STRATA_BIN_DIR) + "/strata", "up"};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> raw;
      for (auto& a : argv) raw.push_back(a.data());
      raw.push_back(nullptr);
      ::execv(raw[0], raw.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    stdout_fd_ = fds[0];
    address_ = AwaitReady(ready_timeout_s);
  }

  ~ClusterProcess() { Stop(); }

  // Empty if the cluster never became ready.
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }

  // SIGTERM and wait; returns the exit status (-1 if killed or not running).
  int Stop(int timeout_s = 60) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      ::usleep(20000);
    }
    pid_ = -1;
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    stdout_fd_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  std::string AwaitReady(int timeout_s) {
    std::string buffer;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd fd{stdout_fd_, POLLIN, 0};
      if (::poll(&fd, 1, 200) <= 0) continue;
      char chunk[1024];
      const ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer.append(chunk, static_cast<size_t>(n));
      const size_t at = buffer.find("READY ");
      const size_t end = buffer.find('\n', at);
      if (at != std::string::npos && end != std::string::npos) {
        return buffer.substr(at + 6, end - at - 6);
      }
    }
    return "";
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_CLUSTER_PROCESS_H_
