#include "tools/strata/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/process.h"
#include "tools/strata/mps_daemon.h"

namespace strata {
namespace {

struct Child {
  Child() = default;
  Child(std::string name, std::vector<std::string> argv)
      : name(std::move(name)), argv(std::move(argv)) {}

  std::string name;
  std::vector<std::string> argv;
  pid_t pid = -1;
  int stdout_fd = -1;
  absl::Time started;
  int restarts = 0;
};

// Starts `child` in its own process group (a terminal's Ctrl-C reaches only the supervisor,
// which then stops the children in order), dying with the supervisor.
absl::Status Spawn(Child& child) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    sigset_t all;
    sigfillset(&all);
    ::sigprocmask(SIG_UNBLOCK, &all, nullptr);
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (std::string& a : child.argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "strata up: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  if (child.stdout_fd >= 0) ::close(child.stdout_fd);
  child.stdout_fd = pipe_fds[0];
  child.pid = pid;
  child.started = absl::Now();
  return absl::OkStatus();
}

// Reads `child`'s stdout until a line starting with `prefix`; returns the rest of the line.
absl::StatusOr<std::string> AwaitLine(Child& child, const std::string& prefix,
                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string buffer;
  while (true) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(child.name, " did not print ", prefix));
    }
    pollfd fd{child.stdout_fd, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)));
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(child.stdout_fd, chunk, sizeof(chunk));
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat(child.name, " exited during start-up"));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

