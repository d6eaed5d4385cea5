#include "services/expert-worker/expert_worker_service.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/fp8_rows.h"
#include "common/transport/tier_counters_proto.h"
#include "common/util/grpc_status.h"

namespace strata {
namespace {

// Read a request, run it, write the response, repeat: one request in flight per stream.
class ExchangeReactor : public grpc::ServerBidiReactor<v1::ExpertRequest, v1::ExpertResponse> {
 public:
  ExchangeReactor(WorkerExecutor& executor, std::mutex& executor_mu, const absl::Status& allowed)
      : executor_(executor), executor_mu_(executor_mu) {
    if (!allowed.ok()) {
      Finish(ToGrpcStatus(allowed));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);  // the router closed its side
      return;
    }
    response_.Clear();
    response_.set_step(request_.step());
    response_.set_layer(request_.layer());
    const absl::Status status = RunRequest();
    if (!status.ok()) response_.set_error(std::string(status.message()));
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status RunRequest() {
    const size_t n = request_.num_tokens(), k = request_.top_k();
    const bool fp8 = !request_.hidden_fp8().empty();
    const size_t hidden_bytes = fp8 ? request_.hidden_fp8().size() : request_.hidden().size();
    const size_t value_bytes = fp8 ? 1 : sizeof(float);
    if (n == 0 || hidden_bytes % (n * value_bytes) != 0 ||
        (fp8 && static_cast<size_t>(request_.hidden_scales_size()) != n) ||
        static_cast<size_t>(request_.experts_size()) != n * k ||
        static_cast<size_t>(request_.weights_size()) != n * k) {
      return absl::InvalidArgumentError("malformed expert request");
    }
    ExpertRequestView view;
    view.step = request_.step();
    view.layer = request_.layer();
    view.num_tokens = static_cast<uint32_t>(n);
    view.top_k = static_cast<uint32_t>(k);
    view.hidden_size = static_cast<uint32_t>(hidden_bytes / (n * value_bytes));
    if (fp8) {
      hidden_.resize(n * view.hidden_size);
      DequantizeRowsFp8(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(request_.hidden_fp8().data()),
                              hidden_.size()),
          request_.hidden_scales(), n, view.hidden_size, absl::MakeSpan(hidden_));
      view.hidden = hidden_;
    } else {
      view.hidden = absl::Span<const float>(
          reinterpret_cast<const float*>(request_.hidden().data()), n * view.hidden_size);
    }
    view.experts = absl::Span<const int32_t>(request_.experts().data(), n * k);
    view.weights = absl::Span<const float>(request_.weights().data(), n * k);
    view.hot_ratio = request_.has_hot_ratio() ? request_.hot_ratio() : -1.0f;
    view.lent_slots = request_.lent_slots();
    std::lock_guard<std::mutex> lock(executor_mu_);
    const absl::Status status = executor_.Run(view);
    TierCountersToProto(executor_.counters(), *response_.mutable_tiers());
    if (!status.ok()) return status;
    const Tensor& partial = executor_.partial();
    if (request_.fp8_partial()) {
      std::string& codes = *response_.mutable_partial_fp8();
      codes.resize(partial.size());
      response_.mutable_partial_scales()->Resize(static_cast<int>(n), 0.0f);
      QuantizeRowsFp8(absl::MakeConstSpan(partial.data(), partial.size()), n, view.hidden_size,
                      absl::MakeSpan(reinterpret_cast<uint8_t*>(codes.data()), codes.size()),
                      absl::MakeSpan(response_.mutable_partial_scales()->mutable_data(), n));
    } else {
      response_.set_partial(std::string(reinterpret_cast<const char*>(partial.data()),
                                        partial.size() * sizeof(float)));
    }
    return absl::OkStatus();
  }

  WorkerExecutor& executor_;
  std::mutex& executor_mu_;
  v1::ExpertRequest request_;
  v1::ExpertResponse response_;
  std::vector<float> hidden_;  // an FP8 request's hidden states as float32
};

}  // namespace

grpc::ServerBidiReactor<v1::ExpertRequest, v1::ExpertResponse>* ExpertWorkerService::Exchange(
    grpc::CallbackServerContext* context) {
  return new ExchangeReactor(executor_, executor_mu_, token_.Check(*context));
}

}  // namespace strata
