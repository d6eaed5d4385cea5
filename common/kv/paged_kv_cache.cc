#include "common/kv/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"

namespace strata {

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "auto") return KvDtype::kAuto;
  if (lower == "bf16" || lower == "bfloat16") return KvDtype::kBf16;
  if (lower == "fp8" || lower == "fp8_e4m3") return KvDtype::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("kv cache dtype \"", name, "\" is not one of auto, bf16, fp8"));
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp8:
      return "fp8";
    default:
      return "auto";
  }
}

int64_t KvBlockBytes(const KvPoolOptions& o) {
  const int64_t parts = o.values_in_keys ? 1 : 2;
  return int64_t{o.num_layers} * parts * o.cache.block_size * o.num_kv_heads * o.head_dim *
         o.element_bytes;
}

absl::StatusOr<PagedKvCache> PagedKvCache::Create(const KvPoolOptions& options) {
  if (options.cache.block_size <= 0 || options.num_blocks <= 0 || options.num_layers <= 0 ||
      options.num_kv_heads <= 0 || options.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: block_size (",
                                                   options.cache.block_size, ") and num_blocks (",
                                                   options.num_blocks, ") must be positive"));
  }
  if (options.initial_blocks < 0 || options.initial_blocks > options.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: initial_blocks (",
                                                   options.initial_blocks, ") must be within the ",
                                                   options.num_blocks, " allocated"));
  }
  if (options.cache.fp16_above_tokens < 0 || options.cache.calibration_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: fp16_above_tokens (",
                                                   options.cache.fp16_above_tokens,
                                                   ") must be 0 or more and calibration_tokens (",
                                                   options.cache.calibration_tokens, ") positive"));
  }
  if (options.values_in_keys && options.fp8()) {
    return absl::UnimplementedError(
        "kv cache: FP8 is not supported for multi-head latent attention's latent cache; use "
        "dtype auto or bf16");
  }
  return PagedKvCache(options);
}

PagedKvCache::PagedKvCache(const KvPoolOptions& options) : options_(options) {
  slot_floats_ = int64_t{options.num_kv_heads} * options.head_dim;
  block_floats_ = (options.values_in_keys ? 1 : 2) * options.cache.block_size * slot_floats_;
  active_blocks_ = options.initial_blocks > 0 ? options.initial_blocks : options.num_blocks;
  ResizeHostStorage();
  if (options.fp8()) {
    const size_t heads = static_cast<size_t>(options.num_layers) * options.num_kv_heads;
    k_amax_.assign(heads, 0.0f);
    v_amax_.assign(heads, 0.0f);
  }
  // Hand out low block ids first.
  for (int b = active_blocks_ - 1; b >= 0; --b) free_.push_back(b);
  blocks_.resize(options.num_blocks);
  if (options.cache.prefix_caching) {
    cached_tokens_.resize(static_cast<size_t>(options.num_blocks) * options.cache.block_size);
  }
}

