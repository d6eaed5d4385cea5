// An ExpertConnection over a gRPC stream to a worker's ExpertWorker.Exchange.
#ifndef STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_
#define STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster/cluster_token.h"
#include "common/transport/expert_connection.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct GrpcExpertOptions {
  // Hidden states and partial sums cross as FP8 E4M3 with a scale per token
  // (common/transport/fp8_rows.h) instead of float32: a quarter of the bytes.
  bool fp8_activations = false;
  WireBytes* wire_bytes = nullptr;  // counts every message's serialized bytes when set
};

class GrpcExpertConnection : public ExpertConnection {
 public:
  // The stream carries `token` (the worker checks it). HTTP/2 keepalive pings every second: a
  // worker process that stops (or its host) ends the stream within about two seconds.
  static absl::StatusOr<std::unique_ptr<GrpcExpertConnection>> Connect(
      const std::string& address, const ClusterToken& token, GrpcExpertOptions options = {});
  ~GrpcExpertConnection() override;

  absl::Status Send(const ExpertRequestView& request) override;
  absl::Status Receive(absl::FunctionRef<void(const ExpertResponseView&)> consume,
                       absl::Duration timeout) override;
  bool Alive() const override { return alive_.load(); }
  void Abandon() override;

 private:
  GrpcExpertConnection() = default;

  std::unique_ptr<v1::ExpertWorker::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ExpertRequest, v1::ExpertResponse>> stream_;
  std::atomic<bool> alive_{true};
  GrpcExpertOptions options_;
  v1::ExpertRequest request_;
  v1::ExpertResponse response_;
  // The shape of the request in flight, and an FP8 partial made float32 again.
  uint32_t num_tokens_ = 0;
  uint32_t hidden_size_ = 0;
  std::vector<float> partial_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_
