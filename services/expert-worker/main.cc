// strata-worker --model DIR --store-address ADDRESS --router ADDRESS --index I [--device cpu]
// Runs the experts the router sends it, reading their weights from strata-expert-store's
// shared memory. Start order does not matter: it waits for the expert store and the router.
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/util/byte_size.h"
#include "common/util/flag_help.h"
#include "common/util/process.h"
#include "common/util/protobuf_log.h"
#include "common/util/tunables.h"
#include "services/expert-worker/worker_server.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json is read)");
ABSL_FLAG(std::string, store_address, "", "strata-expert-store's address: unix:PATH or HOST:PORT");
// The older name of --store-address, still taken from the scripts that pass it.
ABSL_FLAG(std::string, cache, "", "deprecated: --store-address");
ABSL_FLAG(std::string, router, "",
          "strata-router's internal listener (Coordinator): unix:PATH or HOST:PORT");
ABSL_FLAG(
    std::string, cluster_token_file, "",
    "File holding the cluster token carried by every call to the router and the expert store, "
    "and required of the router's (this user's, mode 0600); empty: $STRATA_CLUSTER_TOKEN, "
    "or none");
ABSL_FLAG(std::string, channel_prefix, "strata",
          "Prefix of the shared-memory channels this worker creates (its CPU tier's)");
ABSL_FLAG(int, index, 0, "This worker's index, 0 .. workers - 1");
ABSL_FLAG(std::string, device, "cpu", "Where experts run: cpu or cuda:N");
ABSL_FLAG(std::string, weights, "bf16", "Expert weights on a GPU: bf16 or fp8");
ABSL_FLAG(int, max_batch_tokens, 512, "The router's tokens per step (sizes GPU buffers)");
ABSL_FLAG(std::string, gpu_memory_budget, "",
          "Expert memory of this worker (e.g. 24GiB; on --device cpu its private memory): hot "
          "and warm expert slots plus step buffers. Empty keeps every expert resident");
ABSL_FLAG(std::string, cache_policy, "lfu", "Warm-slot replacement: lru or lfu (with aging)");
ABSL_FLAG(
    std::string, cold_experts, "auto",
    "Experts in no slot: copy them in, have strata-expert-store compute them on its CPUs (cpu), "
    "let the cost model share them between the two (auto; on the CUDA IPC path replayed "
    "decode steps read them in place, eager ones share them, and the router keeps the "
    "faster), or share them with every step eager on the CUDA IPC path too (split)");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 uses every hardware thread");
ABSL_FLAG(std::string, transport, "shm", "shm (same host) or grpc (router on another host)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "ExpertWorker address for --transport grpc");
ABSL_FLAG(std::string, log_level, "warning", "debug, info, warning or error");

int main(int argc, char** argv) {
  strata::BlockTerminationSignals();
  strata::RateLimitProtobufLog();
  strata::ParseDaemonFlags(
      argc, argv, "strata-worker",
      "strata-worker --model DIR --store-address ADDRESS --router ADDRESS --index I [flags]: "
      "runs the experts\nthe router sends it, from strata-expert-store's shared memory",
      {__FILE__});
  const int index = absl::GetFlag(FLAGS_index);
  strata::SetProgramName(absl::StrCat("strata-worker[", index, "]"));
  if (!strata::SetLogLevel(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << "strata-worker: --log-level must be debug, info, warning or error\n";
    return 2;
  }
  strata::WorkerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.store_address = absl::GetFlag(FLAGS_store_address);
  if (options.store_address.empty() && !absl::GetFlag(FLAGS_cache).empty()) {
    std::cerr << "strata-worker: --cache is deprecated, use --store-address\n";
    options.store_address = absl::GetFlag(FLAGS_cache);
  }
  options.router_address = absl::GetFlag(FLAGS_router);
  options.index = index;
  options.device = absl::GetFlag(FLAGS_device);
  options.expert_weights = absl::GetFlag(FLAGS_weights);
  options.max_tokens_per_step = absl::GetFlag(FLAGS_max_batch_tokens);
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.channel_prefix = absl::GetFlag(FLAGS_channel_prefix);
  auto token = strata::ClusterToken::FromFileOrEnvironment(absl::GetFlag(FLAGS_cluster_token_file));
  if (!token.ok()) {
    std::cerr << "strata-worker: " << token.status().message() << "\n";
    return 2;
  }
  options.token = *std::move(token);
  const auto tunables = strata::LoadAndLogTunables();
  if (!tunables.ok()) {
    std::cerr << "strata-worker: " << tunables.status().message() << "\n";
    return 2;
  }
  if (!tunables->gpu_clock_stamps.empty()) {
    options.gpu_clock_stamps = absl::StrCat(tunables->gpu_clock_stamps, "/worker-", index, ".txt");
  }
  if (const std::string budget = absl::GetFlag(FLAGS_gpu_memory_budget); !budget.empty()) {
    auto bytes = strata::ParseByteSize(budget);
    if (!bytes.ok()) {
      std::cerr << "strata-worker: --gpu-memory-budget: " << bytes.status().message() << "\n";
      return 2;
    }
    options.memory_budget = *bytes;
  }
  const std::string policy = absl::GetFlag(FLAGS_cache_policy);
  if (policy == "lru") {
    options.tiers.policy = strata::WarmPolicy::kLru;
  } else if (policy != "lfu") {
    std::cerr << "strata-worker: --cache-policy must be lru or lfu\n";
    return 2;
  }
  const std::string cold = absl::GetFlag(FLAGS_cold_experts);
  if (cold == "copy") {
    options.cold_path.mode = strata::ColdPathOptions::kCopy;
  } else if (cold == "cpu") {
    options.cold_path.mode = strata::ColdPathOptions::kCpu;
  } else if (cold == "split") {
    options.cold_path.mode = strata::ColdPathOptions::kSplit;
  } else if (cold != "auto") {
    std::cerr << "strata-worker: --cold-experts must be auto, copy, cpu or split\n";
    return 2;
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport == "grpc") {
    options.transport = strata::v1::TRANSPORT_GRPC;
  } else if (transport != "shm") {
    std::cerr << "strata-worker: --transport must be shm or grpc\n";
    return 2;
  }
  options.log = [](const std::string& line) { strata::StatusLine(line); };
  if (options.model_dir.empty() || options.store_address.empty() ||
      options.router_address.empty()) {
    std::cerr << "strata-worker: --model, --store-address and --router are required\n";
    return 2;
  }
  // Signals are handled from the start: Create may wait a long time for strata-expert-store.
  static std::atomic<strata::WorkerServer*> running{nullptr};
  std::thread signals([] {
    strata::WaitForTerminationSignal();
    strata::WorkerServer* w = running.load();
    if (w == nullptr) std::_Exit(0);  // still starting: nothing to hand back
    w->Stop();
  });
  signals.detach();
  auto worker = strata::WorkerServer::Create(options);
  if (!worker.ok()) {
    std::cerr << "strata-worker: " << worker.status().message() << "\n";
    return 1;
  }
  running.store(worker->get());
  const absl::Status status = (*worker)->Run();
  if (!status.ok()) {
    std::cerr << "strata-worker: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
