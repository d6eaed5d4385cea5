#include "common/shm/ring.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cluster/protocol_version.h"
#include "common/shm/futex.h"
#include "common/util/status_macros.h"

namespace strata {
namespace shm_internal {

constexpr uint32_t kRingMagic = 0x474E5253;  // "SRNG"
constexpr size_t kRingHeaderBytes = 384;
constexpr size_t kSlotHeaderBytes = 64;

// Counters sit 128 bytes apart: Intel's adjacent-line prefetcher pulls lines in pairs, so
// 64-byte separation would still make the two sides contend.
struct RingHeader {
  // Written once by Initialize (magic last, with release); afterwards only `closed` changes.
  std::atomic<uint32_t> magic;
  uint32_t version;
  uint32_t slot_count;
  uint32_t spin_us;
  uint64_t slot_bytes;
  uint64_t slot_stride;
  std::atomic<uint32_t> closed;
  // Advanced by the producer. The consumer counts itself in head_sleepers before sleeping on
  // head, so a Commit touches this one line.
  alignas(128) std::atomic<uint64_t> head;
  std::atomic<uint32_t> head_sleepers;
  // Advanced by the consumer; the producer sleeps on it when the ring is full.
  alignas(128) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> tail_sleepers;
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);
static_assert(std::is_standard_layout_v<RingHeader>);

struct SlotHeader {
  std::atomic<uint64_t> length;
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);

}  // namespace shm_internal

namespace {

using shm_internal::kRingHeaderBytes;
using shm_internal::kSlotHeaderBytes;
using shm_internal::RingHeader;
using shm_internal::SlotHeader;
using Clock = std::chrono::steady_clock;

uint64_t RoundUp(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

uint64_t Stride(uint64_t slot_bytes) {
  return kSlotHeaderBytes + RoundUp(slot_bytes, ShmRing::kAlignment);
}

absl::Status Closed() { return absl::CancelledError("shm ring is closed"); }

// Timeouts this long are as good as infinite and would overflow time_point arithmetic.
bool EffectivelyInfinite(absl::Duration d) { return d >= absl::Hours(24 * 365); }

}  // namespace

absl::StatusOr<uint64_t> ShmRing::RequiredBytes(const ShmRingOptions& options) {
  if (options.slots < 1 || options.slots > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring: slots must be in [1, ", kMaxSlots, "], got ", options.slots));
  }
  if (options.slot_bytes < 1 || options.slot_bytes > kMaxSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm ring: slot_bytes must be in [1, ",
                                                   kMaxSlotBytes, "], got ", options.slot_bytes));
  }
  if (options.spin_us > kMaxSpinUs) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring: spin_us must be at most ", kMaxSpinUs));
  }
  // At most 2^16 slots of ~2^30 bytes: no overflow in 64 bits.
  return kRingHeaderBytes + uint64_t{options.slots} * Stride(options.slot_bytes);
}

ShmRing::ShmRing(RingHeader* header, uint8_t* slots, uint32_t slot_count, uint64_t slot_bytes,
                 uint64_t stride, uint32_t spin_us)
    : header_(header),
      slots_(slots),
      slot_count_(slot_count),
      slot_bytes_(slot_bytes),
      stride_(stride),
      spin_(absl::Microseconds(spin_us)),
      cached_tail_(header->tail.load(std::memory_order_acquire)),
      cached_head_(header->head.load(std::memory_order_acquire)) {}

absl::StatusOr<ShmRing> ShmRing::Initialize(absl::Span<uint8_t> memory,
                                            const ShmRingOptions& options) {
  ASSIGN_OR_RETURN(const uint64_t need, RequiredBytes(options));
  if (memory.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring needs ", need, " bytes, got ", memory.size()));
  }
  if (reinterpret_cast<uintptr_t>(memory.data()) % kAlignment != 0) {
    return absl::InvalidArgumentError("shm ring memory must be 64-byte aligned");
  }
  auto* header = new (memory.data()) RingHeader();
  header->version = kClusterProtocolVersion;
  header->slot_count = options.slots;
  header->spin_us = options.spin_us;
  header->slot_bytes = options.slot_bytes;
  header->slot_stride = Stride(options.slot_bytes);
  header->closed.store(0, std::memory_order_relaxed);
  header->head.store(0, std::memory_order_relaxed);
  header->head_sleepers.store(0, std::memory_order_relaxed);
  header->tail.store(0, std::memory_order_relaxed);
  header->tail_sleepers.store(0, std::memory_order_relaxed);
  uint8_t* slots = memory.data() + kRingHeaderBytes;
  for (uint32_t i = 0; i < options.slots; ++i) {
    new (slots + i * header->slot_stride) SlotHeader{0};
  }
  // Attach() trusts nothing before it sees the magic.
  header->magic.store(shm_internal::kRingMagic, std::memory_order_release);
  return ShmRing(header, slots, options.slots, options.slot_bytes, header->slot_stride,
                 options.spin_us);
}

