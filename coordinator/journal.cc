#include "coordinator/journal.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "coordinator/crc32c.h"

namespace trainstep {
namespace {

constexpr std::string_view kMagic = "TSJOURNL";
constexpr uint32_t kFormatVersion = 2;
constexpr size_t kFileHeaderSize = 16;    // magic + fixed32 version + fixed32 kind
constexpr size_t kRecordHeaderSize = 12;  // length + payload CRC + header CRC
constexpr char kEndMarker = '\xA5';
constexpr size_t kLegacyHeaderSize = 8;  // format 1: length + payload CRC
// Looking for intact format-1 records after a damaged length costs CRC passes; past this many
// bytes the search gives up and the damage counts as corruption (never as a torn tail).
constexpr uint64_t kMaxLegacyResyncBytes = uint64_t{64} << 20;

constexpr std::string_view kLogPrefix = "log-";
constexpr std::string_view kSnapshotPrefix = "snapshot-";
constexpr std::string_view kTempSuffix = ".tmp";

enum class FileKind : uint32_t { kLog = 1, kSnapshot = 2 };

const char* KindName(uint32_t kind) {
  switch (static_cast<FileKind>(kind)) {
    case FileKind::kLog:
      return "a log";
    case FileKind::kSnapshot:
      return "a snapshot";
  }
  return "of an unknown kind";
}

std::string LogName(uint64_t n) { return absl::StrFormat("log-%06d", n); }
std::string SnapshotName(uint64_t n) { return absl::StrFormat("snapshot-%06d", n); }

// This Abseil's absl::string_view is its own type, not std::string_view.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Accepts only names this file writes, so a stray "log-01" never aliases log-000001.
std::optional<uint64_t> ParseNumber(std::string_view name, std::string_view prefix,
                                    std::string (*format)(uint64_t)) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    return std::nullopt;
  }
  uint64_t n;
  if (!absl::SimpleAtoi(AsAbsl(digits), &n) || n == 0) return std::nullopt;
  if (format(n) != name) return std::nullopt;
  return n;
}

bool IsSnapshotTemp(std::string_view name) {
  if (name.size() <= kTempSuffix.size()) return false;
  const size_t stem = name.size() - kTempSuffix.size();
  return name.substr(stem) == kTempSuffix &&
         ParseNumber(name.substr(0, stem), kSnapshotPrefix, &SnapshotName).has_value();
}

void PutFixed32(std::string* out, uint32_t v) {
  const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 24)};
  out->append(b, 4);
}

uint32_t GetFixed32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) | (static_cast<uint32_t>(u[3]) << 24);
}

std::string FileHeader(FileKind kind) {
  std::string header(kMagic);
  PutFixed32(&header, kFormatVersion);
  PutFixed32(&header, static_cast<uint32_t>(kind));
  return header;
}

// The 12 bytes before a record's payload; the payload is followed by kEndMarker.
std::string RecordHeader(std::string_view payload) {
  std::string header;
  PutFixed32(&header, static_cast<uint32_t>(payload.size()));
  PutFixed32(&header, MaskCrc(Crc32c(payload)));
  PutFixed32(&header, MaskCrc(Crc32c(header)));
  return header;
}

bool AllZero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == 0; });
}

// `data` from `offset` on, or empty.
std::string_view From(std::string_view data, size_t offset) {
  return offset >= data.size() ? std::string_view() : data.substr(offset);
}

absl::Status Corrupt(const std::string& path, size_t offset, const std::string& problem) {
  return absl::DataLossError(absl::StrFormat(
      "journal file %s is damaged at byte offset %d: %s; refusing to open (nothing was changed): "
      "the journal must be repaired or restored by hand. If the records from that offset on may "
      "be lost, keep a copy of the file and truncate it to %d bytes",
      path, offset, problem, offset));
}

