// The processes `strata up` starts: spawned in their own process group with their stdout on a
// pipe, read for the lines they announce themselves with, and stopped in order.
#ifndef STRATA_TOOLS_STRATA_CHILD_PROCESS_H_
#define STRATA_TOOLS_STRATA_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace strata {

struct Child {
  Child() = default;
  Child(std::string name, std::vector<std::string> argv)
      : name(std::move(name)), argv(std::move(argv)) {}

  std::string name;
  std::vector<std::string> argv;
  // NAME=value entries set in its environment over this process's: secrets stay off the
  // command line, which any local user can read.
  std::vector<std::string> environment;
  pid_t pid = -1;
  int stdout_fd = -1;
  std::string unread;  // read from stdout_fd, not yet taken as lines
  absl::Time started;
  int restarts = 0;
};

// Starts `child` in its own process group (a terminal's Ctrl-C reaches only the supervisor,
// which then stops the children in order), dying with the supervisor.
absl::Status Spawn(Child& child);

// Drops the complete lines at the front of `buffer` up to the first that starts with `prefix`
// and returns the rest of that one; nullopt while there is none (an incomplete line stays).
std::optional<std::string> TakeLineWithPrefix(std::string& buffer, absl::string_view prefix);

// One read of `child`'s stdout into child.unread; false once the child has closed it.
bool ReadStdout(Child& child);

// Reads `child`'s stdout until a line starting with `prefix`; returns the rest of the line.
absl::StatusOr<std::string> AwaitLine(Child& child, absl::string_view prefix,
                                      absl::Duration timeout);

// Points `child`'s --listen= at `address`: a restarted child listens where the others look.
void SetListenAddress(Child& child, const std::string& address);

// Keeps reading a child's stdout so it never blocks on a full pipe. The reading thread owns the
// descriptor from here and closes it at end of file: a restart's Spawn must not close it under
// the thread (its number could then be reused by another pipe or socket the thread would read).
void DrainInBackground(Child& child);

// Sends SIGTERM, waits up to `grace`, then SIGKILL. Returns the exit status, or -1.
int Stop(Child& child, absl::Duration grace);

// A wait status in words: "exit status 1", "signal 9".
std::string Describe(int status);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_CHILD_PROCESS_H_
