#include "common/shm/channel.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/shm/shm_test_util.h"

namespace strata {
namespace {

using shm_test::ForkedChild;
using shm_test::ScopedShmName;

constexpr absl::Duration kSlack = absl::Seconds(10);

TEST(ShmChannelTest, InProcessRoundTrip) {
  ScopedShmName name("chan");
  auto router = ShmChannel::Create(name.str(), {.slots = 4, .slot_bytes = 256});
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_TRUE(router->is_creator());
  EXPECT_EQ(router->PeerStatus().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(router->PeerAlive());
  EXPECT_EQ(router->WaitForPeer(absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);

  auto worker = ShmChannel::Open(name.str());
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_FALSE(worker->is_creator());
  EXPECT_TRUE(router->WaitForPeer(absl::Seconds(1)).ok());
  EXPECT_TRUE(router->PeerAlive());
  EXPECT_TRUE(worker->PeerAlive());
  EXPECT_EQ(router->peer_pid(), ::getpid());
  EXPECT_EQ(&router->outbound(), &router->outbound());
  EXPECT_EQ(router->outbound().slot_bytes(), 256u);

  auto request = router->outbound().Reserve(5, absl::ZeroDuration());
  ASSERT_TRUE(request.ok());
  std::memcpy(request->data(), "hello", 5);
  ASSERT_TRUE(router->outbound().Commit(5).ok());
  auto got = worker->inbound().Peek(kSlack);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(got->begin(), got->end()), "hello");
  ASSERT_TRUE(worker->inbound().Pop().ok());

  auto response = worker->outbound().Reserve(3, absl::ZeroDuration());
  ASSERT_TRUE(response.ok());
  std::memcpy(response->data(), "ack", 3);
  ASSERT_TRUE(worker->outbound().Commit(3).ok());
  got = router->inbound().Peek(kSlack);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(got->begin(), got->end()), "ack");
  ASSERT_TRUE(router->inbound().Pop().ok());

  // One opener per channel: it removed the name as it attached, so nothing is left to open
  // (or to leak, whatever happens to both sides now).
  EXPECT_EQ(ShmChannel::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(SharedSegment::ListOwned(name.str()).empty());

  // A worker that goes away closes its rings and says so.
  worker = absl::CancelledError("drop");
  EXPECT_EQ(router->PeerStatus().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(router->inbound().Peek(kSlack).status().code(), absl::StatusCode::kCancelled);
}

TEST(ShmChannelTest, MoveKeepsTheChannelWorking) {
  ScopedShmName name("move");
  auto created = ShmChannel::Create(name.str(), {.slots = 2, .slot_bytes = 64});
  ASSERT_TRUE(created.ok()) << created.status();
  ShmChannel router = std::move(*created);
  auto worker = ShmChannel::Open(name.str());
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(router.outbound().Reserve(1, absl::ZeroDuration()).ok());
  ASSERT_TRUE(router.outbound().Commit(1).ok());
  EXPECT_TRUE(worker->inbound().Peek(kSlack).ok());
  EXPECT_TRUE(router.PeerAlive());
}

TEST(ShmChannelTest, OpenErrors) {
  ScopedShmName name("open");
  EXPECT_EQ(ShmChannel::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      ShmChannel::Open(name.str(), {.wait_for_creator = absl::Milliseconds(30)}).status().code(),
      absl::StatusCode::kNotFound);
  auto segment = SharedSegment::Create(name.str(), 1 << 16);
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ(ShmChannel::Open(name.str()).status().code(), absl::StatusCode::kUnavailable);
  segment->data()[0] = 1;
  EXPECT_EQ(ShmChannel::Open(name.str()).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ShmChannelTest, BadOptions) {
  ScopedShmName name("opts");
  EXPECT_EQ(ShmChannel::Create(name.str(), {.slots = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmChannel::Create(name.str(), {.wait_slice = absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmChannel::Create(name.str(), {.wait_slice = absl::Milliseconds(50),
                                            .heartbeat_timeout = absl::Milliseconds(60)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedSegment::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmChannelTest, OpenWaitsForTheCreator) {
  ScopedShmName name("late");
  std::thread creator_thread;
  absl::StatusOr<ShmChannel> router = absl::UnknownError("not yet");
  creator_thread = std::thread([&] {
    absl::SleepFor(absl::Milliseconds(50));
    router = ShmChannel::Create(name.str());
  });
  auto worker = ShmChannel::Open(name.str(), {.wait_for_creator = kSlack});
  creator_thread.join();
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(worker->PeerAlive());
}

TEST(ShmChannelTest, StaleHeartbeatMeansDead) {
  ScopedShmName name("beat");
  auto router = ShmChannel::Create(name.str(), {.wait_slice = absl::Milliseconds(10),
                                                .heartbeat_timeout = absl::Milliseconds(100)});
  ASSERT_TRUE(router.ok()) << router.status();
  auto worker = ShmChannel::Open(name.str());
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(router->PeerAlive());  // first look starts the clock
  absl::SleepFor(absl::Milliseconds(250));
  absl::Status status = router->PeerStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  worker->Heartbeat();
  EXPECT_TRUE(router->PeerAlive());
  // A worker blocked on its ring beats on its own once per slice.
  std::thread waiter([&] { (void)worker->inbound().Peek(absl::Milliseconds(400)); });
  int alive = 0;
  for (int i = 0; i < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(40));
    alive += router->PeerAlive();
  }
  waiter.join();
  // Without the waiter's beats at most the first two checks (< 100 ms after Heartbeat())
  // would pass. Not all 8 are required: a stalled CI machine can starve the waiter.
  EXPECT_GE(alive, 4);
}

// Message: [u32 index][u32 payload bytes][u64 checksum][payload].
constexpr size_t kHeaderBytes = 16;

uint64_t Fnv1a(const uint8_t* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

uint32_t PayloadBytes(uint32_t index, size_t slot_bytes) {
  const uint32_t max = static_cast<uint32_t>(slot_bytes - kHeaderBytes);
  switch (index % 7) {
    case 0:
      return 0;
    case 1:
      return max;
    case 2:
      return 1;
    case 3:
      return 4096;
    default:
      return (index * 2654435761u) % (max + 1);
  }
}

void FillMessage(uint32_t index, uint32_t bytes, uint8_t* out) {
  uint64_t x = index * 0x9e3779b97f4a7c15ull + 1;
  for (uint32_t i = 0; i < bytes; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    out[kHeaderBytes + i] = static_cast<uint8_t>(x);
  }
  const uint64_t sum = Fnv1a(out + kHeaderBytes, bytes);
  std::memcpy(out, &index, 4);
  std::memcpy(out + 4, &bytes, 4);
  std::memcpy(out + 8, &sum, 8);
}

// The worker side of the echo test: verifies each message, sends it back verbatim.
int EchoWorker(const std::string& name) {
  auto ch = ShmChannel::Open(name, {.wait_for_creator = kSlack});
  if (!ch.ok()) return 10;
  for (uint32_t expected = 0;; ++expected) {
    auto in = ch->inbound().Peek(absl::Seconds(60));
    if (absl::IsCancelled(in.status())) return 0;  // the router closed: done
    if (!in.ok()) return 11;
    if (in->size() < kHeaderBytes) return 12;
    uint32_t index, bytes;
    uint64_t sum;
    std::memcpy(&index, in->data(), 4);
    std::memcpy(&bytes, in->data() + 4, 4);
    std::memcpy(&sum, in->data() + 8, 8);
    if (index != expected) return 13;
    if (in->size() != kHeaderBytes + bytes) return 14;
    if (Fnv1a(in->data() + kHeaderBytes, bytes) != sum) return 15;
    auto out = ch->outbound().Reserve(in->size(), absl::Seconds(60));
    if (!out.ok()) return 16;
    std::memcpy(out->data(), in->data(), in->size());
    if (!ch->outbound().Commit(in->size()).ok()) return 17;
    if (!ch->inbound().Pop().ok()) return 18;
  }
}

TEST(ShmChannelTest, ForkedWorkerEchoesTenThousandMessages) {
  ScopedShmName name("echo");
  const ShmChannelOptions options{.slots = 4, .slot_bytes = 20000};
  auto router = ShmChannel::Create(name.str(), options);
  ASSERT_TRUE(router.ok()) << router.status();
  ForkedChild worker([&] { return EchoWorker(name.str()); });
  ASSERT_TRUE(worker.started());
  ASSERT_TRUE(router->WaitForPeer(kSlack).ok());
  EXPECT_EQ(router->peer_pid(), worker.pid());

  constexpr uint32_t kMessages = 10000;
  std::vector<uint8_t> expected(options.slot_bytes);
  uint32_t sent = 0;
  uint32_t bad = 0;
  for (uint32_t received = 0; received < kMessages;) {
    // Keep up to `slots` requests in flight so that both rings also run full.
    while (sent < kMessages && sent - received < options.slots) {
      const uint32_t bytes = PayloadBytes(sent, options.slot_bytes);
      auto out = router->outbound().Reserve(kHeaderBytes + bytes, kSlack);
      ASSERT_TRUE(out.ok()) << out.status();
      FillMessage(sent, bytes, out->data());
      ASSERT_TRUE(router->outbound().Commit(kHeaderBytes + bytes).ok());
      ++sent;
    }
    auto in = router->inbound().Peek(kSlack);
    ASSERT_TRUE(in.ok()) << in.status() << " after " << received << " responses";
    const uint32_t bytes = PayloadBytes(received, options.slot_bytes);
    FillMessage(received, bytes, expected.data());
    if (in->size() != kHeaderBytes + bytes ||
        std::memcmp(in->data(), expected.data(), in->size()) != 0) {
      ++bad;
    }
    ASSERT_TRUE(router->inbound().Pop().ok());
    ++received;
  }
  EXPECT_EQ(bad, 0u);
  router->Close();
  EXPECT_EQ(worker.Wait(kSlack), 0);
}

// The worker attaches, says so, then hangs until killed.
int IdleWorker(const std::string& name) {
  auto ch = ShmChannel::Open(name, {.wait_for_creator = kSlack});
  if (!ch.ok()) return 10;
  if (!ch->outbound().Reserve(0, kSlack).ok() || !ch->outbound().Commit(0).ok()) return 11;
  (void)ch->inbound().Peek(absl::InfiniteDuration());  // blocks; SIGKILLed here
  return 12;
}

// Starts an idle worker, waits for its hello, and SIGKILLs it 100 ms later from another
// thread; returns when killed_at is set.
struct KilledWorker {
  explicit KilledWorker(ShmChannel& router, const std::string& name)
      : child([&] { return IdleWorker(name); }) {
    auto hello = router.inbound().Peek(kSlack);
    ready = hello.ok() && router.inbound().Pop().ok();
    killer = std::thread([this] {
      absl::SleepFor(absl::Milliseconds(100));
      killed_at = absl::Now();
      ::kill(child.pid(), SIGKILL);
      killed = true;
    });
  }
  ~KilledWorker() {
    if (killer.joinable()) killer.join();
  }
  ForkedChild child;
  bool ready = false;
  std::thread killer;
  std::atomic<bool> killed{false};
  absl::Time killed_at;
};

TEST(ShmChannelTest, PeerAliveTurnsFalseWhenWorkerIsKilled) {
  ScopedShmName name("kill");
  auto router = ShmChannel::Create(name.str());
  ASSERT_TRUE(router.ok()) << router.status();
  KilledWorker worker(*router, name.str());
  ASSERT_TRUE(worker.ready);
  EXPECT_TRUE(router->PeerAlive());

  // The router's loop: bounded waits, and a liveness check whenever one times out.
  const absl::Time start = absl::Now();
  absl::Status status;
  while (absl::Now() - start < kSlack) {
    status = router->inbound().Peek(absl::Milliseconds(20)).status();
    if (!absl::IsDeadlineExceeded(status)) break;
    if (!router->PeerAlive()) break;
  }
  const absl::Time noticed = absl::Now();
  worker.killer.join();
  // Either this loop's PeerAlive() noticed, or the ring's own check at the end of a timed-out
  // sleep did.
  EXPECT_TRUE(absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) << status;
  // The child is an unreaped zombie now; it must still count as dead.
  EXPECT_FALSE(router->PeerAlive());
  const absl::Status peer = router->PeerStatus();
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(peer.message().find("died"), absl::string_view::npos) << peer;
  const absl::Duration latency = noticed - worker.killed_at;
  EXPECT_LT(latency, absl::Seconds(5));  // the requirement is 1 s; CI gets slack
  std::printf("noticed the SIGKILL after %s\n", absl::FormatDuration(latency).c_str());
  EXPECT_EQ(worker.child.Wait(kSlack), 1000 + SIGKILL);
}

TEST(ShmChannelTest, UnboundedWaitEndsWhenWorkerIsKilled) {
  ScopedShmName name("killwait");
  auto router = ShmChannel::Create(name.str(), {.slots = 1, .slot_bytes = 64});
  ASSERT_TRUE(router.ok()) << router.status();
  {
    KilledWorker worker(*router, name.str());
    ASSERT_TRUE(worker.ready);
    const absl::Status status = router->inbound().Peek(absl::InfiniteDuration()).status();
    const absl::Time noticed = absl::Now();
    worker.killer.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    const absl::Duration latency = noticed - worker.killed_at;
    EXPECT_LT(latency, absl::Seconds(5));
    std::printf("Peek(infinite) ended %s after the SIGKILL: %s\n",
                absl::FormatDuration(latency).c_str(), status.ToString().c_str());
  }
  // A producer blocked on a full ring is released the same way.
  EXPECT_EQ(router->PeerStatus().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(router->outbound().Reserve(1, absl::ZeroDuration()).ok());
  ASSERT_TRUE(router->outbound().Commit(1).ok());
  EXPECT_EQ(router->outbound().Reserve(1, absl::InfiniteDuration()).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata
