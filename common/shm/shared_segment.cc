#include "common/shm/shared_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// An errno of shm_open, shm_unlink or Boost as the status callers act on: NOT_FOUND (nothing
// there), ALREADY_EXISTS, PERMISSION_DENIED (another user's, a link, a FIFO with no writer),
// RESOURCE_EXHAUSTED (memory, descriptors); INTERNAL otherwise.
absl::Status FromErrno(int err, const std::string& message) {
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case ELOOP:
    case ENXIO:
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
  return FromErrno(e.get_native_error(), message);
}

// Whether the object behind `fd` is this user's own, as Create makes them: a regular file of
// this effective uid that no other user may read or write. On the descriptor, not the path;
// `st` gets what fstat said.
absl::Status CheckOwn(int fd, const std::string& name, struct stat* st) {
  if (::fstat(fd, st) != 0) {
    return absl::InternalError(absl::StrCat("shm '", name, "': fstat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st->st_mode) || st->st_uid != ::geteuid() || (st->st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "shm '%s' belongs to uid %d with mode %04o, not to this user (uid %d) with mode 0600: "
        "another user made it; not using it",
        name, st->st_uid, st->st_mode & 07777, ::geteuid()));
  }
  return absl::OkStatus();
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

SharedSegment::SharedSegment(std::string name, uint8_t* data, size_t size, bool read_only)
    : name_(std::move(name)), data_(data), size_(size), read_only_(read_only) {}

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
  if (region_ != nullptr) {
    region_.reset();  // munmap
  } else if (data_ != nullptr) {
    ::munmap(data_, size_);
  }
  if (remove_on_destroy_ && !unlinked_ && !name_.empty())
    bip::shared_memory_object::remove(name_.c_str());
  remove_on_destroy_ = false;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<SharedSegment> SharedSegment::Create(const std::string& name, size_t bytes,
                                                    bool reserve) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("shared segment of 0 bytes");
  bool created = false;
  try {
    bip::permissions perms;
    perms.set_permissions(0600);  // activations are nobody else's business
    // create_only is O_CREAT | O_EXCL: a name someone else created first is ALREADY_EXISTS.
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perms);
    created = true;
    const int fd = shm.get_mapping_handle().handle;
    ::fchmod(fd, 0600);  // whatever the umask
    struct stat st {};
    if (absl::Status own = CheckOwn(fd, name, &st); !own.ok()) {
      bip::shared_memory_object::remove(name.c_str());
      return own;
    }
    shm.truncate(static_cast<bip::offset_t>(bytes));
    // ftruncate leaves tmpfs sparse; reserving now turns "/dev/shm full" into an error
    // here instead of a SIGBUS in the middle of a forward pass. Filesystems without
    // fallocate (EOPNOTSUPP) keep the old behaviour.
    const int err = reserve ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : 0;
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
  // Non-blocking: a FIFO planted under the name would block a plain open until someone wrote
  // to it; this way it opens at once and CheckOwn refuses it (not a regular file).
  const int fd =
      ::shm_open(("/" + name).c_str(),
                 (read_only ? O_RDONLY : O_RDWR) | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) {
    const int err = errno;
    return FromErrno(err, absl::StrCat("shm '", name, "': open: ", std::strerror(err)));
  }
  struct stat st {};
  absl::Status status = CheckOwn(fd, name, &st);
  // Create() is shm_open then ftruncate; between the two the object has size 0.
  if (status.ok() && st.st_size == 0) {
    status = absl::UnavailableError(absl::StrCat("shm '", name, "' is not sized yet"));
  }
  void* data = MAP_FAILED;
  if (status.ok()) {
    data = ::mmap(nullptr, static_cast<size_t>(st.st_size),
                  read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("shm '", name, "': mmap: ", std::strerror(errno)));
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  SharedSegment segment(name, static_cast<uint8_t*>(data), static_cast<size_t>(st.st_size),
                        read_only);
  if (absl::Status s = CheckAligned(segment.data(), name); !s.ok()) return s;
  return segment;
}

absl::Status SharedSegment::Remove(const std::string& name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  // Only this user's own: checked on a descriptor of the very object, which no other user can
  // swap for another under the name (/dev/shm is sticky: only the owner unlinks or renames).
  const int fd =
      ::shm_open(("/" + name).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd >= 0) {
    struct stat st {};
    const absl::Status own = CheckOwn(fd, name, &st);
    ::close(fd);
    if (!own.ok()) return own;
    if (::shm_unlink(("/" + name).c_str()) == 0) return absl::OkStatus();
  }
  const int err = errno;  // shm_open's or shm_unlink's
  return FromErrno(err, absl::StrCat("shm '", name, "': remove: ", std::strerror(err)));
}

std::vector<std::string> SharedSegment::ListOwned(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (!absl::StartsWith(name, prefix)) continue;
    struct stat st {};
    if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) names.push_back(name);
  }
  ::closedir(dir);
  return names;
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
