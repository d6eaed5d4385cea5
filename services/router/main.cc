// strata-router --model DIR [--listen HOST:PORT] [--internal-listen ADDRESS] [--workers N] ...
// Serves strata.v1.Generation on --listen and Coordinator/Admin on --internal-listen. Prints
// "INTERNAL <address>" and "LISTENING <host>:<port>" on stdout at once, and
// "READY <host>:<port>" once every worker has registered. SIGINT/SIGTERM drain in-flight requests
// (up to --drain-timeout) and exit; the exit status is non-zero only when requests had to be cut
// off.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/runtime_dir.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/engine_flags.h"
#include "common/placement/hot_ratio.h"
#include "common/util/flag_help.h"
#include "common/util/process.h"
#include "common/util/protobuf_log.h"
#include "common/util/tunables.h"
#include "services/router/router_limits.h"
#include "services/router/router_server.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Client address (Generation, health, reflection); port 0 picks a free port");
ABSL_FLAG(std::string, internal_listen, "",
          "Coordinator and Admin: unix:PATH, or HOST:PORT (needs a cluster token); empty: a "
          "Unix socket in a private directory of this process, printed as INTERNAL <address>");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster token every internal call must carry (this user's, mode "
          "0600); empty: $STRATA_CLUSTER_TOKEN, or none");
ABSL_FLAG(int64_t, max_request_bytes, 8 << 20,
          "Largest gRPC request and HTTP body a client may send, bytes");
ABSL_FLAG(int, http_port, 0,
          "Port of the OpenAI-compatible HTTP API and Prometheus /metrics, on the --listen "
          "host; 0: off");
ABSL_FLAG(std::string, served_model_name, "",
          "The model's id in the HTTP API: what /v1/models lists and requests must name; "
          "empty: the last component of --model");
ABSL_FLAG(std::string, api_key, "",
          "A key the HTTP API asks of /v1/* and /tokenize, /detokenize as 'Authorization: "
          "Bearer KEY' (401 otherwise; /health, /metrics, /version stay open); empty: "
          "$STRATA_API_KEY, or none");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "How the HTTP API reads the model's tool calls: hermes (<tool_call> blocks of JSON), "
          "deepseek_v3 (DeepSeek-V3/R1), deepseek_v31 (DeepSeek-V3.1), glm45 (GLM-4.5/4.6), "
          "kimi_k2, none (requests with tools refused), or auto: the format the chat template "
          "writes, hermes for a model without one (the plain format writes hermes blocks), none "
          "when it writes no format of these");
ABSL_FLAG(int, workers, 1, "Expert workers to wait for; 0 runs the experts in this process");
ABSL_FLAG(std::string, plan, "", "Expert placement from `strata plan`; default: contiguous");
ABSL_FLAG(std::string, router_device, "cpu",
          "Where attention and the KV cache run: cpu, or cuda / cuda:N (then the workers must "
          "run on GPUs of this host; activations stay on the GPUs, shared by CUDA IPC)");
ABSL_FLAG(std::string, weights, "bf16",
          "On a GPU: bf16, or fp8 (the attention projections, and the experts with --workers 0)");
// The KV-cache flags the strata tool takes too are in engine_flags.h; these two are a server's.
ABSL_FLAG(bool, prefix_caching, strata::KvCacheOptions().prefix_caching,
          "Keep computed KV blocks for requests that start with the same tokens (LRU when the "
          "pool is short)");
ABSL_FLAG(bool, kv_cache_share_expert_memory, strata::KvCacheOptions().share_expert_memory,
          "One memory budget for the KV pool and the expert slots of workers on this router's "
          "device: as the hot ratio falls with context length, the slots of experts leaving the "
          "hot set go to the KV pool, and come back as it rises");
ABSL_FLAG(int, speculative_tokens, 0,
          "Speculative decoding by prompt lookup: tokens drafted a step at most (0: off); "
          "drafting turns itself off while it is slower than plain steps");
ABSL_FLAG(int, speculative_ngram, 3, "Prompt lookup: the longest suffix of a sequence looked up");
ABSL_FLAG(std::string, speculative_draft_model, "",
          "A small model of the same vocabulary whose greedy tokens are the drafts (run on this "
          "process's CPU), instead of prompt lookup; with --speculative-tokens");
