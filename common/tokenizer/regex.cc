#include "common/tokenizer/regex.h"

#include <algorithm>
#include <optional>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// Per-thread match data and JIT stack, so that one compiled Regex serves many threads.
class MatchScratch {
 public:
  MatchScratch()
      : data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        stack_(pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr)) {
    if (context_ != nullptr && stack_ != nullptr) {
      pcre2_jit_stack_assign(context_, nullptr, stack_);
    }
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* stack_;
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

absl::Status CompileWith(absl::string_view pattern, uint32_t options, void** code_out) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("error at offset ", offset, ": ", reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: the interpreter is the fallback
  *code_out = code;
  return absl::OkStatus();
}

// Oniguruma's classes, spelled out for PCRE2 where the two differ: \s is the White_Space
// property (PCRE2 also takes U+180E), \w is Alphabetic, Mark, Nd, Pc and Join_Control (PCRE2 takes
// letters, all numbers and _), and Ruby's \h is a hex digit (PCRE2: horizontal space).
constexpr absl::string_view kSpaceSet =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr absl::string_view kWordSet = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";
constexpr absl::string_view kHexSet = "0-9a-fA-F";

// Rewrites \s \S \w \W \h \H of an Oniguruma (Ruby syntax) pattern into explicit sets.
std::string TranslateOnigPattern(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      absl::string_view set;
      bool negated = false;
      switch (e) {
        case 's':
        case 'S':
          set = kSpaceSet;
          negated = e == 'S';
          break;
        case 'w':
        case 'W':
          set = kWordSet;
          negated = e == 'W';
          break;
        case 'h':
        case 'H':
          set = kHexSet;
          negated = e == 'H';
          break;
        default:
          break;
      }
      if (set.empty() || (in_class && negated)) {  // a negated set cannot go inside a class
        out.push_back('\\');
        out.push_back(e);
      } else if (in_class) {
        out.append(set.data(), set.size());
      } else {
        absl::StrAppend(&out, negated ? "[^" : "[", set, "]");
      }
      continue;
    }
    out.push_back(c);
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (close != absl::string_view::npos) {
        out.append(pattern.data() + i + 1, close + 1 - i);
        i = close + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

// Whether `name` is a general category (or group of them) by its short name, which \p{...}
// means the same in Rust and PCRE2.
bool IsGeneralCategory(absl::string_view name) {
  static constexpr absl::string_view kNames[] = {
      "L",  "L&", "LC", "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd",
      "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk",
      "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn", "Any"};
  for (absl::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

// Rust's \p{Script} is the Script property; PCRE2's is Script_Extensions, hence \p{sc=...}.
std::string TranslateRustScripts(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 >= pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char e = pattern[i + 1];
    const size_t close = pattern.find('}', i + 2);
    if ((e == 'p' || e == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{' &&
        close != absl::string_view::npos) {
      const absl::string_view name = pattern.substr(i + 3, close - i - 3);
      const bool script =
          !IsGeneralCategory(name) && name.find_first_of("=:") == absl::string_view::npos;
      absl::StrAppend(&out, "\\", std::string(1, e), "{", script ? "sc=" : "", name, "}");
      i = close;
      continue;
    }
    out.push_back('\\');
    out.push_back(e);
    ++i;
  }
  return out;
}

// The end of the class that opens at `pattern[open]` (the index of its "]"), with the top-level
// "&&" positions of its body and whether it nests classes or uses another set operation ("--",
// "~~"); npos when it does not close.
size_t ClassEnd(absl::string_view pattern, size_t open, std::vector<size_t>* ands, bool* nested,
                bool* other_operation) {
  size_t i = open + 1;
  if (i < pattern.size() && pattern[i] == '^') ++i;
  if (i < pattern.size() && pattern[i] == ']') ++i;  // a leading "]" is literal
  int depth = 0;
  for (; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      ++i;
    } else if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (close != absl::string_view::npos) i = close + 1;
    } else if (c == '[') {
      ++depth;
      *nested = true;
    } else if (c == ']') {
      if (depth == 0) return i;
      --depth;
    } else if (depth == 0 && i + 1 < pattern.size() && pattern[i + 1] == c &&
               (c == '&' || c == '-' || c == '~')) {
      if (c == '&') {
        ands->push_back(i);
      } else {
        *other_operation = true;
      }
      ++i;
    }
  }
  return absl::string_view::npos;
}

// Rewrites the class intersections of a Rust pattern into lookaheads.
absl::StatusOr<std::string> TranslateRustIntersections(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out.append(pattern.data() + i, 2);
      ++i;
      continue;
    }
    if (c != '[') {
      out.push_back(c);
      continue;
    }
    std::vector<size_t> ands;
    bool nested = false;
    bool other_operation = false;
    const size_t end = ClassEnd(pattern, i, &ands, &nested, &other_operation);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("the class at offset ", i, " does not close"));
    }
    if (other_operation) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the class at offset ", i, " uses a set operation other than \"&&\", not supported"));
    }
    if (ands.empty()) {
      if (nested) {
        return absl::InvalidArgumentError(
            absl::StrCat("the nested class at offset ", i, " is not supported"));
      }
      out.append(pattern.data() + i, end + 1 - i);
      i = end;
      continue;
    }
    // [A&&B&&...]: A where every B holds.
    const absl::string_view first = pattern.substr(i + 1, ands[0] - i - 1);
    if (first.empty() || first[0] == '^' || first.find('[') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("the class intersection at offset ", i,
                                                     " must start with a plain set: [A&&B]"));
    }
    absl::StrAppend(&out, "(?:");
    for (size_t k = 0; k < ands.size(); ++k) {
      const size_t from = ands[k] + 2;
      const size_t to = k + 1 < ands.size() ? ands[k + 1] : end;
      absl::string_view operand = pattern.substr(from, to - from);
      if (operand.size() >= 2 && operand.front() == '[' && operand.back() == ']') {
        operand = operand.substr(1, operand.size() - 2);
      }
      const bool negated = !operand.empty() && operand[0] == '^';
      if (negated) operand.remove_prefix(1);
      if (operand.empty() || operand.find('[') != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("the class intersection at offset ", i,
                                                       " has an operand that is not a plain set"));
      }
      absl::StrAppend(&out, negated ? "(?![" : "(?=[", operand, "])");
    }
    absl::StrAppend(&out, "[", first, "])");
    i = end;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileRust(absl::string_view pattern) {
  if (!IsValidUtf8(pattern)) return absl::InvalidArgumentError("regex is not valid UTF-8");
  absl::StatusOr<std::string> translated = TranslateRustIntersections(pattern);
  void* code = nullptr;
  absl::Status status = translated.status();
  if (status.ok()) {
    status = CompileWith(TranslateOnigPattern(TranslateRustScripts(*translated)),
                         PCRE2_UTF | PCRE2_UCP, &code);
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex \"", pattern, "\": ", status.message()));
  }
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  if (!IsValidUtf8(pattern)) return absl::InvalidArgumentError("regex is not valid UTF-8");
  void* code = nullptr;
  // Oniguruma's Ruby syntax (what tokenizers uses) treats ^ and $ as line anchors.
  const std::string translated = TranslateOnigPattern(pattern);
  if (absl::Status status = CompileWith(translated, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code);
      !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex \"", pattern, "\": ", status.message()));
  }
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(absl::string_view text) {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("pattern is not valid UTF-8");
  void* code = nullptr;
  if (absl::Status status = CompileWith(text, PCRE2_UTF | PCRE2_LITERAL, &code); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile literal \"", text, "\": ", status.message()));
  }
  return std::unique_ptr<Regex>(new Regex(std::string(text), code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(absl::string_view text, std::vector<ByteRange>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& scratch = Scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK,
                               scratch.data(), scratch.context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::ResourceExhaustedError(absl::StrCat(
          "regex \"", pattern_, "\" failed: ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && last_match_end == end) {
      if (last_end >= text.size()) break;
      last_end += Utf8CharLength(static_cast<unsigned char>(text[last_end]));
      continue;
    }
    last_end = end;
    last_match_end = end;
    out->push_back({start, end});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MatchSpan>> FindMatches(const Regex& regex, absl::string_view text,
                                                   bool invert) {
  std::vector<MatchSpan> spans;
  if (text.empty()) {
    spans.push_back({0, 0, invert});
    return spans;
  }
  std::vector<ByteRange> matches;
  if (absl::Status status = regex.FindAll(text, &matches); !status.ok()) return status;
  size_t prev = 0;
  for (const ByteRange& m : matches) {
    if (prev != m.start) spans.push_back({prev, m.start, invert});
    spans.push_back({m.start, m.end, !invert});
    prev = m.end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

std::vector<MatchSpan> FindCharMatches(absl::string_view text,
                                       absl::FunctionRef<bool(char32_t)> predicate) {
  std::vector<MatchSpan> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
    return spans;
  }
  size_t last_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const char32_t c = DecodeUtf8(text, pos, &length);
    if (predicate(c)) {
      if (last_offset < pos) spans.push_back({last_offset, pos, false});
      spans.push_back({pos, pos + length, true});
      last_offset = pos + length;
    }
    pos += length;
  }
  if (pos > last_offset) spans.push_back({last_offset, pos, false});
  return spans;
}

std::vector<MatchSpan> FindCharMatches(absl::string_view text, char32_t c) {
  return FindCharMatches(text, [c](char32_t x) { return x == c; });
}

bool ParseSplitBehavior(absl::string_view name, SplitBehavior* behavior) {
  static constexpr std::pair<absl::string_view, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous},
  };
  for (const auto& [n, b] : kNames) {
    if (n == name) {
      *behavior = b;
      return true;
    }
  }
  return false;
}

std::vector<ByteRange> ApplySplitBehavior(const std::vector<MatchSpan>& matches,
                                          SplitBehavior behavior) {
  std::vector<ByteRange> out;
  out.reserve(matches.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const MatchSpan& m : matches) out.push_back({m.start, m.end});
      break;
    case SplitBehavior::kRemoved:
      for (const MatchSpan& m : matches) {
        if (!m.is_match) out.push_back({m.start, m.end});
      }
      break;
    case SplitBehavior::kContiguous:
      for (const MatchSpan& m : matches) {
        if (m.is_match == previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end});
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const MatchSpan& m : matches) {
        if (m.is_match && !previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end});
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end});
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

}  // namespace tokenizer_internal
}  // namespace strata