// What reading one journal file found.
struct ScanResult {
  int format = kFormatVersion;
  std::vector<std::string> records;
  size_t intact_bytes = 0;        // Offset just past the last intact record (or the file header).
  std::string tail_problem;       // Non-empty iff the bytes after intact_bytes are a torn tail.
  bool torn_file_header = false;  // The file is a torn file header (created, never written).
};

// Damage at `offset` of a file: a torn tail if `torn`, else corruption.
absl::StatusOr<ScanResult> Damaged(ScanResult result, const std::string& path, size_t offset,
                                   const std::string& problem, bool torn, bool tail_may_be_torn) {
  if (!torn) return Corrupt(path, offset, problem);
  if (!tail_may_be_torn) {
    return Corrupt(path, offset,
                   absl::StrCat("torn record (", problem,
                                ") where none may be: only the newest log may end torn"));
  }
  result.intact_bytes = offset;
  result.tail_problem = problem;
  return result;
}

// The torn tails both formats share at `off`: nothing but zeros up to EOF, or a record header
// that EOF cuts short. nullopt when neither.
std::optional<std::string> CutShort(std::string_view data, size_t off, size_t header_size) {
  if (AllZero(data.substr(off))) return "only zero bytes from the record start to end of file";
  const size_t left = data.size() - off;
  if (left >= header_size) return std::nullopt;
  return absl::StrFormat("incomplete record header (%d of %d bytes)", left, header_size);
}

// Format 2 records from `start` on. Under the crash model of Journal::Open, see the cases.
absl::StatusOr<ScanResult> ScanRecords(std::string_view data, size_t start, const std::string& path,
                                       bool tail_may_be_torn) {
  ScanResult result;
  size_t off = start;
  while (off < data.size()) {
    const size_t left = data.size() - off;
    if (std::optional<std::string> torn = CutShort(data, off, kRecordHeaderSize)) {
      return Damaged(std::move(result), path, off, *torn, true, tail_may_be_torn);
    }
    const uint32_t length = GetFixed32(data.data() + off);
    const uint32_t crc = UnmaskCrc(GetFixed32(data.data() + off + 4));
    const uint32_t header_crc = UnmaskCrc(GetFixed32(data.data() + off + 8));
    if (Crc32c(data.substr(off, 8)) != header_crc) {
      // The length cannot be trusted. Torn only if the header itself was cut short by zeros.
      const bool torn = AllZero(From(data, off + kRecordHeaderSize));
      return Damaged(std::move(result), path, off,
                     torn ? "incomplete record header (the rest is zero bytes)"
                          : "record header checksum mismatch (its length cannot be trusted) "
                            "with more data after it",
                     torn, tail_may_be_torn);
    }
    const size_t record_size = kRecordHeaderSize + size_t{length} + 1;
    if (record_size > left) {
      // The length is checksummed, so this record's append was cut short: nothing follows it.
      return Damaged(std::move(result), path, off,
                     absl::StrFormat("record of length %d runs past end of file (%d bytes left)",
                                     length, left - kRecordHeaderSize),
                     true, tail_may_be_torn);
    }
    const std::string_view payload = data.substr(off + kRecordHeaderSize, length);
    const char marker = data[off + record_size - 1];
    if (Crc32c(payload) == crc && marker == kEndMarker) {
      result.records.emplace_back(payload);
      off += record_size;
      continue;
    }
    // Torn only if the record's last byte never reached the disk and nothing but zeros follow.
    // A record whose bytes are all present was fsynced or written whole: a crash cannot make
    // its checksum fail, bit rot can.
    const bool torn = marker == 0 && AllZero(From(data, off + record_size));
    std::string problem = Crc32c(payload) != crc
                              ? absl::StrFormat("checksum mismatch in record of length %d", length)
                              : absl::StrFormat("record of length %d lacks its end marker", length);
    if (!torn) {
      absl::StrAppend(&problem, AllZero(From(data, off + record_size))
                                    ? " although all its bytes are present (a crash cannot "
                                      "cause that)"
                                    : " with more data after it");
    }
    return Damaged(std::move(result), path, off, problem, torn, tail_may_be_torn);
  }
  result.intact_bytes = off;
  return result;
}

