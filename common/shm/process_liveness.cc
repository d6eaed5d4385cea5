#include "common/shm/process_liveness.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace strata {
namespace {

struct ProcStat {
  char state = '?';
  uint64_t start_time = 0;
};

// Reads /proc/<pid>/stat. False if it cannot be read (no such process, or no /proc).
bool ReadProcStat(pid_t pid, ProcStat* out) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'. There, field 3 (state) follows; start time is field 22.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  p += 2;
  out->state = *p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  out->start_time = std::strtoull(p, nullptr, 10);
  return true;
}

}  // namespace

uint64_t ProcessStartTime(pid_t pid) {
  ProcStat stat;
  return ReadProcStat(pid, &stat) ? stat.start_time : 0;
}

bool ProcessAlive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;  // EPERM: exists, not ours
  ProcStat stat;
  if (!ReadProcStat(pid, &stat)) {
    // kill() just found it, so it exited in between, or /proc is missing; only the former
    // leaves kill() failing now.
    return !(::kill(pid, 0) != 0 && errno == ESRCH);
  }
  if (stat.state == 'Z' || stat.state == 'X' || stat.state == 'x') return false;
  return start_time == 0 || stat.start_time == start_time;
}

}  // namespace strata
