#include "common/placement/plan_file.h"

#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/placement/placement_stats.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "strata-placement-plan";
constexpr int kVersion = 1;

Json FiguresJson(const ImbalanceReport& r) {
  return Json{{"per_layer", r.per_layer}, {"mean", r.mean}, {"max", r.max}};
}

// Objects one key a line and tables one row a line: readable, and diffs stay small.
void Format(const Json& v, int indent, std::string& out) {
  const std::string pad(indent + 2, ' ');
  if (v.is_object() && !v.empty()) {
    out += "{\n";
    size_t i = 0;
    for (const auto& [key, value] : v.items()) {
      out += pad + Json(key).dump() + ": ";
      Format(value, indent + 2, out);
      out += ++i < v.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "}";
  } else if (v.is_array() && !v.empty() && v[0].is_array()) {
    out += "[\n";
    for (size_t i = 0; i < v.size(); ++i) {
      out += pad + v[i].dump() + (i + 1 < v.size() ? ",\n" : "\n");
    }
    out += std::string(indent, ' ') + "]";
  } else {
    out += v.dump();
  }
}

absl::Status FieldError(const std::string& path, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": \"", field, "\" ", what));
}

absl::StatusOr<int64_t> ReadInt(const Json& json, const std::string& path, const std::string& field,
                                int64_t min, int64_t max) {
  const auto it = json.find(field);
  if (it == json.end()) return FieldError(path, field, "is missing");
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    return FieldError(path, field, absl::StrCat("must be an integer in [", min, ", ", max, "]"));
  }
  return it->get<int64_t>();
}

// A [layers][experts] table of integers in [min, max].
template <typename T>
absl::StatusOr<std::vector<std::vector<T>>> ReadTable(const Json& json, const std::string& path,
                                                      const std::string& field, int layers,
                                                      int experts, int64_t min, int64_t max) {
  const auto it = json.find(field);
  if (it == json.end()) return FieldError(path, field, "is missing");
  if (!it->is_array() || static_cast<int>(it->size()) != layers) {
    return FieldError(path, field, absl::StrCat("must be an array of ", layers, " layers"));
  }
  std::vector<std::vector<T>> table(layers, std::vector<T>(experts));
  for (int layer = 0; layer < layers; ++layer) {
    const Json& row = (*it)[layer];
    if (!row.is_array() || static_cast<int>(row.size()) != experts) {
      return FieldError(
          path, field, absl::StrCat("layer ", layer, " must be an array of ", experts, " experts"));
    }
    for (int e = 0; e < experts; ++e) {
      if (!row[e].is_number_integer() || row[e].get<int64_t>() < min ||
          row[e].get<int64_t>() > max) {
        return FieldError(path, field,
                          absl::StrCat("layer ", layer, " expert ", e, " must be an integer in [",
                                       min, ", ", max, "]"));
      }
      table[layer][e] = static_cast<T>(row[e].get<int64_t>());
    }
  }
  return table;
}

}  // namespace

absl::Status SavePlan(const std::string& path, const PlanFile& file) {
  const PlacementPlan& plan = file.plan;
  if (absl::Status s = plan.Validate(); !s.ok()) return s;
  Json json;
  json["format"] = kFormat;
  json["version"] = kVersion;
  json["model"] = file.model;
  json["num_layers"] = plan.num_layers();
  json["num_experts"] = plan.num_experts();
  json["workers"] = plan.num_workers;
  json["tokens"] = file.tokens;
  if (!file.counts.empty()) {
    absl::StatusOr<ImbalanceReport> planned = ExpectedImbalance(file.counts, plan);
    if (!planned.ok()) return planned.status();
    absl::StatusOr<ImbalanceReport> contiguous = ExpectedImbalance(
        file.counts,
        PlacementPlan::Contiguous(plan.num_layers(), plan.num_experts(), plan.num_workers));
    if (!contiguous.ok()) return contiguous.status();
    const GiniReport gini = GiniByLayer(file.counts);
    json["counted_layers"] = gini.layers;
    json["counts"] = file.counts;
    json["assignment"] = plan.owner;
    json["gini"] = Json{{"per_layer", gini.per_layer}, {"overall", gini.overall}};
    json["imbalance"] =
        Json{{"contiguous", FiguresJson(*contiguous)}, {"plan", FiguresJson(*planned)}};
  } else {
    json["assignment"] = plan.owner;
  }
  std::string text;
  Format(json, 0, text);
  text += "\n";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot open for writing"));
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<PlanFile> ReadPlan(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  const auto format = json.find("format");
  if (format == json.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    return FieldError(path, "format", absl::StrCat("must be \"", kFormat, "\""));
  }
  const auto version = json.find("version");
  if (version == json.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kVersion) {
    return FieldError(path, "version", absl::StrCat("must be ", kVersion));
  }
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  PlanFile file;
  absl::StatusOr<int64_t> layers = ReadInt(json, path, "num_layers", 1, kIntMax);
  if (!layers.ok()) return layers.status();
  absl::StatusOr<int64_t> experts = ReadInt(json, path, "num_experts", 1, kIntMax);
  if (!experts.ok()) return experts.status();
  absl::StatusOr<int64_t> workers = ReadInt(json, path, "workers", 1, kIntMax);
  if (!workers.ok()) return workers.status();
  file.plan.num_workers = static_cast<int>(*workers);
  auto owner = ReadTable<int>(json, path, "assignment", static_cast<int>(*layers),
                              static_cast<int>(*experts), 0, *workers - 1);
  if (!owner.ok()) return owner.status();
  file.plan.owner = *std::move(owner);
  if (const auto model = json.find("model"); model != json.end()) {
    if (!model->is_string()) return FieldError(path, "model", "must be a string");
    file.model = model->get<std::string>();
  }
  if (json.contains("tokens")) {
    absl::StatusOr<int64_t> tokens =
        ReadInt(json, path, "tokens", 0, std::numeric_limits<int64_t>::max());
    if (!tokens.ok()) return tokens.status();
    file.tokens = *tokens;
  }
  if (json.contains("counts")) {
    auto counts =
        ReadTable<int64_t>(json, path, "counts", static_cast<int>(*layers),
                           static_cast<int>(*experts), 0, std::numeric_limits<int64_t>::max());
    if (!counts.ok()) return counts.status();
    file.counts = *std::move(counts);
  }
  return file;
}

absl::StatusOr<PlanFile> LoadPlan(const std::string& path, int num_layers, int num_experts,
                                  int num_workers) {
  absl::StatusOr<PlanFile> file = ReadPlan(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->plan.Validate(num_layers, num_experts, num_workers); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

}  // namespace strata
