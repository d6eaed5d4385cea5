// Flags a kernel raises once all of its blocks are done: the hand-over between the router's and
// a worker's streams (stream_flags.h waits on them) folded into the kernels on either side of
// it, instead of separate flag operations each on the GPU's critical path.
#ifndef STRATA_COMMON_CUDA_GRID_SIGNAL_H_
#define STRATA_COMMON_CUDA_GRID_SIGNAL_H_

#include <cstdint>

namespace strata::gpu {

inline constexpr int kMaxSignalFlags = 16;

// A flag value that stays up: lowering (below) only takes a flag from 1 to 0. Set from the
// host side when the process that should raise a flag is gone, so that its waiter passes
// however often the flag is lowered and waited on again.
inline constexpr uint32_t kFlagReleased = 2;

// When the kernel's last block finishes, after every block's writes are visible to the flags'
// readers: each clear[i] that is 1 is set to 0, then each raise[i] to 1. `done` counts the
// finished blocks of a grid of more than one; it must be 0 before the launch and is 0 again
// after it. count 0: no signal. Lowering a flag is not a release (in a grid of several blocks
// it may pass other blocks' reads): nothing may wait for a flag to go down.
// system: the readers may be on another GPU (peer access) or the host; false when every reader
// runs on this kernel's GPU, in any process: fences and atomics then take device scope.
struct GridSignal {
  int count = 0;
  uint32_t* clear[kMaxSignalFlags] = {};
  uint32_t* raise[kMaxSignalFlags] = {};
  uint32_t* done = nullptr;
  bool system = true;
};

// What a launch taking a signal checks first: the count in range and every pointer it uses set.
inline bool ValidSignal(const GridSignal& s) {
  if (s.count < 0 || s.count > kMaxSignalFlags) return false;
  if (s.count == 0) return true;
  if (s.done == nullptr) return false;
  for (int i = 0; i < s.count; ++i) {
    if (s.clear[i] == nullptr || s.raise[i] == nullptr) return false;
  }
  return true;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_GRID_SIGNAL_H_
