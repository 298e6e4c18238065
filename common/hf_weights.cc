#include "common/hf_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace trainstep {
namespace {

constexpr char kConfig[] = "config.json";
constexpr char kLayout[] =
    "a directory in Hugging Face layout: config.json and model.safetensors, or "
    "model.safetensors.index.json and its shards";

absl::Status ErrnoError(int e, absl::string_view field, const std::string& path,
                        absl::string_view what) {
  if (e == ENOENT || e == ENOTDIR) {
    return absl::NotFoundError(absl::StrCat(field, ": ", path, " does not exist (", what, ")"));
  }
  return absl::Status(absl::ErrnoToStatusCode(e),
                      absl::StrCat(field, ": ", path, ": ", std::strerror(e)));
}

// An open regular file: its descriptor and size. Anything else is an error naming it.
absl::StatusOr<std::pair<int, size_t>> OpenRegular(absl::string_view field, const std::string& path,
                                                   absl::string_view what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, field, path, what);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return ErrnoError(e, field, path, what);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " is not a regular file (", what, ")"));
  }
  return std::make_pair(fd, static_cast<size_t>(st.st_size));
}

absl::StatusOr<std::string> ReadSmall(absl::string_view field, const std::string& path,
                                      absl::string_view what) {
  ASSIGN_OR_RETURN(auto opened, OpenRegular(field, path, what));
  auto closer = absl::MakeCleanup([fd = opened.first] { close(fd); });
  if (opened.second > kMaxHfJsonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " has ", opened.second,
                                                   " bytes; ", what, " has at most ",
                                                   kMaxHfJsonBytes));
  }
  std::string text(opened.second, '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = read(opened.first, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, field, path, what);
    if (n == 0) break;  // shrank while read: what is there is parsed, and fails if cut
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A shard's name from the index: a plain file name in the directory, nothing that climbs out.
absl::Status CheckShardName(absl::string_view field, const std::string& index,
                            absl::string_view tensor, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/') ||
      absl::StrContains(name, '\0') || !absl::EndsWith(name, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", index, " maps tensor ", ckpt::internal::QuotedName(tensor),
                     " to ", ckpt::internal::QuotedName(name),
                     ", which is not a .safetensors file name in the same directory"));
  }
  return absl::OkStatus();
}

}  // namespace

HfWeights::~HfWeights() {
  for (const Mapping& m : mappings_) munmap(const_cast<char*>(m.data), m.size);
}

void HfWeights::ReleasePages(absl::string_view bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

uint64_t HfWeights::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, t] : tensors_) total += t.bytes.size();
  return total;
}

absl::Status HfWeights::AddFile(const std::string& name, const AllowedRoots& roots,
                                absl::string_view field) {
  const std::string path = absl::StrCat(dir_, "/", name);
  RETURN_IF_ERROR(roots.Check(field, path));
  ASSIGN_OR_RETURN(auto opened, OpenRegular(field, path, "a safetensors file of the model"));
  auto closer = absl::MakeCleanup([fd = opened.first] { close(fd); });
  const size_t size = opened.second;
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " has ", size, " bytes: truncated (a safetensors file has at least 8)"));
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened.first, 0);
  if (m == MAP_FAILED) return ErrnoError(errno, field, path, "a safetensors file of the model");
  mappings_.push_back({static_cast<const char*>(m), size});
  absl::StatusOr<ckpt::SafetensorsHeader> header =
      ckpt::ParseSafetensorsHeader(absl::string_view(static_cast<const char*>(m), size));
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, ": ", header.status().message()));
  }
  for (ckpt::SafetensorsEntry& e : header->entries) {
    Tensor t{name, e.dtype, std::move(e.shape), header->data.substr(e.begin, e.end - e.begin)};
    auto [it, inserted] = tensors_.emplace(e.name, std::move(t));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": tensor ", ckpt::internal::QuotedName(e.name), " is in both ",
                       it->second.file, " and ", name, " of ", dir_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HfWeights>> HfWeights::Open(const std::string& dir,
                                                           const AllowedRoots& roots,
                                                           absl::string_view field) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> w, OpenDir(dir, roots, field));
  const std::string config = absl::StrCat(w->dir_, "/", kConfig);
  RETURN_IF_ERROR(roots.Check(field, config));
  ASSIGN_OR_RETURN(w->config_json_, ReadSmall(field, config, kLayout));
  RETURN_IF_ERROR(w->AddWeights(roots, field));
  return w;
}

