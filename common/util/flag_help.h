// Command lines of every Strata executable: usage text with dashed flag names and their
// defaults, an unknown flag answered with the nearest known one, and repeatable flags.
#ifndef STRATA_COMMON_UTIL_FLAG_HELP_H_
#define STRATA_COMMON_UTIL_FLAG_HELP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

// One flag as its help shows it.
struct FlagDoc {
  std::string name;  // dashed, without "--"
  std::string help;
  std::string default_value;  // empty: none shown
};

// "  --name  help (default value)\n" per flag.
std::string FormatFlagDocs(const std::vector<FlagDoc>& docs);

// The Abseil flags named (underscored or dashed) as FlagDocs, in that order; names that are not
// flags are skipped.
std::vector<FlagDoc> DocsOfFlags(const std::vector<std::string>& names);
// Every Abseil flag defined in `file` (a main()'s __FILE__), or in any of `files`, by name.
std::vector<FlagDoc> DocsOfFlagsIn(absl::string_view file);
std::vector<FlagDoc> DocsOfFlagsIn(const std::vector<absl::string_view>& files);

// "; did you mean --x?" for the candidate nearest to `name` (dashed), or "" when none is close.
std::string NearestFlagHint(const std::string& name, const std::vector<std::string>& candidates);

// INVALID_ARGUMENT naming the first --flag in args[1..] that no Abseil flag of this program
// defines (--noX counts for a switch X), with the nearest of `candidates` (dashed; empty: every
// flag of the program) and the command to ask for help.
absl::Status CheckFlagsKnown(const std::vector<std::string>& args,
                             const std::vector<std::string>& candidates,
                             const std::string& program);

// Takes every "--name VALUE" and "--name=VALUE" (dashed or underscored) out of `args` and
// returns the values in order: a flag given once per value. INVALID_ARGUMENT when the last
// one has no value.
absl::StatusOr<std::vector<std::string>> TakeRepeatedFlag(std::vector<std::string>& args,
                                                          const std::string& name);

// Whether args[1..] ask for help (--help, -h, --helpfull).
bool AsksForHelp(const std::vector<std::string>& args);

// For a daemon's main(): sets Abseil's usage message to `usage`; on --help prints `usage` and
// the flags defined in `flag_files` (its __FILE__, and the files of shared flags it links) and
// exits 0; on an unknown flag prints the error and exits 2; otherwise parses argv (dashed names
// accepted).
void ParseDaemonFlags(int argc, char** argv, const std::string& program, const std::string& usage,
                      const std::vector<absl::string_view>& flag_files);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_FLAG_HELP_H_
