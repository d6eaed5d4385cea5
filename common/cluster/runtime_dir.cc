#include "common/cluster/runtime_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cluster/secure_random.h"
#include "common/shm/process_liveness.h"
#include "common/shm/shared_segment.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Whether `path` is a directory of this user that no one else may enter, on its descriptor.
absl::Status CheckPrivateDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "runtime directory ", path, ": ", std::strerror(errno),
        " (it must be a directory, not a link; set $STRATA_RUNTIME_DIR to use another)"));
  }
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  ::close(fd);
  if (!stated || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "runtime directory %s belongs to uid %d with mode %04o; it must be this user's (uid %d) "
        "with mode 0700 (another user may have made it: remove it, or set $STRATA_RUNTIME_DIR)",
        path, st.st_uid, st.st_mode & 07777, ::geteuid()));
  }
  return absl::OkStatus();
}

// Whether no one but this user and root can rename or replace `path`, a directory to be made in
// `parent`: `parent` and each directory above its real path is owned by root or this user, and
// one that others may write to has the sticky bit (as /tmp has). A directory of ours inside
// another user's could be moved away and replaced by theirs, sockets and all.
absl::Status CheckAncestors(const std::string& path, const std::string& parent) {
  char real[PATH_MAX];
  if (::realpath(parent.c_str(), real) == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("runtime directory ", path, ": ", parent, ": ", std::strerror(errno)));
  }
  std::string dir = absl::StrCat(real, "/");
  while (dir.size() > 1) {
    dir = dir.substr(0, std::max<size_t>(dir.rfind('/'), 1));
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot check ", dir, ": ", std::strerror(errno)));
    }
    const bool trusted_owner = st.st_uid == 0 || st.st_uid == ::geteuid();
    const bool others_write = (st.st_mode & 022) != 0;
    if (!trusted_owner || (others_write && (st.st_mode & S_ISVTX) == 0)) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "runtime directory %s is inside %s (uid %d, mode %04o), which another user could "
          "rename or replace; set $STRATA_RUNTIME_DIR to a directory only this user and root "
          "control",
          path, dir, st.st_uid, st.st_mode & 07777));
    }
  }
  return absl::OkStatus();
}

// "<pid>-<start time>-<hex>" -> pid and start time; false for any other name.
bool ParseClusterId(absl::string_view id, pid_t* pid, uint64_t* start_time) {
  const std::vector<absl::string_view> parts = absl::StrSplit(id, '-');
  int64_t p = 0;
  if (parts.size() != 3 || parts[2].size() != 16 || !absl::SimpleAtoi(parts[0], &p) ||
      !absl::SimpleAtoi(parts[1], start_time) || p <= 0) {
    return false;
  }
  *pid = static_cast<pid_t>(p);
  return true;
}

// The cluster id at the start of a shared-memory name "strata-<id>-...", or empty.
std::string IdOfSegment(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "strata-")) return "";
  const std::vector<absl::string_view> parts = absl::StrSplit(name, absl::MaxSplits('-', 3));
  if (parts.size() < 3) return "";
  return absl::StrCat(parts[0], "-", parts[1], "-", parts[2]);
}

bool ClusterAlive(const std::string& id) {
  pid_t pid = 0;
  uint64_t start = 0;
  if (!ParseClusterId(id, &pid, &start)) return true;  // not ours to judge
  return ProcessAlive(pid, start);
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

bool LoopbackOrAny(absl::string_view host) {
  return host.empty() || host == "127.0.0.1" || host == "localhost" || host == "0.0.0.0" ||
         host == "::" || host == "[::]" || host == "::1" || host == "[::1]";
}

bool SameClient(const std::string& a, const std::string& b) {
  const size_t ca = a.rfind(':'), cb = b.rfind(':');
  if (ca == std::string::npos || cb == std::string::npos) return a == b;
  if (a.substr(ca) != b.substr(cb)) return false;
  const std::string ha = a.substr(0, ca), hb = b.substr(0, cb);
  return ha == hb || (LoopbackOrAny(ha) && LoopbackOrAny(hb));
}

}  // namespace

