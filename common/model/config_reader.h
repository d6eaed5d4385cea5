// Typed, range-checked reading of config.json keys, shared by the files that parse
// architectures (model_config.cc, deepseek_config.cc). Internal to common/model.
#ifndef STRATA_COMMON_MODEL_CONFIG_READER_H_
#define STRATA_COMMON_MODEL_CONFIG_READER_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata::config_internal {

using Json = nlohmann::json;

// Upper bounds of config.json values, far above every released model (DeepSeek-V3: 61 layers,
// hidden 7168, 256 experts, vocab 129280; Llama 3.1 405B: 126 layers, hidden 16384) and low
// enough that nothing sized from them overflows or allocates absurdly before the checkpoint is
// compared with them.
constexpr int64_t kMaxConfigInt = int64_t{1} << 40;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxHidden = int64_t{1} << 17;
constexpr int64_t kMaxIntermediate = int64_t{1} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxExperts = int64_t{1} << 14;
constexpr int64_t kMaxTopK = 256;
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr int64_t kMaxTokenId = std::numeric_limits<int32_t>::max();

// Typed access to config keys with errors that name the file and the key.
class ConfigReader {
 public:
  ConfigReader(const Json& json, absl::string_view file_name)
      : json_(json), file_name_(file_name) {}

  bool Has(absl::string_view key) const {
    auto it = json_.find(std::string(key));
    return it != json_.end() && !it->is_null();
  }
  const Json* Find(absl::string_view key) const {
    auto it = json_.find(std::string(key));
    return (it == json_.end() || it->is_null()) ? nullptr : &*it;
  }

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_name_, ": \"", key, "\" ", what));
  }

  // An integer in [min, max], read as 64 bits: a value that would not fit the field it goes to
  // (or would size an allocation past reason) is an error naming the key, never a narrowing.
  absl::StatusOr<int64_t> Int(absl::string_view key, std::optional<int64_t> fallback = {},
                              int64_t min = 1, int64_t max = kMaxConfigInt) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    if (!v->is_number_integer()) return Error(key, "must be an integer");
    // nlohmann keeps integers above INT64_MAX as unsigned: those are out of range too.
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(key, absl::StrCat("must be at most ", max, ", got ", v->get<uint64_t>()));
    }
    const int64_t value = v->get<int64_t>();
    if (value < min) return Error(key, absl::StrCat("must be at least ", min, ", got ", value));
    if (value > max) return Error(key, absl::StrCat("must be at most ", max, ", got ", value));
    return value;
  }

  absl::StatusOr<double> Number(absl::string_view key, std::optional<double> fallback = {}) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    if (!v->is_number()) return Error(key, "must be a number");
    const double value = v->get<double>();
    if (!std::isfinite(value)) return Error(key, "must be finite");
    return value;
  }

  // A finite number greater than `above` (and below `below`, when given).
  absl::StatusOr<double> NumberAbove(absl::string_view key, double above,
                                     std::optional<double> fallback = {},
                                     std::optional<double> below = {}) const {
    ASSIGN_OR_RETURN(const double value, Number(key, fallback));
    if (!(value > above)) {
      return Error(key, absl::StrCat("must be greater than ", above, ", got ", value));
    }
    if (below && !(value < *below)) {
      return Error(key, absl::StrCat("must be less than ", *below, ", got ", value));
    }
    return value;
  }

  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Error(key, "must be true or false");
    return v->get<bool>();
  }

  absl::StatusOr<std::string> String(absl::string_view key) const {
    const Json* v = Find(key);
    if (v == nullptr) return Error(key, "is missing");
    if (!v->is_string()) return Error(key, "must be a string");
    return v->get<std::string>();
  }

 private:
  const Json& json_;
  absl::string_view file_name_;
};

}  // namespace strata::config_internal

#endif  // STRATA_COMMON_MODEL_CONFIG_READER_H_
