// Whether the decode kernels are launched with programmatic dependent launch (pdl.cuh).
#ifndef STRATA_COMMON_BACKEND_CUDA_PDL_H_
#define STRATA_COMMON_BACKEND_CUDA_PDL_H_

namespace strata::gpu {

// On unless the environment has STRATA_PDL=0 (read once): the off switch is for comparing and for
// ruling it out when a kernel misbehaves.
bool ProgrammaticLaunch();

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_PDL_H_
