#include "tools/strata/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {

absl::Status Spawn(Child& child) {
  // Built before the fork: the child of a threaded process may only make async-signal-safe calls.
  std::vector<std::string> environment = child.environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const bool overridden = std::any_of(
        child.environment.begin(), child.environment.end(), [&](const std::string& own) {
          return absl::StartsWith(entry, own.substr(0, own.find('=') + 1));
        });
    if (!overridden) environment.emplace_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (std::string& a : child.argv) args.push_back(a.data());
  args.push_back(nullptr);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(error)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    sigset_t all;
    sigfillset(&all);
    ::sigprocmask(SIG_UNBLOCK, &all, nullptr);
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "strata up: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  if (child.stdout_fd >= 0) ::close(child.stdout_fd);
  child.stdout_fd = pipe_fds[0];
  child.unread.clear();
  child.pid = pid;
  child.started = absl::Now();
  return absl::OkStatus();
}

std::optional<std::string> TakeLineWithPrefix(std::string& buffer, absl::string_view prefix) {
  size_t newline;
  while ((newline = buffer.find('\n')) != std::string::npos) {
    std::string line = buffer.substr(0, newline);
    buffer.erase(0, newline + 1);
    if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
  }
  return std::nullopt;
}

bool ReadStdout(Child& child) {
  char chunk[4096];
  const ssize_t n = ::read(child.stdout_fd, chunk, sizeof(chunk));
  if (n <= 0) return false;
  child.unread.append(chunk, static_cast<size_t>(n));
  return true;
}

absl::StatusOr<std::string> AwaitLine(Child& child, absl::string_view prefix,
                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<std::string> rest = TakeLineWithPrefix(child.unread, prefix)) return *rest;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(child.name, " did not print ", prefix));
    }
    pollfd fd{child.stdout_fd, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)));
    if (ready <= 0) continue;
    if (!ReadStdout(child)) {
      return absl::UnavailableError(absl::StrCat(child.name, " exited during start-up"));
    }
  }
}

void SetListenAddress(Child& child, const std::string& address) {
  for (std::string& arg : child.argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + address;
  }
}

void DrainInBackground(Child& child) {
  const int fd = std::exchange(child.stdout_fd, -1);
  if (fd < 0) return;
  std::thread([fd] {
    char chunk[4096];
    while (::read(fd, chunk, sizeof(chunk)) > 0) {
    }
    ::close(fd);
  }).detach();
}

int Stop(Child& child, absl::Duration grace) {
  if (child.pid <= 0) return -1;
  ::kill(child.pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) break;
    if (absl::Now() > deadline) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  child.pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

}  // namespace strata
