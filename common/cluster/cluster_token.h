// The shared secret of one cluster's processes. `strata up` makes one per cluster and hands it
// to its children in a file only its user can read (the cluster directory: runtime_dir.h);
// every internal RPC (Coordinator, Admin, ExpertStore, ExpertWorker) carries it in its
// metadata and every internal service checks it, whatever listener the call came through. On
// TCP it is what keeps a network client from registering as a worker or driving Admin; on the
// cluster's Unix sockets (in a 0700 directory) it is a second lock.
#ifndef STRATA_COMMON_CLUSTER_CLUSTER_TOKEN_H_
#define STRATA_COMMON_CLUSTER_CLUSTER_TOKEN_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

class ClusterToken {
 public:
  static constexpr char kMetadataKey[] = "x-strata-cluster-token";
  static constexpr char kEnvironment[] = "STRATA_CLUSTER_TOKEN";

  // No token: calls carry none, and every call is accepted (a process started by hand on a
  // listener only its user can reach).
  ClusterToken() = default;
  // INVALID_ARGUMENT unless 32..1024 printable ASCII characters.
  static absl::StatusOr<ClusterToken> FromSecret(std::string secret);
  // Reads a token file: this user's own, not readable by others (checked on the descriptor),
  // surrounding whitespace ignored.
  static absl::StatusOr<ClusterToken> FromFile(const std::string& path);
  // A new random token (256 bits), written to `path` (created exclusively, mode 0600).
  static absl::StatusOr<ClusterToken> Create(const std::string& path);
  // The daemons' rule: `file` when given, else $STRATA_CLUSTER_TOKEN, else none.
  static absl::StatusOr<ClusterToken> FromFileOrEnvironment(const std::string& file);

  bool empty() const { return secret_.empty(); }
  // Adds the token to an outgoing call's metadata (nothing without one).
  void Attach(grpc::ClientContext& context) const;
  // OK when the call carries this token (or there is none to check); UNAUTHENTICATED otherwise.
  // Compares in constant time.
  absl::Status Check(const grpc::CallbackServerContext& context) const;

 private:
  explicit ClusterToken(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

// The daemons' rule for an internal listener (`what` names it in the message): a Unix socket
// may go without a token (its directory keeps others out); TCP may not.
absl::Status CheckInternalListener(const std::string& what, const std::string& address,
                                   const ClusterToken& token);

}  // namespace strata

#endif  // STRATA_COMMON_CLUSTER_CLUSTER_TOKEN_H_
