// Whether another process on this host is still running, robust to zombies and pid reuse.
#ifndef STRATA_COMMON_SHM_PROCESS_LIVENESS_H_
#define STRATA_COMMON_SHM_PROCESS_LIVENESS_H_

#include <sys/types.h>

#include <cstdint>

namespace strata {

// The start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22); with the
// pid it names one process for the life of the host. 0 when unknown (no /proc).
uint64_t ProcessStartTime(pid_t pid);

// False once `pid` has exited (including as an unreaped zombie, which kill(pid, 0) still
// reports as present: the router is often the worker's parent) or its pid now belongs to a
// process started at a time other than `start_time` (0: skip that check). Costs a kill()
// and a read of /proc/<pid>/stat, a few microseconds: for slow paths only.
bool ProcessAlive(pid_t pid, uint64_t start_time);

}  // namespace strata

#endif  // STRATA_COMMON_SHM_PROCESS_LIVENESS_H_
