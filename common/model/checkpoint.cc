#include "common/model/checkpoint.h"

#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Shard names come from the index: keep them inside the model directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status Checkpoint::AddFile(const std::string& path, absl::string_view display_name) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(std::vector<SafetensorsEntry> entries,
                   ParseSafetensors(file->bytes(), display_name));
  const int index = static_cast<int>(files_.size());
  for (auto& entry : entries) {
    if (tensors_.contains(entry.name)) {
      return absl::InvalidArgumentError(absl::StrCat(display_name, ": tensor '", entry.name,
                                                     "' also appears in ",
                                                     file_names_[tensors_[entry.name].file]));
    }
    std::string name = entry.name;
    tensors_.emplace(std::move(name), Located{index, std::move(entry)});
  }
  files_.push_back(std::move(file));
  file_names_.emplace_back(display_name);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointFiles> ListCheckpointFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  CheckpointFiles files;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    files.indexed = true;
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path.string()));
    nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not a JSON object"));
    }
    auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": missing \"weight_map\" object"));
    }
    absl::flat_hash_set<std::string> seen;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor '", tensor,
                                                       "' maps to an invalid shard name"));
      }
      files.weight_map.emplace_back(tensor, shard.get<std::string>());
      if (seen.insert(shard.get<std::string>()).second) {
        files.names.push_back(shard.get<std::string>());
      }
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors or model.safetensors.index.json in the model directory"));
  }
  return files;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->dir_ = dir;
  ASSIGN_OR_RETURN(const CheckpointFiles files, ListCheckpointFiles(dir));
  for (const std::string& name : files.names) {
    RETURN_IF_ERROR(checkpoint->AddFile((fs::path(dir) / name).string(), name));
  }
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  for (const auto& [tensor, shard] : files.weight_map) {
    auto it = checkpoint->tensors_.find(tensor);
    if (it == checkpoint->tensors_.end() || checkpoint->file_names_[it->second.file] != shard) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor,
                                                     "' is listed in shard ", shard,
                                                     " but that shard does not hold it"));
    }
  }
  return checkpoint;
}

absl::StatusOr<std::pair<std::string, uint64_t>> Checkpoint::Locate(const void* data,
                                                                    uint64_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(data);
  for (const auto& file : files_) {
    const absl::Span<const uint8_t> all = file->bytes();
    // Compared as addresses: the span is one mapping.
    const auto begin = reinterpret_cast<uintptr_t>(all.data());
    const auto at = reinterpret_cast<uintptr_t>(p);
    if (at >= begin && at - begin <= all.size() && bytes <= all.size() - (at - begin)) {
      return std::make_pair(file->path(), static_cast<uint64_t>(at - begin));
    }
  }
  return absl::NotFoundError(absl::StrCat(dir_, ": memory not in any checkpoint file"));
}

absl::StatusOr<TensorRef> Checkpoint::Get(absl::string_view name,
                                          absl::Span<const int64_t> shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": missing tensor '", name, "'"));
  }
  const Located& located = it->second;
  const std::string& file_name = file_names_[located.file];
  auto dtype = ParseDType(located.entry.dtype);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": tensor '", name, "': ", dtype.status().message()));
  }
  if (!std::equal(shape.begin(), shape.end(), located.entry.shape.begin(),
                  located.entry.shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": tensor '", name,
                                                   "': expected shape ", ShapeString(shape),
                                                   ", found ", ShapeString(located.entry.shape)));
  }
  TensorRef ref;
  ref.name = std::string(name);
  ref.dtype = *dtype;
  ref.shape = located.entry.shape;
  ref.data = files_[located.file]->bytes().data() + located.entry.begin;
  if (reinterpret_cast<uintptr_t>(ref.data) % DTypeSize(ref.dtype) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": tensor '", name, "': data is not aligned to its element size"));
  }
  return ref;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, located] : tensors_) total += located.entry.end - located.entry.begin;
  return total;
}

}  // namespace strata
