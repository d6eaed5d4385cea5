// A paged key/value cache: fixed-size blocks of token slots handed to sequences on demand,
// so memory is not reserved for a sequence's maximum length up front.
//
// With prefix caching, a full block whose keys and values are computed is registered under a
// hash of every token up to its end (its own and its prefix's), so a later sequence with the
// same leading tokens takes the block instead of computing it again. Blocks are shared by
// reference count; a registered block nobody holds stays cached, and is the first taken again
// (least recently released first) when the free blocks run out.
#ifndef STRATA_COMMON_KV_PAGED_KV_CACHE_H_
#define STRATA_COMMON_KV_PAGED_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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
  // Keep computed full blocks for later sequences with the same leading tokens.
  bool prefix_caching = false;
};

// What prefix caching found: tokens of the prompts looked up, those found in the cache.
struct PrefixCacheStats {
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  int64_t cached_blocks = 0;  // registered now, held or not
  int64_t evictions = 0;      // registered blocks taken for other data
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
  // Returns the sequence's blocks to the pool (registered ones stay cached).
  void Release(SequenceId seq);

  // Prefix caching (a no-op returning 0 when it is off). Gives an empty `seq` the cached blocks
  // that hold the longest run of leading full blocks of `tokens`, leaving at least the last
  // token to compute (its logits are wanted); returns the tokens those blocks hold.
  int64_t MatchPrefix(SequenceId seq, absl::Span<const int32_t> tokens);
  // Of the blocks MatchPrefix would give, those some sequence holds now: they cost a new
  // sequence no free block.
  int64_t HeldPrefixBlocks(absl::Span<const int32_t> tokens) const;
  // Registers the full blocks of `seq` whose keys and values are computed (`tokens` are the
  // sequence's, `computed` how many lead it in the cache).
  void CommitPrefix(SequenceId seq, absl::Span<const int32_t> tokens, int64_t computed);
  const PrefixCacheStats& prefix_stats() const { return prefix_stats_; }

  int64_t capacity(SequenceId seq) const;
  // Blocks `seq` holds now, and blocks that `num_tokens` positions take.
  int64_t blocks_held(SequenceId seq) const { return static_cast<int64_t>(tables_.at(seq).size()); }
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + options_.block_size - 1) / options_.block_size;
  }
  // Token slots in the whole pool.
  int64_t pool_tokens() const { return int64_t{options_.num_blocks} * options_.block_size; }
  // Blocks a sequence may take: unused ones and cached ones nobody holds.
  int free_blocks() const { return static_cast<int>(free_.size() + idle_cached_.size()); }
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
  // An unused block, else the least recently released cached one (unregistered).
  int TakeBlock();
  // The hash of the block of `tokens` that follows a prefix hashed `parent`.
  static uint64_t BlockHash(uint64_t parent, absl::Span<const int32_t> tokens);
  // The registered block holding `tokens` after `parent`, or -1.
  int FindCached(uint64_t parent, absl::Span<const int32_t> tokens) const;

  struct BlockState {
    int refs = 0;
    bool registered = false;  // in cached_, its tokens in cached_tokens_
    uint64_t hash = 0;        // valid for committed blocks (registered or not)
    uint64_t parent = 0;      // the prefix's hash before it
    std::list<int>::iterator idle;  // in idle_cached_ while registered and unheld
  };

  KvCacheOptions options_;
  int64_t slot_floats_ = 0;     // floats per token slot (kv heads x head dim)
  int64_t block_floats_ = 0;    // floats per block per layer, keys and values
  std::vector<float> storage_;  // [layer][block][k|v][slot][kv_head][head_dim]
  std::vector<int> free_;
  absl::flat_hash_map<SequenceId, std::vector<int>> tables_;
  absl::flat_hash_map<SequenceId, int64_t> committed_blocks_;  // leading blocks hashed
  std::vector<BlockState> blocks_;
  std::vector<int32_t> cached_tokens_;  // [block][block_size]: confirms a hash's match
  absl::flat_hash_map<uint64_t, int> cached_;
  std::list<int> idle_cached_;  // registered and unheld, least recently released first
  PrefixCacheStats prefix_stats_;
  SequenceId next_id_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_KV_PAGED_KV_CACHE_H_
