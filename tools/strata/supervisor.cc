#include "tools/strata/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_token.h"
#include "common/cluster/runtime_dir.h"
#include "common/util/process.h"
#include "services/router/router_limits.h"
#include "tools/strata/mps_daemon.h"

namespace strata {
namespace {

struct Child {
  Child() = default;
  Child(std::string name, std::vector<std::string> argv)
      : name(std::move(name)), argv(std::move(argv)) {}

  std::string name;
  std::vector<std::string> argv;
  // NAME=value entries set in its environment over this process's: secrets stay off the
  // command line, which any local user can read.
  std::vector<std::string> environment;
  pid_t pid = -1;
  int stdout_fd = -1;
  std::string unread;  // read from stdout_fd, not yet taken as lines
  absl::Time started;
  int restarts = 0;
};

// Starts `child` in its own process group (a terminal's Ctrl-C reaches only the supervisor,
// which then stops the children in order), dying with the supervisor.
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

// Drops the complete lines at the front of `buffer` up to the first that starts with `prefix`
// and returns the rest of that one; nullopt while there is none (an incomplete line stays).
std::optional<std::string> TakeLineWithPrefix(std::string& buffer, absl::string_view prefix) {
  size_t newline;
  while ((newline = buffer.find('\n')) != std::string::npos) {
    std::string line = buffer.substr(0, newline);
    buffer.erase(0, newline + 1);
    if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
  }
  return std::nullopt;
}

// One read of `child`'s stdout into child.unread; false once the child has closed it.
bool ReadStdout(Child& child) {
  char chunk[4096];
  const ssize_t n = ::read(child.stdout_fd, chunk, sizeof(chunk));
  if (n <= 0) return false;
  child.unread.append(chunk, static_cast<size_t>(n));
  return true;
}

// Reads `child`'s stdout until a line starting with `prefix`; returns the rest of the line.
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

// Points `child`'s --listen= at `address`: a restarted child listens where the others look.
void SetListenAddress(Child& child, const std::string& address) {
  for (std::string& arg : child.argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + address;
  }
}

// Keeps reading a child's stdout so it never blocks on a full pipe. The reading thread owns the
// descriptor from here and closes it at end of file: a restart's Spawn must not close it under
// the thread (its number could then be reused by another pipe or socket the thread would read).
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

// Sends SIGTERM, waits up to `grace`, then SIGKILL. Returns the exit status, or -1.
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

}  // namespace

absl::Status RunCluster(const SupervisorOptions& options, std::ostream& out) {
  ClusterConfig c = options.cluster;
  if (c.model.empty())
    return absl::InvalidArgumentError("--model (or model: in --config) is required");
  if (c.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  absl::StatusOr<std::string> router_device = RouterDevice(c);
  if (!router_device.ok()) return router_device.status();
  if (c.max_batch_tokens == 0) c.max_batch_tokens = DefaultMaxBatchTokens(*router_device);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // The cluster's private directory (sockets, token, addresses) and the prefix of its shared
  // memory, both named with a random id; what a SIGKILLed `strata up` of this user left goes.
  for (const std::string& id : SweepDeadClusters()) {
    StatusLine(absl::StrCat("removed what cluster ", id, " left (its strata up is gone)"));
  }
  absl::StatusOr<ClusterDir> dir = CreateClusterDir();
  if (!dir.ok()) return dir.status();
  absl::Cleanup remove_dir = [&] { RemoveCluster(*dir); };
  absl::StatusOr<ClusterToken> token = ClusterToken::Create(dir->token_file());
  if (!token.ok()) return token.status();
  // GPU processes share a GPU through an MPS daemon of this cluster's own (see mps_daemon.h),
  // its pipes in the cluster's private directory.
  std::unique_ptr<MpsDaemon> mps;
  if (c.device == "cuda" && c.mps != "off") {
    auto started = MpsDaemon::Start(dir->path + "/mps");
    if (started.ok()) {
      mps = *std::move(started);
      StatusLine(absl::StrCat("CUDA MPS daemon started (", mps->pipe_dir(), ")"));
    } else if (c.mps == "on") {
      return started.status();
    } else {
      StatusLine(absl::StrCat("no CUDA MPS (", started.status().message(),
                              "): processes on one GPU share it by time slices"));
    }
  }
  const std::string prefix = dir->shm_prefix();
  const std::string token_flag = "--cluster-token-file=" + dir->token_file();
  const std::string router_internal = dir->socket("router");
  // Every config key handed to a process (DaemonArgs), then what is derived here.
  auto args_of = [&](const char* binary, Daemon daemon, std::vector<std::string> derived) {
    std::vector<std::string> args = {options.bin_dir + "/" + binary};
    for (std::string& arg : DaemonArgs(c, daemon)) args.push_back(std::move(arg));
    for (std::string& arg : derived) args.push_back(std::move(arg));
    return args;
  };
  Child cache{"strata-cache", args_of("strata-cache", Daemon::kCache,
                                      {"--listen=" + dir->socket("cache"),
                                       "--segment-prefix=" + prefix, token_flag})};
  if (absl::Status s = Spawn(cache); !s.ok()) return s;
  auto cache_address = AwaitLine(cache, "READY ", absl::Minutes(30));
  if (!cache_address.ok()) {
    Stop(cache, absl::Seconds(2));
    return cache_address.status();
  }
  DrainInBackground(cache);
  // A restarted cache listens where the workers look for it and, with the same segment prefix,
  // re-attaches to the store the dead one left.
  SetListenAddress(cache, *cache_address);

  Child router{"strata-router",
               args_of("strata-router", Daemon::kRouter,
                       {absl::StrCat("--listen=", c.host, ":", c.port),
                        "--internal-listen=" + router_internal, token_flag,
                        "--router-device=" + *router_device, "--channel-prefix=" + prefix})};
  // The HTTP API's key reaches the router in its environment, as strata-router reads it.
  if (!c.api_key.empty()) router.environment = {absl::StrCat(kApiKeyEnvironment, "=", c.api_key)};
  std::vector<Child> workers(c.workers);
  auto stop_all = [&](absl::Duration router_grace) {
    const int router_exit = Stop(router, router_grace);
    for (Child& w : workers) Stop(w, absl::Seconds(5));
    Stop(cache, absl::Seconds(5));
    return router_exit;
  };
  // Every error from here on stops the whole cluster before it is returned.
  auto fail = [&](absl::Duration router_grace, absl::Status status) {
    stop_all(router_grace);
    return status;
  };
  // Says why `child` stopped and starts it again, on the same arguments.
  auto restart = [](Child& child, int status) {
    StatusLine(absl::StrCat(child.name, " stopped (", Describe(status), "), restarting it"));
    ++child.restarts;
    return Spawn(child);
  };
  if (absl::Status s = Spawn(router); !s.ok()) return fail(absl::Seconds(1), s);
  auto router_address = AwaitLine(router, "LISTENING ", absl::Minutes(30));
  if (!router_address.ok()) return fail(absl::Seconds(1), router_address.status());
  // A restarted router listens where clients and workers look for it.
  SetListenAddress(router, *router_address);
  for (int i = 0; i < c.workers; ++i) {
    // Workers take the GPUs in turn: more workers than GPUs share them (under MPS).
    const int gpu = c.gpus > 0 ? i % c.gpus : i;
    std::string device = c.device == "cuda" ? absl::StrCat("cuda:", gpu) : c.device;
    workers[i] =
        Child{absl::StrCat("strata-worker[", i, "]"),
              args_of("strata-worker", Daemon::kWorker,
                      {"--cache=" + *cache_address, "--router=" + router_internal, token_flag,
                       "--channel-prefix=" + prefix, absl::StrCat("--index=", i),
                       "--device=" + device, absl::StrCat("--listen=", c.host, ":0")})};
    if (absl::Status s = Spawn(workers[i]); !s.ok()) return fail(absl::Seconds(1), s);
    DrainInBackground(workers[i]);
  }

  // One poll loop: the router's stdout until it prints READY, and the signals (SIGCHLD too)
  // through a signalfd.
  const int signal_fd = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (signal_fd < 0) return fail(absl::Seconds(1), absl::InternalError("signalfd failed"));
  // Closed on every way out, after the children are stopped. (SFD_CLOEXEC already keeps it
  // from the children that are restarted: they exec.)
  absl::Cleanup close_signal_fd = [signal_fd] { ::close(signal_fd); };
  bool ready = false;
  bool announced = false;  // READY printed (once: a restarted router only logs)
  absl::Time router_stopped;
  // A restarted strata-cache: whether its stdout is watched for READY, and whether it got there.
  bool cache_starting = false;
  bool cache_back = true;
  absl::Time cache_stopped;
  while (true) {
    pollfd fds[3] = {{signal_fd, POLLIN, 0},
                     {ready ? -1 : router.stdout_fd, POLLIN, 0},
                     {cache_starting ? cache.stdout_fd : -1, POLLIN, 0}};
    if (::poll(fds, 3, 1000) < 0 && errno != EINTR) {
      return fail(absl::Seconds(1), absl::InternalError("poll failed"));
    }
    if (!ready) {
      // Also what an earlier read left unscanned (LISTENING's read may have brought READY).
      if (fds[1].revents & (POLLIN | POLLHUP)) ReadStdout(router);
      if (std::optional<std::string> address = TakeLineWithPrefix(router.unread, "READY ")) {
        if (!announced) {
          const ClusterInfo info{
              .client = *address, .internal = router_internal, .http_port = c.http_port};
          if (absl::Status s = WriteClusterInfo(*dir, info); !s.ok()) {
            StatusLine(absl::StrCat("admin commands cannot find this cluster: ", s.message()));
          }
          out << "READY " << *address << std::endl;
          announced = true;
        } else {
          StatusLine(absl::StrCat("strata-router is back, ",
                                  absl::ToInt64Milliseconds(absl::Now() - router_stopped),
                                  " ms after it stopped"));
        }
        ready = true;
        DrainInBackground(router);
      }
    }
    if (cache_starting && (fds[2].revents & (POLLIN | POLLHUP))) {
      const bool open = ReadStdout(cache);
      if (std::optional<std::string> address = TakeLineWithPrefix(cache.unread, "READY ")) {
        StatusLine(absl::StrCat("strata-cache is back at ", *address, ", ",
                                absl::ToInt64Milliseconds(absl::Now() - cache_stopped),
                                " ms after it stopped"));
        cache_back = true;
        DrainInBackground(cache);
        cache_starting = false;
      } else if (!open) {
        cache_starting = false;  // it exited: SIGCHLD says how
      }
    }
    if (!(fds[0].revents & POLLIN)) continue;
    signalfd_siginfo info;
    if (::read(signal_fd, &info, sizeof(info)) != sizeof(info)) continue;
    const int signal = static_cast<int>(info.ssi_signo);
    if (signal == SIGINT || signal == SIGTERM) {
      StatusLine(absl::StrCat("signal ", signal, ", stopping the cluster"));
      const int router_exit = stop_all(absl::Seconds(c.drain_timeout_s + 10));
      if (router_exit != 0) {
        return absl::DeadlineExceededError("the router could not finish every request in time");
      }
      return absl::OkStatus();
    }
    // Reap whatever exited.
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (pid == cache.pid) {
        // The workers keep serving from their mappings of its segments meanwhile. A restart
        // that exits with an error before READY would only fail again.
        cache.pid = -1;
        if (!cache_back && WIFEXITED(status)) {
          return fail(absl::Seconds(5),
                      absl::InternalError(
                          absl::StrCat("strata-cache failed to restart (", Describe(status), ")")));
        }
        cache_back = false;
        cache_stopped = absl::Now();
        if (absl::Status s = restart(cache, status); !s.ok()) return fail(absl::Seconds(2), s);
        cache_starting = true;
        continue;
      }
      if (pid == router.pid) {
        router.pid = -1;
        // A router that never got ready would only fail again; one that served is restarted
        // on its address: its in-flight requests are lost (clients see UNAVAILABLE), the
        // workers register with the new one, the store and the workers' experts stay.
        if (!announced) {
          return fail(absl::Seconds(5), absl::InternalError(absl::StrCat(router.name, " stopped (",
                                                                         Describe(status), ")")));
        }
        router_stopped = absl::Now();
        ready = false;
        if (absl::Status s = restart(router, status); !s.ok()) return fail(absl::Seconds(2), s);
        continue;
      }
      for (Child& w : workers) {
        if (pid != w.pid) continue;
        w.pid = -1;
        const bool config_error = WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                  absl::Now() - w.started < absl::Seconds(30) && w.restarts == 0 &&
                                  !ready;
        if (config_error) {
          return fail(absl::Seconds(2), absl::FailedPreconditionError(absl::StrCat(
                                            w.name, " failed to start (", Describe(status), ")")));
        }
        if (absl::Status s = restart(w, status); !s.ok()) return fail(absl::Seconds(2), s);
        DrainInBackground(w);
      }
    }
  }
}

}  // namespace strata
