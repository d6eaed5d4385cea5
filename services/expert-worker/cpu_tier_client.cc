#include "services/expert-worker/cpu_tier_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/secure_random.h"
#include "common/util/status_macros.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {
namespace {

// Attaching is an shm_open and a thread start on the expert store's side, plus, the first time, the
// mapping of its segments.
constexpr auto kAttachDeadline = std::chrono::seconds(10);
constexpr absl::Duration kSubmitWait = absl::Seconds(10);
constexpr absl::Duration kStoreHeartbeatTimeout = absl::Seconds(3);

}  // namespace

absl::StatusOr<std::unique_ptr<CpuTierClient>> CpuTierClient::Connect(
    const std::string& store_address, const std::string& channel_name_prefix, int max_tokens,
    int top_k, int hidden_size, const ClusterToken& token) {
  if (max_tokens <= 0 || top_k <= 0 || hidden_size <= 0) {
    return absl::InvalidArgumentError("CPU tier: max_tokens, top_k and hidden_size must be > 0");
  }
  // A channel pairs with one opener once: every connection gets a name of its own, which no
  // other local user can guess and take first.
  ASSIGN_OR_RETURN(const std::string random, RandomHex(8));
  const std::string name = absl::StrCat(channel_name_prefix, "-", random);
  ShmChannelOptions options;
  options.slots = 2;  // one layer in flight, plus room to queue the next
  options.slot_bytes = ExpertSlotBytes(max_tokens, top_k, hidden_size);
  // An expert store that stops answering (stopped, stuck) fails the wait within this, and the
  // worker copies those experts in instead; the expert store beats for every request it takes and
  // answers.
  options.heartbeat_timeout = kStoreHeartbeatTimeout;
  auto channel = ShmChannel::Create(name, options);
  if (!channel.ok()) return channel.status();

  auto stub = v1::ExpertStore::NewStub(
      grpc::CreateChannel(store_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kAttachDeadline);
  token.Attach(context);
  v1::AttachComputeRequest request;
  request.set_channel_name(name);
  request.set_pid(static_cast<uint32_t>(::getpid()));
  v1::AttachComputeResponse response;
  const grpc::Status s = stub->AttachCompute(&context, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("CPU tier at ", store_address, ": ", s.error_message()));
  }
  // The expert store opened it before answering; this only catches it dying right after.
  if (absl::Status peer = channel->WaitForPeer(absl::Seconds(1)); !peer.ok()) return peer;
  // Both sides have it mapped: drop the name so that a crash of either leaves nothing behind.
  channel->segment().Unlink().IgnoreError();
  return std::unique_ptr<CpuTierClient>(
      new CpuTierClient(*std::move(channel), static_cast<uint32_t>(hidden_size)));
}

absl::Status CpuTierClient::Submit(const ExpertRequestView& request) {
  if (abandoned()) return absl::UnavailableError("CPU tier: the channel was given up");
  if (request.kind != ExpertMessageKind::kRun) {
    return absl::InvalidArgumentError("CPU tier: only run requests");
  }
  if (request.hidden_size != hidden_size_ ||
      request.hidden.size() != size_t{request.num_tokens} * request.hidden_size ||
      request.experts.size() != size_t{request.num_tokens} * request.top_k ||
      request.weights.size() != request.experts.size()) {
    return absl::InvalidArgumentError("CPU tier: request arrays do not match its sizes");
  }
  const size_t bytes = ExpertRequestBytes(request.num_tokens, request.top_k, request.hidden_size);
  if (bytes > channel_.outbound().slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU tier: a request of ", request.num_tokens,
                                                   " tokens exceeds the channel's slots"));
  }
  auto slot = channel_.outbound().Reserve(bytes, kSubmitWait);
  if (!slot.ok()) {
    return absl::UnavailableError(
        absl::StrCat("CPU tier channel ", name_, ": ", slot.status().message()));
  }
  EncodeExpertRequest(request, *slot);
  {
    // Before Commit: Collect may see the response as soon as it is committed.
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({request.step, request.layer, request.num_tokens});
  }
  absl::Status committed = channel_.outbound().Commit(bytes);
  if (!committed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.pop_back();
    return absl::UnavailableError(
        absl::StrCat("CPU tier channel ", name_, ": ", committed.message()));
  }
  return absl::OkStatus();
}

