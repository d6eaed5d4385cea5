// The device side of GridSignal (grid_signal.h). Included by .cu files only.
#ifndef STRATA_COMMON_CUDA_GRID_SIGNAL_CUH_
#define STRATA_COMMON_CUDA_GRID_SIGNAL_CUH_

#include "common/cuda/grid_signal.h"

namespace strata::gpu {

// GridSignal::system picks the scope of the signal's fences and flag atomics.
__device__ __forceinline__ void SignalFence(bool system) {
  if (system) {
    __threadfence_system();
  } else {
    __threadfence();
  }
}
__device__ __forceinline__ void SignalLower(bool system, uint32_t* flag) {
  if (system) {
    atomicCAS_system(flag, 1u, 0u);
  } else {
    atomicCAS(flag, 1u, 0u);
  }
}
__device__ __forceinline__ void SignalRaise(bool system, uint32_t* flag) {
  if (system) {
    atomicExch_system(flag, 1u);
  } else {
    atomicExch(flag, 1u);
  }
}

// A flag's value, acquired at system scope (the raiser may be another process or GPU).
__device__ __forceinline__ uint32_t LoadFlagAcquire(const uint32_t* flag) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// The whole block waits until *flag >= 1: thread 0 polls, the barrier carries its acquire to the
// block's later loads. Call from every thread.
__device__ __forceinline__ void BlockWaitForFlag(const uint32_t* flag) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    while (LoadFlagAcquire(flag) < 1u) {
    }
  }
  __syncthreads();
}

// Thread 0 of the block that signals, once every write the readers need is ordered before
// this thread's next fence (its own, its block's through a barrier, other blocks' through a
// count it read): lowers, fences, raises.
__device__ __forceinline__ void RaiseSignal(const GridSignal& s) {
  for (int i = 0; i < s.count; ++i) SignalLower(s.system, s.clear[i]);
  // One fence before the raise: it orders the lowering (a reader must not see its flag go
  // down after the other side raised it again), this block's writes and, through the count
  // just read, every other block's.
  SignalFence(s.system);
  for (int i = 0; i < s.count; ++i) SignalRaise(s.system, s.raise[i]);
}

// Called by every thread of every block at the very end of a kernel (no early returns before
// it). The last block to arrive clears and raises the flags.
__device__ __forceinline__ void SignalGridDone(const GridSignal& s) {
  if (s.count == 0) return;
  // The block's writes are ordered before thread 0's by the barrier; thread 0's fence makes
  // them reach the flags' readers (cumulative; a worker on another GPU writes the router's
  // buffers through peer access, which needs system scope).
  __syncthreads();
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
  if (blocks > 1) {
    SignalFence(s.system);  // this block's writes before its count
    if (atomicAdd(s.done, 1u) != blocks - 1) return;
    *s.done = 0;
  }
  RaiseSignal(s);
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_GRID_SIGNAL_CUH_
