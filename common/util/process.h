// Small pieces every Strata executable's main() needs: flag names with dashes, a log level,
// status lines on stderr, and waiting for SIGINT/SIGTERM.
#ifndef STRATA_COMMON_UTIL_PROCESS_H_
#define STRATA_COMMON_UTIL_PROCESS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace strata {

// argv with "--max-new-tokens" spelled "--max_new_tokens", as Abseil's flags expect; the
// storage lives as long as this object.
class DashedFlags {
 public:
  DashedFlags(int argc, char** argv);
  int argc() { return static_cast<int>(pointers_.size()); }
  char** argv() { return pointers_.data(); }
  // Whether --name (underscored) was given, so a config file can supply the rest.
  bool Specified(absl::string_view name) const;

 private:
  std::vector<std::string> args_;
  std::vector<char*> pointers_;
};

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
// "debug", "info", "warning", "error"; false for anything else.
bool SetLogLevel(absl::string_view name);
bool LogEnabled(LogLevel level);
// One line on stderr, prefixed with the time and the program name, if `level` is enabled.
void Log(LogLevel level, absl::string_view message);
// A line of progress or waiting status on stderr ("loading layer 3/48", "waiting for
// strata-router at ..."), printed at any log level but "error".
void StatusLine(absl::string_view message);
void SetProgramName(absl::string_view name);

// Blocks SIGINT and SIGTERM in this thread and in threads started after it; call first in
// main(). WaitForTerminationSignal() then returns the signal that arrived.
void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_PROCESS_H_
