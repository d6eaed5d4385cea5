// TRANSPORT_CUDA_IPC: a router on a GPU and an expert worker on a GPU of the same host hand each
// MoE layer's activations to each other in device memory, without the host.
//
// The router owns every buffer, on its GPU (router_link.h), and shares them with the worker by
// CUDA IPC handles at registration (v1::CudaIpcBuffers); a worker on another GPU reaches them
// through peer access. Per worker: the routing of its experts (other workers' slots -1), its
// output, two interprocess events and a flag array; the layer's input is one buffer all workers
// read. The layout is versioned with every other message between the processes by
// kClusterProtocolVersion (common/cluster/protocol_version.h).
//
// Eager steps, a layer at a time: the router records input_ready after writing the input and
// routing and sends a kDeviceRun message; the worker's stream waits for that event, runs the
// experts into its output and records output_ready, and the worker answers once that is queued;
// the router's stream waits for output_ready and sums the partials.
//
// Decode steps replayed as CUDA graphs cannot send a message per layer: a captured layer's
// routing split raises the worker's input flag of that layer, the worker's captured graph
// waits for it, runs the experts, whose last kernel lowers it and raises the output flag,
// which the router's graph waits for. One kDeviceStep message per replay starts the worker's
// graph for the step's layers (worker_link.h).
#ifndef STRATA_COMMON_TRANSPORT_CUDA_IPC_LINK_VIEWS_H_
#define STRATA_COMMON_TRANSPORT_CUDA_IPC_LINK_VIEWS_H_

#include <cstddef>
#include <cstdint>

// cudaEvent_t, as the CUDA runtime declares it: plain C++ users need no CUDA headers.
typedef struct CUevent_st* cudaEvent_t;

namespace strata::cuda_ipc {

// The flag array: uint32 [2][num_layers], input flags then output flags.
inline constexpr size_t InputFlag(int layer) { return static_cast<size_t>(layer); }
inline constexpr size_t OutputFlag(int num_layers, int layer) {
  return static_cast<size_t>(num_layers) + static_cast<size_t>(layer);
}

// One link's buffers and events as a process addresses them: the router's own pointers, or a
// worker's after opening the handles.
struct LinkViews {
  int device = 0;  // the router's GPU, where the buffers live
  uint32_t max_tokens = 0;
  uint32_t top_k = 0;
  uint32_t hidden_size = 0;
  uint32_t num_layers = 0;
  void* input = nullptr;               // bf16 [max_tokens, hidden_size], shared by all workers
  int32_t* ids = nullptr;              // [max_tokens, top_k]; -1 for other workers' experts
  float* weights = nullptr;            // [max_tokens, top_k]
  void* output = nullptr;              // bf16 [max_tokens, hidden_size]
  uint32_t* flags = nullptr;           // [2][num_layers]; null: no graph steps
  cudaEvent_t input_ready = nullptr;   // recorded by the router
  cudaEvent_t output_ready = nullptr;  // recorded by the worker
  // The worker runs on the router's GPU: both sides raise the flags at device scope.
  bool device_scope_flags = false;
};

}  // namespace strata::cuda_ipc

#endif  // STRATA_COMMON_TRANSPORT_CUDA_IPC_LINK_VIEWS_H_
