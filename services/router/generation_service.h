// The client API (strata.v1.Generation) on the gRPC callback API: Generate streams tokens
// from the scheduler; ModelInfo, Tokenize and Detokenize answer at once.
#ifndef STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_
#define STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_

#include <functional>

#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/grpc_status.h"
#include "services/router/scheduler.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // `tokenizer` may be null (ids only). `num_workers` is reported by ModelInfo.
  GenerationService(const ModelConfig& config, Scheduler& scheduler, const Tokenizer* tokenizer,
                    int num_workers);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const v1::ModelInfoRequest* request,
                                      v1::ModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context,
                                  const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override;

  // Turns a client request into the scheduler's form: INVALID_ARGUMENT for bad input.
  absl::StatusOr<RequestSpec> ToSpec(const v1::GenerateRequest& request) const;

 private:
  const ModelConfig& config_;
  Scheduler& scheduler_;
  const Tokenizer* tokenizer_;
  int num_workers_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_
