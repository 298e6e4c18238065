#include "common/safetensors_format.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_nesting.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace trainstep::ckpt {

using internal::QuotedName;

namespace {

using google::protobuf::Value;

constexpr char kMetadataKey[] = "__metadata__";
// Header object → tensor entry → shape / data_offsets list. Anything deeper is invalid anyway.
constexpr int kMaxHeaderNesting = 3;
// JSON numbers are doubles: above 2^53 an integer may already have been rounded.
constexpr double kTwoPow53 = 9007199254740992.0;
// Elements of a shape, counting 0 dims as 1: keeps LibTorch's stride arithmetic in int64.
constexpr uint64_t kMaxElements = uint64_t{1} << 62;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF64, "F64", 8}, {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2}, {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8}, {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kI16, "I16", 2}, {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU8, "U8", 1},   {SafetensorsDtype::kBool, "BOOL", 1},
};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[0];  // Unreachable: every enumerator is in the table.
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// A JSON number that must be a non-negative integer small enough to be exact as a double.
absl::StatusOr<uint64_t> ToIndex(const Value& v, absl::string_view what) {
  if (v.kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a number"));
  }
  const double d = v.number_value();
  if (!(d >= 0) || d >= kTwoPow53 || d != std::floor(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", d, ", not a non-negative integer below 2^53"));
  }
  return static_cast<uint64_t>(d);
}

const Value* Field(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Value& value,
                                            uint64_t data_size) {
  SafetensorsEntry e;
  e.name = name;
  const auto fail = [&name](absl::string_view problem) {
    return internal::TensorError(name, problem);
  };
  if (value.kind_case() != Value::kStructValue) return fail("entry is not a JSON object");
  const google::protobuf::Struct& entry = value.struct_value();
  // The first unknown key in sorted order, so the error does not depend on hash-map order.
  const std::string* unknown = nullptr;
  for (const auto& [key, unused] : entry.fields()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets" &&
        (unknown == nullptr || key < *unknown)) {
      unknown = &key;
    }
  }
  if (unknown != nullptr) return fail(absl::StrCat("unknown field ", QuotedName(*unknown)));

  const Value* dtype = Field(entry, "dtype");
  if (dtype == nullptr) return fail("missing \"dtype\"");
  if (dtype->kind_case() != Value::kStringValue) return fail("\"dtype\" is not a string");
  std::optional<SafetensorsDtype> type = SafetensorsDtypeFromName(dtype->string_value());
  if (!type) {
    return fail(absl::StrCat("unknown dtype ", QuotedName(dtype->string_value()),
                             " (supported: ", SupportedSafetensorsDtypes(), ")"));
  }
  e.dtype = *type;

  const Value* shape = Field(entry, "shape");
  if (shape == nullptr) return fail("missing \"shape\"");
  if (shape->kind_case() != Value::kListValue) return fail("\"shape\" is not a list");
  // Counting 0 dims as 1 bounds every stride LibTorch derives, even for empty tensors.
  uint64_t elements_ignoring_zeros = 1;
  bool has_zero_dim = false;
  for (int i = 0; i < shape->list_value().values_size(); ++i) {
    absl::StatusOr<uint64_t> dim =
        ToIndex(shape->list_value().values(i), absl::StrCat("shape[", i, "]"));
    if (!dim.ok()) return fail(dim.status().message());
    if (*dim == 0) {
      has_zero_dim = true;
    } else if (__builtin_mul_overflow(elements_ignoring_zeros, *dim, &elements_ignoring_zeros) ||
               elements_ignoring_zeros > kMaxElements) {
      return fail("shape has too many elements");
    }
    e.shape.push_back(static_cast<int64_t>(*dim));
  }
  const uint64_t elements = has_zero_dim ? 0 : elements_ignoring_zeros;
  const uint64_t nbytes = elements * SafetensorsElementSize(e.dtype);  // <= 2^62 * 8: no overflow.

  const Value* offsets = Field(entry, "data_offsets");
  if (offsets == nullptr) return fail("missing \"data_offsets\"");
  if (offsets->kind_case() != Value::kListValue || offsets->list_value().values_size() != 2) {
    return fail("\"data_offsets\" is not a list of two numbers");
  }
  absl::StatusOr<uint64_t> begin = ToIndex(offsets->list_value().values(0), "data_offsets[0]");
  if (!begin.ok()) return fail(begin.status().message());
  absl::StatusOr<uint64_t> end = ToIndex(offsets->list_value().values(1), "data_offsets[1]");
  if (!end.ok()) return fail(end.status().message());
  e.begin = *begin;
  e.end = *end;
  const std::string range = absl::StrCat("data_offsets [", e.begin, ",", e.end, "]");
  if (e.end < e.begin) return fail(absl::StrCat(range, " end before they begin"));
  if (e.end > data_size) {
    return fail(
        absl::StrCat(range, " are out of range: the data section has ", data_size, " bytes"));
  }
  if (e.end - e.begin != nbytes) {
    return fail(absl::StrCat(range, " hold ", e.end - e.begin, " bytes but shape ",
                             ShapeString(e.shape), " of ", dtype->string_value(), " needs ",
                             nbytes));
  }
  return e;
}

