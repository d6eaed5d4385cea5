#include "common/cuda/virtual_device_memory.h"

#include <cuda.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/driver_api.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

struct VmmApi {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_address)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  bool ok = false;
};

const VmmApi& Vmm() {
  static const VmmApi api = [] {
    VmmApi a;
    a.ok = FindDriverFunction("cuMemGetAllocationGranularity", &a.granularity) &&
           FindDriverFunction("cuMemAddressReserve", &a.reserve) &&
           FindDriverFunction("cuMemAddressFree", &a.free_address) &&
           FindDriverFunction("cuMemCreate", &a.create) &&
           FindDriverFunction("cuMemRelease", &a.release) &&
           FindDriverFunction("cuMemMap", &a.map) && FindDriverFunction("cuMemUnmap", &a.unmap) &&
           FindDriverFunction("cuMemSetAccess", &a.set_access);
    return a;
  }();
  return api;
}

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUdeviceptr Address(const uint8_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

VirtualDeviceMemory::VirtualDeviceMemory(VirtualDeviceMemory&& other) noexcept
    : device_(other.device_),
      base_(std::exchange(other.base_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      chunk_(std::exchange(other.chunk_, 0)),
      chunks_(std::move(other.chunks_)) {
  other.chunks_.clear();
}

VirtualDeviceMemory& VirtualDeviceMemory::operator=(VirtualDeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = other.device_;
    base_ = std::exchange(other.base_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    chunk_ = std::exchange(other.chunk_, 0);
    chunks_ = std::move(other.chunks_);
    other.chunks_.clear();
  }
  return *this;
}

absl::StatusOr<VirtualDeviceMemory> VirtualDeviceMemory::Create(int device, size_t capacity,
                                                                size_t committed) {
  const VmmApi& v = Vmm();
  if (!v.ok) return absl::UnavailableError("the CUDA driver has no virtual memory management");
  if (committed > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory: ", committed, " bytes committed of ", capacity, " reserved"));
  }
  const CUmemAllocationProp prop = DeviceProp(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(
      DriverStatus(v.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                   "cuMemGetAllocationGranularity"));
  granularity = std::max<size_t>(granularity, 1);
  VirtualDeviceMemory memory;
  memory.device_ = device;
  // About 1024 chunks at most: few mappings for a large range, little waste for a small one.
  const size_t wanted = std::max<size_t>(capacity / 1024, 1);
  memory.chunk_ = (wanted + granularity - 1) / granularity * granularity;
  memory.capacity_ =
      std::max<size_t>((capacity + memory.chunk_ - 1) / memory.chunk_, 1) * memory.chunk_;
  CUdeviceptr base = 0;
  // The driver's alignment (a chunk need not be a power of two; mappings only need granules).
  RETURN_IF_ERROR(DriverStatus(v.reserve(&base, memory.capacity_, 0, 0, 0), "cuMemAddressReserve"));
  memory.base_ = reinterpret_cast<uint8_t*>(base);
  RETURN_IF_ERROR(memory.Commit(committed));
  return memory;
}

absl::Status VirtualDeviceMemory::Commit(size_t bytes) {
  if (bytes > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory: ", bytes, " bytes asked of ", capacity_, " reserved"));
  }
  const VmmApi& v = Vmm();
  const size_t wanted = (bytes + chunk_ - 1) / chunk_;
  while (chunks_.size() > wanted) {
    const CUdeviceptr at = Address(base_) + (chunks_.size() - 1) * chunk_;
    RETURN_IF_ERROR(DriverStatus(v.unmap(at, chunk_), "cuMemUnmap"));
    RETURN_IF_ERROR(DriverStatus(v.release(chunks_.back()), "cuMemRelease"));
    chunks_.pop_back();
  }
  if (chunks_.size() == wanted) return absl::OkStatus();
  const CUmemAllocationProp prop = DeviceProp(device_);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  while (chunks_.size() < wanted) {
    CUmemGenericAllocationHandle handle = 0;
    const CUresult created = v.create(&handle, chunk_, &prop, 0);
    if (created == CUDA_ERROR_OUT_OF_MEMORY) {
      break;
    }
    RETURN_IF_ERROR(DriverStatus(created, "cuMemCreate"));
    const CUdeviceptr at = Address(base_) + chunks_.size() * chunk_;
    if (absl::Status mapped = DriverStatus(v.map(at, chunk_, 0, handle, 0), "cuMemMap");
        !mapped.ok()) {
      v.release(handle);
      return mapped;
    }
    // Each chunk usable as it is mapped: a failure further on leaves no chunk without access.
    if (absl::Status opened = DriverStatus(v.set_access(at, chunk_, &access, 1), "cuMemSetAccess");
        !opened.ok()) {
      v.unmap(at, chunk_);
      v.release(handle);
      return opened;
    }
    chunks_.push_back(handle);
  }
  if (chunks_.size() < wanted) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", device_, " is out of memory: ", (wanted - chunks_.size()) * chunk_ >> 20,
        " MiB more could not be backed"));
  }
  return absl::OkStatus();
}

void VirtualDeviceMemory::Reset() {
  if (base_ == nullptr) return;
  const VmmApi& v = Vmm();
  // Best effort: a destructor cannot report.
  for (size_t i = 0; i < chunks_.size(); ++i) {
    v.unmap(Address(base_) + i * chunk_, chunk_);
    v.release(chunks_[i]);
  }
  chunks_.clear();
  v.free_address(Address(base_), capacity_);
  base_ = nullptr;
  capacity_ = 0;
}

}  // namespace strata::gpu