absl::StatusOr<std::string> UserRuntimeDir() {
  std::string base = Getenv("STRATA_RUNTIME_DIR");
  if (base.empty() && !Getenv("XDG_RUNTIME_DIR").empty()) {
    base = Getenv("XDG_RUNTIME_DIR") + "/strata";
  }
  // Root's under /run, where no other user can make it first; others' in /tmp, where another
  // user who makes it first is refused (and $STRATA_RUNTIME_DIR is the way out).
  if (base.empty() && ::geteuid() == 0 && ::access("/run", W_OK) == 0) base = "/run/strata";
  if (base.empty()) base = absl::StrCat("/tmp/strata-", ::geteuid());
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const size_t slash = base.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : base.substr(0, slash);
  if (absl::Status s = CheckAncestors(base, parent); !s.ok()) return s;
  if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the runtime directory ", base, ": ", std::strerror(errno)));
  }
  if (absl::Status s = CheckPrivateDir(base); !s.ok()) return s;
  return base;
}

absl::StatusOr<ClusterDir> CreateClusterDir() {
  absl::StatusOr<std::string> base = UserRuntimeDir();
  if (!base.ok()) return base.status();
  absl::StatusOr<std::string> random = RandomHex(8);
  if (!random.ok()) return random.status();
  ClusterDir dir;
  dir.id = absl::StrCat(::getpid(), "-", ProcessStartTime(::getpid()), "-", *random);
  dir.path = absl::StrCat(*base, "/", dir.id);
  if (::mkdir(dir.path.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the cluster directory ", dir.path, ": ", std::strerror(errno)));
  }
  if (absl::Status s = CheckPrivateDir(dir.path); !s.ok()) return s;
  return dir;
}

void RemoveCluster(const ClusterDir& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir.path, ec);  // links are removed, never followed
  for (const std::string& name : SharedSegment::ListOwned(dir.shm_prefix() + "-")) {
    SharedSegment::Remove(name).IgnoreError();
  }
}

std::vector<std::string> SweepDeadClusters() {
  std::vector<std::string> swept;
  absl::StatusOr<std::string> base = UserRuntimeDir();
  if (base.ok()) {
    for (const std::string& id : ListDir(*base)) {
      if (ClusterAlive(id)) continue;
      RemoveCluster(ClusterDir{id, absl::StrCat(*base, "/", id)});
      swept.push_back(id);
    }
  }
  // Segments whose cluster directory is gone already (or was never made here).
  for (const std::string& name : SharedSegment::ListOwned("strata-")) {
    const std::string id = IdOfSegment(name);
    if (id.empty() || ClusterAlive(id)) continue;
    if (SharedSegment::Remove(name).ok() && (swept.empty() || swept.back() != id)) {
      swept.push_back(id);
    }
  }
  return swept;
}

absl::Status WriteClusterInfo(const ClusterDir& dir, const ClusterInfo& info) {
  nlohmann::json json = {
      {"client", info.client}, {"internal", info.internal}, {"http_port", info.http_port}};
  const std::string temp = dir.info_file() + ".new";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << json.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temp));
  }
  if (::rename(temp.c_str(), dir.info_file().c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", dir.info_file()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterInfo> ReadClusterInfo(const std::string& dir_path) {
  std::ifstream in(dir_path + "/cluster.json");
  if (!in) return absl::NotFoundError(absl::StrCat(dir_path, "/cluster.json"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, false);
  if (!json.is_object() || !json.contains("client") || !json["client"].is_string() ||
      !json.contains("internal") || !json["internal"].is_string()) {
    return absl::DataLossError(absl::StrCat(dir_path, "/cluster.json is not a cluster's"));
  }
  ClusterInfo info;
  info.client = json["client"].get<std::string>();
  info.internal = json["internal"].get<std::string>();
  if (json.contains("http_port") && json["http_port"].is_number_integer()) {
    info.http_port = json["http_port"].get<int>();
  }
  return info;
}

absl::StatusOr<std::pair<ClusterDir, ClusterInfo>> FindClusterByClient(const std::string& client) {
  absl::StatusOr<std::string> base = UserRuntimeDir();
  if (!base.ok()) return base.status();
  for (const std::string& id : ListDir(*base)) {
    if (!ClusterAlive(id)) continue;
    ClusterDir dir{id, absl::StrCat(*base, "/", id)};
    absl::StatusOr<ClusterInfo> info = ReadClusterInfo(dir.path);
    if (info.ok() && SameClient(info->client, client)) return std::make_pair(dir, *info);
  }
  return absl::NotFoundError(
      absl::StrCat("no cluster of this user serves ", client, " (looked in ", *base, ")"));
}

}  // namespace strata
