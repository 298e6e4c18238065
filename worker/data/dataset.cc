#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/env.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "core/random.h"
#include "core/spec.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/data/tokens.h"

namespace trainstep::data {
namespace {

namespace fs = std::filesystem;
namespace pb = ::google::protobuf;

// ---------------------------------------------------------------------------------------
// Fingerprint: FNV-1a 64, little-endian fixed-width fields, lengths before contents so that
// moving a token from one sample to the next changes the hash.

class FingerprintHasher {
 public:
  void Bytes(const void* data, size_t n) { h_ = Fnv1a64(data, n, h_); }
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 8);
  }
  void U32(uint32_t v) {
    unsigned char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 4);
  }
  void Ints(const std::vector<int32_t>& v) {
    U64(v.size());
    for (int32_t x : v) U32(static_cast<uint32_t>(x));
  }
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    for (float x : v) {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof(bits));
      U32(bits);
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kFnv1a64Offset;
};

std::string Fingerprint(const std::vector<Sample>& samples) {
  FingerprintHasher h;
  h.U64(samples.size());
  for (const Sample& s : samples) {
    h.Ints(s.input_ids);
    h.Ints(s.labels);
    h.Floats(s.features);
    h.Floats(s.targets);
  }
  return absl::StrFormat("%016x", h.value());
}

// ---------------------------------------------------------------------------------------
// File-system helpers.

absl::Status FsError(const std::string& field, const std::string& path, const std::error_code& ec) {
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
    return absl::NotFoundError(absl::StrCat(field, ": ", path, " does not exist"));
  }
  return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                      absl::StrCat(field, ": ", path, ": ", ec.message()));
}

// The regular files named by `path` (itself, or every regular file below it), appended to
// `files`. Symbolic links to files count as files; links to directories are not followed.
absl::Status CollectFiles(const std::string& field, const std::string& path,
                          const AllowedRoots& roots, std::vector<std::string>& files) {
  RETURN_IF_ERROR(roots.Check(field, path));
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (!ec) ec = std::make_error_code(std::errc::no_such_file_or_directory);
    return FsError(field, path, ec);
  }
  if (fs::is_regular_file(st)) {
    files.push_back(path);
    return absl::OkStatus();
  }
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " is neither a regular file nor a directory"));
  }
  fs::recursive_directory_iterator it(path, ec);
  if (ec) return FsError(field, path, ec);
  while (it != fs::recursive_directory_iterator()) {
    std::error_code entry_ec;  // a dangling link is simply not a regular file
    if (it->is_regular_file(entry_ec)) {
      RETURN_IF_ERROR(roots.Check(field, it->path().string()));
      files.push_back(it->path().string());
    }
    it.increment(ec);
    if (ec) return FsError(field, path, ec);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Token limits

// What the model accepts: the vocabulary and, when the model declares one, the context.
struct TokenLimits {
  int64_t vocab = 256;
  std::string vocab_source;  // what says so, for messages (ModelVocabSource)
  std::optional<int64_t> max_len;
};

TokenLimits LimitsOf(const v1::JobSpec& spec) {
  TokenLimits limits;
  limits.vocab = ModelVocabSize(spec);
  limits.vocab_source = ModelVocabSource(spec);
  if (spec.model().has_tiny_gpt()) limits.max_len = spec.model().tiny_gpt().seq_len();
  return limits;
}

// ---------------------------------------------------------------------------------------
// text

absl::StatusOr<std::vector<Sample>> LoadText(const v1::JobSpec& spec, const AllowedRoots& roots) {
  const v1::TextData& text = spec.data().text();
  const TokenLimits limits = LimitsOf(spec);
  std::vector<std::string> files;
  for (int i = 0; i < text.paths_size(); ++i) {
    RETURN_IF_ERROR(
        CollectFiles(absl::StrCat("data.text.paths[", i, "]"), text.paths(i), roots, files));
  }
  // One order on every machine, whatever order the OS lists directories in. A file named
  // twice (a directory and a file in it) is read once.
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());

  std::string stream;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::string bytes, Env::Default()->ReadFile(file));
    if (limits.vocab < 256) {  // a model with fewer ids than there are bytes
      for (size_t i = 0; i < bytes.size(); ++i) {
        const int token = static_cast<unsigned char>(bytes[i]);
        if (token >= limits.vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              file, ": byte ", i, " is ", token, ", not a token id in 0..", limits.vocab - 1, " (",
              limits.vocab_source, "); text data needs a vocabulary of 256"));
        }
      }
    }
    stream += bytes;
  }
  if (stream.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data.text.paths: the %d file(s) found hold %d byte(s); a sample needs at least 2 "
        "tokens (one byte is one token)",
        files.size(), stream.size()));
  }

  if (text.seq_len() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("data.text.seq_len must be ≥ 2, got ",
                                                   text.seq_len(), " (is the spec resolved?)"));
  }
  const size_t seq_len = static_cast<size_t>(text.seq_len());
  std::vector<Sample> samples;
  samples.reserve(stream.size() / seq_len + 1);
  for (size_t begin = 0; begin < stream.size(); begin += seq_len) {
    const size_t end = std::min(stream.size(), begin + seq_len);
    if (end - begin < 2) break;  // a 1-token sample has no target: nothing to learn
    Sample s;
    s.input_ids.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      s.input_ids.push_back(static_cast<unsigned char>(stream[i]));
    }
    s.labels = s.input_ids;
    samples.push_back(std::move(s));
  }
  return samples;
}