int PagedKvCache::TakeBlock() {
  if (!free_.empty()) {
    const int b = free_.back();
    free_.pop_back();
    blocks_[b].refs = 1;
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

uint64_t PagedKvCache::BlockHash(uint64_t parent, absl::Span<const int32_t> tokens, int part) {
  return part == 0 ? absl::HashOf(parent, tokens) : absl::HashOf(parent, tokens, part);
}

int PagedKvCache::FindCached(uint64_t parent, absl::Span<const int32_t> tokens, int part) const {
  const auto it = cached_.find(BlockHash(parent, tokens, part));
  if (it == cached_.end()) return -1;
  const int b = it->second;
  // A hash names the block's tokens and its prefix's hash; both are confirmed.
  const int32_t* held = cached_tokens_.data() + int64_t{b} * options_.cache.block_size;
  if (blocks_[b].parent != parent || !std::equal(tokens.begin(), tokens.end(), held)) return -1;
  return b;
}

std::vector<int> PagedKvCache::FindPrefix(absl::Span<const int32_t> tokens, bool wide) const {
  std::vector<int> found;
  if (!options_.cache.prefix_caching || tokens.empty()) return found;
  const int64_t bs = options_.cache.block_size;
  const int64_t blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  uint64_t parent = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    const absl::Span<const int32_t> block = tokens.subspan(i * bs, bs);
    const int b = FindCached(parent, block, wide ? 1 : 0);
    if (b < 0) break;
    if (wide) {
      const int v = FindCached(parent, block, 2);
      if (v < 0) break;
      found.push_back(b);
      found.push_back(v);
    } else {
      found.push_back(b);
    }
    parent = blocks_[b].hash;
  }
  return found;
}

int64_t PagedKvCache::HeldPrefixBlocks(absl::Span<const int32_t> tokens) const {
  int64_t held = 0;
  for (int b : FindPrefix(tokens, WantsWide(static_cast<int64_t>(tokens.size())))) {
    if (blocks_[b].refs > 0) ++held;
  }
  return held;
}

int64_t PagedKvCache::MatchPrefix(SequenceId seq, absl::Span<const int32_t> tokens) {
  if (!options_.cache.prefix_caching || tokens.empty()) return 0;
  std::vector<int>& table = tables_.at(seq);
  if (!table.empty()) return 0;
  const bool is_wide = wide(seq);
  for (int b : FindPrefix(tokens, is_wide)) {
    BlockState& block = blocks_[b];
    if (block.refs++ == 0) idle_cached_.erase(block.idle);
    table.push_back(b);
  }
  const int64_t logical = static_cast<int64_t>(table.size()) / (is_wide ? 2 : 1);
  committed_blocks_[seq] = logical;
  const int64_t hit = logical * options_.cache.block_size;
  prefix_stats_.queried_tokens += static_cast<int64_t>(tokens.size());
  prefix_stats_.hit_tokens += hit;
  return hit;
}

void PagedKvCache::CommitPrefix(SequenceId seq, absl::Span<const int32_t> tokens,
                                int64_t computed) {
  if (!options_.cache.prefix_caching) return;
  const std::vector<int>& table = tables_.at(seq);
  const int per = wide(seq) ? 2 : 1;
  const int64_t bs = options_.cache.block_size;
  const int64_t full =
      std::min<int64_t>({std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) / bs,
                         static_cast<int64_t>(table.size()) / per});
  int64_t& committed = committed_blocks_[seq];
  for (int64_t i = committed; i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : blocks_[table[(i - 1) * per]].hash;
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    for (int part = 0; part < per; ++part) {
      const int b = table[i * per + part];
      BlockState& block = blocks_[b];
      block.parent = parent;
      block.hash = BlockHash(parent, block_tokens, per == 1 ? 0 : part + 1);
      // A block whose data another registered block already holds stays unregistered (its
      // hash still chains the blocks after it).
      if (!block.registered && cached_.emplace(block.hash, b).second) {
        block.registered = true;
        std::copy(block_tokens.begin(), block_tokens.end(),
                  cached_tokens_.begin() + int64_t{b} * bs);
        ++prefix_stats_.cached_blocks;
      }
    }
  }
  committed = std::max(committed, full);
}

PagedKvCache::SequenceId PagedKvCache::AddSequence(bool wide) {
  const SequenceId id = next_id_++;
  tables_[id];
  // Until the scales are known nothing can be stored in FP8.
  if (options_.fp8() && (wide || !scales_ready_)) wide_.insert(id);
  return id;
}

bool PagedKvCache::WantsWide(int64_t num_tokens) const {
  if (!options_.fp8()) return false;
  return !scales_ready_ ||
         (options_.cache.fp16_above_tokens > 0 && num_tokens > options_.cache.fp16_above_tokens);
}

bool PagedKvCache::NeedsWiden(SequenceId seq, int64_t num_tokens) const {
  return options_.fp8() && options_.cache.fp16_above_tokens > 0 &&
         num_tokens > options_.cache.fp16_above_tokens && !wide(seq);
}

