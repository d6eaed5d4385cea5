// A paged key/value cache: fixed-size blocks of token slots handed to sequences on demand,
// so memory is not reserved for a sequence's maximum length up front.
//
// Blocks are shared by reference count. A sequence forked from another (Fork: the samples of
// one prompt) shares its full blocks and copies the last partial one, which both write after.
// With prefix caching, a full block whose keys and values are computed is registered under a
// hash of every token up to its end (its own and its prefix's), so a later sequence with the
// same leading tokens takes the block instead of computing it again; a registered block nobody
// holds stays cached, and is the first taken again (least recently released first) when the
// free blocks run out.
#ifndef STRATA_COMMON_KV_PAGED_KV_CACHE_H_
#define STRATA_COMMON_KV_PAGED_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace strata {

// What the KV cache stores: auto and bf16 keep 16 bits or more (the CPU backend keeps float32,
// a device backend bf16), fp8 keeps E4M3 codes with scales.
enum class KvDtype { kAuto, kBf16, kFp8 };
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
const char* KvDtypeName(KvDtype dtype);

// The KV cache's options as a user sets them (strata-router's and the strata tool's flags,
// `strata up`'s kv_cache keys). Every default is written here only.
struct KvCacheOptions {
  int block_size = 32;  // token slots per block
  // The pool's memory at most, MiB, counted where the blocks live (KvBlockBytes).
  int64_t memory_mb = 1024;
  // kFp8: FP8 E4M3 keys and values with scales; auto and bf16 keep 16 bits or more.
  KvDtype dtype = KvDtype::kAuto;
  // Keep computed full blocks for later sequences with the same leading tokens.
  bool prefix_caching = true;
  // With fp8: a sequence whose context passes this many tokens keeps its keys and values in
  // 16-bit: a longer prompt starts wide, a sequence growing past it is converted (Widen).
  // 0: never.
  int64_t fp16_above_tokens = 2048;
  // With fp8 and no scales set: sequences start wide until the keys and values of this many
  // tokens have been observed (ObserveKvRange); their largest magnitudes then set the scales.
  int64_t calibration_tokens = 512;
  // A router's, with workers on its device: the pool grows into the expert slots they lend as
  // the hot ratio falls, and gives them back as it rises (KvLending).
  bool share_expert_memory = false;
};

// What PagedKvCache::Create builds: the options, and the pool's shape from the model and the
// device.
struct KvPoolOptions {
  KvCacheOptions cache;
  // The most blocks the pool can have (Resize changes it within); the pool's at start unless
  // initial_blocks says fewer. Host storage holds the active blocks only.
  int num_blocks = 0;
  int initial_blocks = 0;  // 0: num_blocks
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Hold the keys and values in host memory. A device backend keeps its own storage and uses
  // this object only for block allocation and block tables.
  bool host_storage = true;
  // Bytes a key or value element takes where the blocks live: float32 on the host, 2 for a
  // device backend's bf16 storage, 1 for FP8. Sizes the pool from a byte budget (KvBlockBytes).
  int element_bytes = 4;
  // The values are the keys (multi-head latent attention: one row per token holds the
  // normalized latent, which is both, then k_pe), so blocks keep no value rows and value()
  // is key(). Not with FP8.
  bool values_in_keys = false;

  // FP8 E4M3 keys and values (element_bytes 1). Host storage: a block is E4M3 codes
  // [k|v][slot][kv_head][head_dim]; a wide sequence's key or value block is bf16
  // [slot][kv_head][head_dim], the same bytes.
  bool fp8() const { return cache.dtype == KvDtype::kFp8; }
};

// Scales of an FP8 cache, [num_layers][num_kv_heads] each: code c stands for c * scale.
struct KvScales {
  std::vector<float> k, v;
};

// The headroom calibration leaves above the largest magnitude observed: later tokens may be
// larger, and E4M3's relative precision does not depend on where in its range a value falls.
inline constexpr float kKvScaleHeadroom = 2.0f;

// A block's data to move where a device backend keeps the blocks (every layer's): a copy of
// block src into dst (compaction), or, when dst_v >= 0, an FP8 block of a sequence turned
// 16-bit: its keys decoded into dst, its values into dst_v (Widen).
struct KvBlockMove {
  int src = 0;
  int dst = 0;
  int dst_v = -1;
};

// What prefix caching found: tokens of the prompts looked up, those found in the cache.
struct PrefixCacheStats {
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  int64_t cached_blocks = 0;  // registered now, held or not
  int64_t evictions = 0;      // registered blocks taken for other data
};

