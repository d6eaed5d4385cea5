// A stream-ordered wait on a flag as a one-warp kernel that polls it, instead of the driver's
// wait operation: the kernels on either side keep their programmatic dependent launch (a wait
// operation between two kernels ends it) and the wake-up is a load, not the front end's poll.
// Only for processes that share the GPU under MPS: without it a polling kernel holds its time
// slice while the process that would raise the flag cannot run.
#ifndef STRATA_COMMON_CUDA_FLAG_POLL_KERNELS_H_
#define STRATA_COMMON_CUDA_FLAG_POLL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::gpu {

// Work queued on `stream` after this runs once *flag >= value and sees what was written before
// the flag was raised (the raiser fences at system scope first). The kernels before it on the
// stream finish first, so a flag they lower is read only after it is lowered. The next kernel
// is let in only once the flag is up: launched early, its blocks would wait on the GPU's
// resources while the flag's raiser may need them. trigger_early lets the next kernel in at
// once (the tests hold chains of launches back with it).
cudaError_t LaunchFlagPoll(const uint32_t* flag, uint32_t value, cudaStream_t stream,
                           bool trigger_early = false);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_FLAG_POLL_KERNELS_H_
