#include "common/shm/shared_segment.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/interprocess/exceptions.hpp"
#include "boost/interprocess/mapped_region.hpp"
#include "boost/interprocess/permissions.hpp"
#include "boost/interprocess/shared_memory_object.hpp"

namespace strata {
namespace {

namespace bip = boost::interprocess;

constexpr size_t kMaxNameLength = 200;
constexpr uintptr_t kPageBytes = 4096;

absl::Status ValidateName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory name must have 1..", kMaxNameLength, " characters"));
  }
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory name '", name, "' must not contain '/' or NUL"));
  }
  return absl::OkStatus();
}

// Boost reports failures by exception; nothing may escape this library, so each is mapped
// to the closest canonical code.
absl::Status FromBoost(const bip::interprocess_exception& e, const std::string& name,
                       const char* what) {
  const std::string message = absl::StrCat("shm '", name, "': ", what, ": ", e.what());
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return absl::AlreadyExistsError(message);
    case bip::not_found_error:
    case bip::not_such_file_or_directory:
      return absl::NotFoundError(message);
    case bip::security_error:
      return absl::PermissionDeniedError(message);
    case bip::out_of_space_error:
    case bip::out_of_memory_error:
    case bip::out_of_resource_error:
      return absl::ResourceExhaustedError(message);
    case bip::invalid_argument:
    case bip::size_error:
      return absl::InvalidArgumentError(message);
    default:
      break;
  }
  // Boost leaves some errnos untranslated (system_error / other_error).
  switch (e.get_native_error()) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CheckAligned(const void* base, const std::string& name) {
  if (reinterpret_cast<uintptr_t>(base) % kPageBytes != 0) {
    return absl::InternalError(absl::StrCat("shm '", name, "': mapping is not page aligned"));
  }
  return absl::OkStatus();
}

}  // namespace

SharedSegment::SharedSegment(std::string name, std::unique_ptr<bip::mapped_region> region,
                             bool read_only, bool creator)
    : name_(std::move(name)),
      region_(std::move(region)),
      data_(static_cast<uint8_t*>(region_->get_address())),
      size_(region_->get_size()),
      read_only_(read_only),
      creator_(creator),
      remove_on_destroy_(creator) {}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)),
      region_(std::move(other.region_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      read_only_(other.read_only_),
      creator_(std::exchange(other.creator_, false)),
      remove_on_destroy_(std::exchange(other.remove_on_destroy_, false)),
      unlinked_(other.unlinked_) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    region_ = std::move(other.region_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    read_only_ = other.read_only_;
    creator_ = std::exchange(other.creator_, false);
    remove_on_destroy_ = std::exchange(other.remove_on_destroy_, false);
    unlinked_ = other.unlinked_;
  }
  return *this;
}

SharedSegment::~SharedSegment() { Reset(); }

void SharedSegment::Reset() {
  region_.reset();  // munmap
  if (remove_on_destroy_ && !unlinked_ && !name_.empty())
    bip::shared_memory_object::remove(name_.c_str());
  remove_on_destroy_ = false;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<SharedSegment> SharedSegment::Create(const std::string& name, size_t bytes) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("shared segment of 0 bytes");
  bool created = false;
  try {
    bip::permissions perms;
    perms.set_permissions(0600);  // activations are nobody else's business
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perms);
    created = true;
    shm.truncate(static_cast<bip::offset_t>(bytes));
    // ftruncate leaves tmpfs sparse; reserving now turns "/dev/shm full" into an error
    // here instead of a SIGBUS in the middle of a forward pass. Filesystems without
    // fallocate (EOPNOTSUPP) keep the old behaviour.
    const int err =
        ::posix_fallocate(shm.get_mapping_handle().handle, 0, static_cast<off_t>(bytes));
    if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
      bip::shared_memory_object::remove(name.c_str());
      return absl::ResourceExhaustedError(
          absl::StrCat("shm '", name, "': cannot reserve ", bytes, " bytes: ", std::strerror(err)));
    }
    auto region = std::make_unique<bip::mapped_region>(shm, bip::read_write);
    if (absl::Status s = CheckAligned(region->get_address(), name); !s.ok()) {
      bip::shared_memory_object::remove(name.c_str());
      return s;
    }
    return SharedSegment(name, std::move(region), /*read_only=*/false, /*creator=*/true);
  } catch (const bip::interprocess_exception& e) {
    if (created) bip::shared_memory_object::remove(name.c_str());
    return FromBoost(e, name, "create");
  } catch (const std::exception& e) {
    if (created) bip::shared_memory_object::remove(name.c_str());
    return absl::InternalError(absl::StrCat("shm '", name, "': create: ", e.what()));
  }
}

absl::StatusOr<SharedSegment> SharedSegment::Open(const std::string& name, bool read_only) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  try {
    const bip::mode_t mode = read_only ? bip::read_only : bip::read_write;
    bip::shared_memory_object shm(bip::open_only, name.c_str(), mode);
    bip::offset_t size = 0;
    if (!shm.get_size(size)) {
      return absl::InternalError(absl::StrCat("shm '", name, "': cannot stat"));
    }
    // Create() is shm_open then ftruncate; between the two the object has size 0.
    if (size == 0) {
      return absl::UnavailableError(absl::StrCat("shm '", name, "' is not sized yet"));
    }
    auto region = std::make_unique<bip::mapped_region>(shm, mode);
    if (absl::Status s = CheckAligned(region->get_address(), name); !s.ok()) return s;
    return SharedSegment(name, std::move(region), read_only, /*creator=*/false);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, name, "open");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("shm '", name, "': open: ", e.what()));
  }
}

absl::Status SharedSegment::Remove(const std::string& name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  errno = 0;
  // Boost's remove() is a bare shm_unlink that reports only a bool; errno says why.
  if (bip::shared_memory_object::remove(name.c_str())) return absl::OkStatus();
  const int err = errno;
  const std::string message = absl::StrCat("shm '", name, "': remove: ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

absl::Status SharedSegment::Unlink() {
  if (!creator_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm '", name_, "': only the creator may unlink it"));
  }
  if (unlinked_) return absl::OkStatus();
  remove_on_destroy_ = false;
  unlinked_ = true;
  return Remove(name_);
}

}  // namespace strata