absl::StatusOr<ShmRing> ShmRing::Attach(absl::Span<uint8_t> memory) {
  if (reinterpret_cast<uintptr_t>(memory.data()) % kAlignment != 0) {
    return absl::InvalidArgumentError("shm ring memory must be 64-byte aligned");
  }
  if (memory.size() < kRingHeaderBytes) {
    return absl::DataLossError(absl::StrCat("shm ring: ", memory.size(), " bytes is too small"));
  }
  auto* header = std::launder(reinterpret_cast<RingHeader*>(memory.data()));
  const uint32_t magic = header->magic.load(std::memory_order_acquire);
  if (magic == 0) return absl::UnavailableError("shm ring is not initialized yet");
  if (magic != shm_internal::kRingMagic) {
    return absl::DataLossError(absl::StrCat("shm ring: bad magic 0x", absl::Hex(magic)));
  }
  if (header->version != kClusterProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm ring: version ", header->version, ", this build speaks ", kClusterProtocolVersion));
  }
  const ShmRingOptions options{
      .slots = header->slot_count, .slot_bytes = header->slot_bytes, .spin_us = header->spin_us};
  absl::StatusOr<uint64_t> need = RequiredBytes(options);
  if (!need.ok() || *need > memory.size() || header->slot_stride != Stride(options.slot_bytes)) {
    return absl::DataLossError("shm ring: corrupt geometry in header");
  }
  const uint64_t head = header->head.load(std::memory_order_acquire);
  const uint64_t tail = header->tail.load(std::memory_order_acquire);
  if (tail > head || head - tail > options.slots) {
    return absl::DataLossError(
        absl::StrCat("shm ring: corrupt counters head=", head, " tail=", tail));
  }
  return ShmRing(header, memory.data() + kRingHeaderBytes, options.slots, options.slot_bytes,
                 header->slot_stride, options.spin_us);
}

absl::StatusOr<ShmRing> ShmRing::Create(const std::string& name, const ShmRingOptions& options) {
  ASSIGN_OR_RETURN(const uint64_t need, RequiredBytes(options));
  ASSIGN_OR_RETURN(SharedSegment segment, SharedSegment::Create(name, need));
  ASSIGN_OR_RETURN(ShmRing ring, Initialize(segment.span(), options));
  ring.segment_.emplace(std::move(segment));  // the mapping does not move with the object
  return ring;
}

absl::StatusOr<ShmRing> ShmRing::Open(const std::string& name) {
  ASSIGN_OR_RETURN(SharedSegment segment, SharedSegment::Open(name));
  ASSIGN_OR_RETURN(ShmRing ring, Attach(segment.span()));
  ring.segment_.emplace(std::move(segment));
  return ring;
}

SlotHeader* ShmRing::SlotAt(uint64_t seq) const {
  return std::launder(reinterpret_cast<SlotHeader*>(slots_ + (seq % slot_count_) * stride_));
}

uint8_t* ShmRing::PayloadAt(uint64_t seq) const {
  return slots_ + (seq % slot_count_) * stride_ + kSlotHeaderBytes;
}

template <typename Ready>
absl::Status ShmRing::Wait(std::atomic<uint64_t>& counter, std::atomic<uint32_t>& sleepers,
                           Ready ready, absl::Duration timeout, const char* what) {
  const auto timed_out = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        "shm ring: timed out after ", absl::FormatDuration(timeout), " waiting for ", what));
  };
  if (header_->closed.load(std::memory_order_acquire)) {
    // A close may have raced with the caller's check: look once more so nothing committed
    // before Close() is lost to the consumer.
    return ready(counter.load(std::memory_order_acquire)) ? absl::OkStatus() : Closed();
  }
  if (timeout <= absl::ZeroDuration()) return timed_out();

  const bool infinite = EffectivelyInfinite(timeout);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      infinite ? Clock::time_point::max() : start + absl::ToChronoNanoseconds(timeout);
  const Clock::time_point spin_end =
      start + absl::ToChronoNanoseconds(std::min(spin_, infinite ? spin_ : timeout));

  // Phase 1: spin. The clock is read every 16 pauses only; a pause is 10-140 cycles.
  for (uint32_t i = 1;; ++i) {
    if (ready(counter.load(std::memory_order_acquire))) return absl::OkStatus();
    if (header_->closed.load(std::memory_order_acquire)) {
      return ready(counter.load(std::memory_order_acquire)) ? absl::OkStatus() : Closed();
    }
    if (i % 16 == 0 && Clock::now() >= spin_end) break;
    shm_internal::CpuRelax();
  }

  // Phase 2: sleep on the futex. Announcing ourselves in `sleepers` and then re-reading the
  // counter, both seq_cst, pairs with the waker's seq_cst counter store then sleepers load:
  // either we see the new value or the waker sees us and wakes us. A wake that lands
  // between our re-read and FUTEX_WAIT is caught by the kernel's value check.
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return timed_out();
    absl::Duration slice = wait_slice_;
    if (!infinite) slice = std::min(slice, absl::FromChrono(deadline - now));
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t seen = counter.load(std::memory_order_seq_cst);
    shm_internal::FutexResult result = shm_internal::FutexResult::kValueChanged;
    if (!ready(seen) && !header_->closed.load(std::memory_order_seq_cst)) {
      result = shm_internal::FutexWaitLow32(counter, static_cast<uint32_t>(seen), slice);
    }
    sleepers.fetch_sub(1, std::memory_order_release);
    if (ready(counter.load(std::memory_order_acquire))) return absl::OkStatus();
    if (header_->closed.load(std::memory_order_acquire)) {
      return ready(counter.load(std::memory_order_acquire)) ? absl::OkStatus() : Closed();
    }
    if (result == shm_internal::FutexResult::kTimedOut && observer_ != nullptr) {
      RETURN_IF_ERROR(observer_->OnIdleSlice());
    }
  }
}

