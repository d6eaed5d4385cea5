#include "services/expert-store/cpu_tier_service.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/transport/expert_executor.h"
#include "common/transport/expert_wire.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

// How often a waiting channel thread looks at stopping_.
constexpr absl::Duration kPoll = absl::Milliseconds(200);
// The worker creates the channel before it asks; this only covers a slow file system.
constexpr absl::Duration kOpenWait = absl::Seconds(1);

}  // namespace

struct CpuTierService::Channel {
  explicit Channel(ShmChannel c) : channel(std::move(c)) {}
  ShmChannel channel;
  std::thread thread;
  std::atomic<bool> done{false};
};

CpuTierService::CpuTierService(ModelConfig config, std::function<v1::ExpertLayout()> layout,
                               CpuTierOptions options)
    : config_(std::move(config)), layout_(std::move(layout)), options_(options) {}

CpuTierService::~CpuTierService() {
  stopping_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : channels_) c->thread.join();
  channels_.clear();  // detaches: the workers see UNAVAILABLE and copy instead
}

absl::Status CpuTierService::EnsureBackend() {
  std::lock_guard<std::mutex> lock(init_mu_);
  if (backend_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(experts_, MappedExperts::Map(layout_(), config_));
  pool_ = std::make_unique<ThreadPool>(options_.num_threads);
  backend_ = std::make_unique<CpuExpertBackend>(config_, *experts_, *pool_);
  Log(LogLevel::kInfo,
      absl::StrCat("CPU tier: experts mapped, ", pool_->num_threads(), " threads"));
  return absl::OkStatus();
}

absl::Status CpuTierService::Attach(const std::string& channel_name, pid_t pid) {
  if (channel_name.empty()) return absl::InvalidArgumentError("CPU tier: no channel name");
  if (stopping_.load()) return absl::UnavailableError("CPU tier: shutting down");
  RETURN_IF_ERROR(EnsureBackend());
  ASSIGN_OR_RETURN(ShmChannel channel,
                   ShmChannel::Open(channel_name, {.wait_for_creator = kOpenWait}));
  // A stale channel of an earlier worker with the same name must not be served.
  if (pid != 0 && channel.peer_pid() != pid) {
    return absl::FailedPreconditionError(absl::StrCat("CPU tier: channel ", channel_name,
                                                      " was created by pid ", channel.peer_pid(),
                                                      ", not ", pid));
  }
  RETURN_IF_ERROR(channel.PeerStatus());

  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError("CPU tier: shutting down");
  ReapLocked();
  channels_.push_back(std::make_unique<Channel>(std::move(channel)));
  Channel* c = channels_.back().get();
  c->thread = std::thread([this, c] {
    Serve(c->channel);
    c->done.store(true);
  });
  Log(LogLevel::kInfo,
      absl::StrCat("CPU tier: serving channel ", channel_name, " of pid ", c->channel.peer_pid()));
  return absl::OkStatus();
}

int CpuTierService::active_channels() {
  std::lock_guard<std::mutex> lock(mu_);
  ReapLocked();
  return static_cast<int>(channels_.size());
}

void CpuTierService::ReapLocked() {
  for (auto it = channels_.begin(); it != channels_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = channels_.erase(it);
    } else {
      ++it;
    }
  }
}

// Like WorkerServer::ServeChannel, except that a full response ring is waited out rather than
// ending the channel: a worker may collect late, and a dead one ends the wait anyway.
void CpuTierService::Serve(ShmChannel& channel) {
  ExpertExecutor executor(config_, *backend_);
  std::string error;  // the text an error response points into
  absl::Status ended;
  while (!stopping_.load()) {
    auto request_bytes = channel.inbound().Peek(kPoll);
    if (absl::IsDeadlineExceeded(request_bytes.status())) continue;
    if (!request_bytes.ok()) {  // the worker is gone
      ended = request_bytes.status();
      break;
    }
    auto request = DecodeExpertRequest(*request_bytes);
    absl::Status status = request.status();
    if (status.ok() && request->kind != ExpertMessageKind::kRun) {
      status = absl::DataLossError("CPU tier: only run requests are served");
    }
    if (status.ok() && ExpertResponseBytes(request->num_tokens, request->hidden_size) >
                           channel.outbound().slot_bytes()) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "CPU tier: a response of ", request->num_tokens, " tokens exceeds the channel's slots"));
    }
    // Beats around the work (the worker fails a wait on a store whose heartbeat stands still),
    // also after waiting for the backend behind another worker's request.
    channel.Heartbeat();
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(backend_mu_);
      channel.Heartbeat();
      status = executor.Run(*request);
    }
    channel.Heartbeat();
    const ExpertResponseView response = ExpertResponseFor(
        *request_bytes, request, status, /*on_device=*/false,
        absl::Span<const float>(executor.partial().data(), executor.partial().size()), error);
    const size_t bytes = EncodedSize(response);
    absl::StatusOr<absl::Span<uint8_t>> slot;
    do {
      slot = channel.outbound().Reserve(bytes, kPoll);
    } while (absl::IsDeadlineExceeded(slot.status()) && !stopping_.load());
    if (!slot.ok()) {
      ended = slot.status();
      break;
    }
    EncodeExpertResponse(response, *slot);
    ended = channel.outbound().Commit(bytes);
    if (ended.ok()) ended = channel.inbound().Pop();
    if (!ended.ok()) break;
  }
  Log(LogLevel::kInfo, absl::StrCat("CPU tier: channel ", channel.name(), " ended",
                                    ended.ok() ? "" : absl::StrCat(" (", ended.message(), ")")));
}

}  // namespace strata
