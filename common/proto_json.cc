#include "common/proto_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace trainstep {

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = pretty;
  std::string out;
  // Serialising a well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

namespace {

// The shortest decimal that reads back as the same double ("0.05", not 0.050000000000000003).
std::string ShortestDouble(double v) {
  for (int precision = 15; precision <= 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

}  // namespace

std::string RecordToJson(const google::protobuf::Message& record) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = record.GetDescriptor();
  const google::protobuf::Reflection* r = record.GetReflection();
  std::string out = "{";
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    absl::StrAppend(&out, i == 0 ? "" : ",", "\"", f->name(), "\":");
    // An optional field that is unset (an update that was not evaluated) has no value.
    if (f->has_presence() && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE &&
        !r->HasField(record, f)) {
      absl::StrAppend(&out, "null");
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        absl::StrAppend(&out, r->GetInt32(record, f));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        absl::StrAppend(&out, r->GetInt64(record, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        absl::StrAppend(&out, r->GetUInt32(record, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        absl::StrAppend(&out, r->GetUInt64(record, f));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const double v = f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ? r->GetDouble(record, f)
                                                                          : r->GetFloat(record, f);
        absl::StrAppend(&out, std::isfinite(v) ? ShortestDouble(v) : "null");
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        absl::StrAppend(&out, r->GetBool(record, f) ? "true" : "false");
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        absl::StrAppend(&out, JsonQuote(r->GetEnum(record, f)->name()));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        absl::StrAppend(&out, JsonQuote(r->GetString(record, f)));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        absl::StrAppend(&out, ToJson(r->GetMessage(record, f)));
        break;
    }
  }
  out += "}";
  return out;
}

}  // namespace trainstep
