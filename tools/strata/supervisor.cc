#include "tools/strata/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_token.h"
#include "common/cluster/runtime_dir.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "services/router/router_limits.h"
#include "tools/strata/child_process.h"
#include "tools/strata/mps_daemon.h"

namespace strata {
namespace {

// One `strata up`: the cluster's private directory and processes, started in order and kept
// running until a signal stops them or one cannot be brought back.
class Supervisor {
 public:
  Supervisor(const SupervisorOptions& options, ClusterConfig config, std::string router_device,
             std::ostream& out)
      : options_(options),
        c_(std::move(config)),
        router_device_(std::move(router_device)),
        out_(out) {}
  ~Supervisor() {
    mps_.reset();  // before its pipes' directory goes
    if (dir_.has_value()) RemoveCluster(*dir_);
  }

  // The cluster's private directory (sockets, token, addresses) and the prefix of its shared
  // memory, both named with a random id (what a SIGKILLed `strata up` of this user left goes),
  // and the CUDA MPS daemon its GPU processes share a GPU through.
  absl::Status Prepare();
  // strata-expert-store, then strata-router, then the workers, each once the one before listens.
  // Any error stops what was started.
  absl::Status StartProcesses();
  // One poll loop over the router's stdout until it prints READY, a restarted expert store's
  // until it is back, and the signals (SIGCHLD too, `signals` blocked by the caller) through a
  // signalfd.
  absl::Status Supervise(const sigset_t& signals);

 private:
  // Every config key handed to a process (DaemonArgs), then what is derived here.
  std::vector<std::string> ArgsOf(const char* binary, Daemon daemon,
                                  std::vector<std::string> derived) const;
  std::string WorkerDevice(int index) const;
  // Stops the router (draining for up to `router_grace`), the workers and the expert store;
  // returns the router's exit status.
  int StopAll(absl::Duration router_grace);
  // Stops the whole cluster and returns `status`.
  absl::Status Fail(absl::Duration router_grace, absl::Status status) {
    StopAll(router_grace);
    return status;
  }
  // Says why `child` stopped and starts it again, on the same arguments.
  static absl::Status Restart(Child& child, int status);
  // The router's READY: announced once (the cluster's info written, READY printed), later
  // only logged (a restarted router).
  void TakeRouterReady();
  void TakeStoreReady();
  // A child that exited: restarted, or the error that ends the cluster.
  absl::Status OnExit(pid_t pid, int status);

