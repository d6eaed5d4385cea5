#include "tools/strata/admin_target.h"

#include "absl/strings/str_cat.h"
#include "common/cluster/runtime_dir.h"

namespace strata {

std::unique_ptr<v1::Admin::Stub> AdminTarget::Stub() const {
  return v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> AdminTarget::Context(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  token.Attach(*context);
  return context;
}

absl::StatusOr<AdminTarget> ResolveAdmin(const std::string& server, const std::string& admin,
                                         const std::string& token_file) {
  AdminTarget target;
  if (!admin.empty()) {
    absl::StatusOr<ClusterToken> token = ClusterToken::FromFileOrEnvironment(token_file);
    if (!token.ok()) return token.status();
    target.address = admin;
    target.token = *std::move(token);
    return target;
  }
  if (server.empty()) {
    return absl::InvalidArgumentError(
        "give --server HOST:PORT (a cluster this user started on this host) or --admin "
        "ADDRESS with --cluster-token-file FILE");
  }
  absl::StatusOr<std::pair<ClusterDir, ClusterInfo>> found = FindClusterByClient(server);
  if (!found.ok()) {
    return absl::NotFoundError(absl::StrCat(
        found.status().message(),
        ": admin calls go to the router's internal listener; give --admin ADDRESS and "
        "--cluster-token-file FILE for a cluster started elsewhere or by another user"));
  }
  target.address = found->second.internal;
  absl::StatusOr<ClusterToken> token = ClusterToken::FromFile(found->first.token_file());
  if (!token.ok()) return token.status();
  target.token = *std::move(token);
  return target;
}

}  // namespace strata
