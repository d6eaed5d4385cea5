#include "services/expert-store/expert_store_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "absl/strings/str_cat.h"
#include "common/util/grpc_listen.h"
#include "common/util/grpc_status.h"
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ExpertStoreServer>> ExpertStoreServer::Start(
    const ExpertStoreServerOptions& options) {
  RETURN_IF_ERROR(CheckInternalListener("strata-expert-store", options.listen, options.token));
  std::unique_ptr<ExpertStoreServer> s(new ExpertStoreServer());
  s->token_ = options.token;
  ASSIGN_OR_RETURN(s->model_, LoadModel(options.model_dir));
  ASSIGN_OR_RETURN(s->store_, options.reattach ? ExpertStore::Attach(*s->model_, options.store)
                                               : ExpertStore::Build(*s->model_, options.store));
  s->cpu_tier_ = std::make_unique<CpuTierService>(
      s->model_->config, [server = s.get()] { return server->store_->layout(); }, options.cpu_tier);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(s.get());
  builder.SetMaxSendMessageSize(256 << 20);
  ASSIGN_OR_RETURN(ListeningServer listening, StartListening(builder, options.listen));
  s->server_ = std::move(listening.server);
  s->address_ = std::move(listening.address);
  return s;
}

ExpertStoreServer::~ExpertStoreServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

grpc::ServerUnaryReactor* ExpertStoreServer::GetLayout(grpc::CallbackServerContext* context,
                                                       const v1::GetLayoutRequest* request,
                                                       v1::ExpertLayout* response) {
  auto* reactor = context->DefaultReactor();
  const absl::Status allowed = token_.Check(*context);
  if (allowed.ok()) *response = store_->layout();
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

grpc::ServerUnaryReactor* ExpertStoreServer::AttachCompute(grpc::CallbackServerContext* context,
                                                           const v1::AttachComputeRequest* request,
                                                           v1::AttachComputeResponse* response) {
  // Quick: the worker created the channel before asking; serving runs on a thread of its own.
  absl::Status status = token_.Check(*context);
  if (status.ok()) {
    status = cpu_tier_->Attach(request->channel_name(), static_cast<pid_t>(request->pid()));
  }
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace strata