  const SupervisorOptions& options_;
  const ClusterConfig c_;
  const std::string router_device_;
  std::ostream& out_;
  std::optional<ClusterDir> dir_;
  std::optional<ClusterToken> token_;
  std::unique_ptr<MpsDaemon> mps_;
  std::string token_flag_;
  std::string router_internal_;
  std::string store_address_;
  Child store_, router_;
  std::vector<Child> workers_;
  bool ready_ = false;      // the router printed READY since it (last) started
  bool announced_ = false;  // READY printed (once: a restarted router only logs)
  absl::Time router_stopped_;
  // A restarted strata-expert-store: whether its stdout is watched for READY, and whether it
  // got there.
  bool store_starting_ = false;
  bool store_back_ = true;
  absl::Time store_stopped_;
};

absl::Status Supervisor::Prepare() {
  for (const std::string& id : SweepDeadClusters()) {
    StatusLine(absl::StrCat("removed what cluster ", id, " left (its strata up is gone)"));
  }
  ASSIGN_OR_RETURN(dir_, CreateClusterDir());
  ASSIGN_OR_RETURN(token_, ClusterToken::Create(dir_->token_file()));
  token_flag_ = "--cluster-token-file=" + dir_->token_file();
  router_internal_ = dir_->socket("router");
  // Its pipes in the cluster's private directory (see mps_daemon.h).
  if (c_.device == "cuda" && c_.mps != "off") {
    absl::StatusOr<std::unique_ptr<MpsDaemon>> started = MpsDaemon::Start(dir_->path + "/mps");
    if (started.ok()) {
      mps_ = *std::move(started);
      StatusLine(absl::StrCat("CUDA MPS daemon started (", mps_->pipe_dir(), ")"));
    } else if (c_.mps == "on") {
      return started.status();
    } else {
      StatusLine(absl::StrCat("no CUDA MPS (", started.status().message(),
                              "): processes on one GPU share it by time slices"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Supervisor::ArgsOf(const char* binary, Daemon daemon,
                                            std::vector<std::string> derived) const {
  std::vector<std::string> args = {options_.bin_dir + "/" + binary};
  for (std::string& arg : DaemonArgs(c_, daemon)) args.push_back(std::move(arg));
  for (std::string& arg : derived) args.push_back(std::move(arg));
  return args;
}

std::string Supervisor::WorkerDevice(int index) const {
  // Workers take the GPUs in turn: more workers than GPUs share them (under MPS).
  const int gpu = c_.gpus > 0 ? index % c_.gpus : index;
  return c_.device == "cuda" ? absl::StrCat("cuda:", gpu) : c_.device;
}

absl::Status Supervisor::StartProcesses() {
  const std::string prefix = dir_->shm_prefix();
  store_ = Child{"strata-expert-store", ArgsOf("strata-expert-store", Daemon::kExpertStore,
                                               {"--listen=" + dir_->socket("expert-store"),
                                                "--segment-prefix=" + prefix, token_flag_})};
  RETURN_IF_ERROR(Spawn(store_));
  absl::StatusOr<std::string> store_address = AwaitLine(store_, "READY ", absl::Minutes(30));
  if (!store_address.ok()) {
    Stop(store_, absl::Seconds(2));
    return store_address.status();
  }
  store_address_ = *store_address;
  DrainInBackground(store_);
  // A restarted expert store listens where the workers look for it and, with the same segment
  // prefix, re-attaches to the store the dead one left.
  SetListenAddress(store_, store_address_);

  router_ = Child{"strata-router",
                  ArgsOf("strata-router", Daemon::kRouter,
                         {absl::StrCat("--listen=", c_.host, ":", c_.port),
                          "--internal-listen=" + router_internal_, token_flag_,
                          "--router-device=" + router_device_, "--channel-prefix=" + prefix})};
  // The HTTP API's key reaches the router in its environment, as strata-router reads it.
  if (!c_.api_key.empty()) {
    router_.environment = {absl::StrCat(kApiKeyEnvironment, "=", c_.api_key)};
  }
  workers_.resize(c_.workers);
  if (absl::Status s = Spawn(router_); !s.ok()) return Fail(absl::Seconds(1), s);
  absl::StatusOr<std::string> router_address = AwaitLine(router_, "LISTENING ", absl::Minutes(30));
  if (!router_address.ok()) return Fail(absl::Seconds(1), router_address.status());
  // A restarted router listens where clients and workers look for it.
  SetListenAddress(router_, *router_address);
  for (int i = 0; i < c_.workers; ++i) {
    workers_[i] =
        Child{absl::StrCat("strata-worker[", i, "]"),
              ArgsOf("strata-worker", Daemon::kWorker,
                     {"--store-address=" + store_address_, "--router=" + router_internal_,
                      token_flag_, "--channel-prefix=" + prefix, absl::StrCat("--index=", i),
                      "--device=" + WorkerDevice(i), absl::StrCat("--listen=", c_.host, ":0")})};
    if (absl::Status s = Spawn(workers_[i]); !s.ok()) return Fail(absl::Seconds(1), s);
    DrainInBackground(workers_[i]);
  }
  return absl::OkStatus();
}

int Supervisor::StopAll(absl::Duration router_grace) {
  const int router_exit = Stop(router_, router_grace);
  for (Child& w : workers_) Stop(w, absl::Seconds(5));
  Stop(store_, absl::Seconds(5));
  return router_exit;
}

absl::Status Supervisor::Restart(Child& child, int status) {
  StatusLine(absl::StrCat(child.name, " stopped (", Describe(status), "), restarting it"));
  ++child.restarts;
  return Spawn(child);
}

void Supervisor::TakeRouterReady() {
  std::optional<std::string> address = TakeLineWithPrefix(router_.unread, "READY ");
  if (!address.has_value()) return;
  if (!announced_) {
    const ClusterInfo info{
        .client = *address, .internal = router_internal_, .http_port = c_.http_port};
    if (absl::Status s = WriteClusterInfo(*dir_, info); !s.ok()) {
      StatusLine(absl::StrCat("admin commands cannot find this cluster: ", s.message()));
    }
    out_ << "READY " << *address << std::endl;
    announced_ = true;
  } else {
    StatusLine(absl::StrCat("strata-router is back, ",
                            absl::ToInt64Milliseconds(absl::Now() - router_stopped_),
                            " ms after it stopped"));
  }
  ready_ = true;
  DrainInBackground(router_);
}

void Supervisor::TakeStoreReady() {
  const bool open = ReadStdout(store_);
  if (std::optional<std::string> address = TakeLineWithPrefix(store_.unread, "READY ")) {
    StatusLine(absl::StrCat("strata-expert-store is back at ", *address, ", ",
                            absl::ToInt64Milliseconds(absl::Now() - store_stopped_),
                            " ms after it stopped"));
    store_back_ = true;
    DrainInBackground(store_);
    store_starting_ = false;
  } else if (!open) {
    store_starting_ = false;  // it exited: SIGCHLD says how
  }
}

absl::Status Supervisor::OnExit(pid_t pid, int status) {
  if (pid == store_.pid) {
    // The workers keep serving from their mappings of its segments meanwhile. A restart that
    // exits with an error before READY would only fail again.
    store_.pid = -1;
    if (!store_back_ && WIFEXITED(status)) {
      return Fail(absl::Seconds(5),
                  absl::InternalError(absl::StrCat("strata-expert-store failed to restart (",
                                                   Describe(status), ")")));
    }
    store_back_ = false;
    store_stopped_ = absl::Now();
    if (absl::Status s = Restart(store_, status); !s.ok()) return Fail(absl::Seconds(2), s);
    store_starting_ = true;
    return absl::OkStatus();
  }
  if (pid == router_.pid) {
    router_.pid = -1;
    // A router that never got ready would only fail again; one that served is restarted on
    // its address: its in-flight requests are lost (clients see UNAVAILABLE), the workers
    // register with the new one, the store and the workers' experts stay.
    if (!announced_) {
      return Fail(absl::Seconds(5), absl::InternalError(absl::StrCat(router_.name, " stopped (",
                                                                     Describe(status), ")")));
    }
    router_stopped_ = absl::Now();
    ready_ = false;
    if (absl::Status s = Restart(router_, status); !s.ok()) return Fail(absl::Seconds(2), s);
    return absl::OkStatus();
  }
  for (Child& w : workers_) {
    if (pid != w.pid) continue;
    w.pid = -1;
    const bool config_error = WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                              absl::Now() - w.started < absl::Seconds(30) && w.restarts == 0 &&
                              !ready_;
    if (config_error) {
      return Fail(absl::Seconds(2), absl::FailedPreconditionError(absl::StrCat(
                                        w.name, " failed to start (", Describe(status), ")")));
    }
    if (absl::Status s = Restart(w, status); !s.ok()) return Fail(absl::Seconds(2), s);
    DrainInBackground(w);
  }
  return absl::OkStatus();
}

absl::Status Supervisor::Supervise(const sigset_t& signals) {
  const int signal_fd = ::signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) return Fail(absl::Seconds(1), absl::InternalError("signalfd failed"));
  // Closed on every way out, after the children are stopped. (SFD_CLOEXEC already keeps it
  // from the children that are restarted: they exec.)
  absl::Cleanup close_signal_fd = [signal_fd] { ::close(signal_fd); };
  while (true) {
    pollfd fds[3] = {{signal_fd, POLLIN, 0},
                     {ready_ ? -1 : router_.stdout_fd, POLLIN, 0},
                     {store_starting_ ? store_.stdout_fd : -1, POLLIN, 0}};
    if (::poll(fds, 3, 1000) < 0 && errno != EINTR) {
      return Fail(absl::Seconds(1), absl::InternalError("poll failed"));
    }
    if (!ready_) {
      // Also what an earlier read left unscanned (LISTENING's read may have brought READY).
      if (fds[1].revents & (POLLIN | POLLHUP)) ReadStdout(router_);
      TakeRouterReady();
    }
    if (store_starting_ && (fds[2].revents & (POLLIN | POLLHUP))) TakeStoreReady();
    if (!(fds[0].revents & POLLIN)) continue;
    signalfd_siginfo info;
    if (::read(signal_fd, &info, sizeof(info)) != sizeof(info)) continue;
    const int signal = static_cast<int>(info.ssi_signo);
    if (signal == SIGINT || signal == SIGTERM) {
      StatusLine(absl::StrCat("signal ", signal, ", stopping the cluster"));
      if (StopAll(absl::Seconds(c_.drain_timeout_s + 10)) != 0) {
        return absl::DeadlineExceededError("the router could not finish every request in time");
      }
      return absl::OkStatus();
    }
    // Reap whatever exited.
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) RETURN_IF_ERROR(OnExit(pid, status));
  }
}

}  // namespace

absl::Status RunCluster(const SupervisorOptions& options, std::ostream& out) {
  ClusterConfig c = options.cluster;
  if (c.model.empty())
    return absl::InvalidArgumentError("--model (or model: in --config) is required");
  if (c.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  ASSIGN_OR_RETURN(std::string router_device, RouterDevice(c));
  if (c.max_batch_tokens == 0) c.max_batch_tokens = DefaultMaxBatchTokens(router_device);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Supervisor supervisor(options, std::move(c), std::move(router_device), out);
  RETURN_IF_ERROR(supervisor.Prepare());
  RETURN_IF_ERROR(supervisor.StartProcesses());
  return supervisor.Supervise(signals);
}

}  // namespace strata