// ---------------------------------------------------------------------------------------
// jsonl

// The shortest form that reads back as `v`: "17", "4.5", "1e+300".
std::string FormatNumber(double v) {
  if (std::isfinite(v) && std::floor(v) == v && std::fabs(v) < 9.2e18) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  for (int precision = 6; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string Describe(const pb::Value& v) {
  switch (v.kind_case()) {
    case pb::Value::kNullValue:
      return "null";
    case pb::Value::kNumberValue:
      return FormatNumber(v.number_value());
    case pb::Value::kStringValue:
      return absl::StrCat("the string \"", v.string_value(), "\"");
    case pb::Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case pb::Value::kStructValue:
      return "an object";
    case pb::Value::kListValue:
      return "a list";
    default:
      return "nothing";
  }
}

// A list of integers, or an error naming `key[k]`. `where` is "file:line".
absl::StatusOr<std::vector<int32_t>> IntList(absl::string_view where, absl::string_view key,
                                             const pb::Value& value, const TokenLimits& limits,
                                             bool allow_ignore) {
  if (value.kind_case() != pb::Value::kListValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", key, " must be a list of token ids, got ", Describe(value)));
  }
  const pb::ListValue& list = value.list_value();
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(list.values_size()));
  for (int k = 0; k < list.values_size(); ++k) {
    const pb::Value& item = list.values(k);
    const double x = item.number_value();
    if (item.kind_case() != pb::Value::kNumberValue || !std::isfinite(x) || std::floor(x) != x) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", key, "[", k, "] must be an integer, got ", Describe(item)));
    }
    if (allow_ignore && x == kIgnoreLabel) {
      out.push_back(kIgnoreLabel);
      continue;
    }
    if (x < 0 || x >= static_cast<double>(limits.vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", key, "[", k, "] is ", FormatNumber(x),
                       allow_ignore ? ": must be -100 (not trained) or" : ", not",
                       " a token id in 0..", limits.vocab - 1, " (", limits.vocab_source, ")"));
    }
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

absl::StatusOr<Sample> ParseJsonlLine(absl::string_view where, absl::string_view line,
                                      const TokenLimits& limits) {
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(line);
  if (body.front() != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object {\"input_ids\": [...], \"labels\": [...]}"));
  }
  pb::Struct object;
  const auto parsed =
      pb::util::JsonStringToMessage(pb::StringPiece(line.data(), line.size()), &object);
  if (!parsed.ok()) {
    // Protobuf appends an excerpt and a caret on further lines; the first line is the reason.
    const auto message = parsed.message();
    absl::string_view reason(message.data(), message.size());
    reason = reason.substr(0, reason.find('\n'));
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", reason));
  }

  const auto& fields = object.fields();
  const auto ids_it = fields.find("input_ids");
  if (ids_it == fields.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": input_ids is missing"));
  }
  Sample s;
  ASSIGN_OR_RETURN(s.input_ids, IntList(where, "input_ids", ids_it->second, limits,
                                        /*allow_ignore=*/false));
  if (s.input_ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": input_ids is empty: a sample needs at least one token"));
  }
  if (limits.max_len.has_value() && static_cast<int64_t>(s.input_ids.size()) > *limits.max_len) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": input_ids has ", s.input_ids.size(),
                                                   " tokens, more than model.tiny_gpt.seq_len ",
                                                   *limits.max_len));
  }

  const auto labels_it = fields.find("labels");
  if (labels_it == fields.end() || labels_it->second.kind_case() == pb::Value::kNullValue) {
    s.labels = s.input_ids;
    return s;
  }
  if (labels_it->second.kind_case() == pb::Value::kListValue &&
      labels_it->second.list_value().values_size() != static_cast<int>(s.input_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": labels has ",
                                                   labels_it->second.list_value().values_size(),
                                                   " entries, input_ids ", s.input_ids.size()));
  }
  ASSIGN_OR_RETURN(s.labels, IntList(where, "labels", labels_it->second, limits,
                                     /*allow_ignore=*/true));
  return s;
}

