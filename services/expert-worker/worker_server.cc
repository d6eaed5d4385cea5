#include "services/expert-worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/backend/cpu/cpu_expert_slots.h"
#include "common/cluster/protocol_version.h"
#include "common/shm/channel.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/cuda_expert_slots.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/device_experts.h"
#include "common/backend/cuda/staged_expert_backend.h"
#include "common/cuda/cuda_context.h"
#endif
#include "common/util/grpc_listen.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

// How long a CUDA IPC worker spins for the router's next message before it sleeps.
constexpr absl::Duration kDeviceStepSpin = absl::Milliseconds(20);

// The liveness pulse (WorkerServer::Pulse): how often it looks, the CPU time that counts as
// progress in that time, and the longest one message may keep it beating.
constexpr auto kPulseInterval = std::chrono::milliseconds(100);
constexpr double kProgressCpuSeconds = 0.005;
constexpr absl::Duration kMaxBusy = absl::Seconds(60);

double ProcessCpuSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

// Calls `attempt` until it succeeds or `stopping`, saying every few seconds what it waits for
// (first after two seconds, so that a routine restart of a peer stays quiet).
template <typename T>
absl::StatusOr<T> RetryUntil(const std::function<absl::StatusOr<T>()>& attempt,
                             const std::atomic<bool>& stopping, const std::string& what,
                             const std::function<void(const std::string&)>& log) {
  absl::Time next_log = absl::Now() + absl::Seconds(2);
  while (true) {
    absl::StatusOr<T> result = attempt();
    if (result.ok() || absl::IsInvalidArgument(result.status()) ||
        absl::IsFailedPrecondition(result.status())) {
      return result;
    }
    if (stopping.load()) return absl::CancelledError("stopped");
    if (absl::Now() >= next_log) {
      log(absl::StrCat("waiting for ", what, " (", result.status().message(), ")"));
      next_log = absl::Now() + absl::Seconds(5);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace

WorkerServer::~WorkerServer() {
  stopping_.store(true);
  if (pulse_.joinable()) pulse_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // The slots outlive what they were handed.
  if (tiers_ != nullptr) tiers_->AttachHostTier(nullptr, nullptr);
  if (slots_ != nullptr) slots_->SetResidency(nullptr);
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  std::unique_ptr<WorkerServer> w(new WorkerServer());
  w->options_ = options;
  std::random_device rd;
  w->incarnation_ = (static_cast<uint64_t>(rd()) << 20) ^ static_cast<uint64_t>(::getpid());
  ASSIGN_OR_RETURN(w->config_, LoadModelConfig(options.model_dir));

  auto store = v1::ExpertStore::NewStub(
      grpc::CreateChannel(options.store_address, grpc::InsecureChannelCredentials()));
  std::function<absl::StatusOr<v1::ExpertLayout>()> fetch =
      [&]() -> absl::StatusOr<v1::ExpertLayout> {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    options.token.Attach(context);
    v1::ExpertLayout layout;
    const grpc::Status s = store->GetLayout(&context, v1::GetLayoutRequest(), &layout);
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return absl::FailedPreconditionError(
          absl::StrCat("strata-expert-store refused this worker: ", s.error_message()));
    }
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return layout;
  };
  ASSIGN_OR_RETURN(
      v1::ExpertLayout layout,
      RetryUntil(fetch, w->stopping_,
                 absl::StrCat("strata-expert-store at ", options.store_address), options.log));
  ASSIGN_OR_RETURN(w->experts_, MappedExperts::Map(layout, w->config_));
  const bool in_place = layout.segments_size() > 0 && !layout.segments(0).file_path().empty();
  options.log(
      absl::StrCat("mapped ", layout.tensors_size(), " expert tensors in ", layout.segments_size(),
                   in_place ? " checkpoint file(s), in place" : " shared-memory segment(s)"));

  if (options.device != "cpu" && options.device.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", options.device, "\": use cpu or cuda:N"));
  }
  if (options.device == "cpu") w->pool_ = std::make_unique<ThreadPool>(options.num_threads);
  if (options.memory_budget > 0) {
    RETURN_IF_ERROR(w->CreateTiers());
  } else if (options.device == "cpu") {
    w->backend_ = std::make_unique<CpuExpertBackend>(w->config_, *w->experts_, *w->pool_);
  } else {
#if STRATA_HAVE_CUDA
    gpu::CudaExpertOptions cuda;
    cuda.format = gpu::WeightFormatNamed(options.expert_weights);
    cuda.max_tokens = options.max_tokens_per_step;
    cuda.on_layer = [&options](int layer, int layers, uint64_t bytes) {
      options.log(absl::StrCat("experts of layer ", layer + 1, "/", layers, " on ", options.device,
                               " (", bytes >> 20, " MiB)"));
    };
    ASSIGN_OR_RETURN(
        std::unique_ptr<gpu::StagedCudaExpertBackend> staged,
        gpu::StagedCudaExpertBackend::Create(
            w->config_, *w->experts_, std::atoi(options.device.c_str() + 5), std::move(cuda)));
    w->device_experts_ = staged->device_experts();
    w->backend_ = std::move(staged);
#else
    return absl::InvalidArgumentError("this build has no CUDA backend (nvcc was not found)");
#endif
  }
  w->pulse_ = std::thread([raw = w.get()] { raw->Pulse(); });
  if (w->tiers_ != nullptr) {
    w->executor_ = std::make_unique<WorkerExecutor>(w->config_, *w->tiers_, *w->slots_);
    w->AttachCpuTier();
  } else {
    w->executor_ = std::make_unique<WorkerExecutor>(w->config_, *w->backend_);
  }
  if (options.transport == v1::TRANSPORT_GRPC) {
    RETURN_IF_ERROR(
        CheckInternalListener("the ExpertWorker service", options.listen, options.token));
    w->service_ =
        std::make_unique<ExpertWorkerService>(*w->executor_, w->executor_mu_, options.token);
    grpc::ServerBuilder builder;
    builder.RegisterService(w->service_.get());
    builder.SetMaxReceiveMessageSize(256 << 20);
    // The router pings every second to tell a stopped worker from a slow one (keepalive).
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    ASSIGN_OR_RETURN(ListeningServer listening, StartListening(builder, options.listen));
    w->server_ = std::move(listening.server);
    w->service_address_ = std::move(listening.address);
  }
  return w;
}

