#include "common/util/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>

#include <chrono>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/process.h"

namespace strata {
namespace {

constexpr int kLinesPerMinute = 10;

void Handle(google::protobuf::LogLevel level, const char* filename, int line,
            const std::string& message) {
  static std::mutex mu;
  static auto window_start = std::chrono::steady_clock::now();
  static int lines = 0;
  static int dropped = 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start >= std::chrono::minutes(1)) {
    if (dropped > 0) {
      Log(LogLevel::kWarning, absl::StrCat("libprotobuf: ", dropped, " more line(s) dropped"));
    }
    window_start = now;
    lines = 0;
    dropped = 0;
  }
  if (++lines > kLinesPerMinute) {
    ++dropped;
    return;
  }
  const LogLevel ours = level >= google::protobuf::LOGLEVEL_ERROR     ? LogLevel::kError
                        : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                      : LogLevel::kInfo;
  Log(ours, absl::StrCat("libprotobuf ", filename, ":", line, ": ", message));
}

}  // namespace

void RateLimitProtobufLog() { google::protobuf::SetLogHandler(&Handle); }

}  // namespace strata
