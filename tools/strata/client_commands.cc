#include "tools/strata/client_commands.h"

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/placement/hot_ratio.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {

absl::Status RunRemoteGenerate(const RemoteGenerateOptions& options, std::ostream& out) {
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
    out << "\n";
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

absl::Status RunStats(const std::string& server, std::ostream& out) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse response;
  const grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(server, ": ", status.error_message()));
  }
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(response, &json, options).ok()) {
    return absl::InternalError("cannot print the stats as JSON");
  }
  out << json << "\n";
  return absl::OkStatus();
}

absl::Status RunSetHotRatio(const std::string& server, const std::string& value,
                            std::ostream& out) {
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
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SetHotRatioResponse response;
  const grpc::Status status = stub->SetHotRatio(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(server, ": ", status.error_message()));
  }
  out << "{\"hot_ratio\": " << response.hot_ratio()
      << ", \"automatic\": " << (response.automatic() ? "true" : "false") << "}\n";
  return absl::OkStatus();
}

}  // namespace strata
