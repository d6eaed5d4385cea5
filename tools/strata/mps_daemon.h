// A private CUDA MPS control daemon for a cluster's GPU processes. Without MPS the router and a
// worker on one GPU are time-sliced between two contexts, and every MoE layer pays two context
// switches, most of the decode rate lost (docs/archive/benchmarks-2026-11-to-12-02.md).
#ifndef STRATA_TOOLS_STRATA_MPS_DAEMON_H_
#define STRATA_TOOLS_STRATA_MPS_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

class MpsDaemon {
 public:
  // Starts `nvidia-cuda-mps-control -d` with pipe and log directories of its own under
  // `dir` and exports CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY to the processes this
  // one starts afterwards. NotFound when the control binary is not on PATH; Unavailable when
  // it fails to start.
  static absl::StatusOr<std::unique_ptr<MpsDaemon>> Start(const std::string& dir);
  // Tells the daemon to quit (after the clients have stopped) and removes the directories.
  ~MpsDaemon();

  const std::string& pipe_dir() const { return pipe_dir_; }

 private:
  MpsDaemon() = default;
  std::string dir_, pipe_dir_, log_dir_;
};

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_MPS_DAEMON_H_
