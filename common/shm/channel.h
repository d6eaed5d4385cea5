// A router <-> expert-worker channel: a request ring and a response ring in one named
// segment, plus each side's pid and heartbeat so that either side can tell its peer died.
//
//   router:  auto ch = ShmChannel::Create("strata_w3", {.slots = 8, .slot_bytes = 1 << 20});
//            RETURN_IF_ERROR(ch->WaitForPeer(absl::Seconds(30)));
//            ch->outbound().Reserve(...) / Commit(...);   // requests
//            ch->inbound().Peek(...) / Pop();             // responses
//   worker:  auto ch = ShmChannel::Open("strata_w3", {.wait_for_creator = absl::Seconds(30)});
//            ch->inbound() reads requests, ch->outbound() writes responses.
//
// Liveness: a ring wait sleeps in futex waits of at most `wait_slice`; after each one that
// times out it beats this side's heartbeat and checks the peer (see PeerStatus). A dead or
// detached peer ends the wait with UNAVAILABLE, so even an unbounded Peek notices a
// SIGKILLed worker within about one slice (50 ms by default).
//
// A channel pairs one creator with one opener, once: the opener removes the name as it
// attaches, so a second Open finds nothing, also after the first opener died (make a new
// channel for a restarted worker), and nothing is left in /dev/shm whatever happens to either
// side. Handles are not fork-safe; a forked child opens the channel by name.
#ifndef STRATA_COMMON_SHM_CHANNEL_H_
#define STRATA_COMMON_SHM_CHANNEL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shm/ring.h"
#include "common/shm/shared_segment.h"

namespace strata {

namespace shm_internal {
struct ChannelHeader;
class PeerMonitor;
}  // namespace shm_internal

struct ShmChannelOptions {
  // Geometry of each ring, fixed by the creator.
  uint32_t slots = 8;
  uint64_t slot_bytes = 64 << 10;
  uint32_t spin_us = 50;
  // This side only: the longest futex sleep between liveness checks, and (if finite) how
  // long the peer's heartbeat may stand still before the peer counts as dead. A peer beats
  // while it waits on a ring; one that computes for longer must call Heartbeat() itself (the
  // expert worker beats for every message it handles and while its computation progresses).
  absl::Duration wait_slice = absl::Milliseconds(50);
  absl::Duration heartbeat_timeout = absl::InfiniteDuration();
};

struct ShmChannelOpenOptions {
  // Keep retrying this long while the creator has not created the channel yet.
  absl::Duration wait_for_creator = absl::ZeroDuration();
  absl::Duration wait_slice = absl::Milliseconds(50);
  absl::Duration heartbeat_timeout = absl::InfiniteDuration();
};

class ShmChannel {
 public:
  // ALREADY_EXISTS if the name is taken; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<ShmChannel> Create(const std::string& name,
                                           const ShmChannelOptions& options = {});
  // NOT_FOUND / UNAVAILABLE if the creator is not done by the deadline; FAILED_PRECONDITION
  // if the channel already had an opener; DATA_LOSS if it is not a channel; PERMISSION_DENIED
  // if another user made it (SharedSegment::Open).
  static absl::StatusOr<ShmChannel> Open(const std::string& name,
                                         const ShmChannelOpenOptions& options = {});

  ShmChannel(ShmChannel&& other) noexcept;
  ShmChannel& operator=(ShmChannel&& other) noexcept;
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;
  // Close()s and marks this side detached; the creator also removes the name.
  ~ShmChannel();

  // The ring this side produces into (creator: requests; opener: responses) ...
  ShmRing& outbound() { return creator_ ? request_ : response_; }
  // ... and the one it consumes from.
  ShmRing& inbound() { return creator_ ? response_ : request_; }
  bool is_creator() const { return creator_; }
  const std::string& name() const { return segment_.name(); }
  // The creator may segment().Unlink() once the peer is attached: then nothing can leak.
  SharedSegment& segment() { return segment_; }

  // OK while the peer is attached and its process runs (and, with a heartbeat_timeout, its
  // heartbeat moves); UNAVAILABLE once it exited, was killed, detached or went stale;
  // FAILED_PRECONDITION while it has not attached yet. Thread-safe; a few microseconds.
  absl::Status PeerStatus();
  bool PeerAlive() { return PeerStatus().ok(); }
  // Waits until the peer attaches: OK, UNAVAILABLE (it came and went) or DEADLINE_EXCEEDED.
  absl::Status WaitForPeer(absl::Duration timeout);
  // The peer's pid, 0 before it attached, and its start time (with the pid, one process).
  pid_t peer_pid() const;
  uint64_t peer_start_time() const;
  // Whether PeerStatus ever found the peer's heartbeat standing still past heartbeat_timeout
  // while its process ran (stopped, stuck, or swapped out, rather than dead).
  bool PeerStalled() const;
  // Advances this side's heartbeat (ring waits do it on their own while sleeping).
  void Heartbeat();
  // Closes both rings: the peer drains what was committed, then gets CANCELLED.
  void Close();

  // Removes this user's channels named `prefix`... that no peer opened and whose creator is
  // gone (a creator killed before its peer came); returns how many.
  static int RemoveOrphans(const std::string& prefix);

 private:
  ShmChannel(SharedSegment segment, shm_internal::ChannelHeader* header, ShmRing request,
             ShmRing response, bool creator, absl::Duration wait_slice,
             absl::Duration heartbeat_timeout);
  void Detach();

  SharedSegment segment_;  // first: outlives the rings and the monitor pointing into it
  bool creator_;
  // Heap-allocated so that its address, handed to the rings, survives moves.
  std::unique_ptr<shm_internal::PeerMonitor> monitor_;
  ShmRing request_;
  ShmRing response_;
};

}  // namespace strata

#endif  // STRATA_COMMON_SHM_CHANNEL_H_
