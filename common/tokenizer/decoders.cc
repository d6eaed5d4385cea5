#include "common/tokenizer/decoders.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizers.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& part : parts_) part->DecodeChain(tokens);
  }
  bool HoldsBack(absl::string_view last_token) const override {
    for (const auto& part : parts_) {
      if (part->HoldsBack(last_token)) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t pos = 0; pos < token.size() && mapped;) {
        size_t length = 0;
        std::optional<unsigned char> b = ByteLevelByte(DecodeUtf8(token, pos, &length));
        if (b.has_value()) {
          bytes.push_back(static_cast<char>(*b));
        } else {
          mapped = false;
        }
        pos += length;
      }
      if (!mapped) {  // a character outside the byte alphabet: the token's own bytes
        bytes.resize(mark);
        bytes.append(token);
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      absl::StatusOr<std::vector<MatchSpan>> spans = FindMatches(*pattern_, token);
      if (!spans.ok()) continue;  // only a regex resource limit; keep the token
      std::string out;
      for (const MatchSpan& s : *spans) {
        if (s.is_match) {
          out.append(content_);
        } else {
          out.append(token, s.start, s.end - s.start);
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// "<0xNN>" as ByteFallback reads it (Rust's u8::from_str_radix also takes "+N").
std::optional<unsigned char> ParseByteToken(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int lo = hex(token[4]);
  if (lo < 0) return std::nullopt;
  if (token[3] == '+') return static_cast<unsigned char>(lo);
  const int hi = hex(token[3]);
  if (hi < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    auto flush = [&]() {
      if (run.empty()) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& token : *tokens) {
      if (std::optional<unsigned char> b = ParseByteToken(token)) {
        run.push_back(static_cast<char>(*b));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
  }
  bool HoldsBack(absl::string_view last_token) const override {
    return ParseByteToken(last_token).has_value();
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    tokens->assign(1, absl::StrJoin(*tokens, ""));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<size_t> offsets;  // byte offset of each character
      for (size_t pos = 0; pos < token.size(); pos += Utf8CharLength(token[pos])) {
        offsets.push_back(pos);
      }
      const size_t n = offsets.size();
      auto char_at = [&](size_t i) {
        size_t length = 0;
        return DecodeUtf8(token, offsets[i], &length);
      };
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, n) && char_at(i) == content_; ++i) start_cut = i + 1;
      size_t stop_cut = n;
      for (size_t i = 0; i < std::min(stop_, n) && char_at(n - i - 1) == content_; ++i) {
        stop_cut = n - i - 1;
      }
      if (stop_cut <= start_cut) {
        token.clear();
        continue;
      }
      const size_t begin = offsets[start_cut];
      const size_t end = stop_cut == n ? token.size() : offsets[stop_cut];
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool prepend) : prepend_(prepend) {
    AppendUtf8(replacement, &replacement_);
  }
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      (*tokens)[i] =
          absl::StrReplaceAll((*tokens)[i], {{replacement_, i == 0 && prepend_ ? "" : " "}});
    }
  }

 private:
  std::string replacement_;
  bool prepend_;  // prepend_scheme is not "never": the first token loses its replacements
};

class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    if (suffix_.empty()) return;
    for (size_t i = 0; i < tokens->size(); ++i) {
      (*tokens)[i] =
          absl::StrReplaceAll((*tokens)[i], {{suffix_, i + 1 == tokens->size() ? "" : " "}});
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, absl::string_view where) {
  if (json.is_null()) return nullptr;
  ASSIGN_OR_RETURN(const std::string type, GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, GetArray(json, "decoders", where));
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = IndexPath(FieldPath(where, "decoders"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<Decoder> part, ParseDecoder((*list)[i], path));
      if (part == nullptr) return ConfigError(path, "must not be null");
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern, ParsePattern(json, where));
    ASSIGN_OR_RETURN(std::string content, GetString(json, "content", where));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const char32_t content, GetChar(json, "content", where));
    ASSIGN_OR_RETURN(const int64_t start, GetInt(json, "start", 0, 0, 1 << 20, where));
    ASSIGN_OR_RETURN(const int64_t stop, GetInt(json, "stop", 0, 0, 1 << 20, where));
    return std::make_unique<StripDecoder>(content, start, stop);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(const char32_t replacement, GetChar(json, "replacement", where));
    ASSIGN_OR_RETURN(const std::optional<std::string> scheme,
                     GetOptionalString(json, "prepend_scheme", where));
    ASSIGN_OR_RETURN(const bool add_prefix_space, GetBool(json, "add_prefix_space", true, where));
    const bool prepend = scheme.has_value() ? *scheme != "never" : add_prefix_space;
    return std::make_unique<MetaspaceDecoder>(replacement, prepend);
  }
  if (type == "BPEDecoder") {
    ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetOptionalString(json, "suffix", where));
    return std::make_unique<BpeSuffixDecoder>(suffix.value_or("</w>"));
  }
  return ConfigError(where, absl::StrCat("decoder type \"", type,
                                         "\" is not supported (supported: Sequence, ByteLevel, "
                                         "Metaspace, Replace, ByteFallback, Fuse, Strip, "
                                         "BPEDecoder)"));
}

}  // namespace tokenizer_internal
}  // namespace strata
