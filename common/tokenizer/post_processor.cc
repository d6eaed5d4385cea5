#include "common/tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// The id of a [token, id] pair (RobertaProcessing / BertProcessing "cls" and "sep").
absl::StatusOr<int32_t> PairId(const Json& json, absl::string_view key, absl::string_view where) {
  const Json* pair = FindField(json, key);
  if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
      !(*pair)[1].is_number_integer()) {
    return ConfigError(FieldPath(where, key), "must be [token, id]");
  }
  return (*pair)[1].get<int32_t>();
}

absl::StatusOr<SpecialTokenFrame> ParseTemplate(const Json& json, absl::string_view where) {
  SpecialTokenFrame frame;
  ASSIGN_OR_RETURN(const Json* single, GetArray(json, "single", where));
  const Json* specials = FindField(json, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string path = IndexPath(FieldPath(where, "single"), i);
    if (const Json* seq = FindField(piece, "Sequence")) {
      ASSIGN_OR_RETURN(const std::string id, GetString(*seq, "id", path));
      if (id != "A") return ConfigError(path, "a single-sequence template can only use $A");
      seen_sequence = true;
      continue;
    }
    const Json* special = FindField(piece, "SpecialToken");
    if (special == nullptr) return ConfigError(path, "must be a Sequence or a SpecialToken");
    ASSIGN_OR_RETURN(const std::string name, GetString(*special, "id", path));
    const Json* entry = specials == nullptr ? nullptr : FindField(*specials, name);
    if (entry == nullptr) {
      return ConfigError(
          path, absl::StrCat("special token \"", name, "\" is missing from special_tokens"));
    }
    ASSIGN_OR_RETURN(const Json* ids, GetArray(*entry, "ids", path));
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return ConfigError(path, "special token ids must be non-negative integers");
      }
      (seen_sequence ? frame.suffix : frame.prefix).push_back(id.get<int32_t>());
    }
  }
  return frame;
}

}  // namespace

absl::StatusOr<SpecialTokenFrame> ParsePostProcessor(const Json& json, absl::string_view where) {
  if (json.is_null()) return SpecialTokenFrame();
  ASSIGN_OR_RETURN(const std::string type, GetType(json, where));
  if (type == "ByteLevel") return SpecialTokenFrame();
  if (type == "TemplateProcessing") return ParseTemplate(json, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    SpecialTokenFrame frame;
    ASSIGN_OR_RETURN(const int32_t cls, PairId(json, "cls", where));
    ASSIGN_OR_RETURN(const int32_t sep, PairId(json, "sep", where));
    frame.prefix.push_back(cls);
    frame.suffix.push_back(sep);
    return frame;
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, GetArray(json, "processors", where));
    SpecialTokenFrame frame;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(
          SpecialTokenFrame inner,
          ParsePostProcessor((*list)[i], IndexPath(FieldPath(where, "processors"), i)));
      // Each processor frames what the previous ones produced.
      inner.prefix.insert(inner.prefix.end(), frame.prefix.begin(), frame.prefix.end());
      frame.prefix = std::move(inner.prefix);
      frame.suffix.insert(frame.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return frame;
  }
  return ConfigError(where, absl::StrCat("post-processor type \"", type,
                                         "\" is not supported (supported: TemplateProcessing, "
                                         "ByteLevel, RobertaProcessing, BertProcessing, "
                                         "Sequence)"));
}

}  // namespace tokenizer_internal
}  // namespace strata
