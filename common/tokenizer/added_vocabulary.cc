#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// The character that ends `s` (non-empty, valid UTF-8).
char32_t LastChar(absl::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t length = 0;
  return DecodeUtf8(s, start, &length);
}

// Where the whitespace at the end of `s` starts (regex `\s*$`).
size_t TrailingWhitespaceStart(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t length = 0;
    if (!IsWhitespace(DecodeUtf8(s, start, &length))) break;
    end = start;
  }
  return end;
}

// The length of the whitespace that starts `s` (regex `^\s*`).
size_t LeadingWhitespaceLength(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t length = 0;
    if (!IsWhitespace(DecodeUtf8(s, pos, &length))) break;
    pos += length;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::Insert(absl::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char ch : pattern) {
    const auto c = static_cast<unsigned char>(ch);
    int32_t next = -1;
    for (const auto& [byte, child] : nodes[node].children) {
      if (byte == c) next = child;
    }
    if (next < 0) {
      next = static_cast<int32_t>(nodes.size());
      nodes[node].children.emplace_back(c, next);
      nodes.emplace_back();
    }
    node = next;
  }
  if (nodes[node].token_id < 0) nodes[node].token_id = id;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

int32_t AddedVocabulary::Trie::LongestAt(absl::string_view text, size_t start, size_t* end) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = start; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    int32_t next = -1;
    for (const auto& [byte, child] : nodes[node].children) {
      if (byte == c) next = child;
    }
    if (next < 0) break;
    node = next;
    if (nodes[node].token_id >= 0) {
      best = nodes[node].token_id;
      *end = i + 1;
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::FromJson(
    const Json& json, const Model& model, const Normalizer* normalizer, absl::string_view where) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  if (json.is_null()) return vocab;
  if (!json.is_array()) return ConfigError(where, "must be an array");
  int32_t next_id = static_cast<int32_t>(model.vocab_count());
  for (size_t i = 0; i < json.size(); ++i) {
    const Json& entry = json[i];
    const std::string path = IndexPath(where, i);
    if (!entry.is_object()) return ConfigError(path, "must be an object");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, GetString(entry, "content", path));
    if (!IsValidUtf8(token.content)) return ConfigError(path, "content is not valid UTF-8");
    ASSIGN_OR_RETURN(token.single_word, GetBool(entry, "single_word", false, path));
    ASSIGN_OR_RETURN(token.lstrip, GetBool(entry, "lstrip", false, path));
    ASSIGN_OR_RETURN(token.rstrip, GetBool(entry, "rstrip", false, path));
    ASSIGN_OR_RETURN(token.special, GetBool(entry, "special", false, path));
    ASSIGN_OR_RETURN(token.normalized, GetBool(entry, "normalized", !token.special, path));
    if (token.content.empty()) continue;
    int32_t id;
    if (auto it = vocab->by_content_.find(token.content); it != vocab->by_content_.end()) {
      id = it->second;
    } else if (std::optional<int32_t> model_id = model.TokenToId(token.content)) {
      id = *model_id;
    } else {
      id = next_id++;
    }
    if (token.normalized && normalizer != nullptr) {
      std::string form = token.content;
      RETURN_IF_ERROR(normalizer->Normalize(&form));
      if (form != token.content) {
        vocab->decode_form_[id] = std::move(form);
      } else {
        vocab->decode_form_.erase(id);
      }
    }
    vocab->by_content_[token.content] = id;
    if (token.special) vocab->special_.insert(token.content);
    vocab->by_id_[id] = std::move(token);
    vocab->id_limit_ = std::max(vocab->id_limit_, id + 1);
  }
  vocab->BuildTries();
  return vocab;
}

std::unique_ptr<AddedVocabulary> AddedVocabulary::FromTokens(
    std::vector<std::pair<int32_t, AddedToken>> tokens) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  for (auto& [id, token] : tokens) {
    vocab->by_content_[token.content] = id;
    if (token.special) vocab->special_.insert(token.content);
    vocab->id_limit_ = std::max(vocab->id_limit_, id + 1);
    vocab->by_id_[id] = std::move(token);
  }
  vocab->BuildTries();
  return vocab;
}

void AddedVocabulary::BuildTries() {
  // Insert in id order so that equal patterns resolve the same way every time.
  std::vector<int32_t> ids;
  for (const auto& [id, token] : by_id_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int32_t id : ids) {
    const AddedToken& token = by_id_[id];
    if (token.normalized) {
      auto form = decode_form_.find(id);
      normalized_trie_.Insert(form == decode_form_.end() ? token.content : form->second, id);
    } else {
      raw_trie_.Insert(token.content, id);
    }
  }
}

void AddedVocabulary::Split(absl::string_view text, bool normalized,
                            std::vector<Segment>* out) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // The leftmost-longest match at or after `pos`.
    int32_t id = -1;
    size_t start = pos;
    size_t stop = 0;
    for (; start < text.size(); ++start) {
      if (!trie.first_byte[static_cast<unsigned char>(text[start])]) continue;
      id = trie.LongestAt(text, start, &stop);
      if (id >= 0) break;
    }
    if (id < 0) break;
    pos = stop;
    const AddedToken& token = by_id_.at(id);
    if (token.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastChar(text.substr(0, start)));
      size_t length = 0;
      const bool stop_space = stop == text.size() || !IsWordChar(DecodeUtf8(text, stop, &length));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      start = std::max(TrailingWhitespaceStart(text.substr(0, start)), start_offset);
    }
    if (token.rstrip) stop += LeadingWhitespaceLength(text.substr(stop));
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

const std::string* AddedVocabulary::DecodeForm(int32_t id) const {
  if (auto it = decode_form_.find(id); it != decode_form_.end()) return &it->second;
  if (auto it = by_id_.find(id); it != by_id_.end()) return &it->second.content;
  return nullptr;
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::optional<int32_t> AddedVocabulary::TokenToId(absl::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tokenizer_internal
}  // namespace strata
