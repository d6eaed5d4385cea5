// The per-layer wire format: host runs, prefetch hints, and the header-only device runs of CUDA
// IPC with their answers.
#include "common/transport/expert_wire.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/expert_messages.h"

namespace strata {
namespace {

TEST(ExpertWireTest, HostRunRoundTrip) {
  const std::vector<float> hidden = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> experts = {3, -1, 0, 7};
  const std::vector<float> weights = {0.5f, 0, 0.25f, 0.75f};
  const ExpertRequestView r = testing::HostRunRequest(9, 2, 3, hidden, experts, weights);
  std::vector<uint8_t> bytes(ExpertRequestBytes(2, 2, 3));
  EncodeExpertRequest(r, absl::MakeSpan(bytes));
  auto decoded = DecodeExpertRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, ExpertMessageKind::kRun);
  EXPECT_EQ(std::vector<float>(decoded->hidden.begin(), decoded->hidden.end()), hidden);
  EXPECT_EQ(std::vector<int32_t>(decoded->experts.begin(), decoded->experts.end()), experts);
  EXPECT_EQ(std::vector<float>(decoded->weights.begin(), decoded->weights.end()), weights);
  EXPECT_EQ(decoded->step, 9u);
  EXPECT_EQ(decoded->layer, 2u);
  EXPECT_EQ(decoded->num_tokens, 2u);
  EXPECT_EQ(decoded->top_k, 2u);
  EXPECT_EQ(decoded->hidden_size, 3u);
}

// A slot holds the largest message either way: the request, a full partial (larger than the
// request when a step has fewer than nine slots), or the longest error.
TEST(ExpertWireTest, SlotBytesHoldEveryMessage) {
  for (const auto& [tokens, top_k, hidden] :
       {std::tuple{1u, 8u, 2048u}, std::tuple{512u, 8u, 2048u}, std::tuple{1u, 1u, 16u}}) {
    const size_t slot = ExpertSlotBytes(tokens, top_k, hidden);
    EXPECT_GE(slot, ExpertRequestBytes(tokens, top_k, hidden));
    EXPECT_GE(slot, ExpertResponseBytes(tokens, hidden));
    EXPECT_GE(slot, ExpertResponseBytes(tokens, hidden, kMaxExpertErrorBytes));
  }
  EXPECT_GT(ExpertResponseBytes(1, 2048), ExpertRequestBytes(1, 8, 2048));
}

TEST(ExpertWireTest, DeviceRunIsTheHeaderOnly) {
  ExpertRequestView r;
  r.kind = ExpertMessageKind::kDeviceRun;
  r.step = 41;
  r.layer = 5;
  r.num_tokens = 300;
  r.top_k = 8;
  r.hidden_size = 2048;
  r.hot_ratio = 0.25f;
  std::vector<uint8_t> bytes(ExpertDeviceRunBytes());
  EncodeExpertRequest(r, absl::MakeSpan(bytes));
  auto decoded = DecodeExpertRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, ExpertMessageKind::kDeviceRun);
  EXPECT_EQ(decoded->step, 41u);
  EXPECT_EQ(decoded->layer, 5u);
  EXPECT_EQ(decoded->num_tokens, 300u);
  EXPECT_EQ(decoded->top_k, 8u);
  EXPECT_EQ(decoded->hidden_size, 2048u);
  EXPECT_FLOAT_EQ(decoded->hot_ratio, 0.25f);
  EXPECT_TRUE(decoded->hidden.empty());
  // A device run with arrays appended is refused.
  bytes.resize(bytes.size() + 4);
  EXPECT_FALSE(DecodeExpertRequest(bytes).ok());
}

TEST(ExpertWireTest, DeviceStepCarriesItsLayers) {
  const std::vector<int32_t> layers = {1, 2, 5, 47};
  ExpertRequestView r;
  r.kind = ExpertMessageKind::kDeviceStep;
  r.step = 9;
  r.num_tokens = 8;
  r.top_k = 8;
  r.hidden_size = 2048;
  r.layers = layers;
  std::vector<uint8_t> bytes(ExpertDeviceStepBytes(layers.size()));
  EXPECT_EQ(EncodedSize(r), bytes.size());
  EncodeExpertRequest(r, absl::MakeSpan(bytes));
  auto decoded = DecodeExpertRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, ExpertMessageKind::kDeviceStep);
  EXPECT_EQ(decoded->step, 9u);
  EXPECT_EQ(decoded->num_tokens, 8u);
  EXPECT_EQ(decoded->top_k, 8u);
  EXPECT_EQ(decoded->hidden_size, 2048u);
  EXPECT_EQ(std::vector<int32_t>(decoded->layers.begin(), decoded->layers.end()), layers);
  EXPECT_TRUE(decoded->hidden.empty());
  EXPECT_TRUE(decoded->experts.empty());
  // A layer list shorter or longer than its header says is refused; its step can still be read
  // (the worker answers it with the error).
  bytes.pop_back();
  EXPECT_FALSE(DecodeExpertRequest(bytes).ok());
  EXPECT_EQ(ExpertRequestStep(bytes), 9u);
  EXPECT_EQ(ExpertRequestStep(absl::MakeSpan(bytes).subspan(0, 8)), 0u);  // no whole header
  bytes.resize(bytes.size() + 5);
  EXPECT_FALSE(DecodeExpertRequest(bytes).ok());
}

