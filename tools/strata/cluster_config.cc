#include "tools/strata/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/engine_flags.h"
#include "common/engine/model_stack.h"
#include "common/placement/hot_ratio.h"
#include "common/util/byte_size.h"
#include "common/util/flag_help.h"
#include "services/router/router_limits.h"

namespace strata {
namespace {

absl::Status Must(bool ok, const char* rule) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(rule);
}

absl::Status OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("must be one of ", absl::StrJoin(allowed, ", ")));
}

// Each known key (dotted for nested maps): its `strata up` flag (empty: file only), its help,
// the daemons it is handed to and under which flag, how a file's or a flag's value is stored,
// how the value reads back, and the rule every value must keep.
struct Key {
  std::string flag;
  std::string help;
  int daemons = 0;  // Daemon bits
  std::string daemon_flag;
  bool is_bool = false;
  // Stores a value: INVALID_ARGUMENT when it is not one of the field's type.
  std::function<absl::Status(const YAML::Node&, ClusterConfig&)> set;
  std::function<std::string(const ClusterConfig&)> get;
  std::function<absl::Status(const ClusterConfig&)> check;  // null: any value

  Key&& Help(std::string text) && {
    help = std::move(text);
    return std::move(*this);
  }
  // Handed to `daemons` as --daemon_flag=value (the key's own flag when empty).
  Key&& To(int to, std::string as = "") && {
    daemons = to;
    daemon_flag = as.empty() ? flag : std::move(as);
    return std::move(*this);
  }
};

template <typename T>
std::string AsText(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else {
    return absl::StrCat(v);
  }
}

absl::Status NotOfTheType() { return absl::InvalidArgumentError("not of its type"); }

template <typename Field>
using Check = std::type_identity_t<std::function<absl::Status(const Field&)>>;

// A key of field type Field, read from YAML (and flags) as T; `field(config)` is the field, for
// a const config too.
template <typename T, typename Field, typename Access>
Key KeyAt(std::string flag, Access field, Check<Field> check) {
  Key key;
  key.flag = std::move(flag);
  key.is_bool = std::is_same_v<Field, bool>;
  key.set = [field](const YAML::Node& node, ClusterConfig& c) {
    T value;
    if (!YAML::convert<T>::decode(node, value)) return NotOfTheType();
    field(c) = static_cast<Field>(value);
    return absl::OkStatus();
  };
  key.get = [field](const ClusterConfig& c) { return AsText(field(c)); };
  if (check) key.check = [field, check](const ClusterConfig& c) { return check(field(c)); };
  return key;
}

template <typename T, typename Field>
Key KeyOf(std::string flag, Field ClusterConfig::*field, Check<Field> check = nullptr) {
  return KeyAt<T, Field>(
      std::move(flag), [field](auto& c) -> auto& { return c.*field; }, std::move(check));
}

// The help of the flag of that name strata-router and the strata tool take (engine_flags.h),
// or "" for none; in lower case as the table's help reads on from the key's name (an initial
// acronym kept).
std::string EngineHelp(const std::string& flag) {
  std::string help = EngineFlagHelp(flag);
  if (help.size() > 1 && absl::ascii_islower(help[1])) help[0] = absl::ascii_tolower(help[0]);
  return help;
}

// A kv_cache key: a field of the config's KvCacheOptions, with the engine flag's help.
template <typename T, typename Field>
Key KvKeyOf(std::string flag, Field KvCacheOptions::*field, Check<Field> check = nullptr) {
  Key key = KeyAt<T, Field>(
      flag, [field](auto& c) -> auto& { return c.kv.*field; }, std::move(check));
  key.help = EngineHelp(key.flag);
  return key;
}

// kv_cache.dtype: a name (ParseKvDtype) held as a KvDtype.
Key KvDtypeKey() {
  Key key;
  key.flag = "kv-cache-dtype";
  key.help = EngineHelp(key.flag);
  key.set = [](const YAML::Node& node, ClusterConfig& c) {
    std::string name;
    if (!YAML::convert<std::string>::decode(node, name)) return NotOfTheType();
    absl::StatusOr<KvDtype> dtype = ParseKvDtype(name);
    if (!dtype.ok()) return dtype.status();
    c.kv.dtype = *dtype;
    return absl::OkStatus();
  };
  key.get = [](const ClusterConfig& c) { return std::string(KvDtypeName(c.kv.dtype)); };
  return key;
}