absl::Status PagedKvCache::Widen(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq));
  }
  if (!options_.fp8() || wide(seq)) return absl::OkStatus();
  std::vector<int>& table = it->second;
  const int64_t need = 2 * static_cast<int64_t>(table.size());
  if (need > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache: ", need, " blocks needed to widen a sequence, ", free_blocks(), " free"));
  }
  // Every new block is taken before an old one is released: a released block may be taken
  // again, and its data is still to be read.
  std::vector<KvBlockMove> moves;
  std::vector<int> wide_table;
  for (int src : table) {
    KvBlockMove move;
    move.src = src;
    move.dst = TakeBlock();
    move.dst_v = TakeBlock();
    moves.push_back(move);
    wide_table.push_back(move.dst);
    wide_table.push_back(move.dst_v);
  }
  if (options_.host_storage) MoveOnHost(moves);
  for (auto b = table.rbegin(); b != table.rend(); ++b) ReleaseBlock(*b);
  table = std::move(wide_table);
  wide_.insert(seq);
  committed_blocks_[seq] = 0;  // registered again under the wide blocks' hashes
  if (!options_.host_storage) moves_.insert(moves_.end(), moves.begin(), moves.end());
  return absl::OkStatus();
}

std::vector<KvBlockMove> PagedKvCache::TakeMoves() {
  std::vector<KvBlockMove> moves;
  moves.swap(moves_);
  return moves;
}

int64_t PagedKvCache::blocks_in_use() const {
  absl::flat_hash_set<int> used;
  for (const auto& [seq, table] : tables_) used.insert(table.begin(), table.end());
  return static_cast<int64_t>(used.size());
}

absl::StatusOr<int64_t> PagedKvCache::Resize(int num_blocks) {
  if (num_blocks < 1 || num_blocks > options_.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", num_blocks,
                                                   " blocks; between 1 and the ",
                                                   options_.num_blocks, " allocated"));
  }
  if (num_blocks >= active_blocks_) {
    // Taken after the free blocks there are (free_ hands out from its back).
    std::vector<int> grown;
    for (int b = num_blocks - 1; b >= active_blocks_; --b) grown.push_back(b);
    free_.insert(free_.begin(), grown.begin(), grown.end());
    active_blocks_ = num_blocks;
    ResizeHostStorage();
    return 0;
  }
  const int64_t in_use = blocks_in_use();
  if (in_use > num_blocks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv cache: ", in_use, " blocks are in use; the pool cannot shrink to ", num_blocks));
  }
  // Cached blocks nobody holds past the end are dropped; below it they may make room.
  auto unregister = [&](int b) {
    BlockState& block = blocks_[b];
    idle_cached_.erase(block.idle);
    cached_.erase(block.hash);
    block = BlockState();
    --prefix_stats_.cached_blocks;
    ++prefix_stats_.evictions;
  };
  if (options_.cache.prefix_caching) {
    std::vector<int> past;
    for (int b : idle_cached_) {
      if (b >= num_blocks) past.push_back(b);
    }
    for (int b : past) unregister(b);
  }
  std::vector<int> free_below;
  for (int b : free_) {
    if (b < num_blocks) free_below.push_back(b);
  }
  // Lowest first from the back.
  std::sort(free_below.begin(), free_below.end(), std::greater<int>());
  absl::flat_hash_map<int, int> moved;  // old block -> new
  std::vector<KvBlockMove> moves;
  for (auto& [seq, table] : tables_) {
    for (int& b : table) {
      if (b < num_blocks) continue;
      if (auto it = moved.find(b); it != moved.end()) {  // a shared block, moved already
        b = it->second;
        continue;
      }
      if (free_below.empty()) {
        // in_use <= num_blocks: an idle cached block below the end is there to take.
        const int victim = idle_cached_.front();
        unregister(victim);
        free_below.push_back(victim);
      }
      const int dst = free_below.back();
      free_below.pop_back();
      BlockState& from = blocks_[b];
      if (from.registered) {
        cached_[from.hash] = dst;
        std::copy_n(cached_tokens_.begin() + int64_t{b} * options_.cache.block_size,
                    options_.cache.block_size,
                    cached_tokens_.begin() + int64_t{dst} * options_.cache.block_size);
      }
      blocks_[dst] = from;
      from = BlockState();
      moves.push_back({b, dst, -1});
      moved[b] = dst;
      b = dst;
    }
  }
  free_ = std::move(free_below);
  active_blocks_ = num_blocks;
  if (options_.host_storage) {
    MoveOnHost(moves);
    ResizeHostStorage();
  } else {
    moves_.insert(moves_.end(), moves.begin(), moves.end());
  }
  return static_cast<int64_t>(moves.size());
}