absl::StatusOr<std::vector<Sample>> LoadJsonl(const v1::JobSpec& spec, const AllowedRoots& roots) {
  const std::string& path = spec.data().jsonl().path();
  RETURN_IF_ERROR(roots.Check("data.jsonl.path", path));
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (!ec) ec = std::make_error_code(std::errc::no_such_file_or_directory);
    return FsError("data.jsonl.path", path, ec);
  }
  if (fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.jsonl.path: ", path, " is a directory, not a file"));
  }
  ASSIGN_OR_RETURN(const std::string content, Env::Default()->ReadFile(path));
  const TokenLimits limits = LimitsOf(spec);

  std::vector<Sample> samples;
  absl::string_view rest(content);
  rest = absl::StripPrefix(rest, "\xEF\xBB\xBF");  // a byte-order mark some editors write
  for (int line_no = 1; !rest.empty(); ++line_no) {
    const size_t newline = rest.find('\n');
    absl::string_view line = rest.substr(0, newline);
    rest = newline == absl::string_view::npos ? absl::string_view() : rest.substr(newline + 1);
    line = absl::StripSuffix(line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    ASSIGN_OR_RETURN(Sample s, ParseJsonlLine(absl::StrCat(path, ":", line_no), line, limits));
    samples.push_back(std::move(s));
  }
  if (samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.jsonl.path: ", path, " holds no samples (no non-blank line)"));
  }
  return samples;
}

// ---------------------------------------------------------------------------------------
// synthetic_regression

absl::StatusOr<std::vector<Sample>> LoadSynthetic(const v1::JobSpec& spec) {
  const v1::SyntheticRegression& r = spec.data().synthetic_regression();
  const int64_t n = r.samples();
  const int64_t in = r.in_features();
  const int64_t out = spec.model().has_mlp() ? spec.model().mlp().out_features() : 1;
  constexpr int64_t kMaxFloats = int64_t{1} << 30;  // 4 GiB of floats
  if (n <= 0 || in <= 0 || out <= 0 || n > kMaxFloats / (in + out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic_regression: ", n, " samples × (", in, " features + ", out,
                     " targets) must be between 1 and ", kMaxFloats, " numbers"));
  }

  // W ~ N(0, 1/in): y has about unit variance whatever in_features is.
  std::vector<double> w(static_cast<size_t>(out * in));
  Gaussian wg(DeriveSeed(spec.seed(), kSyntheticWeightsStream, 0));
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(in));
  for (double& x : w) x = wg.Next() * w_scale;

  std::vector<Sample> samples(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Sample& s = samples[static_cast<size_t>(i)];
    // One generator per sample: sample i is the same whatever the sample count.
    Gaussian g(DeriveSeed(spec.seed(), kSyntheticSampleStream, static_cast<uint64_t>(i)));
    s.features.resize(static_cast<size_t>(in));
    for (float& x : s.features) x = static_cast<float>(g.Next());
    // The targets follow from the stored (float) features, so y is exactly reproducible
    // from the data a model sees.
    const double nonlinear = 0.1 * std::sin(static_cast<double>(s.features[0]));
    s.targets.resize(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double y = nonlinear;
      for (int64_t j = 0; j < in; ++j) {
        y += w[static_cast<size_t>(o * in + j)] *
             static_cast<double>(s.features[static_cast<size_t>(j)]);
      }
      s.targets[static_cast<size_t>(o)] = static_cast<float>(y);
    }
  }
  return samples;
}

}  // namespace

