#include "services/router/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "common/cluster/protocol_version.h"
#include "services/router/generation_service.h"
#include "services/router/grpc_expert_connection.h"
#include "services/router/shm_expert_connection.h"

namespace strata {

CoordinatorService::CoordinatorService(const ModelConfig& config, WorkerExpertBackend& experts,
                                       CoordinatorOptions options)
    : config_(config), experts_(experts), options_(std::move(options)) {}

absl::Status CoordinatorService::Register(const v1::RegisterWorkerRequest& request,
                                          v1::RegisterWorkerResponse& response) {
  const int index = static_cast<int>(request.worker_index());
  if (request.protocol_version() != kClusterProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", index, " speaks cluster protocol version ",
                     request.protocol_version(), ", this strata-router ", kClusterProtocolVersion,
                     ": run the router and its workers from the same build"));
  }
  if (index < 0 || index >= experts_.num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker index ", index, " is outside [0, ", experts_.num_workers(), ")"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_.insert(request.worker_index()).second) restarts_.fetch_add(1);
  }
  const v1::Transport asked = request.transport();
  if (options_.cuda_ipc && asked != v1::TRANSPORT_CUDA_IPC) {
    return absl::FailedPreconditionError(absl::StrCat(
        "strata-router runs on ", options_.router_device,
        " and takes only CUDA IPC workers (a GPU on this host, shm transport); worker ", index,
        " (", request.device(), ") asked for another transport"));
  }
  std::shared_ptr<ExpertConnection> connection;
  switch (asked) {
    case v1::TRANSPORT_SHARED_MEMORY:
    case v1::TRANSPORT_CUDA_IPC: {
      const bool ipc = asked == v1::TRANSPORT_CUDA_IPC && options_.cuda_ipc;
      const std::string name =
          absl::StrCat(options_.channel_prefix, "-w", index, "-", request.incarnation());
      // Over CUDA IPC the channel carries only headers: slots for one token are plenty.
      auto shm = ShmExpertConnection::Create(name, ipc ? 1 : options_.max_tokens_per_step,
                                             config_.top_k, static_cast<int>(config_.hidden_size),
                                             ipc ? kIpcSpinUs : kDefaultSpinUs,
                                             options_.heartbeat_timeout);
      if (!shm.ok()) return shm.status();
      response.set_channel_name(name);
      if (ipc) {
        auto link = options_.cuda_ipc(request, *std::move(shm), *response.mutable_cuda_ipc());
        if (!link.ok()) return link.status();
        connection = *std::move(link);
        response.set_transport(v1::TRANSPORT_CUDA_IPC);
      } else {
        connection = *std::move(shm);
        response.set_transport(v1::TRANSPORT_SHARED_MEMORY);
      }
      break;
    }
    case v1::TRANSPORT_GRPC: {
      auto grpc_connection = GrpcExpertConnection::Connect(
          request.address(), options_.token,
          {.fp8_activations = experts_.fp8_activations(), .wire_bytes = &experts_.wire_bytes()});
      if (!grpc_connection.ok()) return grpc_connection.status();
      connection = *std::move(grpc_connection);
      response.set_transport(v1::TRANSPORT_GRPC);
      break;
    }
    default:
      return absl::InvalidArgumentError("unknown transport");
  }
  // The worker's memory is the router's: the same GPU, or both on this host's CPUs.
  const bool shares_memory =
      options_.cuda_ipc
          ? !options_.router_gpu_uuid.empty() && request.gpu_uuid() == options_.router_gpu_uuid
          : asked == v1::TRANSPORT_SHARED_MEMORY && request.device() == "cpu";
  experts_.SetConnection(index, std::move(connection), request.tiered(), shares_memory);
  response.set_num_workers(experts_.num_workers());
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (!config_.layer_is_moe[layer]) continue;
    v1::ExpertRange* range = response.add_owned();
    range->set_layer(layer);
    for (int e : experts_.placement().OwnedBy(layer, index)) {
      range->add_experts(e);
      if (layer < static_cast<int>(options_.calibration.size()) &&
          e < static_cast<int>(options_.calibration[layer].size())) {
        v1::ExpertCount* count = response.add_calibration();
        count->set_layer(layer);
        count->set_expert(e);
        count->set_count(static_cast<uint64_t>(options_.calibration[layer][e]));
      }
    }
  }
  // Set before the coordinator serves (RouterServer::Start).
  response.set_hot_ratio(experts_.hot_ratio());
  response.set_lent_slots(experts_.lent_slots(index));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::Status allowed = options_.token.Check(*context);
  reactor->Finish(ToGrpcStatus(allowed.ok() ? Register(*request, *response) : allowed));
  return reactor;
}

}  // namespace strata
