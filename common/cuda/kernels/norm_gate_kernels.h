// What a decoder layer does between its attention and its experts, for a step of a few tokens,
// in one launch: residual += x, normed = RmsNorm(residual), the gate's logits from normed, and
// their top-k selection. As separate launches (LaunchAddRmsNorm, a GEMV, LaunchMoeGate) each
// waits for the one before to finish; at one token those waits, not the 0.5 MB of gate
// weights, were the cost.
#ifndef STRATA_COMMON_CUDA_KERNELS_NORM_GATE_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_NORM_GATE_KERNELS_H_

#include "common/cuda/cuda_types.h"
#include "common/cuda/grid_signal.h"
#include "common/cuda/kernels/expert_split_kernels.h"
#include "common/cuda/kernels/moe_gate_kernels.h"

namespace strata::gpu {

// Where the step goes besides the router's own buffers, for expert workers that read the
// router's device memory (CUDA IPC): what LaunchSplitRouting would do after the gate, done by
// the gate kernel's last block instead, one launch and one wait fewer. The normed rows are
// copied to `input`, each split target gets its copy of the routing (`owner`: [num_experts],
// the worker of each expert), and `signal` is raised once all of it is visible.
struct GateHandOff {
  bool active = false;
  bf16* input = nullptr;
  const int32_t* owner = nullptr;
  RoutingSplit split;
  GridSignal signal;
};

struct AddNormGateArgs {
  bf16* residual = nullptr;           // [n, hidden], += x (rounded to bf16)
  const bf16* x = nullptr;            // [n, hidden]
  const bf16* norm_weight = nullptr;  // [hidden]
  float eps = 1e-6f;
  bf16* normed = nullptr;           // [n, hidden] out: RmsNorm of the new residual; not residual
  const bf16* gate = nullptr;       // [num_experts, hidden] bf16, row-major
  const bf16* gate_bias = nullptr;  // [num_experts] or null
  float* logits = nullptr;          // [n, num_experts] out, float (before the temperature)
  int32_t* expert_ids = nullptr;    // [n, top_k] out, as LaunchMoeGate
  float* weights = nullptr;         // [n, top_k] out
  uint32_t* blocks_done = nullptr;  // one counter, zero between launches (left zero)
  int64_t n = 0;
  int64_t hidden = 0;
  GateHandOff hand_off;  // inactive: the router's buffers only
};

// Gives the router backend a layer's hand-off (implemented by the expert backend whose workers
// take it).
class GateHandOffSource {
 public:
  virtual ~GateHandOffSource() = default;
  // Fills `hand_off` (active) when layer `layer`'s step of n tokens is to be handed off: the
  // caller's gate kernel then does the split, and the source launches none for the layer.
  // Leaves it inactive otherwise.
  virtual void TakeHandOff(int layer, int64_t n, GateHandOff& hand_off) = 0;
};

// Whether a step of n tokens of this shape fits the fused launch: n <= 4, hidden a multiple of
// 8 and at most 4096, n x hidden x 4 bytes of shared memory at most 46 KB (with the kernel's
// static arrays, a block's 48 KB), valid gate params.
bool AddNormGateFits(int64_t n, int64_t hidden, const MoeGateParams& params);

// Whether LaunchAddNormGate takes these arguments: AddNormGateFits, every pointer it needs set
// and 16-byte aligned, normed apart from residual, and a valid hand-off when active.
bool AddNormGateAccepts(const AddNormGateArgs& args, const MoeGateParams& params);

// The residual and normed outputs are those of LaunchAddRmsNorm bit for bit; logits and the
// selection agree with a GEMV and LaunchMoeGate to float rounding (the dot products' order
// differs). One block per 8 experts; the last block to finish selects. cudaErrorInvalidValue
// unless AddNormGateAccepts.
cudaError_t LaunchAddNormGate(const AddNormGateArgs& args, const MoeGateParams& params,
                              cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_NORM_GATE_KERNELS_H_