// Bytes one block takes across all layers (keys and values, element_bytes each; keys only when
// values_in_keys).
int64_t KvBlockBytes(const KvPoolOptions& options);

class PagedKvCache {
 public:
  using SequenceId = int64_t;

  // Fails on non-positive sizes.
  static absl::StatusOr<PagedKvCache> Create(const KvPoolOptions& options);

  // Starts an empty sequence (16-bit in an FP8 cache when `wide`).
  SequenceId AddSequence(bool wide = false);
  bool wide(SequenceId seq) const { return wide_.contains(seq); }
  // Whether a sequence of `num_tokens` tokens starts wide: an FP8 cache that has no scales
  // yet, or a context past fp16_above_tokens.
  bool WantsWide(int64_t num_tokens) const;
  // Whether `seq` must turn wide (Widen) before it holds `num_tokens` tokens.
  bool NeedsWiden(SequenceId seq, int64_t num_tokens) const;
  // Converts the sequence's blocks to 16-bit: new blocks are taken (RESOURCE_EXHAUSTED, with
  // nothing changed, when the pool lacks them) and the old ones released. Host storage is
  // converted here; a device backend applies the moves TakeMoves hands it, in their order and
  // in stream order before its next step writes.
  absl::Status Widen(SequenceId seq);

  // Compaction: makes the pool `num_blocks` blocks (1 to the allocated options().num_blocks).
  // Growing adds free blocks. Shrinking first moves every block in use at or past the new end
  // into a free one below it (evicting cached blocks nobody holds there when it must) and
  // drops the cached blocks past it, so that the blocks past the end hold nothing: with the
  // blocks stored block-major (every layer of a block together), one contiguous range of the
  // storage. FAILED_PRECONDITION, with nothing changed, when the blocks in use do not fit.
  // Returns the blocks moved. Host storage is copied here; a device backend copies the moves.
  absl::StatusOr<int64_t> Resize(int num_blocks);
  int active_blocks() const { return active_blocks_; }
  // Blocks in use by sequences now (each shared block once).
  int64_t blocks_in_use() const;

  // The data moves Widen and Resize left for a device backend, in order.
  std::vector<KvBlockMove> TakeMoves();
  bool has_moves() const { return !moves_.empty(); }

  // FP8 scales. Until they are set, the cache is calibrating: backends report the largest
  // key and value magnitudes they write (ObserveKvRange, [num_layers][num_kv_heads] each).
  bool calibrating() const { return options_.fp8() && !scales_ready_; }
  bool scales_ready() const { return scales_ready_; }
  const KvScales& scales() const { return scales_; }
  // Fails unless both have num_layers * num_kv_heads positive finite entries.
  absl::Status SetScales(KvScales scales);
  void ObserveKvRange(absl::Span<const float> k_amax, absl::Span<const float> v_amax,
                      int64_t tokens);
  int64_t observed_tokens() const { return observed_tokens_; }
  // Makes room for `num_tokens` positions [0, num_tokens) of `seq`. RESOURCE_EXHAUSTED, with
  // nothing allocated, when the pool lacks the blocks.
  absl::Status Reserve(SequenceId seq, int64_t num_tokens);
  // Returns the sequence's blocks to the pool (registered ones stay cached).
  void Release(SequenceId seq);
  // A new sequence holding the first `num_tokens` positions of `parent` (reserved), of its
  // width: their full blocks shared, the partial block after them copied into a new one (its
  // positions past `num_tokens` are the new sequence's to write). RESOURCE_EXHAUSTED, with
  // nothing changed, when the pool lacks the blocks to copy. A device backend copies the
  // blocks TakeMoves hands it.
  absl::StatusOr<SequenceId> Fork(SequenceId parent, int64_t num_tokens);

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
  // Blocks of the pool `seq` holds now, and blocks that `num_tokens` positions take (twice as
  // many for a wide sequence).
  int64_t blocks_held(SequenceId seq) const { return static_cast<int64_t>(tables_.at(seq).size()); }
  int64_t BlocksFor(int64_t num_tokens, bool wide = false) const {
    return (num_tokens + options_.cache.block_size - 1) / options_.cache.block_size *
           (wide ? 2 : 1);
  }
  // Token slots in the whole pool.
  int64_t pool_tokens() const { return int64_t{active_blocks_} * options_.cache.block_size; }
  // Blocks a sequence may take: unused ones and cached ones nobody holds.
  int free_blocks() const { return static_cast<int>(free_.size() + idle_cached_.size()); }
  int num_sequences() const { return static_cast<int>(tables_.size()); }
  const KvPoolOptions& options() const { return options_; }
  // A wide sequence's table alternates key and value blocks: [k0, v0, k1, v1, ...].
  const std::vector<int>& block_table(SequenceId seq) const { return tables_.at(seq); }