absl::StatusOr<Metadata> ParseMetadata(const Value& value) {
  Metadata metadata;
  if (value.kind_case() == Value::kNullValue) return metadata;  // Rust's Option::None.
  if (value.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("\"__metadata__\" is not a JSON object");
  }
  // In key order: protobuf's map iterates in an order that differs from one parse to the
  // next, and which bad value is named must not (the safetensors fuzzer's finding).
  std::map<std::string, const Value*> by_key;
  for (const auto& [key, v] : value.struct_value().fields()) by_key.emplace(key, &v);
  for (const auto& [key, v] : by_key) {
    if (v->kind_case() != Value::kStringValue) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"__metadata__\" value of ", QuotedName(key), " is not a string"));
    }
    metadata.emplace(key, v->string_value());
  }
  return metadata;
}

// Checks the packing: sorted by offset, each tensor starts where the previous one ended and
// the last one ends where the data does (the reference implementation's rule).
absl::Status CheckLayout(const std::vector<SafetensorsEntry>& entries, uint64_t data_size) {
  std::vector<const SafetensorsEntry*> order;
  order.reserve(entries.size());
  for (const SafetensorsEntry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : order) {
    const std::string range = absl::StrCat("data_offsets [", e->begin, ",", e->end, "]");
    if (e->begin < expected) {
      return internal::TensorError(
          e->name, absl::StrCat(range, " overlap tensor ", QuotedName(previous->name), " at [",
                                previous->begin, ",", previous->end, "]"));
    }
    if (e->begin > expected) {
      return internal::TensorError(e->name, absl::StrCat(range, " leave a gap: bytes [", expected,
                                                         ",", e->begin, ") belong to no tensor"));
    }
    expected = e->end;
    previous = e;
  }
  if (expected != data_size) {
    return absl::InvalidArgumentError(absl::StrCat("the data section has ", data_size,
                                                   " bytes but the tensors cover only ", expected));
  }
  return absl::OkStatus();
}

