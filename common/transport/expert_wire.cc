#include "common/transport/expert_wire.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace strata {
namespace {

constexpr uint32_t kRequestMagic = 0x51455453;   // "STEQ"
constexpr uint32_t kResponseMagic = 0x53455453;  // "STES"

struct RequestHeader {
  uint32_t magic;
  uint32_t layer;
  uint64_t step;
  uint32_t num_tokens;
  uint32_t top_k;
  uint32_t hidden_size;
  uint32_t kind;
  float hot_ratio;
  uint32_t lent_slots;
};

struct ResponseHeader {
  uint32_t magic;
  uint32_t layer;
  uint64_t step;
  uint32_t num_tokens;
  uint32_t hidden_size;
  uint32_t error_bytes;
  uint32_t flags;  // kOnDevice
  TierCounters tiers;
};

constexpr uint32_t kOnDevice = 1;

static_assert(sizeof(RequestHeader) == 40 && sizeof(ResponseHeader) == 120);

template <typename T>
absl::Span<const T> ViewAt(absl::Span<const uint8_t> bytes, size_t offset, size_t count) {
  return absl::Span<const T>(reinterpret_cast<const T*>(bytes.data() + offset), count);
}

}  // namespace

size_t ExpertRequestBytes(uint32_t num_tokens, uint32_t top_k, uint32_t hidden_size) {
  return sizeof(RequestHeader) + size_t{num_tokens} * hidden_size * sizeof(float) +
         size_t{num_tokens} * top_k * (sizeof(int32_t) + sizeof(float));
}

size_t ExpertPrefetchBytes(uint32_t num_experts) {
  return sizeof(RequestHeader) + size_t{num_experts} * sizeof(int32_t);
}

size_t ExpertDeviceRunBytes() { return sizeof(RequestHeader); }

size_t ExpertDeviceStepBytes(uint32_t num_layers) {
  return sizeof(RequestHeader) + size_t{num_layers} * sizeof(int32_t);
}

size_t ExpertSlotBytes(uint32_t max_tokens, uint32_t top_k, uint32_t hidden_size) {
  return std::max({ExpertRequestBytes(max_tokens, top_k, hidden_size),
                   ExpertResponseBytes(max_tokens, hidden_size, 0),
                   ExpertResponseBytes(max_tokens, hidden_size, kMaxExpertErrorBytes)});
}

size_t EncodedSize(const ExpertRequestView& r) {
  switch (r.kind) {
    case ExpertMessageKind::kPrefetch:
      return ExpertPrefetchBytes(r.top_k);
    case ExpertMessageKind::kDeviceRun:
      return ExpertDeviceRunBytes();
    case ExpertMessageKind::kDeviceStep:
      return ExpertDeviceStepBytes(static_cast<uint32_t>(r.layers.size()));
    case ExpertMessageKind::kRun:
      break;
  }
  return ExpertRequestBytes(r.num_tokens, r.top_k, r.hidden_size);
}

size_t ExpertDeviceResponseBytes(size_t error_bytes) {
  return sizeof(ResponseHeader) + error_bytes;
}

size_t ExpertResponseBytes(uint32_t num_tokens, uint32_t hidden_size, size_t error_bytes) {
  if (error_bytes > 0) return sizeof(ResponseHeader) + error_bytes;
  return sizeof(ResponseHeader) + size_t{num_tokens} * hidden_size * sizeof(float);
}

void EncodeExpertRequest(const ExpertRequestView& r, absl::Span<uint8_t> out) {
  const bool step = r.kind == ExpertMessageKind::kDeviceStep;
  RequestHeader h{kRequestMagic,
                  step ? static_cast<uint32_t>(r.layers.size()) : r.layer,
                  r.step,
                  r.num_tokens,
                  r.top_k,
                  r.hidden_size,
                  static_cast<uint32_t>(r.kind),
                  r.hot_ratio,
                  r.lent_slots};
  uint8_t* p = out.data();
  std::memcpy(p, &h, sizeof(h));
  if (r.kind == ExpertMessageKind::kDeviceRun) return;
  p += sizeof(h);
  if (step) {
    std::memcpy(p, r.layers.data(), r.layers.size() * sizeof(int32_t));
    return;
  }
  std::memcpy(p, r.hidden.data(), r.hidden.size() * sizeof(float));
  p += r.hidden.size() * sizeof(float);
  std::memcpy(p, r.experts.data(), r.experts.size() * sizeof(int32_t));
  p += r.experts.size() * sizeof(int32_t);
  std::memcpy(p, r.weights.data(), r.weights.size() * sizeof(float));
}

void EncodeExpertResponse(const ExpertResponseView& r, absl::Span<uint8_t> out) {
  ResponseHeader h{kResponseMagic,
                   r.layer,
                   r.step,
                   r.num_tokens,
                   r.hidden_size,
                   static_cast<uint32_t>(r.error.size()),
                   r.on_device ? kOnDevice : 0,
                   r.tiers};
  std::memcpy(out.data(), &h, sizeof(h));
  if (!r.error.empty()) {
    std::memcpy(out.data() + sizeof(h), r.error.data(), r.error.size());
  } else if (!r.on_device) {
    std::memcpy(out.data() + sizeof(h), r.partial.data(), r.partial.size() * sizeof(float));
  }
}

