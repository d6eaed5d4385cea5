#include "common/shm/channel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cluster/protocol_version.h"
#include "common/shm/process_liveness.h"
#include "common/util/status_macros.h"

namespace strata {
namespace shm_internal {

constexpr uint32_t kChannelMagic = 0x4E484353;  // "SCHN"
constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kChannelHeaderBytes = kPageBytes;  // rings start page-aligned

enum PartyState : uint32_t { kEmpty = 0, kAttaching = 1, kAttached = 2, kDetached = 3 };

// One per side. Written by that side (pid and start time once, before state turns
// kAttached with release), read by the other.
struct alignas(128) Party {
  std::atomic<uint32_t> state;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> start_time;
  std::atomic<uint64_t> heartbeat;
};

struct ChannelHeader {
  std::atomic<uint32_t> magic;  // stored last by Create, with release
  uint32_t version;
  uint64_t ring_bytes;
  uint64_t request_offset;
  uint64_t response_offset;
  Party parties[2];  // [0] creator, [1] opener
};
static_assert(sizeof(ChannelHeader) <= kChannelHeaderBytes);

class PeerMonitor : public ShmWaitObserver {
 public:
  PeerMonitor(Party* self, Party* peer, absl::Duration heartbeat_timeout)
      : self_(self), peer_(peer), heartbeat_timeout_(heartbeat_timeout) {}

  void Beat() { self_->heartbeat.fetch_add(1, std::memory_order_relaxed); }
  pid_t peer_pid() const { return peer_->pid.load(std::memory_order_acquire); }
  uint64_t peer_start_time() const { return peer_->start_time.load(std::memory_order_relaxed); }
  void MarkDetached() { self_->state.store(kDetached, std::memory_order_release); }
  // Whether a peer ever started to attach (it removes the channel's name when it does).
  bool PeerCame() const { return peer_->state.load(std::memory_order_acquire) != kEmpty; }

  absl::Status OnIdleSlice() override {
    Beat();
    absl::Status status = Status();
    // A peer that has not attached yet is not dead: keep waiting.
    return absl::IsFailedPrecondition(status) ? absl::OkStatus() : status;
  }

  absl::Status Status() {
    switch (peer_->state.load(std::memory_order_acquire)) {
      case kAttached:
        break;
      case kDetached:
        return absl::UnavailableError(
            absl::StrCat("shm channel peer (pid ", peer_pid(), ") detached"));
      default:
        return absl::FailedPreconditionError("shm channel peer has not attached yet");
    }
    const pid_t pid = peer_pid();
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    // Reading /proc costs microseconds and the router asks before and after every layer: a
    // peer found alive less than kAliveRecheck ago is taken as alive; a dead one stays dead.
    if (dead_ || !alive_seen_ || now - alive_at_ >= kAliveRecheck) {
      if (dead_ || !ProcessAlive(pid, peer_->start_time.load(std::memory_order_relaxed))) {
        dead_ = true;
        return absl::UnavailableError(absl::StrCat("shm channel peer process ", pid, " died"));
      }
      alive_seen_ = true;
      alive_at_ = now;
    }
    if (heartbeat_timeout_ == absl::InfiniteDuration()) return absl::OkStatus();
    const uint64_t beat = peer_->heartbeat.load(std::memory_order_relaxed);
    if (!seen_ || beat != last_beat_) {
      seen_ = true;
      last_beat_ = beat;
      last_change_ = now;
      return absl::OkStatus();
    }
    const absl::Duration still = absl::FromChrono(now - last_change_);
    if (still > heartbeat_timeout_) {
      stalled_.store(true);
      return absl::UnavailableError(absl::StrCat("shm channel peer process ", pid,
                                                 " stopped answering: no heartbeat for ",
                                                 absl::FormatDuration(still)));
    }
    return absl::OkStatus();
  }

  bool stalled() const { return stalled_.load(); }

