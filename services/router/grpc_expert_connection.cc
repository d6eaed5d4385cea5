#include "services/router/grpc_expert_connection.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/transport/fp8_rows.h"
#include "common/transport/tier_counters_proto.h"

namespace strata {

absl::StatusOr<std::unique_ptr<GrpcExpertConnection>> GrpcExpertConnection::Connect(
    const std::string& address, const ClusterToken& token, GrpcExpertOptions options) {
  std::unique_ptr<GrpcExpertConnection> c(new GrpcExpertConnection());
  c->options_ = options;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat("cannot reach expert worker at ", address));
  }
  c->stub_ = v1::ExpertWorker::NewStub(channel);
  c->context_ = std::make_unique<grpc::ClientContext>();
  token.Attach(*c->context_);
  c->stream_ = c->stub_->Exchange(c->context_.get());
  if (!c->stream_) return absl::UnavailableError("cannot open the expert exchange stream");
  return c;
}

void GrpcExpertConnection::Abandon() {
  alive_.store(false);
  if (context_) context_->TryCancel();
}

GrpcExpertConnection::~GrpcExpertConnection() {
  if (stream_) {
    context_->TryCancel();
    stream_->Finish();
  }
}

absl::Status GrpcExpertConnection::Send(const ExpertRequestView& r) {
  request_.Clear();
  request_.set_step(r.step);
  request_.set_layer(r.layer);
  request_.set_num_tokens(r.num_tokens);
  request_.set_top_k(r.top_k);
  num_tokens_ = r.num_tokens;
  hidden_size_ = r.hidden_size;
  if (options_.fp8_activations) {
    std::string& codes = *request_.mutable_hidden_fp8();
    codes.resize(r.hidden.size());
    request_.mutable_hidden_scales()->Resize(static_cast<int>(r.num_tokens), 0.0f);
    QuantizeRowsFp8(r.hidden, r.num_tokens, r.hidden_size,
                    absl::MakeSpan(reinterpret_cast<uint8_t*>(codes.data()), codes.size()),
                    absl::MakeSpan(request_.mutable_hidden_scales()->mutable_data(),
                                   static_cast<size_t>(r.num_tokens)));
    request_.set_fp8_partial(true);
  } else {
    request_.set_hidden(std::string(reinterpret_cast<const char*>(r.hidden.data()),
                                    r.hidden.size() * sizeof(float)));
  }
  request_.mutable_experts()->Add(r.experts.begin(), r.experts.end());
  request_.mutable_weights()->Add(r.weights.begin(), r.weights.end());
  if (r.hot_ratio >= 0.0f) request_.set_hot_ratio(r.hot_ratio);
  request_.set_lent_slots(r.lent_slots);
  if (!stream_->Write(request_)) {
    alive_.store(false);
    return absl::UnavailableError("expert worker stream closed");
  }
  if (options_.wire_bytes != nullptr) options_.wire_bytes->sent.fetch_add(request_.ByteSizeLong());
  return absl::OkStatus();
}

absl::Status GrpcExpertConnection::Receive(
    absl::FunctionRef<void(const ExpertResponseView&)> consume, absl::Duration timeout) {
  // The synchronous stream has no per-read deadline; a dead worker breaks the stream.
  if (!stream_->Read(&response_)) {
    alive_.store(false);
    return absl::UnavailableError("expert worker stream closed");
  }
  if (options_.wire_bytes != nullptr) {
    options_.wire_bytes->received.fetch_add(response_.ByteSizeLong());
  }
  ExpertResponseView view;
  view.step = response_.step();
  view.layer = response_.layer();
  view.error = response_.error();
  view.tiers = TierCountersFromProto(response_.tiers());
  if (view.error.empty()) {
    view.hidden_size = num_tokens_ == 0 ? 0 : hidden_size_;
    view.num_tokens = num_tokens_;
    const size_t count = size_t{view.num_tokens} * view.hidden_size;
    if (!response_.partial_fp8().empty()) {
      if (response_.partial_fp8().size() != count ||
          static_cast<size_t>(response_.partial_scales_size()) != view.num_tokens) {
        return absl::DataLossError("expert response (FP8) has the wrong size");
      }
      partial_.resize(count);
      DequantizeRowsFp8(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(response_.partial_fp8().data()),
                              count),
          response_.partial_scales(), view.num_tokens, view.hidden_size, absl::MakeSpan(partial_));
      view.partial = partial_;
    } else {
      if (response_.partial().size() != count * sizeof(float)) {
        return absl::DataLossError("expert response has the wrong size");
      }
      view.partial = absl::Span<const float>(
          reinterpret_cast<const float*>(response_.partial().data()), count);
    }
  }
  consume(view);
  return absl::OkStatus();
}

}  // namespace strata