ExpertResponseView ExpertResponseFor(absl::Span<const uint8_t> request_bytes,
                                     const absl::StatusOr<ExpertRequestView>& request,
                                     const absl::Status& status, bool on_device,
                                     absl::Span<const float> partial, std::string& error) {
  ExpertResponseView response;
  response.on_device = on_device;
  if (request.ok()) {
    response.step = request->step;
    response.layer = request->layer;
    response.num_tokens = request->num_tokens;
    response.hidden_size = request->hidden_size;
  } else {
    response.step = ExpertRequestStep(request_bytes);
  }
  error.clear();
  if (status.ok()) {
    if (!on_device) response.partial = partial;
    return response;
  }
  // An empty message would read as success on the other side.
  error = status.message().empty() ? absl::StatusCodeToString(status.code())
                                   : std::string(status.message());
  error.resize(std::min(error.size(), kMaxExpertErrorBytes));
  response.error = error;
  return response;
}

size_t EncodedSize(const ExpertResponseView& r) {
  return r.on_device ? ExpertDeviceResponseBytes(r.error.size())
                     : ExpertResponseBytes(r.num_tokens, r.hidden_size, r.error.size());
}

uint64_t ExpertRequestStep(absl::Span<const uint8_t> bytes) {
  RequestHeader h;
  if (bytes.size() < sizeof(h)) return 0;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h.magic == kRequestMagic ? h.step : 0;
}

absl::StatusOr<ExpertRequestView> DecodeExpertRequest(absl::Span<const uint8_t> bytes) {
  RequestHeader h;
  if (bytes.size() < sizeof(h)) return absl::DataLossError("expert request: truncated header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kRequestMagic) return absl::DataLossError("expert request: bad magic");
  ExpertRequestView r;
  r.hot_ratio = h.hot_ratio;
  r.lent_slots = h.lent_slots;
  r.step = h.step;
  r.layer = h.layer;
  r.num_tokens = h.num_tokens;
  r.top_k = h.top_k;
  r.hidden_size = h.hidden_size;
  switch (h.kind) {
    case static_cast<uint32_t>(ExpertMessageKind::kPrefetch):
      if (h.num_tokens != 0 || h.hidden_size != 0 || bytes.size() != ExpertPrefetchBytes(h.top_k)) {
        return absl::DataLossError("expert prefetch: size does not match its header");
      }
      r.kind = ExpertMessageKind::kPrefetch;
      r.experts = ViewAt<int32_t>(bytes, sizeof(h), h.top_k);
      return r;
    case static_cast<uint32_t>(ExpertMessageKind::kDeviceRun):
      if (bytes.size() != ExpertDeviceRunBytes()) {
        return absl::DataLossError("expert device run: size does not match its header");
      }
      r.kind = ExpertMessageKind::kDeviceRun;
      return r;
    case static_cast<uint32_t>(ExpertMessageKind::kDeviceStep):
      if (bytes.size() != ExpertDeviceStepBytes(h.layer)) {
        return absl::DataLossError("expert device step: size does not match its header");
      }
      r.kind = ExpertMessageKind::kDeviceStep;
      r.layer = 0;  // the header's layer field counts the layers
      r.layers = ViewAt<int32_t>(bytes, sizeof(h), h.layer);
      return r;
    case static_cast<uint32_t>(ExpertMessageKind::kRun):
      break;
    default:
      return absl::DataLossError("expert request: unknown kind");
  }
  if (bytes.size() != ExpertRequestBytes(h.num_tokens, h.top_k, h.hidden_size)) {
    return absl::DataLossError("expert request: size does not match its header");
  }
  size_t offset = sizeof(h);
  const size_t hidden_count = size_t{h.num_tokens} * h.hidden_size;
  const size_t slot_count = size_t{h.num_tokens} * h.top_k;
  r.hidden = ViewAt<float>(bytes, offset, hidden_count);
  offset += hidden_count * sizeof(float);
  r.experts = ViewAt<int32_t>(bytes, offset, slot_count);
  offset += slot_count * sizeof(int32_t);
  r.weights = ViewAt<float>(bytes, offset, slot_count);
  return r;
}

absl::StatusOr<ExpertResponseView> DecodeExpertResponse(absl::Span<const uint8_t> bytes) {
  ResponseHeader h;
  if (bytes.size() < sizeof(h)) return absl::DataLossError("expert response: truncated header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kResponseMagic) return absl::DataLossError("expert response: bad magic");
  const bool on_device = (h.flags & kOnDevice) != 0;
  const size_t expected = on_device
                              ? ExpertDeviceResponseBytes(h.error_bytes)
                              : ExpertResponseBytes(h.num_tokens, h.hidden_size, h.error_bytes);
  if (bytes.size() != expected) {
    return absl::DataLossError("expert response: size does not match its header");
  }
  ExpertResponseView r;
  r.on_device = on_device;
  r.step = h.step;
  r.layer = h.layer;
  r.num_tokens = h.num_tokens;
  r.hidden_size = h.hidden_size;
  r.tiers = h.tiers;
  if (h.error_bytes > 0) {
    r.error =
        absl::string_view(reinterpret_cast<const char*>(bytes.data() + sizeof(h)), h.error_bytes);
  } else if (!on_device) {
    r.partial = ViewAt<float>(bytes, sizeof(h), size_t{h.num_tokens} * h.hidden_size);
  }
  return r;
}

}  // namespace strata