absl::StatusOr<std::unique_ptr<HfWeights>> HfWeights::OpenTensors(const std::string& dir,
                                                                  const AllowedRoots& roots,
                                                                  absl::string_view field) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> w, OpenDir(dir, roots, field));
  RETURN_IF_ERROR(w->AddWeights(roots, field));
  return w;
}

absl::StatusOr<std::unique_ptr<HfWeights>> HfWeights::OpenDir(const std::string& dir,
                                                              const AllowedRoots& roots,
                                                              absl::string_view field) {
  std::unique_ptr<HfWeights> w(new HfWeights());
  w->dir_ = dir;
  while (w->dir_.size() > 1 && w->dir_.back() == '/') w->dir_.pop_back();
  RETURN_IF_ERROR(roots.Check(field, w->dir_));
  if (!IsDirectory(w->dir_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", dir, " is not a directory; it must be ", kLayout));
  }
  return w;
}

absl::Status HfWeights::AddWeights(const AllowedRoots& roots, absl::string_view field) {
  const std::string& dir = dir_;
  const std::string index = absl::StrCat(dir_, "/", kHfIndexFile);
  struct stat st;
  if (lstat(index.c_str(), &st) != 0) {
    if (lstat(absl::StrCat(dir_, "/", kHfSingleFile).c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(field, ": ", dir, " has neither ", kHfSingleFile,
                                              " nor ", kHfIndexFile, "; it must be ", kLayout));
    }
    return AddFile(kHfSingleFile, roots, field);
  }
  // Sharded: the index's weight_map says which shard holds each tensor; the shards together
  // hold exactly those tensors, each where the index says.
  RETURN_IF_ERROR(roots.Check(field, index));
  ASSIGN_OR_RETURN(const std::string index_text, ReadSmall(field, index, kLayout));
  absl::StatusOr<google::protobuf::Struct> parsed =
      ckpt::internal::ParseJsonObject(index_text, /*max_depth=*/8, kHfIndexFile);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", index, ": ", parsed.status().message()));
  }
  const auto map_it = parsed->fields().find("weight_map");
  if (map_it == parsed->fields().end() || !map_it->second.has_struct_value() ||
      map_it->second.struct_value().fields().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", index, " has no weight_map (an object from tensor name to shard file)"));
  }
  std::map<std::string, std::string> weight_map;  // sorted: shards open in a fixed order
  std::set<std::string> shards;
  for (const auto& [tensor, file] : map_it->second.struct_value().fields()) {
    if (!file.has_string_value()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", index, ": weight_map's ",
                                                     ckpt::internal::QuotedName(tensor),
                                                     " must be a shard's file name (a string)"));
    }
    RETURN_IF_ERROR(CheckShardName(field, index, tensor, file.string_value()));
    weight_map.emplace(tensor, file.string_value());
    shards.insert(file.string_value());
  }
  for (const std::string& shard : shards) RETURN_IF_ERROR(AddFile(shard, roots, field));
  for (const auto& [tensor, file] : weight_map) {
    auto it = tensors_.find(tensor);
    if (it == tensors_.end() || it->second.file != file) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", index, " puts tensor ", ckpt::internal::QuotedName(tensor), " in ", file,
          ", which does not hold it", it == tensors_.end() ? "" : " (it is in ",
          it == tensors_.end() ? "" : it->second.file, it == tensors_.end() ? "" : ")"));
    }
  }
  for (const auto& [tensor, t] : tensors_) {
    if (weight_map.count(tensor) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", t.file, " of ", dir, " holds tensor ", ckpt::internal::QuotedName(tensor),
          ", which ", kHfIndexFile, " does not list"));
    }
  }
  return absl::OkStatus();
}

std::string HfShardFileName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index, count);
}

std::vector<int> PlanHfShards(const std::vector<uint64_t>& sizes, uint64_t max_bytes) {
  std::vector<int> shard(sizes.size(), 0);
  int current = 0;
  uint64_t filled = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (filled > 0 && filled + sizes[i] > max_bytes) {
      ++current;
      filled = 0;
    }
    shard[i] = current;
    filled += sizes[i];
  }
  return shard;
}

std::string HfIndexJson(uint64_t total_size, const std::map<std::string, std::string>& weight_map) {
  std::string out = absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", total_size,
                                 "\n  },\n  \"weight_map\": {");
  bool first = true;
  for (const auto& [tensor, file] : weight_map) {
    absl::StrAppend(&out, first ? "\n" : ",\n", "    ", JsonQuote(tensor), ": ", JsonQuote(file));
    first = false;
  }
  out += "\n  }\n}\n";
  return out;
}

}  // namespace trainstep