// Whether an intact format-1 record starts anywhere in data[from, end). nullopt: the search
// was too costly to finish.
std::optional<bool> LegacyRecordAfter(std::string_view data, size_t from) {
  uint64_t budget = kMaxLegacyResyncBytes;
  for (size_t pos = from; pos + kLegacyHeaderSize <= data.size(); ++pos) {
    const uint32_t length = GetFixed32(data.data() + pos);
    if (length > data.size() - pos - kLegacyHeaderSize) continue;
    if (length > budget) return std::nullopt;
    budget -= length;
    if (Crc32c(data.substr(pos + kLegacyHeaderSize, length)) ==
        UnmaskCrc(GetFixed32(data.data() + pos + 4))) {
      return true;
    }
  }
  return false;
}

// Format 1 records (no file header, no header checksum, no end marker). Its lengths are not
// protected, so a damaged length is torn only if intact records precede it (the file is a
// journal) and none follows it.
absl::StatusOr<ScanResult> ScanLegacyRecords(std::string_view data, const std::string& path,
                                             bool tail_may_be_torn) {
  ScanResult result;
  result.format = 1;
  size_t off = 0;
  while (off < data.size()) {
    const size_t left = data.size() - off;
    if (std::optional<std::string> torn = CutShort(data, off, kLegacyHeaderSize)) {
      return Damaged(std::move(result), path, off, *torn, true, tail_may_be_torn);
    }
    const uint32_t length = GetFixed32(data.data() + off);
    const uint32_t crc = UnmaskCrc(GetFixed32(data.data() + off + 4));
    if (length > left - kLegacyHeaderSize) {
      std::string problem =
          absl::StrFormat("format-1 record length %d runs past end of file (%d bytes left)", length,
                          left - kLegacyHeaderSize);
      if (result.records.empty()) {
        return Corrupt(path, off,
                       absl::StrCat(problem,
                                    ", and the file holds no intact record: it is not a journal "
                                    "file (no \"TSJOURNL\" header) or its first length is "
                                    "damaged"));
      }
      const std::optional<bool> after = LegacyRecordAfter(data, off + 1);
      if (after != false) {
        absl::StrAppend(&problem, after.has_value()
                                      ? ", but intact records follow: the length is damaged"
                                      : ", and intact records may follow: the length may be "
                                        "damaged");
      }
      return Damaged(std::move(result), path, off, problem, after == false, tail_may_be_torn);
    }
    const std::string_view payload = data.substr(off + kLegacyHeaderSize, length);
    if (Crc32c(payload) == crc) {
      result.records.emplace_back(payload);
      off += kLegacyHeaderSize + length;
      continue;
    }
    // As in format 2: torn only if the record's last byte and everything after it are zero.
    const size_t end = off + kLegacyHeaderSize + length;
    const bool torn = length > 0 && data[end - 1] == 0 && AllZero(From(data, end));
    return Damaged(std::move(result), path, off,
                   absl::StrFormat("checksum mismatch in format-1 record of length %d%s", length,
                                   torn ? "" : " whose bytes are all present (not a torn write)"),
                   torn, tail_may_be_torn);
  }
  result.intact_bytes = off;
  return result;
}