// Keeps reading a child's stdout so it never blocks on a full pipe.
void DrainInBackground(int fd) {
  std::thread([fd] {
    char chunk[4096];
    while (::read(fd, chunk, sizeof(chunk)) > 0) {
    }
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
  const ClusterConfig& c = options.cluster;
  if (c.model.empty())
    return absl::InvalidArgumentError("--model (or model: in --config) is required");
  if (c.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  absl::StatusOr<std::string> router_device = RouterDevice(c);
  if (!router_device.ok()) return router_device.status();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // GPU processes share a GPU through an MPS daemon of this cluster's own (see mps_daemon.h).
  std::unique_ptr<MpsDaemon> mps;
  if (c.device == "cuda" && c.mps != "off") {
    auto started = MpsDaemon::Start(absl::StrCat("/tmp/strata-mps-", ::getpid()));
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
  const std::string prefix = absl::StrCat("strata-", ::getpid());
  const std::string threads = absl::StrCat("--threads=", c.threads_per_process);
  const std::string log_level = absl::StrCat("--log-level=", c.log_level);
  Child cache{"strata-cache",
              {options.bin_dir + "/strata-cache", "--model=" + c.model,
               absl::StrCat("--listen=", c.host, ":0"), "--segment-prefix=" + prefix, log_level}};
  if (absl::Status s = Spawn(cache); !s.ok()) return s;
  auto cache_address = AwaitLine(cache, "READY ", absl::Minutes(30));
  if (!cache_address.ok()) {
    Stop(cache, absl::Seconds(2));
    return cache_address.status();
  }
  DrainInBackground(cache.stdout_fd);
  // A restarted cache listens where the workers look for it and, with the same segment prefix,
  // re-attaches to the store the dead one left.
  for (std::string& arg : cache.argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + *cache_address;
  }

  Child router{"strata-router",
               {options.bin_dir + "/strata-router",
                "--model=" + c.model,
                absl::StrCat("--listen=", c.host, ":", c.port),
                absl::StrCat("--workers=", c.workers),
                threads,
                "--router-device=" + *router_device,
                absl::StrCat("--kv-block-size=", c.kv_block_size),
                absl::StrCat("--kv-cache-mb=", c.kv_memory_mb),
                absl::StrCat("--router-temperature=", c.router_temperature),
                absl::StrCat("--max-batch-tokens=", c.max_batch_tokens),
                absl::StrCat("--max-running=", c.max_running),
                absl::StrCat("--max-queued-requests=", c.max_queued_requests),
                absl::StrCat("--drain-timeout-s=", c.drain_timeout_s),
                "--channel-prefix=" + prefix,
                "--plan=" + c.plan,
                "--hot-ratio=" + c.hot_ratio,
                "--hot-ratio-policy=" + c.hot_ratio_policy,
                absl::StrCat("--prefetch=", c.prefetch ? "true" : "false"),
                absl::StrCat("--cuda-graph-max-batch=", c.cuda_graph_max_batch),
                log_level}};
  std::vector<Child> workers(c.workers);
  auto stop_all = [&](absl::Duration router_grace) {
    const int router_exit = Stop(router, router_grace);
    for (Child& w : workers) Stop(w, absl::Seconds(5));
    Stop(cache, absl::Seconds(5));
    return router_exit;
  };
  if (absl::Status s = Spawn(router); !s.ok()) {
    stop_all(absl::Seconds(1));
    return s;
  }
  auto router_address = AwaitLine(router, "LISTENING ", absl::Minutes(30));
  if (!router_address.ok()) {
    stop_all(absl::Seconds(1));
    return router_address.status();
  }
  // A restarted router listens where clients and workers look for it.
  for (std::string& arg : router.argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + *router_address;
  }
  for (int i = 0; i < c.workers; ++i) {
    std::string device = c.device == "cuda" ? absl::StrCat("cuda:", i) : c.device;
    workers[i] = Child{
        absl::StrCat("strata-worker[", i, "]"),
        {options.bin_dir + "/strata-worker", "--model=" + c.model, "--cache=" + *cache_address,
         "--router=" + *router_address, absl::StrCat("--index=", i), "--device=" + device,
         "--weights=" + c.weights, absl::StrCat("--max-batch-tokens=", c.max_batch_tokens), threads,
         "--transport=" + c.transport, absl::StrCat("--listen=", c.host, ":0"),
         "--gpu-memory-budget=" + c.gpu_memory_budget, "--cache-policy=" + c.cache_policy,
         "--cold-experts=" + c.cold_experts, log_level}};
    if (absl::Status s = Spawn(workers[i]); !s.ok()) {
      stop_all(absl::Seconds(1));
      return s;
    }
    DrainInBackground(workers[i].stdout_fd);
  }

  // One poll loop: the router's stdout until it prints READY, and the signals (SIGCHLD too)
  // through a signalfd.
  const int signal_fd = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (signal_fd < 0) {
    stop_all(absl::Seconds(1));
    return absl::InternalError("signalfd failed");
  }
  bool ready = false;
  bool announced = false;  // READY printed (once: a restarted router only logs)
  absl::Time router_stopped;
  std::string router_output;
  // A restarted strata-cache: its stdout until READY (then -1), and whether it got there.
  int cache_start_fd = -1;
  bool cache_back = true;
  absl::Time cache_stopped;
  std::string cache_output;
  while (true) {
    pollfd fds[3] = {{signal_fd, POLLIN, 0},
                     {ready ? -1 : router.stdout_fd, POLLIN, 0},
                     {cache_start_fd, POLLIN, 0}};
    if (::poll(fds, 3, 1000) < 0 && errno != EINTR) {
      stop_all(absl::Seconds(1));
      return absl::InternalError("poll failed");
    }
    if (!ready && (fds[1].revents & (POLLIN | POLLHUP))) {
      char chunk[4096];
      const ssize_t n = ::read(router.stdout_fd, chunk, sizeof(chunk));
      if (n > 0) router_output.append(chunk, static_cast<size_t>(n));
      const size_t at = router_output.find("READY ");
      const size_t end_of_line = router_output.find('\n', at);
      if (at != std::string::npos && end_of_line != std::string::npos) {
        if (!announced) {
          out << router_output.substr(at, end_of_line - at) << std::endl;
          announced = true;
        } else {
          StatusLine(absl::StrCat("strata-router is back, ",
                                  absl::ToInt64Milliseconds(absl::Now() - router_stopped),
                                  " ms after it stopped"));
        }
        ready = true;
        DrainInBackground(router.stdout_fd);
      }
    }
    if (cache_start_fd >= 0 && (fds[2].revents & (POLLIN | POLLHUP))) {
      char chunk[4096];
      const ssize_t n = ::read(cache_start_fd, chunk, sizeof(chunk));
      if (n > 0) cache_output.append(chunk, static_cast<size_t>(n));
      const size_t at = cache_output.find("READY ");
      const size_t end_of_line = cache_output.find('\n', at);
      if (at != std::string::npos && end_of_line != std::string::npos) {
        StatusLine(absl::StrCat(
            "strata-cache is back at ", cache_output.substr(at + 6, end_of_line - at - 6), ", ",
            absl::ToInt64Milliseconds(absl::Now() - cache_stopped), " ms after it stopped"));
        cache_back = true;
        DrainInBackground(cache_start_fd);
        cache_start_fd = -1;
      } else if (n <= 0) {
        cache_start_fd = -1;  // it exited: SIGCHLD says how
      }
    }
    if (!(fds[0].revents & POLLIN)) continue;
    signalfd_siginfo info;
    if (::read(signal_fd, &info, sizeof(info)) != sizeof(info)) continue;
    const int signal = static_cast<int>(info.ssi_signo);
    if (signal == SIGINT || signal == SIGTERM) {
      StatusLine(absl::StrCat("signal ", signal, ", stopping the cluster"));
      const int router_exit = stop_all(absl::Seconds(c.drain_timeout_s + 10));
      ::close(signal_fd);
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
          stop_all(absl::Seconds(5));
          ::close(signal_fd);
          return absl::InternalError(
              absl::StrCat("strata-cache failed to restart (", Describe(status), ")"));
        }
        StatusLine(absl::StrCat("strata-cache stopped (", Describe(status), "), restarting it"));
        ++cache.restarts;
        cache_back = false;
        cache_stopped = absl::Now();
        cache_output.clear();
        if (absl::Status s = Spawn(cache); !s.ok()) {
          stop_all(absl::Seconds(2));
          return s;
        }
        cache_start_fd = cache.stdout_fd;
        continue;
      }
      if (pid == router.pid) {
        router.pid = -1;
        // A router that never got ready would only fail again; one that served is restarted
        // on its address: its in-flight requests are lost (clients see UNAVAILABLE), the
        // workers register with the new one, the store and the workers' experts stay.
        if (!announced) {
          stop_all(absl::Seconds(5));
          ::close(signal_fd);
          return absl::InternalError(
              absl::StrCat(router.name, " stopped (", Describe(status), ")"));
        }
        StatusLine(absl::StrCat(router.name, " stopped (", Describe(status), "), restarting it"));
        ++router.restarts;
        router_stopped = absl::Now();
        router_output.clear();
        ready = false;
        if (absl::Status s = Spawn(router); !s.ok()) {
          stop_all(absl::Seconds(2));
          ::close(signal_fd);
          return s;
        }
        continue;
      }
      for (Child& w : workers) {
        if (pid != w.pid) continue;
        w.pid = -1;
        const bool config_error = WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                  absl::Now() - w.started < absl::Seconds(30) && w.restarts == 0 &&
                                  !ready;
        if (config_error) {
          stop_all(absl::Seconds(2));
          ::close(signal_fd);
          return absl::FailedPreconditionError(
              absl::StrCat(w.name, " failed to start (", Describe(status), ")"));
        }
        StatusLine(absl::StrCat(w.name, " stopped (", Describe(status), "), restarting it"));
        ++w.restarts;
        if (absl::Status s = Spawn(w); !s.ok()) {
          stop_all(absl::Seconds(2));
          return s;
        }
        DrainInBackground(w.stdout_fd);
      }
    }
  }
}

}  // namespace strata
