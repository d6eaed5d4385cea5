// Host memory made visible to one GPU (cudaHostRegister, mapped, read-only where the device
// allows): copies from it run as DMA at PCIe speed, and kernels may read it in place through
// the device addresses it is mapped at. A tiered worker registers the expert store's memory so
// that loads into its slots are fast and cold experts can be read where they are.
#ifndef STRATA_COMMON_BACKEND_CUDA_HOST_REGIONS_H_
#define STRATA_COMMON_BACKEND_CUDA_HOST_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace strata::gpu {

class HostRegions {
 public:
  explicit HostRegions(int device) : device_(device) {}
  ~HostRegions();  // unregisters what is still registered
  HostRegions(const HostRegions&) = delete;
  HostRegions& operator=(const HostRegions&) = delete;

  // Registers `memory` (once; a no-op when it is already). Where the driver refuses (no
  // read-only registration, limits), logs a warning and returns OK: copies from it then go
  // through the driver's staging, and nothing in it is readable in place.
  absl::Status Register(absl::Span<const uint8_t> memory);
  // Undoes Register; the caller makes sure no copy or kernel still reads it.
  absl::Status Unregister(absl::Span<const uint8_t> memory);

  // The device address of host [p, p + bytes), or null when that range is not inside one
  // registered region.
  const void* DeviceAddress(const void* p, size_t bytes) const;

 private:
  struct Region {
    const uint8_t* host = nullptr;
    size_t size = 0;
    const uint8_t* device = nullptr;  // null: registered but not mapped
  };
  const int device_;
  mutable std::mutex mu_;
  std::vector<Region> regions_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_HOST_REGIONS_H_
