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
  const bool forced =
      options_.mode == ColdPathOptions::kCopy || options_.mode == ColdPathOptions::kCpu;
  // Unforced: where the step ends sooner (copy on a tie).
  const bool on_cpu = forced ? options_.mode == ColdPathOptions::kCpu
                             : std::max(copy_s_, cpu_s_ + cpu) < std::max(copy_s_ + copy, cpu_s_);
  (on_cpu ? cpu_s_ : copy_s_) += on_cpu ? cpu : copy;
  return on_cpu ? ColdPath::kCpu : ColdPath::kCopy;
}

bool FitCpuRates(double one_token_s, double many_tokens_s, int many_tokens, uint64_t expert_bytes,
                 int64_t hidden, int64_t intermediate, ColdPathOptions& options) {
  if (many_tokens < 2 || !(many_tokens_s > one_token_s) || !(one_token_s > 0.0)) return false;
  const double flop = 6.0 * static_cast<double>(hidden) * static_cast<double>(intermediate);
  const double flops = (many_tokens - 1) * flop / (many_tokens_s - one_token_s);
  const double stream = one_token_s - flop / flops;
  if (stream < 0.25 * one_token_s) return false;
  options.cpu_flops = flops;
  options.cpu_bytes_per_s = static_cast<double>(expert_bytes) / stream;
  return true;
}

}  // namespace strata