 private:
  Party* const self_;
  Party* const peer_;
  const absl::Duration heartbeat_timeout_;
  static constexpr std::chrono::milliseconds kAliveRecheck{1};
  std::mutex mu_;  // PeerStatus may run on the producer and consumer threads at once
  bool dead_ = false;
  bool alive_seen_ = false;
  std::chrono::steady_clock::time_point alive_at_;
  bool seen_ = false;
  std::atomic<bool> stalled_{false};  // sticky: the heartbeat stood still too long once
  uint64_t last_beat_ = 0;
  std::chrono::steady_clock::time_point last_change_;
};

}  // namespace shm_internal

namespace {

using shm_internal::ChannelHeader;
using shm_internal::kChannelHeaderBytes;
using shm_internal::kPageBytes;
using shm_internal::Party;

uint64_t RoundUpToPage(uint64_t n) { return (n + kPageBytes - 1) / kPageBytes * kPageBytes; }

absl::Status ValidateLocal(absl::Duration wait_slice, absl::Duration heartbeat_timeout) {
  if (wait_slice <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shm channel: wait_slice must be positive");
  }
  // Sleeping waiters beat once a slice; a shorter timeout would kill healthy peers.
  if (heartbeat_timeout != absl::InfiniteDuration() && heartbeat_timeout < 2 * wait_slice) {
    return absl::InvalidArgumentError(
        "shm channel: heartbeat_timeout must be at least twice wait_slice");
  }
  return absl::OkStatus();
}

void Claim(Party& party) {
  const pid_t pid = ::getpid();
  party.pid.store(pid, std::memory_order_relaxed);
  party.start_time.store(ProcessStartTime(pid), std::memory_order_relaxed);
  party.heartbeat.store(0, std::memory_order_relaxed);
  party.state.store(shm_internal::kAttached, std::memory_order_release);
}

// Maps `name` and checks that it holds a complete channel. UNAVAILABLE / NOT_FOUND mean
// "not created yet" and are worth retrying.
absl::StatusOr<ChannelHeader*> MapChannel(const std::string& name, SharedSegment& segment) {
  if (segment.size() < kChannelHeaderBytes) {
    return absl::DataLossError(absl::StrCat("shm channel '", name, "' is too small"));
  }
  auto* header = std::launder(reinterpret_cast<ChannelHeader*>(segment.data()));
  const uint32_t magic = header->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    return absl::UnavailableError(absl::StrCat("shm channel '", name, "' is not ready yet"));
  }
  if (magic != shm_internal::kChannelMagic) {
    return absl::DataLossError(absl::StrCat("shm segment '", name, "' is not a channel"));
  }
  if (header->version != kClusterProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("shm channel '", name, "': version ",
                                                      header->version, ", this build speaks ",
                                                      kClusterProtocolVersion));
  }
  const uint64_t size = segment.size();
  for (uint64_t offset : {header->request_offset, header->response_offset}) {
    if (offset < kChannelHeaderBytes || offset % kPageBytes != 0 || offset > size ||
        header->ring_bytes > size - offset) {
      return absl::DataLossError(absl::StrCat("shm channel '", name, "': corrupt layout"));
    }
  }
  return header;
}

}  // namespace

ShmChannel::ShmChannel(SharedSegment segment, ChannelHeader* header, ShmRing request,
                       ShmRing response, bool creator, absl::Duration wait_slice,
                       absl::Duration heartbeat_timeout)
    : segment_(std::move(segment)),
      creator_(creator),
      monitor_(std::make_unique<shm_internal::PeerMonitor>(
          &header->parties[creator ? 0 : 1], &header->parties[creator ? 1 : 0], heartbeat_timeout)),
      request_(std::move(request)),
      response_(std::move(response)) {
  for (ShmRing* ring : {&request_, &response_}) {
    ring->set_wait_slice(wait_slice);
    ring->set_wait_observer(monitor_.get());
  }
}

ShmChannel::ShmChannel(ShmChannel&& other) noexcept = default;

ShmChannel& ShmChannel::operator=(ShmChannel&& other) noexcept {
  if (this != &other) {
    Detach();
    // Rings and monitor first: the old segment unmaps when replaced.
    request_ = std::move(other.request_);
    response_ = std::move(other.response_);
    monitor_ = std::move(other.monitor_);
    creator_ = other.creator_;
    segment_ = std::move(other.segment_);
  }
  return *this;
}

ShmChannel::~ShmChannel() { Detach(); }

void ShmChannel::Detach() {
  if (monitor_ == nullptr) return;  // moved from
  // The opener removed the name when it attached; a name of the same spelling now would be
  // someone else's segment.
  if (creator_ && monitor_->PeerCame()) {
    segment_.set_remove_on_destroy(false);
  }
  Close();
  monitor_->MarkDetached();
  monitor_.reset();
}

