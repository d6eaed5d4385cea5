#include "services/expert-worker/cold_path_model.h"

#include <algorithm>

namespace strata {

double CopyPathSeconds(const ColdPathOptions& options, uint64_t expert_bytes) {
  return static_cast<double>(expert_bytes) / options.copy_bytes_per_s /
         (1.0 + std::max(0.0, options.copy_reuses));
}

double CpuPathSeconds(const ColdPathOptions& options, uint64_t expert_bytes, int64_t tokens,
                      int64_t hidden, int64_t intermediate) {
  const double flops = static_cast<double>(std::max<int64_t>(tokens, 0)) * 6.0 *
                       static_cast<double>(hidden) * static_cast<double>(intermediate);
  return options.cpu_overhead_s + static_cast<double>(expert_bytes) / options.cpu_bytes_per_s +
         flops / options.cpu_flops;
}

ColdPath ChooseColdPath(const ColdPathOptions& options, uint64_t expert_bytes, int64_t tokens,
                        int64_t hidden, int64_t intermediate) {
  switch (options.mode) {
    case ColdPathOptions::kCopy:
      return ColdPath::kCopy;
    case ColdPathOptions::kCpu:
      return ColdPath::kCpu;
    case ColdPathOptions::kAuto:
    case ColdPathOptions::kSplit:
      break;
  }
  return CpuPathSeconds(options, expert_bytes, tokens, hidden, intermediate) <
                 CopyPathSeconds(options, expert_bytes)
             ? ColdPath::kCpu
             : ColdPath::kCopy;
}

ColdPath ColdPathSplit::Choose(int64_t tokens) {
  const double copy = CopyPathSeconds(options_, bytes_);
  const double cpu = CpuPathSeconds(options_, bytes_, tokens, hidden_, intermediate_);
  ColdPath path = ChooseColdPath(options_, bytes_, tokens, hidden_, intermediate_);
  if (options_.mode == ColdPathOptions::kAuto || options_.mode == ColdPathOptions::kSplit) {
    // The end of the step either way; copy on a tie.
    path = std::max(copy_s_, cpu_s_ + cpu) < std::max(copy_s_ + copy, cpu_s_) ? ColdPath::kCpu
                                                                              : ColdPath::kCopy;
  }
  (path == ColdPath::kCpu ? cpu_s_ : copy_s_) += path == ColdPath::kCpu ? cpu : copy;
  return path;
}

}  // namespace strata
