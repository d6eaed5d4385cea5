#include "common/cuda/clock_stamps.h"

namespace strata::gpu {
namespace {

__global__ void StampKernel(uint64_t* slot) {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *slot = now;
}

}  // namespace

cudaError_t LaunchClockStamp(uint64_t* slot, cudaStream_t stream) {
  StampKernel<<<1, 1, 0, stream>>>(slot);
  return cudaGetLastError();
}

}  // namespace strata::gpu