// Reads one journal file of either format.
absl::StatusOr<ScanResult> ScanFile(std::string_view data, const std::string& path, FileKind kind,
                                    bool tail_may_be_torn) {
  const std::string expected = FileHeader(kind);
  size_t matched = 0;
  while (matched < std::min(data.size(), kFileHeaderSize) && data[matched] == expected[matched]) {
    ++matched;
  }
  if (matched == kFileHeaderSize) return ScanRecords(data, kFileHeaderSize, path, tail_may_be_torn);
  if (AllZero(From(data, matched))) {
    // A file created but whose header never reached the disk: it holds no record.
    if (!tail_may_be_torn) {
      return Corrupt(path, matched, "incomplete file header where none may be");
    }
    ScanResult empty;
    empty.torn_file_header = true;
    return empty;
  }
  if (matched >= kMagic.size() && data.size() >= kFileHeaderSize) {
    const uint32_t version = GetFixed32(data.data() + kMagic.size());
    const uint32_t file_kind = GetFixed32(data.data() + kMagic.size() + 4);
    if (version != kFormatVersion) {
      return Corrupt(path, kMagic.size(),
                     absl::StrFormat("format version %d is not one this coordinator reads (1 or "
                                     "%d): was it written by a newer trainstep?",
                                     version, kFormatVersion));
    }
    return Corrupt(path, kMagic.size() + 4,
                   absl::StrFormat("file is %s file, expected %s file", KindName(file_kind),
                                   KindName(static_cast<uint32_t>(kind))));
  }
  return ScanLegacyRecords(data, path, tail_may_be_torn);
}

// Creates (or truncates) a log and makes its file header durable; the caller syncs the
// directory.
absl::StatusOr<std::unique_ptr<WritableFile>> CreateLog(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> log, env->NewWritableFile(path));
  RETURN_IF_ERROR(log->Append(FileHeader(FileKind::kLog)));
  RETURN_IF_ERROR(log->Sync());
  return log;
}

// Copies bytes recovery is about to cut off to `path`, durably, so none is ever destroyed.
absl::Status KeepAside(Env* env, const std::string& dir, const std::string& path,
                       std::string_view bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, env->NewWritableFile(path));
  RETURN_IF_ERROR(f->Append(bytes));
  RETURN_IF_ERROR(f->Sync());
  RETURN_IF_ERROR(f->Close());
  return env->SyncDir(dir);
}

// Writes a framed snapshot to `temp_path` durably; deletes it when that fails.
absl::Status WriteSnapshotTemp(Env* env, const std::string& temp_path, std::string_view snapshot) {
  std::string framed = FileHeader(FileKind::kSnapshot);
  framed.append(RecordHeader(snapshot));
  framed.append(snapshot);
  framed.push_back(kEndMarker);
  absl::Status s;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> temp = env->NewWritableFile(temp_path);
    s = temp.status();
    if (s.ok()) s = (*temp)->Append(framed);
    if (s.ok()) s = (*temp)->Sync();  // Data before name, or a crash could expose an empty one.
    if (s.ok()) s = (*temp)->Close();
  }
  if (!s.ok()) env->DeleteFile(temp_path).IgnoreError();
  return s;
}

