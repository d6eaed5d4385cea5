#include "common/shm/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace strata::shm_internal {
namespace {

// The futex word is the counter's least significant 32 bits, wherever the byte order puts
// them. The kernel only reads it; all C++ accesses go through the std::atomic<uint64_t>.
uint32_t* Low32(const std::atomic<uint64_t>& counter) {
  auto* bytes = reinterpret_cast<char*>(const_cast<std::atomic<uint64_t>*>(&counter));
  return reinterpret_cast<uint32_t*>(bytes + (std::endian::native == std::endian::little ? 0 : 4));
}

long Futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

}  // namespace

FutexResult FutexWaitLow32(const std::atomic<uint64_t>& counter, uint32_t expected,
                           absl::Duration timeout) {
  timespec ts;
  const timespec* ts_ptr = nullptr;
  if (timeout != absl::InfiniteDuration()) {
    if (timeout <= absl::ZeroDuration()) return FutexResult::kTimedOut;
    ts = absl::ToTimespec(timeout);  // FUTEX_WAIT takes a relative CLOCK_MONOTONIC timeout
    ts_ptr = &ts;
  }
  if (Futex(Low32(counter), FUTEX_WAIT, expected, ts_ptr) == 0) return FutexResult::kWoken;
  switch (errno) {
    case EAGAIN:
      return FutexResult::kValueChanged;
    case ETIMEDOUT:
      return FutexResult::kTimedOut;
    default:  // EINTR; callers re-check state either way
      return FutexResult::kInterrupted;
  }
}

void FutexWakeLow32(const std::atomic<uint64_t>& counter) {
  Futex(Low32(counter), FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace strata::shm_internal
