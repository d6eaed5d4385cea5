// Pattern matching and splitting as tokenizers' Pattern / NormalizedString::split do it.
// Regexes are compiled with PCRE2 in UTF + UCP mode, which matches the Oniguruma engine that
// tokenizers uses for the patterns found in tokenizer.json files (\p{L}, \s, lookahead,
// possessive and lazy quantifiers, (?i:...)).
#ifndef STRATA_COMMON_TOKENIZER_REGEX_H_
#define STRATA_COMMON_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {
namespace tokenizer_internal {

struct ByteRange {
  size_t start = 0;
  size_t end = 0;
};

// A piece of a string: a match of a pattern or the text between two matches.
struct MatchSpan {
  size_t start = 0;
  size_t end = 0;
  bool is_match = false;
};

class Regex {
 public:
  // Compiles a regular expression (errors name the pattern and the position).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(absl::string_view pattern);
  // Compiles a pattern in the syntax of Rust's `regex` crate, which tiktoken uses, where it
  // differs from PCRE2 (beyond the \s and \w sets, as in Compile): a class intersection
  // `[A&&[^B]]`, `[A&&[B]]` or `[A&&B]` becomes `(?:(?![B])[A])` or `(?:(?=[B])[A])`, and
  // `\p{Han}` (any name other than a general category is a script) becomes `\p{sc=Han}`,
  // since PCRE2's `\p{Han}` also takes characters whose Script_Extensions include Han (such
  // as "、") and Rust's does not.  Other intersections, nested classes and the other set
  // operations ("--", "~~") are errors.
  static absl::StatusOr<std::unique_ptr<Regex>> CompileRust(absl::string_view pattern);
  // A pattern that matches `text` literally.
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(absl::string_view text);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-overlapping matches in `text` (valid UTF-8), left to right; an empty match
  // right after the previous match is skipped, as Oniguruma's find_iter does.
  absl::Status FindAll(absl::string_view text, std::vector<ByteRange>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;
  void* code_;  // pcre2_code_8*
};

// Pattern::find_matches: matches and the gaps between them, covering all of `text`; `invert`
// flips which is which.  An empty `text` gives one empty non-match.
absl::StatusOr<std::vector<MatchSpan>> FindMatches(const Regex& regex, absl::string_view text,
                                                   bool invert = false);

// Pattern::find_matches for a character predicate: every character for which `predicate` holds
// is a match of its own.
std::vector<MatchSpan> FindCharMatches(absl::string_view text,
                                       absl::FunctionRef<bool(char32_t)> predicate);

// Pattern::find_matches for one character.
std::vector<MatchSpan> FindCharMatches(absl::string_view text, char32_t c);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Parses "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext" or "Contiguous".
bool ParseSplitBehavior(absl::string_view name, SplitBehavior* behavior);

// NormalizedString::split: the ranges of the pieces to keep, in order (possibly empty ones).
std::vector<ByteRange> ApplySplitBehavior(const std::vector<MatchSpan>& matches,
                                          SplitBehavior behavior);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_REGEX_H_