// Best effort: a file that survives is deleted by the next snapshot or Open.
void DeleteObsoleteFiles(Env* env, const std::string& dir, uint64_t oldest_live,
                         std::vector<std::string>* warnings) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) {
    if (warnings != nullptr) warnings->push_back(std::string(names.status().message()));
    return;
  }
  for (const std::string& name : *names) {
    std::optional<uint64_t> log = ParseNumber(name, kLogPrefix, &LogName);
    std::optional<uint64_t> snapshot = ParseNumber(name, kSnapshotPrefix, &SnapshotName);
    const bool temp = IsSnapshotTemp(name);
    if ((log && *log < oldest_live) || (snapshot && *snapshot < oldest_live) || temp) {
      absl::Status s = env->DeleteFile(absl::StrCat(dir, "/", name));
      if (!s.ok() && warnings != nullptr) warnings->push_back(std::string(s.message()));
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(Env* env, std::string dir,
                                                       JournalOptions options,
                                                       RecoveredJournal* recovered) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) return absl::InvalidArgumentError("journal directory is empty");
  const auto path = [&dir](const std::string& name) { return absl::StrCat(dir, "/", name); };

  RETURN_IF_ERROR(env->CreateDirs(dir));
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  std::set<uint64_t> logs;
  uint64_t newest_snapshot = 0;  // 0: none.
  for (const std::string& name : names) {
    if (auto n = ParseNumber(name, kLogPrefix, &LogName)) logs.insert(*n);
    if (auto n = ParseNumber(name, kSnapshotPrefix, &SnapshotName)) {
      newest_snapshot = std::max(newest_snapshot, *n);
    }
  }

  RecoveredJournal out;
  if (newest_snapshot != 0) {
    const std::string snapshot_path = path(SnapshotName(newest_snapshot));
    ASSIGN_OR_RETURN(std::string data, env->ReadFile(snapshot_path));
    // A snapshot is fsynced before it is renamed into place, so it is never legitimately torn.
    ASSIGN_OR_RETURN(ScanResult scan, ScanFile(data, snapshot_path, FileKind::kSnapshot,
                                               /*tail_may_be_torn=*/false));
    if (scan.records.size() != 1) {
      return Corrupt(snapshot_path, 0,
                     absl::StrFormat("snapshot holds %d records, expected 1", scan.records.size()));
    }
    out.snapshot = std::move(scan.records[0]);
  }

  // The snapshot covers every log before its number; later logs must follow without a gap.
  const uint64_t first_live = std::max<uint64_t>(newest_snapshot, 1);
  std::vector<uint64_t> live(logs.lower_bound(first_live), logs.end());
  for (size_t i = 0; i < live.size(); ++i) {
    if (live[i] != first_live + i) {
      return absl::DataLossError(absl::StrFormat(
          "journal %s has %s but %s is missing; refusing to open, the journal must be repaired "
          "or restored by hand",
          dir, LogName(live[i]), LogName(first_live + i)));
    }
  }

  uint64_t log_number = first_live;
  std::unique_ptr<WritableFile> log;
  for (size_t i = 0; i < live.size(); ++i) {
    const std::string log_path = path(LogName(live[i]));
    const bool newest = i + 1 == live.size();
    ASSIGN_OR_RETURN(std::string data, env->ReadFile(log_path));
    ASSIGN_OR_RETURN(ScanResult scan,
                     ScanFile(data, log_path, FileKind::kLog, /*tail_may_be_torn=*/newest));
    for (std::string& r : scan.records) out.records.push_back(std::move(r));
    if (!newest) continue;
    log_number = live[i];
    if (scan.torn_file_header) {
      // Created but never written: start it again.
      ASSIGN_OR_RETURN(log, CreateLog(env, log_path));
      RETURN_IF_ERROR(env->SyncDir(dir));
      continue;
    }
    if (!scan.tail_problem.empty()) {
      const std::string_view tail = std::string_view(data).substr(scan.intact_bytes);
      std::string warning =
          absl::StrFormat("dropped torn record at %s offset %d (%d bytes): %s", log_path,
                          scan.intact_bytes, tail.size(), scan.tail_problem);
      if (!AllZero(tail)) {
        // A tail kept from an earlier crash at the same offset is not overwritten.
        std::string aside = absl::StrCat(log_path, ".torn-", scan.intact_bytes);
        for (int n = 1; env->FileExists(aside); ++n) {
          aside = absl::StrCat(log_path, ".torn-", scan.intact_bytes, ".", n);
        }
        RETURN_IF_ERROR(KeepAside(env, dir, aside, tail));
        absl::StrAppend(&warning, "; its bytes are kept in ", aside);
      }
      out.warnings.push_back(std::move(warning));
      RETURN_IF_ERROR(env->TruncateFile(log_path, scan.intact_bytes));
    }
    ASSIGN_OR_RETURN(log, env->NewAppendableFile(log_path));
    // Makes a truncation durable before appending (or a crash could revive the torn bytes in
    // the middle of the log), and proves the device takes an fsync before the owner serves:
    // a failing disk stops the process here, not at its first record after clients came.
    RETURN_IF_ERROR(log->Sync());
    if (scan.format == 1 && scan.intact_bytes == 0) {
      // A format-1 log with no record left (its only record was torn): rewrite it as an empty
      // format-2 log. Left empty, it would be an old log with no file header, which the next
      // Open must refuse as damaged.
      log->Close().IgnoreError();
      ASSIGN_OR_RETURN(log, CreateLog(env, log_path));
      RETURN_IF_ERROR(env->SyncDir(dir));
    } else if (scan.format == 1) {
      // Never mix formats in one file: continue in a new format-2 log.
      log->Close().IgnoreError();
      log_number = live[i] + 1;
      ASSIGN_OR_RETURN(log, CreateLog(env, path(LogName(log_number))));
      RETURN_IF_ERROR(env->SyncDir(dir));
      out.warnings.push_back(absl::StrFormat(
          "%s is in journal format 1; it stays readable, new records go to %s in format 2",
          log_path, path(LogName(log_number))));
    }
  }
  if (log == nullptr) {
    ASSIGN_OR_RETURN(log, CreateLog(env, path(LogName(log_number))));
    // Records acknowledged in this log must not vanish with its directory entry.
    RETURN_IF_ERROR(env->SyncDir(dir));
  }

  DeleteObsoleteFiles(env, dir, first_live, &out.warnings);
  const uint64_t records_in_log = out.records.size();
  if (recovered != nullptr) *recovered = std::move(out);
  return std::unique_ptr<Journal>(new Journal(env, std::move(dir), std::move(options), log_number,
                                              std::move(log), records_in_log));
}

