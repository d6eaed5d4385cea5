// Where the admin commands (`strata stats`, `hot-ratio`, `kv-resize`, the counters of `strata
// bench`) reach a cluster: its router's internal listener, with its cluster token. Admin is not
// served on the client port.
#ifndef STRATA_TOOLS_STRATA_ADMIN_TARGET_H_
#define STRATA_TOOLS_STRATA_ADMIN_TARGET_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster/cluster_token.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct AdminTarget {
  std::string address;  // the router's internal listener: unix:PATH or HOST:PORT
  ClusterToken token;

  std::unique_ptr<v1::Admin::Stub> Stub() const;
  // A call's context: the deadline and the token.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
};

// `admin` (the --admin flag) with the token of `token_file` (or $STRATA_CLUSTER_TOKEN) when
// given; else the cluster of this user whose client port is `server`, from its directory
// (runtime_dir.h). A clear error when neither finds one.
absl::StatusOr<AdminTarget> ResolveAdmin(const std::string& server, const std::string& admin,
                                         const std::string& token_file);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_ADMIN_TARGET_H_
