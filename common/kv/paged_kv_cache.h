// A paged key/value cache: fixed-size blocks of token slots handed to sequences on demand,
// so memory is not reserved for a sequence's maximum length up front.
#ifndef STRATA_COMMON_KV_PAGED_KV_CACHE_H_
#define STRATA_COMMON_KV_PAGED_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace strata {

struct KvCacheOptions {
  int block_size = 32;  // token slots per block
  int num_blocks = 0;   // blocks in the pool, shared by all sequences
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Hold the keys and values in host memory. A device backend keeps its own storage and uses
  // this object only for block allocation and block tables.
  bool host_storage = true;
  // Bytes a key or value element takes where the blocks live: float32 on the host, 2 for a
  // device backend's bf16 storage. Sizes the pool from a byte budget (KvBlockBytes).
  int element_bytes = 4;
};

// Bytes one block takes across all layers (keys and values, element_bytes each).
int64_t KvBlockBytes(const KvCacheOptions& options);

class PagedKvCache {
 public:
  using SequenceId = int64_t;

  // Fails on non-positive sizes.
  static absl::StatusOr<PagedKvCache> Create(const KvCacheOptions& options);

  // Starts an empty sequence.
  SequenceId AddSequence();
  // Makes room for `num_tokens` positions [0, num_tokens) of `seq`. RESOURCE_EXHAUSTED, with
  // nothing allocated, when the pool lacks the blocks.
  absl::Status Reserve(SequenceId seq, int64_t num_tokens);
  // Returns the sequence's blocks to the pool.
  void Release(SequenceId seq);

  int64_t capacity(SequenceId seq) const;
  // Blocks `seq` holds now, and blocks that `num_tokens` positions take.
  int64_t blocks_held(SequenceId seq) const { return static_cast<int64_t>(tables_.at(seq).size()); }
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + options_.block_size - 1) / options_.block_size;
  }
  // Token slots in the whole pool.
  int64_t pool_tokens() const { return int64_t{options_.num_blocks} * options_.block_size; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int num_sequences() const { return static_cast<int>(tables_.size()); }
  const KvCacheOptions& options() const { return options_; }
  const std::vector<int>& block_table(SequenceId seq) const { return tables_.at(seq); }

  // The [num_kv_heads * head_dim] key or value slot of `position` in `seq` at `layer`; the
  // position must be reserved.
  float* key(int layer, SequenceId seq, int64_t position) { return Slot(layer, seq, position, 0); }
  float* value(int layer, SequenceId seq, int64_t position) {
    return Slot(layer, seq, position, 1);
  }
  // The key (kv = 0) or value (kv = 1) slots of one block at `layer`:
  // [block_size][num_kv_heads * head_dim]. Lets attention walk a block table directly.
  float* block_data(int layer, int block, int kv) {
    return storage_.data() + (int64_t{layer} * options_.num_blocks + block) * block_floats_ +
           int64_t{kv} * options_.block_size * slot_floats_;
  }

 private:
  explicit PagedKvCache(const KvCacheOptions& options);
  float* Slot(int layer, SequenceId seq, int64_t position, int kv);

  KvCacheOptions options_;
  int64_t slot_floats_ = 0;     // floats per token slot (kv heads x head dim)
  int64_t block_floats_ = 0;    // floats per block per layer, keys and values
  std::vector<float> storage_;  // [layer][block][k|v][slot][kv_head][head_dim]
  std::vector<int> free_;
  absl::flat_hash_map<SequenceId, std::vector<int>> tables_;
  SequenceId next_id_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_KV_PAGED_KV_CACHE_H_