template <typename T>
absl::Status NotNegative(const T& v) {
  return Must(v >= 0, "must be >= 0");
}
template <typename T>
absl::Status Positive(const T& v) {
  return Must(v > 0, "must be > 0");
}
// A value in [lo, hi] (router_limits.h).
template <typename T>
std::function<absl::Status(const T&)> Within(T lo, T hi) {
  return [lo, hi](const T& v) {
    return v >= lo && v <= hi
               ? absl::OkStatus()
               : absl::InvalidArgumentError(absl::StrCat("must be in [", lo, ", ", hi, "]"));
  };
}

constexpr int kExpertStore = static_cast<int>(Daemon::kExpertStore);
constexpr int kRouter = static_cast<int>(Daemon::kRouter);
constexpr int kWorker = static_cast<int>(Daemon::kWorker);

const std::map<std::string, Key>& Keys() {
  using S = std::string;
  static const auto* keys = new std::map<std::string, Key>{
      {"model", KeyOf<S>("model", &ClusterConfig::model)
                    .Help("Hugging Face model directory (config.json, safetensors, tokenizer)")
                    .To(kExpertStore | kRouter | kWorker)},
      {"workers", KeyOf<int>("workers", &ClusterConfig::workers, Positive<int>)
                      .Help("expert worker processes")
                      .To(kRouter)},
      {"gpus", KeyOf<int>("gpus", &ClusterConfig::gpus, NotNegative<int>)
                   .Help("GPUs the workers take in turn, worker i on cuda:(i mod gpus); 0: one "
                         "per worker")},
      {"device", KeyOf<S>("device", &ClusterConfig::device,
                          [](const S& v) {
                            return OneOf(v, {"cpu", "cuda"});
                          })
                     .Help("where the workers run: cpu or cuda")},
      {"router_device",
       KeyOf<S>("router-device", &ClusterConfig::router_device,
                [](const S& v) { return v.empty() ? absl::OkStatus() : ParseDevice(v).status(); })
           .Help("where the router runs: cpu, cuda or cuda:N; empty: cuda:0 for GPU workers over "
                 "shared memory, else cpu")},
      {"plan", KeyOf<S>("plan", &ClusterConfig::plan)
                   .Help("expert placement file from `strata plan`")
                   .To(kRouter)},
      {"weights", KeyOf<S>("weights", &ClusterConfig::weights,
                           [](const S& v) {
                             return OneOf(v, {"bf16", "fp8"});
                           })
                      .Help("expert (and on a GPU router attention) weights: bf16 or fp8")
                      .To(kRouter | kWorker)},
      {"host", KeyOf<S>("host", &ClusterConfig::host).Help("address every process listens on")},
      {"port", KeyOf<int>("port", &ClusterConfig::port,
                          [](const int& v) { return Must(v >= 0 && v < 65536, "not a port"); })
                   .Help("port of the Generate API; 0 picks a free one")},
      {"http_port", KeyOf<int>("http-port", &ClusterConfig::http_port,
                               [](const int& v) { return Must(v >= 0 && v < 65536, "not a port"); })
                        .Help("port of the OpenAI-compatible HTTP API and /metrics on the host; "
                              "0: off")
                        .To(kRouter)},
      {"served_model_name",
       KeyOf<S>("served-model-name", &ClusterConfig::served_model_name)
           .Help("the model's id in the HTTP API: what /v1/models lists and requests must name; "
                 "empty: the last component of the model directory")
           .To(kRouter)},
      {"api_key",
       KeyOf<S>("api-key", &ClusterConfig::api_key,
                [](const S& v) {
                  return v.empty() || IsApiKey(v)
                             ? absl::OkStatus()
                             : absl::InvalidArgumentError(
                                   absl::StrCat("must be 1 to ", kMaxApiKeyBytes,
                                                " printable ASCII characters without spaces"));
                })
           .Help("a key the HTTP API asks of /v1/* and /tokenize, /detokenize as "
                 "'Authorization: Bearer KEY' (401 otherwise; /health, /metrics, /version stay "
                 "open); empty: $STRATA_API_KEY, or none. Handed to the router in its "
                 "environment")},
      {"tool_call_parser",
       KeyOf<S>("tool-call-parser", &ClusterConfig::tool_call_parser,
                [](const S& v) {
                  // ChooseToolCallFormat's names (vLLM's, with its older deepseekv3/v31).
                  return OneOf(v, {"auto", "hermes", "deepseek_v3", "deepseekv3", "deepseek_v31",
                                   "deepseekv31", "glm45", "kimi_k2", "none"});
                })
           .Help("how the HTTP API reads the model's tool calls: hermes (<tool_call> blocks of "
                 "JSON), deepseek_v3 (DeepSeek-V3/R1), deepseek_v31 (DeepSeek-V3.1), glm45 "
                 "(GLM-4.5/4.6), kimi_k2, none (tools refused), or auto: the format the chat "
                 "template writes (hermes when there is no template)")
           .To(kRouter)},
      {"transport", KeyOf<S>("transport", &ClusterConfig::transport,
                             [](const S& v) {
                               return OneOf(v, {"shm", "grpc"});
                             })
                        .Help("between router and workers: shm (this host) or grpc")
                        .To(kWorker)},
      {"expert_activations",
       KeyOf<S>("expert-activations", &ClusterConfig::expert_activations,
                [](const S& v) {
                  return OneOf(v, {"f32", "fp8"});
                })
           .Help("gRPC transport: hidden states and partial sums as f32, or fp8 (E4M3 with a "
                 "scale per token, a quarter of the bytes)")
           .To(kRouter)},
      {"log_level", KeyOf<S>("log-level", &ClusterConfig::log_level,
                             [](const S& v) {
                               return OneOf(v, {"debug", "info", "warning", "error"});
                             })
                        .Help("debug, info, warning or error")
                        .To(kExpertStore | kRouter | kWorker)},
      {"threads", KeyOf<int>("threads", &ClusterConfig::threads_per_process, Within(0, kMaxThreads))
                      .Help("CPU threads per process; 0: every hardware thread")
                      .To(kRouter | kWorker)},
      {"cpu_tier_threads",
       KeyOf<int>("cpu-tier-threads", &ClusterConfig::cpu_tier_threads, Within(0, kMaxThreads))
           .Help("threads strata-expert-store computes cold experts on; 0: every hardware thread")
           .To(kExpertStore)},
      {"gate_temperature",
       KeyOf<double>("gate-temperature", &ClusterConfig::gate_temperature, Positive<float>)
           .Help("softmax temperature of the MoE gate (older name: router_temperature, "
                 "--router-temperature, still taken)")
           .To(kRouter)},
      {"kv_cache.block_size",
       KvKeyOf<int>("kv-block-size", &KvCacheOptions::block_size, Positive<int>).To(kRouter)},
      {"kv_cache.memory_mb", KvKeyOf<int64_t>("kv-cache-mb", &KvCacheOptions::memory_mb,
                                              Within<int64_t>(1, kMaxKvCacheMiB))
                                 .To(kRouter)},
      {"kv_cache.prefix_caching",
       KvKeyOf<bool>("prefix-caching", &KvCacheOptions::prefix_caching)
           .Help("keep computed KV blocks for requests that start with the same tokens")
           .To(kRouter)},
      {"kv_cache.dtype", KvDtypeKey().To(kRouter)},
      {"kv_cache.fp16_above_tokens",
       KvKeyOf<int64_t>("kv-cache-fp16-above-tokens", &KvCacheOptions::fp16_above_tokens,
                        NotNegative<int64_t>)
           .To(kRouter)},
      {"kv_cache.calibration_tokens",
       KvKeyOf<int64_t>("kv-cache-calibration-tokens", &KvCacheOptions::calibration_tokens,
                        Positive<int64_t>)
           .To(kRouter)},
      {"kv_cache.share_expert_memory",
       KvKeyOf<bool>("kv-cache-share-expert-memory", &KvCacheOptions::share_expert_memory)
           .Help("one memory budget for the KV pool and the expert slots of workers on the "
                 "router's device: as the hot ratio falls with context length, the slots of "
                 "experts leaving the hot set go to the KV pool, and come back as it rises")
           .To(kRouter)},
      {"speculative.draft_tokens",
       KeyOf<int>("speculative-tokens", &ClusterConfig::speculative_tokens,
                  [](const int& v) { return Must(v >= 0 && v <= 16, "must be in [0, 16]"); })
           .Help("speculative decoding by prompt lookup: tokens drafted a step at most; 0: off")
           .To(kRouter)},
      {"speculative.ngram",
       KeyOf<int>("speculative-ngram", &ClusterConfig::speculative_ngram, Positive<int>)
           .Help("prompt lookup: the longest suffix of a sequence looked up")
           .To(kRouter)},
      {"speculative.draft_model",
       KeyOf<S>("speculative-draft-model", &ClusterConfig::speculative_draft_model)
           .Help("a small model of the same vocabulary whose greedy tokens are the drafts (in "
                 "the router's process, on its CPU), instead of prompt lookup")
           .To(kRouter)},
      {"max_batch_tokens",
       KeyOf<int>("max-batch-tokens", &ClusterConfig::max_batch_tokens, NotNegative<int>)
           .Help("tokens per forward step (decodes and prefill chunks); 0: 4096 with a GPU "
                 "router, 512 on the CPU")
           .To(kRouter | kWorker)},
      {"max_running", KeyOf<int>("max-running", &ClusterConfig::max_running, Positive<int>)
                          .Help("sequences in the running batch")
                          .To(kRouter)},
      {"max_queued_requests",
       KeyOf<int>("max-queued-requests", &ClusterConfig::max_queued_requests, NotNegative<int>)
           .Help("waiting requests beyond this get RESOURCE_EXHAUSTED")
           .To(kRouter)},
      {"drain_timeout_s",
       KeyOf<double>("drain-timeout-s", &ClusterConfig::drain_timeout_s, NotNegative<double>)
           .Help("on SIGTERM, seconds in-flight requests may take to finish")
           .To(kRouter)},
      {"max_request_bytes", KeyOf<int64_t>("max-request-bytes", &ClusterConfig::max_request_bytes,
                                           Within(kMinRequestBytes, kMaxRequestBytes))
                                .Help("largest gRPC request and HTTP body a client may send, bytes")
                                .To(kRouter)},
      {"worker_liveness_timeout_s",
       KeyOf<double>("worker-liveness-timeout-s", &ClusterConfig::worker_liveness_timeout_s,
                     Within(kMinWorkerLivenessS, kMaxWorkerLivenessS))
           .Help("a worker whose heartbeat stands still this long is declared failed and its "
                 "experts rerouted (workers beat for every message and while they compute)")
           .To(kRouter)},
      {"worker_kill_after_s",
       KeyOf<double>(
           "worker-kill-after-s", &ClusterConfig::worker_kill_after_s,
           [](const double& v) { return Must(v >= 0 && v <= 3600, "must be in [0, 3600]"); })
           .Help("a worker declared failed that is still running but not answering this much "
                 "later is killed (by the router) and restarted (by strata up)")
           .To(kRouter)},
      {"gpu_memory_budget",
       KeyOf<S>("gpu-memory-budget", &ClusterConfig::gpu_memory_budget,
                [](const S& v) { return v.empty() ? absl::OkStatus() : ParseByteSize(v).status(); })
           .Help("expert memory per worker (e.g. 24GiB): hot and warm slots; empty keeps every "
                 "expert resident")
           .To(kWorker)},
      {"hot_ratio", KeyOf<S>("hot-ratio", &ClusterConfig::hot_ratio,
                             [](const S& v) { return ParseHotRatio(v).status(); })
                        .Help("share of each worker's experts pinned resident, or auto (by "
                              "context length, hot_ratio_policy)")
                        .To(kRouter)},
      {"hot_ratio_policy",
       KeyOf<S>("hot-ratio-policy", &ClusterConfig::hot_ratio_policy,
                [](const S& v) { return HotRatioPolicy::Parse(v).status(); })
           .Help("the automatic hot ratio by the longest context: limit:ratio steps, then the "
                 "ratio beyond (512:0.35,2048:0.28,0.20)")
           .To(kRouter)},
      {"cache_policy", KeyOf<S>("cache-policy", &ClusterConfig::cache_policy,
                                [](const S& v) {
                                  return OneOf(v, {"lru", "lfu"});
                                })
                           .Help("warm-slot replacement: lru or lfu")
                           .To(kWorker)},
      {"cold_experts",
       KeyOf<S>("cold-experts", &ClusterConfig::cold_experts,
                [](const S& v) {
                  return OneOf(v, {"auto", "copy", "cpu", "split"});
                })
           .Help("experts in no slot: copy, cpu (strata-expert-store computes them), "
                 "auto (the cost model shares them; on GPUs decode graphs read "
                 "them in place, eager steps share them, the router keeps the "
                 "faster) or split (shared on GPUs too, every step eager)")
           .To(kWorker)},
      {"expert_store", KeyOf<S>("expert-store", &ClusterConfig::expert_store,
                                [](const S& v) {
                                  return OneOf(v, {"copy", "in-place"});
                                })
                           .Help("copy the experts into shared memory, or map the checkpoint's "
                                 "files in place")
                           .To(kExpertStore)},
      {"prefetch", KeyOf<bool>("prefetch", &ClusterConfig::prefetch)
                       .Help("predict the next layer's experts and prefetch them")
                       .To(kRouter)},
      {"prefetch_lookahead",
       KeyOf<int>("prefetch-lookahead", &ClusterConfig::prefetch_lookahead,
                  [](const int& v) {
                    return v >= 0 ? absl::OkStatus()
                                  : absl::InvalidArgumentError("must be 0 or more");
                  })
           .Help("with prefetch: also hint MoE layers up to this many layers ahead, and send "
                 "the GPU router's predictions of eager steps to the workers (0: the next "
                 "layer only, host predictions only)")
           .To(kRouter)},
      {"overlap_steps", KeyOf<bool>("overlap-steps", &ClusterConfig::overlap_steps)
                            .Help("GPU router: launch the next greedy decode step before the "
                                  "last one's tokens are read")
                            .To(kRouter)},
      {"cuda_graph_max_batch",
       KeyOf<int>("cuda-graph-max-batch", &ClusterConfig::cuda_graph_max_batch,
                  [](const int& v) {
                    return v >= 0 && v <= kMaxDecodeGraphBatch
                               ? absl::OkStatus()
                               : absl::InvalidArgumentError(
                                     absl::StrCat("must be in [0, ", kMaxDecodeGraphBatch, "]"));
                  })
           .Help("GPU router: decode steps of up to this many sequences replay CUDA graphs (0: "
                 "off)")
           .To(kRouter)},
      {"mps", KeyOf<S>("mps", &ClusterConfig::mps,
                       [](const S& v) {
                         return OneOf(v, {"auto", "on", "off"});
                       })
                  .Help("CUDA MPS daemon for the GPU processes: auto, on or off")},
  };
  return *keys;
}