TEST(ExpertWireTest, DeviceResponseCarriesNoPartial) {
  ExpertResponseView r;
  r.step = 41;
  r.layer = 5;
  r.num_tokens = 300;
  r.hidden_size = 2048;
  r.on_device = true;
  r.tiers.hot_hits = 3;
  std::vector<uint8_t> bytes(ExpertDeviceResponseBytes());
  EncodeExpertResponse(r, absl::MakeSpan(bytes));
  auto decoded = DecodeExpertResponse(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->on_device);
  EXPECT_EQ(decoded->num_tokens, 300u);
  EXPECT_TRUE(decoded->partial.empty());
  EXPECT_TRUE(decoded->error.empty());
  EXPECT_EQ(decoded->tiers.hot_hits, 3u);

  const std::string error = "layer 5 has no experts";
  r.error = error;
  bytes.assign(ExpertDeviceResponseBytes(error.size()), 0);
  EncodeExpertResponse(r, absl::MakeSpan(bytes));
  decoded = DecodeExpertResponse(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->on_device);
  EXPECT_EQ(decoded->error, error);
}

TEST(ExpertWireTest, HostResponseIsNotOnDevice) {
  const std::vector<float> partial = {1, 2, 3};
  ExpertResponseView r;
  r.num_tokens = 1;
  r.hidden_size = 3;
  r.partial = partial;
  std::vector<uint8_t> bytes(ExpertResponseBytes(1, 3));
  EncodeExpertResponse(r, absl::MakeSpan(bytes));
  auto decoded = DecodeExpertResponse(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->on_device);
  EXPECT_EQ(std::vector<float>(decoded->partial.begin(), decoded->partial.end()), partial);
}

// What a worker or the CPU tier answers: fields, partial or error, round-tripped.
TEST(ExpertWireTest, ResponseForARequest) {
  const std::vector<float> hidden = {1, 2};
  const std::vector<int32_t> experts = {0};
  const std::vector<float> weights = {1};
  const ExpertRequestView r = testing::HostRunRequest(41, 3, 2, hidden, experts, weights);
  std::vector<uint8_t> bytes(EncodedSize(r));
  EncodeExpertRequest(r, absl::MakeSpan(bytes));
  const absl::StatusOr<ExpertRequestView> request = DecodeExpertRequest(bytes);
  ASSERT_TRUE(request.ok());
  const std::vector<float> partial = {0.5f, -0.5f};
  std::string error;
  auto round_trip = [](const ExpertResponseView& response) {
    std::vector<uint8_t> out(EncodedSize(response));
    EncodeExpertResponse(response, absl::MakeSpan(out));
    auto decoded = DecodeExpertResponse(out);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return std::make_pair(std::move(out), decoded.ok() ? *decoded : ExpertResponseView{});
  };

  const auto [ok_bytes, ok] =
      round_trip(ExpertResponseFor(bytes, request, absl::OkStatus(), false, partial, error));
  EXPECT_EQ(std::make_tuple(ok.step, ok.layer, ok.num_tokens, ok.hidden_size),
            std::make_tuple(41u, 3u, 1u, 2u));
  EXPECT_EQ(std::vector<float>(ok.partial.begin(), ok.partial.end()), partial);
  EXPECT_TRUE(ok.error.empty());

  // On the device: no partial, whatever the caller passed.
  const auto [device_bytes, device] =
      round_trip(ExpertResponseFor(bytes, request, absl::OkStatus(), true, partial, error));
  EXPECT_TRUE(device.on_device);
  EXPECT_TRUE(device.partial.empty());

  // An error: its text, cut to the limit; an empty message still reads as an error.
  const std::string long_text(kMaxExpertErrorBytes + 10, 'x');
  const auto [long_bytes, failed] = round_trip(
      ExpertResponseFor(bytes, request, absl::InternalError(long_text), false, partial, error));
  EXPECT_EQ(failed.error.size(), kMaxExpertErrorBytes);
  EXPECT_TRUE(failed.partial.empty());
  const auto [empty_bytes, unnamed] = round_trip(ExpertResponseFor(
      bytes, request, absl::Status(absl::StatusCode::kUnavailable, ""), false, partial, error));
  EXPECT_EQ(unnamed.error, "UNAVAILABLE");

  // An undecodable request: the answer still names the step it carried.
  std::vector<uint8_t> torn(bytes.begin(), bytes.begin() + bytes.size() - 1);
  const absl::StatusOr<ExpertRequestView> bad = DecodeExpertRequest(torn);
  ASSERT_FALSE(bad.ok());
  const auto [torn_bytes, answer] =
      round_trip(ExpertResponseFor(torn, bad, bad.status(), false, partial, error));
  EXPECT_EQ(answer.step, 41u);
  EXPECT_FALSE(answer.error.empty());
}

}  // namespace
}  // namespace strata
