// Programmatic dependent launch (Hopper): a kernel launched by LaunchPdl may be scheduled while
// the kernel before it on the stream is still running, so its launch and its first loads of
// data that kernel does not write (weights) overlap that kernel's tail. Such a kernel calls
// PdlWait() before it reads or writes anything the kernels before it touch, and
// PdlLaunchDependents() as soon as the next kernel may be scheduled. PdlWait is a no-op when the
// kernel was launched normally; PdlLaunchDependents is not (a following LaunchPdl kernel may
// then start early), which is safe because every LaunchPdl kernel waits before it touches what
// earlier kernels write or read.
//
// One exception: data that was final before the previous kernel's wait returned may be read
// before the wait, when every block of that kernel lets the next in only after its own wait.
// The one-token experts' down kernel reads the routing so, behind the gate/up kernel; moving
// gate/up's PdlLaunchDependents ahead of its wait, or a kernel between the two, would make that
// a race (cuda_ops_test's OneTokenExpertsReadTheRoutingOnlyOnceItIsFinal fails then).
//
// Below sm_90 both compile to nothing: device code must be built for sm_90 (a PTX-only older
// target JIT-compiled on Hopper would not wait). Included only by nvcc-compiled sources.
#ifndef STRATA_COMMON_CUDA_PDL_CUH_
#define STRATA_COMMON_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <utility>

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

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to start early, in clusters of
// `cluster_blocks` blocks along x when that is over 1 (the kernel must not fix its own with
// __cluster_dims__). The kernel must follow the rules above.
template <typename... Params, typename... Args>
cudaError_t LaunchPdlInClusters(void (*kernel)(Params...), dim3 grid, dim3 block,
                                unsigned cluster_blocks, size_t shared_bytes, cudaStream_t stream,
                                Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cluster_blocks > 1) {
    attribute[1].id = cudaLaunchAttributeClusterDimension;
    attribute[1].val.clusterDim.x = cluster_blocks;
    attribute[1].val.clusterDim.y = 1;
    attribute[1].val.clusterDim.z = 1;
    config.numAttrs = 2;
  }
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (launched != cudaSuccess) cudaGetLastError();  // reported here, not by a later launch
  return launched;
}

template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  return LaunchPdlInClusters(kernel, grid, block, 1, shared_bytes, stream,
                             std::forward<Args>(args)...);
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_PDL_CUH_