Journal::Journal(Env* env, std::string dir, JournalOptions options, uint64_t log_number,
                 std::unique_ptr<WritableFile> log, uint64_t records_in_log)
    : env_(env),
      dir_(std::move(dir)),
      options_(std::move(options)),
      records_since_snapshot_(records_in_log),
      append_log_number_(log_number),
      log_number_(log_number),
      log_(std::move(log)) {}

Journal::~Journal() {
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  if (log_ != nullptr) log_->Close().IgnoreError();
}

uint64_t Journal::Append(std::string record) {
  const bool too_big = record.size() > std::numeric_limits<uint32_t>::max();
  // The CRC pass is the costly part; keep it out of the lock every appender contends on.
  const std::string header = too_big ? "" : RecordHeader(record);
  absl::MutexLock lock(&mu_);
  ++records_since_snapshot_;
  const uint64_t seq = ++last_appended_;
  if (too_big && broken_.ok()) {
    broken_ = absl::InvalidArgumentError(absl::StrFormat(
        "journal %s: record %d of %d bytes exceeds the 4 GiB frame limit; journal is broken", dir_,
        seq, record.size()));
  }
  // Once broken nothing is written again, so there is no point queueing.
  if (broken_.ok()) {
    pending_.append(header);
    pending_.append(record);
    pending_.push_back(kEndMarker);
  }
  return seq;
}

absl::Status Journal::Sync(uint64_t seq) {
  {
    absl::MutexLock lock(&mu_);
    if (seq > last_appended_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "journal %s: Sync(%d) but only %d records appended", dir_, seq, last_appended_));
    }
    // Group commit: whoever finds no writer active writes everything queued so far.
    while (true) {
      if (!broken_.ok()) return broken_;
      if (last_synced_ >= seq) return absl::OkStatus();
      if (!writing_) break;
      writer_done_.Wait(&mu_);
    }
    writing_ = true;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = WritePending();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  {
    absl::MutexLock lock(&mu_);
    ReleaseWriterLocked();
  }
  if (s.ok() && options_.on_fsync) options_.on_fsync(elapsed.count());
  return s;
}

uint64_t Journal::last_appended() const {
  absl::MutexLock lock(&mu_);
  return last_appended_;
}

uint64_t Journal::records_since_snapshot() const {
  absl::MutexLock lock(&mu_);
  return records_since_snapshot_;
}