absl::Status WorkerServer::CreateTiers() {
  const FfnWeights* sample = nullptr;
  for (int layer = 0; layer < config_.num_layers && sample == nullptr; ++layer) {
    if (config_.layer_is_moe[layer]) sample = experts_->Find(layer, 0);
  }
  if (sample == nullptr) return absl::FailedPreconditionError("the model has no experts");
  const int64_t max_tokens = options_.max_tokens_per_step;
  // Activations and scratch of one step come out of the budget too.
  uint64_t scratch =
      static_cast<uint64_t>(max_tokens) *
      (std::max(config_.top_k, 1) * (config_.moe_intermediate_size * 2 + config_.hidden_size * 4) +
       config_.hidden_size * 8);
  // FP8 slots quantize through one bf16 matrix on the device.
  if (options_.expert_weights == "fp8") {
    scratch += static_cast<uint64_t>(config_.hidden_size * config_.moe_intermediate_size * 2);
  }
  uint64_t slot_bytes = 0;
  const bool gpu = options_.device != "cpu";
  if (!gpu) {
    slot_bytes = CpuExpertSlotBytes(config_, sample->gate.dtype, sample->gate_bias.present());
  } else {
#if STRATA_HAVE_CUDA
    slot_bytes = gpu::CudaExpertSlotBytes(config_, gpu::WeightFormatNamed(options_.expert_weights));
#else
    return absl::InvalidArgumentError("this build has no CUDA backend (nvcc was not found)");
#endif
  }
  const uint64_t usable = options_.memory_budget > scratch ? options_.memory_budget - scratch : 0;
  const int num_slots = static_cast<int>(std::min<uint64_t>(usable / slot_bytes, 1 << 20));
  ExpertTierOptions tier_options = options_.tiers;
  // A GPU's slots start full: copies at start cost nothing a request waits for.
  tier_options.warm_start = gpu;
  tier_options.min_warm_slots = static_cast<int>(
      std::min<int64_t>(config_.num_experts, max_tokens * std::max(config_.top_k, 1)));
  if (num_slots < tier_options.min_warm_slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory budget %.1f MiB holds %d expert slot(s) of %.2f MiB after %.1f MiB of step "
        "buffers; at least %d are needed (the distinct experts one layer step can use)",
        options_.memory_budget / 1048576.0, num_slots, slot_bytes / 1048576.0, scratch / 1048576.0,
        tier_options.min_warm_slots));
  }
  if (!gpu) {
    ASSIGN_OR_RETURN(slots_, CpuExpertSlots::Create(config_, num_slots, sample->gate.dtype,
                                                    sample->gate_bias.present(), *pool_));
  } else {
#if STRATA_HAVE_CUDA
    gpu::CudaExpertSlotOptions cuda;
    cuda.format = gpu::WeightFormatNamed(options_.expert_weights);
    cuda.max_tokens = options_.max_tokens_per_step;
    cuda.num_slots = num_slots;
    cuda.usable_slots = 0;  // backed at registration, less what the router's KV pool holds
    ASSIGN_OR_RETURN(
        slots_, gpu::CreateCudaExpertSlots(config_, std::atoi(options_.device.c_str() + 5), cuda));
    // Pinned and mapped: loads run at PCIe speed and cold experts are read in place.
    std::vector<absl::Span<const uint8_t>> memory = experts_->segments();
    for (absl::Span<const uint8_t> file : experts_->files()) memory.push_back(file);
    const absl::Time start = absl::Now();
    uint64_t bytes = 0;
    for (absl::Span<const uint8_t> region : memory) {
      RETURN_IF_ERROR(slots_->RegisterHostMemory(region));
      bytes += region.size();
    }
    options_.log(absl::StrFormat("expert store pinned for %s: %.1f GiB in %.1f s", options_.device,
                                 bytes / 1073741824.0, absl::ToDoubleSeconds(absl::Now() - start)));
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      if (!config_.layer_is_moe[layer]) continue;
      for (int e = 0; e < config_.num_experts; ++e) {
        if (const FfnWeights* w = experts_->Find(layer, e)) {
          RETURN_IF_ERROR(slots_->SetCold(layer, e, *w));
        }
      }
    }
    if (!slots_->cold_readable_in_place()) {
      options_.log(
          "cold experts cannot be read in place (stored format differs from the slots'): "
          "decode steps run eagerly; store the checkpoint in the worker's format to replay them");
    }
    device_experts_ = slots_->device_experts();
