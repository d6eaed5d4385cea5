// The bounds of the router's settings, in one place for its flags (main.cc), RouterServer::Start
// and the cluster config (tools/strata/cluster_config.cc), so that they cannot disagree.
#ifndef STRATA_SERVICES_ROUTER_ROUTER_LIMITS_H_
#define STRATA_SERVICES_ROUTER_ROUTER_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

// Threads of one process: beyond this a process fails to start them.
inline constexpr int kMaxThreads = 1024;
// The KV pool, MiB: at most 4 TiB, far beyond any host this runs on.
inline constexpr int64_t kMaxKvCacheMiB = int64_t{1} << 22;
// The largest gRPC request and HTTP body a client may send.
inline constexpr int64_t kMinRequestBytes = 1024;
inline constexpr int64_t kMaxRequestBytes = int64_t{1} << 30;
// How long a worker's heartbeat may stand still before it is declared failed, seconds: above
// twice the channels' wait slice, below an hour.
inline constexpr double kMinWorkerLivenessS = 0.2;
inline constexpr double kMaxWorkerLivenessS = 3600;

// The HTTP API's key: 1 to 1024 printable ASCII characters without spaces, what an
// Authorization header carries unchanged. Read from this variable where no flag sets it.
inline constexpr char kApiKeyEnvironment[] = "STRATA_API_KEY";
inline constexpr size_t kMaxApiKeyBytes = 1024;
inline bool IsApiKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxApiKeyBytes) return false;
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_ROUTER_LIMITS_H_