absl::Status Journal::StartSnapshot(std::string snapshot) {
  if (snapshot.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "journal %s: snapshot of %d bytes exceeds the 4 GiB frame limit", dir_, snapshot.size()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (snapshot_running_) return absl::OkStatus();
  }
  // The previous snapshot's thread has done everything but return; only StartSnapshot sets
  // snapshot_running_, so it stays false meanwhile.
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  const auto started = std::chrono::steady_clock::now();
  uint64_t number;
  uint64_t covers_records;
  {
    absl::MutexLock lock(&mu_);
    // The caller appends nothing meanwhile, so `snapshot` is the state after exactly the
    // records queued or written so far: those stay in the current log, later ones go to the
    // next, and the snapshot takes the next log's number.
    number = ++append_log_number_;
    rotation_ = Rotation{pending_.size(), number};
    covers_records = records_since_snapshot_;
    snapshot_running_ = true;
  }
  snapshot_thread_ = std::thread(
      [this, snapshot = std::move(snapshot), number, covers_records, started]() mutable {
        RunSnapshot(std::move(snapshot), number, covers_records, started);
      });
  return absl::OkStatus();
}

bool Journal::snapshot_in_progress() const {
  absl::MutexLock lock(&mu_);
  return snapshot_running_;
}

absl::Status Journal::WaitForSnapshot() {
  absl::MutexLock lock(&mu_);
  while (snapshot_running_) snapshot_done_.Wait(&mu_);
  return last_snapshot_;
}

absl::Status Journal::WriteSnapshot(std::string_view snapshot) {
  WaitForSnapshot().IgnoreError();  // An earlier snapshot's outcome is not this one's.
  RETURN_IF_ERROR(StartSnapshot(std::string(snapshot)));
  return WaitForSnapshot();
}

void Journal::RunSnapshot(std::string snapshot, uint64_t number, uint64_t covers_records,
                          std::chrono::steady_clock::time_point started) {
  const absl::Status s = WriteSnapshotFile(snapshot, number);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started;
  bool broken;
  {
    absl::MutexLock lock(&mu_);
    broken = !broken_.ok();
  }
  if (options_.on_snapshot) options_.on_snapshot(s, broken, elapsed.count());
  absl::MutexLock lock(&mu_);
  // What the snapshot covers is no longer in the live log; records appended since still are.
  if (s.ok()) records_since_snapshot_ -= covers_records;
  last_snapshot_ = s;
  snapshot_running_ = false;
  snapshot_done_.SignalAll();
}

absl::Status Journal::WriteSnapshotFile(std::string_view snapshot, uint64_t number) {
  // The records the snapshot covers must be durable in their log, and the next log must exist,
  // before the snapshot may hide them. A Sync may have rotated already; then this only flushes.
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(BecomeWriterLocked());
  }
  const absl::Status rotated = WritePending();
  {
    absl::MutexLock lock(&mu_);
    ReleaseWriterLocked();
  }
  RETURN_IF_ERROR(rotated);

  // From here on Append and Sync carry on in the new log: the snapshot is written beside it.
  // Until the rename, the old snapshot and the logs stay authoritative: a failure costs nothing.
  const std::string final_path = absl::StrCat(dir_, "/", SnapshotName(number));
  const std::string temp_path = absl::StrCat(final_path, AsAbsl(kTempSuffix));
  RETURN_IF_ERROR(WriteSnapshotTemp(env_, temp_path, snapshot));

  // From the rename on, recovery may prefer the new snapshot and ignore the old logs, so any
  // failure leaves the disk in a state this object no longer tracks.
  absl::Status s = env_->RenameFile(temp_path, final_path);
  if (s.ok()) s = env_->SyncDir(dir_);
  if (!s.ok()) return Break(s);
  DeleteObsoleteFiles(env_, dir_, number, /*warnings=*/nullptr);
  return absl::OkStatus();
}

absl::Status Journal::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

