#include "common/backend/cuda/host_regions.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/util/process.h"

namespace strata::gpu {

HostRegions::~HostRegions() {
  cudaSetDevice(device_);
  for (const Region& r : regions_) cudaHostUnregister(const_cast<uint8_t*>(r.host));
}

absl::Status HostRegions::Register(absl::Span<const uint8_t> memory) {
  if (memory.empty()) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(mu_);
  for (const Region& r : regions_) {
    if (r.host == memory.data()) return absl::OkStatus();
  }
  // The store's segments are mapped read-only; such pages can only be registered read-only.
  int read_only = 0;
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device_));
  const unsigned flags =
      cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
  const cudaError_t err =
      cudaHostRegister(const_cast<uint8_t*>(memory.data()), memory.size(), flags);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for the next call's checks
    if (err != cudaErrorHostMemoryAlreadyRegistered) {
      Log(LogLevel::kWarning,
          absl::StrCat("cannot pin ", memory.size() >> 20,
                       " MiB of expert memory for cuda:", device_, " (", cudaGetErrorString(err),
                       "); loads from it go through the driver's staging copies"));
    }
    return absl::OkStatus();
  }
  Region region{memory.data(), memory.size(), nullptr};
  void* device_ptr = nullptr;
  if (cudaHostGetDevicePointer(&device_ptr, const_cast<uint8_t*>(memory.data()), 0) ==
      cudaSuccess) {
    region.device = static_cast<const uint8_t*>(device_ptr);
  } else {
    cudaGetLastError();
  }
  regions_.push_back(region);
  return absl::OkStatus();
}

absl::Status HostRegions::Unregister(absl::Span<const uint8_t> memory) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(regions_.begin(), regions_.end(),
                         [&](const Region& r) { return r.host == memory.data(); });
  if (it == regions_.end()) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaHostUnregister(const_cast<uint8_t*>(it->host)));
  regions_.erase(it);
  return absl::OkStatus();
}

const void* HostRegions::DeviceAddress(const void* p, size_t bytes) const {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Region& r : regions_) {
    if (r.device != nullptr && q >= r.host && bytes <= r.size &&
        static_cast<size_t>(q - r.host) <= r.size - bytes) {
      return r.device + (q - r.host);
    }
  }
  return nullptr;
}

}  // namespace strata::gpu
