// Tokenizer::FromTiktoken (Kimi-K2's tiktoken.model + tokenizer_config.json) and
// Tokenizer::FromModelDir, which picks a model directory's tokenizer files.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/json_config.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/tiktoken_model.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"

namespace strata {

using tokenizer_internal::AddedToken;
using tokenizer_internal::ConfigError;
using tokenizer_internal::FieldPath;
using tokenizer_internal::Json;

namespace {

// tokenization_kimi.py's num_reserved_special_tokens: the ids after the ranks that are special.
constexpr int32_t kNumSpecialTokens = 256;

// The special tokens named in tokenizer_config.json's added_tokens_decoder, by offset from
// `first` (the first id after the ranks).
absl::Status ReadNamedSpecialTokens(const Json& config, int32_t first, absl::string_view source,
                                    std::vector<std::optional<AddedToken>>* named) {
  const Json* decoder = tokenizer_internal::FindField(config, "added_tokens_decoder");
  if (decoder == nullptr) return absl::OkStatus();
  const std::string path = absl::StrCat(source, ": added_tokens_decoder");
  if (!decoder->is_object()) return ConfigError(path, "must be an object of id -> token");
  for (const auto& [key, entry] : decoder->items()) {
    const std::string entry_path = FieldPath(path, key);
    int64_t id = 0;
    if (!absl::SimpleAtoi(key, &id) || id < 0) return ConfigError(entry_path, "is not a token id");
    // Kimi's tokenizer gives tiktoken only the ids right after the ranks; others play no part.
    if (id < first || id >= int64_t{first} + kNumSpecialTokens) continue;
    if (!entry.is_object()) return ConfigError(entry_path, "must be an object with \"content\"");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, tokenizer_internal::GetString(entry, "content", entry_path));
    ASSIGN_OR_RETURN(token.special,
                     tokenizer_internal::GetBool(entry, "special", false, entry_path));
    if (token.content.empty()) return ConfigError(entry_path, "content is empty");
    if (!tokenizer_internal::IsValidUtf8(token.content)) {
      return ConfigError(entry_path, "content is not valid UTF-8");
    }
    (*named)[id - first] = std::move(token);
  }
  return absl::OkStatus();
}

// A file that exists but cannot be read is not "no tokenizer" (NotFound) to callers.
absl::Status Unreadable(const absl::Status& status) {
  if (!absl::IsNotFound(status)) return status;
  return absl::FailedPreconditionError(status.message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTiktoken(absl::string_view model_text,
                                                                   absl::string_view config_text,
                                                                   absl::string_view model_name,
                                                                   absl::string_view config_name) {
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer_internal::TiktokenModel> model,
                   tokenizer_internal::TiktokenModel::FromText(model_text, model_name));
  const std::string config_source(config_name);
  Json config;
  try {
    config = Json::parse(config_text.begin(), config_text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_source, ": not valid JSON: ", e.what()));
  }
  if (!config.is_object()) return ConfigError(config_source, "the top level must be a JSON object");

  const int32_t first = model->id_limit();
  std::vector<std::optional<AddedToken>> named(kNumSpecialTokens);
  RETURN_IF_ERROR(ReadNamedSpecialTokens(config, first, config_source, &named));
  std::vector<std::pair<int32_t, AddedToken>> specials;
  absl::flat_hash_map<std::string, int32_t> ids_by_content;
  for (int32_t offset = 0; offset < kNumSpecialTokens; ++offset) {
    const int32_t id = first + offset;
    AddedToken token;
    if (named[offset].has_value()) {
      token = *std::move(named[offset]);
    } else {
      token.content = absl::StrCat("<|reserved_token_", id, "|>");
      token.special = true;
    }
    auto [it, inserted] = ids_by_content.try_emplace(token.content, id);
    if (!inserted) {
      return ConfigError(
          FieldPath(config_source, "added_tokens_decoder"),
          absl::StrCat("\"", token.content, "\" is the content of both ", it->second, " and ", id));
    }
    specials.emplace_back(id, std::move(token));
  }

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->source_name_ = std::string(model_name);
  ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                   tokenizer_internal::MakeTiktokenPreTokenizer(tokenizer_internal::kKimiPattern));
  tok->added_ = tokenizer_internal::AddedVocabulary::FromTokens(std::move(specials));
  tok->frame_ = std::make_unique<tokenizer_internal::SpecialTokenFrame>();
  tok->tiktoken_ = model.get();
  tok->model_ = std::move(model);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    if (const std::string* token = tok->DecodeToken(id, /*skip_special_tokens=*/false)) {
      tok->max_token_bytes_ = std::max(tok->max_token_bytes_, token->size());
    }
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDirIfAny(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = FromModelDir(dir);
  if (!loaded.ok() && absl::IsNotFound(loaded.status())) return nullptr;
  return loaded;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  const std::filesystem::path root(dir);
  const std::string json_path = (root / "tokenizer.json").string();
  const std::string model_path = (root / "tiktoken.model").string();
  std::error_code error;
  if (std::filesystem::exists(json_path, error)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = FromFile(json_path);
    if (!tok.ok()) return Unreadable(tok.status());
    return tok;
  }
  if (!std::filesystem::exists(model_path, error)) {
    return absl::NotFoundError(
        absl::StrCat(dir, " has no tokenizer: neither tokenizer.json nor tiktoken.model"));
  }
  const std::string config_path = (root / "tokenizer_config.json").string();
  absl::StatusOr<std::string> model_text = ReadFileToString(model_path);
  if (!model_text.ok()) return Unreadable(model_text.status());
  absl::StatusOr<std::string> config_text = ReadFileToString(config_path);
  if (!config_text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(model_path, " needs ", config_path,
                     " (its special tokens): ", config_text.status().message()));
  }
  return FromTiktoken(*model_text, *config_text, model_path, config_path);
}

}  // namespace strata
