#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoders.h"
#include "common/tokenizer/json_config.h"
#include "common/tokenizer/normalizers.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizers.h"
#include "common/tokenizer/tiktoken_model.h"
#include "common/tokenizer/utf8.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"

namespace strata {

using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::BpeModel;
using tokenizer_internal::ConfigError;
using tokenizer_internal::Json;
using tokenizer_internal::PreToken;
using tokenizer_internal::Segment;

namespace {

// "<file>: <key>", the start of the paths in error messages.
std::string RootPath(absl::string_view source, absl::string_view key) {
  return absl::StrCat(source, ": ", key);
}

const Json& MemberOrNull(const Json& obj, const char* key) {
  static const Json* null_json = new Json(nullptr);
  auto it = obj.find(key);
  return it == obj.end() ? *null_json : *it;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view json_text,
                                                               absl::string_view source_name) {
  const std::string source(source_name);
  Json json;
  try {
    json = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!json.is_object()) return ConfigError(source, "the top level must be a JSON object");

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->source_name_ = source;
  try {
    if (const Json* version = tokenizer_internal::FindField(json, "version");
        version != nullptr && (!version->is_string() || version->get<std::string>() != "1.0")) {
      return ConfigError(RootPath(source, "version"), "unknown tokenizer.json version");
    }
    const Json& model = MemberOrNull(json, "model");
    const std::string model_path = RootPath(source, "model");
    if (!model.is_object()) return ConfigError(model_path, "is missing or not an object");
    std::string model_type = "BPE";  // files from old versions may leave the type out
    if (model.contains("type")) {
      ASSIGN_OR_RETURN(model_type, tokenizer_internal::GetType(model, model_path));
    } else if (!model.contains("merges")) {
      return ConfigError(model_path, "has no type");
    }
    if (model_type != "BPE") {
      return ConfigError(
          model_path, absl::StrCat("model type \"", model_type, "\" is not supported (only BPE)"));
    }
    ASSIGN_OR_RETURN(tok->model_, BpeModel::FromJson(model, model_path));
    ASSIGN_OR_RETURN(tok->normalizer_,
                     tokenizer_internal::ParseNormalizer(MemberOrNull(json, "normalizer"),
                                                         RootPath(source, "normalizer")));
    ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                     tokenizer_internal::ParsePreTokenizer(MemberOrNull(json, "pre_tokenizer"),
                                                           RootPath(source, "pre_tokenizer")));
    ASSIGN_OR_RETURN(tok->added_, AddedVocabulary::FromJson(MemberOrNull(json, "added_tokens"),
                                                            *tok->model_, tok->normalizer_.get(),
                                                            RootPath(source, "added_tokens")));
    ASSIGN_OR_RETURN(tokenizer_internal::SpecialTokenFrame frame,
                     tokenizer_internal::ParsePostProcessor(MemberOrNull(json, "post_processor"),
                                                            RootPath(source, "post_processor")));
    tok->frame_ = std::make_unique<tokenizer_internal::SpecialTokenFrame>(std::move(frame));
    ASSIGN_OR_RETURN(tok->decoder_, tokenizer_internal::ParseDecoder(MemberOrNull(json, "decoder"),
                                                                     RootPath(source, "decoder")));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unexpected JSON: ", e.what()));
  }
  for (const auto* ids : {&tok->frame_->prefix, &tok->frame_->suffix}) {
    for (int32_t id : *ids) {
      if (id >= tok->vocab_size()) {
        return ConfigError(RootPath(source, "post_processor"),
                           absl::StrCat("special token id ", id, " is not in the vocabulary"));
      }
    }
  }
  // Token strings are never shorter than the text they stand for: byte-level BPE spells each
  // byte with one character, SentencePiece a space with "\u2581" and a fallback byte "<0x41>".
  const int32_t limit = tok->vocab_size();
  for (int32_t id = 0; id < limit; ++id) {
    if (const std::string* token = tok->DecodeToken(id, /*skip_special_tokens=*/false)) {
      tok->max_token_bytes_ = std::max(tok->max_token_bytes_, token->size());
    }
  }
  return tok;
}

int64_t Tokenizer::MinTokens(size_t text_bytes) const {
  const uint64_t per_token =
      uint64_t{kMaxNormalizationShrink} * std::max<size_t>(max_token_bytes_, 1);
  return static_cast<int64_t>((text_bytes + per_token - 1) / per_token);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (!tokenizer_internal::IsValidUtf8(text)) {
    return absl::InvalidArgumentError("Encode: the text is not valid UTF-8");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = frame_->prefix;
  if (tiktoken_ != nullptr) {
    for (absl::string_view piece : tokenizer_internal::TiktokenPieces(text)) {
      RETURN_IF_ERROR(EncodePiece(piece, &ids));
    }
  } else {
    RETURN_IF_ERROR(EncodePiece(text, &ids));
  }
  if (add_special_tokens) ids.insert(ids.end(), frame_->suffix.begin(), frame_->suffix.end());
  return ids;
}

absl::Status Tokenizer::EncodePiece(absl::string_view text, std::vector<int32_t>* ids) const {
  // 1. Split around the added tokens matched on the raw text, 2. normalize the rest and split
  // it around the added tokens matched on normalized text, 3. pre-tokenize, 4. run the model.
  std::vector<Segment> raw_segments;
  added_->Split(text, /*normalized=*/false, &raw_segments);
  std::vector<Segment> segments;
  std::vector<PreToken> pieces;
  std::string normalized;
  for (const Segment& raw : raw_segments) {
    if (raw.token_id >= 0) {
      ids->push_back(raw.token_id);
      continue;
    }
    normalized.assign(text.data() + raw.start, raw.end - raw.start);
    if (normalizer_ != nullptr) RETURN_IF_ERROR(normalizer_->Normalize(&normalized));
    segments.clear();
    added_->Split(normalized, /*normalized=*/true, &segments);
    for (const Segment& segment : segments) {
      if (segment.token_id >= 0) {
        ids->push_back(segment.token_id);
        continue;
      }
      pieces.clear();
      pieces.push_back({normalized.substr(segment.start, segment.end - segment.start),
                        raw.start == 0 && segment.start == 0});
      if (pre_tokenizer_ != nullptr) RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces));
      for (const PreToken& piece : pieces) RETURN_IF_ERROR(model_->Tokenize(piece.text, ids));
    }
  }
  return absl::OkStatus();
}

