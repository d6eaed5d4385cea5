#include "common/shm/ring.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/shm/shm_test_util.h"

namespace strata {
namespace {

using shm_test::ScopedShmName;

// Generous bound for anything that "should be immediate": CI machines stall.
constexpr absl::Duration kSlack = absl::Seconds(10);

// 64-byte-aligned heap memory for Initialize/Attach.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : bytes(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64))), size(n) {
    std::memset(bytes.get(), 0, size);
  }
  absl::Span<uint8_t> span() { return absl::Span<uint8_t>(bytes.get(), size); }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> bytes;
  size_t size;
};

ShmRing MakeRing(AlignedBuffer& buffer, const ShmRingOptions& options) {
  auto ring = ShmRing::Initialize(buffer.span(), options);
  EXPECT_TRUE(ring.ok()) << ring.status();
  return *std::move(ring);
}

uint8_t PatternByte(uint64_t message, size_t i) {
  return static_cast<uint8_t>((message * 131 + i * 7 + (i >> 8)) & 0xff);
}

void Push(ShmRing& ring, uint64_t message, size_t bytes) {
  auto span = ring.Reserve(bytes, absl::ZeroDuration());
  ASSERT_TRUE(span.ok()) << span.status();
  ASSERT_EQ(span->size(), bytes);
  for (size_t i = 0; i < bytes; ++i) (*span)[i] = PatternByte(message, i);
  ASSERT_TRUE(ring.Commit(bytes).ok());
}

void ExpectPop(ShmRing& ring, uint64_t message, size_t bytes) {
  auto span = ring.Peek(absl::ZeroDuration());
  ASSERT_TRUE(span.ok()) << span.status();
  ASSERT_EQ(span->size(), bytes) << "message " << message;
  for (size_t i = 0; i < bytes; ++i) {
    ASSERT_EQ((*span)[i], PatternByte(message, i)) << "message " << message << " byte " << i;
  }
  ASSERT_TRUE(ring.Pop().ok());
}

