#include "tools/strata/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/model_stack.h"
#include "common/placement/hot_ratio.h"
#include "common/util/byte_size.h"

namespace strata {
namespace {

bool ValidDevice(const std::string& v) { return ParseDevice(v).ok(); }

bool ValidHotRatio(const std::string& v) { return ParseHotRatio(v).ok(); }
bool ValidHotRatioPolicy(const std::string& v) { return HotRatioPolicy::Parse(v).ok(); }

// Each known key (dotted for nested maps) and how to store its value.
using Setter = std::function<bool(const YAML::Node&, ClusterConfig&)>;

template <typename T, typename Field>
Setter Set(Field ClusterConfig::*field, std::function<bool(const T&)> valid = nullptr) {
  return [field, valid](const YAML::Node& node, ClusterConfig& c) {
    T value;
    if (!YAML::convert<T>::decode(node, value)) return false;
    if (valid && !valid(value)) return false;
    c.*field = static_cast<Field>(value);
    return true;
  };
}

const std::map<std::string, Setter>& Setters() {
  static const auto* setters = new std::map<std::string, Setter>{
      {"model", Set<std::string>(&ClusterConfig::model)},
      {"workers", Set<int>(&ClusterConfig::workers, [](const int& v) { return v >= 0; })},
      {"device", Set<std::string>(&ClusterConfig::device)},
      {"router_device", Set<std::string>(&ClusterConfig::router_device, ValidDevice)},
      {"plan", Set<std::string>(&ClusterConfig::plan)},
      {"weights", Set<std::string>(&ClusterConfig::weights,
                                   [](const std::string& v) { return v == "bf16" || v == "fp8"; })},
      {"host", Set<std::string>(&ClusterConfig::host)},
      {"port", Set<int>(&ClusterConfig::port, [](const int& v) { return v >= 0 && v < 65536; })},
      {"transport",
       Set<std::string>(&ClusterConfig::transport,
                        [](const std::string& v) { return v == "shm" || v == "grpc"; })},
      {"log_level", Set<std::string>(&ClusterConfig::log_level)},
      {"threads",
       Set<int>(&ClusterConfig::threads_per_process, [](const int& v) { return v >= 0; })},
      {"router_temperature",
       Set<double>(&ClusterConfig::router_temperature, [](const double& v) { return v > 0; })},
      {"kv_cache.block_size",
       Set<int>(&ClusterConfig::kv_block_size, [](const int& v) { return v > 0; })},
      {"kv_cache.memory_mb",
       Set<int64_t>(&ClusterConfig::kv_memory_mb, [](const int64_t& v) { return v > 0; })},
      {"max_batch_tokens",
       Set<int>(&ClusterConfig::max_batch_tokens, [](const int& v) { return v > 0; })},
      {"max_running", Set<int>(&ClusterConfig::max_running, [](const int& v) { return v > 0; })},
      {"max_queued_requests",
       Set<int>(&ClusterConfig::max_queued_requests, [](const int& v) { return v >= 0; })},
      {"drain_timeout_s",
       Set<double>(&ClusterConfig::drain_timeout_s, [](const double& v) { return v >= 0; })},
      {"gpu_memory_budget",
       Set<std::string>(&ClusterConfig::gpu_memory_budget,
                        [](const std::string& v) { return ParseByteSize(v).ok(); })},
      {"hot_ratio", Set<std::string>(&ClusterConfig::hot_ratio, ValidHotRatio)},
      {"hot_ratio_policy", Set<std::string>(&ClusterConfig::hot_ratio_policy, ValidHotRatioPolicy)},
      {"cache_policy",
       Set<std::string>(&ClusterConfig::cache_policy,
                        [](const std::string& v) { return v == "lru" || v == "lfu"; })},
      {"cold_experts", Set<std::string>(&ClusterConfig::cold_experts,
                                        [](const std::string& v) {
                                          return v == "auto" || v == "copy" || v == "cpu";
                                        })},
      {"prefetch", Set<bool>(&ClusterConfig::prefetch)},
      {"cuda_graph_max_batch",
       Set<int>(&ClusterConfig::cuda_graph_max_batch,
                [](const int& v) { return v >= 0 && v <= kMaxDecodeGraphBatch; })},
      {"mps", Set<std::string>(
                  &ClusterConfig::mps,
                  [](const std::string& v) { return v == "auto" || v == "on" || v == "off"; })},
  };
  return *setters;
}

absl::Status Apply(const YAML::Node& map, const std::string& prefix, const std::string& path,
                   ClusterConfig& config) {
  for (const auto& item : map) {
    const std::string key = prefix + item.first.as<std::string>();
    if (item.second.IsMap()) {
      if (absl::Status s = Apply(item.second, key + ".", path, config); !s.ok()) return s;
      continue;
    }
    auto it = Setters().find(key);
    if (it == Setters().end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key \"", key, "\""));
    }
    if (!it->second(item.second, config)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad value for \"", key, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RouterDevice(const ClusterConfig& c) {
  const bool ipc_workers =
      c.device == "cuda" && c.transport == "shm" && c.gpu_memory_budget.empty();
  if (c.router_device.empty()) return ipc_workers ? std::string("cuda:0") : std::string("cpu");
  const absl::StatusOr<int> index = ParseDevice(c.router_device);
  if (!index.ok())
    return absl::InvalidArgumentError(absl::StrCat("router_", index.status().message()));
  if (*index < 0) return std::string("cpu");
  if (!ipc_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "router_device ", c.router_device,
        " needs workers on GPUs of this host that hold every expert (device cuda, transport "
        "shm, no gpu_memory_budget): activations move between them by CUDA IPC"));
  }
  return absl::StrCat("cuda:", *index);
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