absl::Status Journal::Resume(std::string_view snapshot) {
  if (snapshot.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "journal %s: snapshot of %d bytes exceeds the 4 GiB frame limit", dir_, snapshot.size()));
  }
  WaitForSnapshot().IgnoreError();  // its thread may still touch the files
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) return absl::OkStatus();
    // A broken journal's writers return at once; wait for one still in its I/O.
    while (writing_) writer_done_.Wait(&mu_);
    writing_ = true;
    number = append_log_number_ + 1;
  }
  // The snapshot before its log: once it is in place, Open ignores every older log (the one
  // that failed included) and creates log-M itself if a crash came first.
  const std::string final_path = absl::StrCat(dir_, "/", SnapshotName(number));
  const std::string temp_path = absl::StrCat(final_path, AsAbsl(kTempSuffix));
  std::unique_ptr<WritableFile> log;
  absl::Status s = WriteSnapshotTemp(env_, temp_path, snapshot);
  if (s.ok()) s = env_->RenameFile(temp_path, final_path);
  if (s.ok()) s = env_->SyncDir(dir_);
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<WritableFile>> created =
        CreateLog(env_, absl::StrCat(dir_, "/", LogName(number)));
    s = created.status();
    if (s.ok()) log = std::move(*created);
  }
  if (s.ok()) s = env_->SyncDir(dir_);
  absl::MutexLock lock(&mu_);
  ReleaseWriterLocked();
  if (!s.ok()) return s;
  if (log_ != nullptr) log_->Close().IgnoreError();  // not trusted: never written again
  log_ = std::move(log);
  log_number_ = append_log_number_ = number;
  rotation_.reset();
  pending_.clear();
  last_synced_ = last_appended_;
  records_since_snapshot_ = 0;
  broken_ = absl::OkStatus();
  DeleteObsoleteFiles(env_, dir_, number, /*warnings=*/nullptr);
  return absl::OkStatus();
}

absl::Status Journal::BecomeWriterLocked() {
  while (writing_) writer_done_.Wait(&mu_);
  if (!broken_.ok()) return broken_;
  writing_ = true;
  return absl::OkStatus();
}

void Journal::ReleaseWriterLocked() {
  writing_ = false;
  writer_done_.SignalAll();
}

absl::Status Journal::WritePending() {
  std::string batch;
  uint64_t batch_last;
  std::optional<Rotation> rotation;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(pending_);
    batch_last = last_appended_;
    rotation.swap(rotation_);
  }
  std::string_view rest = batch;
  if (rotation.has_value()) {
    absl::Status s = RotateLog(rest.substr(0, rotation->pending_bytes), rotation->number);
    if (!s.ok()) return Break(s);
    rest.remove_prefix(rotation->pending_bytes);
  }
  if (!rest.empty()) {
    absl::Status s = log_->Append(rest);
    if (s.ok()) s = log_->Sync();
    if (!s.ok()) return Break(s);
  }
  absl::MutexLock lock(&mu_);
  last_synced_ = batch_last;
  return absl::OkStatus();
}

absl::Status Journal::RotateLog(std::string_view rest_of_old_log, uint64_t number) {
  // Only the newest log may end torn, so the old one must be complete on disk first.
  if (!rest_of_old_log.empty()) {
    RETURN_IF_ERROR(log_->Append(rest_of_old_log));
    RETURN_IF_ERROR(log_->Sync());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> new_log,
                   CreateLog(env_, absl::StrCat(dir_, "/", LogName(number))));
  // Records acknowledged in the new log must not vanish with its directory entry.
  RETURN_IF_ERROR(env_->SyncDir(dir_));
  log_->Close().IgnoreError();  // Everything in it is already fsynced.
  log_ = std::move(new_log);
  log_number_ = number;
  return absl::OkStatus();
}

absl::Status Journal::Break(const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) {
    broken_ = absl::Status(cause.code(),
                           absl::StrCat("journal ", dir_,
                                        " is broken after an I/O failure and accepts no more "
                                        "writes until it is resumed from a snapshot: ",
                                        cause.message()));
  }
  return broken_;
}

}  // namespace trainstep
