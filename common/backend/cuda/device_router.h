// What a router backend on a GPU offers beyond RouterBackend (RouterBackend::device_router()):
// its device context, decode steps captured and replayed as CUDA graphs, and the hand-off of
// captured MoE layers from its gate kernel to CUDA IPC workers.
#ifndef STRATA_COMMON_BACKEND_CUDA_DEVICE_ROUTER_H_
#define STRATA_COMMON_BACKEND_CUDA_DEVICE_ROUTER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/row_sampling.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/kv/paged_kv_cache.h"

namespace strata::gpu {

class DeviceRouter {
 public:
  virtual ~DeviceRouter() = default;

  // The context whose stream every step runs on.
  virtual CudaContext* context() const = 0;

  // Decode-step graphs. In graph mode a step has fixed shapes, so one CUDA graph captured from a
  // forward pass replays every decode step of `sequences` sequences, one token each, sequence
  // i at row i: block tables are padded to cover `max_context` tokens, attention is planned for
  // `max_context` keys, and Logits leaves each row's greedy token in pinned memory
  // (decode_greedy(), [sequences], valid after the stream is synchronized) instead of copying
  // the rows to a host tensor; CopyDecodeLogits brings the rows themselves when a step needs
  // them. PrepareGraphs allocates what graphs of up to `max_sequences` sequences keep (again
  // only when no graph is kept: it frees the old buffers); then capture in graph mode and
  // leave it; before each replay, WriteDecodeInputs sets the step's inputs in the pinned
  // buffers the graph's copies read.
  //
  // Graphs read their inputs from one of two slots of pinned buffers and leave their greedy
  // tokens in that slot's: a graph captured for one slot can be launched while the other
  // slot's is still running, its inputs written meanwhile. A token of kPreviousGreedyToken
  // takes the greedy token the step before left on the device at that row (the step before
  // must have been a replay of the same rows). `sampling` (one per row, or none: every row
  // greedy) has the rows with a temperature draw their token on the device instead, from the
  // same logits, into the same place: the step after takes it as it takes a greedy one.
  static constexpr int kInputSlots = 2;
  static constexpr int32_t kPreviousGreedyToken = -1;
  virtual absl::Status PrepareGraphs(int max_context, int max_sequences) = 0;
  virtual absl::Status EnterGraphMode(int sequences, int slot) = 0;
  virtual void LeaveGraphMode() = 0;
  virtual absl::Status WriteDecodeInputs(int slot, absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> positions,
                                         absl::Span<const PagedKvCache::SequenceId> sequences,
                                         PagedKvCache& kv,
                                         absl::Span<const RowSampling> sampling) = 0;
  virtual const int32_t* decode_greedy(int slot) const = 0;
  // The last replayed step's logits, [sequences, vocab] in pinned memory with only `rows`
  // copied: copied and synchronized now, before anything else runs on the stream.
  virtual absl::StatusOr<const float*> CopyDecodeLogits(absl::Span<const int64_t> rows) = 0;

  // An expert backend that takes layers from the fused gate kernel (GateHandOffSource); it
  // must outlive the backend or be unset first. Null: none.
  virtual void SetGateHandOffSource(GateHandOffSource* source) = 0;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_DEVICE_ROUTER_H_
