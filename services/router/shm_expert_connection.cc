#include "services/router/shm_expert_connection.h"

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ShmExpertConnection>> ShmExpertConnection::Create(
    const std::string& name, int max_tokens, int top_k, int hidden_size, uint32_t spin_us,
    absl::Duration heartbeat_timeout) {
  ShmChannelOptions options;
  // One layer in flight, room to queue the next, and a prefetch hint between them.
  options.slots = 4;
  options.spin_us = spin_us;
  options.slot_bytes = ExpertSlotBytes(max_tokens, top_k, hidden_size);
  options.heartbeat_timeout = heartbeat_timeout;
  SharedSegment::Remove(name).IgnoreError();  // a stale channel of a crashed router
  auto channel = ShmChannel::Create(name, options);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<ShmExpertConnection>(new ShmExpertConnection(*std::move(channel)));
}

bool ShmExpertConnection::Alive() const {
  // A channel this side closed is gone at once, whatever the worker is still doing.
  return !channel_.outbound().closed() && channel_.PeerAlive();
}

std::optional<ExpertConnection::Process> ShmExpertConnection::LocalProcess() const {
  if (channel_.peer_pid() <= 0) return std::nullopt;
  return Process{.pid = channel_.peer_pid(), .start_time = channel_.peer_start_time()};
}

absl::Status ShmExpertConnection::PeerStatus() const {
  if (channel_.outbound().closed()) return absl::UnavailableError("its channel was closed");
  return channel_.PeerStatus();
}

absl::Status ShmExpertConnection::Send(const ExpertRequestView& request) {
  if (!unlinked_ && channel_.PeerStatus().ok()) {
    // Both sides have it mapped: drop the name so a crash of either leaves nothing behind.
    channel_.segment().Unlink().IgnoreError();
    unlinked_ = true;
  }
  const size_t bytes = EncodedSize(request);
  auto slot = channel_.outbound().Reserve(bytes, absl::Seconds(10));
  if (!slot.ok()) {
    return absl::UnavailableError(
        absl::StrCat("expert channel ", channel_.name(), ": ", slot.status().message()));
  }
  EncodeExpertRequest(request, *slot);
  return channel_.outbound().Commit(bytes);
}

absl::Status ShmExpertConnection::Prefetch(uint32_t layer, absl::Span<const int32_t> experts) {
  ExpertRequestView hint;
  hint.kind = ExpertMessageKind::kPrefetch;
  hint.layer = layer;
  hint.top_k = static_cast<uint32_t>(experts.size());
  hint.experts = experts;
  return Send(hint);
}

absl::Status ShmExpertConnection::Receive(
    absl::FunctionRef<void(const ExpertResponseView&)> consume, absl::Duration timeout) {
  auto bytes = channel_.inbound().Peek(timeout);
  if (!bytes.ok()) {
    return absl::UnavailableError(
        absl::StrCat("expert channel ", channel_.name(), ": ", bytes.status().message()));
  }
  auto response = DecodeExpertResponse(*bytes);
  if (!response.ok()) return response.status();
  consume(*response);
  return channel_.inbound().Pop();
}

}  // namespace strata
