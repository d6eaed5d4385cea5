// Programmatic dependent launch (Hopper): a kernel launched by LaunchPdl may be scheduled while
// the kernel before it on the stream is still running, so its launch and its first loads of
// data that kernel does not write (weights) overlap that kernel's tail. Such a kernel calls
// PdlWait() before it reads or writes anything the kernels before it touch, and
// PdlLaunchDependents() as soon as the next kernel may be scheduled. Both are no-ops when the
// kernel was launched normally, and before sm_90. Included only by nvcc-compiled sources.
#ifndef STRATA_COMMON_BACKEND_CUDA_PDL_CUH_
#define STRATA_COMMON_BACKEND_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <utility>

#include "common/backend/cuda/pdl.h"

namespace strata::gpu {

// Blocks until the kernels this one depends on have finished and their writes are visible.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled (once every block of this one has called it
// or exited).
__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to start early when
// ProgrammaticLaunch() is on. The kernel must follow the rules above.
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = ProgrammaticLaunch() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_PDL_CUH_
