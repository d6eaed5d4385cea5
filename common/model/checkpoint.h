// The tensors of a Hugging Face model directory: model.safetensors, or the shards that
// model.safetensors.index.json lists. Files are memory-mapped; tensors point into the maps.
#ifndef STRATA_COMMON_MODEL_CHECKPOINT_H_
#define STRATA_COMMON_MODEL_CHECKPOINT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors.h"
#include "common/tensor/dtype.h"

namespace strata {

// A float tensor inside a mapped checkpoint file; valid while the Checkpoint lives.
struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
};

// The safetensors files of the model in `dir`, in load order: the shards that
// model.safetensors.index.json names (in the order first named) or model.safetensors.
struct CheckpointFiles {
  bool indexed = false;            // from the index
  std::vector<std::string> names;  // file names inside `dir`
  // The index's weight_map as (tensor, file name) pairs; empty without an index.
  std::vector<std::pair<std::string, std::string>> weight_map;
};
absl::StatusOr<CheckpointFiles> ListCheckpointFiles(const std::string& dir);

class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  bool Has(absl::string_view name) const { return tensors_.contains(name); }
  // The tensor `name`, which must exist, hold a float dtype and have exactly `shape`.
  absl::StatusOr<TensorRef> Get(absl::string_view name, absl::Span<const int64_t> shape) const;
  // Total bytes of all tensors.
  uint64_t total_bytes() const;
  // The path of the file that holds [data, data + bytes) (memory of a tensor of this
  // checkpoint) and the offset of `data` in it; NotFound when no file holds it whole.
  absl::StatusOr<std::pair<std::string, uint64_t>> Locate(const void* data, uint64_t bytes) const;
  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Located {
    int file = 0;
    SafetensorsEntry entry;
  };
  Checkpoint() = default;
  absl::Status AddFile(const std::string& path, absl::string_view display_name);

  std::string dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::string> file_names_;
  absl::flat_hash_map<std::string, Located> tensors_;
};

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_CHECKPOINT_H_
