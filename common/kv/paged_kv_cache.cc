#include "common/kv/paged_kv_cache.h"

#include "absl/strings/str_cat.h"

namespace strata {

int64_t KvBlockBytes(const KvCacheOptions& o) {
  return int64_t{o.num_layers} * 2 * o.block_size * o.num_kv_heads * o.head_dim * o.element_bytes;
}

absl::StatusOr<PagedKvCache> PagedKvCache::Create(const KvCacheOptions& options) {
  if (options.block_size <= 0 || options.num_blocks <= 0 || options.num_layers <= 0 ||
      options.num_kv_heads <= 0 || options.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: block_size (", options.block_size,
                                                   ") and num_blocks (", options.num_blocks,
                                                   ") must be positive"));
  }
  return PagedKvCache(options);
}

PagedKvCache::PagedKvCache(const KvCacheOptions& options) : options_(options) {
  slot_floats_ = int64_t{options.num_kv_heads} * options.head_dim;
  block_floats_ = 2 * options.block_size * slot_floats_;
  if (options.host_storage) {
    storage_.assign(static_cast<size_t>(options.num_layers) * options.num_blocks * block_floats_,
                    0.0f);
  }
  // Hand out low block ids first.
  for (int b = options.num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

PagedKvCache::SequenceId PagedKvCache::AddSequence() {
  const SequenceId id = next_id_++;
  tables_[id];
  return id;
}

absl::Status PagedKvCache::Reserve(SequenceId seq, int64_t num_tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq));
  }
  std::vector<int>& table = it->second;
  const int64_t missing = BlocksFor(num_tokens) - static_cast<int64_t>(table.size());
  if (missing <= 0) return absl::OkStatus();
  if (missing > static_cast<int64_t>(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: ", missing, " more blocks needed for ", num_tokens, " tokens, ",
                     free_.size(), " free of ", options_.num_blocks));
  }
  for (int64_t i = 0; i < missing; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void PagedKvCache::Release(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  tables_.erase(it);
}

int64_t PagedKvCache::capacity(SequenceId seq) const {
  return static_cast<int64_t>(tables_.at(seq).size()) * options_.block_size;
}

float* PagedKvCache::Slot(int layer, SequenceId seq, int64_t position, int kv) {
  const std::vector<int>& table = tables_.at(seq);
  const int block = table[position / options_.block_size];
  const int64_t slot = position % options_.block_size;
  return block_data(layer, block, kv) + slot * slot_floats_;
}

}  // namespace strata
