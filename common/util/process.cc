#include "common/util/process.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace strata {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::string& ProgramName() {
  static std::string* name = new std::string("strata");
  return *name;
}
std::mutex g_stderr_mu;

// "2024-05-01 12:34:56.789", local time: lines of several processes read in order.
std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  ::localtime_r(&seconds, &local);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03d", static_cast<int>(millis));
  return buf;
}

void Emit(absl::string_view tag, absl::string_view message) {
  const std::string time = Timestamp();
  std::lock_guard<std::mutex> lock(g_stderr_mu);
  std::fprintf(stderr, "%s %s%.*s: %.*s\n", time.c_str(), ProgramName().c_str(),
               static_cast<int>(tag.size()), tag.data(), static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
}

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

DashedFlags::DashedFlags(int argc, char** argv) : args_(argv, argv + argc) {
  for (size_t i = 1; i < args_.size(); ++i) {
    std::string& arg = args_[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t j = 2; j < name_end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  for (std::string& arg : args_) pointers_.push_back(arg.data());
}

bool DashedFlags::Specified(absl::string_view name) const {
  for (size_t i = 1; i < args_.size(); ++i) {
    absl::string_view arg = args_[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
    arg.remove_prefix(2);
    const absl::string_view flag = arg.substr(0, std::min(arg.find('='), arg.size()));
    if (flag == name ||
        (flag.size() == name.size() + 2 && flag.substr(0, 2) == "no" && flag.substr(2) == name)) {
      return true;
    }
  }
  return false;
}

bool SetLogLevel(absl::string_view name) {
  LogLevel level;
  if (name == "debug")
    level = LogLevel::kDebug;
  else if (name == "info")
    level = LogLevel::kInfo;
  else if (name == "warning")
    level = LogLevel::kWarning;
  else if (name == "error")
    level = LogLevel::kError;
  else
    return false;
  g_level.store(static_cast<int>(level));
  return true;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  static constexpr absl::string_view kTags[] = {" [debug]", " [info]", " [warning]", " [error]"};
  Emit(kTags[static_cast<int>(level)], message);
}

void StatusLine(absl::string_view message) {
  if (g_level.load() >= static_cast<int>(LogLevel::kError)) return;
  Emit("", message);
}

void SetProgramName(absl::string_view name) { ProgramName() = std::string(name); }

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSet();
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

}  // namespace strata
