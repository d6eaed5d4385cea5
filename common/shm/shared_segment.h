// A named POSIX shared-memory segment (Boost.Interprocess shared_memory_object) mapped into
// this process. The router and the expert workers exchange activations through these.
#ifndef STRATA_COMMON_SHM_SHARED_SEGMENT_H_
#define STRATA_COMMON_SHM_SHARED_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "boost/interprocess/interprocess_fwd.hpp"

namespace strata {

// Move-only; unmaps on destruction. The creator also removes the name on destruction unless
// told otherwise, so a crashed test or a clean shutdown does not leave /dev/shm litter (a
// SIGKILLed creator still leaks it; callers pick unique names and may Remove() stale ones).
//
// Trust: /dev/shm is shared by every local user. A segment is created exclusively (O_EXCL)
// with mode 0600, and one is opened or removed only after fstat on the opened descriptor shows
// it is a regular file of this process's effective uid that nobody else may read or write, so
// a segment planted under an expected name by another user is refused, never used.
class SharedSegment {
 public:
  // Names are shm_open names without the leading slash: 1..200 characters, no '/'.
  // Creates a new segment of `bytes` (> 0) zeroed bytes, mode 0600; ALREADY_EXISTS if the
  // name is taken, RESOURCE_EXHAUSTED if /dev/shm cannot back it. With `reserve` the memory is
  // reserved up front so a full /dev/shm fails here rather than with SIGBUS on first touch;
  // without it the pages come on first touch (a caller that binds them to a NUMA node first).
  static absl::StatusOr<SharedSegment> Create(const std::string& name, size_t bytes,
                                              bool reserve = true);
  // Maps an existing segment whole. NOT_FOUND if absent, UNAVAILABLE if its creator has not
  // sized it yet (retry), PERMISSION_DENIED if it is not this user's own (see above).
  static absl::StatusOr<SharedSegment> Open(const std::string& name, bool read_only = false);
  // Removes a name; mappings stay valid until unmapped. NOT_FOUND if there was none,
  // PERMISSION_DENIED (and nothing removed) if it is not this user's own.
  static absl::Status Remove(const std::string& name);
  // The names of this user's own segments that start with `prefix` (a directory listing of
  // /dev/shm; others' segments are left out).
  static std::vector<std::string> ListOwned(const std::string& prefix);

  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  // Page-aligned base of the mapping.
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<uint8_t> span() { return absl::Span<uint8_t>(data_, size_); }
  const std::string& name() const { return name_; }
  bool read_only() const { return read_only_; }
  bool is_creator() const { return creator_; }

  // Creator only (FAILED_PRECONDITION otherwise): removes the name now, e.g. once the peer
  // has mapped it, so that not even a SIGKILL of both sides can leak it.
  absl::Status Unlink();
  // Whether the destructor removes the name; true for the creator by default.
  void set_remove_on_destroy(bool remove) { remove_on_destroy_ = remove; }

 private:
  SharedSegment(std::string name, std::unique_ptr<boost::interprocess::mapped_region> region,
                bool read_only, bool creator);
  // A mapping Open made itself (munmap on destruction).
  SharedSegment(std::string name, uint8_t* data, size_t size, bool read_only);
  void Reset();

  std::string name_;
  std::unique_ptr<boost::interprocess::mapped_region> region_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool read_only_ = false;
  bool creator_ = false;
  bool remove_on_destroy_ = false;
  bool unlinked_ = false;
};

}  // namespace strata

#endif  // STRATA_COMMON_SHM_SHARED_SEGMENT_H_
