#include "common/tokenizer/normalizers.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

bool IsAscii(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* normalizer) : normalizer_(normalizer) {}
  absl::Status Normalize(std::string* text) const override {
    if (IsAscii(*text)) return absl::OkStatus();  // ASCII is invariant under all four forms
    UErrorCode status = U_ZERO_ERROR;
    std::string out;
    out.reserve(text->size());
    icu::StringByteSink<std::string> sink(&out);
    normalizer_->normalizeUTF8(0, icu::StringPiece(text->data(), text->size()), sink, nullptr,
                               status);
    if (U_FAILURE(status)) {
      return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(status)));
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* normalizer_;
};

// Rewrites each character of `text` with `fn(c, out)`.
template <typename Fn>
void MapChars(std::string* text, Fn fn) {
  std::string out;
  out.reserve(text->size());
  for (size_t pos = 0; pos < text->size();) {
    size_t length = 0;
    const char32_t c = DecodeUtf8(*text, pos, &length);
    fn(c, absl::string_view(*text).substr(pos, length), &out);
    pos += length;
  }
  *text = std::move(out);
}

class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    MapChars(text,
             [](char32_t c, absl::string_view, std::string* out) { AppendLowercase(c, out); });
    return absl::OkStatus();
  }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    MapChars(text, [](char32_t c, absl::string_view bytes, std::string* out) {
      if (!IsCombiningMark(c)) out->append(bytes.data(), bytes.size());
    });
    return absl::OkStatus();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      while (begin < end) {
        size_t length = 0;
        if (!IsWhitespace(DecodeUtf8(*text, begin, &length))) break;
        begin += length;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t length = 0;
        if (!IsWhitespace(DecodeUtf8(*text, start, &length))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_;
  bool right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    ASSIGN_OR_RETURN(std::vector<MatchSpan> spans, FindMatches(*pattern_, *text));
    std::string out;
    out.reserve(text->size());
    for (const MatchSpan& s : spans) {
      if (s.is_match) {
        out.append(content_);
      } else {
        out.append(*text, s.start, s.end - s.start);
      }
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

}  // namespace

// {"String": "..."} or {"Regex": "..."}, as Replace and Split store their pattern.
absl::StatusOr<std::unique_ptr<Regex>> ParsePattern(const Json& obj, absl::string_view where) {
  const std::string path = FieldPath(where, "pattern");
  const Json* pattern = FindField(obj, "pattern");
  if (pattern == nullptr || !pattern->is_object() || pattern->size() != 1) {
    return ConfigError(path, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const auto it = pattern->begin();
  const std::string kind = it.key();
  const Json& value = it.value();
  if (!value.is_string()) return ConfigError(path, "must hold a string");
  absl::StatusOr<std::unique_ptr<Regex>> regex;
  if (kind == "String") {
    regex = Regex::Literal(value.get<std::string>());
  } else if (kind == "Regex") {
    regex = Regex::Compile(value.get<std::string>());
  } else {
    return ConfigError(path, absl::StrCat("unknown pattern kind \"", kind, "\""));
  }
  if (!regex.ok()) return ConfigError(path, regex.status().message());
  return regex;
}

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            absl::string_view where) {
  if (json.is_null()) return nullptr;
  ASSIGN_OR_RETURN(const std::string type, GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, GetArray(json, "normalizers", where));
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = IndexPath(FieldPath(where, "normalizers"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> part, ParseNormalizer((*list)[i], path));
      if (part == nullptr) return ConfigError(path, "must not be null");
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                 : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status) || n == nullptr) {
      return absl::InternalError(absl::StrCat("ICU has no ", type, " normalizer"));
    }
    return std::make_unique<UnicodeNormalizer>(n);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, GetBool(json, "strip_left", true, where));
    ASSIGN_OR_RETURN(const bool right, GetBool(json, "strip_right", true, where));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, GetString(json, "prepend", where));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern, ParsePattern(json, where));
    ASSIGN_OR_RETURN(std::string content, GetString(json, "content", where));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  return ConfigError(where, absl::StrCat("normalizer type \"", type,
                                         "\" is not supported (supported: Sequence, NFC, NFD, "
                                         "NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, "
                                         "Replace)"));
}

}  // namespace tokenizer_internal
}  // namespace strata
