// Stream-ordered waits on 32-bit flags in device memory, and fills of them (the driver's stream
// memory operations). Two processes that share a flag word by CUDA IPC order their streams
// through it without a host round trip, and a wait can be captured in a CUDA graph (an
// interprocess event cannot: a captured wait would see the record of the capture's time). The
// flags are raised by kernels (grid_signal.h).
#ifndef STRATA_COMMON_CUDA_STREAM_FLAGS_H_
#define STRATA_COMMON_CUDA_STREAM_FLAGS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::gpu {

// Work queued on `stream` after this waits until *flag >= value (a flag released for good, see
// kFlagReleased, passes every wait): in a process under MPS by a polling kernel
// (flag_poll_kernels.h), which keeps the chain of programmatic dependent launches going;
// otherwise, or with the tunable flag_wait_memop (STRATA_FLAG_WAIT=memop), by the driver's wait
// operation.
absl::Status WaitFlag(cudaStream_t stream, const uint32_t* flag, uint32_t value);

// Whether WaitFlag polls with a kernel (CUDA_MPS_PIPE_DIRECTORY set and flag_wait_memop off;
// read once).
bool FlagWaitsPoll();

// Whether flags between processes on one GPU may be raised at device scope (GridSignal::system
// false): only when the waits are polling kernels (the driver's wait operations are no thread of
// a scope), and not with the tunable system_scope_signals (STRATA_SIGNAL_SCOPE=system, for
// comparisons and as a fallback). Read once. The router decides for both sides of a link
// (CudaIpcBuffers.device_scope_flags).
bool DeviceScopeSignalsAllowed();

// Sets count flags to `value` on `stream` (no fence; for releasing a stuck waiter).
absl::Status FillFlags(cudaStream_t stream, uint32_t* flags, uint32_t value, size_t count);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_STREAM_FLAGS_H_
