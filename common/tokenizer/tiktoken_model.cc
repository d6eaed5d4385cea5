#include "common/tokenizer/tiktoken_model.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {

const char kKimiPattern[] =
    R"([\p{Han}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|)"
    R"(\s+(?!\S)|)"
    R"(\s+)";

namespace {

// Ranks above this are taken for a broken file rather than allocating a huge table.
constexpr int64_t kMaxRank = (int64_t{1} << 26) - 1;
// tokenization_kimi.py's limits, in characters (code points).
constexpr size_t kMaxEncodeChars = 400'000;
constexpr size_t kMaxRunChars = 25'000;

// Standard base64 with padding (what tiktoken files hold); false for anything else.
bool DecodeBase64(absl::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    int value;
    if (c >= 'A' && c <= 'Z') {
      value = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      value = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      value = c - '0' + 52;
    } else if (c == '+' || c == '/') {
      value = c == '+' ? 62 : 63;
    } else if (c == '=' && i + 2 >= in.size()) {
      ++padding;
      continue;
    } else {
      return false;
    }
    if (padding > 0) return false;  // data after "="
    acc = (acc << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out->size() == in.size() / 4 * 3 - padding;
}

// A rank: decimal digits only.
bool ParseRank(absl::string_view text, int64_t* rank) {
  if (text.empty() || text.size() > 9) return false;
  *rank = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    *rank = *rank * 10 + (c - '0');
  }
  return true;
}

// Python's str.isspace: General_Category Zs or Bidi_Class WS, B or S.
bool IsPythonSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

struct QueuedPair {
  int32_t rank;
  uint32_t start;  // the pair covers bytes [start, end)
  uint32_t end;
};

// A min-heap on (rank, start): tiktoken merges the lowest rank, the leftmost of equal ones.
struct PairAfter {
  bool operator()(const QueuedPair& a, const QueuedPair& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.start > b.start;
  }
};

class MatchesPreTokenizer : public PreTokenizer {
 public:
  explicit MatchesPreTokenizer(std::unique_ptr<Regex> regex) : regex_(std::move(regex)) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    std::vector<ByteRange> matches;
    for (const PreToken& piece : *pieces) {
      matches.clear();
      RETURN_IF_ERROR(regex_->FindAll(piece.text, &matches));
      for (const ByteRange& m : matches) {
        if (m.end > m.start) out.push_back({piece.text.substr(m.start, m.end - m.start), false});
      }
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> regex_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TiktokenModel>> TiktokenModel::FromText(absl::string_view text,
                                                                       absl::string_view source) {
  std::unique_ptr<TiktokenModel> model(new TiktokenModel());
  std::vector<std::optional<std::string>> by_rank;
  std::vector<int> rank_line;  // the line that gave each rank, for duplicate errors
  std::string bytes;
  // Ranks 0..N-1 of N tokens, one a line: a rank past the line count is wrong before any
  // table is sized for it (a corrupt line would otherwise size it for 2^26 tokens).
  const int64_t max_rank =
      std::min<int64_t>(kMaxRank, static_cast<int64_t>(std::count(text.begin(), text.end(), '\n')));
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::string where = absl::StrCat(source, ": line ", line_number);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected \"<base64 token> <rank>\", got \"", line, "\""));
    }
    if (!DecodeBase64(fields[0], &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", fields[0], "\" is not valid base64"));
    }
    int64_t rank = 0;
    if (!ParseRank(fields[1], &rank) || rank > max_rank) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the rank \"", fields[1],
                                                     "\" is not an integer in [0, ", max_rank,
                                                     "] (a rank per line, from 0)"));
    }
    if (static_cast<size_t>(rank) >= by_rank.size()) {
      by_rank.resize(rank + 1);
      rank_line.resize(rank + 1, 0);
    }
    if (by_rank[rank].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": rank ", rank, " is also the rank of line ", rank_line[rank]));
    }
    auto [it, inserted] = model->ranks_.try_emplace(bytes, static_cast<int32_t>(rank));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": token \"", fields[0],
                                                     "\" is also on line ", rank_line[it->second],
                                                     " (rank ", it->second, ")"));
    }
    by_rank[rank] = bytes;
    rank_line[rank] = line_number;
  }
  if (by_rank.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    if (!by_rank[rank].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": no token has rank ", rank, " (the ranks must be 0 to ", by_rank.size() - 1,
          " without gaps: the special tokens take the ids after them)"));
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!model->ranks_.contains(std::string(1, static_cast<char>(b)))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: byte 0x%02X has no token (every single byte needs one)", source, b));
    }
  }
  model->bytes_.reserve(by_rank.size());
  model->tokens_.reserve(by_rank.size());
  for (std::optional<std::string>& b : by_rank) {
    std::string token;
    AppendByteLevel(*b, &token);
    model->by_token_.emplace(token, static_cast<int32_t>(model->tokens_.size()));
    model->tokens_.push_back(std::move(token));
    model->bytes_.push_back(*std::move(b));
  }
  return model;
}