absl::StatusOr<absl::Span<uint8_t>> ShmRing::Reserve(size_t bytes, absl::Duration timeout) {
  if (bytes > slot_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring: payload of ", bytes, " bytes exceeds the slot's ", slot_bytes_));
  }
  if (header_->closed.load(std::memory_order_acquire)) return Closed();
  const uint64_t head = header_->head.load(std::memory_order_relaxed);  // ours alone
  // A tail beyond head is corruption; treat it as "ready" so it is reported, not waited on.
  const auto has_space = [&](uint64_t tail) { return tail > head || head - tail < slot_count_; };
  if (!has_space(cached_tail_) || cached_tail_ > head) {
    cached_tail_ = header_->tail.load(std::memory_order_acquire);
    if (!has_space(cached_tail_)) {
      RETURN_IF_ERROR(
          Wait(header_->tail, header_->tail_sleepers, has_space, timeout, "a free slot"));
      cached_tail_ = header_->tail.load(std::memory_order_acquire);
      // Wait() lets a consumer drain a closed ring; a producer must stop.
      if (header_->closed.load(std::memory_order_acquire)) return Closed();
    }
    if (cached_tail_ > head) {
      return absl::DataLossError(
          absl::StrCat("shm ring: corrupt counters head=", head, " tail=", cached_tail_));
    }
  }
  reserved_ = true;
  reserved_bytes_ = bytes;
  return absl::Span<uint8_t>(PayloadAt(head), bytes);
}

absl::Status ShmRing::Commit(size_t bytes) {
  if (!reserved_) return absl::FailedPreconditionError("shm ring: Commit without Reserve");
  if (bytes > reserved_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm ring: Commit of ", bytes, " bytes exceeds the reserved ", reserved_bytes_));
  }
  reserved_ = false;
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  SlotAt(head)->length.store(bytes, std::memory_order_relaxed);
  // seq_cst (not just release, which publishes the payload): must not be reordered after
  // the sleepers load below; see Wait().
  header_->head.store(head + 1, std::memory_order_seq_cst);
  if (header_->head_sleepers.load(std::memory_order_seq_cst) != 0) {
    shm_internal::FutexWakeLow32(header_->head);
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const uint8_t>> ShmRing::Peek(absl::Duration timeout) {
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);  // ours alone
  if (cached_head_ <= tail) {
    cached_head_ = header_->head.load(std::memory_order_acquire);
    if (cached_head_ == tail) {
      RETURN_IF_ERROR(Wait(
          header_->head, header_->head_sleepers, [tail](uint64_t head) { return head != tail; },
          timeout, "a message"));
      cached_head_ = header_->head.load(std::memory_order_acquire);
    }
  }
  if (cached_head_ < tail || cached_head_ - tail > slot_count_) {
    return absl::DataLossError(
        absl::StrCat("shm ring: corrupt counters head=", cached_head_, " tail=", tail));
  }
  const uint64_t length = SlotAt(tail)->length.load(std::memory_order_relaxed);
  if (length > slot_bytes_) {
    return absl::DataLossError(absl::StrCat("shm ring: message ", tail, " claims ", length,
                                            " bytes in a ", slot_bytes_, "-byte slot"));
  }
  peeked_ = true;
  return absl::Span<const uint8_t>(PayloadAt(tail), length);
}

absl::Status ShmRing::Pop() {
  if (!peeked_) return absl::FailedPreconditionError("shm ring: Pop without Peek");
  peeked_ = false;
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);
  header_->tail.store(tail + 1, std::memory_order_seq_cst);  // see Commit()
  if (header_->tail_sleepers.load(std::memory_order_seq_cst) != 0) {
    shm_internal::FutexWakeLow32(header_->tail);
  }
  return absl::OkStatus();
}

void ShmRing::Close() {
  header_->closed.store(1, std::memory_order_seq_cst);
  // Unconditional: closing is rare, and a sleeper count read here could be stale.
  shm_internal::FutexWakeLow32(header_->head);
  shm_internal::FutexWakeLow32(header_->tail);
}

bool ShmRing::closed() const { return header_->closed.load(std::memory_order_acquire) != 0; }

uint64_t ShmRing::size() const {
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  return head >= tail ? head - tail : 0;
}

}  // namespace strata
