// A single-producer single-consumer ring of fixed-capacity slots in shared memory: the
// per-layer activation path between the router and an expert worker.
//
// Memory layout (all offsets from the ring's 64-byte-aligned base):
//   [0, 384)   header: magic, version, geometry, `closed`; the producer's `head` and the
//              consumer's `tail` (64-bit sequence counters, each on its own 128-byte pair of
//              cache lines, each next to the count of peers sleeping on it)
//   384 + i * stride   slot i: a 64-byte slot header holding the payload length, then the
//              payload (64-byte aligned, capacity `slot_bytes`)
// Message k lives in slot k % slots. head - tail is the number of committed, unpopped
// messages. Geometry is copied out of shared memory once, when attaching, so a misbehaving
// peer can corrupt messages but not make this process read or write outside the ring.
//
// Waiting: spin with a pause instruction for `spin_us`, then FUTEX_WAIT (shared, not
// _PRIVATE: the waker is another process) on the low 32 bits of the counter being waited
// for. The side that advances a counter calls FUTEX_WAKE only when the sleeper count says
// someone sleeps, so a warm ping-pong makes no system calls.
#ifndef STRATA_COMMON_SHM_RING_H_
#define STRATA_COMMON_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shm/shared_segment.h"

namespace strata {

namespace shm_internal {
struct RingHeader;
struct SlotHeader;
}  // namespace shm_internal

struct ShmRingOptions {
  uint32_t slots = 8;              // 1 .. ShmRing::kMaxSlots
  uint64_t slot_bytes = 64 << 10;  // payload capacity of one slot, 1 .. kMaxSlotBytes
  uint32_t spin_us = 50;           // spin before sleeping (0: a few polls); stored for both sides
};

// Consulted by a ShmRing each time one of its futex sleeps (at most a wait slice long) times
// out with nothing to show; lets the ring's owner (ShmChannel) beat its heartbeat and notice
// a dead peer even during an unbounded wait. Never called on the spinning fast path.
class ShmWaitObserver {
 public:
  virtual ~ShmWaitObserver() = default;
  // A non-OK status ends the wait with that status.
  virtual absl::Status OnIdleSlice() = 0;
};

// One process produces (Reserve/Commit), one consumes (Peek/Pop); the two may also be two
// threads of one process sharing one ShmRing object. Errors:
//   INVALID_ARGUMENT    payload larger than a slot, Commit larger than the reservation
//   DEADLINE_EXCEEDED   the timeout passed (a zero timeout polls once)
//   CANCELLED           the ring is closed (a consumer still drains what was committed)
//   FAILED_PRECONDITION Commit without Reserve, Pop without Peek
//   DATA_LOSS           the shared header or a length is corrupt
//   whatever the ShmWaitObserver returns (UNAVAILABLE from ShmChannel: the peer died)
// Move-only; a moved-from ring must not be used.
class ShmRing {
 public:
  static constexpr uint32_t kMaxSlots = 1u << 16;
  static constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 30;
  static constexpr uint32_t kMaxSpinUs = 1'000'000;
  static constexpr size_t kAlignment = 64;

  // Bytes a ring with these options occupies; INVALID_ARGUMENT for out-of-range options.
  static absl::StatusOr<uint64_t> RequiredBytes(const ShmRingOptions& options);

  // Formats `memory` (64-byte aligned, at least RequiredBytes) as an empty ring and attaches
  // to it. The ring does not own the memory.
  static absl::StatusOr<ShmRing> Initialize(absl::Span<uint8_t> memory,
                                            const ShmRingOptions& options);
  // Attaches to a ring another process (or this one) initialized in `memory`. UNAVAILABLE if
  // it is not initialized yet, DATA_LOSS or FAILED_PRECONDITION if it is not a valid ring
  // of this version.
  static absl::StatusOr<ShmRing> Attach(absl::Span<uint8_t> memory);

  // A standalone ring in its own named segment, owned by the returned object (the creator
  // removes the name on destruction, see SharedSegment).
  static absl::StatusOr<ShmRing> Create(const std::string& name, const ShmRingOptions& options);
  static absl::StatusOr<ShmRing> Open(const std::string& name);

  ShmRing(ShmRing&&) noexcept = default;
  ShmRing& operator=(ShmRing&&) noexcept = default;
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Producer. Waits up to `timeout` for a free slot and returns its first `bytes` bytes to
  // fill; nothing is visible to the consumer until Commit. Reserving again before Commit
  // returns the same slot.
  absl::StatusOr<absl::Span<uint8_t>> Reserve(size_t bytes, absl::Duration timeout);
  // Publishes the reserved slot holding `bytes` (<= the reserved size) payload bytes.
  absl::Status Commit(size_t bytes);

  // Consumer. Waits up to `timeout` for the oldest message and returns it in place; it stays
  // valid, and is returned again by further Peeks, until Pop.
  absl::StatusOr<absl::Span<const uint8_t>> Peek(absl::Duration timeout);
  // Releases the message returned by the last Peek to the producer.
  absl::Status Pop();

  // Either side: wakes every waiter; later Reserves, and Peeks of an empty ring, fail with
  // CANCELLED. Idempotent and permanent.
  void Close();
  bool closed() const;
  // Committed messages not yet popped.
  uint64_t size() const;

  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // This side's spin before sleeping (initially the ring's spin_us).
  absl::Duration spin() const { return spin_; }
  void set_spin(absl::Duration spin) { spin_ = spin; }
  // Longest single futex sleep: bounds how late the observer runs, and how late a waiter
  // notices Close() in the one interleaving where the wake-up cannot reach it (the flag is
  // not the futex word).
  void set_wait_slice(absl::Duration slice) { wait_slice_ = slice; }
  void set_wait_observer(ShmWaitObserver* observer) { observer_ = observer; }
  // The segment of a ring made by Create/Open; null for Initialize/Attach.
  SharedSegment* segment() { return segment_ ? &*segment_ : nullptr; }

 private:
  ShmRing(shm_internal::RingHeader* header, uint8_t* slots, uint32_t slot_count,
          uint64_t slot_bytes, uint64_t stride, uint32_t spin_us);

  shm_internal::SlotHeader* SlotAt(uint64_t seq) const;
  uint8_t* PayloadAt(uint64_t seq) const;
  // Spins, then sleeps, until `ready(counter value)`, the ring closes, the timeout passes, or
  // the observer objects.
  template <typename Ready>
  absl::Status Wait(std::atomic<uint64_t>& counter, std::atomic<uint32_t>& sleepers, Ready ready,
                    absl::Duration timeout, const char* what);

  std::optional<SharedSegment> segment_;
  shm_internal::RingHeader* header_;
  uint8_t* slots_;
  uint32_t slot_count_;
  uint64_t slot_bytes_;
  uint64_t stride_;
  absl::Duration spin_;
  absl::Duration wait_slice_ = absl::Milliseconds(50);
  ShmWaitObserver* observer_ = nullptr;

  // Producer-side state (only the producer thread touches it).
  uint64_t cached_tail_ = 0;  // a lower bound of tail: avoids reading the consumer's line
  size_t reserved_bytes_ = 0;
  bool reserved_ = false;
  // Consumer-side state.
  uint64_t cached_head_ = 0;  // a lower bound of head
  bool peeked_ = false;
};

}  // namespace strata

#endif  // STRATA_COMMON_SHM_RING_H_
