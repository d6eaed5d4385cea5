#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// Ids above this are taken for a broken file rather than allocating a huge id table.
constexpr int64_t kMaxTokenId = (int64_t{1} << 26) - 1;

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

struct QueuedMerge {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
};

// A min-heap on (rank, pos), as tokenizers' Merge ordering.
struct MergeAfter {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& json,
                                                             absl::string_view where) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  ASSIGN_OR_RETURN(const std::string type, GetType(json, where));
  if (type != "BPE") return ConfigError(where, absl::StrCat("type must be BPE, got ", type));

  if (const Json* dropout = FindField(json, "dropout"); dropout != nullptr) {
    if (!dropout->is_number()) return ConfigError(FieldPath(where, "dropout"), "must be a number");
    const double p = dropout->get<double>();
    if (p < 0.0 || p > 1.0) return ConfigError(FieldPath(where, "dropout"), "must be in [0, 1]");
    if (p > 0.0) {
      return ConfigError(FieldPath(where, "dropout"),
                         "BPE dropout (random merges, a training option) is not supported");
    }
  }
  ASSIGN_OR_RETURN(model->unk_token_, GetOptionalString(json, "unk_token", where));
  ASSIGN_OR_RETURN(std::optional<std::string> prefix,
                   GetOptionalString(json, "continuing_subword_prefix", where));
  model->continuing_subword_prefix_ = prefix.value_or("");
  ASSIGN_OR_RETURN(std::optional<std::string> suffix,
                   GetOptionalString(json, "end_of_word_suffix", where));
  model->end_of_word_suffix_ = suffix.value_or("");
  ASSIGN_OR_RETURN(model->fuse_unk_, GetBool(json, "fuse_unk", false, where));
  ASSIGN_OR_RETURN(model->byte_fallback_, GetBool(json, "byte_fallback", false, where));
  ASSIGN_OR_RETURN(model->ignore_merges_, GetBool(json, "ignore_merges", false, where));

  const Json* vocab = FindField(json, "vocab");
  const std::string vocab_path = FieldPath(where, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return ConfigError(vocab_path, "must be an object of token -> id");
  }
  model->vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      return ConfigError(vocab_path, absl::StrCat("the id of \"", token,
                                                  "\" must be an integer "
                                                  "in [0, ",
                                                  kMaxTokenId, "]"));
    }
    if (!IsValidUtf8(token)) return ConfigError(vocab_path, "a token is not valid UTF-8");
    model->vocab_[token] = static_cast<int32_t>(id.get<int64_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  model->id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : model->vocab_) {
    if (!model->id_to_token_[id].has_value()) model->id_to_token_[id] = token;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = model->vocab_.find(absl::StrFormat("<0x%02X>", b));
    model->byte_ids_[b] = it == model->vocab_.end() ? -1 : it->second;
  }

  ASSIGN_OR_RETURN(const Json* merges, GetArray(json, "merges", where));
  const std::string merges_path = FieldPath(where, "merges");
  model->merges_.reserve(merges->size());
  uint32_t rank = 0;
  const size_t prefix_len = model->continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string a, b;
    if (m.is_string()) {  // legacy "a b"
      const std::string line = m.get<std::string>();
      if (absl::StartsWith(line, "#version")) continue;
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) {
        return ConfigError(IndexPath(merges_path, i),
                           absl::StrCat("\"", line, "\" is not \"a b\""));
      }
      a = std::move(parts[0]);
      b = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return ConfigError(IndexPath(merges_path, i), "must be \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = model->vocab_.find(a);
    auto ib = model->vocab_.find(b);
    if (ia == model->vocab_.end() || ib == model->vocab_.end() || b.size() < prefix_len) {
      return ConfigError(IndexPath(merges_path, i), absl::StrCat("merge \"", a, "\" + \"", b,
                                                                 "\" uses a token that is not "
                                                                 "in the vocabulary"));
    }
    auto inew = model->vocab_.find(absl::StrCat(a, absl::string_view(b).substr(prefix_len)));
    if (inew == model->vocab_.end()) {
      return ConfigError(
          IndexPath(merges_path, i),
          absl::StrCat("the result of merge \"", a, "\" + \"", b, "\" is not in the vocabulary"));
    }
    // Like tokenizers' HashMap collect, a repeated pair takes the later rank.
    model->merges_[PairKey(ia->second, ib->second)] = Merge{rank, inew->second};
    ++rank;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !id_to_token_[id].has_value()) return nullptr;
  return &*id_to_token_[id];
}

absl::Status BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> word_ids;
  RETURN_IF_ERROR(MergeWord(word, &word_ids));
  ids->insert(ids->end(), word_ids.begin(), word_ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::move(word_ids));
  }
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(absl::string_view word, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, false});
  };
  int32_t pending_unk = -1;  // the id of an unknown run waiting to be added (fuse_unk)
  std::string buffer;
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = Utf8CharLength(static_cast<unsigned char>(word[pos]));
    const bool is_first = pos == 0;
    const bool is_last = pos + length >= word.size();
    absl::string_view s = word.substr(pos, length);
    pos += length;
    if ((!is_first && !continuing_subword_prefix_.empty()) ||
        (is_last && !end_of_word_suffix_.empty())) {
      buffer.clear();
      if (!is_first) buffer.append(continuing_subword_prefix_);
      buffer.append(s.data(), s.size());
      if (is_last) buffer.append(end_of_word_suffix_);
      s = buffer;
    }
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char c : s) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {
        // As in tokenizers, a pending unknown run is not flushed before the byte tokens.
        for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_token_.has_value()) {
      if (pending_unk >= 0 && fuse_unk_) continue;  // extends the fused unknown run
      if (pending_unk >= 0) add(pending_unk);
      auto unk = vocab_.find(*unk_token_);
      if (unk == vocab_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("unk_token \"", *unk_token_, "\" is not in the vocabulary"));
      }
      pending_unk = unk->second;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, MergeAfter> queue;
  auto find_merge = [this](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next == -1) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // a stale entry
    left.id = top.new_id;
    left.next = right.next;
    symbols[right_pos].removed = true;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push({m->rank, top.pos, m->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) ids->push_back(s.id);
  }
  return absl::OkStatus();
}

}  // namespace tokenizer_internal
}  // namespace strata