  // FP8 host storage: where `position` of a sequence (its table and width) keeps its key and
  // value at `layer`: E4M3 codes, or bf16 for a wide sequence.
  struct Fp8Slot {
    uint8_t* key;
    uint8_t* value;
  };
  Fp8Slot fp8_slot(int layer, const std::vector<int>& table, bool wide, int64_t position) {
    const int64_t bs = options_.cache.block_size;
    const int64_t slot = position % bs;
    if (wide) {
      const int64_t b = position / bs * 2;
      return {unit_data(layer, table[b]) + slot * slot_floats_ * 2,
              unit_data(layer, table[b + 1]) + slot * slot_floats_ * 2};
    }
    uint8_t* base = unit_data(layer, table[position / bs]) + slot * slot_floats_;
    return {base, base + bs * slot_floats_};
  }

  // The [num_kv_heads * head_dim] key or value slot of `position` in `seq` at `layer`; the
  // position must be reserved.
  float* key(int layer, SequenceId seq, int64_t position) { return Slot(layer, seq, position, 0); }
  float* value(int layer, SequenceId seq, int64_t position) {
    return Slot(layer, seq, position, 1);
  }
  // The key (kv = 0) or value (kv = 1) slots of one block at `layer`:
  // [block_size][num_kv_heads * head_dim]. Lets attention walk a block table directly. The
  // storage is block-major: [block][layer][k|v][slot][kv_head][head_dim].
  float* block_data(int layer, int block, int kv) {
    const int64_t part = options_.values_in_keys ? 0 : kv;
    return storage_.data() + (int64_t{block} * options_.num_layers + layer) * block_floats_ +
           part * options_.cache.block_size * slot_floats_;
  }

 private:
  explicit PagedKvCache(const KvPoolOptions& options);
  float* Slot(int layer, SequenceId seq, int64_t position, int kv);
  // An unused block, else the least recently released cached one (unregistered).
  int TakeBlock();
  // The hash of the block of `tokens` that follows a prefix hashed `parent`; part is 0 for an
  // FP8 or full-width block, 1 and 2 for a wide sequence's key and value blocks.
  static uint64_t BlockHash(uint64_t parent, absl::Span<const int32_t> tokens, int part);
  // The registered block holding `tokens` (part as above) after `parent`, or -1.
  int FindCached(uint64_t parent, absl::Span<const int32_t> tokens, int part) const;
  // The cached blocks of the leading full blocks of `tokens` for a sequence of that width:
  // per logical block, its 1 or 2 pool blocks.
  std::vector<int> FindPrefix(absl::Span<const int32_t> tokens, bool wide) const;
  uint8_t* unit_data(int layer, int block) {
    return bytes_.data() + (int64_t{block} * options_.num_layers + layer) * block_floats_;
  }
  void ReleaseBlock(int b);
  // Host storage sized to the active blocks.
  void ResizeHostStorage();
  // Host storage: the moves' FP8 blocks into their 16-bit ones, or copies.
  void MoveOnHost(absl::Span<const KvBlockMove> moves);

  struct BlockState {
    int refs = 0;                   // sequences holding it
    bool registered = false;        // in cached_, its tokens in cached_tokens_
    uint64_t hash = 0;              // valid for committed blocks (registered or not)
    uint64_t parent = 0;            // the prefix's hash before it
    std::list<int>::iterator idle;  // in idle_cached_ while registered and unheld
  };

  KvPoolOptions options_;
  int64_t slot_floats_ = 0;     // floats per token slot (kv heads x head dim)
  int64_t block_floats_ = 0;    // floats per block per layer, keys and values
  std::vector<float> storage_;  // [block][layer][k|v][slot][kv_head][head_dim]
  std::vector<uint8_t> bytes_;  // FP8 host storage: [block][layer][block_floats_ bytes]
  absl::flat_hash_set<SequenceId> wide_;
  std::vector<KvBlockMove> moves_;
  int active_blocks_ = 0;
  KvScales scales_;
  bool scales_ready_ = false;
  std::vector<float> k_amax_, v_amax_;
  int64_t observed_tokens_ = 0;
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
