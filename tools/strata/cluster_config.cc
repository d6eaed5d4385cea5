#include "tools/strata/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/model_stack.h"
#include "common/placement/hot_ratio.h"
#include "common/util/byte_size.h"

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

// Each known key (dotted for nested maps): its `strata up` flag (empty: file only), how a
// file's value is stored, and the rule every value must keep, whether from the file or a flag.
struct Key {
  std::string flag;
  std::function<bool(const YAML::Node&, ClusterConfig&)> set;  // false: not of the field's type
  std::function<absl::Status(const ClusterConfig&)> check;     // null: any value
};

// A key of field type Field, read from YAML as T.
template <typename T, typename Field>
Key KeyOf(std::string flag, Field ClusterConfig::*field,
          std::type_identity_t<std::function<absl::Status(const Field&)>> check = nullptr) {
  Key key;
  key.flag = std::move(flag);
  key.set = [field](const YAML::Node& node, ClusterConfig& c) {
    T value;
    if (!YAML::convert<T>::decode(node, value)) return false;
    c.*field = static_cast<Field>(value);
    return true;
  };
  if (check) key.check = [field, check](const ClusterConfig& c) { return check(c.*field); };
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

const std::map<std::string, Key>& Keys() {
  using S = std::string;
  static const auto* keys = new std::map<std::string, Key>{
      {"model", KeyOf<S>("model", &ClusterConfig::model)},
      {"workers", KeyOf<int>("workers", &ClusterConfig::workers, Positive<int>)},
      {"gpus", KeyOf<int>("gpus", &ClusterConfig::gpus, NotNegative<int>)},
      {"device", KeyOf<S>("device", &ClusterConfig::device,
                          [](const S& v) {
                            return OneOf(v, {"cpu", "cuda"});
                          })},
      {"router_device",
       KeyOf<S>("router-device", &ClusterConfig::router_device,
                [](const S& v) { return v.empty() ? absl::OkStatus() : ParseDevice(v).status(); })},
      {"plan", KeyOf<S>("plan", &ClusterConfig::plan)},
      {"weights", KeyOf<S>("weights", &ClusterConfig::weights,
                           [](const S& v) {
                             return OneOf(v, {"bf16", "fp8"});
                           })},
      {"host", KeyOf<S>("host", &ClusterConfig::host)},
      {"port", KeyOf<int>("port", &ClusterConfig::port,
                          [](const int& v) { return Must(v >= 0 && v < 65536, "not a port"); })},
      {"transport", KeyOf<S>("transport", &ClusterConfig::transport,
                             [](const S& v) {
                               return OneOf(v, {"shm", "grpc"});
                             })},
      {"log_level", KeyOf<S>("log-level", &ClusterConfig::log_level,
                             [](const S& v) {
                               return OneOf(v, {"debug", "info", "warning", "error"});
                             })},
      {"threads", KeyOf<int>("threads", &ClusterConfig::threads_per_process, NotNegative<int>)},
      {"router_temperature",
       KeyOf<double>("router-temperature", &ClusterConfig::router_temperature, Positive<float>)},
      {"kv_cache.block_size",
       KeyOf<int>("kv-block-size", &ClusterConfig::kv_block_size, Positive<int>)},
      {"kv_cache.memory_mb",
       KeyOf<int64_t>("kv-cache-mb", &ClusterConfig::kv_memory_mb, Positive<int64_t>)},
      {"max_batch_tokens",
       KeyOf<int>("max-batch-tokens", &ClusterConfig::max_batch_tokens, Positive<int>)},
      {"max_running", KeyOf<int>("max-running", &ClusterConfig::max_running, Positive<int>)},
      {"max_queued_requests",
       KeyOf<int>("max-queued-requests", &ClusterConfig::max_queued_requests, NotNegative<int>)},
      {"drain_timeout_s",
       KeyOf<double>("drain-timeout-s", &ClusterConfig::drain_timeout_s, NotNegative<double>)},
      {"gpu_memory_budget", KeyOf<S>("gpu-memory-budget", &ClusterConfig::gpu_memory_budget,
                                     [](const S& v) {
                                       return v.empty() ? absl::OkStatus()
                                                        : ParseByteSize(v).status();
                                     })},
      {"hot_ratio", KeyOf<S>("hot-ratio", &ClusterConfig::hot_ratio,
                             [](const S& v) { return ParseHotRatio(v).status(); })},
      {"hot_ratio_policy", KeyOf<S>("", &ClusterConfig::hot_ratio_policy,
                                    [](const S& v) { return HotRatioPolicy::Parse(v).status(); })},
      {"cache_policy", KeyOf<S>("cache-policy", &ClusterConfig::cache_policy,
                                [](const S& v) {
                                  return OneOf(v, {"lru", "lfu"});
                                })},
      {"cold_experts", KeyOf<S>("cold-experts", &ClusterConfig::cold_experts,
                                [](const S& v) {
                                  return OneOf(v, {"auto", "copy", "cpu"});
                                })},
      {"expert_store", KeyOf<S>("expert-store", &ClusterConfig::expert_store,
                                [](const S& v) {
                                  return OneOf(v, {"copy", "in-place"});
                                })},
      {"prefetch", KeyOf<bool>("prefetch", &ClusterConfig::prefetch)},
      {"overlap_steps", KeyOf<bool>("overlap-steps", &ClusterConfig::overlap_steps)},
      {"cuda_graph_max_batch",
       KeyOf<int>("cuda-graph-max-batch", &ClusterConfig::cuda_graph_max_batch,
                  [](const int& v) {
                    return v >= 0 && v <= kMaxDecodeGraphBatch
                               ? absl::OkStatus()
                               : absl::InvalidArgumentError(
                                     absl::StrCat("must be in [0, ", kMaxDecodeGraphBatch, "]"));
                  })},
      {"mps", KeyOf<S>("mps", &ClusterConfig::mps,
                       [](const S& v) {
                         return OneOf(v, {"auto", "on", "off"});
                       })},
  };
  return *keys;
}

absl::Status Apply(const YAML::Node& map, const std::string& prefix, const std::string& path,
                   ClusterConfig& config) {
  for (const auto& item : map) {
    const std::string name = prefix + item.first.as<std::string>();
    if (item.second.IsMap()) {
      if (absl::Status s = Apply(item.second, name + ".", path, config); !s.ok()) return s;
      continue;
    }
    auto it = Keys().find(name);
    if (it == Keys().end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key \"", name, "\""));
    }
    const Key& key = it->second;
    absl::Status valid = key.set(item.second, config)
                             ? absl::OkStatus()
                             : absl::InvalidArgumentError("not of the key's type");
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
  // Tiered workers too: misses are copied in or read in place on their GPUs. Not when cold
  // experts are forced onto strata-cache's CPUs, which takes host activations.
  const bool ipc_workers = c.device == "cuda" && c.transport == "shm" && c.cold_experts != "cpu";
  if (c.router_device.empty()) return ipc_workers ? std::string("cuda:0") : std::string("cpu");
  const absl::StatusOr<int> index = ParseDevice(c.router_device);
  if (!index.ok())
    return absl::InvalidArgumentError(absl::StrCat("router_", index.status().message()));
  if (*index < 0) return std::string("cpu");
  if (!ipc_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "router_device ", c.router_device,
        " needs workers on GPUs of this host (device cuda, transport shm, cold_experts not "
        "cpu): activations move between them by CUDA IPC"));
  }
  return absl::StrCat("cuda:", *index);
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