int32_t TiktokenModel::Rank(absl::string_view bytes) const {
  auto it = ranks_.find(bytes);
  return it == ranks_.end() ? -1 : it->second;
}

absl::Status TiktokenModel::Tokenize(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (const int32_t rank = Rank(word); rank >= 0) {
    ids->push_back(rank);
    return absl::OkStatus();
  }
  // Parts are linked by byte offset: next[s] is where the part that starts at s ends.
  const auto n = static_cast<uint32_t>(word.size());
  std::vector<uint32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  std::priority_queue<QueuedPair, std::vector<QueuedPair>, PairAfter> queue;
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;  // unused for i == 0
    if (i + 2 <= n) {
      if (const int32_t rank = Rank(word.substr(i, 2)); rank >= 0) queue.push({rank, i, i + 2});
    }
  }
  while (!queue.empty()) {
    const QueuedPair top = queue.top();
    queue.pop();
    const uint32_t s = top.start;
    // Stale when the part at `s` was merged away or the pair no longer ends at `end`.
    if (!alive[s] || next[s] >= n || next[next[s]] != top.end) continue;
    alive[next[s]] = false;
    next[s] = top.end;
    if (top.end < n) prev[top.end] = s;
    if (s > 0) {
      const uint32_t p = prev[s];
      if (const int32_t rank = Rank(word.substr(p, top.end - p)); rank >= 0) {
        queue.push({rank, p, top.end});
      }
    }
    if (top.end < n) {
      const uint32_t e = next[top.end];
      if (const int32_t rank = Rank(word.substr(s, e - s)); rank >= 0) queue.push({rank, s, e});
    }
  }
  for (uint32_t s = 0; s < n; s = next[s]) {
    const int32_t rank = Rank(word.substr(s, next[s] - s));
    if (rank < 0) return absl::InternalError("tiktoken BPE left a part that is not a token");
    ids->push_back(rank);
  }
  return absl::OkStatus();
}

std::optional<int32_t> TiktokenModel::TokenToId(absl::string_view token) const {
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return std::nullopt;
  return it->second;
}

const std::string* TiktokenModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit()) return nullptr;
  return &tokens_[id];
}

const std::string* TiktokenModel::IdToBytes(int32_t id) const {
  if (id < 0 || id >= id_limit()) return nullptr;
  return &bytes_[id];
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeTiktokenPreTokenizer(absl::string_view pattern) {
  ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, Regex::CompileRust(pattern));
  return std::make_unique<MatchesPreTokenizer>(std::move(regex));
}

std::vector<absl::string_view> TiktokenPieces(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    // One part of at most kMaxEncodeChars characters, cut further at long runs.
    size_t piece_start = pos;
    size_t chars = 0;
    size_t run = 0;
    bool in_space = false;
    while (pos < text.size() && chars < kMaxEncodeChars) {
      size_t length = 0;
      const bool space = IsPythonSpace(DecodeUtf8(text, pos, &length));
      if (chars == 0) in_space = space;
      if (space != in_space) {
        in_space = space;
        run = 1;
      } else if (++run > kMaxRunChars) {
        pieces.push_back(text.substr(piece_start, pos - piece_start));
        piece_start = pos;
        run = 1;
      }
      pos += length;
      ++chars;
    }
    pieces.push_back(text.substr(piece_start, pos - piece_start));
  }
  return pieces;
}

}  // namespace tokenizer_internal
}  // namespace strata
