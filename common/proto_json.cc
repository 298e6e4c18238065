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

namespace {

// One value of `f` (element `index` of a repeated field, else -1) as RecordToJson writes it.
void AppendValue(std::string* out, const google::protobuf::Message& m,
                 const google::protobuf::FieldDescriptor* f, int index) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        v = rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
      } else {
        v = rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
      }
      absl::StrAppend(out, std::isfinite(v) ? ShortestDouble(v) : "null");
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      absl::StrAppend(
          out, (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      absl::StrAppend(
          out, JsonQuote((rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name()));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      absl::StrAppend(out, JsonQuote(rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      absl::StrAppend(out,
                      RecordToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f)));
      break;
  }
}

}  // namespace

std::string RecordToJson(const google::protobuf::Message& record) {
  const google::protobuf::Descriptor* d = record.GetDescriptor();
  const google::protobuf::Reflection* r = record.GetReflection();
  std::string out = "{";
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    absl::StrAppend(&out, i == 0 ? "" : ",", "\"", f->name(), "\":");
    if (f->is_repeated()) {
      out += "[";
      for (int k = 0; k < r->FieldSize(record, f); ++k) {
        if (k > 0) out += ",";
        AppendValue(&out, record, f, k);
      }
      out += "]";
    } else if (f->has_presence() && !r->HasField(record, f)) {
      out += "null";  // an unset message or optional field: absent, not zero
    } else {
      AppendValue(&out, record, f, -1);
    }
  }
  out += "}";
  return out;
}

}  // namespace trainstep
