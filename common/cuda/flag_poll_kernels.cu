#include "common/cuda/flag_poll_kernels.h"
#include "common/cuda/grid_signal.cuh"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

__global__ void __launch_bounds__(32)
    FlagPollKernel(const uint32_t* flag, uint32_t value, bool trigger_early) {
  if (trigger_early) PdlLaunchDependents();
  PdlWait();  // the kernels before may lower the flag
  if (threadIdx.x == 0) {
    while (LoadFlagAcquire(flag) < value) {
    }
  }
  __syncwarp();
  PdlLaunchDependents();
}

}  // namespace

cudaError_t LaunchFlagPoll(const uint32_t* flag, uint32_t value, cudaStream_t stream,
                           bool trigger_early) {
  if (flag == nullptr) return cudaErrorInvalidValue;
  return LaunchPdl(FlagPollKernel, dim3(1), dim3(32), 0, stream, flag, value, trigger_early);
}

}  // namespace strata::gpu