int64_t ValidTokens(const Sample& s) {
  int64_t n = 0;
  for (size_t t = 1; t < s.labels.size(); ++t) n += s.labels[t] != kIgnoreLabel;
  return n;
}

int64_t ValidTokens(const Dataset& data, const std::vector<int64_t>& indices) {
  int64_t n = 0;
  for (int64_t i : indices) n += ValidTokens(data.at(i));
  return n;
}

Dataset::Dataset(std::vector<Sample> samples, bool token_level)
    : samples_(std::move(samples)),
      token_level_(token_level),
      fingerprint_(Fingerprint(samples_)) {}

Dataset::Dataset(std::shared_ptr<const TokenFile> tokens)
    : tokens_(std::move(tokens)), token_level_(true), fingerprint_(tokens_->Fingerprint()) {}

int64_t Dataset::size() const {
  return tokens_ != nullptr ? tokens_->samples() : static_cast<int64_t>(samples_.size());
}

Sample Dataset::at(int64_t i) const {
  return tokens_ != nullptr ? tokens_->At(i) : samples_[static_cast<size_t>(i)];
}

Dataset Dataset::FromSamples(std::vector<Sample> samples) {
  const bool token_level = samples.empty() || !samples.front().input_ids.empty();
  return Dataset(std::move(samples), token_level);
}

absl::StatusOr<Dataset> Dataset::Load(const v1::JobSpec& resolved, const AllowedRoots& roots) {
  const v1::Data& data = resolved.data();
  if (IsTokenLevel(resolved) && resolved.model().has_torchscript() &&
      ModelVocabSize(resolved) < 2) {
    // Known once the model is loaded (RecordModelVocabulary): a caller that forgot must not
    // check the ids against a guess.
    return absl::FailedPreconditionError(absl::StrCat(
        "model.torchscript.vocab_size is unset: the data's ids are checked against the model's "
        "vocabulary, so load the model ",
        resolved.model().torchscript().path(), " first"));
  }
  switch (data.source_case()) {
    case v1::Data::kText: {
      ASSIGN_OR_RETURN(std::vector<Sample> samples, LoadText(resolved, roots));
      return Dataset(std::move(samples), /*token_level=*/true);
    }
    case v1::Data::kJsonl: {
      ASSIGN_OR_RETURN(std::vector<Sample> samples, LoadJsonl(resolved, roots));
      return Dataset(std::move(samples), /*token_level=*/true);
    }
    case v1::Data::kSyntheticRegression: {
      ASSIGN_OR_RETURN(std::vector<Sample> samples, LoadSynthetic(resolved));
      return Dataset(std::move(samples), /*token_level=*/false);
    }
    case v1::Data::kTokens: {
      RETURN_IF_ERROR(roots.Check("data.tokens.path", data.tokens().path()));
      ASSIGN_OR_RETURN(std::unique_ptr<TokenFile> file,
                       TokenFile::Open(data.tokens().path(), TokenFormatOf(resolved)));
      return Dataset(std::shared_ptr<const TokenFile>(std::move(file)));
    }
    case v1::Data::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "data is required: one of text, jsonl, synthetic_regression, tokens (is the spec "
      "resolved?)");
}

}  // namespace trainstep::data
