// strata-expert-store: builds the expert store in shared memory and serves its layout
// (strata.v1.ExpertStore) to the workers, every call checked for the cluster token.
#ifndef STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_SERVER_H_
#define STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/cluster_token.h"
#include "services/expert-store/cpu_tier_service.h"
#include "services/expert-store/expert_store.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct ExpertStoreServerOptions {
  std::string model_dir;
  std::string listen = "127.0.0.1:0";  // unix:PATH, or HOST:PORT with a token
  ClusterToken token;
  ExpertStoreOptions store;
  // Adopt the store a killed strata-expert-store left under store.segment_prefix when it checks
  // out.
  bool reattach = true;
  CpuTierOptions cpu_tier;
};

class ExpertStoreServer final : public v1::ExpertStore::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<ExpertStoreServer>> Start(
      const ExpertStoreServerOptions& options);
  ~ExpertStoreServer() override;

  const std::string& address() const { return address_; }
  const ExpertStore& store() const { return *store_; }
  CpuTierService& cpu_tier() { return *cpu_tier_; }

  grpc::ServerUnaryReactor* GetLayout(grpc::CallbackServerContext* context,
                                      const v1::GetLayoutRequest* request,
                                      v1::ExpertLayout* response) override;
  grpc::ServerUnaryReactor* AttachCompute(grpc::CallbackServerContext* context,
                                          const v1::AttachComputeRequest* request,
                                          v1::AttachComputeResponse* response) override;

 private:
  ExpertStoreServer() = default;

  std::unique_ptr<Model> model_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<CpuTierService> cpu_tier_;  // after store_: its threads read the store
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  ClusterToken token_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_SERVER_H_
