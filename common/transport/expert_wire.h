// The per-layer messages between router and expert worker, as flat little-endian bytes for a
// shared-memory slot: a fixed header, then the arrays. Views point into the buffer they were
// decoded from, so a worker reads a request in place. Versioned with every other message between
// the processes by kClusterProtocolVersion (common/cluster/protocol_version.h).
#ifndef STRATA_COMMON_TRANSPORT_EXPERT_WIRE_H_
#define STRATA_COMMON_TRANSPORT_EXPERT_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

// A worker's expert-tier counters since it started (strata.v1.TierCounters); every response
// carries them so the router always has a recent copy to report.
struct TierCounters {
  uint64_t hot_hits = 0;
  uint64_t warm_hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_copied = 0;
  uint64_t evictions = 0;
  uint64_t prefetch_loads = 0;
  uint64_t prefetch_hits = 0;
  uint64_t cpu_tier_experts = 0;
  uint32_t hot_slots = 0;
  uint32_t warm_slots = 0;
  uint64_t slot_bytes = 0;
  // Slots whose memory the worker has given back to the router's KV pool (ExpertRequestView::
  // lent_slots, as far as the worker could).
  uint32_t lent_slots = 0;
  uint32_t reserved = 0;
};

enum class ExpertMessageKind : uint32_t {
  kRun = 0,       // run the experts, answer with a response
  kPrefetch = 1,  // start loading `experts` of `layer`; no response
  // Run the experts on the device buffers shared at registration (CUDA IPC): the header only
  // (step, layer, num_tokens, top_k, hidden_size, hot_ratio); the answer is a device response.
  kDeviceRun = 2,
  // Replay the worker's graph for a whole decode step on the shared device buffers: for each
  // of `layers` in order, wait for the router's input flag, run, raise the output flag. The
  // header (step, num_tokens, top_k, hidden_size, hot_ratio) and the layer list; the answer,
  // a device response, comes once the replay is queued.
  kDeviceStep = 3,
};

// Router -> worker: the hidden states of the tokens that have at least one slot on this
// worker, and their routing (experts of other workers are -1). A prefetch message carries
// only the layer and the predicted expert ids (in `experts`; num_tokens and hidden_size 0,
// top_k the number of ids).
struct ExpertRequestView {
  ExpertMessageKind kind = ExpertMessageKind::kRun;
  // The share of its owned experts the worker keeps resident; negative leaves it unchanged.
  float hot_ratio = -1.0f;
  // Slots whose memory the worker gives back for the router's KV pool (on the router's device:
  // one budget for both); 0 takes it all back. Run and step requests only.
  uint32_t lent_slots = 0;
  uint64_t step = 0;
  uint32_t layer = 0;
  uint32_t num_tokens = 0;
  uint32_t top_k = 0;
  uint32_t hidden_size = 0;
  absl::Span<const float> hidden;     // [num_tokens, hidden_size]
  absl::Span<const int32_t> experts;  // [num_tokens, top_k]
  absl::Span<const float> weights;    // [num_tokens, top_k]
  absl::Span<const int32_t> layers;   // kDeviceStep only
};

// Worker -> router: the weighted sum of this worker's experts per token, or an error. A device
// response carries no partial: it is queued into the worker's output buffer, complete when the
// worker's interprocess event is.
struct ExpertResponseView {
  uint64_t step = 0;
  uint32_t layer = 0;
  uint32_t num_tokens = 0;
  uint32_t hidden_size = 0;
  bool on_device = false;           // the answer to a kDeviceRun
  absl::Span<const float> partial;  // [num_tokens, hidden_size]; empty on error or on_device
  absl::string_view error;          // non-empty when the worker failed the request
  TierCounters tiers;
};

// The error text a response carries at most: longer messages are cut to it.
inline constexpr size_t kMaxExpertErrorBytes = 4000;

size_t ExpertRequestBytes(uint32_t num_tokens, uint32_t top_k, uint32_t hidden_size);
size_t ExpertPrefetchBytes(uint32_t num_experts);
size_t ExpertDeviceRunBytes();
size_t ExpertDeviceStepBytes(uint32_t num_layers);
// The step in a request's header when the header is there and its magic right, else 0: a
// worker that cannot decode a request still answers its step.
uint64_t ExpertRequestStep(absl::Span<const uint8_t> bytes);
// A channel slot that holds any request or response of up to `max_tokens` tokens (errors
// included).
size_t ExpertSlotBytes(uint32_t max_tokens, uint32_t top_k, uint32_t hidden_size);
// The bytes EncodeExpertRequest writes for `r`, whatever its kind.
size_t EncodedSize(const ExpertRequestView& r);
size_t ExpertResponseBytes(uint32_t num_tokens, uint32_t hidden_size, size_t error_bytes = 0);
size_t ExpertDeviceResponseBytes(size_t error_bytes = 0);

// The answer to the request in `request_bytes` (`request` is its decoding, or why it has
// none): the request's header fields, or for an undecodable one only the step it names (the
// router waiting for it then fails at once); `partial` when `status` is ok, else the status's
// message cut to kMaxExpertErrorBytes, kept in `error`, which the view points into.
ExpertResponseView ExpertResponseFor(absl::Span<const uint8_t> request_bytes,
                                     const absl::StatusOr<ExpertRequestView>& request,
                                     const absl::Status& status, bool on_device,
                                     absl::Span<const float> partial, std::string& error);
// The bytes EncodeExpertResponse writes for `r`.
size_t EncodedSize(const ExpertResponseView& r);

// Encoders write exactly the bytes the *Bytes functions give (by kind, and on_device for a
// response); `out` must hold them.
void EncodeExpertRequest(const ExpertRequestView& request, absl::Span<uint8_t> out);
void EncodeExpertResponse(const ExpertResponseView& response, absl::Span<uint8_t> out);

// Decoders check the magic, the sizes and the array lengths against the buffer.
absl::StatusOr<ExpertRequestView> DecodeExpertRequest(absl::Span<const uint8_t> bytes);
absl::StatusOr<ExpertResponseView> DecodeExpertResponse(absl::Span<const uint8_t> bytes);

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_EXPERT_WIRE_H_
