#include "common/cuda/stream_flags.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/cuda/driver_api.h"
#include "common/cuda/flag_poll_kernels.h"
#include "common/util/tunables.h"

namespace strata::gpu {
namespace {

struct DriverApi {
  CUresult (*wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*memset_d32_async)(CUdeviceptr, unsigned int, size_t, CUstream) = nullptr;
  bool ok = false;
};

const DriverApi& Driver() {
  static const DriverApi api = [] {
    DriverApi a;
    a.ok = FindDriverFunction("cuStreamWaitValue32", &a.wait_value32) &&
           FindDriverFunction("cuMemsetD32Async", &a.memset_d32_async);
    return a;
  }();
  return api;
}

absl::Status Unavailable() {
  return absl::UnavailableError("the CUDA driver has no stream memory operations");
}

CUdeviceptr Address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
CUstream Stream(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

}  // namespace

bool FlagWaitsPoll() {
  // Under MPS only: `strata up` runs its GPU processes under a private MPS daemon named by
  // CUDA_MPS_PIPE_DIRECTORY; without one a polling kernel would hold its time slice.
  static const bool poll =
      std::getenv("CUDA_MPS_PIPE_DIRECTORY") != nullptr && !GetTunables().flag_wait_memop;
  return poll;
}

bool DeviceScopeSignalsAllowed() {
  static const bool allowed = FlagWaitsPoll() && !GetTunables().system_scope_signals;
  return allowed;
}

absl::Status WaitFlag(cudaStream_t stream, const uint32_t* flag, uint32_t value) {
  if (FlagWaitsPoll()) {
    const cudaError_t launched = LaunchFlagPoll(flag, value, stream);
    if (launched == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("flag poll kernel launch: ", cudaGetErrorString(launched)));
  }
  const DriverApi& d = Driver();
  if (!d.ok) return Unavailable();
  return DriverStatus(
      d.wait_value32(Stream(stream), Address(flag), value, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue32");
}

absl::Status FillFlags(cudaStream_t stream, uint32_t* flags, uint32_t value, size_t count) {
  const DriverApi& d = Driver();
  if (!d.ok) return Unavailable();
  return DriverStatus(d.memset_d32_async(Address(flags), value, count, Stream(stream)),
                      "cuMemsetD32Async");
}

}  // namespace strata::gpu