TEST(ShmRingTest, RejectsBadOptionsAndMemory) {
  AlignedBuffer buffer(1 << 16);
  EXPECT_EQ(ShmRing::Initialize(buffer.span(), {.slots = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRing::Initialize(buffer.span(), {.slots = 2, .slot_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRing::Initialize(buffer.span(), {.slots = 2, .slot_bytes = 1 << 20}).status().code(),
            absl::StatusCode::kInvalidArgument);  // too small
  EXPECT_EQ(
      ShmRing::Initialize(buffer.span().subspan(8), {.slots = 2, .slot_bytes = 64}).status().code(),
      absl::StatusCode::kInvalidArgument);  // misaligned
}

TEST(ShmRingTest, FifoOrderAndSizes) {
  const ShmRingOptions options{.slots = 4, .slot_bytes = 1000};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  EXPECT_EQ(ring.slot_count(), 4u);
  EXPECT_EQ(ring.slot_bytes(), 1000u);
  const size_t sizes[] = {0, 1, 1000, 333};
  for (int m = 0; m < 4; ++m) Push(ring, m, sizes[m]);
  EXPECT_EQ(ring.size(), 4u);
  for (int m = 0; m < 4; ++m) ExpectPop(ring, m, sizes[m]);
  EXPECT_EQ(ring.size(), 0u);
}

TEST(ShmRingTest, PeekIsIdempotentAndReserveReusesTheSlot) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 64};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  auto a = ring.Reserve(10, absl::ZeroDuration());
  auto b = ring.Reserve(20, absl::ZeroDuration());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data(), b->data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  (*b)[0] = 5;
  ASSERT_TRUE(ring.Commit(1).ok());
  auto p1 = ring.Peek(absl::ZeroDuration());
  auto p2 = ring.Peek(absl::ZeroDuration());
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_EQ(p1->data(), p2->data());
  EXPECT_EQ(p2->size(), 1u);
  EXPECT_EQ((*p2)[0], 5);
}

TEST(ShmRingTest, WrapsAroundManyTimes) {
  const ShmRingOptions options{.slots = 3, .slot_bytes = 257};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  uint64_t produced = 0;
  uint64_t consumed = 0;
  // Uneven bursts so that the ring is seen empty, partly full and full at every slot.
  for (int round = 0; produced < 20000; ++round) {
    const int burst = 1 + round % 3;
    for (int i = 0; i < burst && ring.size() < 3; ++i, ++produced) {
      Push(ring, produced, produced % 258);
    }
    const int drain = 1 + (round / 3) % 3;
    for (int i = 0; i < drain && consumed < produced; ++i, ++consumed) {
      ExpectPop(ring, consumed, consumed % 258);
    }
    if (HasFatalFailure()) return;
  }
  while (consumed < produced) {
    ExpectPop(ring, consumed, consumed % 258);
    ++consumed;
  }
  EXPECT_EQ(ring.size(), 0u);
}

TEST(ShmRingTest, FullRingTimesOutThenAcceptsAfterPop) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 16, .spin_us = 10};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  Push(ring, 0, 16);
  Push(ring, 1, 16);
  EXPECT_EQ(ring.Reserve(1, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const absl::Time start = absl::Now();
  EXPECT_EQ(ring.Reserve(1, absl::Milliseconds(60)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(55));
  EXPECT_LT(waited, kSlack);
  ExpectPop(ring, 0, 16);
  Push(ring, 2, 16);
  ExpectPop(ring, 1, 16);
  ExpectPop(ring, 2, 16);
}

TEST(ShmRingTest, EmptyRingPeekTimesOut) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 16};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  EXPECT_EQ(ring.Peek(absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ring.Peek(absl::Milliseconds(20)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ShmRingTest, MisuseErrors) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 100};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  EXPECT_EQ(ring.Reserve(101, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring.Commit(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring.Pop().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ring.Reserve(10, absl::ZeroDuration()).ok());
  EXPECT_EQ(ring.Commit(11).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ring.Commit(10).ok());
  EXPECT_EQ(ring.Commit(10).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ring.Peek(absl::ZeroDuration()).ok());
  EXPECT_TRUE(ring.Pop().ok());
  EXPECT_EQ(ring.Pop().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShmRingTest, BlockedProducerWakesWhenConsumerPops) {
  const ShmRingOptions options{.slots = 1, .slot_bytes = 8, .spin_us = 0};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  ring.set_wait_slice(absl::Seconds(1));
  Push(ring, 0, 8);
  std::atomic<bool> done{false};
  absl::Status status;
  std::thread producer([&] {
    status = ring.Reserve(8, kSlack).status();
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(30));  // let it reach the futex (not required)
  EXPECT_FALSE(done);
  ExpectPop(ring, 0, 8);
  producer.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmRingTest, CloseWakesBlockedConsumer) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 8, .spin_us = 0};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  ring.set_wait_slice(absl::Seconds(2));  // the wake must come from Close, not a timeout
  absl::Status status;
  absl::Time returned;
  std::thread consumer([&] {
    status = ring.Peek(absl::InfiniteDuration()).status();
    returned = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time closed = absl::Now();
  ring.Close();
  consumer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(returned - closed, kSlack);
  EXPECT_TRUE(ring.closed());
}

TEST(ShmRingTest, CloseWakesBlockedProducer) {
  const ShmRingOptions options{.slots = 1, .slot_bytes = 8, .spin_us = 0};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  Push(ring, 0, 8);
  absl::Status status;
  std::thread producer([&] { status = ring.Reserve(8, absl::InfiniteDuration()).status(); });
  absl::SleepFor(absl::Milliseconds(20));
  ring.Close();
  producer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
}

TEST(ShmRingTest, ConsumerDrainsAClosedRing) {
  const ShmRingOptions options{.slots = 4, .slot_bytes = 8};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  Push(ring, 0, 3);
  Push(ring, 1, 4);
  ring.Close();
  ring.Close();  // idempotent
  EXPECT_EQ(ring.Reserve(1, absl::ZeroDuration()).status().code(), absl::StatusCode::kCancelled);
  ExpectPop(ring, 0, 3);
  ExpectPop(ring, 1, 4);
  EXPECT_EQ(ring.Peek(absl::Seconds(1)).status().code(), absl::StatusCode::kCancelled);
}

TEST(ShmRingTest, ObserverCanEndAnUnboundedWait) {
  struct CountingObserver : ShmWaitObserver {
    absl::Status OnIdleSlice() override {
      return ++calls < 3 ? absl::OkStatus() : absl::UnavailableError("peer gone");
    }
    int calls = 0;
  };
  const ShmRingOptions options{.slots = 1, .slot_bytes = 8, .spin_us = 0};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  CountingObserver observer;
  ring.set_wait_observer(&observer);
  ring.set_wait_slice(absl::Milliseconds(5));
  EXPECT_EQ(ring.Peek(absl::InfiniteDuration()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(observer.calls, 3);
}

TEST(ShmRingTest, TwoThreadsStreamWithChecksums) {
  const ShmRingOptions options{.slots = 4, .slot_bytes = 512};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  ShmRing ring = MakeRing(buffer, options);
  constexpr uint64_t kMessages = 50000;
  std::thread producer([&] {
    for (uint64_t m = 0; m < kMessages; ++m) {
      const size_t bytes = 8 + m % 505;
      auto span = ring.Reserve(bytes, kSlack);
      if (!span.ok()) return;
      std::memcpy(span->data(), &m, 8);
      for (size_t i = 8; i < bytes; ++i) (*span)[i] = PatternByte(m, i);
      if (!ring.Commit(bytes).ok()) return;
    }
  });
  uint64_t bad = 0;
  for (uint64_t m = 0; m < kMessages; ++m) {
    auto span = ring.Peek(kSlack);
    ASSERT_TRUE(span.ok()) << span.status() << " at message " << m;
    uint64_t got;
    std::memcpy(&got, span->data(), 8);
    bad += got != m || span->size() != 8 + m % 505;
    for (size_t i = 8; i < span->size(); ++i) bad += (*span)[i] != PatternByte(m, i);
    ASSERT_TRUE(ring.Pop().ok());
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
}

TEST(ShmRingTest, ReopenByNameSeesTheSameRing) {
  ScopedShmName name("ring");
  const ShmRingOptions options{.slots = 4, .slot_bytes = 100};
  auto a = ShmRing::Create(name.str(), options);
  ASSERT_TRUE(a.ok()) << a.status();
  Push(*a, 0, 10);
  Push(*a, 1, 20);
  Push(*a, 2, 30);
  {
    auto b = ShmRing::Open(name.str());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->slot_count(), 4u);
    EXPECT_EQ(b->slot_bytes(), 100u);
    EXPECT_EQ(b->size(), 3u);
    ExpectPop(*b, 0, 10);
    Push(*b, 3, 40);  // b produces too: the state lives in the segment, not the object
  }
  ExpectPop(*a, 1, 20);
  ExpectPop(*a, 2, 30);
  ExpectPop(*a, 3, 40);
  // The creator's destruction removes the name.
  a = absl::CancelledError("drop");
  EXPECT_EQ(ShmRing::Open(name.str()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmRingTest, AttachValidatesTheHeader) {
  const ShmRingOptions options{.slots = 2, .slot_bytes = 64};
  AlignedBuffer buffer(*ShmRing::RequiredBytes(options));
  EXPECT_EQ(ShmRing::Attach(buffer.span()).status().code(), absl::StatusCode::kUnavailable);
  buffer.span()[0] = 0x5a;
  EXPECT_EQ(ShmRing::Attach(buffer.span()).status().code(), absl::StatusCode::kDataLoss);
  ShmRing ring = MakeRing(buffer, options);
  EXPECT_TRUE(ShmRing::Attach(buffer.span()).ok());
  EXPECT_EQ(ShmRing::Attach(buffer.span().subspan(0, buffer.size - 1)).status().code(),
            absl::StatusCode::kDataLoss);
  // A corrupt length is reported rather than handed out.
  Push(ring, 0, 8);
  std::memset(buffer.span().data() + 384, 0xff, 8);  // slot 0's length
  EXPECT_EQ(ring.Peek(absl::ZeroDuration()).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata
