// `strata up`: starts strata-expert-store, the workers and strata-router as separate
// processes, prints "READY <host>:<port>" when Generate is served, restarts a worker or
// strata-expert-store that dies (the store on the same address, re-attaching to its shared
// memory), and stops them all on SIGINT/SIGTERM.
#ifndef STRATA_TOOLS_STRATA_SUPERVISOR_H_
#define STRATA_TOOLS_STRATA_SUPERVISOR_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "tools/strata/cluster_config.h"

namespace strata {

struct SupervisorOptions {
  ClusterConfig cluster;
  std::string bin_dir;  // where strata-expert-store, strata-worker and strata-router are
};

// Runs the cluster until SIGINT/SIGTERM (blocked by the caller) and returns the router's
// verdict: OK when every in-flight request finished.
absl::Status RunCluster(const SupervisorOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_SUPERVISOR_H_
