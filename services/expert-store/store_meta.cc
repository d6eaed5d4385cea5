#include "services/expert-store/store_meta.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/protocol_version.h"
#include "common/util/file_stamp.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "services/expert-store/fast_hash.h"

namespace strata {
namespace {

constexpr uint64_t kMagic = 0x3154454D58545253ull;  // "SRTXMET1" in memory order
constexpr uint32_t kMaxSegments = 4096;

// Followed by num_segments uint64 checksums, the model directory and the serialized layout.
struct MetaHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t generation;
  uint64_t config_checksum;
  uint64_t checkpoint_fingerprint;
  uint64_t layout_bytes;
  uint64_t layout_checksum;
  uint32_t model_dir_bytes;
  uint32_t num_segments;
  uint64_t owner_start_time;
  int32_t owner_pid;
  uint32_t reserved;
};
static_assert(std::is_trivially_copyable_v<MetaHeader> && sizeof(MetaHeader) == 80);

}  // namespace

absl::StatusOr<ModelIdentity> IdentifyModel(const std::string& dir) {
  namespace fs = std::filesystem;
  ModelIdentity id;
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(dir, ec);
  id.dir = ec ? dir : canonical.string();

  ASSIGN_OR_RETURN(const std::string bytes,
                   ReadFileToString((fs::path(dir) / "config.json").string()));
  id.config_checksum = FastHash64(bytes.data(), bytes.size());

  // The checkpoint's weights are not read; a rewritten file changes its size or mtime.
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".safetensors.index.json")) {
      files.push_back(name);
    }
  }
  std::sort(files.begin(), files.end());
  std::string fingerprint;
  for (const std::string& name : files) {
    const absl::StatusOr<FileStamp> stamp = StampFile((fs::path(dir) / name).string());
    if (!stamp.ok()) continue;
    // Seconds "." nanoseconds, as the text was before FileStamp: existing stores keep their
    // fingerprints.
    absl::StrAppend(&fingerprint, name, " ", stamp->bytes, " ", stamp->mtime_ns / 1000000000, ".",
                    stamp->mtime_ns % 1000000000, "\n");
  }
  id.checkpoint_fingerprint = FastHash64(fingerprint.data(), fingerprint.size());
  return id;
}

std::string EncodeMeta(const StoreMeta& meta) {
  const std::string layout = meta.layout.SerializeAsString();
  MetaHeader h{};
  h.magic = kMagic;
  h.version = kClusterProtocolVersion;
  h.header_bytes = sizeof(MetaHeader);
  h.generation = meta.generation;
  h.config_checksum = meta.model.config_checksum;
  h.checkpoint_fingerprint = meta.model.checkpoint_fingerprint;
  h.layout_bytes = layout.size();
  h.layout_checksum = FastHash64(layout.data(), layout.size());
  h.model_dir_bytes = static_cast<uint32_t>(meta.model.dir.size());
  h.num_segments = static_cast<uint32_t>(meta.segment_checksums.size());
  h.owner_start_time = meta.owner_start_time;
  h.owner_pid = meta.owner_pid;
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(reinterpret_cast<const char*>(meta.segment_checksums.data()),
             meta.segment_checksums.size() * sizeof(uint64_t));
  out += meta.model.dir;
  out += layout;
  return out;
}

void CommitMeta(const std::string& encoded, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  std::memcpy(out + sizeof(uint64_t), encoded.data() + sizeof(uint64_t),
              encoded.size() - sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(out, encoded.data(), sizeof(uint64_t));
}

absl::StatusOr<StoreMeta> DecodeMeta(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  MetaHeader h;
  if (size < sizeof(h)) return absl::DataLossError("the meta segment is too small");
  std::memcpy(&h, bytes, sizeof(h));
  if (h.magic != kMagic) return absl::DataLossError("the meta segment is incomplete (no magic)");
  if (h.version != kClusterProtocolVersion || h.header_bytes != sizeof(h)) {
    return absl::DataLossError(absl::StrCat("the store has format version ", h.version, ", not ",
                                            kClusterProtocolVersion));
  }
  if (h.num_segments == 0 || h.num_segments > kMaxSegments) {
    return absl::DataLossError(absl::StrCat("the meta lists ", h.num_segments, " segments"));
  }
  const uint64_t checksums_at = sizeof(h);
  const uint64_t dir_at = checksums_at + uint64_t{h.num_segments} * sizeof(uint64_t);
  const uint64_t layout_at = dir_at + h.model_dir_bytes;
  if (h.layout_bytes > size || layout_at > size - h.layout_bytes) {
    return absl::DataLossError("the meta runs past the end of its segment");
  }
  const uint8_t* layout = bytes + layout_at;
  if (FastHash64(layout, h.layout_bytes) != h.layout_checksum) {
    return absl::DataLossError("the layout's checksum does not match");
  }
  StoreMeta meta;
  if (!meta.layout.ParseFromArray(layout, static_cast<int>(h.layout_bytes))) {
    return absl::DataLossError("the layout does not parse");
  }
  if (meta.layout.generation() != h.generation ||
      meta.layout.segments_size() != static_cast<int>(h.num_segments)) {
    return absl::DataLossError("the layout does not agree with the meta header");
  }
  meta.generation = h.generation;
  meta.model.dir.assign(reinterpret_cast<const char*>(bytes + dir_at), h.model_dir_bytes);
  meta.model.config_checksum = h.config_checksum;
  meta.model.checkpoint_fingerprint = h.checkpoint_fingerprint;
  meta.segment_checksums.resize(h.num_segments);
  std::memcpy(meta.segment_checksums.data(), bytes + checksums_at,
              h.num_segments * sizeof(uint64_t));
  meta.owner_pid = h.owner_pid;
  meta.owner_start_time = h.owner_start_time;
  return meta;
}

void SetMetaOwner(void* meta, pid_t pid, uint64_t start_time) {
  auto* bytes = static_cast<uint8_t*>(meta);
  const int32_t owner = pid;
  std::memcpy(bytes + offsetof(MetaHeader, owner_start_time), &start_time, sizeof(start_time));
  std::memcpy(bytes + offsetof(MetaHeader, owner_pid), &owner, sizeof(owner));
}

}  // namespace strata
