#include "services/router/client_request.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

namespace pb = ::google::protobuf;

// Nested messages deeper than this are not a client request of ours.
constexpr int kMaxDepth = 16;

absl::Status CheckFields(const pb::Descriptor& descriptor, absl::string_view wire,
                         const std::string& path, int depth) {
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat("the request nests too deeply at ", path));
  }
  // Read without the schema: no UTF-8 check, no log; only the structure.
  pb::UnknownFieldSet fields;
  if (!fields.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return absl::InvalidArgumentError(
        path.empty() ? absl::StrCat("the request is not a ", descriptor.full_name(), " message")
                     : absl::StrCat("field ", path, " is not a ", descriptor.full_name()));
  }
  for (int i = 0; i < fields.field_count(); ++i) {
    const pb::UnknownField& field = fields.field(i);
    if (field.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const pb::FieldDescriptor* f = descriptor.FindFieldByNumber(field.number());
    if (f == nullptr) continue;
    const std::string name = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    const std::string& value = field.length_delimited();
    if (f->type() == pb::FieldDescriptor::TYPE_STRING && !tokenizer_internal::IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", name, " is not valid UTF-8 text (", value.size(), " bytes)"));
    }
    if (f->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s = CheckFields(*f->message_type(), value, name, depth + 1); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckUtf8Fields(const pb::Descriptor& descriptor, absl::string_view wire) {
  return CheckFields(descriptor, wire, "", 0);
}

absl::Status ParseClientRequest(const grpc::ByteBuffer& buffer, pb::Message& message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable request");
  std::string wire;
  wire.reserve(buffer.Length());
  for (const grpc::Slice& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (absl::Status s = CheckUtf8Fields(*message.GetDescriptor(), wire); !s.ok()) return s;
  if (!message.ParseFromString(wire)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", message.GetDescriptor()->full_name()));
  }
  return absl::OkStatus();
}

absl::Status SerializeResponse(const pb::Message& message, grpc::ByteBuffer& buffer) {
  buffer.Clear();  // a stream's buffer still holds the message written before
  bool own = false;
  const grpc::Status s = grpc::SerializationTraits<pb::Message>::Serialize(message, &buffer, &own);
  if (!s.ok()) return absl::InternalError(absl::StrCat("response: ", s.error_message()));
  return absl::OkStatus();
}

}  // namespace strata