void PagedKvCache::ResizeHostStorage() {
  if (!options_.host_storage) return;
  const size_t elements = static_cast<size_t>(options_.num_layers) * active_blocks_ * block_floats_;
  // Block-major: the active blocks are the leading elements, kept as they are.
  if (options_.fp8()) {
    bytes_.resize(elements, 0);
    bytes_.shrink_to_fit();
  } else {
    storage_.resize(elements, 0.0f);
    storage_.shrink_to_fit();
  }
}

void PagedKvCache::MoveOnHost(absl::Span<const KvBlockMove> moves) {
  const int64_t bs = options_.cache.block_size;
  const int64_t kv_dim = slot_floats_;
  const int d = options_.head_dim;
  const int64_t span = int64_t{options_.num_layers} * block_floats_;  // a block, every layer
  for (const KvBlockMove& m : moves) {
    if (m.dst_v >= 0) continue;
    if (options_.fp8()) {
      std::copy_n(bytes_.begin() + m.src * span, span, bytes_.begin() + m.dst * span);
    } else {
      std::copy_n(storage_.begin() + m.src * span, span, storage_.begin() + m.dst * span);
    }
  }
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const float* ks = scales_.k.data() + int64_t{layer} * options_.num_kv_heads;
    const float* vs = scales_.v.data() + int64_t{layer} * options_.num_kv_heads;
    for (const KvBlockMove& m : moves) {
      if (m.dst_v < 0) continue;
      const uint8_t* src = unit_data(layer, m.src);
      uint16_t* k = reinterpret_cast<uint16_t*>(unit_data(layer, m.dst));
      uint16_t* v = reinterpret_cast<uint16_t*>(unit_data(layer, m.dst_v));
      for (int64_t i = 0; i < bs * kv_dim; ++i) {
        const int head = static_cast<int>(i % kv_dim) / d;
        k[i] = FloatToBf16(Fp8E4M3ToFloat(src[i]) * ks[head]);
        v[i] = FloatToBf16(Fp8E4M3ToFloat(src[bs * kv_dim + i]) * vs[head]);
      }
    }
  }
}

absl::Status PagedKvCache::SetScales(KvScales scales) {
  const size_t heads = static_cast<size_t>(options_.num_layers) * options_.num_kv_heads;
  if (scales.k.size() != heads || scales.v.size() != heads) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", heads,
                                                   " key and value scales expected, got ",
                                                   scales.k.size(), " and ", scales.v.size()));
  }
  for (const std::vector<float>* s : {&scales.k, &scales.v}) {
    for (float x : *s) {
      if (!(x > 0.0f) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat("kv cache: scale ", x, " is not positive and finite"));
      }
    }
  }
  scales_ = std::move(scales);
  scales_ready_ = true;
  return absl::OkStatus();
}

