#include "tools/strata/mps_daemon.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata {
namespace {

constexpr char kControl[] = "nvidia-cuda-mps-control";

bool OnPath(const std::string& name) {
  const char* path = ::getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(std::filesystem::path(std::string(dir)) / name, ec))
      return true;
  }
  return false;
}

// Runs the control binary with this daemon's directories; `input` goes to its stdin.
int Control(const std::string& pipe_dir, const std::string& log_dir, const std::string& args,
            const std::string& input) {
  const std::string command =
      absl::StrCat("CUDA_MPS_PIPE_DIRECTORY='", pipe_dir, "' CUDA_MPS_LOG_DIRECTORY='", log_dir,
                   "' ", kControl, " ", args, " >/dev/null 2>&1");
  FILE* pipe = ::popen(command.c_str(), "w");
  if (pipe == nullptr) return -1;
  if (!input.empty()) std::fputs(input.c_str(), pipe);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpsDaemon>> MpsDaemon::Start(const std::string& dir) {
  if (!OnPath(kControl)) {
    return absl::NotFoundError(absl::StrCat(kControl, " is not on PATH"));
  }
  std::unique_ptr<MpsDaemon> d(new MpsDaemon());
  d->dir_ = dir;
  d->pipe_dir_ = dir + "/pipe";
  d->log_dir_ = dir + "/log";
  std::error_code ec;
  std::filesystem::create_directories(d->pipe_dir_, ec);
  std::filesystem::create_directories(d->log_dir_, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (const int rc = Control(d->pipe_dir_, d->log_dir_, "-d", ""); rc != 0) {
    std::filesystem::remove_all(dir, ec);
    d->dir_.clear();
    return absl::UnavailableError(absl::StrCat(kControl, " -d exited with ", rc));
  }
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", d->pipe_dir_.c_str(), 1);
  ::setenv("CUDA_MPS_LOG_DIRECTORY", d->log_dir_.c_str(), 1);
  return d;
}

MpsDaemon::~MpsDaemon() {
  if (dir_.empty()) return;
  Control(pipe_dir_, log_dir_, "", "quit\n");
  ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  ::unsetenv("CUDA_MPS_LOG_DIRECTORY");
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace strata
