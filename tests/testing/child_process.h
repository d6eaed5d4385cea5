// A child process for integration tests: started with execv, its stdout read line by line
// (its stderr optionally into a file), stopped with SIGTERM (then SIGKILL) when the object dies.
#ifndef STRATA_TESTS_TESTING_CHILD_PROCESS_H_
#define STRATA_TESTS_TESTING_CHILD_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace strata::testing {

class ChildProcess {
 public:
  // argv[0] is the program's path. With `stderr_path`, stderr goes to that file (appended).
  explicit ChildProcess(std::vector<std::string> argv, const std::string& stderr_path = "") {
    int fds[2];
    if (::pipe(fds) != 0) return;
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // A test that crashes must not leave its child running: a cluster left behind holds the
      // test runner's output pipe open, and the runner waits for it forever.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      if (!stderr_path.empty()) {
        const int err =
            ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (err >= 0) ::dup2(err, STDERR_FILENO);
      }
      std::vector<char*> raw;
      for (auto& a : argv) raw.push_back(a.data());
      raw.push_back(nullptr);
      ::execv(raw[0], raw.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    stdout_fd_ = fds[0];
  }
  ~ChildProcess() { Stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The rest of the first stdout line that starts with `prefix`; empty on timeout or exit.
  std::string AwaitLine(const std::string& prefix, int timeout_s = 120) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      size_t newline;
      while ((newline = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        if (line.compare(0, prefix.size(), prefix) == 0) return line.substr(prefix.size());
      }
      pollfd fd{stdout_fd_, POLLIN, 0};
      if (::poll(&fd, 1, 200) <= 0) continue;
      char chunk[1024];
      const ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return "";
  }

  // Sends `signal`, waits up to `timeout_s`, then SIGKILL. Returns the exit status, or -1 if
  // the process was killed by a signal or was not running.
  int Stop(int timeout_s = 60, int signal = SIGTERM) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, signal);
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
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_CHILD_PROCESS_H_
