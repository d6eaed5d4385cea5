// The client API (strata.v1.Generation) on the gRPC callback API: Generate streams tokens
// from the scheduler; ModelInfo, Tokenize and Detokenize answer at once; Score when its
// score-only request is done.
#ifndef STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_
#define STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_

#include <functional>

#include "common/grammar/grammar_compiler.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/grpc_status.h"
#include "services/router/request_budget.h"
#include "services/router/scheduler.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {

// Every method takes its request as bytes and parses it itself (client_request.h), so that
// malformed requests get INVALID_ARGUMENT with a message rather than gRPC's bare UNIMPLEMENTED.
using RawGenerationService = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_ModelInfo<v1::Generation::WithRawCallbackMethod_Tokenize<
        v1::Generation::WithRawCallbackMethod_Detokenize<
            v1::Generation::WithRawCallbackMethod_Score<v1::Generation::Service>>>>>;

class GenerationService final : public RawGenerationService {
 public:
  // `tokenizer` may be null (ids only). `num_workers` is reported by ModelInfo. `budget`
  // bounds the bytes of requests being prepared (request_budget.h). `grammar` compiles
  // response formats (null: every one is refused); it must outlive the service.
  GenerationService(const ModelConfig& config, Scheduler& scheduler, const Tokenizer* tokenizer,
                    int num_workers, RequestBudgetOptions budget = {},
                    GrammarCompiler* grammar = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

  // Turns a client request into the scheduler's form: INVALID_ARGUMENT for bad input.
  absl::StatusOr<RequestSpec> ToSpec(const v1::GenerateRequest& request) const;
  absl::StatusOr<RequestSpec> ScoreSpec(const v1::ScoreRequest& request) const;

 private:
  // The grammar of a request's response format; null for text. INVALID_ARGUMENT naming
  // response_format when it cannot be compiled.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileFormat(
      const v1::ResponseFormat& format) const;
  absl::StatusOr<RequestBudget::Hold> TakeBudget(const grpc::CallbackServerContext& context,
                                                 const grpc::ByteBuffer& request);

  const ModelConfig& config_;
  Scheduler& scheduler_;
  const Tokenizer* tokenizer_;
  int num_workers_;
  RequestBudget budget_;
  GrammarCompiler* grammar_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_GENERATION_SERVICE_H_
