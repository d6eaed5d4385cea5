// Device memory that grows and shrinks in place: a range of device addresses reserved once, of
// which a leading part is backed by physical memory (the CUDA driver's virtual memory
// management). Pointers into it stay valid across Commit, so CUDA graphs and device tables that
// captured them need no update; the memory Commit gives back is free for any process on the
// device (a worker's expert slots lent to the router's KV pool, and back).
#ifndef STRATA_COMMON_CUDA_VIRTUAL_DEVICE_MEMORY_H_
#define STRATA_COMMON_CUDA_VIRTUAL_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::gpu {

class VirtualDeviceMemory {
 public:
  VirtualDeviceMemory() = default;
  ~VirtualDeviceMemory() { Reset(); }
  VirtualDeviceMemory(const VirtualDeviceMemory&) = delete;
  VirtualDeviceMemory& operator=(const VirtualDeviceMemory&) = delete;
  VirtualDeviceMemory(VirtualDeviceMemory&& other) noexcept;
  VirtualDeviceMemory& operator=(VirtualDeviceMemory&& other) noexcept;

  // Reserves `capacity` bytes of addresses on `device` (nothing backed yet) and commits
  // `committed` of them. The range is backed in chunks of at least the driver's granularity
  // (2 MiB on current GPUs), at most ~1024 chunks over the capacity.
  static absl::StatusOr<VirtualDeviceMemory> Create(int device, size_t capacity, size_t committed);

  uint8_t* data() const { return base_; }
  size_t capacity() const { return capacity_; }
  // Bytes backed now, from data(): whole chunks, at least what the last Commit asked for.
  size_t committed() const { return chunks_.size() * chunk_; }
  size_t chunk_bytes() const { return chunk_; }

  // Backs [0, bytes) (bytes <= capacity): maps chunks past the backed end, or unmaps and
  // releases the chunks wholly past `bytes`. The caller makes sure nothing still reads or
  // writes what is released (synchronize the streams first). RESOURCE_EXHAUSTED when the device
  // has not the memory to grow; what was mapped before stays.
  absl::Status Commit(size_t bytes);

 private:
  void Reset();

  int device_ = 0;
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0;  // reserved, a multiple of chunk_
  size_t chunk_ = 0;
  std::vector<unsigned long long> chunks_;  // CUmemGenericAllocationHandle, mapped in order
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_VIRTUAL_DEVICE_MEMORY_H_
