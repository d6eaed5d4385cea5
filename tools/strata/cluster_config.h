// The configuration of a cluster started by `strata up`: a YAML or JSON file whose keys read
// like the design (gate_temperature, kv_cache.block_size, ...), overridden by command-line
// flags. A few keys have an older name that is still taken (OlderKeyNames in the .cc).
#ifndef STRATA_TOOLS_STRATA_CLUSTER_CONFIG_H_
#define STRATA_TOOLS_STRATA_CLUSTER_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/paged_kv_cache.h"
#include "common/placement/hot_ratio.h"

namespace strata {

struct ClusterConfig {
  std::string model;
  int workers = 1;
  std::string device = "cpu";  // the workers': cpu or cuda (worker i on cuda:(i mod gpus))
  int gpus = 0;                // GPUs the workers take in turn; 0: one per worker
  // The router's (attention, KV cache): cpu, cuda or cuda:N; empty picks (RouterDevice).
  std::string router_device;
  std::string weights = "bf16";  // expert weights on GPUs: bf16 or fp8
  std::string plan;              // expert placement file from `strata plan`
  std::string host = "127.0.0.1";
  int port = 0;                   // 0 picks a free port
  int http_port = 0;              // the router's OpenAI-compatible HTTP API; 0: off
  std::string served_model_name;  // the model's id in the HTTP API; empty: its directory's name
  // The key the HTTP API asks for (IsApiKey); empty: $STRATA_API_KEY, or none. Handed to the
  // router in its environment, not its command line.
  std::string api_key;
  // How the HTTP API reads the model's tool calls: auto (from its chat template), or a format
  // (ChooseToolCallFormat's names: hermes, deepseek_v3, deepseek_v31, glm45, kimi_k2, none).
  std::string tool_call_parser = "auto";
  std::string transport = "shm";  // shm or grpc between router and workers
  // gRPC transport: activations as f32, or fp8 (E4M3, a scale per token).
  std::string expert_activations = "f32";
  std::string log_level = "warning";
  int threads_per_process = 0;          // 0: every hardware thread
  int cpu_tier_threads = 0;             // strata-expert-store's CPU tier; 0: every hardware thread
  float gate_temperature = 1.0f;        // the MoE gate's softmax temperature
  KvCacheOptions kv;                    // the router's KV pool (kv_cache.*)
  int speculative_tokens = 0;           // prompt-lookup drafts a step at most; 0: no speculation
  int speculative_ngram = 3;            // the longest suffix looked up
  std::string speculative_draft_model;  // drafts from this model instead of prompt lookup
  // Tokens a step; 0: DefaultMaxBatchTokens of the router's device.
  int max_batch_tokens = 0;
  int max_running = 64;
  int max_queued_requests = 256;
  double drain_timeout_s = 30;
  // Trust and liveness (docs/security.md).
  int64_t max_request_bytes = 8 << 20;     // largest gRPC request and HTTP body
  double worker_liveness_timeout_s = 1.5;  // a stalled worker's experts are rerouted after it
  double worker_kill_after_s = 5;          // and strata up kills it this long later
  // Expert tiers (see docs/tiers.md).
  std::string gpu_memory_budget;   // per worker, e.g. 24GiB; empty: every expert resident
  std::string hot_ratio = "auto";  // a number in [0, 1], or auto (hot_ratio_policy)
  std::string hot_ratio_policy = HotRatioPolicy().ToString();
  std::string cache_policy = "lfu";  // warm slots: lru or lfu
  std::string cold_experts =
      "auto";  // copy, cpu (strata-expert-store computes them), auto or split
  // strata-expert-store: copy the experts into NUMA-local shared memory, or map the checkpoint's
  // files in place (in-place: no second copy in memory).
  std::string expert_store = "copy";
  bool prefetch = true;
  int prefetch_lookahead = 0;
  // GPU router: decode steps of up to this many sequences replay CUDA graphs (0: off).
  int cuda_graph_max_batch = 32;
  // GPU router: greedy decode steps launched before the last one's tokens are read.
  bool overlap_steps = true;
  // GPU clusters: a CUDA MPS daemon for the cluster's processes. auto: when the control
  // binary is there; on: required; off: never.
  std::string mps = "auto";
};

// Reads `path` (YAML or JSON) into `config`, keeping fields the file does not set. Unknown
// keys and bad values are errors naming the file and the key.
absl::Status LoadClusterConfig(const std::string& path, ClusterConfig& config);

// `strata up`'s flags (argv after the command), one per key of the file that has one, dashed:
// --name=value, --name value, and for switches --name / --noname. Overrides what `config`
// holds (a file's values). INVALID_ARGUMENT for an unknown flag (naming the nearest one) or a
// value of the wrong type; each key's rule is CheckClusterConfig's.
absl::Status ApplyClusterFlags(const std::vector<std::string>& args, ClusterConfig& config);

// The flags' help: one line each, with its config key and default.
std::string ClusterFlagsHelp();

// The processes `strata up` starts, and the flags each takes from the config: every key handed
// to `daemon`, as --flag=value (the supervisor adds what it derives itself: addresses, devices,
// indexes).
enum class Daemon { kExpertStore = 1, kRouter = 2, kWorker = 4 };
std::vector<std::string> DaemonArgs(const ClusterConfig& config, Daemon daemon);

// Every value of `config` kept to the rules the file's keys are read with, and a router device
// its workers can serve (RouterDevice): for a config merged from a file and flags.
// INVALID_ARGUMENT naming the first bad key and its flag.
absl::Status CheckClusterConfig(const ClusterConfig& config);

// The `strata up` flag of every config key that has one, dashed (e.g. "cache-policy").
std::vector<std::string> ClusterConfigFlags();

// Where the router runs: router_device when set; otherwise cuda:0 for GPU workers that talk
// shared memory, with or without a memory budget (activations then stay on the GPUs, by CUDA
// IPC; a worker hands strata-expert-store's CPU tier its rows itself); cpu for everything else.
// INVALID_ARGUMENT when a GPU router is asked for with workers that cannot share its device
// buffers.
absl::StatusOr<std::string> RouterDevice(const ClusterConfig& config);

// The step size where none is configured: 4096 tokens with a GPU router (a long prompt in
// chunks that each read every expert once, and tensor-core tiles kept full), 512 on the CPU
// (where a step's time grows with its tokens and decodes beside a prefill would wait).
int DefaultMaxBatchTokens(const std::string& router_device);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_CLUSTER_CONFIG_H_
