// Whether the decode kernels are launched with programmatic dependent launch (pdl.cuh).
#ifndef STRATA_COMMON_BACKEND_CUDA_PDL_H_
#define STRATA_COMMON_BACKEND_CUDA_PDL_H_

namespace strata::gpu {

// On when the environment has STRATA_PDL=1 (read once): an experiment until it is measured.
bool ProgrammaticLaunch();

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_PDL_H_