// Keys renamed since configs were first written: the older name reads as the new one.
const std::map<std::string, std::string>& OlderKeyNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"router_temperature", "gate_temperature"},
  };
  return *names;
}

// `name`, or the key it is the older name of.
std::string CurrentKeyName(const std::string& name) {
  auto it = OlderKeyNames().find(name);
  return it == OlderKeyNames().end() ? name : it->second;
}

absl::Status Apply(const YAML::Node& map, const std::string& prefix, const std::string& path,
                   ClusterConfig& config) {
  for (const auto& item : map) {
    const std::string name = prefix + item.first.as<std::string>();  // as written
    if (item.second.IsMap()) {
      if (absl::Status s = Apply(item.second, name + ".", path, config); !s.ok()) return s;
      continue;
    }
    auto it = Keys().find(CurrentKeyName(name));
    if (it == Keys().end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key \"", name, "\""));
    }
    const Key& key = it->second;
    absl::Status valid = key.set(item.second, config);
    if (valid.ok() && key.check) valid = key.check(config);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": bad value for \"", name, "\": ", valid.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RouterDevice(const ClusterConfig& c) {
  // Tiered workers too: misses are copied in, read in place on their GPUs, or computed by
  // strata-expert-store's CPUs (the worker hands them the layer's rows itself).
  const bool ipc_workers = c.device == "cuda" && c.transport == "shm";
  if (c.router_device.empty()) return ipc_workers ? std::string("cuda:0") : std::string("cpu");
  const absl::StatusOr<int> index = ParseDevice(c.router_device);
  if (!index.ok())
    return absl::InvalidArgumentError(absl::StrCat("router_", index.status().message()));
  if (*index < 0) return std::string("cpu");
  if (!ipc_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "router_device ", c.router_device,
        " needs workers on GPUs of this host (device cuda, transport shm): activations move "
        "between them by CUDA IPC"));
  }
  return absl::StrCat("cuda:", *index);
}

