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
      break;
  }
  return CpuPathSeconds(options, expert_bytes, tokens, hidden, intermediate) <
                 CopyPathSeconds(options, expert_bytes)
             ? ColdPath::kCpu
             : ColdPath::kCopy;
}

}  // namespace strata