const std::string* Tokenizer::DecodeToken(int32_t id, bool skip_special_tokens) const {
  const std::string* token = added_->DecodeForm(id);
  if (token == nullptr) token = model_->IdToToken(id);
  if (token == nullptr) return nullptr;
  if (skip_special_tokens && added_->IsSpecialContent(*token)) return nullptr;
  return token;
}

std::string Tokenizer::DecodeInRange(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const {
  if (tiktoken_ != nullptr) {  // tiktoken's decode: the bytes, special tokens as their text
    std::string bytes;
    for (int32_t id : ids) {
      if (const tokenizer_internal::AddedToken* token = added_->Find(id)) {
        if (!skip_special_tokens || !token->special) bytes.append(token->content);
      } else if (const std::string* b = tiktoken_->IdToBytes(id)) {
        bytes.append(*b);
      }
    }
    return tokenizer_internal::Utf8Lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const std::string* token = DecodeToken(id, skip_special_tokens)) tokens.push_back(*token);
  }
  if (decoder_ == nullptr) return absl::StrJoin(tokens, " ");
  decoder_->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

bool Tokenizer::DecodeMayChange(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  if (decoder_ == nullptr) return false;
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (const std::string* token = DecodeToken(*it, skip_special_tokens)) {
      return decoder_->HoldsBack(*token);
    }
  }
  return false;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  const int32_t limit = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("Decode: token id ", id, " is out of range [0, ", limit, ")"));
    }
  }
  return DecodeInRange(ids, skip_special_tokens);
}

int32_t Tokenizer::vocab_size() const { return std::max(model_->id_limit(), added_->id_limit()); }

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  if (std::optional<int32_t> id = added_->TokenToId(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::string* token = DecodeToken(id, /*skip_special_tokens=*/false);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const tokenizer_internal::AddedToken* token = added_->Find(id);
  return token != nullptr && token->special;
}

}  // namespace strata