// Everything but allocating tensors. Every offset into `bytes` is checked before it is used.
}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("file has ", bytes.size(), " bytes, fewer than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header length ", n, " exceeds the ", bytes.size() - 8, " bytes after the length field"));
  }
  const absl::string_view json = bytes.substr(8, n);
  SafetensorsHeader out;
  out.data = bytes.substr(8 + n);

  ASSIGN_OR_RETURN(const google::protobuf::Struct header,
                   internal::ParseJsonObject(json, kMaxHeaderNesting, "header"));

  // Sorted names: the first error reported does not depend on hash-map order.
  std::vector<std::string> names;
  names.reserve(header.fields_size());
  for (const auto& [name, unused] : header.fields()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const Value& value = header.fields().at(name);
    if (name == kMetadataKey) {
      ASSIGN_OR_RETURN(out.metadata, ParseMetadata(value));
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(name, value, out.data.size()));
    out.entries.push_back(std::move(e));
  }
  RETURN_IF_ERROR(CheckLayout(out.entries, out.data.size()));

  // Any other byte in a bool is undefined behaviour in LibTorch's kernels.
  for (const SafetensorsEntry& e : out.entries) {
    if (e.dtype != SafetensorsDtype::kBool) continue;
    for (uint64_t i = e.begin; i < e.end; ++i) {
      const auto byte = static_cast<unsigned char>(out.data[i]);
      if (byte > 1) {
        return internal::TensorError(e.name, absl::StrCat("BOOL element ", i - e.begin, " is byte ",
                                                          static_cast<int>(byte), ", not 0 or 1"));
      }
    }
  }
  return out;
}

absl::Status ValidateSafetensors(absl::string_view bytes) {
  return ParseSafetensorsHeader(bytes).status();
}

absl::StatusOr<std::string> SafetensorsFilePrefix(const std::vector<SafetensorsTensorInfo>& tensors,
                                                  const Metadata& metadata, uint64_t* data_bytes) {
  std::string header = "{";
  if (!metadata.empty()) {
    absl::StrAppend(&header, "\"", kMetadataKey, "\":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!internal::IsValidUtf8(key) || !internal::IsValidUtf8(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("metadata entry ", internal::QuotedName(key), " is not valid UTF-8"));
      }
      absl::StrAppend(&header, first ? "" : ",", JsonQuote(key), ":", JsonQuote(value));
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const SafetensorsTensorInfo& t : tensors) {
    if (t.name == kMetadataKey) {
      return internal::TensorError(t.name, "the name is reserved for metadata");
    }
    if (!internal::IsValidUtf8(t.name)) {
      return internal::TensorError(t.name, "the name is not valid UTF-8");
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return internal::TensorError(t.name, "a dimension is negative");
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t nbytes = elements * SafetensorsElementSize(t.dtype);
    absl::StrAppend(&header, header.size() > 1 ? "," : "", JsonQuote(t.name), ":{\"dtype\":\"",
                    SafetensorsDtypeName(t.dtype), "\",\"shape\":[", absl::StrJoin(t.shape, ","),
                    "],\"data_offsets\":[", offset, ",", offset + nbytes, "]}");
    offset += nbytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header of ", header.size(), " bytes exceeds the limit of ", kMaxSafetensorsHeaderBytes));
  }
  const uint64_t n = header.size();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  prefix += header;
  if (data_bytes != nullptr) *data_bytes = offset;
  return prefix;
}

const char* SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }

std::optional<SafetensorsDtype> SafetensorsDtypeFromName(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

size_t SafetensorsElementSize(SafetensorsDtype dtype) { return Info(dtype).size; }

std::string SupportedSafetensorsDtypes() {
  std::vector<absl::string_view> names;
  for (const DtypeInfo& d : kDtypes) names.push_back(d.name);
  return absl::StrJoin(names, ", ");
}

namespace internal {

std::string QuotedName(absl::string_view name) {
  return absl::StrCat("'", absl::CHexEscape(name), "'");
}

absl::Status TensorError(absl::string_view name, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", QuotedName(name), ": ", problem));
}

absl::StatusOr<google::protobuf::Struct> ParseJsonObject(absl::string_view json, int max_depth,
                                                         absl::string_view what) {
  if (absl::Status s = CheckJsonNesting(json, max_depth); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is invalid: ", s.message()));
  }
  google::protobuf::Struct object;
  // The parser reads std::string; absl::string_view is not std::string_view in this Abseil.
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &object);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: ", parsed.message().as_string()));
  }
  return object;
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned cc = p[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace internal
}  // namespace trainstep::ckpt
