#include "common/util/flag_help.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/util/process.h"

namespace strata {
namespace {

std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }
std::string Underscored(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }

FlagDoc DocOf(const absl::CommandLineFlag& flag) {
  FlagDoc doc{Dashed(flag.Name()), flag.Help(), flag.DefaultValue()};
  if (doc.default_value.empty()) doc.default_value = "\"\"";
  return doc;
}

// Edit distance, for the nearest flag to a misspelt one.
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The flag named by a "--name[=value]" argument, dashed; empty for anything else.
std::string FlagName(absl::string_view arg) {
  if (arg.size() < 3 || !absl::StartsWith(arg, "--")) return "";
  arg.remove_prefix(2);
  return Dashed(arg.substr(0, std::min(arg.find('='), arg.size())));
}

bool IsKnown(const std::string& dashed) {
  if (absl::FindCommandLineFlag(Underscored(dashed)) != nullptr) return true;
  if (!absl::StartsWith(dashed, "no")) return false;
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(Underscored(dashed.substr(2)));
  return flag != nullptr && flag->IsOfType<bool>();
}

}  // namespace

std::string FormatFlagDocs(const std::vector<FlagDoc>& docs) {
  std::string out;
  for (const FlagDoc& doc : docs) {
    absl::StrAppend(
        &out, "  --", doc.name, "  ", doc.help,
        doc.default_value.empty() ? "" : absl::StrCat(" (default ", doc.default_value, ")"), "\n");
  }
  return out;
}

std::vector<FlagDoc> DocsOfFlags(const std::vector<std::string>& names) {
  std::vector<FlagDoc> docs;
  for (const std::string& name : names) {
    if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(Underscored(name))) {
      docs.push_back(DocOf(*flag));
    }
  }
  return docs;
}

std::vector<FlagDoc> DocsOfFlagsIn(absl::string_view file) {
  return DocsOfFlagsIn(std::vector<absl::string_view>{file});
}

std::vector<FlagDoc> DocsOfFlagsIn(const std::vector<absl::string_view>& files) {
  std::map<std::string, FlagDoc> sorted;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // Abseil normalizes the name (drops a leading "/" or "./"): the file ends with it.
    const std::string defined_in = flag->Filename();
    if (defined_in.empty()) continue;
    for (absl::string_view file : files) {
      if (absl::EndsWith(file, defined_in)) sorted.emplace(std::string(name), DocOf(*flag));
    }
  }
  std::vector<FlagDoc> docs;
  for (auto& [name, doc] : sorted) docs.push_back(std::move(doc));
  return docs;
}

std::string NearestFlagHint(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = 4;  // farther is no suggestion
  for (const std::string& candidate : candidates) {
    const size_t d = Distance(name, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best.empty() ? "" : absl::StrCat("; did you mean --", best, "?");
}

absl::Status CheckFlagsKnown(const std::vector<std::string>& args,
                             const std::vector<std::string>& candidates,
                             const std::string& program) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    const std::string name = FlagName(args[i]);
    if (name.empty() || IsKnown(name)) continue;
    std::vector<std::string> names = candidates;
    if (names.empty()) {
      for (const auto& [flag_name, flag] : absl::GetAllFlags()) names.push_back(Dashed(flag_name));
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name,
                                                   NearestFlagHint(name, names), " (`", program,
                                                   " --help` lists the flags)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> TakeRepeatedFlag(std::vector<std::string>& args,
                                                          const std::string& name) {
  std::vector<std::string> values, rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string flag = i == 0 ? "" : FlagName(args[i]);
    if (flag != Dashed(name)) {
      rest.push_back(args[i]);
      continue;
    }
    if (const size_t eq = args[i].find('='); eq != std::string::npos) {
      values.push_back(args[i].substr(eq + 1));
    } else if (i + 1 < args.size()) {
      values.push_back(args[++i]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", Dashed(name), " needs a value"));
    }
  }
  args = std::move(rest);
  return values;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    if (args[i] == "--help" || args[i] == "-h" || args[i] == "--helpfull") return true;
  }
  return false;
}

void ParseDaemonFlags(int argc, char** argv, const std::string& program, const std::string& usage,
                      const std::vector<absl::string_view>& flag_files) {
  absl::SetProgramUsageMessage(usage);
  const std::vector<std::string> args(argv, argv + argc);
  if (AsksForHelp(args)) {
    std::cout << usage << "\n" << FormatFlagDocs(DocsOfFlagsIn(flag_files));
    std::exit(0);
  }
  std::vector<std::string> own;
  for (const FlagDoc& doc : DocsOfFlagsIn(flag_files)) own.push_back(doc.name);
  if (absl::Status known = CheckFlagsKnown(args, own, program); !known.ok()) {
    std::cerr << program << ": " << known.message() << "\n";
    std::exit(2);
  }
  DashedFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
}

}  // namespace strata