void PagedKvCache::ObserveKvRange(absl::Span<const float> k_amax, absl::Span<const float> v_amax,
                                  int64_t tokens) {
  if (!calibrating() || k_amax.size() != k_amax_.size() || v_amax.size() != v_amax_.size()) {
    return;
  }
  for (size_t i = 0; i < k_amax_.size(); ++i) {
    k_amax_[i] = std::max(k_amax_[i], k_amax[i]);
    v_amax_[i] = std::max(v_amax_[i], v_amax[i]);
  }
  observed_tokens_ += tokens;
  if (observed_tokens_ < options_.cache.calibration_tokens) return;
  KvScales scales;
  auto scale = [](float amax) {
    // A head that never saw a value (or only zeros) keeps scale 1.
    return amax > 0.0f && std::isfinite(amax) ? amax * kKvScaleHeadroom / kFp8E4M3MaxValue : 1.0f;
  };
  for (size_t i = 0; i < k_amax_.size(); ++i) {
    scales.k.push_back(scale(k_amax_[i]));
    scales.v.push_back(scale(v_amax_[i]));
  }
  (void)SetScales(std::move(scales));  // valid by construction
}

absl::Status PagedKvCache::Reserve(SequenceId seq, int64_t num_tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq));
  }
  std::vector<int>& table = it->second;
  const int64_t missing = BlocksFor(num_tokens, wide(seq)) - static_cast<int64_t>(table.size());
  if (missing <= 0) return absl::OkStatus();
  if (missing > free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: ", missing, " more blocks needed for ", num_tokens, " tokens, ",
                     free_blocks(), " free of ", active_blocks_));
  }
  for (int64_t i = 0; i < missing; ++i) table.push_back(TakeBlock());
  return absl::OkStatus();
}

void PagedKvCache::Release(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) ReleaseBlock(*b);
  tables_.erase(it);
  committed_blocks_.erase(seq);
  wide_.erase(seq);
}

absl::StatusOr<PagedKvCache::SequenceId> PagedKvCache::Fork(SequenceId parent, int64_t num_tokens) {
  auto it = tables_.find(parent);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", parent));
  }
  if (num_tokens < 0 || num_tokens > capacity(parent)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: ", num_tokens, " tokens to fork; the sequence holds ", capacity(parent)));
  }
  const bool is_wide = wide(parent);
  const int per = is_wide ? 2 : 1;
  const int64_t full = num_tokens / options_.cache.block_size;
  const int copies = num_tokens % options_.cache.block_size != 0 ? per : 0;
  if (copies > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache: ", copies, " blocks needed to fork a sequence, ", free_blocks(), " free"));
  }
  const std::vector<int> source = it->second;  // AddSequence may move the tables
  const SequenceId child = AddSequence(is_wide);
  std::vector<int>& table = tables_[child];
  for (int64_t i = 0; i < full * per; ++i) {
    ++blocks_[source[i]].refs;
    table.push_back(source[i]);
  }
  std::vector<KvBlockMove> moves;
  for (int part = 0; part < copies; ++part) {
    const int dst = TakeBlock();
    moves.push_back({source[full * per + part], dst, -1});
    table.push_back(dst);
  }
  committed_blocks_[child] = std::min(committed_blocks_[parent], full);
  if (options_.host_storage) {
    MoveOnHost(moves);
  } else {
    moves_.insert(moves_.end(), moves.begin(), moves.end());
  }
  return child;
}

void PagedKvCache::ReleaseBlock(int b) {
  BlockState& block = blocks_[b];
  if (--block.refs > 0) return;
  if (block.registered) {
    block.idle = idle_cached_.insert(idle_cached_.end(), b);
  } else {
    block = BlockState();
    free_.push_back(b);
  }
}

int64_t PagedKvCache::capacity(SequenceId seq) const {
  return static_cast<int64_t>(tables_.at(seq).size()) / (wide(seq) ? 2 : 1) *
         options_.cache.block_size;
}

float* PagedKvCache::Slot(int layer, SequenceId seq, int64_t position, int kv) {
  const std::vector<int>& table = tables_.at(seq);
  const int block = table[position / options_.cache.block_size];
  const int64_t slot = position % options_.cache.block_size;
  return block_data(layer, block, kv) + slot * slot_floats_;
}

}  // namespace strata
