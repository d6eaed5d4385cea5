#include "common/kv/paged_kv_cache.h"

#include <algorithm>

#include "absl/hash/hash.h"
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
  if (options.prefix_caching) {
    blocks_.resize(options.num_blocks);
    cached_tokens_.resize(static_cast<size_t>(options.num_blocks) * options.block_size);
  }
}

int PagedKvCache::TakeBlock() {
  if (!free_.empty()) {
    const int b = free_.back();
    free_.pop_back();
    if (options_.prefix_caching) blocks_[b].refs = 1;
    return b;
  }
  const int b = idle_cached_.front();
  idle_cached_.pop_front();
  BlockState& block = blocks_[b];
  cached_.erase(block.hash);
  block = BlockState();
  block.refs = 1;
  --prefix_stats_.cached_blocks;
  ++prefix_stats_.evictions;
  return b;
}

uint64_t PagedKvCache::BlockHash(uint64_t parent, absl::Span<const int32_t> tokens) {
  return absl::HashOf(parent, tokens);
}

int PagedKvCache::FindCached(uint64_t parent, absl::Span<const int32_t> tokens) const {
  const auto it = cached_.find(BlockHash(parent, tokens));
  if (it == cached_.end()) return -1;
  const int b = it->second;
  // A hash names the block's tokens and its prefix's hash; both are confirmed.
  const int32_t* held = cached_tokens_.data() + int64_t{b} * options_.block_size;
  if (blocks_[b].parent != parent || !std::equal(tokens.begin(), tokens.end(), held)) return -1;
  return b;
}

int64_t PagedKvCache::HeldPrefixBlocks(absl::Span<const int32_t> tokens) const {
  if (!options_.prefix_caching || tokens.empty()) return 0;
  const int64_t bs = options_.block_size;
  const int64_t blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  int64_t held = 0;
  uint64_t parent = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    const absl::Span<const int32_t> block = tokens.subspan(i * bs, bs);
    const int b = FindCached(parent, block);
    if (b < 0) break;
    if (blocks_[b].refs > 0) ++held;
    parent = blocks_[b].hash;
  }
  return held;
}

int64_t PagedKvCache::MatchPrefix(SequenceId seq, absl::Span<const int32_t> tokens) {
  if (!options_.prefix_caching || tokens.empty()) return 0;
  std::vector<int>& table = tables_.at(seq);
  if (!table.empty()) return 0;
  const int64_t bs = options_.block_size;
  const int64_t blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  uint64_t parent = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    const int b = FindCached(parent, tokens.subspan(i * bs, bs));
    if (b < 0) break;
    BlockState& block = blocks_[b];
    if (block.refs++ == 0) idle_cached_.erase(block.idle);
    table.push_back(b);
    parent = block.hash;
  }
  committed_blocks_[seq] = static_cast<int64_t>(table.size());
  const int64_t hit = static_cast<int64_t>(table.size()) * bs;
  prefix_stats_.queried_tokens += static_cast<int64_t>(tokens.size());
  prefix_stats_.hit_tokens += hit;
  return hit;
}

void PagedKvCache::CommitPrefix(SequenceId seq, absl::Span<const int32_t> tokens,
                                int64_t computed) {
  if (!options_.prefix_caching) return;
  const std::vector<int>& table = tables_.at(seq);
  const int64_t bs = options_.block_size;
  const int64_t full = std::min<int64_t>(
      {std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) / bs,
       static_cast<int64_t>(table.size())});
  int64_t& committed = committed_blocks_[seq];
  for (int64_t i = committed; i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : blocks_[table[i - 1]].hash;
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    const int b = table[i];
    BlockState& block = blocks_[b];
    block.parent = parent;
    block.hash = BlockHash(parent, block_tokens);
    // A block whose data another registered block already holds stays unregistered (its
    // hash still chains the blocks after it).
    if (!block.registered && cached_.emplace(block.hash, b).second) {
      block.registered = true;
      std::copy(block_tokens.begin(), block_tokens.end(),
                cached_tokens_.begin() + int64_t{b} * bs);
      ++prefix_stats_.cached_blocks;
    }
  }
  committed = std::max(committed, full);
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
  if (missing > free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: ", missing, " more blocks needed for ", num_tokens, " tokens, ",
                     free_blocks(), " free of ", options_.num_blocks));
  }
  for (int64_t i = 0; i < missing; ++i) table.push_back(TakeBlock());
  return absl::OkStatus();
}

void PagedKvCache::Release(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
    if (!options_.prefix_caching) {
      free_.push_back(*b);
      continue;
    }
    BlockState& block = blocks_[*b];
    if (--block.refs > 0) continue;
    if (block.registered) {
      block.idle = idle_cached_.insert(idle_cached_.end(), *b);
    } else {
      block = BlockState();
      free_.push_back(*b);
    }
  }
  tables_.erase(it);
  committed_blocks_.erase(seq);
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
