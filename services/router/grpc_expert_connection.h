// An ExpertConnection over a gRPC stream to a worker's ExpertWorker.Exchange.
#ifndef STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_
#define STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/cluster_token.h"
#include "common/transport/expert_connection.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

class GrpcExpertConnection : public ExpertConnection {
 public:
  // The stream carries `token` (the worker checks it). HTTP/2 keepalive pings every second: a
  // worker process that stops (or its host) ends the stream within about two seconds.
  static absl::StatusOr<std::unique_ptr<GrpcExpertConnection>> Connect(const std::string& address,
                                                                       const ClusterToken& token);
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
  v1::ExpertRequest request_;
  v1::ExpertResponse response_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_GRPC_EXPERT_CONNECTION_H_