absl::StatusOr<ShmChannel> ShmChannel::Create(const std::string& name,
                                              const ShmChannelOptions& options) {
  RETURN_IF_ERROR(ValidateLocal(options.wait_slice, options.heartbeat_timeout));
  const ShmRingOptions ring_options{
      .slots = options.slots, .slot_bytes = options.slot_bytes, .spin_us = options.spin_us};
  ASSIGN_OR_RETURN(const uint64_t ring_need, ShmRing::RequiredBytes(ring_options));
  const uint64_t ring_bytes = RoundUpToPage(ring_need);
  ASSIGN_OR_RETURN(SharedSegment segment,
                   SharedSegment::Create(name, kChannelHeaderBytes + 2 * ring_bytes));

  auto* header = new (segment.data()) ChannelHeader();
  header->version = kClusterProtocolVersion;
  header->ring_bytes = ring_bytes;
  header->request_offset = kChannelHeaderBytes;
  header->response_offset = kChannelHeaderBytes + ring_bytes;
  ASSIGN_OR_RETURN(ShmRing request,
                   ShmRing::Initialize(segment.span().subspan(header->request_offset, ring_bytes),
                                       ring_options));
  ASSIGN_OR_RETURN(ShmRing response,
                   ShmRing::Initialize(segment.span().subspan(header->response_offset, ring_bytes),
                                       ring_options));
  Claim(header->parties[0]);
  header->magic.store(shm_internal::kChannelMagic, std::memory_order_release);
  return ShmChannel(std::move(segment), header, std::move(request), std::move(response),
                    /*creator=*/true, options.wait_slice, options.heartbeat_timeout);
}

absl::StatusOr<ShmChannel> ShmChannel::Open(const std::string& name,
                                            const ShmChannelOpenOptions& options) {
  RETURN_IF_ERROR(ValidateLocal(options.wait_slice, options.heartbeat_timeout));
  const absl::Time deadline = absl::Now() + options.wait_for_creator;
  for (absl::Duration backoff = absl::Microseconds(100);;
       backoff = std::min(backoff * 2, absl::Milliseconds(10))) {
    absl::StatusOr<SharedSegment> segment = SharedSegment::Open(name);
    absl::StatusOr<ChannelHeader*> header = segment.ok()
                                                ? MapChannel(name, *segment)
                                                : absl::StatusOr<ChannelHeader*>(segment.status());
    if (header.ok()) {
      ASSIGN_OR_RETURN(ShmRing request, ShmRing::Attach(segment->span().subspan(
                                            (*header)->request_offset, (*header)->ring_bytes)));
      ASSIGN_OR_RETURN(ShmRing response, ShmRing::Attach(segment->span().subspan(
                                             (*header)->response_offset, (*header)->ring_bytes)));
      Party& self = (*header)->parties[1];
      uint32_t expected = shm_internal::kEmpty;
      if (!self.state.compare_exchange_strong(expected, shm_internal::kAttaching,
                                              std::memory_order_acq_rel)) {
        return absl::FailedPreconditionError(
            absl::StrCat("shm channel '", name, "' already has (or had) a peer"));
      }
      Claim(self);
      // Paired for good: the name is no longer needed, and without it nothing can leak even if
      // both sides are killed (the creator leaves it alone once a peer came: Detach).
      SharedSegment::Remove(name).IgnoreError();
      return ShmChannel(*std::move(segment), *header, std::move(request), std::move(response),
                        /*creator=*/false, options.wait_slice, options.heartbeat_timeout);
    }
    const bool retryable =
        absl::IsNotFound(header.status()) || absl::IsUnavailable(header.status());
    if (!retryable || absl::Now() + backoff > deadline) return header.status();
    absl::SleepFor(backoff);
  }
}

absl::Status ShmChannel::PeerStatus() { return monitor_->Status(); }

absl::Status ShmChannel::WaitForPeer(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Status status = monitor_->Status();
    if (!absl::IsFailedPrecondition(status)) return status;  // attached, or gone again
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shm channel '", name(), "': no peer after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));  // start-up path: polling is fine
  }
}

pid_t ShmChannel::peer_pid() const { return monitor_->peer_pid(); }

uint64_t ShmChannel::peer_start_time() const { return monitor_->peer_start_time(); }

bool ShmChannel::PeerStalled() const { return monitor_->stalled(); }

void ShmChannel::Heartbeat() { monitor_->Beat(); }

void ShmChannel::Close() {
  request_.Close();
  response_.Close();
}

int ShmChannel::RemoveOrphans(const std::string& prefix) {
  int removed = 0;
  for (const std::string& name : SharedSegment::ListOwned(prefix)) {
    absl::StatusOr<SharedSegment> segment = SharedSegment::Open(name, /*read_only=*/true);
    if (!segment.ok()) continue;
    absl::StatusOr<ChannelHeader*> header = MapChannel(name, *segment);
    if (!header.ok()) continue;
    const Party& creator = (*header)->parties[0];
    if (ProcessAlive(creator.pid.load(std::memory_order_relaxed),
                     creator.start_time.load(std::memory_order_relaxed))) {
      continue;
    }
    removed += SharedSegment::Remove(name).ok() ? 1 : 0;
  }
  return removed;
}

}  // namespace strata
