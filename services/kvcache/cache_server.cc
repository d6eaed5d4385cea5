#include "services/kvcache/cache_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<CacheServer>> CacheServer::Start(const CacheOptions& options) {
  std::unique_ptr<CacheServer> s(new CacheServer());
  ASSIGN_OR_RETURN(s->model_, LoadModel(options.model_dir));
  ASSIGN_OR_RETURN(s->store_, ExpertStore::Build(*s->model_, options.store));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s.get());
  builder.SetMaxSendMessageSize(256 << 20);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  s->address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", port);
  return s;
}

CacheServer::~CacheServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

grpc::ServerUnaryReactor* CacheServer::GetLayout(grpc::CallbackServerContext* context,
                                                 const v1::GetLayoutRequest* request,
                                                 v1::ExpertLayout* response) {
  *response = store_->layout();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace strata
