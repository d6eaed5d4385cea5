#include "common/tokenizer/pre_tokenizers.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizers.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// GPT-2's split regex, built into tokenizers' ByteLevel pre-tokenizer.
constexpr absl::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Appends the non-empty `ranges` of `piece` to `out`.
void AppendRanges(const PreToken& piece, const std::vector<ByteRange>& ranges,
                  std::vector<PreToken>* out) {
  for (const ByteRange& r : ranges) {
    if (r.end <= r.start) continue;
    out->push_back({piece.text.substr(r.start, r.end - r.start), piece.at_origin && r.start == 0});
  }
}

// Applies `fn(const PreToken&, std::vector<PreToken>* out)` to every piece.
template <typename Fn>
absl::Status SplitEach(std::vector<PreToken>* pieces, Fn fn) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  for (const PreToken& piece : *pieces) RETURN_IF_ERROR(fn(piece, &out));
  *pieces = std::move(out);
  return absl::OkStatus();
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->PreTokenize(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, const Regex* regex)
      : add_prefix_space_(add_prefix_space), regex_(regex) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    RETURN_IF_ERROR(SplitEach(pieces, [&](const PreToken& piece, std::vector<PreToken>* out) {
      PreToken p = piece;
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (regex_ == nullptr) {
        if (!p.text.empty()) out->push_back(std::move(p));
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(std::vector<MatchSpan> spans, FindMatches(*regex_, p.text));
      AppendRanges(p, ApplySplitBehavior(spans, SplitBehavior::kIsolated), out);
      return absl::OkStatus();
    }));
    for (PreToken& piece : *pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      AppendByteLevel(piece.text, &mapped);
      piece.text = std::move(mapped);
    }
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  const Regex* regex_;  // GPT-2's regex, or nullptr when use_regex is false
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitEach(pieces, [&](const PreToken& piece, std::vector<PreToken>* out) {
      ASSIGN_OR_RETURN(std::vector<MatchSpan> spans, FindMatches(*regex_, piece.text, invert_));
      AppendRanges(piece, ApplySplitBehavior(spans, behavior_), out);
      return absl::OkStatus();
    });
  }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { kFirst, kNever, kAlways };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, &replacement_utf8_);
  }
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitEach(pieces, [&](const PreToken& piece, std::vector<PreToken>* out) {
      PreToken p{absl::StrReplaceAll(piece.text, {{" ", replacement_utf8_}}), piece.at_origin};
      const bool starts_with_replacement = absl::StartsWith(p.text, replacement_utf8_);
      if (!starts_with_replacement && (scheme_ == PrependScheme::kAlways ||
                                       (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        p.text.insert(0, replacement_utf8_);
      }
      if (!split_) {
        if (!p.text.empty()) out->push_back(std::move(p));
        return absl::OkStatus();
      }
      AppendRanges(
          p,
          ApplySplitBehavior(FindCharMatches(p.text, replacement_), SplitBehavior::kMergedWithNext),
          out);
      return absl::OkStatus();
    });
  }

 private:
  char32_t replacement_;
  std::string replacement_utf8_;
  PrependScheme scheme_;
  bool split_;
};

// Digits and WhitespaceSplit: split around characters of one class.
class CharClassPreTokenizer : public PreTokenizer {
 public:
  CharClassPreTokenizer(bool (*predicate)(char32_t), SplitBehavior behavior)
      : predicate_(predicate), behavior_(behavior) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitEach(pieces, [&](const PreToken& piece, std::vector<PreToken>* out) {
      AppendRanges(piece, ApplySplitBehavior(FindCharMatches(piece.text, predicate_), behavior_),
                   out);
      return absl::OkStatus();
    });
  }

 private:
  bool (*predicate_)(char32_t);
  SplitBehavior behavior_;
};

absl::StatusOr<const Regex*> ByteLevelRegex() {
  static const absl::StatusOr<std::unique_ptr<Regex>>* regex =
      new absl::StatusOr<std::unique_ptr<Regex>>(Regex::Compile(kByteLevelPattern));
  if (!regex->ok()) return regex->status();
  return regex->value().get();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                absl::string_view where) {
  if (json.is_null()) return nullptr;
  ASSIGN_OR_RETURN(const std::string type, GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, GetArray(json, "pretokenizers", where));
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = IndexPath(FieldPath(where, "pretokenizers"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> part, ParsePreTokenizer((*list)[i], path));
      if (part == nullptr) return ConfigError(path, "must not be null");
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(const bool add_prefix_space, GetBool(json, "add_prefix_space", true, where));
    ASSIGN_OR_RETURN(const bool use_regex, GetBool(json, "use_regex", true, where));
    const Regex* regex = nullptr;
    if (use_regex) {
      ASSIGN_OR_RETURN(regex, ByteLevelRegex());
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, regex);
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, ParsePattern(json, where));
    ASSIGN_OR_RETURN(const std::string behavior_name, GetString(json, "behavior", where));
    SplitBehavior behavior;
    if (!ParseSplitBehavior(behavior_name, &behavior)) {
      return ConfigError(FieldPath(where, "behavior"),
                         absl::StrCat("unknown split behavior \"", behavior_name, "\""));
    }
    ASSIGN_OR_RETURN(const bool invert, GetBool(json, "invert", false, where));
    return std::make_unique<SplitPreTokenizer>(std::move(regex), behavior, invert);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(const char32_t replacement, GetChar(json, "replacement", where));
    ASSIGN_OR_RETURN(const std::optional<std::string> scheme_name,
                     GetOptionalString(json, "prepend_scheme", where));
    PrependScheme scheme = PrependScheme::kAlways;
    if (scheme_name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (scheme_name == "never") {
      scheme = PrependScheme::kNever;
    } else if (scheme_name.has_value() && scheme_name != "always") {
      return ConfigError(FieldPath(where, "prepend_scheme"),
                         absl::StrCat("unknown prepend scheme \"", *scheme_name, "\""));
    }
    // Older files say add_prefix_space instead; false means "never".
    ASSIGN_OR_RETURN(const bool add_prefix_space, GetBool(json, "add_prefix_space", true, where));
    if (!add_prefix_space) {
      if (scheme != PrependScheme::kNever && scheme_name.has_value()) {
        return ConfigError(where, "add_prefix_space does not match declared prepend_scheme");
      }
      scheme = PrependScheme::kNever;
    }
    ASSIGN_OR_RETURN(const bool split, GetBool(json, "split", true, where));
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, split);
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool individual, GetBool(json, "individual_digits", false, where));
    return std::make_unique<CharClassPreTokenizer>(
        &IsNumeric, individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharClassPreTokenizer>(&IsWhitespace, SplitBehavior::kRemoved);
  }
  return ConfigError(where, absl::StrCat("pre-tokenizer type \"", type,
                                         "\" is not supported (supported: Sequence, ByteLevel, "
                                         "Split, Metaspace, Digits, WhitespaceSplit)"));
}

}  // namespace tokenizer_internal
}  // namespace strata