#endif
  }
  ASSIGN_OR_RETURN(tiers_, ExpertTiers::Create(config_, *slots_, *experts_, tier_options));
  slots_->SetResidency(tiers_.get());
  options_.log(absl::StrFormat("expert memory: %d slots of %.2f MiB on %s (budget %.1f MiB)",
                               num_slots, slot_bytes / 1048576.0, options_.device,
                               options_.memory_budget / 1048576.0));
  return absl::OkStatus();
}

void WorkerServer::AttachCpuTier() {
  // On a CPU worker the CPU tier only adds a hop: it is used when forced.
  if (options_.cold_path.mode == ColdPathOptions::kCopy ||
      (options_.device == "cpu" && (options_.cold_path.mode == ColdPathOptions::kAuto ||
                                    options_.cold_path.mode == ColdPathOptions::kSplit))) {
    return;
  }
  auto client = CpuTierClient::Connect(
      options_.store_address, absl::StrCat(options_.channel_prefix, "-cpu-w", options_.index),
      options_.max_tokens_per_step, config_.top_k, static_cast<int>(config_.hidden_size),
      options_.token);
  if (!client.ok()) {
    Log(LogLevel::kWarning,
        absl::StrCat("no CPU tier (", client.status().message(), "); cold experts are copied"));
    return;
  }
  cpu_tier_ = *std::move(client);
  cpu_tier_->set_on_wait([this] { progress_.fetch_add(1); });
  if (absl::Status timed = CalibrateCpuTier(); !timed.ok()) {
    Log(LogLevel::kWarning,
        absl::StrCat("no CPU tier (", timed.message(), "); cold experts are copied"));
    cpu_tier_->Abandon();
    cpu_tier_.reset();
    return;
  }
  // One split per path: each shares a layer step's misses between copies and the CPU tier.
  const auto chooser = [this] {
    auto split =
        std::make_shared<ColdPathSplit>(options_.cold_path, slots_->slot_bytes(),
                                        config_.hidden_size, config_.moe_intermediate_size);
    return [split](int, int, int64_t tokens, bool first) {
      if (first) split->Start();
      return split->Choose(tokens) == ColdPath::kCpu;
    };
  };
  executor_->SetCpuTier(cpu_tier_.get(), chooser());
  // On the CUDA IPC path the CPU tier takes part in eager steps only: with kCpu and kSplit
  // every step is eager (no_graph_steps at registration); with kAuto, decode steps replay
  // graphs that read cold experts in place unless the router finds eager steps faster.
  if (device_experts_ != nullptr) {
    cpu_host_tier_ =
        std::make_unique<CpuHostTier>(*cpu_tier_, static_cast<int>(config_.hidden_size));
    tiers_->AttachHostTier(cpu_host_tier_.get(), chooser());
  }
  options_.log("CPU tier attached: strata-expert-store computes cold experts the cost model picks");
}