absl::Status CpuTierClient::Collect(Tensor& partial, absl::Duration timeout) {
  if (abandoned()) return absl::UnavailableError("CPU tier: the channel was given up");
  Pending expected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return absl::FailedPreconditionError("CPU tier: nothing submitted");
    expected = pending_.front();
  }
  // In slices: while the expert store computes, each slice tells the waiting worker's liveness so.
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<absl::Span<const uint8_t>> bytes;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    bytes = channel_.inbound().Peek(
        std::max(absl::ZeroDuration(), std::min(left, absl::Milliseconds(100))));
    if (!absl::IsDeadlineExceeded(bytes.status()) || left <= absl::Milliseconds(100)) break;
    if (on_wait_) on_wait_();
  }
  if (absl::IsDeadlineExceeded(bytes.status())) return bytes.status();
  if (!bytes.ok()) {
    return absl::UnavailableError(
        absl::StrCat("CPU tier channel ", name_, ": ", bytes.status().message()));
  }
  auto response = DecodeExpertResponse(*bytes);
  absl::Status status = response.status();
  if (status.ok() && response->error.empty()) {
    if (response->step != expected.step || response->layer != expected.layer ||
        response->num_tokens != expected.num_tokens || response->hidden_size != hidden_size_) {
      status = absl::DataLossError(absl::StrCat(
          "CPU tier: response for step ", response->step, " layer ", response->layer,
          " does not answer the request for step ", expected.step, " layer ", expected.layer));
    } else {
      partial.Resize(response->num_tokens, response->hidden_size);
      std::memcpy(partial.data(), response->partial.data(),
                  response->partial.size() * sizeof(float));
    }
  } else if (status.ok()) {
    status = absl::InternalError(absl::StrCat("CPU tier: ", response->error));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.pop_front();
  }
  if (absl::Status popped = channel_.inbound().Pop(); !popped.ok()) return popped;
  return status;
}

bool CpuTierClient::Alive() const { return channel_.PeerAlive(); }

int CpuTierClient::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pending_.size());
}

namespace {

// A kRun request of n tokens over the caller's arrays.
ExpertRequestView RunRequest(int layer, int64_t n, int top_k, int hidden_size,
                             absl::Span<const float> x, absl::Span<const int32_t> ids,
                             absl::Span<const float> weights) {
  ExpertRequestView request;
  request.layer = static_cast<uint32_t>(layer);
  request.num_tokens = static_cast<uint32_t>(n);
  request.top_k = static_cast<uint32_t>(top_k);
  request.hidden_size = static_cast<uint32_t>(hidden_size);
  request.hidden = x;
  request.experts = ids;
  request.weights = weights;
  return request;
}

}  // namespace

absl::Status CpuHostTier::Submit(int layer, int64_t n, int top_k, absl::Span<const float> x,
                                 absl::Span<const int32_t> ids, absl::Span<const float> weights) {
  return client_.Submit(RunRequest(layer, n, top_k, hidden_, x, ids, weights));
}

absl::Status CpuHostTier::Collect(Tensor& partial) {
  return client_.Collect(partial, absl::Seconds(30));
}

absl::StatusOr<double> TimeCpuTierExpert(CpuTierClient& client,
                                         absl::Span<const std::pair<int, int>> experts, int tokens,
                                         int top_k, int hidden_size) {
  if (experts.size() < 2 || top_k <= 0 || tokens <= 0) {
    return absl::InvalidArgumentError("CPU tier timing: two experts and a token at least");
  }
  std::vector<float> hidden(static_cast<size_t>(tokens) * hidden_size, 0.01f);
  std::vector<float> weights(static_cast<size_t>(tokens) * top_k, 0.0f);
  std::vector<int32_t> ids(static_cast<size_t>(tokens) * top_k, -1);
  for (int t = 0; t < tokens; ++t) weights[t * top_k] = 1.0f;
  ExpertRequestView request = RunRequest(0, tokens, top_k, hidden_size, hidden, ids, weights);
  Tensor partial;
  std::vector<double> seconds;
  // Two passes, the second timed: the first read of an expert also maps its pages into
  // strata-expert-store (a fault per page), which a serving CPU tier has long done for the experts
  // it computes; the others read in between have evicted it from the CPU's caches.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [layer, expert] : experts) {
      request.layer = static_cast<uint32_t>(layer);
      for (int t = 0; t < tokens; ++t) ids[t * top_k] = expert;
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(client.Submit(request));
      RETURN_IF_ERROR(client.Collect(partial, absl::Seconds(30)));
      if (pass == 1) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace strata
