// Cross-process futex wait/wake on the low 32 bits of a 64-bit counter in shared memory,
// and a CPU pause for spin loops. Internal to strata_shm.
#ifndef STRATA_COMMON_SHM_FUTEX_H_
#define STRATA_COMMON_SHM_FUTEX_H_

#include <atomic>
#include <bit>
#include <cstdint>

#include "absl/time/time.h"

namespace strata::shm_internal {

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint64_t>) == sizeof(uint64_t),
              "shared-memory counters must be plain lock-free 64-bit words");
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "shared-memory flags must be plain lock-free 32-bit words");

enum class FutexResult { kWoken, kValueChanged, kTimedOut, kInterrupted };

// Sleeps while the low word of `counter` equals `expected`, for at most `timeout`
// (InfiniteDuration: no limit). Uses the shared (non-_PRIVATE) futex ops, so the wake may
// come from another process mapping the same memory. Spurious returns are possible.
FutexResult FutexWaitLow32(const std::atomic<uint64_t>& counter, uint32_t expected,
                           absl::Duration timeout);
// Wakes every sleeper on the low word of `counter`.
void FutexWakeLow32(const std::atomic<uint64_t>& counter);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace strata::shm_internal

#endif  // STRATA_COMMON_SHM_FUTEX_H_
