#include "tools/strata/client_commands.h"

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/placement/hot_ratio.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {
namespace {

namespace pb = ::google::protobuf;

// "stop" for FINISH_REASON_STOP.
std::string FinishName(v1::FinishReason reason) {
  std::string name = absl::AsciiStrToLower(v1::FinishReason_Name(reason));
  return name.substr(name.rfind('_') + 1);
}

// One field's value (element `index` of a repeated field) as JSON. Protobuf's own JSON
// printer writes 64-bit integers as strings; counters read better as numbers.
nlohmann::json ToJson(const pb::Message& message);
nlohmann::json FieldValue(const pb::Message& m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return ToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

// Every field, set or not, under its proto name.
nlohmann::json ToJson(const pb::Message& message) {
  nlohmann::json json = nlohmann::json::object();
  const pb::Descriptor* d = message.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (!f->is_repeated()) {
      json[f->name()] = FieldValue(message, f, 0);
      continue;
    }
    nlohmann::json list = nlohmann::json::array();
    const int n = message.GetReflection()->FieldSize(message, f);
    for (int k = 0; k < n; ++k) list.push_back(FieldValue(message, f, k));
    json[f->name()] = std::move(list);
  }
  return json;
}

}  // namespace

absl::Status RunRemoteGenerate(const RemoteGenerateOptions& options, std::ostream& out,
                               std::ostream& err) {
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
  auto reader = stub->Generate(&context, options.request);
  v1::GenerateResponse response;
  std::vector<uint32_t> ids;
  std::string text;
  v1::GenerateResponse last;
  while (reader->Read(&response)) {
    ids.insert(ids.end(), response.token_ids().begin(), response.token_ids().end());
    text += response.text();
    if (options.stream_text) out << response.text() << std::flush;
    last = response;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(options.server, ": ", status.error_message()));
  }
  if (options.stream_text) {
    out << "\n" << std::flush;
    err << "[finish: " << FinishName(last.finish_reason()) << "]\n";
    return absl::OkStatus();
  }
  nlohmann::json json;
  json["token_ids"] = ids;
  json["text"] = text;
  json["finish_reason"] = v1::FinishReason_Name(last.finish_reason());
  json["usage"] = {{"prompt_tokens", last.usage().prompt_tokens()},
                   {"completion_tokens", last.usage().completion_tokens()},
                   {"time_to_first_token_ms", last.usage().time_to_first_token_ms()},
                   {"decode_tokens_per_second", last.usage().decode_tokens_per_second()}};
  out << json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

namespace {

absl::Status FromGrpc(const grpc::Status& status, const AdminTarget& admin) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(admin.address, ": ", status.error_message()));
}

}  // namespace

absl::Status RunStats(const AdminTarget& admin, std::ostream& out) {
  v1::StatsResponse response;
  const grpc::Status status =
      admin.Stub()->Stats(admin.Context(absl::Seconds(10)).get(), v1::StatsRequest(), &response);
  if (!status.ok()) return FromGrpc(status, admin);
  out << ToJson(response).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

absl::Status RunSetHotRatio(const AdminTarget& admin, const std::string& value, std::ostream& out) {
  v1::SetHotRatioRequest request;
  const absl::StatusOr<std::optional<float>> ratio = ParseHotRatio(value);
  if (!ratio.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--hot-ratio: ", ratio.status().message()));
  }
  if (ratio->has_value()) {
    request.set_hot_ratio(**ratio);
  } else {
    request.set_automatic(true);
  }
  v1::SetHotRatioResponse response;
  const grpc::Status status =
      admin.Stub()->SetHotRatio(admin.Context(absl::Seconds(10)).get(), request, &response);
  if (!status.ok()) return FromGrpc(status, admin);
  out << "{\"hot_ratio\": " << response.hot_ratio()
      << ", \"automatic\": " << (response.automatic() ? "true" : "false") << "}\n";
  return absl::OkStatus();
}

absl::Status RunResizeKvCache(const AdminTarget& admin, int blocks, std::ostream& out) {
  if (blocks <= 0) return absl::InvalidArgumentError("--kv-blocks must be positive");
  v1::ResizeKvCacheRequest request;
  request.set_blocks(static_cast<uint32_t>(blocks));
  v1::ResizeKvCacheResponse response;
  const grpc::Status status =
      admin.Stub()->ResizeKvCache(admin.Context(absl::Seconds(30)).get(), request, &response);
  if (!status.ok()) return FromGrpc(status, admin);
  out << "{\"blocks\": " << response.blocks() << ", \"moved_blocks\": " << response.moved_blocks()
      << ", \"millis\": " << response.millis() << "}\n";
  return absl::OkStatus();
}

}  // namespace strata