int DefaultMaxBatchTokens(const std::string& router_device) {
  return router_device == "cpu" ? 512 : 4096;
}

std::vector<std::string> ClusterConfigFlags() {
  std::vector<std::string> flags;
  for (const auto& [name, key] : Keys()) {
    if (!key.flag.empty()) flags.push_back(key.flag);
  }
  return flags;
}

absl::Status CheckClusterConfig(const ClusterConfig& config) {
  for (const auto& [name, key] : Keys()) {
    if (!key.check) continue;
    if (absl::Status valid = key.check(config); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad value for \"", name, "\"",
          key.flag.empty() ? "" : absl::StrCat(" (--", key.flag, ")"), ": ", valid.message()));
    }
  }
  return RouterDevice(config).status();
}

namespace {

const Key* KeyOfFlag(const std::string& flag) {
  for (const auto& [name, key] : Keys()) {
    if (!key.flag.empty() && key.flag == flag) return &key;
  }
  // An older key's flag: its name dashed.
  for (const auto& [older, current] : OlderKeyNames()) {
    std::string older_flag = older;
    std::replace(older_flag.begin(), older_flag.end(), '_', '-');
    if (older_flag == flag) return &Keys().at(current);
  }
  return nullptr;
}

}  // namespace

absl::Status ApplyClusterFlags(const std::vector<std::string>& args, ClusterConfig& config) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string flag = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    std::replace(flag.begin(), flag.end(), '_', '-');
    const Key* key = KeyOfFlag(flag);
    if (key == nullptr && !has_value && flag.rfind("no", 0) == 0) {
      const Key* negated = KeyOfFlag(flag.substr(2));
      if (negated != nullptr && negated->is_bool) {
        key = negated;
        value = "false";
        has_value = true;
      }
    }
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag, " for `strata up`",
                                                     NearestFlagHint(flag, ClusterConfigFlags())));
    }
    if (!has_value) {
      if (key->is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs a value"));
      }
    }
    if (absl::Status set = key->set(YAML::Node(value), config); !set.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", set.message()));
    }
  }
  return absl::OkStatus();
}

std::string ClusterFlagsHelp() {
  const ClusterConfig defaults;
  std::vector<FlagDoc> docs;
  for (const auto& [name, key] : Keys()) {
    if (key.flag.empty()) continue;
    docs.push_back({key.flag, absl::StrCat(key.help, " (config: ", name, ")"), key.get(defaults)});
  }
  return FormatFlagDocs(docs);
}

std::vector<std::string> DaemonArgs(const ClusterConfig& config, Daemon daemon) {
  std::vector<std::string> args;
  for (const auto& [name, key] : Keys()) {
    if (key.daemons & static_cast<int>(daemon)) {
      args.push_back(absl::StrCat("--", key.daemon_flag, "=", key.get(config)));
    }
  }
  return args;
}

absl::Status LoadClusterConfig(const std::string& path, ClusterConfig& config) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a mapping"));
  try {
    return Apply(root, "", path, config);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace strata
