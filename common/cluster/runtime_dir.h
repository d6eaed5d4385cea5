// Where one cluster's processes find each other and their secret, out of other local users'
// reach: a directory per cluster, mode 0700, under the user's runtime directory. It holds the
// internal listeners' Unix sockets, the cluster token (cluster_token.h) and cluster.json (the
// client and internal addresses, for `strata stats` and the other admin commands). The same id
// names the cluster's shared-memory segments ("strata-<id>-..."), so that a cluster whose
// `strata up` was killed can be swept whole by the next one.
#ifndef STRATA_COMMON_CLUSTER_RUNTIME_DIR_H_
#define STRATA_COMMON_CLUSTER_RUNTIME_DIR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// The user's runtime directory: $STRATA_RUNTIME_DIR, else $XDG_RUNTIME_DIR/strata, else
// /run/strata for root, else /tmp/strata-<uid>. Created (mode 0700) when missing; refused
// unless it is a directory of this user that nobody else may enter, checked on the opened
// descriptor (a directory or link planted there by another user is not used).
absl::StatusOr<std::string> UserRuntimeDir();

struct ClusterDir {
  // "<pid>-<start time>-<16 hex digits>" of the process that made it: whether the cluster
  // still runs is read from its id.
  std::string id;
  std::string path;  // <runtime dir>/<id>

  // Prefix of the cluster's shared-memory names.
  std::string shm_prefix() const { return "strata-" + id; }
  std::string token_file() const { return path + "/token"; }
  std::string info_file() const { return path + "/cluster.json"; }
  // A gRPC address of a Unix socket in the directory: "unix:<path>/<name>.sock".
  std::string socket(const std::string& name) const {
    return "unix:" + path + "/" + name + ".sock";
  }
};

// Makes a new cluster directory (0700) named after this process and a random id.
absl::StatusOr<ClusterDir> CreateClusterDir();

// Removes `dir` and the shared-memory segments under its prefix (this user's own only).
void RemoveCluster(const ClusterDir& dir);

// Removes the clusters of this user whose making process is gone (a `strata up` that was
// SIGKILLed), directories and segments; returns their ids.
std::vector<std::string> SweepDeadClusters();

// What cluster.json records: written by `strata up` once the cluster serves.
struct ClusterInfo {
  std::string client;    // the Generation API, HOST:PORT
  std::string internal;  // the router's internal listener (Coordinator, Admin)
  int http_port = 0;     // the OpenAI-compatible API's port, 0 when off (for operators)
};
absl::Status WriteClusterInfo(const ClusterDir& dir, const ClusterInfo& info);
absl::StatusOr<ClusterInfo> ReadClusterInfo(const std::string& dir_path);

// The running cluster of this user whose client address is `client` (HOST:PORT; a loopback
// or wildcard host matches any loopback spelling), with its directory; NOT_FOUND if none.
absl::StatusOr<std::pair<ClusterDir, ClusterInfo>> FindClusterByClient(const std::string& client);

}  // namespace strata

#endif  // STRATA_COMMON_CLUSTER_RUNTIME_DIR_H_