ABSL_FLAG(int, max_batch_tokens, 512, "Tokens per forward step (decodes + prefill chunks)");
ABSL_FLAG(int, max_running, 64, "Sequences in the running batch");
ABSL_FLAG(int, max_queued_requests, 256, "Waiting requests beyond this get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_context, 0, "Longest sequence; 0 uses the model's limit");
ABSL_FLAG(double, drain_timeout_s, 30, "On SIGTERM, how long in-flight requests may finish");
ABSL_FLAG(double, worker_kill_after_s, 5,
          "A worker of this host still stalled this long after it was declared failed is "
          "killed, for its supervisor to restart; negative: never");
ABSL_FLAG(double, worker_liveness_timeout_s, 1.5,
          "A worker on this host whose heartbeat stands still this long is declared failed and "
          "its experts rerouted (workers beat for every message and while they compute)");
ABSL_FLAG(std::string, hot_ratio, "auto",
          "Share of each worker's experts kept resident: a number in [0, 1], or auto to follow "
          "--hot-ratio-policy by context length");
ABSL_FLAG(std::string, hot_ratio_policy, strata::HotRatioPolicy().ToString(),
          "Hot ratio by longest context in the batch: LIMIT:RATIO,... then the ratio beyond");
ABSL_FLAG(bool, prefetch, true, "Predict the next layer's experts and tell the workers");
ABSL_FLAG(int, prefetch_lookahead, 0,
          "With --prefetch: hint MoE layers up to this many layers ahead, and send the GPU's "
          "predictions of eager steps to the workers (0: the next layer, host predictions only)");
ABSL_FLAG(std::string, expert_activations, "f32",
          "How hidden states and partial sums cross to gRPC-transport workers: f32, or fp8 "
          "(E4M3 with a scale per token, a quarter of the bytes; approximate)");
ABSL_FLAG(int, cuda_graph_max_batch, 32,
          "GPU router: decode steps of up to this many sequences replay a CUDA graph (0: off, "
          "at most 64)");
ABSL_FLAG(bool, overlap_steps, true,
          "GPU router: launch the next greedy decode step before the last one's tokens are read");
ABSL_FLAG(std::string, channel_prefix, "strata", "Shared-memory channel name prefix");
ABSL_FLAG(std::string, log_level, "warning", "debug, info, warning or error");

int main(int argc, char** argv) {
  strata::BlockTerminationSignals();
  strata::RateLimitProtobufLog();
  strata::SetProgramName("strata-router");
  strata::ParseDaemonFlags(
      argc, argv, "strata-router",
      "strata-router --model DIR [--listen HOST:PORT] [--workers N] [flags]: serves "
      "strata.v1.Generation;\nprints LISTENING <host>:<port>, then READY <host>:<port> once "
      "every worker has registered",
      {__FILE__, strata::EngineFlagsFile()});
  if (!strata::SetLogLevel(absl::GetFlag(FLAGS_log_level))) {
    std::cerr << "strata-router: --log-level must be debug, info, warning or error\n";
    return 2;
  }
  strata::RouterOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.num_workers = absl::GetFlag(FLAGS_workers);
  const int http_port = absl::GetFlag(FLAGS_http_port);
  if (http_port < 0 || http_port > 65535) {
    std::cerr << "strata-router: --http-port must be in [0, 65535]\n";
    return 2;
  }
  options.http_port = http_port == 0 ? -1 : http_port;
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  // As vLLM reads VLLM_API_KEY: `strata up` hands its key over this way, off the command line
  // (which any local user can read).
  options.api_key = absl::GetFlag(FLAGS_api_key);
  if (options.api_key.empty()) {
    const char* key = std::getenv(strata::kApiKeyEnvironment);
    if (key != nullptr) options.api_key = key;
  }
  if (!options.api_key.empty() && !strata::IsApiKey(options.api_key)) {
    std::cerr << "strata-router: the API key (--api-key or $" << strata::kApiKeyEnvironment
              << ") must be 1 to " << strata::kMaxApiKeyBytes
              << " printable ASCII characters without spaces\n";
    return 2;
  }
  options.tool_call_parser = absl::GetFlag(FLAGS_tool_call_parser);
  options.plan_file = absl::GetFlag(FLAGS_plan);
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.device = absl::GetFlag(FLAGS_router_device);
  options.expert_weights = absl::GetFlag(FLAGS_weights);
  options.kv.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  options.kv.share_expert_memory = absl::GetFlag(FLAGS_kv_cache_share_expert_memory);
  absl::StatusOr<strata::KvCacheOptions> kv = strata::KvCacheOptionsFromFlags(options.kv);
  if (!kv.ok()) {
    std::cerr << "strata-router: " << kv.status().message() << "\n";
    return 2;
  }
  options.kv = *kv;
  if (options.kv.memory_mb < 1 || options.kv.memory_mb > strata::kMaxKvCacheMiB) {
    std::cerr << "strata-router: --kv-cache-mb must be in [1, " << strata::kMaxKvCacheMiB << "]\n";
    return 2;
  }
  options.scheduler.speculation.max_draft_tokens = absl::GetFlag(FLAGS_speculative_tokens);
  options.scheduler.speculation.ngram_max = absl::GetFlag(FLAGS_speculative_ngram);
  options.draft_model_dir = absl::GetFlag(FLAGS_speculative_draft_model);
  if (options.scheduler.speculation.max_draft_tokens < 0 ||
      options.scheduler.speculation.max_draft_tokens > 16 ||
      options.scheduler.speculation.ngram_max < 1) {
    std::cerr << "strata-router: --speculative-tokens must be in [0, 16] and --speculative-ngram "
                 "at least 1\n";
    return 2;
  }
  options.gate_temperature = static_cast<float>(strata::GateTemperatureFromFlags());
  options.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.scheduler.max_running = absl::GetFlag(FLAGS_max_running);
  options.scheduler.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.scheduler.max_context_tokens = absl::GetFlag(FLAGS_max_context);
  options.channel_prefix = absl::GetFlag(FLAGS_channel_prefix);
  const double liveness = absl::GetFlag(FLAGS_worker_liveness_timeout_s);
  if (!(liveness >= strata::kMinWorkerLivenessS && liveness <= strata::kMaxWorkerLivenessS)) {
    std::cerr << "strata-router: --worker-liveness-timeout-s must be in ["
              << strata::kMinWorkerLivenessS << ", " << strata::kMaxWorkerLivenessS << "]\n";
    return 2;
  }
  options.worker_liveness_timeout = absl::Seconds(liveness);
  const double kill_after = absl::GetFlag(FLAGS_worker_kill_after_s);
  options.worker_kill_after =
      kill_after < 0 ? absl::InfiniteDuration() : absl::Seconds(std::min(kill_after, 1e6));
  options.prefetch = absl::GetFlag(FLAGS_prefetch);
  options.prefetch_lookahead = absl::GetFlag(FLAGS_prefetch_lookahead);
  if (options.prefetch_lookahead < 0) {
    std::cerr << "strata-router: --prefetch-lookahead must be 0 or more\n";
    return 2;
  }
  const std::string activations = absl::GetFlag(FLAGS_expert_activations);
  if (activations != "f32" && activations != "fp8") {
    std::cerr << "strata-router: --expert-activations must be f32 or fp8\n";
    return 2;
  }
  options.fp8_activations = activations == "fp8";
  options.cuda_graph_max_batch = absl::GetFlag(FLAGS_cuda_graph_max_batch);
  options.scheduler.overlap_decode_steps = absl::GetFlag(FLAGS_overlap_steps);
  const auto tunables = strata::LoadAndLogTunables();
  if (!tunables.ok()) {
    std::cerr << "strata-router: " << tunables.status().message() << "\n";
    return 2;
  }
  if (!tunables->gpu_clock_stamps.empty()) {
    options.gpu_clock_stamps = tunables->gpu_clock_stamps + "/router.txt";
  }
  if (options.cuda_graph_max_batch < 0 ||
      options.cuda_graph_max_batch > strata::kMaxDecodeGraphBatch) {
    std::cerr << "strata-router: --cuda-graph-max-batch must be in [0, "
              << strata::kMaxDecodeGraphBatch << "]\n";
    return 2;
  }
  auto policy = strata::HotRatioPolicy::Parse(absl::GetFlag(FLAGS_hot_ratio_policy));
  if (!policy.ok()) {
    std::cerr << "strata-router: " << policy.status().message() << "\n";
    return 2;
  }
  options.hot_ratio_policy = *policy;
  const auto ratio = strata::ParseHotRatio(absl::GetFlag(FLAGS_hot_ratio));
  if (!ratio.ok()) {
    std::cerr << "strata-router: --hot-ratio: " << ratio.status().message() << "\n";
    return 2;
  }
  if (ratio->has_value()) options.hot_ratio = **ratio;
  if (options.model_dir.empty()) {
    std::cerr << "strata-router: --model is required\n";
    return 2;
  }
  if (!(options.gate_temperature > 0)) {
    std::cerr << "strata-router: --gate-temperature must be positive\n";
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_drain_timeout_s) >= 0)) {
    std::cerr << "strata-router: --drain-timeout-s must be >= 0\n";
    return 2;
  }
  const int64_t max_request = absl::GetFlag(FLAGS_max_request_bytes);
  if (max_request < strata::kMinRequestBytes || max_request > strata::kMaxRequestBytes) {
    std::cerr << "strata-router: --max-request-bytes must be in [" << strata::kMinRequestBytes
              << ", " << strata::kMaxRequestBytes << "]\n";
    return 2;
  }
  options.max_request_bytes = static_cast<int>(max_request);
  options.http.max_body_bytes = static_cast<size_t>(max_request);
  auto token = strata::ClusterToken::FromFileOrEnvironment(absl::GetFlag(FLAGS_cluster_token_file));
  if (!token.ok()) {
    std::cerr << "strata-router: " << token.status().message() << "\n";
    return 2;
  }
  options.token = *std::move(token);
  options.internal_listen = absl::GetFlag(FLAGS_internal_listen);
  // Started by hand: a private directory of its own for the internal socket, removed at exit.
  std::optional<strata::ClusterDir> own_dir;
  absl::Cleanup remove_own_dir = [&] {
    if (own_dir) strata::RemoveCluster(*own_dir);
  };
  if (options.internal_listen.empty()) {
    auto dir = strata::CreateClusterDir();
    if (!dir.ok()) {
      std::cerr << "strata-router: " << dir.status().message() << "\n";
      return 1;
    }
    own_dir = *std::move(dir);
    options.internal_listen = own_dir->socket("router");
  }
  auto server = strata::RouterServer::Start(options);
  if (!server.ok()) {
    std::cerr << "strata-router: " << server.status().message() << "\n";
    return 1;
  }
  strata::RouterServer& router = **server;
  std::cout << "INTERNAL " << router.internal_address() << std::endl;
  std::cout << "LISTENING " << router.address() << std::endl;
  if (router.http_port() > 0) {
    strata::StatusLine(absl::StrCat("HTTP API on port ", router.http_port()));
  }
  const std::string growth =
      options.kv.share_expert_memory
          ? absl::StrCat("; contexts up to ", router.scheduler().max_context_tokens(),
                         " tokens as the workers lend it memory")
          : "";
  strata::StatusLine(absl::StrCat("listening on ", router.address(), "; KV pool of ",
                                  router.scheduler().kv_pool_blocks(), " blocks (",
                                  router.scheduler().kv_pool_tokens(), " tokens", growth,
                                  "); waiting for ", options.num_workers, " worker(s)"));
  std::thread announcer([&] {
    while (!router.WaitReady(absl::Seconds(10))) {
      strata::StatusLine(
          absl::StrCat("still waiting for workers to register at ", router.address()));
    }
    std::cout << "READY " << router.address() << std::endl;
  });
  announcer.detach();
  const int signal = strata::WaitForTerminationSignal();
  strata::StatusLine(absl::StrCat("signal ", signal, ": draining"));
  const bool drained = router.Shutdown(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
  if (!drained) strata::StatusLine("drain timed out; unfinished requests were cancelled");
  return drained ? 0 : 1;
}