absl::Status WorkerServer::CalibrateCpuTier() {
  // Requests of 1 and of 8 tokens (or as many as a step holds), each for (layer, expert) pairs
  // of its own, read from memory: at least 5 pairs each, and 256 MiB (past any CPU's last-level
  // cache). Steps of one token leave nothing to compare: the cost model keeps its defaults.
  const int many_tokens = std::min(8, options_.max_tokens_per_step);
  if (many_tokens < 2) {
    options_.log("CPU tier: steps of one token; the cost model keeps its defaults");
    return absl::OkStatus();
  }
  std::vector<int> moe;
  for (int l = 0; l < config_.num_layers; ++l) {
    if (config_.layer_is_moe[l]) moe.push_back(l);
  }
  std::vector<std::pair<int, int>> probe[2];
  const int pairs = static_cast<int>(moe.size()) * config_.num_experts;
  const uint64_t per_probe = (uint64_t{256} << 20) / std::max<uint64_t>(slots_->slot_bytes(), 1);
  const int probes = static_cast<int>(std::min<uint64_t>(std::max<uint64_t>(per_probe, 5), 64));
  for (int i = 0; i < std::min(pairs, 2 * probes); ++i) {
    probe[i % 2].push_back({moe[i % moe.size()], static_cast<int>(i / moe.size())});
  }
  const int hidden = static_cast<int>(config_.hidden_size), k = config_.top_k;
  // A request that failed or timed out leaves the channel out of step: no CPU tier then.
  ASSIGN_OR_RETURN(const double one, TimeCpuTierExpert(*cpu_tier_, probe[0], 1, k, hidden));
  ASSIGN_OR_RETURN(const double many,
                   TimeCpuTierExpert(*cpu_tier_, probe[1], many_tokens, k, hidden));
  ColdPathOptions& cold = options_.cold_path;
  const uint64_t bytes = slots_->slot_bytes();
  if (!FitCpuRates(one, many, many_tokens, bytes, config_.hidden_size,
                   config_.moe_intermediate_size, cold)) {
    options_.log(absl::StrFormat(
        "CPU tier: one expert in %.3f ms for one token, %.3f ms for %d: too close to tell its "
        "rates apart; the cost model keeps its defaults",
        one * 1e3, many * 1e3, many_tokens));
    return absl::OkStatus();
  }
  options_.log(absl::StrFormat(
      "CPU tier: one expert (%.2f MiB) in %.2f ms for one token, %.2f ms for %d; the cost model "
      "streams %.1f GB/s and computes %.0f GFLOP/s on it, against %.1f GB/s copied",
      bytes / 1048576.0, one * 1e3, many * 1e3, many_tokens, cold.cpu_bytes_per_s / 1e9,
      cold.cpu_flops / 1e9, cold.copy_bytes_per_s / 1e9));
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerServer::Register() {
  ++incarnation_;
  // This GPU's UUID, by which the router tells whether it shares the GPU; empty (system-scope
  // flags) when it cannot be read.
  std::string gpu_uuid;
#if STRATA_HAVE_CUDA
  if (device_experts_ != nullptr) {
    absl::StatusOr<std::string> uuid = gpu::GpuUuid(device_experts_->context()->device());
    if (uuid.ok()) {
      gpu_uuid = *std::move(uuid);
    } else {
      options_.log(absl::StrCat("GPU UUID unknown (", uuid.status().message(),
                                "): the router will signal at system scope"));
    }
  }
#endif
  std::function<absl::StatusOr<v1::RegisterWorkerResponse>()> attempt =
      [&]() -> absl::StatusOr<v1::RegisterWorkerResponse> {
    v1::RegisterWorkerRequest request;
    request.set_worker_index(options_.index);
    request.set_protocol_version(kClusterProtocolVersion);
    request.set_device(options_.device);
    request.set_pid(static_cast<uint32_t>(::getpid()));
    request.set_incarnation(incarnation_);
    // A GPU worker holding every expert offers CUDA IPC; a router on the CPU declines.
    const bool ipc =
        device_experts_ != nullptr && options_.transport == v1::TRANSPORT_SHARED_MEMORY;
    request.set_transport(ipc ? v1::TRANSPORT_CUDA_IPC : options_.transport);
    if (ipc) request.set_gpu_uuid(gpu_uuid);
    const bool eager_cpu_tier = cpu_host_tier_ != nullptr && !cpu_tier_->abandoned() &&
                                (options_.cold_path.mode == ColdPathOptions::kCpu ||
                                 options_.cold_path.mode == ColdPathOptions::kSplit);
    request.set_no_graph_steps(ipc && slots_ != nullptr &&
                               (!slots_->cold_readable_in_place() || eager_cpu_tier));
    request.set_address(service_address_);
    request.set_tiered(tiers_ != nullptr);
    // A fresh channel per attempt: a restarted router is answered as soon as it listens,
    // without waiting out the reconnect backoff of a channel that saw it gone.
    auto router = v1::Coordinator::NewStub(
        grpc::CreateChannel(options_.router_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
    options_.token.Attach(context);
    v1::RegisterWorkerResponse response;
    const grpc::Status s = router->RegisterWorker(&context, request, &response);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return response;
  };
  return RetryUntil(attempt, stopping_, absl::StrCat("strata-router at ", options_.router_address),
                    options_.log);
}

absl::Status WorkerServer::ServeChannel(const std::string& name) {
  ASSIGN_OR_RETURN(ShmChannel channel,
                   ShmChannel::Open(name, {.wait_for_creator = absl::Seconds(10)}));
  // Over CUDA IPC a decode step's message starts this worker's graph, which the router's
  // first MoE layer soon waits for: a futex wake-up (tens of microseconds) would be on the
  // critical path of every step. Steps come every few milliseconds while decoding, so spin
  // through that gap; an idle worker still sleeps after it.
  if (ipc_link_ != nullptr) channel.inbound().set_spin(kDeviceStepSpin);
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beating_ = &channel;
  }
  absl::Cleanup stop_beating = [this] {
    busy_since_ns_.store(0);
    std::lock_guard<std::mutex> lock(beat_mu_);
    beating_ = nullptr;
  };
  std::string error;  // the text an error response points into
  while (!stopping_.load()) {
    auto request_bytes = channel.inbound().Peek(absl::Milliseconds(200));
    if (absl::IsDeadlineExceeded(request_bytes.status())) continue;
    if (!request_bytes.ok()) return request_bytes.status();  // the router is gone
    // Every message handled is a heartbeat (a worker kept busy never waits long enough for
    // the ring's idle beats); the pulse beats while it takes long.
    channel.Heartbeat();
    busy_since_ns_.store(NowNs());
    auto request = DecodeExpertRequest(*request_bytes);
    absl::Status status = request.status();
    const bool step = request.ok() && request->kind == ExpertMessageKind::kDeviceStep;
    const bool on_device = request.ok() && (request->kind == ExpertMessageKind::kDeviceRun || step);
    if (status.ok() && request->kind == ExpertMessageKind::kPrefetch) {
      // A hint: no response. A failed prefetch only costs the later miss.
      if (absl::Status s = executor_->Prefetch(*request); !s.ok()) {
        Log(LogLevel::kWarning, absl::StrCat("prefetch: ", s.message()));
      }
      RETURN_IF_ERROR(channel.inbound().Pop());
      continue;
    }
    if (status.ok() && on_device) {
      if (ipc_link_ == nullptr) {
        status = absl::FailedPreconditionError("no CUDA IPC buffers");
      } else {
        status = executor_->ApplyMemory(*request);
        if (status.ok()) status = step ? ipc_link_->RunStep(*request) : ipc_link_->Run(*request);
      }
    } else if (status.ok()) {
      status = executor_->Run(*request);
    }
    ExpertResponseView response = ExpertResponseFor(
        *request_bytes, request, status, on_device,
        absl::Span<const float>(executor_->partial().data(), executor_->partial().size()), error);
    response.tiers = executor_->counters();
    const size_t bytes = EncodedSize(response);
    ASSIGN_OR_RETURN(absl::Span<uint8_t> slot,
                     channel.outbound().Reserve(bytes, absl::Seconds(10)));
    EncodeExpertResponse(response, slot);
    RETURN_IF_ERROR(channel.outbound().Commit(bytes));
    RETURN_IF_ERROR(channel.inbound().Pop());
    busy_since_ns_.store(0);
    channel.Heartbeat();
#if STRATA_HAVE_CUDA
    // The tiers' bookkeeping of what finished steps used, off the router's path.
    if (on_device && device_experts_ != nullptr) {
      if (absl::Status s = device_experts_->AfterReply(); !s.ok()) {
        Log(LogLevel::kWarning, absl::StrCat("expert tiers: ", s.message()));
      }
    }
#endif
  }
  return absl::OkStatus();
}

void WorkerServer::Pulse() {
  double cpu = ProcessCpuSeconds();
  uint64_t progress = progress_.load();
  while (!stopping_.load()) {
    std::this_thread::sleep_for(kPulseInterval);
    const double cpu_now = ProcessCpuSeconds();
    const uint64_t progress_now = progress_.load();
    const int64_t busy_since = busy_since_ns_.load();
    const bool progressing = cpu_now - cpu >= kProgressCpuSeconds || progress_now != progress;
    cpu = cpu_now;
    progress = progress_now;
    // Idle, the ring's waits beat; busy past kMaxBusy, something is stuck whatever it uses.
    if (busy_since == 0 || !progressing ||
        absl::FromUnixNanos(busy_since) + kMaxBusy < absl::Now()) {
      continue;
    }
    std::lock_guard<std::mutex> lock(beat_mu_);
    if (beating_ != nullptr) beating_->Heartbeat();
  }
}

absl::Status WorkerServer::Run() {
  int registrations = 0;
  while (!stopping_.load()) {
    auto registration = Register();
    if (!registration.ok()) return stopping_.load() ? absl::OkStatus() : registration.status();
    int owned = 0;
    for (const auto& range : registration->owned()) owned += range.experts_size();
    if (tiers_ != nullptr) {
      std::lock_guard<std::mutex> lock(executor_mu_);
      absl::flat_hash_map<std::pair<int, int>, uint64_t> counts;
      for (const auto& c : registration->calibration()) counts[{c.layer(), c.expert()}] = c.count();
      std::vector<OwnedExpert> experts;
      for (const auto& range : registration->owned()) {
        for (uint32_t e : range.experts()) {
          const auto it = counts.find({range.layer(), e});
          experts.push_back({static_cast<int>(range.layer()), static_cast<int>(e),
                             it == counts.end() ? 0 : it->second});
        }
      }
      const absl::Time start = absl::Now();
      // What the router's KV pool holds of this worker's memory goes before the hot set loads.
      RETURN_IF_ERROR(tiers_->SetLentSlots(static_cast<int>(registration->lent_slots())));
      RETURN_IF_ERROR(tiers_->SetOwned(std::move(experts), registration->hot_ratio()));
#if STRATA_HAVE_CUDA
      // The slots' first copies (the hot set, and on a GPU the warm start) land now, not
      // during the first request.
      if (device_experts_ != nullptr) RETURN_IF_ERROR(slots_->WaitForLoads());
#endif
      const TierCounters& c = tiers_->counters();
      options_.log(absl::StrFormat(
          "hot set: %u expert(s) resident (hot ratio %g), %u warm slot(s); %.1f GiB copied in "
          "%.1f s",
          c.hot_slots, registration->hot_ratio(), c.warm_slots, c.bytes_copied / 1073741824.0,
          absl::ToDoubleSeconds(absl::Now() - start)));
    }
    options_.log(absl::StrCat(registrations++ == 0 ? "registered" : "registered again",
                              " as worker ", options_.index, " of ", registration->num_workers(),
                              ", owning ", owned, " (layer, expert) pairs"));
    if (options_.transport == v1::TRANSPORT_GRPC) {
      // Requests arrive through the ExpertWorker service; nothing to do here but wait.
      while (!stopping_.load()) absl::SleepFor(absl::Milliseconds(100));
      break;
    }
    if (registration->transport() == v1::TRANSPORT_CUDA_IPC) {
      if (device_experts_ == nullptr) {
        return absl::FailedPreconditionError("the router granted CUDA IPC to a worker off GPUs");
      }
      auto link = OpenWorkerLink(registration->cuda_ipc(), config_, *device_experts_,
                                 options_.max_tokens_per_step, options_.gpu_clock_stamps);
      if (!link.ok()) {
        return absl::Status(link.status().code(),
                            absl::StrCat("CUDA IPC buffers: ", link.status().message()));
      }
      ipc_link_ = *std::move(link);
      options_.log(absl::StrCat("activations by CUDA IPC in the router's cuda:",
                                registration->cuda_ipc().device(), " buffers"));
    }
    const absl::Status served = ServeChannel(registration->channel_name());
    if (ipc_link_ != nullptr) {
      const absl::Status closed = ipc_link_->Close();
      ipc_link_.reset();
      if (!closed.ok()) return closed;
    }
    if (stopping_.load()) break;
    // A router that stops (the cluster stopping too, most often) ends the channel; a restarted
    // one is announced by "registered again", so only debug logs say it ended.
    Log(LogLevel::kDebug, absl::StrCat("router connection ended (", served.message(),
                                       "); waiting to register with a router"));
  }
  return absl::OkStatus();
}

}  // namespace strata
