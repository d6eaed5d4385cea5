// The expert store's meta segment, "<prefix>-experts-meta": what a restarted strata-expert-store
// needs to re-attach to the data segments a killed one left behind, and to check that they still
// hold what it would build.
//
// A separate segment rather than a header in each data segment: the data segments stay plain
// tensor bytes at the offsets the workers map, the serialized layout (hundreds of KiB on a
// large model) has a single home, and the meta is the store's commit record: it is written
// after every data segment is complete, its magic last, so a store killed while being built is
// never adopted.
#ifndef STRATA_SERVICES_EXPERT_STORE_STORE_META_H_
#define STRATA_SERVICES_EXPERT_STORE_STORE_META_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

// Which model a store was built from, without reading its weights.
struct ModelIdentity {
  std::string dir;                      // canonical model directory
  uint64_t config_checksum = 0;         // FastHash64 of config.json
  uint64_t checkpoint_fingerprint = 0;  // names, sizes and mtimes of its safetensors files
};

absl::StatusOr<ModelIdentity> IdentifyModel(const std::string& dir);

struct StoreMeta {
  uint64_t generation = 0;
  ModelIdentity model;
  std::vector<uint64_t> segment_checksums;  // ChunkedChecksum of each layout segment's bytes
  v1::ExpertLayout layout;
  pid_t owner_pid = 0;  // the strata-expert-store that removes the store when it stops
  uint64_t owner_start_time = 0;
};

// The meta segment's bytes.
std::string EncodeMeta(const StoreMeta& meta);

// Copies EncodeMeta's bytes to shared memory, the magic last: a reader sees all or nothing.
void CommitMeta(const std::string& encoded, void* dst);

// Parses a meta segment; DataLoss, saying what is wrong, when it is not a complete meta of
// this format (no magic, another version, sizes past the end, a layout checksum mismatch).
absl::StatusOr<StoreMeta> DecodeMeta(const void* data, size_t size);

// Records a new owner in a committed meta segment (after a re-attach).
void SetMetaOwner(void* meta, pid_t pid, uint64_t start_time);

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_STORE_STORE_META_H_
